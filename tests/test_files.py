"""speculative/files.py: run directories never reused, run records appended, and unwritable
settings named without a raw errno."""

import datetime
import json
import os

import pytest

from speculative import files


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


def test_check_writable_names_the_setting_without_a_raw_errno(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (str(tmp_path / "file" / "sub"), "/proc/forbidden"):
        with pytest.raises(PermissionError) as e:
            files.check_writable(bad, "output_dir")
        message = str(e.value)
        assert message.startswith(f"output_dir={bad!r} cannot be written (")
        assert "Errno" not in message and "\n" not in message
        assert message.endswith("choose a writable directory.")
