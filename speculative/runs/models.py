"""From configuration to `DecodeModel`: T5 checkpoints, random weights, and cheap drafts.

    target = load_model(T5Config(...), checkpoint="/ckpts/t5_1_1_xxl/checkpoint_1000000")
    draft = load_model(T5Config(...), checkpoint=None, seed=1)    # random weights (tests, timing)

A checkpoint path is anything `checkpoints.load_params` accepts (T5X legacy or Orbax dir, step
dir, msgpack file, HF directory); its tree is validated against the config before use, so a
mismatched checkpoint fails with the list of wrong parameters rather than deep inside jit.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from speculative import decoding
from speculative.models import t5


def load_model(
    config: t5.T5Config,
    checkpoint: Optional[str] = None,
    *,
    decoder_only: bool = False,
    seed: int = 0,
    param_dtype: Optional[str] = None,
) -> decoding.DecodeModel:
    """A T5 `DecodeModel` with weights from `checkpoint`, or random (T5X init) with `seed`.

    Args:
      config: the model's `T5Config`.
      checkpoint: a checkpoint path, or None for randomly initialised weights.
      decoder_only: build `t5.DecoderOnly` instead of the encoder-decoder `t5.Transformer`.
      seed: PRNG seed for random weights (ignored with a checkpoint).
      param_dtype: cast parameters on load (e.g. 'bfloat16' as T5X's infer.gin does).
    """
    module = t5.DecoderOnly(config) if decoder_only else t5.Transformer(config)
    if checkpoint:
        from speculative import checkpoints  # tensorstore/orbax only when a checkpoint is read

        params = checkpoints.load_params(checkpoint, dtype=param_dtype)
        checkpoints.validate_params(params, module)
        params = jax.tree_util.tree_map(jnp.asarray, params)
    else:
        params = t5.init_params(module, jax.random.PRNGKey(seed))
        if param_dtype:
            params = jax.tree_util.tree_map(lambda x: x.astype(param_dtype), params)
    adapter = decoding.DecoderOnlyModel if decoder_only else decoding.EncoderDecoderModel
    return adapter(module, params)
