"""speculative/runs/infer_output.py: T5X's file names and line layout, chunks with completion
markers, and a run killed (SIGKILL) after its second chunk that, run again with the same
command, resumes and writes the file an uninterrupted run writes, byte for byte."""

import json
import os
import subprocess
import sys

import pytest

from speculative.data import tasks
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_output
from tests.helpers import REPO
from tests.helpers.runs import INFER_GIN, infer_bindings, script_env

pytestmark = pytest.mark.usefixtures("clean_gin")
NAME = "mini_ende-predict.jsonl-00000-of-00001"
# Seven examples at batch 1, one batch a chunk: seven chunks.
MACROS = dict(NUM_EXAMPLES="7", BATCH_SIZE="1", CHECKPOINT_PERIOD="1")

_KILLED_CHILD = r'''
import os, runpy, signal, sys
from speculative.runs import infer_output
real = infer_output.RunOutput.write_chunk


def write_chunk(self, chunk):  # SIGKILL right after the second chunk and its marker
    real(self, chunk)
    if chunk.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)


infer_output.RunOutput.write_chunk = write_chunk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def test_t5x_names_and_line_layout():
    assert infer_output.output_name("wmt_t2t_ende_v003", "predict", 3, 16) == \
        "wmt_t2t_ende_v003-predict.jsonl-00003-of-00016"
    assert infer.output_name(tasks.MINI_TASK, "score", 0, 1) == \
        "mini_ende-score.jsonl-00000-of-00001"


def test_killed_after_its_second_chunk_a_rerun_resumes_to_the_same_file(tiny_gin, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(whole, **MACROS))
    infer.infer()
    assert sorted(os.listdir(whole)) == sorted(
        ["config.gin", "metrics.json", NAME, NAME + ".COMPLETED"])
    lines = [json.loads(x) for x in (whole / NAME).read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(7))
    for r in lines:  # T5X's layout (inputs, prediction), and ours beside it
        assert set(r["inputs"]) == {"inputs_pretokenized", "targets_pretokenized"}
        assert r["inputs"]["inputs_pretokenized"].startswith(tasks.EN_DE_PREFIX)
        assert isinstance(r["prediction"], str) and r["prediction_tokens"]
        assert r["target_calls"] >= 1 and 0.0 <= r["alpha"] <= 1.0

    args = [f"--gin_file={INFER_GIN}", f"--gin_file={tiny_gin}"]
    args += [f"--gin_bindings={b}" for b in infer_bindings(killed, **MACROS)]
    proc = subprocess.run([sys.executable, "-c", _KILLED_CHILD,
                           os.path.join(REPO, "scripts", "infer.py"), *args],
                          capture_output=True, text=True, env=script_env(), timeout=300, cwd=REPO)
    assert proc.returncode == -9, proc.stderr[-3000:]
    chunks = killed / "tmp-mini_ende-00000-of-00001"
    assert sorted(n for n in os.listdir(chunks) if n.endswith(".COMPLETED")) == [
        f"{NAME}-chunk00000.COMPLETED", f"{NAME}-chunk00001.COMPLETED"]
    assert os.listdir(killed) == [chunks.name]  # no output file yet

    gin_text = (whole / "config.gin").read_text()
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(killed, **MACROS))
    resumed = infer.infer()  # the same command again
    assert resumed.metrics["timing"]["resumed_chunks"] == [0, 1]
    assert (killed / NAME).read_bytes() == (whole / NAME).read_bytes()
    assert sorted(os.listdir(killed)) == sorted(os.listdir(whole))  # the chunks removed
    assert (killed / "config.gin").read_text() == gin_text.replace(str(whole), str(killed))

    # Run again now, it refuses to replace the complete run; other settings are refused
    # beside an interrupted one's chunks.
    with pytest.raises(FileExistsError, match="OVERWRITE=True"):
        infer.infer()
    os.makedirs(chunks)
    (chunks / "settings.json").write_text("{}")
    (killed / (NAME + ".COMPLETED")).unlink()
    with pytest.raises(FileExistsError, match="interrupted run with other settings"):
        infer.infer()
