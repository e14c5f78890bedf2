"""Tests for the benchmark and alpha runs (speculative/runs/{benchmark,alpha}.py and scripts).

Tiny random T5 models (vocab 16) keep every compilation to seconds; shapes are shared between
tests so jit caches are reused. Known answers: a draft identical to the target has alpha = 1 and
emits gamma + 1 tokens per target call except at the end of a sequence; the synthetic draft is
accepted at the requested rate; teacher-forced beta equals a full-forward computation.
"""

import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from speculative import files
from speculative.measure import analysis as theory
from speculative.models import t5
from speculative.runs import benchmark
from speculative.runs import config as config_lib
from tests.helpers import REPO, run_interrupted, snapshot
from tests.helpers.runs import BENCH_TINY, L_IN, N, bench_cfg

pytestmark = pytest.mark.usefixtures("clean_gin")


RUN_KEYS = {"sampling", "batch_size", "gamma", "max_decode_len", "timings", "speedup",
            "speedup_spread", "baseline_tokens", "speculative_tokens", "speedup_per_token",
            "alpha", "tokens_per_target_call", "expected_tokens_per_call",
            "accepted_per_position", "accepted_per_position_rate", "stats", "c", "verify_cost",
            "predicted_speedup", "predicted_speedup_paper", "measured_over_predicted"}
TIMING_KEYS = {"median_s", "q25_s", "q75_s", "min_s", "max_s", "mean_s", "repeats_s",
               "first_call_s", "compile_s"}


def _common_bindings(out_dir):
    return ["TARGET_MODEL = @tiny/t5.T5Config()", "DRAFT_MODEL = @tiny/t5.T5Config()",
            "TARGET_CHECKPOINT = None", "DRAFT_CHECKPOINT = None",
            f"OUTPUT_DIR = '{out_dir}'", f"MAX_DECODE_LEN = {N}", f"INPUT_LENGTH = {L_IN}",
            "TEMPERATURES = [0.0]"]


def test_benchmark_gin_identical_draft(tmp_path, bench_gin):
    """Draft == target: alpha = 1 and each row needs ceil(length / (gamma + 1)) target calls."""
    out = tmp_path / "bench"
    gamma = 3
    config_lib.parse_gin(
        ["configs/runs/benchmark.gin", bench_gin],
        _common_bindings(out) + [f"GAMMAS = [{gamma}]", "BATCH_SIZES = [4]", "REPEATS = 2",
                                 "benchmark.run.draft_seed = 0", "benchmark.run.cost_steps = 2"])
    benchmark.run()
    data = json.loads((out / "benchmark.json").read_text())
    assert data["schema"] == "speculative.benchmark/1"
    assert {"config", "environment", "costs", "runs"} <= set(data)
    assert {"device", "jax_version", "platform"} <= set(data["environment"])
    assert data["config"]["gammas"] == [gamma] and data["config"]["target_checkpoint"] is None
    assert data["config"]["target_model"]["vocab_size"] == 16
    assert "benchmark.BenchmarkSettings.gammas = %GAMMAS" in (out / "config.gin").read_text()
    [run] = data["runs"]
    assert RUN_KEYS <= set(run)
    for side in ("baseline", "speculative"):
        assert TIMING_KEYS <= set(run["timings"][side])
        assert len(run["timings"][side]["repeats_s"]) == 2
    assert run["alpha"] == 1.0
    rows = run["stats"]["per_row"]
    expected_calls = [math.ceil(n / (gamma + 1)) for n in rows["generated"]]
    assert rows["target_calls"] == expected_calls
    assert run["speculative_tokens"] == run["baseline_tokens"]  # greedy: identical outputs
    assert run["speedup"] == pytest.approx(
        run["timings"]["baseline"]["median_s"] / run["timings"]["speculative"]["median_s"])
    assert run["predicted_speedup"] == pytest.approx(
        theory.speedup(1.0, gamma, run["c"], run["verify_cost"]))
    # The decode-loop cost model is fitted on CALIBRATION_BATCHES (default 8) further batches;
    # random tiny models may run every calibration batch to max_decode_len, and then say so.
    assert data["config"]["calibration_batches"] == 8
    assert "predicted_speedup_loop" in run
    if "error" in run["loop_costs"]:
        assert "different lengths" in run["loop_costs"]["error"]
    [cost] = data["costs"]
    assert cost["c"] > 0 and set(cost["verify_cost"]) == {str(gamma)}
    assert set(cost["step_spread_s"]) == {"target", "draft", str(gamma)}
    assert cost["from_min"]["c"] > 0 and set(cost["from_min"]["verify_cost"]) == {str(gamma)}


@pytest.mark.parametrize("override, message", [
    (dict(gammas=[0]), "gammas holds 0"),
    (dict(gammas=[]), r"gammas=\[\] is empty"),
    (dict(temperatures=["hot"]), "'hot' has unknown type str"),
    (dict(temperatures=[-1.0]), "temperature=-1.0"),
    (dict(batch_sizes=[0]), "batch_sizes holds 0"),
    (dict(synthetic_acceptance=1.5), "synthetic_acceptance=1.5"),
    (dict(calibration_batches=-1), "calibration_batches=-1"),
    (dict(draft_model=t5.T5Config(**{**BENCH_TINY, "vocab_size": 32})),
     "Target vocab_size=16 and draft vocab_size=32 differ"),
])
def test_bad_benchmark_config_raises(tmp_path, override, message):
    kwargs = dict(target_model=bench_cfg(), draft_model=bench_cfg(), output_dir=str(tmp_path))
    kwargs.update(override)
    with pytest.raises((ValueError, TypeError), match=message):
        benchmark.run(**kwargs)


