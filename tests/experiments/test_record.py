"""Provenance of results: `host.provenance` (commit, command, date, host), `files.new_run_dir`
(a fresh directory per run), `files.append_run` (the append-only `results/runs.jsonl`) and
`record.publish`, the end of every report."""

import datetime
import json
import os

import pytest

from speculative import files
from speculative.experiments import record
from speculative.measure import host


def test_provenance_records_commit_command_date_and_host(tmp_path):
    record = host.provenance("python scripts/demo.py --gamma=7")
    assert record["command"] == "python scripts/demo.py --gamma=7"
    date = datetime.datetime.fromisoformat(record["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert set(record["host"]) >= {"cpu_model", "last_level_cache_bytes", "cores", "load"}
    assert record["host"]["cores"] == os.cpu_count()
    assert record["host"]["load"]["before"] >= 0
    assert record["host"]["bandwidth_gb_per_s"] is None  # only when asked
    json.dumps(record)  # strict JSON as it is
    # Default command: this process's argv, prefixed with 'python'.
    assert host.provenance()["command"].startswith("python ")
    assert host.command_line(["scripts/demo.py", "--name=a b"]) == \
        "python scripts/demo.py '--name=a b'"


def test_provenance_load_from_a_timed_run():
    load = host.LoadAverage()
    record = host.provenance("x", load=load)
    assert set(record["host"]["load"]) == {"before", "after"}
    assert record["host"]["load"]["before"] == load.before


def _report(date="2026-12-04T17:26:38+00:00"):
    return {"rows": [{"temperature": 0.0, "chain": {"speedup": 1.57},
                      "most_tokens": {"speedup": 1.47}, "tree_over_chain_tokens": 1.16}],
            "provenance": {"commit": "a" * 40, "command": "python scripts/tree_benchmark.py",
                           "date": date, "host": {"cpu_model": "x"}}}


def test_index_run_appends_runs_written_under_results_only(tmp_path):
    index = tmp_path / "repo" / "results" / "runs.jsonl"
    inside = tmp_path / "repo" / "results" / "large" / "trees" / "trees.json"
    rec = record.index_run("trees", "large_target/large_draft_kdtv", str(inside), _report(),
                           index_path=str(index))
    assert rec["run_id"] == "trees-large_target-large_draft_kdtv-20261204-172638"
    assert rec["path"] == os.path.join("results", "large", "trees", "trees.json")
    assert rec["commit"] == "a" * 40 and rec["command"].startswith("python scripts/tree")
    assert rec["headline"] == {"rows": [{"T": 0.0, "chain_speedup": 1.57,
                                         "widest_tree_speedup": 1.47,
                                         "tree_over_chain_tokens": 1.16}]}
    assert record.index_run("trees", "x", str(tmp_path / "elsewhere" / "trees.json"),
                            _report(), index_path=str(index)) is None
    lines = index.read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [rec["run_id"]]


def test_headline_numbers_of_tables():
    report = {"table2": [
        {"draft": "a", "temperature": 0.0, "gamma": 3, "alpha": 0.7, "speedup": 1.2},
        {"draft": "b", "temperature": 0.0, "gamma": 5, "alpha": 0.8, "speedup": 1.5},
        {"draft": "a", "temperature": 1.0, "gamma": 2, "alpha": 0.6, "speedup": 1.1}]}
    assert record.headline_numbers("tables", report) == {
        "best_T0": {"draft": "b", "gamma": 5, "alpha": 0.8, "speedup": 1.5},
        "best_T1": {"draft": "a", "gamma": 2, "alpha": 0.6, "speedup": 1.1}}
    assert record.headline_numbers("unknown", report) == {}


def test_publish_stamps_writes_both_files_and_indexes_under_results_only(tmp_path):
    def markdown(result):
        return f"# {result['rows'][0]['x']} at {result['provenance']['commit'][:7]}\n"

    out = tmp_path / "elsewhere"  # outside this repository's results/: written, not indexed
    result = {"rows": [{"x": 3}]}
    assert record.publish("trees", "a/b", str(out), "trees", result, markdown) is None
    written = json.loads((out / "trees.json").read_text())
    assert written["rows"] == [{"x": 3}]
    assert {"commit", "command", "date", "host"} <= set(written["provenance"])
    assert (out / "trees.md").read_text().startswith("# 3 at ")
    with pytest.raises(FileExistsError):  # never over an earlier run unless asked
        files.check_report(str(out), "trees", overwrite=False)
