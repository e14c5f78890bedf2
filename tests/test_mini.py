"""The bundled mini models: greedy identity on the test split, and results that match the README.

Speculative greedy output must equal the target's greedy output; where a sentence differs, the
difference must be a numerical tie (`tests.helpers.check_greedy_identity`: the two top logits within
1e-4), counted and reported.
"""

import json
import os
import signal

import pytest

from speculative.data import bundles
from speculative.decode.sampling import SamplingConfig
from speculative.experiments import mini_results
from speculative.measure import acceptance
from speculative.measure import costs as costs_lib
from speculative.models import layers
from speculative.runs import mini
from tests.helpers import REPO, check_greedy_identity, run_interrupted, snapshot

pytestmark = pytest.mark.skipif(not mini.available(), reason="no bundled models")
RESULTS = os.path.join(REPO, "results", "mini")
GREEDY = SamplingConfig(0.0)
TARGETS = mini.targets() if mini.available() else []


def _check(num_sentences, target_name, tree=None, draft=None, gamma=4):
    """Greedy identity of `target_name` with `draft` (default: its best) on the first
    `num_sentences` test sentences (None = all)."""
    draft = draft or mini.best_draft(target_name)
    check_greedy_identity(mini.load(target_name), mini.load(draft),
                          mini.source_batches(num_sentences, 64, bundles.INPUT_LENGTH),
                          bundles.MAX_DECODE_LEN, gamma=gamma, what=f"{draft}, tree {tree}",
                          tree=tree)


@pytest.mark.parametrize("target_name", [  # CI: mini_target (the notebook and the README's
    # snippet check the large pair's greedy identity too); large_target slow
    pytest.param(t, marks=pytest.mark.slow) if t == mini.LARGE_TARGET else t for t in TARGETS])
def test_greedy_identity_first_test_sentences(target_name):
    _check(64, target_name)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", TARGETS)
def test_greedy_identity_whole_test_split(target_name):
    _check(None, target_name)


FEATURE_DRAFTS = sorted(n for n, e in (mini.model_card()["models"].items()
                                        if mini.available() else ())
                        if e.get("kind") == mini.FEATURE_DRAFT)


@pytest.mark.parametrize("draft_name", FEATURE_DRAFTS)  # every bundled target-aware draft
def test_greedy_identity_target_aware_draft_first_test_sentences(draft_name):
    _check(64, mini.target_of(draft_name), draft=draft_name, gamma=5)


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", FEATURE_DRAFTS)
def test_greedy_identity_target_aware_draft_whole_test_split(draft_name):
    _check(None, mini.target_of(draft_name), draft=draft_name, gamma=5)


TREE = (3, 2, 1)  # branching at the first two depths, a chain below


@pytest.mark.parametrize("target_name", [  # CI: the compute-bound pair (cheaper); large slow
    pytest.param(t, marks=pytest.mark.slow) if t == mini.LARGE_TARGET else t for t in TARGETS])
def test_greedy_identity_with_a_token_tree_first_test_sentences(target_name):
    _check(64, target_name, TREE)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", TARGETS)
def test_greedy_identity_with_a_token_tree_whole_test_split(target_name):
    _check(None, target_name, TREE)


def _results():
    with open(os.path.join(RESULTS, "results.json")) as f:
        return json.load(f)


def _written():
    """(results, directory) of every bundled target whose results are written."""
    return [(mini_results.load_results(os.path.join(REPO, mini_results.RESULT_DIRS[t])),
             mini_results.RESULT_DIRS[t]) for t in bundles.targets()
            if os.path.exists(os.path.join(REPO, mini_results.RESULT_DIRS[t], "results.json"))]


def test_results_stages_resume_and_refuse_to_overwrite(tmp_path):
    """Each finished stage is on disk at once; a resumed run takes it from there (same settings
    only), and a finished run's results.json is replaced only when asked."""
    settings = {"target": "t", "repeats": 3, "environment": {"time": "then"}}
    stages = mini_results._Stages(str(tmp_path), settings, resume=False)
    stages.done("table3", {"d": {"0.0": {"alpha": float("nan")}}})
    resumed = mini_results._Stages(str(tmp_path), {**settings, "environment": {"time": "now"}},
                                   resume=True)
    assert "table3" in resumed and "costs" not in resumed
    assert resumed["table3"] == {"d": {"0.0": {"alpha": None}}}  # strict JSON on disk
    assert "table3" not in mini_results._Stages(str(tmp_path), settings, resume=False)
    with pytest.raises(ValueError, match="other settings"):
        mini_results._Stages(str(tmp_path), {**settings, "repeats": 4}, resume=True)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(FileExistsError, match="overwrite"):
        mini_results.run(output_dir=str(tmp_path), target_name=mini.TARGET)


