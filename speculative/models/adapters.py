"""T5 modules as `DecodeModel`s (speculative/decode/contract.py): the adapters the decode loops
drive. The factory that makes them from a config and a checkpoint is
`checkpoints.factory.load_model`.

    target = EncoderDecoderModel(t5.Transformer(config), params)    # inputs: encoder tokens
    lm = DecoderOnlyModel(t5.DecoderOnly(config), params)           # inputs: prompts

Each is a pytree (the module is static, the params are traced), so the jitted loops take it as an
argument. With a mesh (`partitioning.place_model`) its decode states are pinned to batch over
'data' and heads over 'model' wherever they are made or extended. `speculative.decoding`
re-exports both names.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode.contract import DecodeModel, take_rows
from speculative.models import partitioning, t5


@struct.dataclass
class _T5Model:
    """Adapter from a T5 flax module + params to the `DecodeModel` contract."""

    module: nn.Module = struct.field(pytree_node=False)
    params: Any
    max_length: Optional[int] = struct.field(pytree_node=False, default=None)
    mesh: Optional[Any] = struct.field(pytree_node=False, default=None)

    @property
    def vocab_size(self) -> int:
        return self.module.config.vocab_size

    def _pin(self, state):
        return state if self.mesh is None else partitioning.constrain_state(state, self.mesh)

    def init(self, params, inputs, max_len, keep_encoded=False):
        kwargs = {"keep_encoded": True} if keep_encoded else {}
        return self._pin(self.module.apply({"params": params}, inputs, max_len,
                                           method="init_cache", **kwargs))

    def extend(self, params, state, tokens):
        logits, state = self.module.apply({"params": params}, state, tokens, method="extend")
        return logits, self._pin(state)

    def extend_with_features(self, params, state, tokens, feature_layers):
        """`extend` that also returns the decoder's hidden states after `feature_layers`
        (`[B, K, F]`, what a target-aware draft reads)."""
        logits, features, state = self.module.apply(
            {"params": params}, state, tokens, tuple(feature_layers),
            method="extend_with_features")
        return logits, features, self._pin(state)

    def feature_dim(self, feature_layers: Sequence[int]) -> int:
        """Width of `extend_with_features`' output for `feature_layers` (ValueError for a layer
        this decoder does not have)."""
        config = self.module.config
        bad = [i for i in feature_layers if not 1 <= i <= config.num_decoder_layers]
        if bad:
            raise ValueError(f"Feature layers {tuple(feature_layers)} include {bad}: this target "
                             f"has decoder layers 1..{config.num_decoder_layers}.")
        return len(feature_layers) * config.emb_dim

    def rewind(self, state, lengths):
        return t5.rewind(state, lengths)

    def shared(self, state):
        """The state's parts every beam of one input shares: the cross-attention keys and
        values (`()` for a decoder-only model)."""
        return state.cross_kv

    def reorder(self, state, rows, shared):
        """Rows `rows` of `state` with cross-attention keys and values `shared` (`SharedRows`)."""
        if not state.cross_kv:
            return self._pin(take_rows(state, rows))
        return self._pin(take_rows(state.replace(cross_kv=()), rows).replace(cross_kv=shared))

    def release_context(self, state):
        """`state` without what only a target-aware draft's start reads (the encoder output,
        the prompt's features): the beams do not carry it."""
        return state.replace(encoded=None, prefix_features=None)

    def extend_tree(self, params, state, tokens, tree, feature_layers=()):
        """Verifies a token tree in one forward: `tokens [B, K]` are its nodes and
        `tree = (depths [K], visible [K, K])` (`trees.Tree.attention`); returns `(logits
        [B, K, V], features [B, K, F] or None, state)` with the nodes in slots
        `lengths .. lengths + K - 1`."""
        logits, features, state = self.module.apply(
            {"params": params}, state, tokens, tree, tuple(feature_layers),
            method="extend_tree")
        return logits, features, self._pin(state)

    def keep_path(self, state, starts, offsets):
        """The entries at `starts + offsets[:, j]` moved to `starts + j` (`t5.keep_path`)."""
        return self._pin(t5.keep_path(state, starts, offsets))

    def cache_bytes(self, batch: int, length: int) -> int:
        """Bytes of the decoder's self-attention KV cache for `batch` rows of `length`."""
        config = self.module.config
        itemsize = np.dtype(jnp.dtype(config.dtype)).itemsize
        return (2 * config.num_decoder_layers * batch * length * config.num_heads
                * config.head_dim * itemsize)


