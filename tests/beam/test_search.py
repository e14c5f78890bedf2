"""Speculative beam search (paper A.4) equals the target's own T5X-style beam search, token for
token and score for score, on the bundled EN->DE pair and random pairs; and it saves target
calls. The jitted searches are checked against the host-driven references."""


import numpy as np
import pytest

from speculative import decoding
from speculative.beam import reference as beam_reference
from speculative.beam import search as beam_lib
from speculative.data import text
from speculative.decode import contract
from speculative.models import adapters, t5
from speculative.runs import mini
from tests.helpers import random_params, tiny_config

MAX_LEN = 48


@pytest.fixture(scope="module")
def pair_and_inputs():
    target, draft = mini.load(mini.MINI_TARGET), mini.load("mini_draft_10")
    pairs = text.load_pairs(f"{text.MINI_DIR}/test.tsv")
    return target, draft, pairs


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


# ----------------------------------------------------------------------------------------------
# The jitted, cached search against the host-driven reference (T5X's algorithm step by step).


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


# ----------------------------------------------------------------------------------------------
# From tests/beam/test_faults_tmp.py.
@pytest.fixture(scope="module")
def models():
    module = t5.Transformer(tiny_config())
    target = decoding.EncoderDecoderModel(module, random_params(module, 0))
    draft = decoding.EncoderDecoderModel(module, random_params(module, 1))
    return target, draft


INPUTS = np.asarray([[5, 6, 7, 1], [9, 3, 1, 0]], np.int32)


def test_beam_search_takes_numpy_length_penalties(models):
    """`length_penalty=np.float32(0.6)` is a finite float: accepted, same result as 0.6."""
    target = models[0]
    want = decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4)
    for penalty in (np.float32(0.6), np.float64(0.6)):
        got = decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4,
                                   length_penalty=penalty)
        np.testing.assert_array_equal(got.sequences, want.sequences)
    for bad in (np.float32("nan"), np.bool_(True), "0.6"):
        with pytest.raises(ValueError, match="length_penalty=.* is invalid: give a finite float"):
            decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4,
                                 length_penalty=bad)


def test_beam_search_checks_inputs_like_the_decode_loops():
    """Negative ids, ids >= vocab, an all-padding row, zero length, an empty batch and a
    forward too large for memory: each refused before any forward, naming the input."""
    from speculative import decoding
    from speculative.models import t5 as t5_lib
    from tests.helpers import random_params, tiny_config

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