@pytest.mark.skipif(not mini.available(), reason="no bundled models")
def test_an_interrupted_overwrite_leaves_the_earlier_run_and_its_stages(tmp_path):
    """scripts/mini_results.py --overwrite, resumed from a stopped run whose every stage is
    done (the committed mini results, as results.partial.json), and sent SIGTERM just before
    its tables, plot and results.json are renamed into place: the earlier run's files are
    left as they were (no new plot beside old tables), and so are the stages, to resume."""
    committed = json.loads(open(os.path.join(REPO, "results", "mini", "results.json")).read())
    partial = {k: v for k, v in committed.items() if k != "dynamic"}
    for t in mini_results.TEMPERATURES:
        partial[f"dynamic_{t:g}"] = [r for r in committed["dynamic"] if r["temperature"] == t]
    out = tmp_path / "mini"
    out.mkdir()
    for name in ("results.json", "table2.md", "speedup_vs_gamma.png"):
        (out / name).write_bytes(b"earlier run: " + name.encode())
    (out / mini_results.PARTIAL).write_text(json.dumps(partial))
    before = snapshot(out)
    settings = committed["settings"]
    run_interrupted("mini_results.py", [
        "--targets=mini_target", f"--output_dir={out}", "--resume", "--overwrite",
        f"--num_alpha_tokens={settings['num_alpha_tokens']}",
        f"--num_sentences={settings['num_sentences']}", f"--repeats={settings['repeats']}"],
        result=str(out), signum=signal.SIGTERM)
    assert snapshot(out) == before


def test_results_tables_are_what_their_results_json_gives(tmp_path):
    """Every committed table (Tables 2/3/4, models, objectives, round time, dynamic gamma) is
    what `mini_results` writes from the committed results.json beside it."""
    for results, directory in _written():
        tables = mini_results._tables(results)  # pylint: disable=protected-access
        assert {"table2.md", "table3.md", "table4.md", "models.md"} <= set(tables)
        for name, text in tables.items():
            assert text == open(os.path.join(REPO, directory, name)).read(), \
                f"{directory}/{name} differs from what its results.json gives"


@pytest.mark.skipif(not os.path.exists(os.path.join(RESULTS, "results.json")),
                    reason="results/mini not written yet")
def test_mini_results_meet_the_targets():
    for results, directory in _written():
        _check_results(results, directory)


def _check_results(results, directory):
    best_t0 = max(v["0.0"]["alpha"] for v in results["table3"].values())
    assert best_t0 >= 0.6
    # Every Table 2 row records its prediction from the same run's alpha, c and verify cost, and
    # the decode-loop cost model predicts each measured speedup within 15%.
    for row in results["table2"]:
        assert row["predicted_speedup"] > 0 and row["speedup"] > 0
        assert abs(row["measured_over_predicted_loop"] - 1.0) <= 0.15, (directory, row)
    if results["settings"].get("target") == mini.LARGE_TARGET:  # the memory-bound pair pays
        best = max(r["speedup"] for r in results["table2"] if r["temperature"] == 0.0)
        assert best > 1.0, best


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(RESULTS, "results.json")),
                    reason="results/mini not written yet")
def test_alpha_reproduces_to_two_decimals():
    results = _results()
    settings = results["settings"]
    target = mini.load(mini.TARGET)
    for name, row in results["table3"].items():
        got = acceptance.bundle_alpha(target, mini.load(name), bundles.ENDE, 0.0,
                                      settings["num_alpha_tokens"], settings["seed"])
        assert round(got["alpha"], 2) == round(row["0.0"]["alpha"], 2), name


