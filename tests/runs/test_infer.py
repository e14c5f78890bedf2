"""scripts/infer.py end to end (offline, tiny random models on mini_ende, and tiny decoder-only
models on stdlib_code), the Table 2 rows and scripts/reproduce_table2.py.

Known answers: at temperature 0 speculative and baseline predictions are identical token for
token (encoder-decoder and decoder-only); the baseline makes one target call per token; the
JSONL has one line per requested example (the padded rows of the last batch are dropped); the
truncation count equals the too-long inputs; a too-long decoder-only prompt keeps exactly its
last L_in tokens; each Table 2 gin file resolves to the paper's gamma and temperature with a T5-XXL
target; a paper task without its data fails with TaskDataUnavailableError before any model loads.
"""

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys

import gin
import numpy as np
import pytest
import seqio

from speculative import loading
from speculative.data import tasks
from speculative.decode import contract
from speculative.measure import speculation
from speculative.models import t5
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_choice, infer_output, table2
from tests.helpers import REPO, run_interrupted, snapshot
from tests.helpers.runs import (
    INFER_GIN,
    LENGTHS,
    NUM_EXAMPLES,
    fake_interleaved,
    infer_bindings,
    script_env,
)
from tests.helpers.walk import module_entries, settings_walk

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.fixture(scope="module")
def speculative_run(tiny_gin, tmp_path_factory):
    """scripts/infer.py, speculative, in a subprocess; returns its output directory."""
    out = tmp_path_factory.mktemp("spec")
    cmd = [sys.executable, os.path.join(REPO, "scripts", "infer.py"),
           f"--gin_file={INFER_GIN}", f"--gin_file={tiny_gin}"]
    cmd += [f"--gin_bindings={b}" for b in infer_bindings(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(script_env(), SPECULATIVE_PROGRESS="1"), timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc.stderr


def _read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


OUTPUT = infer.output_name(tasks.MINI_TASK, "predict", 0, 1)  # T5X's name of the output file
OUTPUT_FILES = ["config.gin", "metrics.json", OUTPUT, OUTPUT + ".COMPLETED"]


RECORD_KEYS = {"index", "inputs", "prediction", "prediction_tokens", "input_length",
               "input_truncated", "ended_with_eos", "hit_max_decode_len", "generated",
               "target_calls", "draft_calls", "drafted", "accepted", "tested", "beta_sum",
               "alpha", "tokens_per_target_call", "accepted_per_position"}


def test_infer_script_end_to_end_and_baseline_identical(speculative_run, tiny_gin, tmp_path):
    out, stderr = speculative_run
    assert sorted(os.listdir(out)) == sorted(OUTPUT_FILES)
    assert "speculative decoding" in stderr  # the tqdm bar over batches
    spec = _read_jsonl(out / OUTPUT)
    assert len(spec) == NUM_EXAMPLES and [r["index"] for r in spec] == list(range(NUM_EXAMPLES))
    for r in spec:
        assert set(r) == RECORD_KEYS
        assert r["inputs"]["inputs_pretokenized"].startswith(tasks.EN_DE_PREFIX)
        assert r["inputs"]["targets_pretokenized"]
        assert len(r["prediction_tokens"]) == r["generated"] <= LENGTHS["targets"]
        assert 1 <= r["target_calls"] <= r["generated"]
        assert r["draft_calls"] == 3 * r["target_calls"]
        assert r["alpha"] is not None and 0.0 <= r["alpha"] <= 1.0
        assert r["input_truncated"] == (r["input_length"] > LENGTHS["inputs"])

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == tasks.MINI_TASK and metrics["mode"] == "speculative"
    assert metrics["num_examples"] == NUM_EXAMPLES
    assert set(metrics["metrics"]) == {"bleu"} and 0.0 <= metrics["metrics"]["bleu"] <= 100.0
    timing = metrics["timing"]
    assert timing["decode_seconds"] > 0 and timing["compile_seconds"] > 0
    assert timing["num_batches"] == 3
    decoding = metrics["decoding"]
    assert decoding["generated_tokens"] == sum(r["generated"] for r in spec)
    assert timing["tokens_per_second"] == pytest.approx(
        decoding["generated_tokens"] / timing["decode_seconds"])
    assert decoding["tokens_per_target_call"] == pytest.approx(
        decoding["generated_tokens"] / sum(r["target_calls"] for r in spec))
    assert decoding["alpha"] == pytest.approx(
        sum(r["beta_sum"] for r in spec) / sum(r["tested"] for r in spec))
    truncated = sum(r["input_truncated"] for r in spec)
    assert truncated > 0  # LENGTHS["inputs"] = 16 is short on purpose: counted, not silent
    assert metrics["inputs"]["num_truncated"] == truncated
    assert metrics["targets"]["num_hit_max_decode_len"] == sum(
        r["hit_max_decode_len"] for r in spec)
    config_text = (out / "config.gin").read_text()
    assert "SPECULATIVE = True" in config_text and "GAMMA = 3" in config_text

    # The baseline through the same run function (in-process): identical predictions at T = 0.
    base_out = tmp_path / "base"
    config_lib.parse_gin([INFER_GIN, tiny_gin],
                         infer_bindings(base_out, SPECULATIVE="False", DRAFT_MODEL="None",
                                   DRAFT_CHECKPOINT="None") + ["infer.infer.progress = False"])
    result = infer.infer()
    base = _read_jsonl(base_out / OUTPUT)
    assert [r["prediction_tokens"] for r in base] == [r["prediction_tokens"] for r in spec]
    assert [r["prediction"] for r in base] == [r["prediction"] for r in spec]
    assert all(r["target_calls"] == r["generated"] and r["alpha"] is None for r in base)
    base_metrics = json.loads((base_out / "metrics.json").read_text())
    assert base_metrics["mode"] == "autoregressive"
    assert base_metrics["metrics"] == metrics["metrics"]
    assert result.metrics["decoding"]["tokens_per_target_call"] == 1.0


def test_truncation_can_be_an_error(tiny_gin, tmp_path, monkeypatch):
    config_lib.parse_gin([INFER_GIN, tiny_gin],
                         infer_bindings(tmp_path) + ["infer.infer.truncate_inputs = False"])
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match=r"more than TASK_FEATURE_LENGTHS\['inputs'\]=16"):
        infer.infer()


def test_paper_task_offline_fails_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "no_tfds"))
    monkeypatch.setattr(loading, "load_model",
                        lambda *a, **k: pytest.fail("a model was loaded before the data check"))
    info, settings, _ = table2.resolve_row(
        "ende_small_t0", checkpoints={"*": {"target": str(tmp_path), "draft": str(tmp_path)}},
        output_dir=str(tmp_path / "out"))
    assert settings.mixture_or_task_name == tasks.WMT_ENDE_TASK
    with pytest.raises(tasks.TaskDataUnavailableError, match="wmt_t2t_translate/de-en:1.0.0"):
        infer.infer()
    assert not os.path.exists(tmp_path / "out")


