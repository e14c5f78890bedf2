"""Tests for speculative.models.hybrid: the copy's law where the input matches and the model's
elsewhere (by hand), greedy speculative == greedy target, and the sampled law of three tokens
(chi-square, with a wrong kernel rejected)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import kernel as sampling_lib
from speculative.decode import loops as decoding
from speculative.models import hybrid, ngram, t5
from tests.helpers import decoding as td
from tests.helpers import tiny_config

V = 16


def test_copy_where_the_input_matches_the_model_elsewhere():
    unigram = ngram.fit_unigram([[3, 4, 4, 9, 1]], V)
    draft = hybrid.HybridDraft(unigram, ngram.PromptLookupDraft(V, min_ngram=2))
    inputs = jnp.asarray([[5, 6, 7, 1, 0, 0]], jnp.int32)
    state = draft.init(draft.params, inputs, 16)
    tokens = jnp.asarray([[0, 9, 5, 6, 7]], jnp.int32)
    logits, state = draft.extend(draft.params, state, tokens)
    logits = np.asarray(logits[0])
    model = np.asarray(unigram.params["log_probs"])
    # [BOS] matches the input's start (virtual BOS before it) only as a 1-gram: model.
    # [0, 9], [9, 5]: never seen: model. [5, 6] -> 7 and [6, 7] -> 1: copied (one-hot).
    for i in (0, 1, 2):
        np.testing.assert_allclose(logits[i], model, rtol=1e-6)
    for i, follower in ((3, 7), (4, 1)):
        assert np.isfinite(logits[i]).sum() == 1 and np.argmax(logits[i]) == follower
    assert state.copy.lengths[0] == 5  # both parts read every token
    # Rewinding rewinds both: re-reading position 3 with another token finds no copy.
    state = draft.rewind(state, jnp.asarray([3], jnp.int32))
    logits, _ = draft.extend(draft.params, state, jnp.asarray([[4]], jnp.int32))
    np.testing.assert_allclose(np.asarray(logits[0, 0]), model, rtol=1e-6)


def test_refuses_mismatched_parts():
    unigram = ngram.fit_unigram([], V)
    with pytest.raises(ValueError, match="vocab_size=8"):
        hybrid.HybridDraft(unigram, ngram.PromptLookupDraft(8))
    with pytest.raises(ValueError, match="decoder_only"):
        hybrid.HybridDraft(unigram, ngram.PromptLookupDraft(V, decoder_only=True))
    with pytest.raises(TypeError, match="PromptLookupDraft"):
        hybrid.HybridDraft(unigram, unigram)


def _pair(vocab, seeds):
    module = t5.Transformer(tiny_config(vocab_size=vocab))
    target, draft = td.pair(module, seeds=seeds)
    return module, target, hybrid.HybridDraft(draft, ngram.PromptLookupDraft(vocab,
                                                                             min_ngram=1))


def test_greedy_speculative_equals_greedy_target():
    _, target, draft = _pair(V, (0, 1))
    inputs = td.prompts([7, 3, 5, 1], 7)
    greedy = sampling_lib.SamplingConfig(temperature=0.0)
    ref = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                         sampling=greedy, max_decode_len=16)
    out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                      gamma=3, sampling=greedy, max_decode_len=16)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)


@pytest.fixture(scope="module")
def joint_case():
    module, target, draft = _pair(td.VOCAB, (3, 4))
    enc = np.array([[3, 5, 2, 7, 1]], np.int32)
    cfg = td.JOINT_CONFIGS["t1"]
    return module, target, draft, enc, cfg, td.exact_joint(module, target.params, enc, cfg)


def test_joint_law_of_three_tokens_matches_target(joint_case):
    _, target, draft, enc, cfg, probs = joint_case
    samples, stats = td.sample_three(target, draft, enc, cfg, gamma=3, seed=5)
    assert int(jnp.sum(stats.accepted)) > 0
    assert td.joint_pvalue(samples, probs) > 1e-6


def test_joint_law_rejects_a_wrong_kernel(joint_case, monkeypatch):
    """The negative control: resampling from p on rejection (a classic bug) is caught."""
    _, target, draft, enc, cfg, probs = joint_case
    samples = td.sample_three_with_wrong_kernel(monkeypatch, target, draft, enc, cfg, 3, 6)
    assert td.joint_pvalue(samples, probs) < 1e-6
