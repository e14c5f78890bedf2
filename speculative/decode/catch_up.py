"""How a draft catches up with the committed text at a round's start: the cache a drafter
allocates, the catch-up chunk read at the narrowest compiled width, and the part the drafters
of a draft that reads the target share (`FeatureReread`, used by `drafters.TargetAwareDrafter`
and `drafters.BlockDrafter` by composition).

The target-aware rule: the draft's own entries for last round's accepted drafts were made from
its own hidden states; it rewinds to T - `reread` (the n drafts accepted) and re-reads
S[T - reread .. T] with the target's features of the positions before them (`tokens`,
`features`), replacing them; the logits at index `reread` are q_1.

Shape legend: B batch, G gamma, V vocab, F feature width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from speculative.decode import contract, rounds

Array = jax.Array


def chunk_widths(width: int) -> Tuple[int, ...]:
    """The catch-up chunk widths compiled for a chunk of `width` slots: the powers of two below
    it, and `width` (e.g. 8 -> (1, 2, 4, 8); 6 -> (1, 2, 4, 6))."""
    return tuple(w for w in (1 << i for i in range(max(width - 1, 0).bit_length()))
                 if w < width) + (width,)


def read_chunk(read, tokens: Array, features: Optional[Array], num_real: Array):
    """`read(tokens[:, :w], features[:, :w])` at the narrowest w of `chunk_widths` that holds
    every row's `num_real [B]` real tokens (a `lax.switch`; each branch's result must have one
    shape). What `read` returns for a row's real tokens cannot depend on the junk after them
    (a causal read with the junk masked), so every branch gives the same laws."""
    widths = chunk_widths(tokens.shape[1])
    index = jnp.searchsorted(jnp.asarray(widths, jnp.int32), jnp.max(num_real))

    def branch(w):
        return lambda: read(tokens[:, :w], None if features is None else features[:, :w])

    return jax.lax.switch(jnp.minimum(index, len(widths) - 1), [branch(w) for w in widths])


def cache_length(model, inputs: Array, max_decode_len: int, width: int) -> int:
    """Cache slots a model needs: its prefix, the output, and one round's `width` + 2."""
    return model.prefix_length(inputs.shape[1]) + max_decode_len + width + 2


@struct.dataclass
class FeatureState:
    """The state of a drafter whose draft reads the target (`FeatureReread`).

    Attributes:
      model: the draft's decode state.
      reread: `[B]` committed tokens before S[-1] whose draft entries are re-read with the
        target's features next round (last round's n accepted drafts).
      tokens: `[B, G + 1]` S[T - reread .. T], zero-padded: the catch-up chunk.
      features: `[B, G + 1, F]` the target's features of the positions before those tokens
        (last round's verification), or None for a draft that reads no hidden states.
      budget: `[B]` as `ChainState.budget` (a block drafter's stays at G).
    """

    model: Any
    reread: Array
    tokens: Array
    features: Optional[Array]
    budget: Array


@dataclasses.dataclass(frozen=True)
class FeatureReread:
    """The part two drafters share (by composition, not inheritance): a draft that reads the
    target starts from the target's context and, each round, rewinds over last round's accepted
    drafts and re-reads them and the committed token with the target's features (module
    docstring). `TargetAwareDrafter` then drafts a chain from that call; `BlockDrafter` takes
    the whole block from it. Made on the fly from the drafter's `model` and `gamma` (it holds
    no state of its own)."""

    model: Any
    gamma: int

    @property
    def layers(self) -> Tuple[int, ...]:
        return tuple(self.model.feature_layers)

    def view(self, target) -> rounds.TargetView:
        return rounds.FeatureView(target, self.layers)

    def check(self, target) -> None:
        contract.check_target_aware(target, self.model)

    def start(self, view, inputs, max_decode_len, target_width, draft_width: int,
              budget: int):
        """The target's state and a `FeatureState`; the draft's cache has room for
        `draft_width` + 2 slots a round."""
        target = view.model
        tstate = view.start(inputs, cache_length(target, inputs, max_decode_len, target_width))
        dstate = self.model.init(self.model.params, inputs,
                                 cache_length(self.model, inputs, max_decode_len, draft_width),
                                 context=target.context(tstate))
        batch, width = tstate.pending.shape[0], self.gamma + 1
        features = None
        if self.layers:  # the first round reads the pending token with the feature before it
            first = target.pending_features(tstate, self.layers)
            features = jnp.zeros((batch, width, self.model.feature_dim),
                                 jnp.float32).at[:, 0].set(first)
        return tstate, FeatureState(
            model=dstate, reread=jnp.zeros((batch,), jnp.int32),
            tokens=jnp.zeros((batch, width), jnp.int32).at[:, 0].set(tstate.pending),
            features=features, budget=jnp.full((batch,), budget, jnp.int32))

    def widths(self) -> Tuple[int, ...]:
        """The chunk re-reads the last round's accepted drafts and the committed token at the
        narrowest of these widths holding them (`read_chunk`)."""
        return chunk_widths(self.gamma + 1)

    def read(self, state: FeatureState, start: Array, call):
        """`call(draft state rewound to T - reread, tokens [B, w], features [B, w, F])` at the
        narrowest compiled width w holding every row's chunk (`read_chunk`)."""
        dstate = self.model.rewind(state.model, start - state.reread)
        return read_chunk(lambda tokens, features: call(dstate, tokens, features),
                          state.tokens, state.features, state.reread + 1)

    def advance(self, state: FeatureState, outcome, moving) -> FeatureState:
        """Next round re-reads x_1..x_n, t with the features the verification just gave."""
        features = state.features
        if features is not None:  # static: a draft that reads hidden states
            features = jnp.where(moving[:, None, None], outcome.features, features)
        return state.replace(
            reread=jnp.where(moving, outcome.accepted, state.reread),
            tokens=jnp.where(moving[:, None], outcome.emitted(), state.tokens),
            features=features)
