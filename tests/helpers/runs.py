"""Run-level helpers: `TINY_GIN`, gin bindings of tiny T5 configs (a 4000-piece vocabulary,
as the mini task's) for the infer, table2 and config tests, with the bindings of a tiny infer run;
and `BENCH_TINY` (vocabulary 16) with its gin file for the benchmark, alpha and measure tests."""

import os

from speculative.data import tasks
from speculative.models import t5
from tests.helpers import REPO

TINY = dict(vocab_size=4000, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
             mlp_activations=("gelu", "linear"), dropout_rate=0.0,
             relative_attention_num_buckets=8, relative_attention_max_distance=16)
TINY_GIN = "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n"
TINY_GIN += "".join(
    f"{scope}/t5.T5Config:\n" + "".join(f"  {k} = {v!r}\n" for k, v in dict(
        TINY, num_encoder_layers=enc, num_decoder_layers=dec).items())
    for scope, enc, dec in (("tiny_target", 2, 2), ("tiny_draft", 1, 1),
                            # decoder-only (DECODER_ONLY = True), for the stdlib_code task
                            ("tiny_code_target", 0, 2), ("tiny_code_draft", 0, 1)))

# ----------------------------------------------------------------------------------------------
# scripts/infer.py runs (tests/runs/test_infer.py, test_table2.py, test_config.py): the run gin
# file, and macro bindings of a tiny run on the mini task (`tiny_gin`, tests/conftest.py, writes
# `TINY_GIN` to a file).
INFER_GIN = os.path.join(REPO, "configs", "runs", "infer.gin")

NUM_EXAMPLES = 5  # BATCH_SIZE 2: batches of 2, 2 and 1 (+ 1 padding row)
LENGTHS = {"inputs": 16, "targets": 8}


def infer_bindings(out_dir, **macros):
    """Gin bindings of a tiny speculative run (`macros` replace or add macros)."""
    values = dict(TARGET_MODEL="@tiny_target/t5.T5Config()",
                  DRAFT_MODEL="@tiny_draft/t5.T5Config()",
                  TARGET_CHECKPOINT="None", DRAFT_CHECKPOINT="None",
                  MIXTURE_OR_TASK_NAME=repr(tasks.MINI_TASK), TASK_FEATURE_LENGTHS=repr(LENGTHS),
                  INFER_OUTPUT_DIR=repr(str(out_dir) if out_dir else None),
                  NUM_EXAMPLES=str(NUM_EXAMPLES),
                  BATCH_SIZE="2", GAMMA="3", TEMPERATURE="0.0")
    values.update(macros)
    return [f"{k} = {v}" for k, v in values.items()]


def fake_interleaved(seconds):
    """For GAMMA = 'auto' runs: `costs.interleaved` with each program called once (its real
    results) and the seconds of `seconds[(kind, gamma)]` instead of a clock's."""
    def timer(programs, repeats, progress=None):
        del progress
        outputs = {name: fn() for name, fn in programs.items()}
        times = {name: [seconds[name[:2]]] * repeats for name in programs}
        return {name: 1.0 for name in programs}, times, outputs
    return timer


def script_env():
    """The environment of a script run as a subprocess: on CPU, TensorFlow quiet."""
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


# ----------------------------------------------------------------------------------------------
# Benchmark and alpha runs (tests/runs/test_benchmark.py, test_alpha.py, tests/measure/
# test_costs.py, test_acceptance.py, tests/models/test_synthetic.py): a tiny T5 of vocabulary 16
# under the gin scope `tiny` (`bench_gin`, tests/conftest.py, writes `BENCH_TINY_GIN` to a file).
BENCH_TINY = dict(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                  num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                  dropout_rate=0.0)
BENCH_TINY_GIN = (
    "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n\n"
    + "".join(f"tiny/t5.T5Config.{k} = {v!r}\n" for k, v in BENCH_TINY.items()))
N, L_IN = 16, 8  # max_decode_len and input length shared by the tests (one compilation each)


def bench_cfg():
    return t5.T5Config(**BENCH_TINY)
