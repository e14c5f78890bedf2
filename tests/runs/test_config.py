"""speculative/runs/config.py: gin macros checked by name, and multi-host flags checked before any
work."""

import pytest

from speculative.runs import config as config_lib
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


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


def test_misspelled_gin_macro_is_refused_with_the_closest_name(tiny_gin, tmp_path):
    with pytest.raises(ValueError, match="TEMPERATUR.*did you mean TEMPERATURE"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["TEMPERATUR = 1.0"])
    with pytest.raises(ValueError, match="no gin file defines the macro ZZZ"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["ZZZ = 1"])
    # Bindings of configurable parameters are gin's to check; known macros pass.
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["TEMPERATURE = 1.0"])
