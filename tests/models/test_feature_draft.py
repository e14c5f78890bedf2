"""The target-aware draft: its unrolled training forward is its decode mode, round by round."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from speculative.beam import search as beam_lib
from speculative.decode import drafters
from speculative.decode import kernel as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode.contract import write_rows
from speculative.decode.kernel import SamplingConfig
from speculative.models import adapters, t5
from speculative.models import feature_draft as fd
from tests.helpers import decoding as td
from tests.helpers import random_params, tiny_config


def _draft(feature_layers=(1, 2), **kw):
    cfg = fd.FeatureDraftConfig(vocab_size=23, target_emb_dim=6, feature_layers=feature_layers,
                                emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16, **kw)
    module = fd.FeatureDraft(cfg)
    return module, fd.init_params(module, jax.random.PRNGKey(1))


@pytest.mark.parametrize("feature_layers,num_layers", [  # CI: no features; with them: slow
    pytest.param((1, 2), 1, marks=pytest.mark.slow),
    pytest.param((2,), 2, marks=pytest.mark.slow), ((), 1)])
def test_unrolled_training_equals_decode_rounds(feature_layers, num_layers):
    module, params = _draft(feature_layers, num_layers=num_layers)
    cfg = module.config
    rng = np.random.default_rng(0)
    length, depth = 9, 3
    tokens = jnp.asarray(np.concatenate([[0], rng.integers(2, 23, length - 1)])[None], jnp.int32)
    feats = jnp.asarray(rng.normal(size=(1, length, max(cfg.feature_dim, 1))), jnp.float32)
    feats = feats[..., :cfg.feature_dim]
    encoded = jnp.asarray(rng.normal(size=(1, 5, 6)), jnp.float32)
    mask = jnp.asarray([[True, True, True, True, False]])
    train = module.apply({"params": params}, encoded, mask, tokens, feats, depth)
    model = fd.FeatureDraftModel(module, params)
    extend = jax.jit(model.extend)  # (op-by-op flax is slower than one compile per shape)
    prev = jnp.pad(feats[:, :-1], ((0, 0), (1, 0), (0, 0)))  # feature of the previous position
    for start in range(length - depth + 1):  # a round whose first draft is at position `start`
        state = model.init(params, None, 16, context=(encoded, mask))
        logits, state = extend(params, state, tokens[:, :start + 1],
                               prev[:, :start + 1])  # catch-up: every true feature
        got = [logits[:, -1]]
        for d in range(1, depth):
            pos = start + d
            logits, state = extend(params, state, tokens[:, pos:pos + 1])
            got.append(logits[:, 0])
        for d in range(depth):
            np.testing.assert_allclose(got[d][0], train[d, 0, start + d], rtol=2e-4, atol=2e-5)


def test_a_decoder_only_draft_reads_the_prompt_as_its_training_forward_does():
    """`init_prefix_cache` (the prompt, with the target's features of it) and then the decode
    rounds equal the teacher-forced forward over the same sequence, at every depth."""
    module, params = _draft(cross_attention=False)
    rng = np.random.default_rng(3)
    length, prompt_len, depth = 10, 4, 3
    tokens = jnp.asarray(np.concatenate([[0], rng.integers(2, 23, length - 1)])[None], jnp.int32)
    feats = jnp.asarray(rng.normal(size=(1, length, module.config.feature_dim)), jnp.float32)
    train = module.apply({"params": params}, None, None, tokens, feats, depth)
    model = fd.FeatureDraftModel(module, params)
    assert model.prefix_length(prompt_len) == prompt_len + 1
    extend = jax.jit(model.extend)
    prompt = tokens[:, 1:prompt_len + 1]
    state = model.init(params, prompt, 16, context=feats[:, :prompt_len + 1])
    assert int(state.lengths[0]) == prompt_len  # BOS + prompt[:-1]; the last one is pending
    logits, state = extend(params, state, tokens[:, prompt_len:prompt_len + 1],
                           feats[:, prompt_len - 1:prompt_len])
    got = [logits[:, 0]]
    for d in range(1, depth):
        logits, state = extend(params, state, tokens[:, prompt_len + d:prompt_len + d + 1])
        got.append(logits[:, 0])
    for d in range(depth):
        np.testing.assert_allclose(got[d][0], train[d, 0, prompt_len + d], rtol=2e-4, atol=2e-5)


def test_rewind_then_extend_reads_the_hidden_state_of_the_last_kept_position():
    module, params = _draft()
    model = fd.FeatureDraftModel(module, params)
    encoded = jnp.ones((2, 3, 6))
    mask = jnp.ones((2, 3), bool)
    feats = jax.random.normal(jax.random.PRNGKey(2), (2, 4, module.config.feature_dim))
    tokens = jnp.asarray([[0, 5, 6, 7], [0, 8, 9, 10]], jnp.int32)
    state = model.init(params, None, 12, context=(encoded, mask))
    extend = jax.jit(model.extend)
    _, full = extend(params, state, tokens, feats)
    # Rewinding row 0 to 2 positions and extending must equal a cache that only ever held 2.
    _, short = extend(params, state, tokens[:, :2], feats[:, :2])
    a, _ = extend(params, model.rewind(full, jnp.asarray([2, 2])), tokens[:, 2:3])
    b, _ = extend(params, short, tokens[:, 2:3])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="emb_dim"):
        fd.FeatureDraftConfig(vocab_size=10, target_emb_dim=4, emb_dim=0)
    with pytest.raises(ValueError, match="feature_layers"):
        fd.FeatureDraftConfig(vocab_size=10, target_emb_dim=4, feature_layers=(0,))
    with pytest.raises(ValueError, match="one token"):
        module, params = _draft()
        model = fd.FeatureDraftModel(module, params)
        state = model.init(params, None, 8, context=(jnp.ones((1, 2, 6)), jnp.ones((1, 2), bool)))
        model.extend(params, state, jnp.zeros((1, 2), jnp.int32))


# ----------------------------------------------------------------------------------------------
# Exactness inside speculative_decode, on tiny random target-aware pairs.


_SLOW = dict(marks=pytest.mark.slow)


@pytest.mark.parametrize("kind,feature_layers,gamma,tree", [
    ("encoder_decoder", (1, 2), 1, None), ("decoder_only", (1, 2), 3, None),
    ("decoder_only", (1, 2), 2, (2, 1)),
    pytest.param("encoder_decoder", (), 3, None, **_SLOW),
    pytest.param("encoder_decoder", (1, 2), 3, None, **_SLOW),
    pytest.param("encoder_decoder", (1, 2), 6, None, **_SLOW),
    pytest.param("encoder_decoder", (), 1, None, **_SLOW),
    pytest.param("encoder_decoder", (), 6, None, **_SLOW),
    pytest.param("decoder_only", (), 3, None, **_SLOW),
    pytest.param("decoder_only", (1, 2), 1, None, **_SLOW)])
def test_greedy_identity_batch4_prompts_of_different_lengths(kind, feature_layers, gamma, tree):
    """Batch 4 (a decoder-only target's batch has an empty prompt); a chain, also with dynamic
    gamma and the +2/-1 schedule (they feed the catch-up chunk differently), or a token tree."""
    pair = td.aware_pair if kind == "encoder_decoder" else td.aware_lm_pair
    _, target, draft = pair(feature_layers=feature_layers)
    lengths = [7, 2, 5, 1] if kind == "encoder_decoder" else [6, 2, 0, 4]
    rng = np.random.default_rng(0)
    inputs = np.zeros((4, max(lengths)), np.int32)
    for b, n in enumerate(lengths):
        inputs[b, :n] = rng.integers(2, 16, n)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=18)
    ar = decoding.autoregressive_decode(target, inputs, **kw)
    sp = decoding.speculative_decode(target, draft, inputs, gamma=gamma, tree=tree, **kw)
    np.testing.assert_array_equal(sp.tokens, ar.tokens)
    np.testing.assert_array_equal(sp.lengths, ar.lengths)
    if tree is None:
        for extra in (dict(confidence=0.5), dict(schedule="heuristic", initial_gamma=1)):
            drafter = drafters.TargetAwareDrafter(draft, gamma, **extra)
            other = decoding.speculative_decode(target, drafter, inputs, gamma=gamma, **kw)
            np.testing.assert_array_equal(other.tokens, ar.tokens)


@struct.dataclass
class _CheckingSelfDraft:
    """A target-aware test double: the target drafting for itself, which also recomputes the
    target's features of every position it is fed and garbles its logits wherever the features
    the loop passed differ from them. With correct plumbing every draft is accepted at
    temperature 0; a feature from the wrong position makes q_1 garbage and it is rejected."""

    target: Any
    params: Any
    feature_layers: tuple = struct.field(pytree_node=False, default=(1, 2))
    reads_target: bool = struct.field(pytree_node=False, default=True)
    max_length: Any = struct.field(pytree_node=False, default=None)

    vocab_size = 16
    feature_dim = 32

    def prefix_length(self, input_length):
        return self.target.prefix_length(input_length)

    def init(self, params, inputs, max_len, context=None):
        assert context is not None
        state = self.target.init(self.target.params, inputs, max_len)
        feats = jnp.zeros((inputs.shape[0], max_len, self.feature_dim))
        if isinstance(self.target, adapters.DecoderOnlyModel):  # the prompt's, from the prefill
            feats = feats.at[:, :context.shape[1]].set(context)
        return state, feats

    def extend(self, params, state, tokens, features=None):
        cache, feats = state
        start = cache.lengths
        logits, own, cache = self.target.module.apply(  # not the adapter the control patches
            {"params": self.target.params}, cache, tokens, self.feature_layers,
            method="extend_with_features")
        if features is not None:  # feature of position p must be the target's state at p - 1
            before = jnp.take_along_axis(feats, jnp.maximum(start - 1, 0)[:, None, None], 1)
            before = jnp.where((start > 0)[:, None, None], before, 0.0)
            expected = jnp.concatenate([before, own[:, :-1]], axis=1)
            wrong = jnp.any(jnp.abs(expected - features) > 1e-3 * (1 + jnp.abs(expected)), -1)
            logits = jnp.where(wrong[..., None], jnp.zeros_like(logits).at[..., 0].set(9.0),
                               logits)
        feats = write_rows(feats, own, start)
        return logits, (cache, feats)

    def rewind(self, state, lengths):
        return self.target.rewind(state[0], lengths), state[1]


@pytest.mark.parametrize("gamma,tree", [  # CI: gamma 4 and a tree
    pytest.param(1, None, marks=pytest.mark.slow), pytest.param(2, None, marks=pytest.mark.slow),
    (4, None), (3, (2, 2, 1))])
def test_the_loop_feeds_each_position_the_targets_features_of_the_position_before(gamma, tree):
    """Chains, and a token tree, whose kept path's features are gathered from its nodes."""
    _, target, _ = td.aware_pair()
    inputs = np.asarray([[3, 5, 2, 7, 1], [4, 1, 0, 0, 0]], np.int32)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=14)
    out = decoding.speculative_decode(target, _CheckingSelfDraft(target, None), inputs,
                                      gamma=gamma, tree=tree, **kw)
    ar = decoding.autoregressive_decode(target, inputs, **kw)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    stats = out.stats
    # Every examined draft was accepted (a full round always; a shorter last round near EOS).
    np.testing.assert_array_equal(stats.accepted, stats.tested)
    assert int(np.sum(stats.accepted)) >= int(np.sum(stats.target_calls)) * 1


def test_the_checking_draft_catches_a_feature_from_the_wrong_position(monkeypatch):
    """Negative control: shift the verification's features by one position."""
    _, target, _ = td.aware_pair()
    real = adapters.EncoderDecoderModel.extend_with_features

    def shifted(self, params, state, tokens, feature_layers):
        logits, feats, state = real(self, params, state, tokens, feature_layers)
        return logits, jnp.roll(feats, 1, axis=1), state

    inputs = np.asarray([[3, 5, 2, 7, 1]], np.int32)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=14)
    checker = _CheckingSelfDraft(target, None)
    good = decoding.speculative_decode(target, checker, inputs, gamma=3, **kw).stats
    jax.clear_caches()
    monkeypatch.setattr(adapters.EncoderDecoderModel, "extend_with_features", shifted)
    try:
        bad = decoding.speculative_decode(target, checker, inputs, gamma=3, **kw).stats
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert float(good.alpha) == 1.0
    assert float(bad.alpha) < 0.9


