"""T5 model: parameter tree, configs, and the K-token decode mode against the full forward."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.models import t5
from tests.helpers import GOLDEN as GOLDEN_DIR
from tests.helpers import random_params, tiny_config

GOLDEN = os.path.join(GOLDEN_DIR, "t5_1_1_small_params.json")


def _flat_shapes(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): list(leaf.shape) for path, leaf in flat}


def test_t5_1_1_small_param_tree_matches_golden():
    cfg = t5.preset("t5_1_1_small")
    assert (cfg.num_heads, cfg.head_dim, cfg.emb_dim) == (6, 64, 512)
    shapes = _flat_shapes(t5.param_shapes(t5.Transformer(cfg)))  # eval_shape: no allocation
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert shapes == golden
    assert sum(int(np.prod(s)) for s in shapes.values()) == 76_961_152  # "77.0M" in t5x.md §2.3
    assert shapes["encoder/layers_0/attention/query/kernel"] == [512, 384]


def test_logical_axes_follow_t5x():
    axes = t5.param_axes(t5.Transformer(tiny_config()))
    assert axes["token_embedder"]["embedding"] == ("vocab", "embed")
    assert axes["encoder"]["layers_0"]["attention"]["query"]["kernel"] == ("embed", "joined_kv")
    assert axes["encoder"]["layers_0"]["attention"]["out"]["kernel"] == ("joined_kv", "embed")
    assert axes["decoder"]["layers_1"]["mlp"]["wi_0"]["kernel"] == ("embed", "mlp")
    assert axes["decoder"]["relpos_bias"]["rel_embedding"] == ("heads", "relpos_buckets")
    assert axes["decoder"]["logits_dense"]["kernel"] == ("embed", "vocab")


@pytest.mark.parametrize("name", sorted(t5.PRESETS))
def test_presets_build(name):
    cfg = t5.preset(name)
    shapes = _flat_shapes(t5.param_shapes(t5.Transformer(cfg)))
    assert shapes["token_embedder/embedding"] == [32128, cfg.emb_dim]
    if name.startswith("t5_1_0"):
        assert "decoder/logits_dense/kernel" not in shapes
        assert "encoder/layers_0/mlp/wi/kernel" in shapes
    else:
        assert "decoder/logits_dense/kernel" in shapes
        assert "encoder/layers_0/mlp/wi_1/kernel" in shapes


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=1), "vocab_size"),
    (dict(vocab_size=16, emb_dim=10, num_heads=4, head_dim=None), "not divisible by num_heads"),
    (dict(vocab_size=16, head_dim=0), "head_dim"),
    (dict(vocab_size=16, num_heads=0), "num_heads"),
    (dict(vocab_size=16, mlp_activations=("swishy",)), "Unknown MLP activation"),
    (dict(vocab_size=16, dtype="int32"), "dtype"),
    (dict(vocab_size=16, dropout_rate=1.5), "dropout_rate"),
    (dict(vocab_size=16, relative_attention_num_buckets=32, relative_attention_max_distance=16),
     "relative_attention_max_distance"),
])
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        t5.T5Config(**kwargs)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="t5_1_1_small"):
        t5.preset("t5_1_1_gigantic")


def test_head_dim_derived_when_none():
    assert t5.T5Config(vocab_size=8, emb_dim=12, num_heads=3, head_dim=None).head_dim == 4


def _jitted(model):
    """(full forward, init_cache, extend) of `model`, jitted: eager flax is slow on CPU."""
    full = jax.jit(model.apply)
    init = jax.jit(functools.partial(model.apply, method="init_cache"), static_argnums=2)
    extend = jax.jit(functools.partial(model.apply, method="extend"))
    return full, init, extend


def _chunks(rng, total):
    sizes = []
    while sum(sizes) < total:
        sizes.append(int(min(rng.integers(1, 7), total - sum(sizes))))
    return sizes


@pytest.mark.parametrize("logits_via_embedding",
                         [False, pytest.param(True, marks=pytest.mark.slow)])  # CI: untied
def test_encoder_decoder_chunked_extend_equals_full_forward(logits_via_embedding):
    cfg = tiny_config(logits_via_embedding=logits_via_embedding,
                      mlp_activations=("relu",) if logits_via_embedding else ("gelu", "linear"))
    model = t5.Transformer(cfg)
    params = {"params": random_params(model, 0)}
    rng = np.random.default_rng(0)
    enc = np.zeros((3, 9), np.int32)
    for b, n in enumerate([9, 4, 6]):  # different prompt lengths (0 = padding)
        enc[b, :n] = rng.integers(2, 16, n)
    dec = rng.integers(2, 16, (3, 24)).astype(np.int32)
    dec[:, 0] = 0  # BOS
    apply, init_cache, extend = _jitted(model)
    full = apply(params, enc, dec)

    cache = init_cache(params, enc, 24)
    outs, pos = [], 0
    for k in _chunks(rng, 24):
        logits, cache = extend(params, cache, dec[:, pos:pos + k])
        outs.append(logits)
        pos += k
    np.testing.assert_allclose(np.concatenate(outs, 1), full, atol=1e-5)
    np.testing.assert_array_equal(cache.lengths, [24, 24, 24])

    # Rewind rows to different lengths and extend again: the full-forward logits of the new rows.
    keep = np.array([3, 11, 7], np.int32)
    new = rng.integers(2, 16, (3, 5)).astype(np.int32)
    cache = t5.rewind(cache, keep)
    outs = []
    for k in (2, 3):
        logits, cache = extend(params, cache, new[:, :k] if not outs else new[:, 2:])
        outs.append(logits)
    got = np.concatenate(outs, 1)
    for b in range(3):
        seq = np.concatenate([dec[b, :keep[b]], new[b]])[None]
        ref = apply(params, enc[b:b + 1], seq)[0, keep[b]:]
        np.testing.assert_allclose(got[b], ref, atol=1e-5)


def test_decoder_only_prompts_of_different_lengths():
    cfg = tiny_config()
    model = t5.DecoderOnly(cfg)
    params = {"params": random_params(model, 1)}
    rng = np.random.default_rng(1)
    lengths = [5, 0, 3]
    prompts = np.zeros((3, 5), np.int32)
    for b, n in enumerate(lengths):
        prompts[b, :n] = rng.integers(2, 16, n)
    new = rng.integers(2, 16, (3, 9)).astype(np.int32)

    apply, init_cache, extend = _jitted(model)
    cache = init_cache(params, prompts, 20)
    np.testing.assert_array_equal(cache.lengths, [5, 0, 3])  # [BOS] + prompt[:-1]
    first = np.where(np.array(lengths) > 0, prompts[np.arange(3), np.maximum(lengths, 1) - 1], 0)
    np.testing.assert_array_equal(cache.pending, first)
    feed = np.concatenate([np.asarray(cache.pending)[:, None], new], 1)
    outs, pos = [], 0
    for k in _chunks(rng, feed.shape[1]):
        logits, cache = extend(params, cache, feed[:, pos:pos + k])
        outs.append(logits)
        pos += k
    got = np.concatenate(outs, 1)
    for b, n in enumerate(lengths):
        seq = np.concatenate([[0], prompts[b, :n], new[b]])[None]
        ref = apply(params, seq)[0, n:]
        np.testing.assert_allclose(got[b], ref, atol=1e-5)


def test_decoder_only_prompt_longer_than_cache_raises():
    model = t5.DecoderOnly(tiny_config())
    params = {"params": random_params(model, 0)}
    with pytest.raises(ValueError, match="does not fit the decode cache"):
        model.apply(params, jnp.ones((1, 8), jnp.int32), 8, method="init_cache")


@pytest.mark.slow  # ~8 s; bfloat16 is for storage on CPU (its dots are ~10x slower)
def test_bfloat16_compute_keeps_float32_logits_and_params():
    cfg = tiny_config(dtype="bfloat16")
    model = t5.Transformer(cfg)
    params = random_params(model, 0)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    enc = jnp.array([[3, 4, 5, 1]])
    dec = jnp.array([[0, 3, 4]])
    logits = model.apply({"params": params}, enc, dec)
    assert logits.dtype == jnp.float32
    ref = t5.Transformer(tiny_config()).apply({"params": params}, enc, dec)
    np.testing.assert_allclose(logits, ref, atol=0.1)  # bf16 activations, same function
