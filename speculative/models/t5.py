"""T5 (v1.1 and 1.0) in flax.linen with T5X's parameter tree, plus a K-token decode mode.

`Transformer` is the encoder-decoder of `t5x/examples/t5/network.py`; `DecoderOnly` is the same
decoder stack without cross-attention. Both share `layers.py`. Parameter names are T5X's, so a T5X
checkpoint's `target` tree is a lookup:

    token_embedder/embedding                                  [V, E]
    encoder/relpos_bias/rel_embedding                         [H, 32]
    encoder/layers_0/attention/{query,key,value}/kernel       [E, H*D]
    ...
    decoder/logits_dense/kernel                               [E, V]   (v1.1 only)

Decode mode (docs/design.md, "The decode contract"):

    cache = module.apply(v, inputs, max_len, method='init_cache')   # encoder, cross K/V: once
    logits, cache = module.apply(v, cache, tokens, method='extend')    # K tokens per row
    cache = rewind(cache, lengths)                                     # per-row rollback

Worked example of how indices move for one row (K = 3, the row holds 5 cached tokens):

    cache.lengths = 5; extend(tokens=[a, b, c]) writes a, b, c at slots 5, 6, 7;
    query i (token at position 5 + i) attends slots j <= 5 + i;
    logits[:, i] is the next-token distribution after a (i=0), a b (i=1), a b c (i=2);
    cache.lengths becomes 8. rewind(cache, 6) keeps a; slots 6, 7 are masked from now on and
    overwritten by the next extend.

Shape legend: B batch, L length, K chunk, H heads, D head dim, E embed, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode.contract import BOS_ID, write_rows
from speculative.models import layers

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5 hyperparameters, with T5X's field names (`t5x/examples/t5/network.py` T5Config).

    `head_dim=None` derives it as `emb_dim // num_heads` (which must divide exactly). The draft
    and the target are two instances of this class; make variants with `dataclasses.replace`.
    """

    vocab_size: int
    emb_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: Optional[int] = 64
    mlp_dim: int = 2048
    mlp_activations: Tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = False
    dtype: str = "float32"
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128

    def __post_init__(self):
        def fail(field, value, fix):
            raise ValueError(f"T5Config.{field}={value!r} is invalid: {fix}")

        if not isinstance(self.vocab_size, (int, np.integer)) or self.vocab_size < 2:
            fail("vocab_size", self.vocab_size, "need at least 2 ids (PAD/BOS=0 and EOS=1).")
        for field in ("emb_dim", "num_heads", "mlp_dim", "relative_attention_num_buckets",
                      "relative_attention_max_distance"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value < 1:
                fail(field, value, "must be a positive integer.")
        for field in ("num_encoder_layers", "num_decoder_layers"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value < 0:
                fail(field, value, "must be a non-negative integer.")
        if self.head_dim is None:
            if self.emb_dim % self.num_heads:
                raise ValueError(
                    f"T5Config: emb_dim={self.emb_dim} is not divisible by num_heads="
                    f"{self.num_heads}, so head_dim cannot be derived; set head_dim explicitly "
                    "(T5 allows num_heads * head_dim != emb_dim, e.g. t5_1_1_small: 6 * 64 vs 512)."
                )
            object.__setattr__(self, "head_dim", self.emb_dim // self.num_heads)
        elif not isinstance(self.head_dim, (int, np.integer)) or self.head_dim < 1:
            fail("head_dim", self.head_dim, "must be a positive integer or None.")
        if isinstance(self.mlp_activations, str):
            object.__setattr__(self, "mlp_activations", (self.mlp_activations,))
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        if not self.mlp_activations:
            fail("mlp_activations", self.mlp_activations, "give at least one, e.g. ('relu',).")
        for act in self.mlp_activations:
            layers._activation(act)  # raises a clear error for unknown names
        if not 0.0 <= self.dropout_rate < 1.0:
            fail("dropout_rate", self.dropout_rate, "must be in [0, 1).")
        try:
            dtype = jnp.dtype(self.dtype)
        except TypeError:
            fail("dtype", self.dtype, "use 'float32' or 'bfloat16'.")
        if not jnp.issubdtype(dtype, jnp.floating):
            fail("dtype", self.dtype, "use a floating dtype such as 'float32' or 'bfloat16'.")
        object.__setattr__(self, "dtype", dtype.name)
        if self.relative_attention_num_buckets < 4:
            fail("relative_attention_num_buckets", self.relative_attention_num_buckets,
                 "need at least 4 buckets (T5 uses 32).")
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            # The log-spaced buckets start at num_buckets // 2; a smaller max distance divides
            # by log(1) = 0 (T5X and HF share this degenerate arithmetic).
            fail("relative_attention_max_distance", self.relative_attention_max_distance,
                 f"must exceed relative_attention_num_buckets // 2 = "
                 f"{self.relative_attention_num_buckets // 2} (T5 uses 128 with 32 buckets).")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def inner_dim(self) -> int:
        """`H * D`, the width of the attention projections (not necessarily `emb_dim`)."""
        return self.num_heads * self.head_dim


_V11 = dict(vocab_size=32128, mlp_activations=("gelu", "linear"), logits_via_embedding=False,
            head_dim=64, dropout_rate=0.0)
_V10 = dict(vocab_size=32128, mlp_activations=("relu",), logits_via_embedding=True,
            head_dim=64, dropout_rate=0.0)

# From T5X's t5x/examples/t5/t5_1_1/*.gin and t5_1_0/*.gin.
PRESETS = {
    "t5_1_1_tiny": dict(_V11, emb_dim=8, num_heads=4, num_encoder_layers=2,
                        num_decoder_layers=2, head_dim=3, mlp_dim=16),
    "t5_1_1_small": dict(_V11, emb_dim=512, num_heads=6, num_encoder_layers=8,
                         num_decoder_layers=8, mlp_dim=1024),
    "t5_1_1_base": dict(_V11, emb_dim=768, num_heads=12, num_encoder_layers=12,
                        num_decoder_layers=12, mlp_dim=2048),
    "t5_1_1_large": dict(_V11, emb_dim=1024, num_heads=16, num_encoder_layers=24,
                         num_decoder_layers=24, mlp_dim=2816),
    "t5_1_1_xl": dict(_V11, emb_dim=2048, num_heads=32, num_encoder_layers=24,
                      num_decoder_layers=24, mlp_dim=5120),
    "t5_1_1_xxl": dict(_V11, emb_dim=4096, num_heads=64, num_encoder_layers=24,
                       num_decoder_layers=24, mlp_dim=10240),
    "t5_1_0_small": dict(_V10, emb_dim=512, num_heads=8, num_encoder_layers=6,
                         num_decoder_layers=6, mlp_dim=2048),
    "t5_1_0_base": dict(_V10, emb_dim=768, num_heads=12, num_encoder_layers=12,
                        num_decoder_layers=12, mlp_dim=3072),
}


def preset(name: str, **overrides) -> T5Config:
    """A named T5 configuration, e.g. `preset('t5_1_1_small', dtype='bfloat16')`.

    Presets use float32 compute and dropout 0 (inference); T5X's gin files use bfloat16 compute,
    which you get with `dtype='bfloat16'`.
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown T5 preset {name!r}; choose one of {sorted(PRESETS)}.")
    return T5Config(**{**PRESETS[name], **overrides})


@struct.dataclass
class DecodeCache:
    """Decode state of one T5 model (a pytree; every leaf has batch as its leading axis).

    Attributes:
      lengths: `[B]` int32, tokens held in the self-attention cache per row.
      pending: `[B]` int32, the last prefix token, not yet in the cache: the decode loops feed it
        first (BOS for the encoder-decoder; the prompt's last token for the decoder-only model).
      self_kv: per decoder layer `(key, value)`, each head-major `[B, H, L, D]`.
      cross_kv: per decoder layer `(key, value)` of the encoder output, `[B, H, L_enc, D]`, or
        `()` for the decoder-only model.
      encoder_mask: `[B, L_enc]` bool (`[B, 0]` for the decoder-only model).
      encoded: `[B, L_enc, E]` the encoder output, kept only when `init_cache(keep_encoded=True)`
        (a target-aware draft cross-attends to it); None otherwise.
      prefix_features: `[B, P + 1, F]` the decoder-only model's features after reading each of
        `[BOS] + prompt`, kept only when `init_cache(feature_layers=...)` (a target-aware draft
        reads the prompt with them); None otherwise.
    """

    lengths: Array
    pending: Array
    self_kv: Tuple[Tuple[Array, Array], ...]
    cross_kv: Tuple[Tuple[Array, Array], ...]
    encoder_mask: Array
    encoded: Optional[Array] = None
    prefix_features: Optional[Array] = None

    @property
    def max_length(self) -> int:
        return self.self_kv[0][0].shape[2] if self.self_kv else 0


def rewind(cache: DecodeCache, lengths: Array) -> DecodeCache:
    """Rolls every row back to `lengths[b]` cached tokens; later slots are masked, not cleared."""
    return cache.replace(lengths=jnp.asarray(lengths, jnp.int32))


def keep_path(cache: DecodeCache, starts: Array, offsets: Array) -> DecodeCache:
    """Moves the self-attention entries at slots `starts[b] + offsets[b, j]` to slots
    `starts[b] + j` (`offsets [B, P]`, non-decreasing in j): after a token tree was verified, the
    accepted path's keys and values become contiguous. `lengths` is left to the caller's rewind."""
    src = (starts[:, None] + offsets).astype(jnp.int32)

    def move(kv):  # [B, H, L, D]
        picked = jnp.take_along_axis(kv, src[:, None, :, None], axis=2)
        return write_rows(kv, picked, starts, axis=2)

    return cache.replace(self_kv=tuple((move(k), move(v)) for k, v in cache.self_kv))


class EncoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        cfg = self.config
        dtype = cfg.compute_dtype
        self.pre_attention_layer_norm = layers.RMSNorm(dtype=dtype)
        self.attention = layers.MultiHeadAttention(
            cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype=dtype, dropout_rate=cfg.dropout_rate)
        self.pre_mlp_layer_norm = layers.RMSNorm(dtype=dtype)
        self.mlp = layers.MlpBlock(cfg.mlp_dim, cfg.mlp_activations, dtype, cfg.dropout_rate)
        self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def __call__(self, x: Array, bias: Array, deterministic: bool = True) -> Array:
        h = self.pre_attention_layer_norm(x)
        k, v = self.attention.project_kv(h)
        x = x + self.attention(h, k, v, bias, deterministic)
        h = self.pre_mlp_layer_norm(x)
        return x + self.dropout(self.mlp(h, deterministic), deterministic=deterministic)


class DecoderLayer(nn.Module):
    config: T5Config
    cross_attention: bool = True

    def setup(self):
        cfg = self.config
        dtype = cfg.compute_dtype
        attention = functools.partial(
            layers.MultiHeadAttention, cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype=dtype,
            dropout_rate=cfg.dropout_rate)
        self.pre_self_attention_layer_norm = layers.RMSNorm(dtype=dtype)
        self.self_attention = attention()
        if self.cross_attention:
            self.pre_cross_attention_layer_norm = layers.RMSNorm(dtype=dtype)
            self.encoder_decoder_attention = attention()
        self.pre_mlp_layer_norm = layers.RMSNorm(dtype=dtype)
        self.mlp = layers.MlpBlock(cfg.mlp_dim, cfg.mlp_activations, dtype, cfg.dropout_rate)
        self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def project_cross_kv(self, encoded: Array) -> Tuple[Array, Array]:
        return self.encoder_decoder_attention.project_kv(encoded)

    def _rest(self, x, cross_kv, cross_bias, deterministic):
        """Cross-attention (if any) and MLP blocks, after self-attention."""
        if self.cross_attention:
            h = self.pre_cross_attention_layer_norm(x)
            x = x + self.encoder_decoder_attention(h, *cross_kv, cross_bias, deterministic)
        h = self.pre_mlp_layer_norm(x)
        return x + self.dropout(self.mlp(h, deterministic), deterministic=deterministic)

    def __call__(self, x, self_bias, cross_kv, cross_bias, deterministic: bool = True):
        """Teacher forcing: `x [B, L, E]` attends to itself under `self_bias [B|1, H, L, L]`."""
        h = self.pre_self_attention_layer_norm(x)
        k, v = self.self_attention.project_kv(h)
        x = x + self.self_attention(h, k, v, self_bias, deterministic)
        return self._rest(x, cross_kv, cross_bias, deterministic)

    def project_self_kv(self, x: Array) -> Tuple[Array, Array]:
        """Self-attention keys/values of `x [B, L, E]` (for callers that assemble their own key
        set, e.g. the target-aware draft's unrolled training)."""
        return self.self_attention.project_kv(self.pre_self_attention_layer_norm(x))

    def attend(self, x, key, value, self_bias, cross_kv, cross_bias, deterministic: bool = True):
        """The layer on `x [B, K, E]` with given self-attention `key/value [B, H, L, D]`."""
        h = self.pre_self_attention_layer_norm(x)
        x = x + self.self_attention(h, key, value, self_bias, deterministic)
        return self._rest(x, cross_kv, cross_bias, deterministic)

    def extend(self, x, kv, lengths, self_bias, cross_kv, cross_bias, deterministic: bool = True):
        """Decode mode: `x [B, K, E]` is written into the cache `kv` at `lengths`."""
        h = self.pre_self_attention_layer_norm(x)
        h, kv = self.self_attention.extend(h, kv, lengths, self_bias, deterministic)
        return self._rest(x + h, cross_kv, cross_bias, deterministic), kv


class Encoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    def setup(self):
        cfg = self.config
        self.relpos_bias = layers.RelativePositionBiases(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
            cfg.num_heads, dtype=cfg.compute_dtype)
        self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
        self.encoder_norm = layers.RMSNorm(dtype=cfg.compute_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def __call__(self, tokens: Array, deterministic: bool = True) -> Array:
        """`tokens [B, L]` (0 = padding) -> `[B, L, E]`."""
        length = tokens.shape[1]
        positions = jnp.arange(length)[None]
        mask = (tokens > 0)[:, None, :, None] & (tokens > 0)[:, None, None, :]
        bias = (self.relpos_bias(positions, positions, bidirectional=True)
                + layers.mask_to_bias(mask))
        x = self.dropout(self.shared_embedding(tokens), deterministic=deterministic)
        for layer in self.layers:
            x = layer(x, bias, deterministic)
        x = self.encoder_norm(x)
        return self.dropout(x, deterministic=deterministic)


class Decoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module
    cross_attention: bool = True

    def setup(self):
        cfg = self.config
        self.relpos_bias = layers.RelativePositionBiases(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
            cfg.num_heads, dtype=cfg.compute_dtype)
        self.layers = [DecoderLayer(cfg, self.cross_attention)
                       for _ in range(cfg.num_decoder_layers)]
        self.decoder_norm = layers.RMSNorm(dtype=cfg.compute_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        if not cfg.logits_via_embedding:
            self.logits_dense = layers.DenseGeneral(
                cfg.vocab_size, dtype=jnp.float32, kernel_axes=("embed", "vocab"))

    def project_cross_kv(self, encoded: Array):
        if not self.cross_attention:
            return tuple(() for _ in self.layers)
        return tuple(layer.project_cross_kv(encoded) for layer in self.layers)

    def logits(self, y: Array, deterministic: bool = True) -> Array:
        """Final norm and output layer; float32 `[B, K, V]`."""
        y = self.dropout(self.decoder_norm(y), deterministic=deterministic)
        if self.config.logits_via_embedding:
            # T5 1.0: tied output layer, scaled by 1/sqrt(E) (T5X `attend() / sqrt(emb_dim)`).
            return self.shared_embedding.attend(y) / np.sqrt(y.shape[-1]).astype(np.float32)
        return self.logits_dense(y)

    def __call__(self, tokens, cross_kv, cross_bias, decoder_mask=None, deterministic=True):
        """Teacher forcing: `tokens [B, L]` (BOS-shifted inputs) -> logits `[B, L, V]`."""
        length = tokens.shape[1]
        positions = jnp.arange(length)[None]
        mask = positions[:, :, None] >= positions[:, None, :]  # causal [1, L, L]
        mask = mask[:, None]
        if decoder_mask is not None:
            mask = mask & decoder_mask
        bias = (self.relpos_bias(positions, positions, bidirectional=False)
                + layers.mask_to_bias(mask))
        x = self.dropout(self.shared_embedding(tokens), deterministic=deterministic)
        for layer, ckv in zip(self.layers, cross_kv):
            x = layer(x, bias, ckv, cross_bias, deterministic)
        return self.logits(x, deterministic)

    def extend(self, tokens: Array, cache: DecodeCache, with_logits: bool = True):
        """Appends `tokens [B, K]` at each row's own position; returns (logits, cache)."""
        logits, _, cache = self.extend_with_features(tokens, cache, (), with_logits)
        return logits, cache

    def extend_with_features(self, tokens: Array, cache: DecodeCache,
                             feature_layers: Tuple[int, ...], with_logits: bool = True,
                             tree: Optional[Tuple[np.ndarray, np.ndarray]] = None):
        """`extend`, also returning the residual stream after each decoder layer in
        `feature_layers` (1-based; `num_decoder_layers` is the top, before the final norm),
        concatenated: `(logits [B, K, V], features [B, K, len(feature_layers) * E] f32, cache)`.
        Feature i of row b is the state that produced `logits[b, i]`.

        `tree = (depths [K], visible [K, K])` reads the K tokens as the nodes of a token tree
        rather than a chain: node i sits at position `lengths + depths[i]` (its relative-position
        buckets count depth, not slot) and attends to the cached prefix and to the nodes j with
        `visible[i, j]` (itself and its ancestors). The nodes are still written to slots
        `lengths .. lengths + K - 1`; `keep_path` moves the accepted ones together afterwards.
        A chain is `depths = arange(K)`, `visible` lower-triangular."""
        num_new = tokens.shape[1]
        max_len = cache.max_length
        slots = jnp.arange(max_len)[None]  # [1, L]
        if tree is None:
            query_pos = cache.lengths[:, None] + jnp.arange(num_new)[None]  # [B, K]
            key_pos = slots
            mask = (key_pos[:, None, :] <= query_pos[:, :, None])[:, None]  # [B, 1, K, L]
        else:
            depths, visible = (jnp.asarray(a) for a in tree)
            start = cache.lengths[:, None]  # [B, 1]
            query_pos = start + depths[None]
            offset = slots - start  # [B, L]: the slot's index in the block of new nodes
            in_block = (offset >= 0) & (offset < num_new)
            node = jnp.clip(offset, 0, num_new - 1)
            key_pos = jnp.where(in_block, start + depths[node], slots)
            sees = jnp.transpose(visible[:, node], (1, 0, 2)) & in_block[:, None]  # [B, K, L]
            mask = ((slots < start)[:, None, :] | sees)[:, None]
        self_bias = (self.relpos_bias(query_pos, key_pos, bidirectional=False)
                     + layers.mask_to_bias(mask))
        cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
        x = self.shared_embedding(tokens)
        new_kv, features = [], []
        for depth, (layer, kv, ckv) in enumerate(zip(self.layers, cache.self_kv, cache.cross_kv or
                                                     [()] * len(self.layers)), 1):
            x, kv = layer.extend(x, kv, cache.lengths, self_bias, ckv, cross_bias)
            new_kv.append(kv)
            if depth in feature_layers:
                features.append(jnp.asarray(x, jnp.float32))
        cache = cache.replace(lengths=cache.lengths + num_new, self_kv=tuple(new_kv))
        logits = self.logits(x) if with_logits else None
        return logits, (jnp.concatenate(features, -1) if features else None), cache


def _empty_self_kv(cfg: T5Config, batch: int, max_len: int):
    shape = (batch, cfg.num_heads, max_len, cfg.head_dim)
    zeros = jnp.zeros(shape, cfg.compute_dtype)
    return tuple((zeros, zeros) for _ in range(cfg.num_decoder_layers))


class _Extend(nn.Module):
    """The decode contract's cached steps, shared by both model kinds: each runs the module's
    `decoder` (a `Decoder`) on the cache that `init_cache` made."""

    def extend(self, cache: DecodeCache, tokens: Array) -> Tuple[Array, DecodeCache]:
        """Appends `tokens [B, K]` per row; returns float32 logits `[B, K, V]` and the cache."""
        return self.decoder.extend(tokens, cache)

    def extend_with_features(self, cache: DecodeCache, tokens: Array,
                             feature_layers: Tuple[int, ...]):
        """`extend` plus the decoder's hidden states: `(logits, features [B, K, F], cache)`."""
        return self.decoder.extend_with_features(tokens, cache, feature_layers)

    def extend_tree(self, cache: DecodeCache, tokens: Array, tree, feature_layers=()):
        """`extend` of the nodes of a token tree (`Decoder.extend_with_features`)."""
        return self.decoder.extend_with_features(tokens, cache, tuple(feature_layers), tree=tree)


class Transformer(_Extend):
    """T5 encoder-decoder (T5X `network.Transformer`), with a K-token decode mode."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.compute_dtype)
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
        return self.encoder(encoder_input_tokens, deterministic=not enable_dropout)

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens,
               decoder_target_tokens=None, enable_dropout: bool = False) -> Array:
        """Teacher-forced decoder logits `[B, L, V]` for an encoded batch."""
        deterministic = not enable_dropout
        cross_kv = self.decoder.project_cross_kv(encoded)
        if decoder_target_tokens is None:
            decoder_valid = jnp.ones_like(decoder_input_tokens, bool)
            decoder_mask = None
        else:
            decoder_valid = decoder_target_tokens > 0
            decoder_mask = (decoder_valid[:, None, :, None] & decoder_valid[:, None, None, :])
        cross_mask = decoder_valid[:, None, :, None] & (encoder_input_tokens > 0)[:, None, None, :]
        return self.decoder(decoder_input_tokens, cross_kv, layers.mask_to_bias(cross_mask),
                            decoder_mask, deterministic)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
                 enable_dropout: bool = False) -> Array:
        """Teacher forcing: logits `[B, L_dec, V]` (float32).

        `decoder_input_tokens` are the targets shifted right with BOS = 0 first. Padding (0) in
        `decoder_target_tokens`, when given, is masked as in T5X; it only affects padded rows.
        """
        encoded = self.encode(encoder_input_tokens, enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                           decoder_target_tokens, enable_dropout)

    def init_cache(self, encoder_input_tokens: Array, max_len: int,
                   keep_encoded: bool = False) -> DecodeCache:
        """Runs the encoder once and projects its cross-attention keys/values once
        (`keep_encoded`: the encoder output stays in the cache, for a target-aware draft)."""
        encoded = self.encode(encoder_input_tokens)
        batch = encoder_input_tokens.shape[0]
        return DecodeCache(
            lengths=jnp.zeros((batch,), jnp.int32),
            pending=jnp.full((batch,), BOS_ID, jnp.int32),
            self_kv=_empty_self_kv(self.config, batch, max_len),
            cross_kv=self.decoder.project_cross_kv(encoded),
            encoder_mask=encoder_input_tokens > 0,
            encoded=jnp.asarray(encoded, jnp.float32) if keep_encoded else None,
        )


class DecoderOnly(_Extend):
    """A T5-style decoder stack without cross-attention (a causal language model)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.compute_dtype)
        self.decoder = Decoder(cfg, self.token_embedder, cross_attention=False)

    def __call__(self, decoder_input_tokens, decoder_target_tokens=None,
                 enable_dropout: bool = False) -> Array:
        """Teacher forcing: inputs start with BOS = 0 (not padding); causal mask; `[B, L, V]`."""
        decoder_mask = None
        if decoder_target_tokens is not None:
            valid = decoder_target_tokens > 0
            decoder_mask = valid[:, None, :, None] & valid[:, None, None, :]
        no_cross = tuple(() for _ in range(self.config.num_decoder_layers))
        return self.decoder(decoder_input_tokens, no_cross, None, decoder_mask,
                            deterministic=not enable_dropout)

    def init_cache(self, prompt_tokens: Array, max_len: int,
                   feature_layers: Optional[Tuple[int, ...]] = None) -> DecodeCache:
        """Prefills `[BOS] + prompt` per row; `prompt_tokens [B, L]` are right-padded with 0.

        Rows may have different prompt lengths. The cache holds `[BOS] + prompt[:-1]` and the
        prompt's last token (BOS for an empty prompt) is left `pending`, to be fed first. With
        `feature_layers` (a target-aware draft's), the prefill's features after those layers
        stay in the cache as `prefix_features [B, L + 1, F]`.
        """
        batch, prompt_len = prompt_tokens.shape
        if prompt_len + 1 > max_len:
            raise ValueError(
                f"Prompt length {prompt_len} (+1 for BOS) does not fit the decode cache of "
                f"max_len={max_len}; increase max_len or shorten the prompt.")
        seq = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32),
                               prompt_tokens.astype(jnp.int32)], 1)
        num = 1 + jnp.sum(prompt_tokens > 0, axis=1).astype(jnp.int32)  # tokens incl. BOS
        cache = DecodeCache(
            lengths=jnp.zeros((batch,), jnp.int32),
            pending=jnp.zeros((batch,), jnp.int32),
            self_kv=_empty_self_kv(self.config, batch, max_len),
            cross_kv=(),
            encoder_mask=jnp.zeros((batch, 0), bool),
        )
        _, features, cache = self.decoder.extend_with_features(
            seq, cache, tuple(feature_layers or ()), with_logits=False)
        pending = jnp.take_along_axis(seq, (num - 1)[:, None], axis=1)[:, 0]
        return cache.replace(lengths=num - 1, pending=pending,
                             prefix_features=None if feature_layers is None else features)


def param_shapes(module: nn.Module, enc_len: int = 4, dec_len: int = 4) -> Any:
    """The unboxed parameter tree as `jax.ShapeDtypeStruct`s, without allocating it."""
    boxed = jax.eval_shape(lambda: init_boxed(module, jax.random.PRNGKey(0), enc_len, dec_len))
    return nn.meta.unbox(boxed)


def param_axes(module: nn.Module) -> Any:
    """Logical axis names of every parameter, e.g. `('embed', 'joined_kv')`."""
    boxed = jax.eval_shape(lambda: init_boxed(module, jax.random.PRNGKey(0), 4, 4))
    return jax.tree_util.tree_map(
        lambda x: tuple(x.names), boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def init_boxed(module: nn.Module, rng: Array, enc_len: int = 4, dec_len: int = 4):
    """`module.init` on dummy inputs; parameters are `nn.LogicallyPartitioned` boxes."""
    dec = jnp.ones((1, dec_len), jnp.int32)
    if isinstance(module, DecoderOnly):
        return module.init(rng, dec)["params"]
    return module.init(rng, jnp.ones((1, enc_len), jnp.int32), dec)["params"]


def init_params(module: nn.Module, rng: Array) -> Any:
    """Randomly initialised float32 parameters (T5X initialisers), as a plain nested dict."""
    return nn.meta.unbox(init_boxed(module, rng))
