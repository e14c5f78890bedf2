"""speculative/runs/config.py: gin macros checked by name, and multi-host flags checked before any
work."""

import os

import gin
import pytest

from speculative.data import tasks
from speculative.runs import config as config_lib
from tests.helpers.runs import TINY_GIN


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_incomplete_multihost_flags_are_refused_before_any_work():
    """--num_processes=2 --process_id=1 without a coordinator used to run one process that
    wrote outputs as if alone."""
    from speculative.runs import config as config_lib

    with pytest.raises(ValueError, match="give all three"):
        config_lib.initialize_distributed(None, 2, 1)
    with pytest.raises(ValueError, match=r"process_id=2 must lie in \[0, num_processes=2\)"):
        config_lib.initialize_distributed("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="distributed_timeout=0"):
        config_lib.initialize_distributed("localhost:1234", 2, 1, timeout_s=0)


# ----------------------------------------------------------------------------------------------
# From tests/test_infer.py.
REPO = config_lib.REPO_ROOT
INFER_GIN = os.path.join(REPO, "configs", "runs", "infer.gin")

NUM_EXAMPLES = 5  # BATCH_SIZE 2: batches of 2, 2 and 1 (+ 1 padding row)
LENGTHS = {"inputs": 16, "targets": 8}


def _bindings(out_dir, **macros):
    values = dict(TARGET_MODEL="@tiny_target/t5.T5Config()",
                  DRAFT_MODEL="@tiny_draft/t5.T5Config()",
                  TARGET_CHECKPOINT="None", DRAFT_CHECKPOINT="None",
                  MIXTURE_OR_TASK_NAME=repr(tasks.MINI_TASK), TASK_FEATURE_LENGTHS=repr(LENGTHS),
                  INFER_OUTPUT_DIR=repr(str(out_dir) if out_dir else None),
                  NUM_EXAMPLES=str(NUM_EXAMPLES),
                  BATCH_SIZE="2", GAMMA="3", TEMPERATURE="0.0")
    values.update(macros)
    return [f"{k} = {v}" for k, v in values.items()]


@pytest.fixture(scope="module")
def tiny_gin(tmp_path_factory):
    path = tmp_path_factory.mktemp("gin") / "tiny.gin"
    path.write_text(TINY_GIN)
    return str(path)


def test_misspelled_gin_macro_is_refused_with_the_closest_name(tiny_gin, tmp_path):
    with pytest.raises(ValueError, match="TEMPERATUR.*did you mean TEMPERATURE"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], _bindings(tmp_path) + ["TEMPERATUR = 1.0"])
    with pytest.raises(ValueError, match="no gin file defines the macro ZZZ"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], _bindings(tmp_path) + ["ZZZ = 1"])
    # Bindings of configurable parameters are gin's to check; known macros pass.
    config_lib.parse_gin([INFER_GIN, tiny_gin], _bindings(tmp_path) + ["TEMPERATURE = 1.0"])