@pytest.mark.slow  # ~19 s (six decode programs compile); mini_results saves each stage
def test_dynamic_gamma_rows_share_one_baseline():
    """mini_results.dynamic_gamma: fixed and dynamic gamma against one interleaved baseline; a
    higher confidence threshold drafts fewer tokens per round (at temperature 0, deterministic)."""
    target, draft = mini.load(mini.TARGET), mini.load("mini_draft_30")
    batches = mini.source_batches(4, 1, bundles.INPUT_LENGTH)
    costs = costs_lib.StepCosts.assumed(0.1, {2: 1.5, mini_results.DYNAMIC_MAX_GAMMA: 2.0})
    rows = mini_results.dynamic_gamma(target, draft, batches, GREEDY, 2, repeats=1, seed=0,
                                      draft_name="mini_draft_30", costs=costs)
    assert [r["confidence"] for r in rows] == list(mini_results.DYNAMIC_CONFIDENCES) + ["+2/-1"]
    assert len({r["fixed_speedup"] for r in rows}) == 1  # one fixed-gamma program
    *rows, heuristic = rows
    assert 1.0 <= heuristic["drafted_per_round"] <= mini_results.DYNAMIC_MAX_GAMMA
    # The section 3.5 bound at the fixed run's alpha and these costs, on every row.
    assert len({r["oracle_bound"] for r in rows + [heuristic]}) == 1
    assert heuristic["oracle_bound"] > 0
    drafted = [r["drafted_per_round"] for r in rows]
    assert all(1.0 <= d <= mini_results.DYNAMIC_MAX_GAMMA for d in drafted)
    assert drafted == sorted(drafted, reverse=True) and drafted[0] > drafted[-1]
    assert all(r["speedup"] > 0 and r["draft"] == "mini_draft_30" for r in rows)


@pytest.mark.slow  # ~13 s
def test_demo_picks_a_tree_only_when_it_is_predicted_faster():
    """The demo's shape choice (`theory.best_tree` on per-rank rates along the target's output):
    with free verification a branching tree wins; with a verify cost that grows by 0.3 steps
    per drafted token the chain does, the line says why, and the draft's cost on several paths
    is never measured (no tree can win even at its one-row cost)."""
    from speculative.experiments import demo  # pylint: disable=g-import-not-at-top

    target, draft = mini.load(mini.MINI_TARGET), mini.load("mini_draft_30")
    batches = mini.source_batches(2, 1, bundles.INPUT_LENGTH)
    measured = []

    def row_costs():
        measured.append(True)
        return {m: 0.02 for m in (1, 2, 4, 8, 12)}

    free = costs_lib.StepCosts.assumed(0.02, {n: 1.0 for n in range(1, 13)})
    gamma, tree, line = demo._pick_shape(target, draft, batches, GREEDY, free, row_costs,  # pylint: disable=protected-access
                                         bundles.MAX_DECODE_LEN, 0)
    assert tree is not None and max(tree) > 1 and gamma == len(tree), tree
    assert line.endswith(": the tree"), line
    assert measured == [True]
    costly = costs_lib.StepCosts.assumed(0.02, {n: 1.0 + 0.3 * n for n in range(1, 13)})
    gamma, tree, line = demo._pick_shape(target, draft, batches, GREEDY, costly, row_costs,  # pylint: disable=protected-access
                                         bundles.MAX_DECODE_LEN, 0)
    assert tree is None and "per-rank acceptance" in line and line.endswith("the chain"), line
    assert f"best chain gamma {gamma} " in line
    assert measured == [True]  # not measured again: the chain wins at any draft cost


