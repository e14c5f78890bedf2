"""runs/train_block_draft.py: the expected tokens of a block from its per-depth rates (the training
run and its per-depth acceptance run end to end with the bundled models: `-m slow` in
tests/training/test_block_training.py)."""

import pytest

from speculative.measure import analysis as theory
from speculative.runs import train_block_draft as block_draft


def test_expected_tokens_of_a_block_from_its_depth_rates():
    assert block_draft.expected_tokens([]) == 1.0  # the bonus alone
    assert block_draft.expected_tokens([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert block_draft.expected_tokens([1.0, 0.0, 1.0]) == pytest.approx(2.0)  # stops at a miss
    # equal rates at every depth: Eq. 1
    assert block_draft.expected_tokens([0.8] * 5) == pytest.approx(theory.expected_tokens(0.8, 5))
