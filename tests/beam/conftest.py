"""The bundled EN->DE pair and its test sentences, shared by the beam tests."""

import pytest

from speculative.data import text
from speculative.runs import mini


@pytest.fixture(scope="module")
def pair_and_inputs():
    target, draft = mini.load(mini.MINI_TARGET), mini.load("mini_draft_10")
    pairs = text.load_pairs(f"{text.MINI_DIR}/test.tsv")
    return target, draft, pairs