def _with_pending_feature_of_its_own_position(run):
    """`run()` with a decoder-only target whose pending token is read with the feature of its
    own position instead of the one before (the negative control of the two tests below)."""
    def own_position(self, state, feature_layers):
        picked = jnp.take_along_axis(state.prefix_features, state.lengths[:, None, None], 1)
        return picked[:, 0]

    jax.clear_caches()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(adapters.DecoderOnlyModel, "pending_features", own_position)
            return run()
    finally:
        jax.clear_caches()


def test_the_loop_feeds_a_decoder_only_target_s_features_from_the_prompt_on():
    """The draft of a decoder-only target starts from the prefill's features (the prompt's last
    cached position before the pending token; nothing before an empty prompt). Negative
    control: the pending token read with the feature of its own position instead."""
    _, target, _ = td.aware_lm_pair()
    inputs = np.asarray([[3, 5, 2, 7, 1], [4, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=12)
    checker = _CheckingSelfDraft(target, None)
    out = decoding.speculative_decode(target, checker, inputs, gamma=3, **kw)
    ar = decoding.autoregressive_decode(target, inputs, **kw)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    np.testing.assert_array_equal(out.stats.accepted, out.stats.tested)

    bad = _with_pending_feature_of_its_own_position(
        lambda: decoding.speculative_decode(target, checker, inputs, gamma=3, **kw).stats)
    assert np.all(np.asarray(bad.accepted) < np.asarray(bad.tested))  # every row's first round


def test_forced_alpha_reads_a_decoder_only_prompt_as_the_loop_does():
    """Table 3's teacher-forced alpha feeds the checking self-draft what the loop feeds it:
    beta is 1 everywhere (q = p); with the pending token's feature taken from the wrong
    position, the first position of every row loses it."""
    from speculative.measure import acceptance
    _, target, draft = td.aware_lm_pair()
    inputs = jnp.asarray([[3, 5, 2, 7, 1], [4, 1, 0, 0, 0], [0, 0, 0, 0, 0]], jnp.int32)
    generated = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                               sampling=SamplingConfig(0.0),
                                               max_decode_len=6).tokens
    checker = _CheckingSelfDraft(target, None)
    kw = dict(sampling=SamplingConfig(1.0))
    np.testing.assert_allclose(acceptance.forced_betas(target, checker, inputs, generated, **kw),
                               1.0, atol=1e-5)

    bad = np.asarray(_with_pending_feature_of_its_own_position(
        lambda: acceptance.forced_betas(target, checker, inputs, generated, **kw)))
    assert np.all(bad[:, 0] < 0.99) and np.allclose(bad[:, 1:], 1.0, atol=1e-5)


def test_per_depth_logits_of_a_decoder_only_draft_are_its_decode_rounds():
    """What `rank_acceptance` measures at depth d for the draft of a decoder-only target, with
    prompts of different lengths (one empty): the d-th draft of a round that begins at fed
    position k, as the loop makes it (read the prompt, extend with the target's features up
    to k, then d - 1 steps on its own states)."""
    from speculative.measure import acceptance
    _, target, draft = td.aware_lm_pair()
    inputs = jnp.asarray([[3, 5, 2, 7, 1], [4, 1, 0, 0, 0], [0, 0, 0, 0, 0]], jnp.int32)
    generated = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                               sampling=SamplingConfig(0.0),
                                               max_decode_len=6).tokens
    depth, num = 3, generated.shape[1]
    _, q_all = acceptance._forced_depth_logits(target, draft, inputs, generated, depth)
    assert q_all.shape[:3] == (depth, 3, num)

    layers = draft.feature_layers
    cache_len = target.prefix_length(inputs.shape[1]) + num + 1
    tstate = target.init_for_draft(target.params, inputs, cache_len, layers)
    fed = jnp.concatenate([tstate.pending[:, None], generated[:, :-1]], axis=1)
    _, feats, _ = target.extend_with_features(target.params, tstate, fed, layers)
    before = jnp.concatenate([target.pending_features(tstate, layers)[:, None], feats[:, :-1]], 1)
    extend = jax.jit(draft.extend)
    for start in range(num - depth + 1):
        state = draft.init(draft.params, inputs, cache_len, context=target.context(tstate))
        logits, state = extend(draft.params, state, fed[:, :start + 1], before[:, :start + 1])
        got = [logits[:, -1]]
        for d in range(1, depth):
            logits, state = extend(draft.params, state, fed[:, start + d:start + d + 1])
            got.append(logits[:, 0])
        for d in range(depth):
            np.testing.assert_allclose(got[d], q_all[d, :, start + d], rtol=2e-4, atol=2e-5)
    assert not np.allclose(q_all[1, :, 1:], q_all[0, :, 1:], atol=1e-3)  # its own states differ

    ranks = acceptance.rank_acceptance(target, draft, [np.asarray(inputs)], SamplingConfig(0.0),
                                       max_rank=2, max_decode_len=6, max_depth=2)
    assert ranks.depth_rates[0] == ranks.rates and len(ranks.depth_rates) == 2


