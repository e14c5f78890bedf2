"""speculative/models/layers.py: the kernel layouts (T5X's `kernel [in, out]` and the
transposed `kernel_t [out, in]`) compute the same model."""

import jax
import numpy as np
import pytest

from speculative.models import t5
from tests.helpers import random_params, tiny_config


def _flat_shapes(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): list(leaf.shape) for path, leaf in flat}


@pytest.mark.parametrize("decoder_only", [False, True])
def test_transposed_kernels_compute_the_same_model(decoder_only):
    """`layers.transpose_kernels` stores every dense kernel [out, in] (the decode layout on a
    CPU): the full forward and a cached extend give T5X's logits to float32 round-off, for
    one-axis (q/k/v with features (H, D), MLP) and two-axis (attention out) contractions and an
    untied output layer; the inverse gives back T5X's tree exactly."""
    from speculative.models import layers  # pylint: disable=g-import-not-at-top

    cfg = tiny_config()
    model = t5.DecoderOnly(cfg) if decoder_only else t5.Transformer(cfg)
    params = random_params(model, 3)
    moved = layers.transpose_kernels(params)
    flat = {"/".join(k.key for k in p): x.shape
            for p, x in jax.tree_util.tree_flatten_with_path(moved)[0]}
    orig = _flat_shapes(params)
    kernels = [k for k in orig if k.endswith("/kernel")]
    assert kernels and not any(k.endswith("/kernel") for k in flat)
    for k in kernels:
        assert list(flat[k + "_t"]) == orig[k][::-1]
    back = layers.untranspose_kernels(moved)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert layers.untranspose_kernels(params) == params  # T5X's tree: untouched

    rng = np.random.default_rng(1)
    dec = rng.integers(2, 16, (2, 7)).astype(np.int32)
    dec[:, 0] = 0
    enc = rng.integers(2, 16, (2, 5)).astype(np.int32)
    args = (dec,) if decoder_only else (enc, dec)
    full = model.apply({"params": params}, *args)
    np.testing.assert_allclose(model.apply({"params": moved}, *args), full, atol=1e-5)
    if not decoder_only:
        for p in (params, moved):  # a 3-token verify-like call on a cache, in both layouts
            cache = model.apply({"params": p}, enc, 8, method="init_cache")
            logits, _ = model.apply({"params": p}, cache, dec[:, :3], method="extend")
            np.testing.assert_allclose(logits, full[:, :3], atol=1e-5)
