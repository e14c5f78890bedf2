"""One speculative round's parts: the named keys, what a drafter proposes, how the target scores
a proposal in one forward, and what verification decided.

A round of `speculative_decode` (decode/loops.py) is

    proposal = drafter.propose(...)                      # draft: G tokens and their laws q
    scored = layout.score(view, target_state, last, proposal)   # verify: one target forward
    outcome = layout.accept(verifier, scored, proposal, key, active)   # accept: n, next token
    target_state = layout.keep(view, target_state, start, outcome)    # the kept path's cache

where the *layout* is the proposal's shape: a chain of G drafts (`ChainLayout`) or a token tree
(`TreeLayout`, decode/trees.py). A drafter names its layout; the loop never asks which it is.

A *target view* is what the round needs from the target, fixed once per call: `TargetView`
scores with `extend` (or `extend_tree`), `FeatureView` also returns the target's hidden states
after the layers a target-aware draft reads (`extend_with_features`). The capability each needs
is checked before anything is traced (`contract.require`).

Shape legend: B batch, G gamma (a tree's depth), W drafted tokens the target verifies (G, or a
tree's nodes below the root), V vocab, F feature width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from speculative.decode import contract, trees, verifiers
from speculative.decode import kernel as sampling_lib

Array = jax.Array


@struct.dataclass
class RoundKeys:
    """One round's keys, split from the loop's key: never reused across rounds or roles."""

    next: Array  # the loop's key for the next round
    draft: Array  # [G] one per drafted depth (the tokens x_i ~ q_i)
    accept: Array  # the accept test and the correction / bonus draw

    @classmethod
    def split(cls, rng: Array, gamma: int) -> "RoundKeys":
        rng, draft, accept = jax.random.split(rng, 3)
        return cls(next=rng, draft=jax.random.split(draft, gamma), accept=accept)


@struct.dataclass
class Proposal:
    """What a drafter proposes in one round.

    Attributes:
      tokens: `[B, W]` drafted tokens: x_1..x_G of a chain, or a tree's nodes level by level.
      q: the laws they were drawn from: `[B, G, V]` for a chain, `[B, internal nodes, V]` for a
        tree; the size-1 summary `[..., 1]` at temperature 0 (argmax drafts).
      valid: `[B, W]` bool, drafted from a finite distribution (and, in a chain, within the
        row's drafts this round).
      num_drafted: `[B]` drafts proposed this round (a chain may stop early; a tree: its depth).
      draft_calls: `[B]` draft forwards this round (the stats' draft calls).
      drafts_read: `[]` or `[B]` drafted tokens the draft's cache already holds after proposing
        (a chain's x_1..x_read), which its catch-up rule needs.
    """

    tokens: Array
    q: Array
    valid: Array
    num_drafted: Array
    draft_calls: Array
    drafts_read: Array


@struct.dataclass
class Scored:
    """The target's one forward over `[S[-1], proposal.tokens]`."""

    logits: Array  # [B, W + 1, V]
    features: Optional[Array]  # [B, W + 1, F] for a target-aware draft, else None


@struct.dataclass
class Outcome:
    """What verification decided, per row.

    Attributes:
      accepted: `[B]` n, drafts kept (each tested at a finite position).
      drafts: `[B, G]` the kept path's tokens x_1..x_n (0 past n).
      next_token: `[B]` t, the correction or bonus token emitted after them.
      beta: `[B, G]` sum_x min(p, q) at each depth (0/1 at temperature 0, and for trees).
      broken: `[B]` active rows whose next token would come from NaN/inf: they keep x_1..x_n,
        emit no t, and stop.
      features: `[B, G + 1, F]` the target's features at the kept positions S[T..T+n] (the
        position before each emitted token), or None.
      leaf: `[B]` a tree's kept path (the first leaf below its last kept node); 0 for a chain.
    """

    accepted: Array
    drafts: Array
    next_token: Array
    beta: Array
    broken: Array
    features: Optional[Array]
    leaf: Array

    def emitted(self) -> Array:
        """`[B, G + 1]` x_1..x_n, t, then zeros: the tokens this round appends."""
        n = self.accepted[:, None]
        idx = jnp.arange(self.drafts.shape[1] + 1)[None]
        padded = jnp.concatenate([self.drafts, jnp.zeros_like(self.drafts[:, :1])], axis=1)
        return jnp.where(idx < n, padded, jnp.where(idx == n, self.next_token[:, None], 0))


# ----------------------------------------------------------------------------------------------
# Target views: the target calls a round makes, chosen once per decode call.


@dataclasses.dataclass(frozen=True)
class TargetView:
    """A target scored with its plain calls (`extend`, `extend_tree`)."""

    model: Any

    def start(self, inputs: Array, max_len: int):
        return self.model.init(self.model.params, inputs, max_len)

    def score(self, state, tokens: Array) -> Tuple[Scored, Any]:
        logits, state = self.model.extend(self.model.params, state, tokens)
        return Scored(logits=logits, features=None), state

    def score_tree(self, state, tokens: Array, attention) -> Tuple[Scored, Any]:
        logits, features, state = self.model.extend_tree(self.model.params, state, tokens,
                                                         attention, ())
        return Scored(logits=logits, features=features), state

    def keep_path(self, state, starts: Array, offsets: Array):
        return self.model.keep_path(state, starts, offsets)

    def rewind(self, state, lengths: Array):
        return self.model.rewind(state, lengths)


@dataclasses.dataclass(frozen=True)
class FeatureView(TargetView):
    """A target that also returns its hidden states after `layers` (a target-aware draft's
    input) with every scored position."""

    layers: Tuple[int, ...] = ()

    def start(self, inputs: Array, max_len: int):
        return self.model.init_for_draft(self.model.params, inputs, max_len, self.layers)

    def score(self, state, tokens: Array) -> Tuple[Scored, Any]:
        logits, features, state = self.model.extend_with_features(
            self.model.params, state, tokens, self.layers)
        return Scored(logits=logits, features=features), state

    def score_tree(self, state, tokens: Array, attention) -> Tuple[Scored, Any]:
        logits, features, state = self.model.extend_tree(self.model.params, state, tokens,
                                                         attention, self.layers)
        return Scored(logits=logits, features=features), state


# ----------------------------------------------------------------------------------------------
# Layouts: how a proposal is laid out for the target and how its verdict is read.


@dataclasses.dataclass(frozen=True)
class ChainLayout:
    """G drafts in a row: the target scores `[S[-1], x_1, .., x_G]`; the verifier's
    `verify` (Algorithm 1 steps 3-5) keeps the leading accepted drafts."""

    gamma: int

    @property
    def width(self) -> int:
        """Drafted tokens the target scores per round."""
        return self.gamma

    def require(self, target) -> None:
        del target  # every DecodeModel scores a chain

    def check_verifier(self, verifier) -> None:
        """Any acceptance rule applies to a chain: it needs `ChainVerifier`'s methods."""
        del verifier  # speculative_decode checked them (verifiers.check_policy)

    def score(self, view: TargetView, state, last: Array, proposal: Proposal):
        return view.score(state, jnp.concatenate([last[:, None], proposal.tokens], axis=1))

    def accept(self, verifier, scored: Scored, proposal: Proposal, key: Array,
               active: Array) -> Outcome:
        verdict = verifier.verify(scored.logits, proposal.q, proposal.tokens,
                                  proposal.num_drafted, key)
        # Accepted drafts passed finite positions; the emitted token needs position n finite.
        broken = verdict.broken(active)
        n = verdict.num_accepted
        drafts = jnp.where(jnp.arange(self.gamma)[None] < n[:, None], proposal.tokens, 0)
        return Outcome(accepted=n, drafts=drafts, next_token=verdict.next_token,
                       beta=verdict.beta, broken=broken, features=scored.features,
                       leaf=jnp.zeros_like(n))

    def keep(self, view: TargetView, state, start: Array, outcome: Outcome):
        del view, start, outcome  # the kept drafts already sit in contiguous slots
        return state


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """A token tree (decode/trees.py): the target scores every node in one forward, each
    attending to the prefix and its ancestors; the verifier walks down it (`verify_tree`) and
    the kept path is moved into contiguous cache slots."""

    tree: trees.Tree

    @property
    def gamma(self) -> int:
        return self.tree.depth

    @property
    def width(self) -> int:
        return self.tree.num_nodes - 1

    def require(self, target) -> None:
        contract.require(target, contract.TreeTarget, f"tree={self.tree.branching}")

    def check_verifier(self, verifier) -> None:
        """A tree needs `TreeVerifier`'s methods and an exact rule (the verifier's lenience 1)."""
        verifiers.check_policy(verifier, protocol=verifiers.TreeVerifier)
        if verifier.lenience != 1.0:
            raise ValueError(f"tree={self.tree.branching} verifies exactly with a fixed shape: "
                             f"it needs lenience=1 (got {verifier.lenience}).")

    def score(self, view: TargetView, state, last: Array, proposal: Proposal):
        tokens = jnp.concatenate([last[:, None], proposal.tokens], axis=1)
        return view.score_tree(state, tokens, self.tree.attention())

    def accept(self, verifier, scored: Scored, proposal: Proposal, key: Array,
               active: Array) -> Outcome:
        tree = self.tree
        walk = verifier.verify_tree(tree, scored.logits, proposal.q, proposal.tokens,
                                    proposal.valid, key)
        ok = jnp.take_along_axis(sampling_lib.finite_rows(scored.logits), walk.stop[:, None], 1)
        broken = active & ~ok[:, 0]
        n = walk.accepted
        depth = jnp.arange(tree.depth)[None]
        drafts = jnp.where(depth < n[:, None], jnp.take_along_axis(
            proposal.tokens, jnp.maximum(walk.path - 1, 0), 1), 0)
        features = scored.features
        if features is not None:  # static: the view decides
            features = jnp.take_along_axis(features, _offsets(walk.path)[..., None], 1)
        return Outcome(accepted=n, drafts=drafts, next_token=walk.token,
                       beta=(depth < n[:, None]).astype(jnp.float32), broken=broken,
                       features=features, leaf=walk.leaf)

    def keep(self, view: TargetView, state, start: Array, outcome: Outcome):
        node_ids = self._path_nodes(outcome)
        return view.keep_path(state, start, _offsets(node_ids))

    def _path_nodes(self, outcome: Outcome) -> Array:
        """`[B, d]` node ids of the kept path (0 past n), from the kept leaf."""
        tree = self.tree
        ids = []
        for level in range(1, tree.depth + 1):
            index = outcome.leaf // tree.leaves_under(level)
            ids.append(tree.offsets[level] + index)
        ids = jnp.stack(ids, axis=1)
        return jnp.where(jnp.arange(tree.depth)[None] < outcome.accepted[:, None], ids, 0)


def _offsets(path: Array) -> Array:
    """`[B, d + 1]` the root, then the kept path's nodes (0 past n: the root's slot)."""
    return jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)

