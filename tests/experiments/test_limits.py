"""Tests for speculative/experiments/limits.py, scripts/limits.py and scripts/gpu_benchmark.sh.

Known answers: the bytes a decode step reads, counted by hand for a tiny config and for
large_target (the ~122 MB of weights its docs state); the mean decode position of rows of known
lengths; the first batch size with a speedup below 1; the bound of a hand-made benchmark.json;
a draft identical to the target is always accepted (alpha = 1). The --dry-run of the GPU script
runs every step end to end on CPU (30-60 s on 2 cores: CI runs it).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from speculative import decoding
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import limits
from speculative.measure import host
from speculative.runs import mini
from tests.helpers import REPO, tiny_config
from tests.helpers.host import needs_bundle, random_model, tiny_bytes


def test_mean_position_and_crossover():
    # Rows of 1 and 3 tokens: steps read 1 | 1, 2, 3 keys: (1 + 6) / 4.
    assert host.mean_position([1, 3]) == pytest.approx(7 / 4)
    assert host.mean_position([4, 4]) == pytest.approx(2.5)
    rows = [{"batch_size": b, "speedup": s} for b, s in [(16, 0.9), (1, 1.3), (64, 0.7),
                                                         (4, 1.0)]]
    assert limits.crossover(rows) == 16  # 1.0 at batch 4 is not slower
    assert limits.crossover(rows[1:2] + rows[3:]) is None

def _benchmark_json(tmp_path, **config_overrides):
    fields = {k: (list(v) if isinstance(v, tuple) else v)
              for k, v in vars(tiny_config()).items()}
    config = {"target_model": {"type": "T5Config", **fields}, "decoder_only": False,
              "input_length": 5, **config_overrides}
    data = {"config": config,
            "costs": [{"batch_size": 2, "target_step_s": 0.002,
                       "target_verify_s": {"3": 0.003}}],
            "runs": [{"batch_size": 2, "stats": {"per_row": {"generated": [4, 4]}}}]}
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_benchmark_bounds_known_answer(tmp_path):
    path = _benchmark_json(tmp_path)
    [row] = limits.benchmark_bounds(path, {"gb_per_s": 1.0})  # 1e9 bytes per second
    nbytes = tiny_bytes(False, 2, 2.5, 5)  # two rows of 4 tokens: mean position 2.5
    assert row["bytes"]["total"] == nbytes
    assert row["bound_s"] == pytest.approx(nbytes / 1e9)
    assert row["step_over_bound"] == pytest.approx(0.002 / (nbytes / 1e9))
    assert row["verify_over_bound"]["3"] == pytest.approx(0.003 / (nbytes / 1e9))
    with pytest.raises(ValueError, match="encoder-decoder T5Config"):
        limits.benchmark_config(_benchmark_json(tmp_path, decoder_only=True))
    with pytest.raises(ValueError, match="not a readable benchmark.json"):
        limits.benchmark_config(str(tmp_path / "missing.json"))


@pytest.mark.slow  # ~13 s
def test_batch_scaling_identical_draft(tiny_cfg):
    """A draft identical to the target is always accepted (alpha = 1); steps, positions and
    bytes follow from the rows' lengths; every ratio the tables read is finite."""
    target = random_model(tiny_cfg)
    sources = np.random.default_rng(0).integers(2, 16, (2, 6)).astype(np.int32)
    lengths = np.asarray(decoding.autoregressive_decode(
        target, sources, rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0),
        max_decode_len=4).lengths)
    rows = limits.batch_scaling(target, target, sources, batch_sizes=[2],
                                samplings=[SamplingConfig(0.0)], gammas=[2], alphas={},
                                max_decode_len=4, repeats=1, cost_steps=2)
    limits.add_bounds(rows, target, bandwidth={"gb_per_s": 10.0}, input_length=6,
                      max_decode_len=4)
    [r] = rows
    assert (r["batch_size"], r["gamma"], r["alpha"]) == (2, 2, 1.0)
    assert r["baseline_steps"] == lengths.max()  # the loop runs until the longest row ends
    position = host.mean_position(lengths)
    assert r["mean_position"] == pytest.approx(position) and r["mean_source_length"] == 6
    assert r["bytes"]["total"] == pytest.approx(tiny_bytes(False, 2, position, 6))
    assert r["bytes_as_allocated"]["self_kv"] == 4 * 2 * 2 * 2 * 16 * 6  # cache of 4 + 2
    assert r["bound_s"] == pytest.approx(r["bytes"]["total"] / 10e9)
    for key in ("speedup", "step_over_bound", "verify_over_bound", "baseline_over_bound"):
        assert np.isfinite(r[key]) and r[key] > 0


