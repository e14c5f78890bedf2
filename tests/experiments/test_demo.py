"""The main job's pieces that need no timing (speculative/experiments/demo.py): bad arguments
refused before any model loads, the legend, the cache's name, and the run index's line. The
end-to-end run on the mini pair is tests/test_mini.py::test_demo_runs_on_the_bundled_mini_pair."""

import dataclasses
import json
import os

import numpy as np
import pytest

from speculative import files
from speculative.data import bundles
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import demo
from speculative.measure import costs as costs_lib
from speculative.models import layers
from speculative.runs import mini


@pytest.fixture
def no_loading(monkeypatch):
    """Makes loading a model or timing one fail the test: a refusal must come before both."""
    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded or timed before the arguments were checked")

    monkeypatch.setattr(bundles.Bundle, "load", fail)
    monkeypatch.setattr(demo.costs_lib, "measure_costs", fail)
    monkeypatch.setattr(demo, "_random_pair", fail)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(gamma=100), ValueError, "gamma=100 drafts more tokens per round than max_decode_len"),
    (dict(gamma=0), ValueError, "gamma=0"),
    (dict(max_decode_len=0), ValueError, "max_decode_len=0"),
    (dict(runs_dir="/proc/no/such/place"), PermissionError, "runs_dir"),
    (dict(runs_index="/proc/no/such/runs.jsonl"), PermissionError, "runs_index"),
])
def test_bad_arguments_are_refused_before_any_model_loads(no_loading, kwargs, error, match):
    with pytest.raises(error, match=match):
        demo.run(**kwargs)


def test_a_task_is_checked_and_a_missing_bundle_named(no_loading, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"task='nope' is not a demo task; use one of "
                                         r"\['docstrings', 'ende'\]"):
        demo.run(task="nope")
    empty = dataclasses.replace(demo.TASKS["docstrings"], bundle=dataclasses.replace(
        bundles.DOCSTRINGS, models_dir=str(tmp_path)))
    monkeypatch.setitem(demo.TASKS, "docstrings", empty)
    with pytest.raises(FileNotFoundError, match="docstrings/models/MODEL_CARD.md"):
        demo.run(task="docstrings")


def test_the_docstring_task_reads_the_test_functions_in_order():
    task = demo.TASKS["docstrings"]
    pairs = task.pairs(3)
    assert task.pairs(2, skip=1) == pairs[1:]
    assert task.show(pairs[0][0]).startswith(("def ", "async def "))
    [batch] = task.calibration(1, 384, skip=3)
    assert batch.shape == (1, 384)
    np.testing.assert_array_equal(batch, task.tokenizer().encode_sources(
        [task.pairs(1, skip=3)[0][0]], 384))


@pytest.mark.skipif(not mini.available(), reason="needs the bundled models' card")
def test_bundled_names_are_checked_against_the_card(no_loading):
    target = mini.main_target()
    assert demo.check_names(None, None) == (target, mini.best_draft(target))
    with pytest.raises(ValueError, match=r"target='nope' is not a bundled target"):
        demo.run(target_name="nope")
    with pytest.raises(ValueError, match=r"draft='nope' is not a bundled draft of large_target"):
        demo.run(draft_name="nope")
    # A draft trained for the other target: the message says whose it is.
    with pytest.raises(ValueError, match=r"\(it belongs to large_target\); choose one of"):
        demo.run(target_name=mini.MINI_TARGET, draft_name="large_feature_draft")


def test_the_legend_explains_every_printed_term():
    for term in ("alpha", "tokens per target call", "c  ", "verify cost", "speedup",
                 "Theorem 3.8", "decode-loop model"):
        assert term in demo.LEGEND, term
    assert "draft's cost per call, in target steps" in demo.LEGEND
    assert len(demo.LEGEND.splitlines()) <= 16  # short


def test_the_cache_is_named_as_its_maker_names_it():
    """sysfs says 32768K for a 32 MB L3: the demo prints '32 MB L3' (binary megabytes, as the
    README), not '34 MB'."""
    assert demo.cache_name(32 * 2**20, "L3") == "32 MB L3"
    assert demo.cache_name(260 * 2**20, "L3") == "260 MB L3"
    assert demo.cache_name(32 * 2**20) == "32 MB last-level cache"
    regime = {"weight_bytes": 122e6, "last_level_cache_bytes": 32 * 2**20,
              "weights_over_cache": 3.6, "memory_bound": True}
    line = demo._regime_line("large_target", regime, 0.005, "L3")  # pylint: disable=protected-access
    assert "3.6x this CPU's 32 MB L3: memory-bound" in line


def test_the_index_line_names_the_run_its_command_and_headline(tmp_path):
    """`index_record`: the run id is the run directory's name, the path is relative to the
    repository (the index's parent's parent), and each temperature's headline numbers are
    there; `add_to_index` appends it as one JSON line."""
    run_dir = files.new_run_dir(str(tmp_path / "results" / "runs"), "demo-mini_draft_10")
    path = os.path.join(run_dir, "demo.json")
    index = str(tmp_path / "results" / "runs.jsonl")
    row = {"temperature": 0.0, "gamma": 2, "tree": None, "alpha": 0.5, "speedup": 1.2504,
           "tokens_per_target_call": 1.9, "speedup_over_fastest_baseline": 1.2,
           "predicted_speedup": 1.4, "predicted_speedup_loop": 1.3, "baseline_s": 1.0}
    provenance = {"commit": "abc", "command": "python scripts/demo.py", "date": "2026-12-04",
                  "host": {"cpu_model": "x"}}
    summary = {"target": "mini_target", "draft": "mini_draft_10", "rows": [row],
               "provenance": provenance}
    record = demo.index_record(summary, path, index)
    assert record["run_id"] == os.path.basename(run_dir)
    assert record["run_id"].startswith("demo-mini_draft_10-")
    assert record["path"] == os.path.join("results", "runs", record["run_id"], "demo.json")
    assert record["command"] == "python scripts/demo.py" and record["commit"] == "abc"
    assert record["pair"] == "mini_target/mini_draft_10" and record["experiment"] == "demo"
    [headline] = record["headline"]["rows"]
    assert headline["T"] == 0.0 and headline["speedup"] == 1.25 and headline["gamma"] == 2  # 3 d.p.
    assert "baseline_s" not in headline  # headline numbers only
    # Indexed when the JSON lies under the index's results/ directory, twice for two runs.
    assert demo.add_to_index(summary, path, index) == record
    assert demo.add_to_index(summary, path, index) == record
    lines = open(index, encoding="utf-8").read().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == json.loads(json.dumps(record))
    # A JSON written elsewhere is not: the index lists the runs whose files are in results/.
    assert demo.add_to_index(summary, str(tmp_path / "elsewhere" / "demo.json"), index) is None
    assert len(open(index, encoding="utf-8").read().splitlines()) == 2


# ----------------------------------------------------------------------------------------------
# From tests/experiments/test_demo_tmp.py.
GREEDY = SamplingConfig(0.0)


@pytest.mark.skipif(not mini.available(), reason="no bundled models")
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


@pytest.mark.skipif(not mini.available(), reason="no bundled models")
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


# ----------------------------------------------------------------------------------------------
# From tests/experiments/test_demo_tmp.py.
