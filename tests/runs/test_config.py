"""Faults and bad inputs: non-finite numbers never become accepted tokens, and bad arguments
are refused by name before any work (decode API, temperatures, cache size, run settings, the
trainer, the bundle, gin, the converter; the infer, benchmark and checkpoint suites add output
directories, interruption and corrupt checkpoints).

A target with NaN parameters must stop every row and flag it (`DecodeStats.nonfinite`) at
temperature 0 and 1, in both decoders, instead of emitting text computed from NaN; a draft with
NaN parameters must never get a token accepted (at temperature 0 the output still equals the
target's greedy output, at temperature 1 every token comes from the target alone). The kernel
rejects drafts at non-finite positions and leaves a broken q out of the residual.
"""

import pytest


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