def _rows():
    base = {"draft": "d", "temperature": 0.0, "gamma": 3, "alpha": 0.7, "baseline_step_s": 0.01,
            "predicted_speedup": 1.5, "c": 0.05, "verify_cost": 1.2, "step_over_bound": 1.3,
            "target_step_s": 0.006, "baseline_over_bound": 2.0, "target_verify_s": 0.007,
            "verify_over_bound": 1.5, "bound_s": 0.005,
            "bytes": {"decoder_weights": 1e8, "output_layer": 8e6, "self_kv": 1e4,
                      "cross_kv": 1e5, "total": 1.0811e8},
            "bytes_as_allocated": {"total": 1.09e8}}
    return [dict(base, target="big", batch_size=b, speedup=s) for b, s in [(1, 1.4), (4, 1.1)]] \
        + [dict(base, target="small", batch_size=b, speedup=s) for b, s in [(1, 0.7), (4, 0.6)]]


def test_write_results_tables_and_plot(tmp_path):
    rows = _rows()
    results = {"settings": {"targets": ["big", "small"]}, "bandwidth": {"gb_per_s": 20.0},
               "rows": rows,
               "crossover": [{"target": t, "draft": "d", "temperature": 0.0,
                              "batch_size": limits.crossover([r for r in rows
                                                              if r["target"] == t])}
                             for t in ("big", "small")]}
    limits.write_results(results, str(tmp_path))
    assert json.loads((tmp_path / "limits.json").read_text())["rows"][0]["speedup"] == 1.4
    table = (tmp_path / "batch_scaling.md").read_text()
    assert "| big | d | 0 | none |" in table and "| small | d | 0 | 1 |" in table
    bandwidth = (tmp_path / "bandwidth.md").read_text()
    assert bandwidth.count("| big | 1 |") == 1 and "6.000 (1.30x)" in bandwidth
    assert (tmp_path / "speedup_vs_batch.png").stat().st_size > 1000


@needs_bundle
def test_bad_settings_fail_before_any_work(tmp_path):
    kw = {"targets": ["mini_target"], "batch_sizes": [1, 4], "temperatures": [0.0],
          "gammas": [2], "num_sentences": 6, "repeats": 1, "cost_steps": 1,
          "max_decode_len": 4, "bandwidth_bytes": 1 << 20}
    with pytest.raises(ValueError, match="num_sentences=6 is not a multiple of batch sizes "
                                         r"\[4\].*multiple of 4"):
        limits.check_settings(**kw)
    with pytest.raises(ValueError, match="targets=.*'nope'"):
        limits.check_settings(**dict(kw, targets=["nope"]))
    with pytest.raises(ValueError, match="batch_sizes holds 0"):
        limits.check_settings(**dict(kw, batch_sizes=[0]))
    with pytest.raises(ValueError, match="repeats=0 is invalid"):
        limits.check_settings(**dict(kw, num_sentences=4, repeats=0))
    (tmp_path / "limits.json").write_text("{}")
    with pytest.raises(FileExistsError, match="earlier run.*--overwrite"):
        limits.run(str(tmp_path), **dict(kw, num_sentences=4))
    with pytest.raises(ValueError, match="benchmark_json="):
        limits.run(str(tmp_path / "new"), benchmark_jsons=[str(tmp_path / "none.json")],
                   **dict(kw, num_sentences=4))
    assert not (tmp_path / "new" / "limits.json").exists()


@needs_bundle
@pytest.mark.slow  # ~20 s
def test_depth_sweep_of_a_one_layer_copy(tmp_path):
    """A 1-decoder-layer copy of large_target reads its 121,478,144 bytes less 5 decoder layers
    of 4,720,128 float32 weights each (self-attention q, k, v, o and cross-attention q, o:
    6 x 512 x 512; the gated MLP: 3 x 512 x 2048; three norm scales of 512); Theorem 3.8's
    column is `theory.speedup` at the best gamma for the row's own costs and the card's alpha."""
    from speculative.measure import analysis as theory  # pylint: disable=g-import-not-at-top

    with pytest.raises(ValueError, match="depths holds 0"):
        limits.run_depth_sweep(str(tmp_path), [1, 0])
    with pytest.raises(ValueError, match="target='nope'"):
        limits.run_depth_sweep(str(tmp_path), [1], target="nope")
    assert not (tmp_path / limits.DEPTH_FILE).exists()
    results = limits.run_depth_sweep(str(tmp_path), [1], gammas=[1, 3], num_steps=2, repeats=1)
    [row] = results["rows"]
    assert row["decoder_layers"] == 1
    assert row["bytes"]["total"] == 121_478_144 - 5 * 4 * 4_720_128
    assert row["target_step_s"] > 0 and row["c"] > 0 and set(row["verify_cost"]) == {1, 3}
    for t, entry in row["thm38"].items():
        assert entry["alpha"] == limits.prior_alpha(mini.best_t5_draft("large_target"), t)
        best = max(theory.speedup(entry["alpha"], g, row["c"], row["verify_cost"][g])
                   for g in (1, 3))
        assert entry["speedup"] == pytest.approx(best)
    written = json.loads((tmp_path / limits.DEPTH_FILE).read_text())
    assert written["settings"]["depths"] == [1] and len(written["rows"]) == 1
    assert "| 1 | 27 |" in (tmp_path / "depth_sweep.md").read_text()
    with pytest.raises(FileExistsError, match="earlier run.*--overwrite"):
        limits.run_depth_sweep(str(tmp_path), [1])