def test_demo_runs_on_the_bundled_mini_pair(tmp_path, capsys):
    """The main job's code path end to end (small): the legend, translations identical to the
    target's greedy output, one row per temperature with its measured and predicted speedups,
    the JSON written with its provenance into a new run directory (its path printed) and the
    run appended to the run index."""
    from speculative.experiments import demo  # pylint: disable=g-import-not-at-top

    runs, index = tmp_path / "results" / "runs", tmp_path / "results" / "runs.jsonl"
    summary = demo.run(num_sentences=2, gamma=2, temperatures=(0.0,), target_name=mini.MINI_TARGET,
                       draft_name="mini_draft_10", repeats=1, runs_dir=str(runs),
                       runs_index=str(index), command="python scripts/demo.py --test")
    [run_dir] = os.listdir(runs)
    assert run_dir.startswith("demo-mini_draft_10-")
    out = runs / run_dir / "demo.json"
    assert summary["json"] == str(out) and os.listdir(runs / run_dir) == ["demo.json"]
    assert summary["identical_to_baseline"] and summary["sentences"] == 2
    # The first two test sentences need 18 tokens each (prefix and EOS): padded to 24.
    assert summary["input_length"] == 24
    [row] = summary["rows"]
    assert row["gamma"] == 2 and 0.0 <= row["alpha"] <= 1.0 and row["speedup"] > 0
    # Greedy: one decode per sentence (the same text for any key), the same tokens both ways.
    assert row["samples_per_sentence"] == 1
    assert row["tokens"]["baseline"] == row["tokens"]["speculative"] > 0
    assert 1.0 <= row["tokens_per_target_call"] <= 3.0 and row["predicted_speedup"] > 0
    written = json.loads(out.read_text())
    assert written["rows"][0]["speedup"] == row["speedup"]
    # On a CPU the target decodes with [out, in] kernels; the same target in T5X's layout is
    # timed as a second baseline in the same rounds, and the speedup over the faster of the two
    # is never above the speedup over the first. (An accelerator keeps T5X's layout: one baseline.)
    transposed = layers.resolve_kernel_layout("auto") == "transposed"
    assert summary["kernel_layout"] == ("transposed" if transposed else "t5x")
    if transposed:
        t5x_s = row["other_baselines_s"]["t5x_layout"]
        assert t5x_s > 0 and row["speedup_over_fastest_baseline"] == pytest.approx(
            min(row["baseline_s"], t5x_s) / row["speculative_s"])
        assert row["speedup_over_fastest_baseline"] <= row["speedup"]
    else:
        assert "other_baselines_s" not in row
    # mini_target's weights (~11 MB) against this CPU's last-level cache, when sysfs tells it.
    assert 5e6 < written["cache_regime"]["weight_bytes"] < 20e6
    assert "cache_bytes" in written["environment"]["cpu"]
    printed = capsys.readouterr().out
    assert demo.LEGEND in printed and f"Wrote {out}" in printed
    # Provenance, and the run's line in the index.
    provenance = written["provenance"]
    assert provenance["command"] == "python scripts/demo.py --test" and provenance["date"]
    assert "commit" in provenance and "last_level_cache_bytes" in provenance["host"]
    [line] = index.read_text().splitlines()
    record = json.loads(line)
    assert record["run_id"] == run_dir and f"Run {run_dir} added to {index}" in printed
    assert record["path"] == os.path.join("results", "runs", run_dir, "demo.json")
    assert record["headline"]["rows"][0]["speedup"] == round(row["speedup"], 3)
    assert "Theorem 3.8" in printed and "by the decode-loop model" not in printed
    step_ms = 1e3 * written["target_step_s"]
    assert f"A step took {step_ms:.1f} ms" in printed
    assert f"target step: {step_ms:.2f} ms before the timings" in printed
    if transposed:
        assert (f"T=0: the baseline with T5X's [in, out] kernels {t5x_s:.3f} s: "
                f"{row['speedup_over_fastest_baseline']:.2f}x over the faster baseline") in printed
    else:
        assert "over the faster baseline" not in printed
    loop_ms = 1e3 * row["baseline_step_s_loop"]
    if loop_ms > 0:  # a fit on a busy host can come out non-positive: the line leaves it out
        assert f"{loop_ms:.2f} ms per baseline loop step during them" in printed
    else:
        assert "(no decode-loop fit to compare with)" in printed
    # A host that changed state between the cost timing and the decode timings is named.
    state_line = demo._state_line  # pylint: disable=protected-access
    assert "changed state" in state_line(0.004, [0.007]) and "Rerun" in state_line(0.004, [0.007])
    assert "changed state" in state_line(0.007, [0.0045])
    assert "changed state" not in state_line(0.007, [0.0075, 0.0068])
    assert "changed state" in state_line(0.0054, [0.0045, 0.0069])  # between temperatures
    assert "no decode-loop fit" in state_line(0.007, [None])
    # The regime line in each case: the step's read rate is the weights over the step time.
    regime = {"weight_bytes": 100e6, "last_level_cache_bytes": 32e6, "weights_over_cache": 3.1,
              "memory_bound": True}
    regime_line = demo._regime_line  # pylint: disable=protected-access
    line = regime_line("t", regime, 0.005)
    assert "memory-bound" in line and "A step took 5.0 ms (20 GB/s of weights)" in line
    line = regime_line("t", dict(regime, memory_bound=False), 0.004)
    assert "more than the weights" in line and "(25 GB/s of weights)" in line
    line = regime_line("t", dict(regime, memory_bound=None), 0.01)
    assert "unknown" in line and "(10 GB/s of weights)" in line


def test_best_draft_is_the_cards_and_best_t5_draft_a_separate_t5():
    """`best_draft` is the main job's default (the card's, here a target-aware draft for the
    large target); `best_t5_draft` is a separate T5 draft of the same target, the card's best
    where that is one."""
    card = mini.model_card()["best_draft"]
    for target in TARGETS:
        assert mini.best_draft(target) == card[target]
        t5_best = mini.best_t5_draft(target)
        assert mini.is_t5(t5_best) and mini.target_of(t5_best) == target
        if mini.is_t5(card[target]):
            assert t5_best == card[target]
    assert not mini.is_t5(mini.best_draft(mini.LARGE_TARGET))