def test_task_inputs():
    batches = benchmark.take_batches(2, 3, vocab_size=4000, input_length=12, seed=0,
                                     task="mini_ende", split="validation")
    assert [b.shape for b in batches] == [(3, 12), (3, 12)]
    assert all(np.any(b == 1, axis=1).all() for b in batches)  # EOS kept after truncation
    with pytest.raises(ValueError, match="vocab_size is 16"):
        benchmark.take_batches(1, 2, vocab_size=16, input_length=12, seed=0, task="mini_ende")


@pytest.mark.parametrize("input_length", [12, 48])
def test_tsv_inputs_read_without_seqio_equal_the_mini_ende_task(tmp_path, input_length):
    """A TSV path alone is read directly (no seqio/TensorFlow, as on an accelerator image) and
    gives the ids the seqio task gives for the same file, cut ones included."""
    tsv = os.path.join(REPO, "speculative", "data", "mini", "test.tsv")
    kwargs = dict(vocab_size=4000, input_length=input_length, seed=0, split="test")
    direct = benchmark.take_batches(40, 1, tsv_path=tsv, **kwargs)
    via_seqio = benchmark.take_batches(40, 1, task="mini_ende", **kwargs)
    np.testing.assert_array_equal(np.concatenate(direct), np.concatenate(via_seqio))
    lengths = (np.concatenate(direct) != 0).sum(axis=1)
    assert (lengths == input_length).any()  # the cut ones are compared too
    bad = tmp_path / "bad.tsv"
    bad.write_text("one field only\n")
    with pytest.raises(ValueError, match="bad.tsv:1: expected 'source<TAB>target'"):
        benchmark.take_batches(1, 1, tsv_path=str(bad), **kwargs)


def _script(name, *args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", name), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.parametrize("script, first_line", [
    ("benchmark.py", "Times speculative vs autoregressive decoding"),
    ("measure_alpha.py", "Measures a draft's acceptance rate alpha"),
])
def test_script_help_shows_docstring(script, first_line):
    result = _script(script, "--help")  # absl exits with 1 after printing the usage
    assert first_line in result.stdout
    assert "Example" in result.stdout and "--gin_file" in result.stdout


@pytest.mark.slow  # ~25 s each; CI: the same harness on infer, the converter and mini_results
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_benchmark_leaves_the_earlier_run(tmp_path, bench_gin, signum):
    """scripts/benchmark.py over an earlier run (OVERWRITE=True), stopped by a real signal
    just before its results are renamed into place: the earlier benchmark.json and config.gin
    stay together, and no temporary file is left."""
    out = tmp_path / "bench"
    out.mkdir()
    before = {"benchmark.json": b'{"earlier": true}', "config.gin": b"# earlier run"}
    for name, data in before.items():
        (out / name).write_bytes(data)
    args = [f"--gin_file={bench_gin}", "--gin_file=configs/runs/benchmark.gin"]
    args += [f"--gin_bindings={b}" for b in _common_bindings(out) + [
        "GAMMAS = [2]", "BATCH_SIZES = [2]", "REPEATS = 1", "OVERWRITE = True",
        "benchmark.run.cost_steps = 1"]]
    run_interrupted("benchmark.py", args, result=str(out), signum=signum,
                    env=dict(os.environ, PYTHONPATH=REPO))
    assert snapshot(out) == before


def test_results_writers_refuse_an_earlier_run_and_write_atomically(tmp_path):
    out = tmp_path / "bench"
    assert files.check_output_dir(str(out), benchmark.RESULTS_FILE, False) == str(out)
    path = benchmark.write_json({"x": float("nan")}, str(out), benchmark.RESULTS_FILE)
    assert json.loads(open(path).read()) == {"x": None}
    assert sorted(os.listdir(out)) == ["benchmark.json", "config.gin"]  # no temporary left
    with pytest.raises(FileExistsError, match="OVERWRITE=True"):
        files.check_output_dir(str(out), benchmark.RESULTS_FILE, False)
    files.check_output_dir(str(out), benchmark.RESULTS_FILE, True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match="cannot be written"):
        files.check_output_dir(str(tmp_path / "file" / "sub"), benchmark.RESULTS_FILE, False)
    for bad in (None, "", 3):
        with pytest.raises(ValueError, match="output_dir"):
            files.check_output_dir(bad)


def test_committed_gpu_summary_is_what_its_benchmark_jsons_give():
    """results/gpu/summary.md is benchmark.summary_markdown of the runs beside it, as
    scripts/gpu_benchmark.sh writes it: no number in it was typed by hand."""
    root = os.path.join(REPO, "results", "gpu")
    paths = sorted(os.path.join(root, d, "benchmark.json") for d in os.listdir(root)
                   if os.path.exists(os.path.join(root, d, "benchmark.json")))
    assert len(paths) == 4
    summary = benchmark.summary_markdown(paths)
    with open(os.path.join(root, "summary.md"), encoding="utf-8") as f:
        assert f.read() == summary
    rows = summary.splitlines()[2:]
    assert len(rows) == 10 and all("| NVIDIA H200 |" in row for row in rows)

    # The README's short table copies four of those rows: every cell it shares with them.
    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    header, *full = [cells(r) for r in summary.splitlines() if not r.startswith("|---")]
    by_key = {(r[0], r[2], r[3], r[4]): dict(zip(header, r)) for r in full}  # run, T, B, γ
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    table = readme.split("## What it shows", 1)[1].split("\n\n", 2)[1].splitlines()
    short_header, copied = cells(table[0]), [cells(r) for r in table[2:]]
    assert len(copied) == 4
    for row in copied:
        short = dict(zip(short_header, row))
        original = by_key[(short["run"], short["T"], short["B"], short["γ"])]
        for column, value in short.items():
            if column != "device":
                assert original[column] == value, (short["run"], column)