@struct.dataclass
class EncoderDecoderModel(_T5Model):
    """A `t5.Transformer` as a DecodeModel: `inputs` are encoder tokens (0 = padding)."""

    def __post_init__(self):
        if not isinstance(self.module, t5.Transformer):
            raise TypeError(
                f"EncoderDecoderModel needs a t5.Transformer, got {type(self.module).__name__}; "
                "use DecoderOnlyModel for a t5.DecoderOnly.")

    def prefix_length(self, input_length: int) -> int:
        return 0  # the decoder cache starts empty; BOS is pending.

    def init_for_draft(self, params, inputs, max_len, feature_layers=()):
        """`init` keeping what a target-aware draft starts from (the encoder output)."""
        return self.init(params, inputs, max_len, keep_encoded=True)

    def context(self, state):
        """`(encoded [B, L_enc, E], mask [B, L_enc])`: what a target-aware draft cross-attends
        to (the state must come from `init(..., keep_encoded=True)`)."""
        if state.encoded is None:
            raise ValueError("This target state was made without keep_encoded=True.")
        return state.encoded, state.encoder_mask

    def pending_features(self, state, feature_layers):
        """`[B, F]` the features of the position before the pending token: zero, as BOS comes
        first (and as the draft was trained)."""
        return jnp.zeros((state.lengths.shape[0], self.feature_dim(feature_layers)), jnp.float32)


@struct.dataclass
class DecoderOnlyModel(_T5Model):
    """A `t5.DecoderOnly` as a DecodeModel: `inputs` are prompts right-padded with 0."""

    def __post_init__(self):
        if not isinstance(self.module, t5.DecoderOnly):
            raise TypeError(
                f"DecoderOnlyModel needs a t5.DecoderOnly, got {type(self.module).__name__}; "
                "use EncoderDecoderModel for a t5.Transformer.")

    def prefix_length(self, input_length: int) -> int:
        return input_length + 1  # BOS + prompt

    def init_for_draft(self, params, inputs, max_len, feature_layers=()):
        """`init` keeping what a target-aware draft starts from: the prefill's features after
        `feature_layers` at every position of `[BOS] + prompt`."""
        return self._pin(self.module.apply({"params": params}, inputs, max_len,
                                           tuple(feature_layers), method="init_cache"))

    def context(self, state):
        """`prefix_features [B, P + 1, F]` (None without feature layers): the target's features
        after reading each of `[BOS] + prompt`, which a target-aware draft reads the prompt with
        (the state must come from `init_for_draft`)."""
        return state.prefix_features

    def pending_features(self, state, feature_layers):
        """`[B, F]` the features of the position before the pending token (the prompt's last
        cached one; zero for an empty prompt), from `init_for_draft(..., feature_layers)`."""
        feats = state.prefix_features
        if feats is None:
            raise ValueError("This target state holds no prompt features: make it with "
                             f"init_for_draft(..., feature_layers={tuple(feature_layers)}).")
        before = jnp.maximum(state.lengths - 1, 0)
        picked = jnp.take_along_axis(feats, before[:, None, None], axis=1)[:, 0]
        return jnp.where((state.lengths > 0)[:, None], picked, 0.0)


def make_module(config: t5.T5Config, *, decoder_only: bool = False):
    """The flax module of `config`: `t5.DecoderOnly`, or the encoder-decoder `t5.Transformer`."""
    return t5.DecoderOnly(config) if decoder_only else t5.Transformer(config)


def as_decode_model(module, params, **kwargs) -> DecodeModel:
    """A T5 `module` with `params` as a `DecodeModel` (the adapter for its kind; `kwargs` go to
    it, e.g. `mesh`)."""
    if isinstance(module, t5.DecoderOnly):
        return DecoderOnlyModel(module, params, **kwargs)
    return EncoderDecoderModel(module, params, **kwargs)