def test_timed_drafts_are_the_t5_and_target_aware_drafts():
    """The reports time (Table 2) every T5 and target-aware draft of a target; the n-gram
    tables get alpha (Table 3) only."""
    for target in TARGETS:
        timed = bundles.ENDE.timed_drafts(target)
        expected = [n for n in bundles.ENDE.drafts(target) if mini.target_of(n) == target]
        assert timed == expected and all(
            mini.is_t5(n) or bundles.ENDE.entry(n)["kind"] in bundles.READS_TARGET for n in timed)
    assert "large_feature_draft" in bundles.ENDE.timed_drafts(mini.LARGE_TARGET)
    assert not any(n.startswith("mini_") and "gram" in n
                   for n in bundles.ENDE.timed_drafts(mini.LARGE_TARGET))


@pytest.mark.slow  # ~14 s; CI: the bins (tests/test_benchmark.py) and the refusals below
def test_alpha_by_confidence_report(tmp_path):
    """The report's bins hold Table 3's positions once and its overall alpha is Table 3's
    (`bundle_alpha`, same positions and seed); an earlier report is not replaced."""
    from speculative.experiments import alpha_by_confidence

    out = str(tmp_path / "conf")
    report = alpha_by_confidence.run(["mini_draft_10"], target_name=mini.MINI_TARGET,
                                     output_dir=out, num_alpha_tokens=60)
    assert [(r["draft"], r["temperature"]) for r in report["rows"]] == [
        ("mini_draft_10", 0.0), ("mini_draft_10", 1.0)]
    draft, target = mini.load("mini_draft_10"), mini.load(mini.MINI_TARGET)
    for row in report["rows"]:
        assert sum(b["positions"] for b in row["bins"]) == row["positions"] == 60
        table3 = acceptance.bundle_alpha(target, draft, bundles.ENDE, row["temperature"], 60, 0)
        assert row["alpha"] == pytest.approx(table3["alpha"], abs=1e-6)
    assert "| mini_draft_10 | 0 |" in open(os.path.join(out, "alpha_by_confidence.md")).read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        alpha_by_confidence.run(["mini_draft_10"], target_name=mini.MINI_TARGET, output_dir=out)


def test_alpha_by_confidence_refuses_bad_drafts_before_any_work(tmp_path):
    from speculative.experiments import alpha_by_confidence

    kw = dict(target_name=mini.MINI_TARGET, output_dir=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"\['large_draft_kl'\] are not bundled drafts"):
        alpha_by_confidence.run(["large_draft_kl"], **kw)
    with pytest.raises(ValueError, match="drafts is empty"):
        alpha_by_confidence.run([], **kw)
    with pytest.raises(ValueError, match="num_alpha_tokens=0"):
        alpha_by_confidence.run(["mini_draft_10"], num_alpha_tokens=0, **kw)
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.slow  # ~1 minute of compiles; CI: the refusals below and tests/test_t5.py's layout
def test_kernel_layout_report(tmp_path):
    """Both layouts decode the same greedy text, each speedup is over its own baseline, and an
    earlier report is not replaced."""
    from speculative.experiments import kernel_layout

    out = str(tmp_path / "layout")
    report = kernel_layout.run(out, target_name=mini.MINI_TARGET, draft_name="mini_draft_10",
                               num_sentences=1, gammas=(2,), temperatures=(0.0,), repeats=1)
    [row] = report["rows"]
    assert row["identical_to_greedy"] and set(report["costs"]) == {"t5x", "transposed"}
    cell = row["gammas"][2]
    for layout in ("t5x", "transposed"):
        assert cell[layout]["speedup"] == pytest.approx(
            row["baseline_s"][layout] / cell[layout]["seconds"])
    assert "| 0 |" in open(os.path.join(out, "kernel_layout.md")).read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        kernel_layout.run(out, target_name=mini.MINI_TARGET)


def test_kernel_layout_refuses_bad_settings_before_any_work(tmp_path):
    from speculative.experiments import kernel_layout

    kw = dict(output_dir=str(tmp_path / "x"), target_name=mini.MINI_TARGET)
    with pytest.raises(ValueError, match="gammas is empty"):
        kernel_layout.run(gammas=(), **kw)
    with pytest.raises(ValueError, match="gammas=0"):
        kernel_layout.run(gammas=(2, 0), **kw)
    with pytest.raises(ValueError, match="samples=0"):
        kernel_layout.run(samples=0, **kw)
    with pytest.raises(ValueError, match="temperature"):
        kernel_layout.run(temperatures=(-1.0,), **kw)
    assert not os.path.exists(tmp_path / "x")