@pytest.mark.slow  # ~16 s, mostly building four models
def test_refuses_a_target_of_another_width_and_a_decoder_only_target():
    _, target, draft = td.aware_pair()
    wide = t5.Transformer(tiny_config(emb_dim=24))
    other = adapters.EncoderDecoderModel(wide, random_params(wide, 0))
    kw = dict(rng=jax.random.PRNGKey(0), gamma=2, sampling=SamplingConfig(0.0), max_decode_len=4)
    with pytest.raises(ValueError, match="reads 32 features"):
        decoding.speculative_decode(other, draft, np.ones((1, 3), np.int32), **kw)
    shallow = t5.Transformer(tiny_config(num_decoder_layers=1))
    with pytest.raises(ValueError, match=r"include \[2\]"):
        decoding.speculative_decode(adapters.EncoderDecoderModel(
            shallow, random_params(shallow, 0)), draft, np.ones((1, 3), np.int32), **kw)
    lm = t5.DecoderOnly(tiny_config())
    with pytest.raises(ValueError, match="read `inputs` differently"):
        decoding.speculative_decode(adapters.DecoderOnlyModel(lm, random_params(lm, 0)), draft,
                                    np.ones((1, 3), np.int32), **kw)
    _, _, lm_draft = td.aware_lm_pair()  # and a decoder-only target's draft, the other way round
    with pytest.raises(ValueError, match="cross_attention=False"):
        decoding.speculative_decode(target, lm_draft, np.ones((1, 3), np.int32), **kw)


