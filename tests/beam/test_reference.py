"""speculative/beam/reference.py: the host-driven beam search (T5X's algorithm step by step)
is the oracle of the jitted, cached search: the same sequences, scores and steps."""

import numpy as np
import pytest

from speculative.beam import reference as beam_reference
from speculative.beam import search as beam_lib
from speculative.data import text
from speculative.models import adapters
from speculative.runs import mini

MAX_LEN = 48


def _same_search(target, inputs, beam_size, max_decode_len, length_penalty=0.6):
    jitted = beam_lib.beam_search(target, inputs, beam_size=beam_size,
                                  max_decode_len=max_decode_len, length_penalty=length_penalty)
    host = beam_reference.host_beam_search(target, inputs, beam_size=beam_size,
                                     max_decode_len=max_decode_len,
                                     length_penalty=length_penalty)
    np.testing.assert_array_equal(jitted.sequences, host.sequences)
    np.testing.assert_allclose(jitted.scores, host.scores, rtol=1e-5)
    np.testing.assert_array_equal(jitted.row_steps, host.row_steps)
    assert jitted.target_calls == int(np.max(host.row_steps))  # one cached forward per step
    return jitted


@pytest.mark.parametrize("beam_size", [pytest.param(1, marks=pytest.mark.slow),
                                       pytest.param(2, marks=pytest.mark.slow), 4])
def test_jitted_beam_search_equals_the_host_search_on_the_bundled_pair(pair_and_inputs,
                                                                       beam_size):
    target, _, pairs = pair_and_inputs
    inputs = text.Tokenizer().encode_sources([s for s, _ in pairs[:6]], MAX_LEN)
    out = _same_search(target, inputs, beam_size, MAX_LEN)
    assert np.all(np.diff(out.scores, axis=1) <= 0)


@pytest.mark.parametrize("seed", [  # CI: the first six (every width and length penalty)
    k if k < 6 else pytest.param(k, marks=pytest.mark.slow) for k in range(12)])
def test_jitted_beam_search_equals_the_host_search_on_random_models(seed):
    """Twelve random tiny T5s (vocab 12, EOS frequent): early stops, rows finishing at
    different steps, rows with no finished beam, widths 1 to 4, length penalties 0 to 1.2."""
    from speculative.models import t5  # pylint: disable=g-import-not-at-top
    from tests.helpers import random_params, tiny_config  # pylint: disable=g-import-not-at-top

    module = t5.Transformer(tiny_config(vocab_size=12))
    target = adapters.EncoderDecoderModel(module, random_params(module, seed))
    rng = np.random.default_rng(seed)
    inputs = np.zeros((3, 6), np.int32)
    for b, n in enumerate(rng.integers(1, 7, 3)):
        inputs[b, :n] = rng.integers(2, 12, n)
    _same_search(target, inputs, beam_size=1 + seed % 4, max_decode_len=9,
                 length_penalty=(0.0, 0.6, 1.2)[seed % 3])


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [2, 4])
def test_jitted_beam_search_equals_the_host_search_on_256_test_sentences(pair_and_inputs,
                                                                         beam_size):
    target, _, _ = pair_and_inputs
    for inputs in mini.source_batches(256, 64, MAX_LEN):
        _same_search(target, inputs, beam_size, MAX_LEN)
