"""The block draft: one call appends the catch-up tokens and G - 1 placeholders; its teacher-forced
training forward (every position an anchor, `block_mask`) is that call, anchor by anchor."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.models import block_draft as bd
from speculative.models import feature_draft as fd

GAMMA = 4


def _draft(hot_ids=(), max_gamma=GAMMA, **kw):
    cfg = fd.FeatureDraftConfig(vocab_size=23, target_emb_dim=6, feature_layers=(1, 2),
                                emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, hot_ids=hot_ids, **kw)
    module = bd.BlockDraft(cfg, max_gamma=max_gamma)
    return module, bd.init_params(module, jax.random.PRNGKey(1))


def _inputs(batch=2, length=9, seed=0):
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([np.zeros((batch, 1), int), rng.integers(2, 23, (batch, length - 1))],
                            1)
    feats = rng.normal(size=(batch, length, 12)).astype(np.float32)
    encoded = rng.normal(size=(batch, 5, 6)).astype(np.float32)
    mask = np.ones((batch, 5), bool)
    mask[-1, 3:] = False
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(feats), jnp.asarray(encoded), \
        jnp.asarray(mask)


def _prev(feats):  # the feature of the previous position, as the decode loop feeds it
    return jnp.pad(feats[:, :-1], ((0, 0), (1, 0), (0, 0)))


def test_block_mask_worked_example():
    mask = bd.block_mask(4, 2)
    row = 1 * 4 + 2  # placeholder 1 after anchor 1
    assert mask[row].nonzero()[0].tolist() == [0, 1, row]
    np.testing.assert_array_equal(mask[:4, :4], np.tril(np.ones((4, 4), bool)))
    assert not mask[:4, 4:].any()  # real tokens never see a placeholder


@pytest.mark.parametrize("hot", [False, True])
def test_real_token_logits_are_the_feature_drafts_and_placeholders_change_nothing_before(hot):
    module, params = _draft(hot_ids=tuple(range(2, 23, 2)) if hot else ())
    tokens, feats, encoded, mask = _inputs()
    feature = fd.FeatureDraftModel(fd.FeatureDraft(module.config),
                                   {k: v for k, v in params.items() if k != bd.PLACEHOLDERS})
    block = bd.BlockDraftModel(module, params)
    fstate = feature.init(feature.params, None, 32, context=(encoded, mask))
    bstate = block.init(params, None, 32, context=(encoded, mask))
    # two calls: a prefix, then a catch-up chunk, as the loop's rounds do
    for lo, hi in ((0, 5), (5, 8)):
        want, fstate = feature.extend(feature.params, fstate, tokens[:, lo:hi],
                                      _prev(feats)[:, lo:hi])
        got, bstate = block.extend_block(params, bstate, tokens[:, lo:hi],
                                         _prev(feats)[:, lo:hi], GAMMA - 1)
        assert got.shape == (2, GAMMA, 23)  # q_1 at the last real token, then q_2..q_G
        np.testing.assert_allclose(got[:, 0], want[:, -1], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(bstate.lengths, fstate.lengths)  # placeholders dropped
    # the next plain extend reads the same cache
    want, _ = feature.extend(feature.params, fstate, tokens[:, 8:9], _prev(feats)[:, 8:9])
    got, _ = block.extend(params, bstate, tokens[:, 8:9], _prev(feats)[:, 8:9])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_placeholder_logits_are_the_training_forward_anchor_by_anchor():
    module, params = _draft()
    tokens, feats, encoded, mask = _inputs()
    length = tokens.shape[1]
    train = module.apply({"params": params}, encoded, mask, tokens, feats, GAMMA,
                         method="block_logits")  # [G, B, L, V]
    block = bd.BlockDraftModel(module, params)
    extend_block = jax.jit(block.extend_block, static_argnums=4)
    for anchor in range(length):
        state = block.init(params, None, 32, context=(encoded, mask))
        cut = max(anchor - 2, 0)  # a cached prefix, then the catch-up chunk with the block
        if cut:
            _, state = block.extend(params, state, tokens[:, :cut], _prev(feats)[:, :cut])
        logits, state = extend_block(params, state, tokens[:, cut:anchor + 1],
                                     _prev(feats)[:, cut:anchor + 1], GAMMA - 1)
        np.testing.assert_allclose(logits[:, 0], train[0, :, anchor], rtol=2e-4, atol=2e-5)
        for k in range(1, GAMMA):
            if anchor + k < length:
                np.testing.assert_allclose(logits[:, k], train[k, :, anchor + k],
                                           rtol=2e-4, atol=2e-5)
    short = module.apply({"params": params}, encoded, mask, tokens[:, :2], feats[:, :2], GAMMA,
                         method="block_logits")  # a sentence shorter than the block
    np.testing.assert_allclose(short[0], train[0, :, :2], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(short[1, :, 1], train[1, :, 1], rtol=2e-4, atol=2e-5)
    # the model's unrolled logits are the block's (what per-depth acceptance measures)
    got = block.unrolled_logits(params, (encoded, mask), tokens, feats, GAMMA)
    np.testing.assert_allclose(got, train, rtol=1e-6, atol=1e-6)


def test_rows_with_fewer_real_tokens_mask_their_junk_slots():
    """The loop pads each row's catch-up to one width; `num_tokens` places a row's
    placeholders right after its own last real token, as if the junk were not there."""
    module, params = _draft()
    tokens, feats, encoded, mask = _inputs()
    block = bd.BlockDraftModel(module, params)
    state0 = block.init(params, None, 32, context=(encoded, mask))
    _, state0 = block.extend(params, state0, tokens[:, :3], _prev(feats)[:, :3])
    num = jnp.asarray([2, 4])
    junk = tokens[:, 3:7].at[0, 2:].set(5)
    padded, state = block.extend_block(params, state0, junk, _prev(feats)[:, 3:7], GAMMA - 1,
                                       num_tokens=num)
    np.testing.assert_array_equal(state.lengths, [5, 7])
    for row, n in enumerate([2, 4]):
        one = jax.tree_util.tree_map(lambda x, r=row: x[r:r + 1], state0)
        want, _ = block.extend_block(params, one, tokens[row:row + 1, 3:3 + n],
                                     _prev(feats)[row:row + 1, 3:3 + n], GAMMA - 1)
        np.testing.assert_allclose(padded[row], want[0], rtol=1e-5, atol=1e-5)


def test_a_placeholder_sees_exactly_the_prefix_to_its_anchor_and_its_own_earlier_placeholders():
    module, params = _draft()
    tokens, feats, encoded, mask = _inputs(batch=1, length=8)

    def run(p, t, f):
        return np.asarray(module.apply({"params": p}, encoded[:1], mask[:1], t, f, GAMMA,
                                       method="block_logits"))

    base = run(params, tokens, feats)
    d_idx, j_idx = np.meshgrid(np.arange(GAMMA), np.arange(8), indexing="ij")
    valid = j_idx >= d_idx
    for i in range(1, 8):  # the token at i (and its feature, read at i + 1)
        t = tokens.at[0, i].set(int(tokens[0, i]) % 21 + 2)
        changed = np.abs(run(params, t, feats) - base).max(-1)[:, 0] > 1e-6
        np.testing.assert_array_equal(changed[valid], (j_idx - d_idx >= i)[valid])
        f = feats.at[0, i].add(1.0)
        changed = np.abs(run(params, tokens, f) - base).max(-1)[:, 0] > 1e-6
        np.testing.assert_array_equal(changed[valid], (j_idx - d_idx >= i + 1)[valid])
    for k in range(1, GAMMA):  # placeholder k reaches only depths >= k (its block's later rows)
        p = dict(params)
        table = params[bd.PLACEHOLDERS]["embedding"]
        p[bd.PLACEHOLDERS] = {"embedding": table.at[k - 1].add(1.0)}
        changed = np.abs(run(p, tokens, feats) - base).max(-1)[:, 0] > 1e-6
        np.testing.assert_array_equal(changed[valid], (d_idx >= k)[valid])


def test_warm_start_keeps_the_feature_drafts_parameters():
    module, _ = _draft()
    feature = fd.init_params(fd.FeatureDraft(module.config), jax.random.PRNGKey(3))
    params = bd.from_feature_draft(module, feature, jax.random.PRNGKey(0))
    assert set(params) == set(feature) | {bd.PLACEHOLDERS, "block_norm", "block_layers_0",
                                                "block_input"}
    assert params[bd.PLACEHOLDERS]["embedding"].shape == (GAMMA - 1, 8)
    np.testing.assert_array_equal(params["block_layers_0"]["mlp"]["wo"]["kernel"],
                                  feature["layers_0"]["mlp"]["wo"]["kernel"])
    # the stream shares the real stream's projected encoder output (no kernels of its own)
    assert set(params["block_layers_0"]["encoder_decoder_attention"]) == {"query", "out"}
    with pytest.raises(ValueError, match="lack"):
        bd.from_feature_draft(module, {k: v for k, v in feature.items() if k != "fuse"},
                              jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="num_placeholders"):
        bd.BlockDraftModel(module, params).extend_block(
            params, bd.BlockDraftModel(module, params).init(
                params, None, 8, context=(jnp.zeros((1, 2, 6)), jnp.ones((1, 2), bool))),
            jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1, 12)), GAMMA)