VOCAB = 8
N_SAMPLES = 50_000


@pytest.fixture(scope="module")
def joint_aware():
    module, target, draft = td.aware_pair(vocab=VOCAB, seed=3)
    return module, target, draft, np.array([[3, 5, 2, 7, 1]], np.int32)


def _joint(module, params, enc, cfg):
    """The exact law of the first three tokens, as for plain drafts."""
    return td.exact_joint(module, params, enc, cfg, vocab=VOCAB)


def _pvalue(samples, probs):
    return td.joint_pvalue(samples, probs, vocab=VOCAB)


def _sample(target, draft, enc, cfg, seed):
    out = decoding.speculative_decode(target, draft, np.repeat(enc, N_SAMPLES, 0),
                                      rng=jax.random.PRNGKey(seed), gamma=3, sampling=cfg,
                                      max_decode_len=3)
    return np.asarray(out.tokens), out.stats


def _check_law(law, target, draft, inputs, cfg, seed):
    """The three-token samples of `speculative_decode` follow `law(cfg)`; drafts are both
    accepted and rejected."""
    probs = law(cfg)
    assert np.sum(probs * N_SAMPLES >= 5) >= 20, "law too concentrated for a meaningful test"
    samples, stats = _sample(target, draft, inputs, cfg, seed=seed)
    assert 0.05 < float(stats.alpha) < 0.95
    assert _pvalue(samples, probs) > 1e-6


