"""A draft with a known acceptance rate, for timing speculative decoding without a trained pair.

`SyntheticDraft(target, acceptance, seed)` wraps the target: the token it predicts after decoder
position j of row b is the target's own distribution when `hash(j, b, seed) < acceptance` and a
point mass on the target's least likely token otherwise. Kept positions give q = p (beta = 1),
corrupted ones beta ~ 0, so alpha is `acceptance` by construction, independent of the inputs and
of the sampling settings. The draft costs one target step (c ~ 1), so it times the machinery
(draft loop, verification, kernel, rewinds) at a known acceptance rate against the prediction
with the measured c; it cannot show a speedup (`scripts/benchmark.py
--gin.SYNTHETIC_ACCEPTANCE=0.8`; see `runs/benchmark.py`).
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array

_NEG = -1e9


def _hash_uniform(position: Array, row: Array, seed) -> Array:
    """Uniform [0, 1) float32 from a 32-bit integer hash of (position, row, seed) (lowbias32)."""
    salt = jnp.asarray(seed).astype(jnp.uint32) * jnp.uint32(0xC2B2AE3D) + jnp.uint32(0x27D4EB2F)
    x = (position.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)) ^ (
        row.astype(jnp.uint32) * jnp.uint32(0x85EBCA77)) ^ salt
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return (x >> 8).astype(jnp.float32) / jnp.float32(1 << 24)


def check_acceptance(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"synthetic_acceptance={value!r} is invalid: give a float in [0, 1] "
                         "(or None to use the real draft).")
    return float(value)


@struct.dataclass
class SyntheticDraft:
    """A draft `DecodeModel` that wraps the target and is accepted with probability `acceptance`.

    `extend` runs the target's `extend`; for the token predicted after decoder position j of row
    b (j = the row's cache length + chunk index) it keeps the target's logits when
    `hash(j, b, seed) < acceptance` and otherwise puts all mass on the target's least likely
    token. Under any `SamplingConfig` the kept positions give q = p (beta = 1) and the corrupted
    ones beta = p(least likely) (0 at temperature 0 and under top-k/top-p, tiny otherwise).
    """

    base: Any  # the target DecodeModel (a pytree)
    acceptance: Any = 1.0  # traced (like seed), so every value shares one compilation
    seed: Any = 0

    def __post_init__(self):
        if isinstance(self.acceptance, (int, float, type(None))):  # not a tracer
            check_acceptance(self.acceptance)

    @property
    def params(self):
        return self.base.params

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def max_length(self):
        return self.base.max_length

    def prefix_length(self, input_length: int) -> int:
        return self.base.prefix_length(input_length)

    def init(self, params, inputs, max_len):
        return self.base.init(params, inputs, max_len)

    def rewind(self, state, lengths):
        return self.base.rewind(state, lengths)

    def extend(self, params, state, tokens):
        batch, num = tokens.shape
        position = state.lengths[:, None] + jnp.arange(num, dtype=jnp.int32)[None]  # [B, K]
        row = jnp.broadcast_to(jnp.arange(batch, dtype=jnp.int32)[:, None], (batch, num))
        logits, state = self.base.extend(params, state, tokens)
        logits = jnp.asarray(logits, jnp.float32)
        keep = _hash_uniform(position, row, self.seed) < self.acceptance
        worst = jax.nn.one_hot(jnp.argmin(logits, axis=-1), logits.shape[-1], dtype=bool)
        corrupted = jnp.where(worst, 0.0, _NEG)
        return jnp.where(keep[..., None], logits, corrupted), state
