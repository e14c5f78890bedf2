"""A target-aware draft for T5 encoder-decoders (EAGLE-3 style features, distil-whisper style
encoder sharing), and for decoder-only T5 language models: a small decoder with no encoder of
its own.

At each position j the draft reads the token z_j and a feature f_{j-1} of the previous position:

    f_{j-1} = fuse(norm(h_{j-1}))   the target decoder's hidden states after the layers in
                                    `feature_layers` (e.g. 2, 4 and 6 of 6), where the target has
                                    already read position j-1 (every committed position);
    f_{j-1} = g_{j-1}               its own top hidden state at j-1, at the positions it drafted
                                    itself this round (no target state exists for them yet);
    x_j = input(concat(embed(z_j), f_{j-1}))  ->  decoder layers (self-attention over its own
          cache, cross-attention to the TARGET's encoder output, MLP)  ->  g_j  ->  logits q_j

Its cross-attention keys and values are projected once per sentence from the target's encoder
output (`init(..., context=(encoded, mask))`). The draft of a decoder-only target
(`cross_attention=False`) has no cross-attention; it starts by reading `[BOS] + prompt` with the
target's features of the prefill (`init(..., context=prefix_features)`), as it reads every
committed position. The output layer is its own: tied to its
embedding (T5 1.0 style) over the target's whole vocabulary, or, with `hot_ids`, a separate
table over a reduced "hot" vocabulary (EAGLE-3's draft vocabulary), whose logits are placed at
those ids and `HOT_MASK_LOGIT` elsewhere, so q is still a full distribution over the target's
vocabulary, exactly zero outside the hot set (`exp(HOT_MASK_LOGIT / T - max)` underflows to 0
in float32): the verifiers handle q = 0 as for any other draft.
`with_hot_vocab` makes one from a trained full-vocabulary draft (the hot rows of its tied table).
With `target_head` (EAGLE's reuse of the target's LM head) the output layer is instead the
TARGET's, frozen: the draft maps g_j to the target's width (its guess of the target's top-layer
state at j, `head_state`), then applies the target's final norm and output table
(`with_target_head` copies them in; hot rows only with `hot_ids`).

Decode contract (`speculative.decoding`): `init(params, inputs, max_len, context)`,
`extend(params, state, tokens [B, K], features [B, K, F] | None)` and `rewind`; with
`features=None` (one token per call) the feature of the new position is the draft's own hidden
state at the row's last cached position, which the state keeps per position like its KV cache.

Training (`speculative.feature_training`) unrolls the draft over several depths on its own
hidden states ("training-time test", EAGLE-3 / HASS): `unrolled_logits`.

Shape legend: B batch, L length, K chunk, E the draft's width, F feature width
(len(feature_layers) * the target's width), V vocab, T the target's width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode import contract
from speculative.decode.contract import write_rows
from speculative.models import layers, t5

Array = jax.Array
HOT_MASK_LOGIT = -1e30  # logit of a token outside the hot vocabulary (finite: never "non-finite")


@dataclasses.dataclass(frozen=True)
class FeatureDraftConfig:
    """Shape of a target-aware draft.

    Attributes:
      vocab_size: the target's vocabulary (q covers all of it).
      target_emb_dim: the target's width T (its encoder output and each feature layer).
      feature_layers: the target decoder layers whose outputs it reads (1-based; empty = the
        encoder output only, the ablation without features).
      emb_dim, num_heads, head_dim, mlp_dim, num_layers: the draft's own decoder.
      hot_ids: the ids its output layer covers (ascending, unique; empty = all `vocab_size`);
        q is zero at every other id. The input embedding still covers the whole vocabulary.
      cross_attention: True for an encoder-decoder target (the draft cross-attends to its
        encoder output); False for a decoder-only target (`t5.DecoderOnly`).
      target_head: the logits go through the target's own final norm and output table (frozen
        copies, `with_target_head`) from a map of the draft's state to the target's width T,
        instead of the draft's tied table; with `hot_ids`, the table's hot rows only.
    """

    vocab_size: int
    target_emb_dim: int
    feature_layers: Tuple[int, ...] = (2, 4, 6)
    emb_dim: int = 192
    num_heads: int = 3
    head_dim: int = 64
    mlp_dim: int = 768
    num_layers: int = 1
    mlp_activations: Tuple[str, ...] = ("gelu", "linear")
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dtype: str = "float32"
    hot_ids: Tuple[int, ...] = ()
    cross_attention: bool = True
    target_head: bool = False

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        object.__setattr__(self, "hot_ids", tuple(int(i) for i in self.hot_ids))
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for name in ("vocab_size", "target_emb_dim", "emb_dim", "num_heads", "head_dim",
                     "mlp_dim", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"FeatureDraftConfig.{name}={value!r} must be a positive int.")
        if any(i < 1 for i in self.feature_layers):
            raise ValueError(f"FeatureDraftConfig.feature_layers={self.feature_layers} are "
                             "1-based target decoder layers.")
        hot = np.asarray(self.hot_ids, np.int64)
        if hot.size and (np.any(np.diff(hot) <= 0) or hot[0] < 0 or hot[-1] >= self.vocab_size):
            bad = hot[(hot < 0) | (hot >= self.vocab_size)][:5].tolist() or "not ascending"
            raise ValueError(f"FeatureDraftConfig.hot_ids must be ascending unique ids in "
                             f"[0, {self.vocab_size}) ({len(hot)} given; {bad}); build them "
                             "with feature_data.hot_vocabulary.")

    @property
    def feature_dim(self) -> int:
        return len(self.feature_layers) * self.target_emb_dim

    def layer_config(self) -> t5.T5Config:
        """The T5 decoder layer shape the draft reuses (no dropout, no encoder)."""
        return t5.T5Config(
            vocab_size=self.vocab_size, emb_dim=self.emb_dim, num_heads=self.num_heads,
            num_encoder_layers=0, num_decoder_layers=self.num_layers, head_dim=self.head_dim,
            mlp_dim=self.mlp_dim, mlp_activations=self.mlp_activations, dropout_rate=0.0,
            logits_via_embedding=True, dtype=self.dtype,
            relative_attention_num_buckets=self.relative_attention_num_buckets,
            relative_attention_max_distance=self.relative_attention_max_distance)


@struct.dataclass
class FeatureDraftCache:
    """Decode state of a target-aware draft (every leaf has batch first).

    Attributes:
      lengths: `[B]` int32, positions held per row.
      pending: `[B]` int32, BOS (the decode loops feed it first).
      self_kv: per layer `(key, value)`, each head-major `[B, H, L, D]`.
      cross_kv: per layer `(key, value)` of the target's encoder output, `[B, H, L_enc, D]`
        (`()` without cross-attention).
      encoder_mask: `[B, L_enc]` bool (`[B, 0]` without cross-attention).
      hidden: `[B, L, E]` the draft's top hidden state g at each cached position (the feature
        of the next position when the draft extends without target features).
    """

    lengths: Array
    pending: Array
    self_kv: Tuple[Tuple[Array, Array], ...]
    cross_kv: Tuple[Tuple[Array, Array], ...]
    encoder_mask: Array
    hidden: Array


class FeatureDraft(nn.Module):
    """The flax module (see the module docstring)."""

    config: FeatureDraftConfig

    def setup(self):
        cfg = self.config
        lcfg = cfg.layer_config()
        dtype = lcfg.compute_dtype
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, dtype=dtype)
        if cfg.feature_layers:
            self.feature_norms = [layers.RMSNorm(dtype=jnp.float32) for _ in cfg.feature_layers]
            self.fuse = layers.DenseGeneral(cfg.emb_dim, dtype=dtype, kernel_axes=("mlp", "embed"))
            self.input = layers.DenseGeneral(cfg.emb_dim, dtype=dtype, kernel_axes=("mlp", "embed"))
        self.relpos_bias = layers.RelativePositionBiases(
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
            cfg.num_heads, dtype=dtype)
        self.layers = [t5.DecoderLayer(lcfg, cfg.cross_attention) for _ in range(cfg.num_layers)]
        self.decoder_norm = layers.RMSNorm(dtype=dtype)
        if cfg.target_head:  # frozen copies of the target's final norm and output table
            self.head_proj = layers.DenseGeneral(cfg.target_emb_dim, dtype=dtype,
                                                 kernel_axes=("embed", "mlp"))
            self.head_norm = layers.RMSNorm(dtype=dtype)
            self.head = layers.Embed(len(cfg.hot_ids) or cfg.vocab_size, cfg.target_emb_dim,
                                     dtype=dtype)
        elif cfg.hot_ids:
            self.hot_output = layers.Embed(len(cfg.hot_ids), cfg.emb_dim, dtype=dtype)

    # -- pieces ---------------------------------------------------------------------------------

    def fused(self, features: Array) -> Array:
        """Target features `[..., F]` -> `[..., E]` (each layer normalised, then one map)."""
        parts = jnp.split(jnp.asarray(features, jnp.float32), len(self.config.feature_layers), -1)
        return self.fuse(jnp.concatenate([n(p) for n, p in zip(self.feature_norms, parts)], -1))

    def embed(self, tokens: Array, feature: Optional[Array]) -> Array:
        """Layer input from tokens `[B, L]` and the previous position's feature `[B, L, E]`."""
        x = self.token_embedder(tokens)
        if not self.config.feature_layers:
            return x
        return self.input(jnp.concatenate([x, jnp.asarray(feature, x.dtype)], -1))

    def head_state(self, hidden: Array) -> Array:
        """`target_head`: the draft's guess `[..., T]` of the target's top-layer state (before
        its final norm) from its own top states `hidden [..., E]`."""
        return self.head_proj(self.decoder_norm(hidden))

    def state_logits(self, state: Array) -> Array:
        """`target_head`: the target's logits of a guessed top-layer state `[..., T]`."""
        return self._output(self.head, self.head_norm(state))

    def logits(self, hidden: Array) -> Array:
        cfg = self.config
        if cfg.target_head:
            return self.state_logits(self.head_state(hidden))
        table = self.hot_output if cfg.hot_ids else self.token_embedder
        return self._output(table, self.decoder_norm(hidden))

    def _output(self, table: nn.Module, y: Array) -> Array:
        """T5 1.0's tied output layer `attend(y) / sqrt(width)`; with `hot_ids`, its hot
        logits placed at those ids and `HOT_MASK_LOGIT` elsewhere."""
        cfg = self.config
        out = table.attend(y) / np.sqrt(y.shape[-1]).astype(np.float32)
        if not cfg.hot_ids:
            return out
        full = jnp.full(out.shape[:-1] + (cfg.vocab_size,), HOT_MASK_LOGIT, out.dtype)
        return full.at[..., np.asarray(cfg.hot_ids)].set(out)  # out: [..., H] hot logits

    def project_cross_kv(self, encoded: Optional[Array]):
        if not self.config.cross_attention:
            return tuple(() for _ in self.layers)
        return tuple(layer.project_cross_kv(encoded) for layer in self.layers)

    # -- training -------------------------------------------------------------------------------

    def __call__(self, encoded: Optional[Array], encoder_mask: Optional[Array], tokens: Array,
                 features: Optional[Array] = None, depth: int = 1, return_states: bool = False):
        """Teacher forcing on the target's features, unrolled `depth` times on its own states.

        `tokens [B, L]` are decoder inputs (BOS first), `features [B, L, F]` the target's state
        after reading each of them (row j predicts token j + 1), `encoded [B, L_enc, T]` (None
        without cross-attention). Returns
        logits `[depth, B, L, V]`: at depth d, position j reads the target's features only up to
        position j - d (its cache holds them for positions <= j - d + 1) and its own states at
        positions j - d + 1 .. j - 1, exactly as the d-th draft of a round does at inference.
        Positions j < d - 1 have no such round; give them zero loss weight. With
        `return_states` (a `target_head` draft), also the guesses of the target's top-layer
        state `[depth, B, L, T]` the logits were read from.
        """
        cfg = self.config
        batch, length = tokens.shape
        if return_states and not cfg.target_head:
            raise ValueError("return_states: only a target_head draft guesses target states.")
        cross_kv = self.project_cross_kv(encoded)
        cross_bias = (layers.mask_to_bias(encoder_mask[:, None, None, :])
                      if cfg.cross_attention else None)
        positions = jnp.arange(length)
        rel = self.relpos_bias(positions[None], positions[None], bidirectional=False)  # [1,H,L,L]

        def shift(x):  # the previous position's vector (zeros at position 0)
            return jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))

        feature = (shift(self.fused(features)) if cfg.feature_layers
                   else jnp.zeros((batch, length, cfg.emb_dim)))
        keys = [[] for _ in self.layers]  # per layer, per depth: (k, v) [B, H, L, D]
        out, states = [], []
        for d in range(1, depth + 1):
            x = self.embed(tokens, feature)
            q_pos, k_pos = positions[:, None], positions[None, :]
            # Depth-1 keys at positions <= j - d + 1; the depth-i key (i >= 2) at j - d + i.
            masks = [k_pos <= q_pos - d + 1] + [k_pos == q_pos - d + i for i in range(2, d + 1)]
            bias = jnp.concatenate([rel + layers.mask_to_bias(m[None, None]) for m in masks], -1)
            for li, layer in enumerate(self.layers):
                keys[li].append(layer.project_self_kv(x))
                key = jnp.concatenate([k for k, _ in keys[li]], axis=2)
                value = jnp.concatenate([v for _, v in keys[li]], axis=2)
                x = layer.attend(x, key, value, bias, cross_kv[li], cross_bias)
            if cfg.target_head:
                states.append(self.head_state(x))
                out.append(self.state_logits(states[-1]))
            else:
                out.append(self.logits(x))
            feature = shift(x)
        return (jnp.stack(out), jnp.stack(states)) if return_states else jnp.stack(out)

    # -- decode mode ----------------------------------------------------------------------------

    def init_cache(self, encoded: Array, encoder_mask: Array, max_len: int) -> FeatureDraftCache:
        """An empty cache of a draft that cross-attends to `encoded [B, L_enc, T]`."""
        return self._empty_cache(encoded.shape[0], max_len, self.project_cross_kv(encoded),
                                 encoder_mask)

    def init_prefix_cache(self, prompt_tokens: Array, prefix_features: Optional[Array],
                          max_len: int) -> FeatureDraftCache:
        """The draft of a decoder-only target after reading `[BOS] + prompt` (`prompt_tokens
        [B, P]`, right-padded with 0) with the target's `prefix_features [B, P + 1, F]` of the
        same positions: it then holds what the target's prefill holds (`[BOS] + prompt[:-1]`);
        the prompt's last token is the target's pending one."""
        batch = prompt_tokens.shape[0]
        cache = self._empty_cache(batch, max_len, self.project_cross_kv(None),
                                  jnp.zeros((batch, 0), bool))
        seq = jnp.concatenate([jnp.full((batch, 1), contract.BOS_ID, jnp.int32),
                               jnp.asarray(prompt_tokens, jnp.int32)], 1)
        before = None  # the feature of the position before each (zero before BOS)
        if self.config.feature_layers:
            before = jnp.pad(prefix_features[:, :-1], ((0, 0), (1, 0), (0, 0)))
        _, cache = self.extend(cache, seq, before)
        return cache.replace(lengths=jnp.sum(prompt_tokens > 0, axis=1).astype(jnp.int32))

    def _empty_cache(self, batch, max_len, cross_kv, encoder_mask) -> FeatureDraftCache:
        cfg = self.config
        zeros = jnp.zeros((batch, cfg.num_heads, max_len, cfg.head_dim),
                          cfg.layer_config().compute_dtype)
        return FeatureDraftCache(
            lengths=jnp.zeros((batch,), jnp.int32),
            pending=jnp.full((batch,), contract.BOS_ID, jnp.int32),
            self_kv=tuple((zeros, zeros) for _ in self.layers),
            cross_kv=cross_kv, encoder_mask=encoder_mask,
            hidden=jnp.zeros((batch, max_len, cfg.emb_dim), jnp.float32))

    def cached_input(self, cache: FeatureDraftCache, tokens: Array,
                     features: Optional[Array]) -> Array:
        """The layer input of `tokens [B, K]` appended to `cache`: each token with the target's
        feature of the previous position (`features [B, K, F]`), or, with `features=None` (K =
        1), the draft's own hidden state at the row's last cached position."""
        if not self.config.feature_layers:
            feature = None  # the ablation that reads the encoder output only
        elif features is None:
            if tokens.shape[1] != 1:
                raise ValueError("Without target features the draft extends one token per call.")
            prev = jnp.maximum(cache.lengths - 1, 0)
            feature = jnp.take_along_axis(cache.hidden, prev[:, None, None], axis=1)
        else:
            feature = self.fused(features)
        return self.embed(tokens, feature)

    def extend(self, cache: FeatureDraftCache, tokens: Array,
               features: Optional[Array] = None) -> Tuple[Array, FeatureDraftCache]:
        """Appends `tokens [B, K]` with the target's `features [B, K, F]` of the previous
        positions, or (`features=None`, K = 1) with the draft's own hidden state there."""
        num_new = tokens.shape[1]
        x = self.cached_input(cache, tokens, features)
        max_len = cache.hidden.shape[1]
        query_pos = cache.lengths[:, None] + jnp.arange(num_new)[None]
        key_pos = jnp.arange(max_len)[None]
        mask = (key_pos[:, None, :] <= query_pos[:, :, None])[:, None]
        self_bias = (self.relpos_bias(query_pos, key_pos, bidirectional=False)
                     + layers.mask_to_bias(mask))
        cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])
        new_kv = []
        for layer, kv, ckv in zip(self.layers, cache.self_kv, cache.cross_kv):
            x, kv = layer.extend(x, kv, cache.lengths, self_bias, ckv, cross_bias)
            new_kv.append(kv)
        hidden = write_rows(cache.hidden, jnp.asarray(x, jnp.float32), cache.lengths)
        cache = cache.replace(lengths=cache.lengths + num_new, self_kv=tuple(new_kv),
                              hidden=hidden)
        return self.logits(x), cache