def _check_control_fails(law, target, draft, inputs, seed, monkeypatch):
    """Negative control: a kernel that resamples from p instead of the residual fails."""
    probs = law(SamplingConfig(1.0))
    jax.clear_caches()
    monkeypatch.setattr(sampling_lib, "speculative_sample",
                        td.kernel_resampling_from_p)
    try:
        samples, _ = _sample(target, draft, inputs, SamplingConfig(1.0), seed=seed)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert _pvalue(samples, probs) < 1e-6


def _law(module, target, enc):
    return functools.partial(_joint, module, target.params, enc)


JOINT_CONFIGS = [
    pytest.param(SamplingConfig(1.0), id="t1"),
    pytest.param(SamplingConfig(0.7, top_k=3), id="t0.7_topk3", marks=pytest.mark.slow)]


@pytest.mark.parametrize("cfg", JOINT_CONFIGS)
def test_joint_law_of_three_tokens_matches_target(joint_aware, cfg):
    module, target, draft, enc = joint_aware
    _check_law(_law(module, target, enc), target, draft, enc, cfg, seed=1)


def test_negative_control_wrong_residual_fails(joint_aware, monkeypatch):
    module, target, draft, enc = joint_aware
    _check_control_fails(_law(module, target, enc), target, draft, enc, 5, monkeypatch)


