"""Tests for speculative.models.ngram: fitted probabilities, the decode-state contract, prompt
lookup on hand-made contexts, greedy speculative == greedy target, and bigram alpha > unigram alpha.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decode import kernel as sampling
from speculative.models import ngram, t5

V = 16
GREEDY = sampling.SamplingConfig(temperature=0.0)
CFG = t5.T5Config(vocab_size=V, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                  num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                  dropout_rate=0.0)


def _probs(draft):
    return np.exp(np.asarray(draft.params["log_probs"], np.float64))


# ----------------------------------------------------------------------------------------------
# Fitting.

CORPUS = [[2, 3, 3, 1], [3, 1]]


def test_fit_unigram_by_hand():
    k = 0.5
    draft = ngram.fit_unigram(CORPUS, 5, smoothing=k)
    counts = np.array([0, 2, 1, 3, 0])  # 6 tokens
    np.testing.assert_allclose(_probs(draft), (counts + k) / (6 + 5 * k), rtol=1e-6)
    # A right-padded array is the same corpus.
    padded = ngram.fit_unigram(np.array([[2, 3, 3, 1], [3, 1, 0, 0]]), 5, smoothing=k)
    np.testing.assert_array_equal(padded.params["log_probs"], draft.params["log_probs"])
    assert draft.vocab_size == 5


def test_fit_bigram_by_hand():
    k = 0.5
    draft = ngram.fit_bigram(CORPUS, 5, smoothing=k)
    p = _probs(draft)
    # Pairs with BOS first: (0,2) (2,3) (3,3) (3,1) | (0,3) (3,1).
    np.testing.assert_allclose(p[0], (np.array([0, 0, 1, 1, 0]) + k) / (2 + 5 * k), rtol=1e-6)
    np.testing.assert_allclose(p[2], (np.array([0, 0, 0, 1, 0]) + k) / (1 + 5 * k), rtol=1e-6)
    np.testing.assert_allclose(p[3], (np.array([0, 2, 0, 1, 0]) + k) / (3 + 5 * k), rtol=1e-6)
    np.testing.assert_allclose(p[1], np.full(5, 0.2), rtol=1e-6)  # unseen context: uniform
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(ngram.bigram_counts(CORPUS, 5)[3], [0, 2, 0, 1, 0])


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ngram.fit_bigram([[2, 7]], 5)
    with pytest.raises(ValueError, match="smoothing"):
        ngram.fit_unigram(CORPUS, 5, smoothing=0.0)


def test_save_load_roundtrip(tmp_path):
    for fit, cls in ((ngram.fit_unigram, ngram.UnigramDraft),
                     (ngram.fit_bigram, ngram.BigramDraft)):
        draft = fit(CORPUS, 5)
        path = tmp_path / f"{cls.kind}.npz"
        draft.save(path)
        loaded = cls.load(path, decoder_only=True)
        np.testing.assert_array_equal(loaded.params["log_probs"], draft.params["log_probs"])
        assert loaded.decoder_only and loaded.vocab_size == 5
    with pytest.raises(ValueError, match="does not hold a bigram"):
        ngram.BigramDraft.load(tmp_path / "unigram.npz")
    with pytest.raises(FileNotFoundError, match="fit_bigram"):
        ngram.BigramDraft.load(tmp_path / "missing.npz")


# ----------------------------------------------------------------------------------------------
# The decode-state contract.


def _drafts(decoder_only):
    corpus = np.random.default_rng(0).integers(1, V, (20, 10))
    return [ngram.fit_unigram(corpus, V, decoder_only=decoder_only),
            ngram.fit_bigram(corpus, V, decoder_only=decoder_only),
            ngram.PromptLookupDraft(V, decoder_only=decoder_only)]


def test_init_matches_t5_cache_layout():
    prompts = jnp.array([[3, 4, 5], [6, 0, 0], [0, 0, 0]])
    d = ngram.PromptLookupDraft(V, decoder_only=True)
    s = d.init(d.params, prompts, 8)
    np.testing.assert_array_equal(s.lengths, [3, 1, 0])
    np.testing.assert_array_equal(s.pending, [5, 6, 0])
    np.testing.assert_array_equal(s.history[0, :3], [0, 3, 4])
    assert d.prefix_length(3) == 4
    e = ngram.PromptLookupDraft(V)
    s = e.init(e.params, prompts, 8)
    np.testing.assert_array_equal(s.lengths, [0, 0, 0])
    np.testing.assert_array_equal(s.pending, [0, 0, 0])
    assert e.prefix_length(3) == 0 and s.history.shape == (3, 8)
    with pytest.raises(ValueError, match="does not fit"):
        d.init(d.params, prompts, 3)


@pytest.mark.parametrize("decoder_only", [False, True])
def test_chunked_extend_equals_one_by_one(decoder_only):
    prompts = jnp.array([[4, 5, 6, 4, 5], [7, 7, 0, 0, 0]])
    tokens = jnp.array([[6, 4, 5, 9, 6, 4], [7, 3, 7, 7, 3, 2]])
    for d in _drafts(decoder_only):
        extend = jax.jit(d.extend)
        state = d.init(d.params, prompts, 16)
        full, full_state = extend(d.params, state, tokens)
        pieces = []
        for i in range(tokens.shape[1]):
            logits, state = extend(d.params, state, tokens[:, i:i + 1])
            pieces.append(logits)
        np.testing.assert_array_equal(jnp.concatenate(pieces, 1), full)
        np.testing.assert_array_equal(state.lengths, full_state.lengths)
        np.testing.assert_array_equal(state.history, full_state.history)
        assert full.shape == (2, 6, V) and full.dtype == jnp.float32


@pytest.mark.parametrize("decoder_only", [False, True])
def test_rewind_then_extend_equals_fresh(decoder_only):
    prompts = jnp.array([[4, 5, 6, 0], [7, 8, 9, 10]])
    prefix = jnp.array([[4, 5], [8, 9]])
    junk = jnp.array([[6, 2, 2], [10, 3, 3]])  # stale slots that would match if read
    real = jnp.array([[2, 6, 2], [3, 10, 3]])
    for d in _drafts(decoder_only):
        extend = jax.jit(d.extend)
        state = d.init(d.params, prompts, 16)
        _, state = extend(d.params, state, prefix)
        fresh_logits, _ = extend(d.params, state, real)
        _, dirty = extend(d.params, state, junk)
        dirty = d.rewind(dirty, state.lengths + jnp.array([0, 1]))  # row 1 keeps junk[1, 0]
        logits0, _ = extend(d.params, d.rewind(dirty, state.lengths), real)
        np.testing.assert_array_equal(logits0, fresh_logits)
        # Row 1 kept one token; its continuation must equal a fresh history with that token.
        kept = jnp.concatenate([junk[:, :1], real[:, :2]], 1)
        ref, _ = extend(d.params, state, kept)
        got, _ = extend(d.params, dirty, real[:, :2])
        np.testing.assert_array_equal(got[1], ref[1, 1:])


# ----------------------------------------------------------------------------------------------
# Prompt lookup on hand-made contexts.


@functools.lru_cache(maxsize=None)
def _lookup_draft(decoder_only, **kw):
    d = ngram.PromptLookupDraft(V, decoder_only=decoder_only, **kw)
    return d, jax.jit(d.extend)


def _lookup(inputs, tokens, decoder_only=False, **kw):
    """Prompt-lookup logits for one row; inputs and tokens are padded to fixed shapes (one
    compile per setting; junk tokens after `tokens` cannot change earlier positions)."""
    d, extend = _lookup_draft(decoder_only, **kw)
    padded_inputs = jnp.array([list(inputs) + [0] * (8 - len(inputs))])
    padded_tokens = jnp.array([list(tokens) + [V - 1] * (6 - len(tokens))])
    state = d.init(d.params, padded_inputs, 24)
    logits, _ = extend(d.params, state, padded_tokens)
    logits = np.asarray(logits[0, :len(tokens)])
    found = np.isfinite(logits).sum(-1) == 1
    pred = [int(np.argmax(row)) if f else None for row, f in zip(logits, found)]
    return pred, logits


def test_prompt_lookup_copies_longest_most_recent_match():
    # BOS -> the input's first token (virtual BOS before the input); 9 never seen -> uniform;
    # 5 -> 6 (input); [5, 6] -> 7 (input); [6, 7, 3]... 3 unseen before -> uniform.
    pred, logits = _lookup([5, 6, 7, 1, 0, 0], [0, 9, 5, 6, 3])
    assert pred == [5, None, 6, 7, None]
    np.testing.assert_allclose(logits[1], np.full(V, -np.log(V)), rtol=1e-6)
    np.testing.assert_allclose(logits[4], np.full(V, -np.log(V)), rtol=1e-6)
    # Most recent of two equal-length matches: [2, 3] is followed by 4, later by 5.
    pred, _ = _lookup([2, 3, 4, 2, 3, 5], [0, 7, 2, 3])
    assert pred[-1] == 5
    # ... but at the start, [BOS, 2, 3] matches the input's start (virtual BOS): 3-gram -> 4.
    pred, _ = _lookup([2, 3, 4, 2, 3, 5], [0, 2, 3])
    assert pred[-1] == 4
    # Longest beats most recent: [9, 3] -> 4 (earlier) beats [3] -> 5 (later).
    pred, _ = _lookup([9, 3, 4, 3, 5], [0, 8, 9, 3])
    assert pred[-1] == 4
    pred, _ = _lookup([9, 3, 4, 3, 5], [0, 8, 9, 3], max_ngram=1)
    assert pred[-1] == 5
    pred, _ = _lookup([9, 3, 4, 3, 5], [0, 8, 9, 3], min_ngram=3)
    assert pred[-1] is None
    # The decoder's own text is context too; a match may end just before the current token.
    pred, _ = _lookup([1], [0, 4, 8, 4, 4, 4])
    assert pred[1:] == [None, None, 8, 4, 4]
    # The trailing n-gram itself, padding and the last input token (no follower) never match.
    pred, _ = _lookup([6, 0, 0], [0, 6])
    assert pred == [6, None]


def test_prompt_lookup_decoder_only_and_eps():
    # History [BOS, 3, 4, 5]; pending 3 -> [3] occurred at slot 1, followed by 4.
    pred, _ = _lookup([3, 4, 5, 3], [3, 4, 5], decoder_only=True)
    assert pred == [4, 5, 3]
    eps = 0.1
    _, logits = _lookup([3, 4, 5, 3], [3, 9], decoder_only=True, eps=eps)
    probs = np.exp(logits.astype(np.float64))
    np.testing.assert_allclose(probs[0, 4], 1 - eps, rtol=1e-6)
    np.testing.assert_allclose(np.delete(probs[0], 4), eps / (V - 1), rtol=1e-5)
    np.testing.assert_allclose(probs[1], 1.0 / V, rtol=1e-6)  # 9 unseen -> uniform
    with pytest.raises(ValueError, match="eps"):
        ngram.PromptLookupDraft(V, eps=1.0)
    with pytest.raises(ValueError, match="min_ngram"):
        ngram.PromptLookupDraft(V, min_ngram=3, max_ngram=2)


# ----------------------------------------------------------------------------------------------
# Inside the decode loops, with a tiny random T5 target.


@functools.lru_cache(maxsize=None)
def _target(decoder_only):
    module = t5.DecoderOnly(CFG) if decoder_only else t5.Transformer(CFG)
    params = t5.init_params(module, jax.random.PRNGKey(0))
    cls = decoding.DecoderOnlyModel if decoder_only else decoding.EncoderDecoderModel
    return cls(module, params)


def _inputs(batch, length, seed):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, V, (batch, length))
    lengths = rng.integers(1, length + 1, batch)
    lengths[:4] = [length, length - 2, 2, 1][:batch]
    inputs[np.arange(length)[None] >= lengths[:, None]] = 0
    return jnp.asarray(inputs, jnp.int32)


@functools.lru_cache(maxsize=None)
def _greedy_reference(decoder_only):
    inputs = _inputs(4, 6, seed=1)
    ref = decoding.autoregressive_decode(_target(decoder_only), inputs, rng=jax.random.PRNGKey(0),
                                         sampling=GREEDY, max_decode_len=12)
    return inputs, ref


# Every gamma for the encoder-decoder; the decoder-only target at the edges (each case compiles
# its own decode loop, ~2-3 s on CPU). CI: gamma 1 and 4 encoder-decoder, 4 decoder-only.
_CASES = ([(False, kind, g) if g in (1, 4) else
           pytest.param(False, kind, g, marks=pytest.mark.slow)
           for kind in ("bigram", "prompt_lookup") for g in (1, 2, 3, 4)]
          + [(True, kind, g) if g == 4 else pytest.param(True, kind, g, marks=pytest.mark.slow)
             for kind in ("bigram", "prompt_lookup") for g in (1, 4)])


@pytest.mark.parametrize("decoder_only,kind,gamma", _CASES)
def test_greedy_speculative_equals_greedy_target(decoder_only, kind, gamma):
    inputs, ref = _greedy_reference(decoder_only)
    if kind == "bigram":  # fitted on the target's own greedy text, so many drafts are accepted
        draft = ngram.fit_bigram(np.asarray(ref.tokens), V, decoder_only=decoder_only)
    else:
        draft = ngram.PromptLookupDraft(V, decoder_only=decoder_only)
    out = decoding.speculative_decode(_target(decoder_only), draft, inputs,
                                      rng=jax.random.PRNGKey(1), gamma=gamma, sampling=GREEDY,
                                      max_decode_len=12)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert int(jnp.sum(out.stats.accepted)) > 0  # the drafts were not all rejected


def test_bigram_alpha_beats_unigram():
    """Fitted on text sampled from the target, a bigram predicts it better (alpha at T = 1) than a
    unigram, which for this flat random target is nearly uniform (alpha ~0.69 vs ~0.74 with these
    keys; paper Table 3 has the same order: 0.07 vs 0.19 on EnDe).

    The training text is sampled by speculative decoding with a uniform draft (exact sampling from
    the target), so the unigram evaluation reuses that compiled loop.
    """
    target = _target(False)
    t1 = sampling.SamplingConfig(temperature=1.0)
    spec = functools.partial(decoding.speculative_decode, target, gamma=2, sampling=t1,
                             max_decode_len=16)
    uniform = ngram.fit_unigram([], V)
    corpus = []
    for seed in (2, 3):
        train = spec(uniform, _inputs(64, 6, seed=seed), rng=jax.random.PRNGKey(seed))
        corpus += [row[:n] for row, n in zip(np.asarray(train.tokens), np.asarray(train.lengths))]
    unigram = ngram.fit_unigram(corpus, V)
    bigram = ngram.fit_bigram(corpus, V)
    assert np.exp(np.asarray(unigram.params["log_probs"])).max() < 3.0 / V  # uniform-ish
    test_inputs = _inputs(64, 6, seed=4)
    alpha = {name: spec(d, test_inputs, rng=jax.random.PRNGKey(4)).stats.alpha
             for name, d in (("unigram", unigram), ("bigram", bigram))}
    assert alpha["bigram"] > alpha["unigram"] + 0.02, alpha