def init_params(module: FeatureDraft, rng: Array) -> Any:
    cfg = module.config
    boxed = module.init(rng, jnp.zeros((1, 4, cfg.target_emb_dim)), jnp.ones((1, 4), bool),
                        jnp.ones((1, 4), jnp.int32), jnp.zeros((1, 4, cfg.feature_dim)), 1)
    return nn.meta.unbox(boxed["params"])


def with_hot_vocab(config: FeatureDraftConfig, params: Any,
                   hot_ids) -> Tuple[FeatureDraftConfig, Any]:
    """A full-vocabulary draft restricted to `hot_ids`: its output table is the hot rows of
    its tied embedding, so on the hot set its logits are unchanged and q is renormalised there
    (zero elsewhere). No retraining; the argmax changes only where it was outside the set."""
    if config.hot_ids:
        raise ValueError(f"This draft already has a hot vocabulary ({len(config.hot_ids)} ids).")
    new = dataclasses.replace(config, hot_ids=hot_ids)  # __post_init__ checks them
    # a target_head draft keeps the hot rows of the target's table
    source, dest = ("head", "head") if config.target_head else ("token_embedder", "hot_output")
    table = jnp.asarray(params[source]["embedding"])[np.asarray(new.hot_ids)]
    return new, {**params, dest: {"embedding": table}}