def _gpu_script(*args, timeout=30, env=None):
    env = dict(os.environ, PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_benchmark.sh"), *args],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def test_gpu_script_arguments():
    result = _gpu_script("--help")
    assert result.returncode == 0 and "--dry-run" in result.stdout
    result = _gpu_script("--bogus")
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr
    result = _gpu_script("/tmp/a", "/tmp/b")
    assert result.returncode == 2 and "give one OUT_DIR" in result.stderr
    result = _gpu_script("--steps=limits,plots")
    assert result.returncode == 2 and "names 'plots'" in result.stderr
    result = _gpu_script("--dry-run", "--no-install")
    assert result.returncode == 2 and "drop --no-install" in result.stderr


def test_gpu_script_no_install_stops_without_a_gpu(tmp_path):
    # --no-install uses PYTHON as it is (no pip): on a machine without a GPU its first step
    # fails the GPU check, and nothing else runs or is installed.
    result = _gpu_script("--no-install", str(tmp_path))
    assert result.returncode == 1 and "check_gpu failed; nothing else can run" in result.stderr
    assert "no GPU" in (tmp_path / "logs" / "check_gpu.log").read_text()
    steps = (tmp_path / "steps.tsv").read_text().splitlines()
    assert steps[0].split("\t") == ["step", "exit_code", "seconds"]
    assert [line.split("\t")[:2] for line in steps[1:]] == [["check_gpu", "1"]]


@needs_bundle
@pytest.mark.slow  # ~3 minutes: every step of the GPU script end to end on CPU
def test_gpu_script_dry_run(tmp_path):
    """Every step of scripts/gpu_benchmark.sh on CPU with tiny settings: each writes its JSON."""
    env = {"FEATURE_CACHE": str(tmp_path / "feature_cache")}
    result = _gpu_script("--dry-run", str(tmp_path), timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = (tmp_path / "steps.tsv").read_text().split("\n")[1:-1]
    assert [s.split("\t")[:2] for s in steps] == [
        ["t5_1_1_tiny_synthetic", "0"], ["limits", "0"], ["mini_target_pair", "0"],
        ["mini_target_trees", "0"], ["mini_target_beam", "0"],
        ["block_costs_command_buffers", "0"], ["block_costs_no_command_buffers", "0"],
        ["feature_cache", "0"],
        ["feature_cache_sampled", "0"], ["feature_train", "0"]]
    # The feature step's draft is exported in bfloat16 with its card entry, as a bundle's is.
    card = json.loads((tmp_path / "feature" / "models" / "model_card.json").read_text())
    entry = card["models"]["mini_draft_feature"]
    assert entry["kind"] == "feature_draft" and entry["steps"] == 2
    assert len(entry["config"]["hot_ids"]) == 50 and len(entry["extra_feature_caches"]) == 1
    assert (tmp_path / "feature" / "models" / entry["checkpoint"]).exists()
    beam = json.loads((tmp_path / "mini_target_beam" / "beam.json").read_text())
    assert [r["beam_size"] for r in beam["rows"]] == [1, 2]
    assert all(r["test_split"]["sentences"] == 2 and r["test_split"]["same_beams"]
               for r in beam["rows"])
    trees = json.loads((tmp_path / "mini_target_trees" / "trees.json").read_text())
    [row] = trees["rows"]
    assert row["chain"]["tokens_per_target_call"] >= 1 and len(row["rank_acceptance"]["rates"]) == 4
    for name in ("t5_1_1_tiny_synthetic", "mini_target_pair"):
        data = json.loads((tmp_path / name / "benchmark.json").read_text())
        assert data["runs"] and all(r["speedup"] > 0 for r in data["runs"])
    # The pair reads the test split's TSV itself (no seqio on an accelerator image).
    assert data["config"]["inputs"]["tsv_path"] == "speculative/data/mini/test.tsv"
    summary = (tmp_path / "summary.md").read_text().splitlines()
    assert [line.split(" | ")[:2] for line in summary[2:]] == [
        ["| mini_target_pair", "cpu"], ["| t5_1_1_tiny_synthetic", "cpu"]]
    data = json.loads((tmp_path / "limits" / "limits.json").read_text())
    assert data["schema"] == limits.SCHEMA and data["bandwidth"]["gb_per_s"] > 0
    [row] = data["rows"]
    assert row["target"] == "mini_target" and row["draft"] == mini.best_t5_draft("mini_target")
    assert row["speedup"] > 0 and row["step_over_bound"] > 0
    [bound] = data["benchmark_bounds"]
    assert bound["benchmark_json"].endswith("t5_1_1_tiny_synthetic/benchmark.json")
    for name in ("batch_scaling.md", "bandwidth.md", "speedup_vs_batch.png"):
        assert (tmp_path / "limits" / name).exists()