def test_infer_script_paper_task_offline_prints_one_message(tmp_path):
    env = dict(script_env(), TFDS_DATA_DIR=str(tmp_path / "no_tfds"))
    cmd = [sys.executable, os.path.join(REPO, "scripts", "infer.py"),
           f"--gin_file={table2.row_file('ende_small_t0')}",
           f'--gin.TARGET_CHECKPOINT="{tmp_path}"', f'--gin.DRAFT_CHECKPOINT="{tmp_path}"',
           f'--gin.INFER_OUTPUT_DIR="{tmp_path / "out"}"']
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "TaskDataUnavailableError" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("TaskDataUnavailableError: Task 'wmt_t2t_ende_v003' needs the "
                               "TFDS dataset 'wmt_t2t_translate/de-en:1.0.0'")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("script,first_line", [
    ("infer.py", "Decodes a seqio task (or your own inputs) with speculative decoding"),
    ("reproduce_table2.py", "Reproduces rows of the paper's Table 2"),
])
def test_script_help_prints_docstring_with_example(script, first_line):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", script), "--help"],
                          capture_output=True, text=True, env=script_env(), timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(first_line), proc.stderr[-2000:]
    assert f"python scripts/{script}" in proc.stdout
    # The shared flags a user needs are listed under the script's own, not only in --helpfull.
    own = proc.stdout.split(f"scripts/{script}:\n", 1)[1]
    for flag in ("--gin_file", "--gin_bindings", "--multihost", "--coordinator_address",
                 "--num_processes", "--process_id", "--[no]verbose"):
        assert flag in own, flag