def with_target_head(config: FeatureDraftConfig, params: Any, target_params: Any,
                     target_config: t5.T5Config) -> Any:
    """`params` of a `target_head` draft with the target's final norm and output table copied
    in (hot rows only with `hot_ids`). An untied target's `logits_dense` kernel [T, V] is stored
    transposed and scaled by sqrt(T), so the draft's `attend / sqrt(T)` gives its logits."""
    if not config.target_head:
        raise ValueError("with_target_head: the draft's config has target_head=False.")
    if target_config.emb_dim != config.target_emb_dim or \
            target_config.vocab_size != config.vocab_size:
        raise ValueError(f"with_target_head: the target has width {target_config.emb_dim} and "
                         f"{target_config.vocab_size} tokens; the draft expects "
                         f"{config.target_emb_dim} and {config.vocab_size}.")
    target_params = layers.untranspose_kernels(target_params)  # T5X's layout, as documented
    decoder = target_params["decoder"]
    if target_config.logits_via_embedding:
        table = jnp.asarray(target_params["token_embedder"]["embedding"], jnp.float32)
    else:
        kernel = jnp.asarray(decoder["logits_dense"]["kernel"], jnp.float32)
        table = kernel.T * np.sqrt(config.target_emb_dim).astype(np.float32)
    if config.hot_ids:
        table = table[np.asarray(config.hot_ids)]
    scale = jnp.asarray(decoder["decoder_norm"]["scale"], jnp.float32)
    return {**params, "head": {"embedding": table}, "head_norm": {"scale": scale}}


