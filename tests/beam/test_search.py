"""Speculative beam search (paper A.4) equals the target's own T5X-style beam search, token for
token and score for score, on the bundled EN->DE pair and random pairs; and it saves target
calls. The jitted searches are checked against the host-driven references (the plain search's
own check: tests/beam/test_reference.py; the arguments: tests/beam/test_checks.py)."""


import numpy as np
import pytest

from speculative.beam import reference as beam_reference
from speculative.beam import search as beam_lib
from speculative.data import text
from speculative.decode import contract
from speculative.models import adapters
from speculative.runs import mini

MAX_LEN = 48


def _compare(target, draft, sources, beam_size, draft_beam, gamma=4, host=True):
    """`sources`: sentences, or their encoded `[B, MAX_LEN]` inputs. The jitted speculative
    search against the jitted plain one, and the host-driven reference against the
    host-driven plain search of the same forward shape (equal bit for bit)."""
    inputs = (sources if isinstance(sources, np.ndarray)
              else text.Tokenizer().encode_sources(sources, MAX_LEN))
    kw = dict(beam_size=beam_size, draft_beam=draft_beam, gamma=gamma, max_decode_len=MAX_LEN)
    spec = beam_lib.speculative_beam_search(target, draft, inputs, **kw)
    plain = beam_lib.beam_search(target, inputs, beam_size=beam_size, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(spec.sequences, plain.sequences)
    np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5)
    np.testing.assert_array_equal(spec.row_steps, plain.row_steps)  # the same steps, replayed
    if not host:
        return plain, spec
    # The reference: with forwards of the same shape the numbers are the same bit for bit.
    host = beam_reference.host_speculative_beam_search(target, draft, inputs, **kw)
    same_shape = beam_lib.beam_search(target, inputs, beam_size=beam_size,
                                      max_decode_len=MAX_LEN,
                                      rows=len(inputs) * (beam_size + draft_beam))
    np.testing.assert_array_equal(host.sequences, same_shape.sequences)
    np.testing.assert_array_equal(host.scores, same_shape.scores)
    np.testing.assert_array_equal(host.sequences, spec.sequences)
    return plain, spec


def _random_pair(seed):
    from speculative.models import t5  # pylint: disable=g-import-not-at-top
    from tests.helpers import random_params, tiny_config  # pylint: disable=g-import-not-at-top

    module = t5.Transformer(tiny_config(vocab_size=12))
    return tuple(adapters.EncoderDecoderModel(module, random_params(module, seed + k))
                 for k in (0, 100))


@pytest.mark.parametrize("seed", [  # CI: width 4, draft beam 0, gamma 4 (the bundled-pair
    # check covers a draft beam search)
    pytest.param(k, marks=pytest.mark.slow) if k != 3 else k for k in range(8)])
def test_jitted_speculative_beam_search_equals_plain_on_random_models(seed):
    """Random tiny pairs (vocab 12, EOS frequent; a draft unlike its target, so rounds end
    early and rows replay different numbers of steps): widths 1 to 4, gamma 1 to 4, 1 to 3
    first tokens per alive beam (draft_branch), batches of rows that stop at different rounds,
    length penalties 0 to 1.2."""
    target, draft = _random_pair(seed)
    rng = np.random.default_rng(seed)
    inputs = np.zeros((3, 6), np.int32)
    for b, n in enumerate(rng.integers(1, 7, 3)):
        inputs[b, :n] = rng.integers(2, 12, n)
    w, penalty = 1 + seed % 4, (0.0, 0.6, 1.2)[seed % 3]
    kw = dict(beam_size=w, max_decode_len=9, length_penalty=penalty)
    plain = beam_lib.beam_search(target, inputs, **kw)
    for draft_model in (draft, target):  # a self-draft replays every step it proposes
        spec = beam_lib.speculative_beam_search(target, draft_model, inputs,
                                                draft_beam=(0, w, w + 1)[seed % 3],
                                                draft_branch=1 + (seed + 1) % 3,
                                                gamma=1 + seed % 4, **kw)
        np.testing.assert_array_equal(spec.sequences, plain.sequences)
        np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(spec.row_steps, plain.row_steps)
        assert 1 <= spec.target_calls <= plain.target_calls


@pytest.mark.parametrize("beam_size,draft_beam,num,host", [  # CI: no host-driven reference
    (1, 2, 2, False), pytest.param(1, 2, 4, True, marks=pytest.mark.slow),
    pytest.param(2, 0, 4, False, marks=pytest.mark.slow),
    pytest.param(2, 4, 4, True, marks=pytest.mark.slow),
    pytest.param(4, 4, 2, True, marks=pytest.mark.slow),
    pytest.param(4, 8, 4, True, marks=pytest.mark.slow)])
def test_speculative_beam_search_equals_target_beam_search(pair_and_inputs, beam_size,
                                                           draft_beam, num, host):
    target, draft, pairs = pair_and_inputs
    plain, spec = _compare(target, draft, [s for s, _ in pairs[:num]], beam_size, draft_beam,
                           host=host)
    assert spec.target_calls < plain.target_calls  # the point of it
    assert np.all(np.diff(spec.scores, axis=1) <= 0)  # best beam first
    # Every returned best beam is a real translation: it ends with EOS within MAX_LEN.
    assert all(contract.EOS_ID in row for row in spec.sequences[:, 0])


@pytest.mark.slow
@pytest.mark.parametrize("beam_size,draft_beam", [(1, 2), (2, 4), (4, 8)])
def test_speculative_beam_search_equals_on_the_test_split(pair_and_inputs, beam_size,
                                                          draft_beam):
    """Every test sentence that fits MAX_LEN tokens (956 of 972; the encoder refuses to cut
    longer ones), in batches of 64: the jitted searches, a few minutes per width on 2 cores."""
    target, draft, pairs = pair_and_inputs
    batches = mini.source_batches(None, 64, MAX_LEN)
    assert sum(len(b) for b in batches) > 0.95 * len(pairs)
    for inputs in batches:
        _compare(target, draft, inputs, beam_size, draft_beam, host=False)


def test_non_finite_target_distribution_never_becomes_a_beam(pair_and_inputs):
    """A NaN in the target's parameters stops the search with an error naming it, instead of
    ranking NaN scores into kept beams."""
    import jax  # pylint: disable=g-import-not-at-top

    target, draft, _ = pair_and_inputs
    broken = adapters.EncoderDecoderModel(
        target.module, jax.tree_util.tree_map(lambda x: x * np.nan, target.params))
    inputs = np.asarray([[5, 6, 7, contract.EOS_ID]], np.int32)
    for search in (lambda: beam_lib.beam_search(broken, inputs, beam_size=2, max_decode_len=4),
                   lambda: beam_lib.speculative_beam_search(
                       broken, draft, inputs, beam_size=2, draft_beam=2, gamma=2,
                       max_decode_len=4)):
        with pytest.raises(FloatingPointError, match="NaN or infinite"):
            search()