def test_output_dir_is_never_overwritten_silently_and_writes_are_atomic(tiny_gin, tmp_path,
                                                                          monkeypatch):
    """An earlier run is refused before any work unless OVERWRITE; with it, an interruption
    while the run's files are written leaves the earlier complete run's files as they were."""
    out = tmp_path / "run"
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(out))
    first = infer.infer()
    before = {name: (out / name).read_text() for name in os.listdir(out)}
    assert sorted(before) == sorted(OUTPUT_FILES)

    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(FileExistsError, match="OVERWRITE=True"):
        infer.infer()  # refused before any model is loaded
    monkeypatch.undo()

    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(out, OVERWRITE="True", SEED="7"))
    real_dumps = json.dumps

    def interrupted_dumps(obj, **kw):  # Ctrl-C while metrics.json (the last file) is made
        if isinstance(obj, dict) and "files" in obj:
            raise KeyboardInterrupt
        return real_dumps(obj, **kw)

    monkeypatch.setattr(infer_output.json, "dumps", interrupted_dumps)
    with pytest.raises(KeyboardInterrupt):
        infer.infer()
    monkeypatch.undo()
    assert {name: (out / name).read_text() for name in before} == before
    # The interrupted run's complete chunks wait beside them, for a rerun to resume.
    assert [n for n in os.listdir(out) if n not in before] == ["tmp-mini_ende-00000-of-00001"]

    second = infer.infer()  # OVERWRITE=True, not interrupted: the new complete run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["seed"] == 7
    assert (out / OUTPUT).read_text().count("\n") == NUM_EXAMPLES
    assert sorted(os.listdir(out)) == sorted(OUTPUT_FILES)  # no chunks left
    assert os.listdir(tmp_path) == ["run"]
    assert first.output_files == second.output_files

    # A user's own files beside a run: the run refuses to write among them.
    (out / "notes.txt").write_text("mine")
    (out / "checkpoint_1000").mkdir()
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(FileExistsError, match="notes.txt"):
        infer.infer()
    assert (out / "notes.txt").read_text() == "mine" and (out / "checkpoint_1000").is_dir()
    # A path that is a file is refused before any work, and left as it is.
    config_lib.parse_gin([INFER_GIN, tiny_gin],
                         infer_bindings(tmp_path / "notes", OVERWRITE="True"))
    (tmp_path / "notes").write_text("a file")
    with pytest.raises(FileExistsError, match="is a file"):
        infer.infer()
    assert (tmp_path / "notes").read_text() == "a file"


def test_unwritable_output_dir_fails_before_any_work(tiny_gin, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(blocker / "run"))
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(PermissionError, match="cannot be written"):
        infer.infer()


