"""The model factory: a `T5Config` (or a T5X model directory's own config.gin) and a
checkpoint -> a T5 `DecodeModel`, optionally on a mesh.

    target = load_model(T5Config(...), checkpoint="/ckpts/t5_1_1_xxl/checkpoint_1000000")
    target = load_model(None, "/ckpts/my_t5x_run")      # the architecture from its config.gin
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
from absl import logging

from speculative.checkpoints import config_gin, param_trees
from speculative.decode import validation
from speculative.decode.contract import DecodeModel
from speculative.models import layers, partitioning, t5
from speculative.models.adapters import as_decode_model, make_module


def load_model(
    config: Optional[t5.T5Config],
    checkpoint: Optional[str] = None,
    *,
    decoder_only: Optional[bool] = None,
    seed: int = 0,
    param_dtype: Optional[str] = None,
    mesh: Optional[Any] = None,
    rules: Optional[partitioning.LogicalRules] = None,
    kernel_layout: str = "auto",
) -> DecodeModel:
    """A T5 `DecodeModel` with weights from `checkpoint`, or random (T5X init) with `seed`.

    Args:
      config: the model's `T5Config`; None reads it from the T5X `config.gin` at, beside or
        above `checkpoint` (`config_gin.t5x_model_config`: T5X writes one into every model
        directory) and logs where it came from.
      checkpoint: a checkpoint path (anything `t5x.load_params` reads), or None for randomly
        initialised weights.
      decoder_only: build `t5.DecoderOnly` instead of the encoder-decoder `t5.Transformer`;
        None (the default) is False, or with `config=None` what the config.gin's model is.
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
    if config is None:
        config, decoder_only = _config_from_gin(checkpoint, decoder_only)
    if not isinstance(config, t5.T5Config):
        raise TypeError(f"config={config!r} is not a speculative.models.t5.T5Config: give one "
                        "(e.g. t5.preset('t5_1_1_small')), or None to read the T5X config.gin "
                        "beside the checkpoint.")
    module = make_module(config, decoder_only=bool(decoder_only))
    if checkpoint:
        from speculative.checkpoints import (
            t5x as checkpoints,  # tensorstore/orbax only when a checkpoint is read
        )

        param_trees.validate_params(checkpoints.load_metadata(checkpoint), module,
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



def _config_from_gin(checkpoint, decoder_only: Optional[bool]):
    """(config, decoder_only) from the T5X config.gin of `checkpoint`, logged."""
    if not checkpoint:
        raise ValueError("config=None needs a checkpoint whose T5X config.gin gives the "
                         "architecture; for random weights give a T5Config (e.g. "
                         "t5.preset('t5_1_1_small')).")
    found = config_gin.t5x_model_config(checkpoint)
    if decoder_only is not None and bool(decoder_only) != found.decoder_only:
        kind = "decoder-only" if found.decoder_only else "encoder-decoder"
        raise ValueError(f"decoder_only={decoder_only} but {found.source} describes an {kind} "
                         f"model; pass decoder_only={found.decoder_only} (in gin: DECODER_ONLY = "
                         f"{found.decoder_only}) or None.")
    logging.info("Architecture of %s: %s", checkpoint, found.describe())
    for note in found.skipped:
        logging.info("%s: %s", found.source, note)
    return found.config, found.decoder_only
