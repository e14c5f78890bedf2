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


# ----------------------------------------------------------------------------------------------
# Any drafter of `speculative_decode`: the search drives drafters, never asks their kind.


@pytest.mark.parametrize("draft_beam,branch", [(0, 1), (2, 2)])
def test_prompt_lookup_draft_gives_the_plain_search(draft_beam, branch):
    """A parameter-free copying draft (one-hot laws: -inf logits off its guess), as a model and
    as a drafter object, proposes the paths; the beams are the target's own."""
    from speculative.decode import drafters  # pylint: disable=g-import-not-at-top
    from speculative.models import ngram  # pylint: disable=g-import-not-at-top

    target, _ = _random_pair(3)
    inputs = np.asarray([[5, 6, 7, 5, 6, 1], [3, 4, 3, 4, 3, 1], [9, 2, 0, 0, 0, 0]], np.int32)
    kw = dict(beam_size=3, max_decode_len=9)
    plain = beam_lib.beam_search(target, inputs, **kw)
    lookup = ngram.PromptLookupDraft(vocab_size=12, max_ngram=2)
    for draft, gamma in ((lookup, 3), (drafters.ChainDrafter(lookup, 3), None)):
        spec = beam_lib.speculative_beam_search(target, draft, inputs, draft_beam=draft_beam,
                                                draft_branch=branch, gamma=gamma, **kw)
        np.testing.assert_array_equal(spec.sequences, plain.sequences)
        np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(spec.row_steps, plain.row_steps)
        assert spec.draft_calls == spec.rounds * (3 + 1 + (3 if draft_beam else 0))


def test_target_aware_drafter_object_gives_the_plain_search():
    """A `TargetAwareDrafter` given as the draft (the feature draft's own drafter): the target's
    features reach it through the drafter's methods; the beams are the target's own, and the
    draft calls count its re-read of the kept path."""
    from speculative.decode import drafters  # pylint: disable=g-import-not-at-top
    from tests.helpers import decoding as td  # pylint: disable=g-import-not-at-top

    _, target, draft = td.aware_pair()
    inputs = np.asarray([[3, 5, 2, 7, 1], [4, 1, 9, 0, 0]], np.int32)
    kw = dict(beam_size=2, max_decode_len=10)
    plain = beam_lib.beam_search(target, inputs, **kw)
    spec = beam_lib.speculative_beam_search(target, drafters.TargetAwareDrafter(draft, 3),
                                            inputs, draft_beam=2, gamma=None, **kw)
    np.testing.assert_array_equal(spec.sequences, plain.sequences)
    np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5, atol=1e-5)
    assert spec.draft_calls == spec.rounds * (3 + 1 + 1 + 3)


def test_a_drafter_that_cannot_propose_beam_paths_is_refused_in_one_line(tiny_models):
    """A token tree, a block draft, and a chain with dynamic gamma: each refused by name before
    anything is traced, in one line saying why; a drafter's gamma must agree with `gamma`."""
    from speculative.decode import drafters, tree_drafter  # pylint: disable=g-import-not-at-top

    target, draft = tiny_models
    kw = dict(beam_size=2, draft_beam=0, max_decode_len=4)
    inputs = np.asarray([[3, 4, 1]], np.int32)
    cases = [
        (tree_drafter.TreeDrafter(drafters.ChainDrafter(draft, 2), (2, 2)), TypeError,
         "TreeDrafter cannot draft for speculative beam search"),
        (drafters.BlockDrafter(draft, 2), TypeError,
         "BlockDrafter cannot draft for speculative beam search"),
        (drafters.ChainDrafter(draft, 2, confidence=0.5), ValueError,
         r"ChainDrafter\(confidence=0.5, schedule='constant'\): .* confidence=0"),
    ]
    for drafter, error, message in cases:
        with pytest.raises(error, match=message) as caught:
            beam_lib.speculative_beam_search(target, drafter, inputs, gamma=None, **kw)
        assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="gamma=3 but the drafter drafts 2 per round"):
        beam_lib.speculative_beam_search(target, drafters.ChainDrafter(draft, 2), inputs,
                                         gamma=3, **kw)


def test_the_beam_room_asks_no_model_or_drafter_what_it_is():
    """speculative/beam/ neither probes objects (hasattr) nor branches on the draft's kind
    (reads_target): the drafter's and the view's methods carry every kind-specific step."""
    import pathlib  # pylint: disable=g-import-not-at-top

    room = pathlib.Path(beam_lib.__file__).parent
    sources = {p.name: p.read_text() for p in sorted(room.glob("*.py"))}
    assert "search.py" in sources and "checks.py" in sources
    for name, source in sources.items():
        assert "hasattr(" not in source, name
        assert "reads_target" not in source, name
        assert "layers is None" not in source, name
