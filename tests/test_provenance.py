"""Provenance of results: `host.provenance` (commit, command, date, host), `files.new_run_dir`
(a fresh directory per run) and `files.append_run` (the append-only `results/runs.jsonl`)."""

import datetime
import json
import os
import subprocess

import pytest

from speculative import files
from speculative.experiments import record
from speculative.measure import host


def test_new_run_dir_never_reuses_a_directory(tmp_path):
    first = files.new_run_dir(str(tmp_path / "runs"), "demo")
    second = files.new_run_dir(str(tmp_path / "runs"), "demo")
    third = files.new_run_dir(str(tmp_path / "runs"), "demo")
    assert len({first, second, third}) == 3
    assert all(os.path.isdir(p) for p in (first, second, third))
    name = os.path.basename(first)
    assert name.startswith("demo-")
    stamp = datetime.datetime.strptime(name[len("demo-"):len("demo-") + 15], "%Y%m%d-%H%M%S")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert abs((now - stamp).total_seconds()) < 120  # a UTC stamp, not local time
    # Within one second the suffixes count up from -2; a run never lands in an earlier one's.
    if os.path.basename(second).startswith(name):
        assert second == first + "-2"
    open(os.path.join(first, "result.json"), "w").close()
    assert not os.listdir(files.new_run_dir(str(tmp_path / "runs"), "demo"))


def test_append_run_appends_one_line_per_record(tmp_path):
    index = str(tmp_path / "results" / "runs.jsonl")
    files.append_run(index, {"run_id": "a", "speedup": 2.07, "text": "two\nlines"})
    files.append_run(index, {"run_id": "b", "speedup": float("nan")})
    with open(index, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert records[0] == {"run_id": "a", "speedup": 2.07, "text": "two\nlines"}
    assert records[1] == {"run_id": "b", "speedup": None}  # strict JSON: NaN -> null


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


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_git_commit_clean_dirty_and_outside_git(tmp_path):
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert host.git_commit(str(tmp_path)) == sha
    assert host.provenance("x", repo_dir=str(tmp_path))["commit"] == sha
    (tmp_path / "a.txt").write_text("two")
    assert host.git_commit(str(tmp_path)) == sha + "-dirty"
    assert host.provenance("x", repo_dir=str(tmp_path))["commit"] == sha + "-dirty"
    lone = tmp_path.parent / (tmp_path.name + "_nogit")  # beside the repository, not in it
    lone.mkdir()
    assert host.git_commit(str(lone)) is None


def test_check_writable_names_the_setting_without_a_raw_errno(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (str(tmp_path / "file" / "sub"), "/proc/forbidden"):
        with pytest.raises(PermissionError) as e:
            files.check_writable(bad, "output_dir")
        message = str(e.value)
        assert message.startswith(f"output_dir={bad!r} cannot be written (")
        assert "Errno" not in message and "\n" not in message
        assert message.endswith("choose a writable directory.")


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
