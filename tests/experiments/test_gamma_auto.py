"""GAMMA = 'auto' against no speculation as whole infer.py runs (experiments/gamma_auto.py): the
commands it runs, its refusals, its report; end to end under -m slow."""

import json

import pytest

from speculative.experiments import gamma_auto, record


def test_the_commands_are_the_readme_inference_with_a_batch_size():
    s = gamma_auto.GammaAutoSettings()
    auto = gamma_auto.infer_command(s, 64, 0, True, "/tmp/x")
    base = gamma_auto.infer_command(s, 1, 8, False, "/tmp/y")
    assert auto[1].endswith("scripts/infer.py") and "--gin.BATCH_SIZE=64" in auto
    assert "--gin.DRAFT_MODEL='large_draft_kdtv'" in auto and "--gin.SPECULATIVE=False" not in auto
    assert not any(a.startswith("--gin.GAMMA") for a in auto)  # the default: 'auto'
    assert "--gin.SPECULATIVE=False" in base and "--gin.DRAFT_MODEL=None" in base
    assert "--gin.NUM_EXAMPLES=8" in base and "--gin.INFER_OUTPUT_DIR='/tmp/y'" in base


@pytest.mark.parametrize("field,value,message", [
    ("batch_sizes", (64, 0), r"batch_sizes=\(64, 0\)"),
    ("num_examples", (0,), "one number of examples"),
    ("repeats", 0, "repeats=0"),
    ("caches", ("cold",), r"caches=\('cold',\).*per batch size"),
    ("caches", ("cold", "hot", "cold", "warm"), "cold', 'warm'"),
])
def test_bad_settings_are_refused_by_name(tmp_path, field, value, message):
    s = gamma_auto.GammaAutoSettings(output_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=message):
        gamma_auto.run(gamma_auto.GammaAutoSettings(**{**s.__dict__, field: value}))
    assert not (tmp_path / "out").exists()


def test_the_report_and_its_headline():
    runs = [{"mode": m, "batch_size": 64, "wall_seconds": t + 3.0, "run_seconds": t,
             "calibration_seconds": c, "choice": ch, "gate": g, "line": "", "examples": 972}
            for m, t, c, ch, g in (("auto", 37.0, 5.5, "baseline", {"bound": 0.9}),
                                   ("baseline", 35.0, 0.0, None, None))]
    result = {"rows": [{"batch_size": 64, "caches": "cold", "runs": runs, "auto_s": 37.0,
                        "baseline_s": 35.0, "auto_over_baseline": 37 / 35,
                        "choices": ["baseline"]}],
              "commands": {"auto": "A", "baseline": "B"},
              "provenance": {"command": "c", "commit": "abc", "date": "d"}}
    md = gamma_auto.markdown(result)
    assert "| 64 | 972 | cold | 37.0 | 35.0 | 1.057 | baseline |" in md
    assert "| 64 | 972 | auto | 40.0 | 37.0 | 5.5 | baseline | closed: bound 0.90 |" in md
    cells = [gamma_auto._gate_cell(g) for g in (
        None, {"open": True, "bound": 1.5}, {"open": False, "pays": False, "bound": 3.0},
        {"open": False, "pays": True, "fits": False, "bound": 2.0})]
    assert cells == ["", "open (bound 1.50)", "closed: payback", "closed: budget"]
    head = record.headline_numbers("gamma_auto", result)
    assert head["rows"][0]["auto_over_baseline"] == pytest.approx(1.057, abs=1e-3)


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_cold_runs_start_empty_and_warm_runs_share_primed_caches(tmp_path, monkeypatch, cache):
    calls, out_dirs = [], set()

    def fake(s, batch_size, num, auto, name, caches):
        out_dir = gamma_auto.run_dir(caches, auto, batch_size, num, name)
        assert out_dir not in out_dirs, "two runs would write one output directory"
        out_dirs.add(out_dir)
        env = gamma_auto.cache_env(caches)
        calls.append((name, auto, env["SPECULATIVE_JAX_CACHE"],
                      env["SPECULATIVE_CALIBRATION_CACHE"]))
        return {"mode": "auto" if auto else "baseline"}

    monkeypatch.setattr(gamma_auto, "_one_run", fake)
    s = gamma_auto.GammaAutoSettings(repeats=2)
    runs = gamma_auto._row_runs(s, 1, 16, cache, str(tmp_path))
    # A second row of the same batch and examples (the other caches) writes elsewhere.
    gamma_auto._row_runs(s, 1, 16, "warm" if cache == "cold" else "cold", str(tmp_path))
    calls = calls[:len(calls) - (4 if cache == "warm" else 6)]
    assert [r["mode"] for r in runs] == ["auto", "baseline", "baseline", "auto"]
    timed = [c for c in calls if c[0] != "prime"]
    folders = {auto: {c[2] for c in timed if c[1] == auto} for auto in (True, False)}
    assert all(c[2].startswith(str(tmp_path)) and c[3] != c[2] for c in calls)
    if cache == "cold":  # nothing primed; every run its own empty folders
        assert len(calls) == 4 and len({c[2] for c in calls}) == 4
    else:  # one untimed run of each mode first, then that mode's runs share its folders
        assert [(c[0], c[1]) for c in calls[:2]] == [("prime", True), ("prime", False)]
        assert folders[True] == {calls[0][2]} and folders[False] == {calls[1][2]}
        assert calls[0][2] != calls[1][2]


@pytest.mark.slow  # two infer.py processes on the large pair: about a minute
def test_gamma_auto_runs_both_modes_end_to_end(tmp_path):
    s = gamma_auto.GammaAutoSettings(batch_sizes=(2,), num_examples=(4,), caches=("cold",),
                                     repeats=1, output_dir=str(tmp_path))
    gamma_auto.run(s)
    report = json.loads((tmp_path / "gamma_auto.json").read_text())
    [row] = report["rows"]
    assert [r["mode"] for r in row["runs"]] == ["auto", "baseline"]
    assert all(r["wall_seconds"] > r["run_seconds"] > 0 and r["examples"] == 4
               for r in row["runs"])
    assert row["runs"][0]["gate"] is not None and row["runs"][1]["choice"] is None
    assert report["provenance"]["commit"]
    with pytest.raises(FileExistsError, match="overwrite"):
        gamma_auto.run(s)
