"""speculative/beam/checks.py: the beam searches' arguments and inputs, each refused by name
before any forward (the decode loops' rules), in the jitted searches and the host reference."""

import numpy as np
import pytest

from speculative import decoding
from speculative.beam import reference as beam_reference
from speculative.beam import search as beam_lib
from speculative.runs import mini
from tests.helpers import TINY_INPUTS, random_params, tiny_config


def test_beam_search_arguments_are_checked(pair_and_inputs):
    target, draft, _ = pair_and_inputs
    inputs = np.ones((1, 4), np.int32)
    with pytest.raises(ValueError, match="draft_beam=1 is invalid: give an int >= beam_size=2"):
        beam_reference.host_speculative_beam_search(
            target, draft, inputs, beam_size=2, draft_beam=1, gamma=3, max_decode_len=8)
    with pytest.raises(ValueError, match="draft_beam=-1 is invalid: give an int >= 0"):
        beam_lib.speculative_beam_search(target, draft, inputs, beam_size=2, draft_beam=-1,
                                         gamma=3, max_decode_len=8)
    with pytest.raises(ValueError, match="beam_size=0"):
        beam_lib.beam_search(target, inputs, beam_size=0, max_decode_len=8)
    with pytest.raises(ValueError, match="draft_branch=0 is invalid: give an int >= 1"):
        beam_lib.speculative_beam_search(target, draft, inputs, beam_size=2, draft_beam=0,
                                         gamma=3, max_decode_len=8, draft_branch=0)
    with pytest.raises(ValueError, match="gamma=0"):
        beam_lib.speculative_beam_search(target, draft, inputs, beam_size=1, draft_beam=1,
                                         gamma=0, max_decode_len=8)
    with pytest.raises(TypeError, match="integer token ids"):  # the decode loops' rule
        beam_lib.beam_search(target, inputs.astype(np.float32), beam_size=1, max_decode_len=8)
    aware = mini.load("large_feature_draft")  # reads large_target's states
    with pytest.raises(TypeError, match="best_t5_draft"):  # the host reference cannot feed it
        beam_reference.host_speculative_beam_search(
            target, aware, inputs, beam_size=2, draft_beam=2, gamma=3, max_decode_len=8)
    with pytest.raises(ValueError, match=r"layers \(2, 4, 6\) include \[4, 6\]: this target"):
        beam_lib.speculative_beam_search(target, aware, inputs, beam_size=2, draft_beam=2,
                                         gamma=3, max_decode_len=8)



def test_beam_search_takes_numpy_length_penalties(tiny_models):
    """`length_penalty=np.float32(0.6)` is a finite float: accepted, same result as 0.6."""
    target = tiny_models[0]
    want = decoding.beam_search(target, TINY_INPUTS, beam_size=2, max_decode_len=4)
    for penalty in (np.float32(0.6), np.float64(0.6)):
        got = decoding.beam_search(target, TINY_INPUTS, beam_size=2, max_decode_len=4,
                                   length_penalty=penalty)
        np.testing.assert_array_equal(got.sequences, want.sequences)
    for bad in (np.float32("nan"), np.bool_(True), "0.6"):
        with pytest.raises(ValueError, match="length_penalty=.* is invalid: give a finite float"):
            decoding.beam_search(target, TINY_INPUTS, beam_size=2, max_decode_len=4,
                                 length_penalty=bad)


def test_beam_search_checks_inputs_like_the_decode_loops():
    """Negative ids, ids >= vocab, an all-padding row, zero length, an empty batch and a
    forward too large for memory: each refused before any forward, naming the input."""
    from speculative import decoding
    from speculative.models import t5 as t5_lib

    module = t5_lib.Transformer(tiny_config())
    model = decoding.EncoderDecoderModel(module, random_params(module, 0))
    ok = np.asarray([[3, 4, 1]], np.int32)
    cases = [
        (np.asarray([[3, -1, 1]]), ValueError, r"min -1"),
        (np.asarray([[3, 16, 1]]), ValueError, r"vocab_size=16"),
        (np.asarray([[3, 4, 1], [0, 0, 0]]), ValueError, r"rows \[1\] are all padding"),
        (np.zeros((1, 0), np.int32), ValueError, r"shape \(1, 0\)"),
        (np.zeros((0, 3), np.int32), ValueError, r"shape \(0, 3\)"),
        (np.asarray([[3.0, 4.0]]), TypeError, "float"),
    ]
    for search in (
            lambda x, **kw: decoding.beam_search(model, x, beam_size=2, **kw),
            lambda x, **kw: decoding.speculative_beam_search(model, model, x, beam_size=2,
                                                             draft_beam=2, gamma=2, **kw)):
        for inputs, error, message in cases:
            with pytest.raises(error, match=message):
                search(inputs, max_decode_len=4)
        with pytest.raises(ValueError, match=r"max_decode_len=1000000000.*needs [0-9.]+ GiB"):
            search(ok, max_decode_len=10**9)
        with pytest.raises(ValueError, match="max_decode_len=0"):
            search(ok, max_decode_len=0)
