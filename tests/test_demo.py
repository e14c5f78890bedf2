"""The main job's pieces that need no timing (speculative/experiments/demo.py): bad arguments
refused before any model loads, the legend, the cache's name, and the run index's line. The
end-to-end run on the mini pair is tests/test_mini.py::test_demo_runs_on_the_bundled_mini_pair."""

import json
import os

import pytest

from speculative import files
from speculative.experiments import demo
from speculative.runs import mini


@pytest.fixture
def no_loading(monkeypatch):
    """Makes loading a model or timing one fail the test: a refusal must come before both."""
    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded or timed before the arguments were checked")

    monkeypatch.setattr(demo.mini, "load", fail)
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
