"""speculative/runs/infer_encode.py: a file's line is encoded exactly as the task encodes the
same text (prefix, vocabulary, EOS); inputs are fitted and batched with fixed shapes."""

import numpy as np
import pytest

from speculative.data import tasks
from speculative.decode import contract
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_encode, infer_inputs
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_a_file_line_encodes_as_the_task_encodes_it(tiny_gin):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, NUM_EXAMPLES="3"))
    settings = infer.infer(dry_run=True, task_feature_lengths={"inputs": 256, "targets": 256})
    task = infer_inputs.get_task(settings)
    assert infer_encode.task_prefix(task) == tasks.EN_DE_PREFIX
    from_task = infer_encode.encode(settings, task, infer_inputs.read_inputs(settings, task))
    lines = [infer_inputs.Source(index=ex.index, line=ex.index + 1,
                                 inputs_text=ex.inputs_text[len(tasks.EN_DE_PREFIX):],
                                 targets_text=ex.targets_text) for ex in from_task]
    from_file = infer_encode.encode(settings, task, lines)
    for a, b in zip(from_task, from_file):
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        np.testing.assert_array_equal(a.target_ids, b.target_ids)
        assert a.inputs_text == b.inputs_text  # the prefix the model read, as T5X writes it


def test_fit_and_batches():
    ids = np.arange(2, 12, dtype=np.int32)
    np.testing.assert_array_equal(infer_encode.fit_input(ids, 4, decoder_only=True), [8, 9, 10, 11])
    np.testing.assert_array_equal(infer_encode.fit_input(ids, 4, decoder_only=False),
                                  [2, 3, 4, contract.EOS_ID])
    rows = [np.array([5, 1]), np.array([6, 7, 1])]
    (first, n1), (last, n2) = infer_encode.batches(
        [type("E", (), {"input_ids": r})() for r in rows + rows[:1]], 2, 4)
    np.testing.assert_array_equal(first, [[5, 1, 0, 0], [6, 7, 1, 0]])
    np.testing.assert_array_equal(last, [[5, 1, 0, 0], [5, 1, 0, 0]])  # the filler repeats
    assert (n1, n2) == (2, 1) and first.dtype == np.int32