def _exact_joint_lm(module, params, prompt, cfg):
    """P(y1, y2, y3 | prompt) of a decoder-only target, by teacher forcing (0 after EOS)."""
    n = prompt.shape[1]
    pairs = np.array([[a, b] for a in range(VOCAB) for b in range(VOCAB)], np.int32)
    seqs = np.concatenate([np.zeros((len(pairs), 1), np.int32),
                           np.repeat(prompt, len(pairs), 0), pairs], 1)
    logits = module.apply({"params": params}, seqs)[:, n:n + 3]  # the laws of y1, y2, y3
    return td.joint_of_steps(logits, cfg, VOCAB)


@pytest.fixture(scope="module")
def joint_aware_lm():
    module, target, draft = td.aware_lm_pair(vocab=VOCAB, seed=7)
    prompt = np.array([[3, 5, 2]], np.int32)
    return functools.partial(_exact_joint_lm, module, target.params, prompt), target, draft, \
        prompt


@pytest.mark.parametrize("cfg", JOINT_CONFIGS)
def test_joint_law_with_a_decoder_only_target(joint_aware_lm, cfg):
    law, target, draft, prompt = joint_aware_lm
    _check_law(law, target, draft, prompt, cfg, seed=2)


@pytest.mark.slow  # CI: the encoder-decoder pair's control of the same test and kernel
def test_negative_control_wrong_residual_fails_with_a_decoder_only_target(joint_aware_lm,
                                                                           monkeypatch):
    law, target, draft, prompt = joint_aware_lm
    _check_control_fails(law, target, draft, prompt, 6, monkeypatch)


# ----------------------------------------------------------------------------------------------
# A reduced ("hot") output vocabulary: q is zero outside it, and the decode stays exact.

def _hot(draft, hot_ids):
    config, params = fd.with_hot_vocab(draft.module.config, draft.params, hot_ids)
    return fd.FeatureDraftModel(fd.FeatureDraft(config), params)


def test_hot_vocab_keeps_the_hot_logits_and_gives_exactly_zero_elsewhere():
    _, target, draft = td.aware_pair()
    hot = (1, 2, 3, 5, 8, 13)
    small = _hot(draft, hot)
    x = jnp.asarray([[3, 5, 2, 7, 1]], jnp.int32)
    fed = jnp.asarray([[0, 4, 9, 2]], jnp.int32)

    @jax.jit
    def both(draft, small):  # (op by op, flax is slower than one compile)
        tstate = target.init(target.params, x, 6, keep_encoded=True)
        _, feats, _ = target.extend_with_features(target.params, tstate, fed,
                                                  draft.feature_layers)
        return tuple(m.unrolled_logits(m.params, target.context(tstate), fed, feats, 2)
                     for m in (draft, small))

    full, got = both(draft, small)
    np.testing.assert_allclose(got[..., list(hot)], full[..., list(hot)], rtol=1e-6)
    outside = np.setdiff1d(np.arange(16), hot)
    assert np.all(np.asarray(got[..., outside]) == fd.HOT_MASK_LOGIT)
    for temperature in (1.0, 0.3):
        q = np.asarray(jax.nn.softmax(got / temperature, -1))
        assert np.all(q[..., outside] == 0.0) and np.allclose(q.sum(-1), 1.0, atol=1e-6)
    # The stored form: a separate output table of the hot size, the input table whole.
    assert small.params["hot_output"]["embedding"].shape == (len(hot), 8)
    assert small.params["token_embedder"]["embedding"].shape == (16, 8)
    with pytest.raises(ValueError, match="already has a hot vocabulary"):
        fd.with_hot_vocab(small.module.config, small.params, hot)
    for bad in [(3, 2), (1, 1), (-1, 2), (2, 16)]:
        with pytest.raises(ValueError, match="hot_ids"):
            dataclasses.replace(draft.module.config, hot_ids=bad)