FROZEN = ("head", "head_norm")  # a target_head draft's copies of the target (never trained)


@struct.dataclass
class FeatureDraftModel:
    """A `FeatureDraft` + params as the draft of `speculative_decode` (a pytree).

    It reads the target (`reads_target`): the loop initialises it with the target's context
    (`target.context`: an encoder-decoder's encoder output, or a decoder-only model's features
    of the prompt) and feeds it the target's features of every committed position
    (docs/design.md, "Target-aware drafts")."""

    module: FeatureDraft = struct.field(pytree_node=False)
    params: Any
    max_length: Optional[int] = struct.field(pytree_node=False, default=None)
    reads_target: bool = struct.field(pytree_node=False, default=True)

    @property
    def vocab_size(self) -> int:
        return self.module.config.vocab_size

    @property
    def feature_layers(self) -> Tuple[int, ...]:
        return self.module.config.feature_layers

    @property
    def feature_dim(self) -> int:
        return self.module.config.feature_dim

    def prefix_length(self, input_length: int) -> int:
        # as its target: an encoder-decoder's decoder starts empty; a decoder-only model holds
        # BOS + prompt
        return 0 if self.module.config.cross_attention else input_length + 1

    def init(self, params, inputs, max_len, context=None):
        cfg = self.module.config
        if cfg.cross_attention:
            if context is None:
                raise ValueError("A target-aware draft needs the target's encoder output "
                                 "(context=(encoded, mask)); speculative_decode passes it.")
            encoded, mask = context
            return self.module.apply({"params": params}, encoded, mask, max_len,
                                     method="init_cache")
        if cfg.feature_layers and context is None:
            raise ValueError("The draft of a decoder-only target reads the prompt with the "
                             "target's features of it (context=prefix_features, from "
                             "target.init_for_draft); speculative_decode passes them.")
        return self.module.apply({"params": params}, inputs, context, max_len,
                                 method="init_prefix_cache")

    def extend(self, params, state, tokens, features=None):
        return self.module.apply({"params": params}, state, tokens, features, method="extend")

    def rewind(self, state, lengths):
        return state.replace(lengths=jnp.asarray(lengths, jnp.int32))

    def shared(self, state):
        """The cross-attention keys and values every beam of one sentence shares."""
        return state.cross_kv

    def reorder(self, state, rows, shared):
        """Rows `rows` with cross-attention keys and values `shared` (`SharedRows`)."""
        if not state.cross_kv:
            return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), state)
        moved = state.replace(cross_kv=())
        moved = jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), moved)
        return moved.replace(cross_kv=shared)

    def unrolled_logits(self, params, context, tokens, features, depth: int):
        """Logits `[depth, B, L, V]` teacher-forced along `tokens [B, L]` (BOS first), with the
        target's `features [B, L, F]` after reading each token: at depth d, position j is the
        d-th draft of a round that began at j - d + 1 (`FeatureDraft.__call__`). Positions
        j < d - 1 have no such round. What `acceptance.rank_acceptance` measures per depth."""
        encoded, mask = context if self.module.config.cross_attention else (None, None)
        return self.module.apply({"params": params}, encoded, mask, tokens, features,
                                 depth=depth)
