"""A block draft: the target-aware draft (`feature_draft`) proposing a whole block of G tokens
in ONE forward, by reading G - 1 learned placeholders after the committed prefix.

Why this design. The chain of a target-aware draft costs G draft calls per round; on a host
where a call is launch-bound (an accelerator) or where the draft's weights are re-read per call
(a CPU), G - 1 of them are overhead. Here one call appends the chunk

    [catch-up tokens S[T - lag .. T] (with the target's features, as `FeatureDraft.extend`),
     placeholder 1, ..., placeholder G - 1]

to the draft's cache. The real tokens go through `FeatureDraft` unchanged (the "real stream":
the same parameters, warm-started from a trained `large_feature_draft`, hot vocabulary
included), so the logits at the last real token (position T) are q_1, the feature draft's own.
Placeholder k sits at position T + k; its logits are q_{k+1}, the law of the token k + 1
positions after S[T]. No token and no target feature exists there: its layer input is
`block_input(concat(P_k, g_T))`, a learned embedding `placeholder_embedder/embedding
[max_gamma - 1, E]` in the token's place and the real stream's top state g_T at the last real
token in the feature's (the state the feature draft reads when it drafts on its own states,
and the one q_1 comes from), and it goes through the "placeholder stream": decoder layers of its own
(`block_layers_<i>`, warm-started as copies of the real stream's; their self-attention reads
the real stream's cached keys/values of the prefix, their cross-attention its projected
encoder output) and a final norm of its own (`block_norm`), then the shared output layer.
Placeholders attend causally to the committed prefix and to the placeholders before them; the
relative position of placeholder k to each key is the true distance of the token it drafts.
Why two streams: with every parameter shared, training the placeholders pulled the shared
layer away from q_1 (held-out top-1 of q_1 0.80 -> 0.68 after 250 steps, 0.69 after 750, with
depth 2 at 0.28); with the real stream frozen, q_1 stays exactly the feature draft's, the
stream with the most weight in a round's expected tokens, and the placeholder stream has a
whole layer to learn the later depths. Why g_T: with the placeholder's embedding alone as
its input (it reads the prefix only through the one layer's attention) depth 2's held-out
top-1 stayed at 0.23 after 1000 steps.

Exactness: q_{k+1} depends on S and on the placeholders only, never on the drafted x_1..x_k, so
x_i ~ q_i can be drawn independently and the existing kernel applies unchanged at every
temperature (the verifier's p_i is the target's law given S and x_<i, as for any draft).
Per-position top-b of the block gives a token tree whose nodes at one depth share one q.

Decode contract: `BlockDraftModel` is a `FeatureDraftModel` (`init`, `extend`, `rewind` as
there; it also works as a chain draft) with one more method, `extend_block(params, state,
tokens [B, K], features [B, K, F] | None, num_placeholders, num_tokens=None)`, which returns
the block's laws q_1..q_{1 + num_placeholders} (logits `[B, 1 + num_placeholders, V]`). A row
whose catch-up is shorter than K (the loop pads it) passes `num_tokens [B]`: its junk slots are
masked for the placeholders, which are placed right after its last real token. The state
returned holds the real tokens only (`lengths + num_tokens`); the placeholder and junk
slots are stale (masked), so no rewind is needed (one is harmless).

Training (`training/block_training.py`) is teacher-forced with many anchors in one forward:
`BlockDraft.block_logits` lays out G copies of the sentence, depth d's copy holding at position
j the d-th draft of the round whose last real token is j - d + 1 (`block_mask` says who sees
whom), so one forward gives `[G, B, L, V]` in the layout of `FeatureDraft.__call__`'s unrolled
logits; `BlockDraftModel.unrolled_logits` returns them, so the per-depth acceptance measured by
`measure.acceptance` (Table 3's method) is the block draft's own.

Shape legend: B batch, L length, K chunk, G gamma (block size), E the draft's width, F feature
width, V vocab, H heads, D head dim.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct

from speculative.decode.contract import write_rows
from speculative.models import feature_draft as fd
from speculative.models import layers, t5

Array = jax.Array
PLACEHOLDERS = "placeholder_embedder"  # the only parameters a feature draft does not have


def block_mask(length: int, gamma: int) -> np.ndarray:
    """`[G * L, G * L]` bool: who sees whom in the training forward (True = attend).

    Row `d * L + j` (d = 0 .. G - 1) is the (d + 1)-th draft of position j: d = 0 is the real
    token z_j (q_1 of the round whose last real token is j), d >= 1 is placeholder d of the
    round whose last real token is a = j - d (anchor a). It sees the real tokens at positions
    <= a and the placeholders d' <= d of the same anchor (rows `d' * L + a + d'`). Worked
    example, L = 4, G = 2, row `1 * 4 + 2` (placeholder 1 after anchor 1, at position 2): real
    keys 0, 1 and placeholder key `1 * 4 + 2` (itself); not real key 2 (the token it drafts)."""
    pos = np.arange(length)
    d = np.repeat(np.arange(gamma), length)  # depth of each row
    j = np.tile(pos, gamma)  # position of each row
    anchor = j - d
    q_d, q_a = d[:, None], anchor[:, None]
    k_d, k_j, k_a = d[None], j[None], anchor[None]
    real = (k_d == 0) & (k_j <= q_a)
    own = (k_d >= 1) & (k_d <= q_d) & (k_a == q_a)
    # A row with no anchor (j < d) sees itself only: never trained, never NaN.
    return ((real | own) & (q_a >= 0)) | (np.eye(gamma * length, dtype=bool) & (q_a < 0))


class BlockDraft(fd.FeatureDraft):
    """`FeatureDraft` plus `max_gamma - 1` placeholder embeddings (see the module docstring)."""

    max_gamma: int = 8

    def setup(self):
        super().setup()
        if self.max_gamma < 1:
            raise ValueError(f"BlockDraft.max_gamma={self.max_gamma} must be >= 1.")
        # At least one row, so a max_gamma of 1 (no placeholder) still has a well-formed tree.
        lcfg = self.config.layer_config()
        self.placeholder_embedder = layers.Embed(max(self.max_gamma - 1, 1),
                                                 self.config.emb_dim, dtype=lcfg.compute_dtype)
        # The placeholder stream's own layers and final norm (warm-started as copies of the
        # feature draft's); it shares the cross-attention keys/values, the relative position
        # biases and the output table of the real stream.
        self.block_layers = [t5.DecoderLayer(lcfg, self.config.cross_attention)
                             for _ in range(self.config.num_layers)]
        self.block_norm = layers.RMSNorm(dtype=lcfg.compute_dtype)
        if self.config.feature_layers:  # a placeholder's input: its embedding with g_T
            self.block_input = layers.DenseGeneral(self.config.emb_dim, dtype=lcfg.compute_dtype,
                                                   kernel_axes=("mlp", "embed"))

    def placeholders(self, num: int) -> Array:
        """`[num, E]` the layer inputs of placeholders 1..num."""
        if not 0 <= num <= self.max_gamma - 1:
            raise ValueError(f"num_placeholders={num} must be in [0, {self.max_gamma - 1}] "
                             f"(max_gamma={self.max_gamma}).")
        return self.placeholder_embedder(jnp.arange(num))

    def placeholder_inputs(self, ph: Array, top: Array) -> Array:
        """Layer inputs `[..., E]` of placeholders `ph [..., E]` after a real token whose top
        hidden state (the real stream's, before its final norm) is `top [..., E]`: as the
        feature draft reads a position with its own state before it, `block_input(concat(P_k,
        g_T))` (without target features, the draft has no input map: `P_k`)."""
        if not self.config.feature_layers:
            return ph
        return self.block_input(jnp.concatenate([ph, jnp.asarray(top, ph.dtype)], -1))

    def placeholder_logits(self, x: Array) -> Array:
        """The placeholder stream's logits of its top states `x [..., E]` (its own final norm,
        then the feature draft's output layer)."""
        y = self.block_norm(x)
        if self.config.target_head:
            return self.state_logits(self.head_proj(y))
        return self._output(self.hot_output if self.config.hot_ids else self.token_embedder, y)

    # -- training -------------------------------------------------------------------------------

    def block_logits(self, encoded: Optional[Array], encoder_mask: Optional[Array],
                     tokens: Array, features: Optional[Array], gamma: int) -> Array:
        """Teacher forcing with every position an anchor: logits `[G, B, L, V]`.

        `tokens [B, L]` are decoder inputs (BOS first) and `features [B, L, F]` the target's
        state after reading each (as `FeatureDraft.__call__`). `logits[d, :, j]` is the
        (d + 1)-th draft of position j: the round's last real token is j - d and the rows at
        positions j - d + 1 .. j are placeholders 1..d (`block_mask`). Positions j < d have no
        such round (give them zero loss weight). One forward over G * L rows."""
        cfg = self.config
        batch, length = tokens.shape
        if not 1 <= gamma <= self.max_gamma:
            raise ValueError(f"gamma={gamma} must be in [1, max_gamma={self.max_gamma}].")
        cross_kv = self.project_cross_kv(encoded)
        cross_bias = (layers.mask_to_bias(encoder_mask[:, None, None, :])
                      if cfg.cross_attention else None)
        if cfg.feature_layers:
            fused = self.fused(features)
            feature = jnp.pad(fused[:, :-1], ((0, 0), (1, 0), (0, 0)))
        else:
            feature = None
        x = self.embed(tokens, feature)  # [B, L, E] the real stream
        positions = jnp.tile(jnp.arange(length), gamma)[None]  # every copy's row j is at j
        bias = (self.relpos_bias(positions, positions, bidirectional=False)
                + layers.mask_to_bias(jnp.asarray(block_mask(length, gamma))[None, None]))
        real_bias, ph_bias = bias[:, :, :length, :length], bias[:, :, length:]
        kv = []
        for layer, ckv in zip(self.layers, cross_kv):
            kv.append(layer.project_self_kv(x))  # the real tokens' keys, as in the cache
            x = layer.attend(x, *kv[-1], real_bias, ckv, cross_bias)
        # Placeholder d's row at position j follows anchor j - d: its input reads g_{j-d}.
        ph = jnp.asarray(self.placeholders(gamma - 1), x.dtype)  # [G - 1, E]
        top = jnp.stack([jnp.pad(x, ((0, 0), (d, 0), (0, 0)))[:, :length]
                         for d in range(1, gamma)], 1)  # [B, G - 1, L, E]
        y = self.placeholder_inputs(jnp.broadcast_to(ph[None, :, None], top.shape), top)
        y = y.reshape(batch, (gamma - 1) * length, -1)  # the placeholder stream, by depth
        for block_layer, (key, value), ckv in zip(self.block_layers, kv, cross_kv):
            ph_key, ph_value = block_layer.project_self_kv(y)
            y = block_layer.attend(y, jnp.concatenate([key, ph_key], 2),
                                   jnp.concatenate([value, ph_value], 2), ph_bias, ckv,
                                   cross_bias)
        logits = jnp.concatenate([self.logits(x)[:, None],
                                  self.placeholder_logits(y).reshape(batch, gamma - 1, length,
                                                                     -1)], 1)
        return jnp.moveaxis(logits, 1, 0)  # [G, B, L, V]

    # -- decode mode ----------------------------------------------------------------------------

    def extend_block(self, cache: fd.FeatureDraftCache, tokens: Array,
                     features: Optional[Array], num_placeholders: int,
                     num_tokens: Optional[Array] = None) -> Tuple[Array, fd.FeatureDraftCache]:
        """Appends `tokens [B, K]` (row b's first `num_tokens[b]` real, default all K; the
        features as `FeatureDraft.extend`), then `num_placeholders` placeholders right after
        each row's last real token. Returns the block's laws as logits `[B, 1 +
        num_placeholders, V]` (q_1 at row b's last real token, then q_2.. at the placeholders;
        the output layer runs on those rows only) and the cache holding the real tokens only
        (`lengths + num_tokens`).

        Worked example: lengths 5, K = 3, num_tokens 2, 2 placeholders. Physical slots 5, 6
        real, 7 junk, 8, 9 placeholders at logical positions 7, 8; slot 7 is masked for every
        later row; the cache returned has length 7, so slots 7.. are stale."""
        batch, num_real = tokens.shape
        n = (jnp.full((batch,), num_real, jnp.int32) if num_tokens is None
             else jnp.asarray(num_tokens, jnp.int32))
        x = self.cached_input(cache, tokens, features)
        start = cache.lengths[:, None]  # [B, 1]
        max_len = cache.hidden.shape[1]
        slot = jnp.arange(max_len)[None]  # [1, L]
        cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
        # The real stream: FeatureDraft.extend (placeholders never reach these rows).
        query_slot = start + jnp.arange(num_real)[None]
        visible = slot[:, None, :] <= query_slot[:, :, None]
        self_bias = (self.relpos_bias(query_slot, slot, bidirectional=False)
                     + layers.mask_to_bias(visible[:, None]))
        new_kv = []
        for layer, kv, ckv in zip(self.layers, cache.self_kv, cache.cross_kv):
            x, kv = layer.extend(x, kv, cache.lengths, self_bias, ckv, cross_bias)
            new_kv.append(kv)
        top = jnp.take_along_axis(x, (n - 1)[:, None, None], axis=1)  # g_T [B, 1, E]
        logits = self.logits(top)  # q_1
        hidden = write_rows(cache.hidden, jnp.asarray(x, jnp.float32), cache.lengths)
        if num_placeholders:
            # The placeholder stream, written after the chunk (slots start + K ..) at the
            # logical positions right after each row's last real token; junk slots masked.
            ph = jnp.asarray(self.placeholders(num_placeholders), x.dtype)
            y = self.placeholder_inputs(jnp.broadcast_to(ph[None], (batch,) + ph.shape),
                                        jnp.broadcast_to(top, (batch,) + ph.shape))
            gap = (num_real - n)[:, None]
            query_slot = start + num_real + jnp.arange(num_placeholders)[None]
            key_pos = jnp.where(slot >= start + num_real, slot - gap, slot)  # [B, L]
            junk = (slot >= start + n[:, None]) & (slot < start + num_real)
            visible = (slot[:, None, :] <= query_slot[:, :, None]) & ~junk[:, None, :]
            ph_bias = (self.relpos_bias(query_slot - gap, key_pos, bidirectional=False)
                       + layers.mask_to_bias(visible[:, None]))
            for li, (layer, ckv) in enumerate(zip(self.block_layers, cache.cross_kv)):
                y, _ = layer.extend(y, new_kv[li], cache.lengths + num_real, ph_bias, ckv,
                                    cross_bias)
            logits = jnp.concatenate([logits, self.placeholder_logits(y)], 1)
        cache = cache.replace(lengths=cache.lengths + n, self_kv=tuple(new_kv), hidden=hidden)
        return logits, cache


def init_params(module: BlockDraft, rng: Array) -> Any:
    """Fresh parameters of every part (the feature draft's and the placeholders)."""
    cfg = module.config
    gamma = module.max_gamma
    boxed = module.init(rng, jnp.zeros((1, 4, cfg.target_emb_dim)), jnp.ones((1, 4), bool),
                        jnp.ones((1, 4), jnp.int32), jnp.zeros((1, 4, cfg.feature_dim)), gamma,
                        method="block_logits")
    return nn.meta.unbox(boxed["params"])


def is_block_param(name: str) -> bool:
    """Whether a top-level parameter belongs to the placeholder stream (the rest is the
    feature draft's: trained with `freeze_feature_draft=False` only)."""
    return name in (PLACEHOLDERS, "block_norm", "block_input") or \
        name.startswith("block_layers_")


def from_feature_draft(module: BlockDraft, feature_params: Any, rng: Array) -> Any:
    """A block draft's parameters warm-started from a trained feature draft of the same config
    (`module.config`): its parameters (in T5X's kernel layout), the placeholder stream's
    layers and final norm as copies of its own, fresh placeholders."""
    fresh = init_params(module, rng)
    missing = sorted(k for k in set(fresh) - set(feature_params) if not is_block_param(k))
    if missing:
        raise ValueError(f"from_feature_draft: the feature draft's parameters lack {missing}; "
                         "was it trained with another config (hot_ids, target_head)?")

    def copy(source, template):  # the parts `template` has (the stream never projects the
        if not isinstance(template, Mapping):  # encoder output: no cross key/value kernels)
            return jnp.asarray(source)
        return {k: copy(source[k], v) for k, v in template.items()}

    feature_params = layers.untranspose_kernels(feature_params)  # T5X's layout, as `fresh`
    params = {k: v for k, v in feature_params.items() if not is_block_param(k)}
    params[PLACEHOLDERS] = fresh[PLACEHOLDERS]
    params["block_norm"] = copy(feature_params["decoder_norm"], fresh["block_norm"])
    if "block_input" in fresh:
        params["block_input"] = copy(feature_params["input"], fresh["block_input"])
    for i in range(module.config.num_layers):
        params[f"block_layers_{i}"] = copy(feature_params[f"layers_{i}"],
                                           fresh[f"block_layers_{i}"])
    return params


@struct.dataclass
class BlockDraftModel(fd.FeatureDraftModel):
    """A `BlockDraft` + params as a draft (a pytree): a `FeatureDraftModel` (same `init`,
    `extend`, `rewind`, so it also drafts as a chain) with `extend_block`, the one call a round
    of a block drafter makes, and `unrolled_logits` in the block's sense."""

    @property
    def max_gamma(self) -> int:
        return self.module.max_gamma

    def extend_block(self, params, state, tokens, features, num_placeholders: int,
                     num_tokens=None):
        """See `BlockDraft.extend_block`; `num_placeholders` is static (a Python int)."""
        return self.module.apply({"params": params}, state, tokens, features,
                                 int(num_placeholders), num_tokens, method="extend_block")

    def unrolled_logits(self, params, context, tokens, features, depth: int):
        """Logits `[depth, B, L, V]` teacher-forced along `tokens [B, L]` (BOS first) with the
        target's `features [B, L, F]`: at depth d, position j is the d-th draft of a block
        whose last real token is j - d + 1 (`BlockDraft.block_logits`), the layout of
        `FeatureDraftModel.unrolled_logits`, so per-depth acceptance measures the block."""
        if not 1 <= depth <= self.max_gamma:
            raise ValueError(f"depth={depth} must be in [1, max_gamma={self.max_gamma}].")
        encoded, mask = context if self.module.config.cross_attention else (None, None)
        return self.module.apply({"params": params}, encoded, mask, tokens, features, depth,
                                 method="block_logits")

    def chain_unrolled_logits(self, params, context, tokens, features, depth: int):
        """The same parameters drafting as a chain (`FeatureDraftModel.unrolled_logits`)."""
        return fd.FeatureDraftModel.unrolled_logits(self, params, context, tokens, features,
                                                    depth)
