"""The model factory: a `T5Config` and a checkpoint -> a T5 `DecodeModel`, optionally on a
mesh.

    target = load_model(T5Config(...), checkpoint="/ckpts/t5_1_1_xxl/checkpoint_1000000")
    draft = load_model(T5Config(...), seed=1)           # random weights (tests, timing)
    target = load_model(config, checkpoint, mesh=mesh)  # sharded by T5X's rules

The checkpoint's names and shapes are checked against the model before any array is read, so a
mismatched checkpoint fails with the list of wrong parameters rather than deep inside jit.
`speculative.loading` re-exports `load_model` and builds every other kind of model.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from speculative.decode import validation
from speculative.decode.contract import DecodeModel
from speculative.models import layers, partitioning, t5
from speculative.models.adapters import as_decode_model, make_module


def load_model(
    config: t5.T5Config,
    checkpoint: Optional[str] = None,
    *,
    decoder_only: bool = False,
    seed: int = 0,
    param_dtype: Optional[str] = None,
    mesh: Optional[Any] = None,
    rules: Optional[partitioning.LogicalRules] = None,
    kernel_layout: str = "auto",
) -> DecodeModel:
    """A T5 `DecodeModel` with weights from `checkpoint`, or random (T5X init) with `seed`.

    Args:
      config: the model's `T5Config`.
      checkpoint: a checkpoint path (anything `t5x.load_params` reads), or None for randomly
        initialised weights.
      decoder_only: build `t5.DecoderOnly` instead of the encoder-decoder `t5.Transformer`.
      seed: PRNG seed for random weights (ignored with a checkpoint).
      param_dtype: cast parameters on load (e.g. 'bfloat16' as T5X's infer.gin does).
      mesh, rules: place the model on a ('data', 'model') mesh (`partitioning.place_model`).
      kernel_layout: 'auto' (default): T5X's `[in, out]` dense kernels with a mesh or on an
        accelerator, `layers.transpose_kernels`' `[out, in]` on a CPU without one (the same
        model; its verify calls cost less there); 't5x' or 'transposed' to choose. The
        transposition copies the kernels once: pass 't5x' for a model that would not fit twice.
        Either way `t5x.save_t5x(model.params, ...)` writes T5X's names and layout.
    """
    param_dtype = validation.float_dtype(param_dtype, "param_dtype")
    transposed = layers.resolve_kernel_layout(kernel_layout, sharded=mesh is not None)
    module = make_module(config, decoder_only=decoder_only)
    if checkpoint:
        from speculative.checkpoints import (
            t5x as checkpoints,  # tensorstore/orbax only when a checkpoint is read
        )

        checkpoints.validate_params(checkpoints.load_metadata(checkpoint), module,
                                    source=checkpoint)  # names and shapes, before any read
        if mesh is not None:  # each device's block read straight into its place
            params = checkpoints.load_params(
                checkpoint, dtype=param_dtype,
                shardings=partitioning.param_shardings(module, mesh, rules))
            return as_decode_model(module, params, mesh=mesh)
        params = checkpoints.load_params(checkpoint, dtype=param_dtype)
        params = jax.tree_util.tree_map(jnp.asarray, params)
    else:
        params = t5.init_params(module, jax.random.PRNGKey(seed))
        if param_dtype:
            params = jax.tree_util.tree_map(lambda x: x.astype(param_dtype), params)
    if transposed == "transposed":
        params = layers.transpose_kernels(params)
    model = as_decode_model(module, params)
    return partitioning.place_model(model, mesh, rules) if mesh is not None else model