_SIGINT_CHILD = r'''
import json, os, runpy, signal, sys
real_dumps = json.dumps


def dumps(obj, **kw):  # a real SIGINT to this process while metrics.json is made
    if isinstance(obj, dict) and "files" in obj:
        os.kill(os.getpid(), signal.SIGINT)
    return real_dumps(obj, **kw)


json.dumps = dumps
# As in a terminal: Ctrl-C raises KeyboardInterrupt (a shell's background job would otherwise
# start this process with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@pytest.mark.slow  # ~20 s; CI: the converter's and mini_results' SIGTERM tests (same harness)
def test_sigint_during_the_write_of_a_real_process_leaves_the_earlier_run(tiny_gin, tmp_path):
    """scripts/infer.py in its own process, interrupted by a real SIGINT while it writes over
    an earlier run (OVERWRITE=True): the earlier complete run is left, nothing else."""
    out = tmp_path / "run"
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(out))
    infer.infer()
    before = {name: (out / name).read_text() for name in os.listdir(out)}
    cmd = [sys.executable, "-c", _SIGINT_CHILD, os.path.join(REPO, "scripts", "infer.py"),
           f"--gin_file={INFER_GIN}", f"--gin_file={tiny_gin}"]
    cmd += [f"--gin_bindings={b}" for b in infer_bindings(out, OVERWRITE="True", SEED="7")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=script_env(), timeout=300,
                          cwd=REPO)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr, proc.stderr[-3000:]
    assert {name: (out / name).read_text() for name in before} == before
    assert set(os.listdir(out)) - set(before) <= {"tmp-mini_ende-00000-of-00001"}  # its chunks
    assert os.listdir(tmp_path) == ["run"]


@pytest.mark.slow  # ~20 s; CI: the converter's and mini_results' SIGTERM tests (same harness)
@pytest.mark.parametrize("signum", [signal.SIGTERM])  # SIGINT: the test above
def test_a_signal_before_the_swap_leaves_the_earlier_run_and_no_staging(tiny_gin, tmp_path,
                                                                        signum):
    """SIGTERM (a scheduler's stop) unwinds like Ctrl-C: the earlier run stays whole and the
    staging directory is removed."""
    out = tmp_path / "run"
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(out))
    infer.infer()
    before = snapshot(out)
    args = [f"--gin_file={INFER_GIN}", f"--gin_file={tiny_gin}"]
    args += [f"--gin_bindings={b}" for b in infer_bindings(out, OVERWRITE="True", SEED="7")]
    run_interrupted("infer.py", args, result=str(out), signum=signum, env=script_env())
    assert snapshot(out) == before
    assert os.listdir(tmp_path) == ["run"]


def test_infer_beam_search_speculative_equals_the_targets_own(tiny_gin, tmp_path):
    """BEAM_SIZE: speculative beam search through scripts/infer.py's run gives the target's own
    beam search (same beams, scores to float32 round-off) in no more target forwards."""
    runs = {}
    for speculative in (True, False):
        gin.clear_config()
        out = tmp_path / str(speculative)
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(
            out, SPECULATIVE=str(speculative), BEAM_SIZE="2", DRAFT_BEAM="3", NUM_EXAMPLES="2",
            FORCE_SPECULATIVE_BEAM=str(speculative))
            + ["infer.infer.progress = False"])
        runs[speculative] = (infer.infer(), _read_jsonl(out / OUTPUT))
    (spec, spec_rows), (base, base_rows) = runs[True], runs[False]
    assert spec.metrics["mode"] == "speculative_beam_search"
    assert base.metrics["mode"] == "beam_search"
    # Not forced, SPECULATIVE = True with beams runs the (faster) jitted plain search.
    assert dataclasses.replace(spec.settings, force_speculative_beam=False).mode == "beam_search"
    assert ([r["prediction_tokens"] for r in spec_rows]
            == [r["prediction_tokens"] for r in base_rows])
    for s, b in zip(spec_rows, base_rows):
        assert len(s["beams"]) == 2 and s["score"] == s["beams"][0]["score"]
        assert [x["prediction"] for x in s["beams"]] == [x["prediction"] for x in b["beams"]]
        assert [x["score"] for x in s["beams"]] == pytest.approx(
            [x["score"] for x in b["beams"]], rel=1e-5)
    # Not forced, the run times both searches on its first inputs and runs the faster one.
    gin.clear_config()
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(  # DRAFT_BEAM fixed: one candidate,
        tmp_path / "auto", BEAM_SIZE="2", DRAFT_BEAM="3", NUM_EXAMPLES="2")  # compiled above
        + ["infer.infer.progress = False"])
    auto = infer.infer()
    choice = auto.metrics["beam_choice"]
    assert [(c["draft_beam"], c["gamma"]) for c in choice["candidates"]] == [(3, 3)]
    assert choice["speedup"] > 0 and choice["replayed_per_round"] >= 1
    assert auto.metrics["mode"] == ("speculative_beam_search"
                                    if choice["speedup"] >= infer.MIN_BEAM_SPEEDUP
                                    else "beam_search")
    assert ([r["prediction_tokens"] for r in _read_jsonl(tmp_path / "auto" / OUTPUT)]
            == [r["prediction_tokens"] for r in base_rows])
    d, db = spec.metrics["decoding"], base.metrics["decoding"]
    assert db["target_calls"] == db["target_alone_forwards"] and db["target_calls_saved"] == 0
    assert d["target_alone_forwards"] == db["target_calls"]
    assert 1 <= d["target_calls"] <= d["target_alone_forwards"]
    assert d["target_calls_saved"] == pytest.approx(1 - d["target_calls"] / db["target_calls"])
    assert d["draft_calls"] > 0 and d["generated_tokens"] == db["generated_tokens"]


@pytest.mark.parametrize("macros, match", [
    (dict(BEAM_SIZE="2", TEMPERATURE="1.0"), "TEMPERATURE=1.0"),
    (dict(BEAM_SIZE="0"), "BEAM_SIZE=0"),
    (dict(BEAM_SIZE="3", DRAFT_BEAM="-1"), "DRAFT_BEAM=-1"),
    (dict(BEAM_SIZE="2", LENGTH_PENALTY="'0.6'"), "LENGTH_PENALTY='0.6'"),
])
def test_infer_beam_settings_are_checked_first(tiny_gin, macros, match):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, **macros))
    with pytest.raises(ValueError, match=match):
        infer.infer(dry_run=True)


# ----------------------------------------------------------------------------------------------
# Decoder-only (GPT-like) models on the stdlib_code task (prompt -> continuation, no EOS).

CODE_LENGTHS = {"inputs": 24, "targets": 8}  # the bundled prompts are 100+ tokens: all truncated


def _code_bindings(out_dir, **macros):
    values = dict(TARGET_MODEL="@tiny_code_target/t5.T5Config()",
                  DRAFT_MODEL="@tiny_code_draft/t5.T5Config()", DECODER_ONLY="True",
                  MIXTURE_OR_TASK_NAME=repr(tasks.CODE_TASK),
                  TASK_FEATURE_LENGTHS=repr(CODE_LENGTHS), NUM_EXAMPLES="3")
    values.update(macros)
    return infer_bindings(out_dir, **values) + ["infer.infer.progress = False"]


def test_infer_decoder_only_on_stdlib_code_speculative_equals_baseline(tiny_gin, tmp_path):
    """Tiny random decoder-only models continue code prompts through infer's run: at temperature
    0 the speculative predictions are the baseline's token for token; the task has no metric and
    metrics.json is still written, with decoder_only among the settings."""
    runs = {}
    for speculative in (True, False):
        gin.clear_config()
        out = tmp_path / str(speculative)
        config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(
            out, SPECULATIVE=str(speculative)))
        runs[speculative] = (infer.infer(),
                             _read_jsonl(out / infer.output_name(tasks.CODE_TASK, "predict", 0, 1)),
                             json.loads((out / "metrics.json").read_text()))
    (spec, spec_rows, spec_metrics), (base, base_rows, base_metrics) = runs[True], runs[False]
    assert [r["index"] for r in spec_rows] == [0, 1, 2]  # BATCH_SIZE 2: the filler row dropped
    tokens = [r["prediction_tokens"] for r in spec_rows]
    assert tokens == [r["prediction_tokens"] for r in base_rows]
    assert len({t for row in tokens for t in row}) > 1  # not one repeated token: a real check
    vocabulary = seqio.get_mixture_or_task(tasks.CODE_TASK).output_features["targets"].vocabulary
    for r in spec_rows:
        assert 1 <= r["generated"] == len(r["prediction_tokens"]) <= CODE_LENGTHS["targets"]
        assert r["prediction"] == vocabulary.decode(r["prediction_tokens"])
        inputs = r["inputs"]  # 16 whole lines, then the next 16
        assert inputs["inputs_pretokenized"].endswith("\n") and inputs["targets_pretokenized"]
        assert r["input_truncated"] and r["input_length"] > CODE_LENGTHS["inputs"]
        assert r["alpha"] is not None and 0.0 <= r["alpha"] <= 1.0
    assert all(r["target_calls"] == r["generated"] and r["alpha"] is None for r in base_rows)
    for metrics, mode in ((spec_metrics, "speculative"), (base_metrics, "autoregressive")):
        assert metrics["task"] == tasks.CODE_TASK and metrics["mode"] == mode
        assert metrics["metrics"] == {} and metrics["num_examples"] == 3
        assert metrics["settings"]["decoder_only"] is True
        assert metrics["inputs"]["num_truncated"] == 3
    assert spec.metrics["decoding"]["generated_tokens"] == sum(r["generated"] for r in spec_rows)
    assert base.metrics["decoding"]["tokens_per_target_call"] == 1.0
    assert "DECODER_ONLY = True" in (tmp_path / "True" / "config.gin").read_text()


def test_decoder_only_prompts_keep_their_last_tokens(tiny_gin, tmp_path, monkeypatch):
    """A too-long prompt keeps its last L_in tokens (no EOS added), flagged and counted; an
    encoder input keeps seqio's first L_in - 1 tokens + EOS; with truncate_inputs=False a
    too-long prompt is an error before any model loads."""
    config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(None, NUM_EXAMPLES="4"))
    settings = infer.infer(dry_run=True)
    task, examples = infer.load_examples(settings)
    raw = [np.asarray(ex["inputs"]) for ex in task.get_dataset(
        None, split="test", shuffle=False, num_epochs=1).take(4).as_numpy_iterator()]
    n = CODE_LENGTHS["inputs"]
    for ex, ids in zip(examples, raw):
        assert ex.input_length == len(ids) > n and ex.truncated
        np.testing.assert_array_equal(ex.input_ids, ids[-n:])
    assert [ex.index for ex in examples] == [0, 1, 2, 3]
    ids = np.arange(2, 12, dtype=np.int32)
    np.testing.assert_array_equal(infer.fit_input(ids, 4, decoder_only=True), [8, 9, 10, 11])
    np.testing.assert_array_equal(infer.fit_input(ids, 4, decoder_only=False),
                                  [2, 3, 4, contract.EOS_ID])
    assert infer.fit_input(ids, 10, decoder_only=True) is ids  # fits: untouched

    gin.clear_config()
    config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(tmp_path / "out") + [
        "infer.infer.truncate_inputs = False"])
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match=r"more than TASK_FEATURE_LENGTHS\['inputs'\]=24.*"
                                         r"last L_in tokens"):
        infer.infer()


def test_decoder_only_prompt_with_the_padding_id_is_refused(tiny_gin):
    """A decoder-only prompt is right-padded with 0: an id 0 inside one would end it early."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    class OneExample:
        name = "fake"

        def get_dataset(self, *args, **kwargs):
            return tf.data.Dataset.from_tensors({"inputs": np.array([5, 0, 7], np.int32)})

    config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(None))
    with pytest.raises(ValueError, match=r"Example 0 of fake/test has the padding id 0 .*"
                                         r"positions \[1\]"):
        infer.load_examples(infer.infer(dry_run=True), OneExample())


@pytest.mark.parametrize("macros, match", [
    (dict(TARGET_MODEL="@tiny_target/t5.T5Config()"),
     r"TARGET_MODEL.num_encoder_layers=2 is invalid: DECODER_ONLY = True"),
    (dict(DRAFT_MODEL="@tiny_draft/t5.T5Config()"),
     r"DRAFT_MODEL.num_encoder_layers=1 is invalid: DECODER_ONLY = True"),
    (dict(DECODER_ONLY="False"),
     r"TARGET_MODEL.num_encoder_layers=0 is invalid: an encoder-decoder T5 \(DECODER_ONLY = "
     r"False\).*set DECODER_ONLY = True"),
    (dict(DECODER_ONLY="False", TARGET_MODEL="@tiny_target/t5.T5Config()"),
     r"DRAFT_MODEL.num_encoder_layers=0 is invalid: an encoder-decoder"),
    (dict(BEAM_SIZE="2"), r"BEAM_SIZE=2 is invalid: beam search .* encoder-decoder T5 models "
                          r"only, and DECODER_ONLY = True"),
    (dict(DECODER_ONLY="'yes'"), r"DECODER_ONLY='yes' is invalid"),
])
def test_decoder_only_mismatches_fail_before_any_work(tiny_gin, tmp_path, monkeypatch, macros,
                                                      match):
    out = tmp_path / "out"
    config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(out, **macros))
    monkeypatch.setattr(infer, "get_task", lambda s: pytest.fail("task read"))
    monkeypatch.setattr(infer, "load_models", lambda s: pytest.fail("models loaded"))
    with pytest.raises(ValueError, match=match):
        infer.infer()
    assert not os.path.exists(out)


def test_preloaded_models_of_the_other_kind_are_refused(tiny_gin):
    """`run` with models loaded elsewhere (as Table 2 passes them): an encoder-decoder target
    with DECODER_ONLY = True is refused before decoding."""
    from speculative import loading  # pylint: disable=g-import-not-at-top

    config_lib.parse_gin([INFER_GIN, tiny_gin], _code_bindings(
        None, SPECULATIVE="False", DRAFT_MODEL="None", NUM_EXAMPLES="1"))
    settings = infer.infer(dry_run=True)
    gin.clear_config()
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None))
    encdec = loading.load_model(infer.infer(dry_run=True).target_config)
    with pytest.raises(ValueError, match="DECODER_ONLY=True but the target is an "
                                         "encoder-decoder model"):
        infer.run(settings, models=(encdec, None))


@pytest.mark.parametrize("draft", ["bigram", "prompt_lookup"])
def test_infer_takes_ngram_and_prompt_lookup_drafts(tiny_gin, tmp_path, draft):
    """As the library does: an n-gram table (.npz) and prompt lookup draft for infer's target;
    greedy output equals the baseline's."""
    from speculative.runs import mini
    if draft == "bigram":
        if not mini.available():
            pytest.skip("no bundled models")
        spec = repr(os.path.join(mini.MODELS_DIR, "mini_bigram.npz"))
    else:
        spec = repr("prompt_lookup")
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path / "spec", DRAFT_MODEL=spec))
    spec_run = infer.infer()
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path / "base",
                                                          SPECULATIVE="False"))
    base_run = infer.infer()
    assert [r["prediction"] for r in spec_run.records] == \
        [r["prediction"] for r in base_run.records]
    assert spec_run.metrics["decoding"]["target_forwards"] > 0


def test_the_log_names_what_a_model_spec_loads():
    """A bundled name is not 'random weights' (infer used to log that for a named draft)."""
    assert loading.source(t5.T5Config(vocab_size=16), None) == "(random weights)"
    assert loading.source(t5.T5Config(vocab_size=16), "/ckpt/checkpoint_1") == "/ckpt/checkpoint_1"
    assert loading.source("large_feature_draft", None) == "'large_feature_draft'"


# ----------------------------------------------------------------------------------------------
# GAMMA = 'auto' (the default): the run times its choices on its first inputs and runs the
# fastest. The timings are injected; the decodes are real (their results are the run's).


def test_gamma_auto_where_the_gate_closes_runs_the_baseline_with_its_first_results(
        tiny_gin, tmp_path, monkeypatch):
    """The gate (stage 0) decodes the first batch with the baseline and prices the verify; where
    its bound is under min_speedup (forced here) no speculative program is timed, the run is the
    baseline's, the calibration batch's results are the gate's decode, and metrics.json says
    why."""
    search = speculation.SpeculationSearch  # the bound closes it (the run's length unknown)
    monkeypatch.setattr(speculation, "SpeculationSearch", lambda **k: search(
        **{**k, "min_speedup": 1e6, "run_batches": None}))
    monkeypatch.setattr(speculation, "interleaved", lambda *a, **k: pytest.fail("timed"))
    config_lib.parse_gin([INFER_GIN, tiny_gin], [
        b for b in infer_bindings(tmp_path / "gated") if not b.startswith("GAMMA")]
        + ["infer.infer.progress = False"])
    gated = infer.infer()
    metrics = json.loads((tmp_path / "gated" / "metrics.json").read_text())
    choice = metrics["speculation_choice"]
    assert choice["choice"] == "baseline" and metrics["mode"] == "autoregressive"
    assert choice["gate"]["open"] is False and choice["gate"]["bound"] > 0
    assert [c["name"] for c in choice["candidates"]] == ["baseline"]
    assert "rounds for" in choice["line"] and "at most" in choice["line"]
    gin.clear_config()
    config_lib.parse_gin([INFER_GIN, tiny_gin],
                         infer_bindings(tmp_path / "plain", SPECULATIVE="False")
                         + ["infer.infer.progress = False"])
    plain = infer.infer()
    assert [r["prediction_tokens"] for r in gated.records] == \
        [r["prediction_tokens"] for r in plain.records]


def test_gamma_auto_runs_the_fastest_choice_and_records_it(tiny_gin, tmp_path, monkeypatch,
                                                          caplog):
    """Default GAMMA: speculation at the timed-fastest gamma when it beat the baseline, the
    baseline when nothing did; metrics.json records the choice, every candidate's cost and
    the line that says why; at T = 0 both give the same text."""
    assert infer.InferSettings.__dataclass_fields__["gamma"].default == "auto"
    caplog.set_level("INFO", logger="absl")
    asked = []
    monkeypatch.setattr(infer_choice, "chosen_tree", lambda *a: asked.append(a) or None)
    # the stages with injected timings; the gate's real costs are tested below
    monkeypatch.setattr(speculation, "SpeculationSearch",
                        functools.partial(speculation.SpeculationSearch, gate=False))
    runs = {}
    for name, seconds in (("chain", {("baseline", None): 1.0, ("chain", 2): 0.9,
                                     ("chain", 4): 0.5, ("chain", 6): 0.7}),
                          ("baseline", {("baseline", None): 1.0, ("chain", 2): 1.1,
                                        ("chain", 4): 1.2, ("chain", 6): 1.3})):
        monkeypatch.setattr(speculation, "interleaved", fake_interleaved(seconds))
        gin.clear_config()
        config_lib.parse_gin([INFER_GIN, tiny_gin], [
            b for b in infer_bindings(tmp_path / name) if not b.startswith("GAMMA")]
            + ["infer.infer.progress = False"])
        runs[name] = (infer.infer(), json.loads((tmp_path / name / "metrics.json").read_text()))
    (spec, spec_metrics), (base, base_metrics) = runs["chain"], runs["baseline"]
    assert len(asked) == 1  # the tree chooser: only where speculation paid
    choice = spec_metrics["speculation_choice"]
    assert (choice["choice"], choice["kind"], choice["gamma"]) == ("chain g4", "chain", 4)
    # The probe (gamma 2) paid, so gammas 4 and 6 were timed too, against the baseline again.
    assert [c["name"] for c in choice["candidates"]] == ["baseline", "chain g2", "baseline",
                                                         "chain g4", "chain g6"]
    assert all(c["ms_per_token"] > 0 for c in choice["candidates"])
    assert choice["batch_size"] == 2 and choice["calibration_batches"] == 1  # 3 batches: 1
    assert "-> chain gamma 4" in choice["line"] and choice["line"].startswith("gamma auto:")
    assert spec_metrics["mode"] == "speculative" and spec_metrics["plan"]["gamma"] == 4
    assert spec_metrics["settings"]["gamma"] == "auto"  # the settings as given, never rebound
    # The closing summary repeats the choice and its reason, and metrics.json keeps them.
    assert spec_metrics["decision"] == {"choice": "chain gamma 4 (2.00x)",
                                        "reason": choice["line"]}
    assert f"*** decoded with chain gamma 4 (2.00x); why: {choice['line']} ***" in caplog.text
    assert all(r["draft_calls"] == 4 * r["target_calls"] for r in spec.records)
    timing = spec_metrics["timing"]
    # The calibration batch's result is reused, its decode (0.5 s, timed in the calibration)
    # counted once: in calibration_seconds, not again in run_seconds' decode share.
    assert timing["calibration_seconds"] > 0 and timing["run_seconds"] == pytest.approx(
        timing["decode_seconds"] - 0.5 + timing["compile_seconds"]
        + timing["calibration_seconds"])
    assert base_metrics["speculation_choice"]["choice"] == "baseline"
    assert len(base_metrics["speculation_choice"]["candidates"]) == 2  # the probe lost: no more
    assert "no speculation" in base_metrics["speculation_choice"]["line"]
    assert base_metrics["decision"] == {"choice": "the baseline (no speculation)",
                                        "reason": base_metrics["speculation_choice"]["line"]}
    assert base_metrics["mode"] == "autoregressive"
    assert all(r["target_calls"] == r["generated"] and r["alpha"] is None for r in base.records)
    assert [r["prediction_tokens"] for r in spec.records] == \
        [r["prediction_tokens"] for r in base.records]
    assert len(spec.records) == NUM_EXAMPLES
    # A fixed GAMMA times nothing and keeps its gamma.
    monkeypatch.setattr(speculation, "choose_speculation", lambda *a, **k: pytest.fail("timed"))
    gin.clear_config()
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, GAMMA="2"))
    fixed = infer.infer()
    assert "speculation_choice" not in fixed.metrics and fixed.settings.gamma == 2
    assert fixed.metrics["decision"] == {"choice": "chain gamma 2",
                                         "reason": "GAMMA = 2 given"}
    with pytest.raises(ValueError, match="GAMMA='fast' is invalid.*or 'auto'"):
        infer.infer(fixed.settings, dry_run=True, gamma="fast")


# The settings' walk from infer.run (tests/helpers/walk.py says what a stop and an entry are).
MAX_STOPS = 30
MAX_ENTRIES = 2


@pytest.mark.parametrize("gamma", ["3", "'auto'"])
def test_the_settings_walk_is_short_and_enters_each_module_at_most_twice(tiny_gin, tmp_path,
                                                                          gamma):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path / "walk", GAMMA=gamma)
                         + ["infer.infer.progress = False"])
    settings = infer.infer(dry_run=True)
    stops = settings_walk(settings, lambda: infer.run(settings))
    distinct = list(dict.fromkeys((m, f) for m, f, _ in stops))
    entries = module_entries(stops)
    walk = "\n".join(f"  {m}: {f}" for m, f in distinct)
    print(f"\n{len(distinct)} stops in {len(entries)} modules:\n{walk}\nentries: {dict(entries)}")
    # The walk covers the stages (a measurement that saw nothing would pass vacuously).
    modules = {m for m, _ in distinct}
    assert {"runs/infer.py", "runs/infer_inputs.py", "runs/infer_encode.py",
            "runs/infer_choice.py", "runs/infer_decode.py", "runs/infer_output.py"} <= modules
    assert len(distinct) <= MAX_STOPS, walk
    assert max(entries.values()) <= MAX_ENTRIES, entries
    # Frozen: nothing rebinds the settings on the way.
    with pytest.raises(Exception, match="cannot assign|frozen"):
        settings.batch_size = 1


def test_the_walk_counts_stops_and_entries():
    """The counters on a hand-made walk (so that the limits above measure what they say)."""
    stops = [("a.py", "f", None), ("a.py", "g", "a.py"), ("b.py", "h", "a.py"),
             ("a.py", "f", "b.py"), ("c.py", "k", "a.py")]
    assert module_entries(stops) == {"a.py": 2, "b.py": 1, "c.py": 1}
    marker = object()

    def inner(x):
        return x

    def outer(x):
        return inner(x) and inner(None)

    here = os.path.dirname(os.path.abspath(__file__))
    name = os.path.basename(__file__)
    prefix = "test_the_walk_counts_stops_and_entries.<locals>."
    # outer and the first inner get the marker as an argument; inner(None) does not, nor does
    # the lambda (the marker is its closure's, not an argument).
    assert settings_walk(marker, lambda: outer(marker), root=here) == [
        (name, prefix + "outer", None), (name, prefix + "inner", name)]
    assert settings_walk(marker, lambda: outer(marker)) == []  # nothing of the package ran
