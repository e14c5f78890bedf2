"""speculative/runs/infer_inputs.py: INPUT_FILE's three formats read line by line, each
malformed line named with its number and the fix before any model loads, and the shards."""

import json
import os

import pytest

from speculative.data import tasks
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_inputs
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_three_formats(tmp_path):
    text = infer_inputs.read_input_file(_write(tmp_path, "in.txt", "Hello.\nA\tcat.\n"))
    assert [(s.index, s.inputs_text, s.targets_text, s.line) for s in text] == [
        (0, "Hello.", "", 1), (1, "A\tcat.", "", 2)]  # a text file keeps its tabs
    tsv = infer_inputs.read_input_file(_write(tmp_path, "in.tsv", "Hello.\tHallo.\nNo.\tNein.\r\n"))
    assert [(s.inputs_text, s.targets_text) for s in tsv] == [("Hello.", "Hallo."),
                                                              ("No.", "Nein.")]
    rows = [{"input": "Hello.", "target": "Hallo."}, {"input": "Yes.", "reference": "Ja."}]
    jsonl = infer_inputs.read_input_file(
        _write(tmp_path, "in.jsonl", "".join(json.dumps(r) + "\n" for r in rows)))
    assert [(s.inputs_text, s.targets_text) for s in jsonl] == [("Hello.", "Hallo."),
                                                                ("Yes.", "Ja.")]
    assert all(s.input_ids is None for s in text + tsv + jsonl)  # encoding is stage 2's


@pytest.mark.parametrize("name, text, match", [
    ("in.jsonl", '{"input": "a"}\n{"input": "b"\n', r"line 2: not JSON"),
    ("in.jsonl", '{"input": "a"}\n{"text": "b"}\n', r'line 2: no "input" string'),
    ("in.jsonl", '{"input": "a", "target": 3}\n', r"line 1: the reference 3 is not a string"),
    ("in.tsv", "a\tb\nc\td\te\n", r"line 2: 3 tab-separated columns.*use a \.jsonl"),
    ("in.tsv", "a\tb\nc\n", r"line 2: a reference missing where line 1 has.*or none"),
    ("in.txt", "a\n\nb\n", r"line 2: an empty line; remove it"),
    ("in.tsv", "a\tb\n\tc\n", r"line 2: an empty input"),
])
def test_a_malformed_line_is_named_with_its_number(tmp_path, name, text, match):
    path = _write(tmp_path, name, text)
    with pytest.raises(ValueError, match=f"INPUT_FILE='{path}' {match}"):
        infer_inputs.read_input_file(path)


def test_bad_input_stops_the_run_before_any_model_loads(tiny_gin, tmp_path, monkeypatch):
    bad = _write(tmp_path, "in.tsv", "Hello.\tHallo.\nA\tB\tC\n")
    config_lib.parse_gin([INFER_GIN, tiny_gin],
                         infer_bindings(tmp_path / "out", INPUT_FILE=repr(bad)))
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match="line 2: 3 tab-separated columns"):
        infer.infer()
    assert not os.path.exists(tmp_path / "out")
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(
        None, INPUT_FILE=repr(str(tmp_path / "missing.txt"))))
    with pytest.raises(ValueError, match=r"INPUT_FILE='.*missing.txt' is invalid: no such file"):
        infer.infer(dry_run=True)


def test_shards_split_the_inputs_by_index(tiny_gin, tmp_path):
    path = _write(tmp_path, "in.txt", "".join(f"line {i}\n" for i in range(7)))
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(
        None, INPUT_FILE=repr(path), NUM_EXAMPLES="None", NUM_SHARDS="3", SHARD_ID="1"))
    settings = infer.infer(dry_run=True)
    task = infer_inputs.get_task(settings)
    assert [s.index for s in infer_inputs.read_inputs(settings, task)] == [1, 4]
    with pytest.raises(ValueError, match=r"SHARD_ID=3 is invalid: use an int in \[0, NUM_SH"):
        infer.infer(settings, dry_run=True, shard_id=3)
    with pytest.raises(ValueError, match="mode 'score' scores given targets"):
        infer_inputs.read_inputs(infer.infer(settings, dry_run=True, mode="score"), task)


def test_a_task_split_reads_in_order_with_its_ids(tiny_gin):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, NUM_EXAMPLES="3"))
    settings = infer.infer(dry_run=True)
    sources = infer_inputs.read_inputs(settings, infer_inputs.get_task(settings))
    assert [s.index for s in sources] == [0, 1, 2]
    assert all(s.inputs_text.startswith(tasks.EN_DE_PREFIX) and s.targets_text for s in sources)
    assert all(s.input_ids[-1] == 1 and s.target_ids[-1] == 1 for s in sources)  # EOS