@pytest.mark.parametrize("gamma,tree", [(3, None), pytest.param(2, (2, 2), marks=pytest.mark.slow)])
def test_hot_vocab_greedy_identity(gamma, tree):
    """The target's argmax is often outside the draft's hot set: those drafts are rejected and
    the output is still the target's own."""
    _, target, draft = td.aware_pair()
    small = _hot(draft, (1, 2, 3, 5, 8, 13))
    inputs = np.zeros((4, 7), np.int32)
    rng = np.random.default_rng(0)
    for b, n in enumerate([7, 2, 5, 1]):
        inputs[b, :n] = rng.integers(2, 16, n)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=20)
    ar = decoding.autoregressive_decode(target, inputs, **kw)
    sp = decoding.speculative_decode(target, small, inputs, gamma=gamma, tree=tree, **kw)
    np.testing.assert_array_equal(sp.tokens, ar.tokens)
    np.testing.assert_array_equal(sp.lengths, ar.lengths)


@pytest.mark.slow  # ~15 s; CI: the full-vocabulary draft's chi-square and its negative control
def test_hot_vocab_joint_law_of_three_tokens_matches_target(joint_aware):
    """q is zero on a third of the vocabulary: tokens there come only from the residual."""
    module, target, draft, enc = joint_aware
    cfg = SamplingConfig(1.0)
    probs = _joint(module, target.params, enc, cfg)
    samples, stats = _sample(target, _hot(draft, (1, 2, 4, 5, 7)), enc, cfg, seed=2)
    assert 0.05 < float(stats.alpha) < 0.95
    outside = np.isin(samples, [0, 3, 6]).mean()
    assert outside > 0.05  # the residual does produce them
    assert _pvalue(samples, probs) > 1e-6


# ----------------------------------------------------------------------------------------------
# Speculative beam search with a target-aware draft.

@pytest.mark.parametrize("beam_size,draft_beam,branch", [  # CI: two beams, two first tokens
    pytest.param(1, 0, 1, marks=pytest.mark.slow), (2, 0, 2),
    pytest.param(2, 2, 1, marks=pytest.mark.slow)])
def test_speculative_beam_search_with_a_target_aware_draft_is_the_plain_search(
        beam_size, draft_beam, branch):
    _, target, draft = td.aware_pair()
    inputs = np.asarray([[3, 5, 2, 7, 1], [4, 1, 9, 0, 0]], np.int32)
    kw = dict(beam_size=beam_size, max_decode_len=10)
    plain = beam_lib.beam_search(target, inputs, **kw)
    spec = beam_lib.speculative_beam_search(target, draft, inputs, draft_beam=draft_beam,
                                            gamma=3, draft_branch=branch, **kw)
    np.testing.assert_array_equal(spec.sequences, plain.sequences)
    np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5, atol=1e-5)
    assert spec.target_calls <= plain.target_calls


def _beam_steps_per_round(target, draft, inputs, gamma):
    out = beam_lib.speculative_beam_search(target, draft, inputs, beam_size=1, draft_beam=0,
                                           gamma=gamma, max_decode_len=14)
    return out, float(np.sum(out.row_steps)) / out.rounds / inputs.shape[0]


def test_speculative_beam_search_feeds_the_draft_the_targets_features(monkeypatch):
    """The checking self-draft proposes the target's own continuation when it is fed the
    target's features of the position before each token (a feature from any other position
    turns its first draft into token 0): at beam 1 the target's steps then lie on its paths
    round after round; with the verification's features shifted by one position they do not."""
    _, target, _ = td.aware_pair()
    inputs = np.asarray([[3, 5, 2, 7, 1], [4, 1, 9, 6, 0]], np.int32)
    checker = _CheckingSelfDraft(target, None)
    plain = beam_lib.beam_search(target, inputs, beam_size=1, max_decode_len=14)
    good, good_steps = _beam_steps_per_round(target, checker, inputs, gamma=3)
    np.testing.assert_array_equal(good.sequences, plain.sequences)
    real = adapters.EncoderDecoderModel.extend_with_features

    def shifted(self, params, state, tokens, feature_layers):
        logits, feats, state = real(self, params, state, tokens, feature_layers)
        return logits, jnp.roll(feats, 1, axis=1), state

    jax.clear_caches()
    monkeypatch.setattr(adapters.EncoderDecoderModel, "extend_with_features", shifted)
    try:
        bad, bad_steps = _beam_steps_per_round(target, checker, inputs, gamma=3)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    np.testing.assert_array_equal(bad.sequences, plain.sequences)  # exact either way
    assert good_steps >= 3.0 and bad_steps < 2.0, (good_steps, bad_steps)
