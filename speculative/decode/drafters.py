"""Drafters: who proposes the G tokens of a round, and how a draft catches up with the text.

A drafter is a pytree (its draft model's parameters are traced; its settings are static) with

    model                           the draft model (None for a drafter without one)
    gamma                           the most drafts per round (a tree's depth)
    layout                          ChainLayout(G) or TreeLayout(tree)    (decode/rounds.py)
    view(target) -> TargetView      the target calls its rounds need
    check(target) -> None           refuses, by name, a target that lacks a capability
    start(view, inputs, max_decode_len, target_width) -> (target state, drafter state)
    propose(state, last, start, keys [G], verifier) -> (Proposal, state)
    advance(state, outcome, proposal, last, moving [B]) -> state

and owns its state: a struct with named fields, made by `start` and carried by the loop. The
loop (decode/loops.py) never asks which kind of drafter it drives, and nothing outside the
drafters asks a draft model what it is: the built-in drafters answer for it (`Capabilities`:
`reads_target`, `proposes_block`, `copies_input`, `tree`, `unrolls`; `candidates` for
calibration; `with_tree`). The protocol and `Capabilities` live in decode/capabilities.py,
`TreeDrafter` in decode/tree_drafter.py.

    ChainDrafter(model, gamma)          any DecodeModel (T5, n-gram, prompt lookup): G drafts,
                                        one draft call each; dynamic gamma (`confidence`) and
                                        the +2/-1 schedule (`schedule='heuristic'`).
    TargetAwareDrafter(model, gamma)    a draft that reads the target (models/feature_draft.py):
                                        it starts from the target's context and re-reads each
                                        round's committed tokens with the target's features.
    TreeDrafter(base, tree)             a token tree whose nodes' laws come from any chain
                                        drafter's model (`base`): one draft call per level.
    BlockDrafter(model, gamma)          a block draft (models/block_draft.py): all G laws from
                                        one draft call per round; `tree=` fills a token tree
                                        from the same call. Its own class: it shares the
                                        target-aware catch-up with TargetAwareDrafter through a
                                        `FeatureReread` part, and has no chain settings.

The catch-up rule (invariants at the start of a round: the target's cache holds S[:-1], length
T, and `last` = S[-1]):

  ChainDrafter: the draft's cache holds S[:-1] (`behind` = 0) or S[:-2] (`behind` = 1: the last
    round accepted every draft and the draft never read x_G). The round's first call rewinds it
    to T - behind and feeds [S[-2], S[-1]] (behind) or [S[-1], a junk copy]; the logits at index
    `behind` are q_1 and the cache then holds S.
  TargetAwareDrafter, BlockDrafter (`FeatureReread`): the draft's own entries for last round's
    accepted drafts were made from its own hidden states; it rewinds to T - `reread` (the n
    drafts accepted) and re-reads S[T - reread .. T] with the target's features of the
    positions before them (`tokens`, `features`), replacing them; the logits at index `reread`
    are q_1. The chunk is padded to G + 1 slots, but the call reads only the narrowest of a few
    compiled widths that holds every row's real tokens (`catch_up.read_chunk`): the padding is
    masked junk, so the laws are the same, and a round that accepted few drafts pays for few
    rows.

Shape legend: B batch, G gamma, V vocab, F feature width.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from speculative.decode import beam_paths, contract, rounds, trees, validation
from speculative.decode import kernel as sampling_lib
from speculative.decode.capabilities import Capabilities, Drafter, gammas_within
from speculative.decode.catch_up import FeatureReread, cache_length
from speculative.decode.contract import take_rows
from speculative.decode.tree_drafter import TreeDrafter

Array = jax.Array

SCHEDULES = ("constant", "heuristic")


# ----------------------------------------------------------------------------------------------
# A chain of drafts from any DecodeModel.


@struct.dataclass
class ChainState:
    """A chain drafter's state.

    Attributes:
      model: the draft's decode state (its cache holds S[:-1] or S[:-2], see `behind`).
      prev: `[B]` S[-2] (fed first when `behind`).
      behind: `[B]` int32, 1 when the draft never read the last accepted draft x_G.
      budget: `[B]` drafts each row may propose this round (the schedule; gamma if constant).
    """

    model: Any
    prev: Array
    behind: Array
    budget: Array


@struct.dataclass
class ChainDrafter(Capabilities):
    """G drafts per round from any `DecodeModel`, one draft call each (module docstring).

    `confidence > 0`: a row stops drafting before x_i (i >= 2) when the draft's top
    probability for it is below `confidence` (dynamic gamma, as transformers'
    `assistant_confidence_threshold`). `schedule='heuristic'` adapts each row's drafts per
    round as transformers does for assistant models: start at `initial_gamma` (default gamma),
    +2 after a round whose drafts were all accepted, -1 otherwise, within [1, gamma]. Both rules
    look only at the draft and at past rounds, so the output stays exact."""

    model: Any
    gamma: int = struct.field(pytree_node=False)
    confidence: float = struct.field(pytree_node=False, default=0.0)
    schedule: str = struct.field(pytree_node=False, default="constant")
    initial_gamma: Optional[int] = struct.field(pytree_node=False, default=None)

    @property
    def layout(self):
        return rounds.ChainLayout(self.gamma)

    def view(self, target) -> rounds.TargetView:
        return rounds.TargetView(target)

    def check(self, target) -> None:
        """Refuses bad settings or a target that lacks what this drafter needs, by name."""
        validation.schedule(self.confidence, self.schedule, self.initial_gamma, self.gamma)
        self.layout.require(target)

    def start(self, view, inputs, max_decode_len, target_width):
        """The target's state (room for `target_width` scored drafts a round) and the
        drafter's."""
        tstate = view.start(inputs, cache_length(view.model, inputs, max_decode_len,
                                                 target_width))
        dstate = self.model.init(self.model.params, inputs,
                                 cache_length(self.model, inputs, max_decode_len, self.gamma))
        return tstate, self._memory(dstate, tstate.pending)

    def _memory(self, dstate, pending):
        batch = pending.shape[0]
        budget = self.gamma if self.initial_gamma is None else self.initial_gamma
        return ChainState(model=dstate, prev=pending, behind=jnp.zeros((batch,), jnp.int32),
                          budget=jnp.full((batch,), budget, jnp.int32))

    def catch_up(self, state, last: Array, start: Array) -> Tuple[Array, Any]:
        """The round's first draft call: `(q_1's logits [B, V], draft state holding S)`."""
        behind = state.behind
        dstate = self.model.rewind(state.model, start - behind)
        first = jnp.stack([jnp.where(behind > 0, state.prev, last), last], axis=1)
        logits, dstate = self.model.extend(self.model.params, dstate, first)
        dstate = self.model.rewind(dstate, start + 1)  # holds S; the junk slot is masked
        return jnp.take_along_axis(logits, behind[:, None, None], axis=1)[:, 0], dstate

    def catch_up_widths(self) -> Tuple[int, ...]:
        """The widths the catch-up call is compiled at (its cost per round follows the last
        round's accepted drafts where there are several; `measure.round_costs` times each):
        one here, the pending token with the one before it."""
        return (1,)

    def step(self, dstate, tokens: Array) -> Tuple[Array, Any]:
        """One single-token draft call: `(logits [B, V], state)`."""
        logits, dstate = self.model.extend(self.model.params, dstate, tokens[:, None])
        return logits[:, 0], dstate

    def propose(self, state, last, start, keys, verifier):
        """Up to G drafts per row; a row's drafts end before the first draft distribution
        holding NaN/inf (a token drawn from non-finite numbers is never offered), at its budget,
        or below `confidence`. The loop of single-token calls exits once every row has stopped,
        so stopped rows save draft calls. Drafts past `num_drafted` are junk the kernel ignores;
        the draft's cache holds S + x_1..x_read."""
        logits, dstate = self.catch_up(state, last, start)
        x1, q1 = verifier.propose(logits, keys[0])
        batch, gamma = x1.shape[0], self.gamma
        x = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)
        q = jnp.zeros((batch, gamma) + q1.shape[1:], q1.dtype).at[:, 0].set(q1)
        going = sampling_lib.finite_rows(logits)
        num = going.astype(jnp.int32)

        def cond(carry):
            i, _, _, _, _, going = carry
            return (i < gamma) & jnp.any(going)

        def body(carry):
            i, dstate, x, q, num, going = carry
            logits, dstate = self.step(dstate, jax.lax.dynamic_index_in_dim(x, i - 1, 1, False))
            xi, qi = verifier.propose(logits, keys[i])
            if self.confidence > 0.0:  # static: no cost without dynamic gamma
                going = going & (verifier.top_probability(logits, qi) >= self.confidence)
            going = going & sampling_lib.finite_rows(logits) & (i < state.budget)
            x = jax.lax.dynamic_update_slice_in_dim(x, xi[:, None], i, axis=1)
            q = jax.lax.dynamic_update_slice_in_dim(q, qi[:, None], i, axis=1)
            return i + 1, dstate, x, q, num + going.astype(jnp.int32), going

        calls, dstate, x, q, num, _ = jax.lax.while_loop(
            cond, body, (jnp.ones((), jnp.int32), dstate, x, q, num, going))
        proposal = rounds.Proposal(
            tokens=x, q=q, valid=jnp.arange(gamma)[None] < num[:, None], num_drafted=num,
            draft_calls=jnp.broadcast_to(calls, (batch,)), drafts_read=calls - 1)
        return proposal, state.replace(model=dstate)

    def advance(self, state, outcome, proposal, last, moving):
        """After the round: the draft is behind when it never read the last accepted draft."""
        n = outcome.accepted
        prev = jnp.where(n > 0, jnp.take_along_axis(
            outcome.drafts, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0], last)
        return state.replace(
            prev=jnp.where(moving, prev, state.prev),
            behind=jnp.where(moving, (n > proposal.drafts_read).astype(jnp.int32), state.behind),
            budget=self._next_budget(state.budget, n, proposal.num_drafted))

    def _next_budget(self, budget, accepted, drafted):
        if self.schedule == "constant":
            return budget
        all_accepted = (accepted >= drafted) & (drafted > 0)
        return jnp.clip(jnp.where(all_accepted, budget + 2, budget - 1), 1, self.gamma)

    # Speculative beam search (beam/search.py): the `beam_paths.BeamProposer` methods.

    def beam_check(self, target) -> None:
        """Refuses, by name, settings that speculative beam search cannot honour."""
        del target  # any DecodeModel's paths can be scored
        if self.confidence or self.schedule != "constant":
            raise ValueError(
                f"{type(self).__name__}(confidence={self.confidence}, schedule="
                f"{self.schedule!r}): speculative beam search proposes whole paths of gamma "
                "tokens per beam; it takes confidence=0 and schedule='constant'.")

    def beam_calls(self, draft_beam: int) -> int:
        """Draft calls per round: the greedy paths' G + 1 (the last reads x_G), and the G of
        the draft's own beam search when `draft_beam` > 0."""
        return self.gamma + 1 + (self.gamma if draft_beam else 0)

    def beam_start(self, view, inputs, max_len, beams):
        """`(target state, BeamDraftState)` of `B * beams` rows (each input's beams in a block),
        both caches `max_len` slots."""
        per_beam = jnp.repeat(jnp.arange(inputs.shape[0]), beams)
        tstate = take_rows(view.start(inputs, max_len), per_beam)
        dstate = self.model.init(self.model.params, inputs, max_len)
        return tstate, beam_paths.BeamDraftState(model=take_rows(dstate, per_beam), feature=None)

    def beam_first(self, state, last: Array) -> Tuple[Array, Any]:
        """Reads every beam's `last [R]` token: `(logits [R, V] of its next token, state)`."""
        return self.step(state.model, last)

    def beam_propose(self, state, last, scores, draft_beam, branch) -> beam_paths.BeamProposal:
        return beam_paths.propose(self, state, last, scores, draft_beam, branch)

    def beam_keep(self, state, proposal, rows, lengths, replayed, scored):
        """The kept beams' rows `rows [B * w]` of the proposal's draft state, rewound to
        `lengths [B * w]` (the beam's prefix, its replayed tokens included)."""
        del replayed, scored  # the draft's own entries for the path stand
        dstate = contract.reorder_rows(self.model, proposal.model, rows,
                                       contract.shared_parts(self.model, state.model))
        return state.replace(model=self.model.rewind(dstate, lengths))

    def own_model(self, needed_for: str):
        """The draft model, for a caller that drives it without the target (`needed_for`: the
        host-driven reference search); a drafter whose draft reads the target refuses."""
        del needed_for
        return self.model

    def candidates(self, gammas, max_decode_len: int):
        """One family: this chain at each of `gammas` (at most `max_decode_len`)."""
        family = tuple(self.replace(gamma=g, initial_gamma=None if self.initial_gamma is None
                                    else min(self.initial_gamma, g))
                       for g in gammas_within(gammas, max_decode_len))
        return (family,) if family else ()

    def with_tree(self, tree):
        """The token tree `tree` drafted from this chain's model (`TreeDrafter`)."""
        tree = trees.as_tree(tuple(tree))
        return TreeDrafter(self.replace(gamma=tree.depth, initial_gamma=None), tree)


def _refuse_own_model(model, needed_for: str, then: str):
    """`own_model`'s refusal for a draft that reads the target (`then`: how the message goes on
    before naming the separate draft to use)."""
    raise TypeError(f"{needed_for} takes a draft with a model of its own; this "
                    f"{type(model).__name__} reads the target's states{then} a separate draft "
                    "(a bundle's best_t5_draft, e.g. large_draft_kdtv).")


# ----------------------------------------------------------------------------------------------
# A draft that reads the target.


@struct.dataclass
class TargetAwareDrafter(ChainDrafter):
    """A chain from a draft that reads the target's context and hidden states (EAGLE-style;
    models/feature_draft.py). The verify call returns the target's features of every scored
    position, and the next round's first call re-reads the committed tokens with them
    (`FeatureReread`); the drafts after it are the chain's single-token calls."""

    @property
    def reads_target(self) -> bool:
        return True

    @property
    def unrolls(self) -> bool:
        return not contract.missing(self.model, contract.UnrolledDraft)

    @property
    def reread(self) -> FeatureReread:
        return FeatureReread(self.model, self.gamma)

    @property
    def layers(self) -> Tuple[int, ...]:
        return self.reread.layers

    def view(self, target) -> rounds.TargetView:
        return self.reread.view(target)

    def check(self, target) -> None:
        self.reread.check(target)
        super().check(target)

    def start(self, view, inputs, max_decode_len, target_width):
        budget = self.gamma if self.initial_gamma is None else self.initial_gamma
        return self.reread.start(view, inputs, max_decode_len, target_width, self.gamma, budget)

    def catch_up_widths(self) -> Tuple[int, ...]:
        return self.reread.widths()

    def catch_up(self, state, last, start):
        del last  # the chunk ends with it

        def call(dstate, tokens, features):
            logits, out = self.model.extend(self.model.params, dstate, tokens, features)
            # holds S; the padding slots are masked
            return (jnp.take_along_axis(logits, state.reread[:, None, None], axis=1)[:, 0],
                    self.model.rewind(out, start + 1))

        return self.reread.read(state, start, call)

    def advance(self, state, outcome, proposal, last, moving):
        del last
        state = self.reread.advance(state, outcome, moving)
        return state.replace(
            budget=self._next_budget(state.budget, outcome.accepted, proposal.num_drafted))

    def beam_check(self, target) -> None:
        contract.check_target_aware(target, self.model)
        super().beam_check(target)

    def beam_calls(self, draft_beam: int) -> int:
        """The chain's calls, and one re-read of the kept path with the target's features."""
        return super().beam_calls(draft_beam) + 1

    def beam_start(self, view, inputs, max_len, beams):
        """As the chain's, the draft started from the target's context; the beams carry the
        target's features of the position before each beam's last token (BOS: zero), not the
        context."""
        target = view.model
        first = view.start(inputs, max_len)
        dstate = self.model.init(self.model.params, inputs, max_len,
                                 context=target.context(first))
        per_beam = jnp.repeat(jnp.arange(inputs.shape[0]), beams)
        feature = target.pending_features(first, self.layers)
        return (take_rows(target.release_context(first), per_beam),
                beam_paths.BeamDraftState(model=take_rows(dstate, per_beam),
                               feature=take_rows(feature, per_beam)))

    def beam_first(self, state, last):
        """Reads `last` with the target's features of the position before it."""
        logits, dstate = self.model.extend(self.model.params, state.model, last[:, None],
                                           state.feature[:, None])
        return logits[:, 0], dstate

    def beam_keep(self, state, proposal, rows, lengths, replayed, scored):
        """The draft read its path with its own states: it re-reads the kept path's tokens
        with the target's features `scored.features` (those of the position before each) from
        the position after the root's last token, keeps the `replayed [B * w]` tokens like the
        target, and carries the feature before each beam's new last token."""
        gamma = self.gamma
        dstate = contract.reorder_rows(self.model, proposal.model, rows,
                                       contract.shared_parts(self.model, state.model))
        feats = take_rows(scored.features, rows)  # [B * w, G + 1, F]
        kept = take_rows(proposal.paths.reshape(-1, gamma), rows)  # [B * w, G]
        dstate = self.model.rewind(dstate, lengths - replayed + 1)
        _, dstate = self.model.extend(self.model.params, dstate, kept, feats[:, :gamma])
        before_last = jnp.maximum(replayed - 1, 0)
        feature = jnp.take_along_axis(feats, before_last[:, None, None], axis=1)[:, 0]
        feature = jnp.where((replayed > 0)[:, None], feature, state.feature)
        return state.replace(model=self.model.rewind(dstate, lengths), feature=feature)

    def own_model(self, needed_for: str):
        _refuse_own_model(self.model, needed_for, ", which the jitted speculative_beam_search "
                          "feeds it. Use that, or")


# ----------------------------------------------------------------------------------------------
# A whole block in one draft call.


@struct.dataclass
class BlockDrafter(Capabilities):
    """G drafts from ONE draft call per round (models/block_draft.py): the call re-reads the
    committed tokens with the target's features (`FeatureReread`, shared with
    `TargetAwareDrafter`) and appends G - 1 learned placeholders; the logits at the last
    committed token are q_1 and the placeholders' are q_2..q_G, the laws of the tokens 2..G
    positions ahead given the committed text only. Each x_i ~ q_i is drawn independently, so
    q_i is exactly the law x_i was drawn from and the verifiers apply unchanged (exact at any
    temperature). It has no chain settings (dynamic gamma, a schedule): its block is one call.

    With `tree=(b_1, ..., b_d)` (d = gamma) the block fills a token tree with no extra call:
    every node at depth i - 1 gets as children b_i tokens from q_i (its top-b_i at temperature
    0, drawn without replacement at T > 0), q_i being the same law whatever the path."""

    model: Any
    gamma: int = struct.field(pytree_node=False)
    tree: Optional[trees.Tree] = struct.field(pytree_node=False, default=None)

    @property
    def reads_target(self) -> bool:
        return True

    @property
    def proposes_block(self) -> bool:
        return True

    @property
    def unrolls(self) -> bool:
        return True  # q_i is the law i positions ahead: it changes with the depth

    @property
    def kind(self) -> str:
        return "block" if self.tree is None else "tree"

    @property
    def reread(self) -> FeatureReread:
        return FeatureReread(self.model, self.gamma)

    @property
    def layout(self):
        return rounds.ChainLayout(self.gamma) if self.tree is None else rounds.TreeLayout(
            self.tree)

    def view(self, target) -> rounds.TargetView:
        return self.reread.view(target)

    def check(self, target) -> None:
        if self.gamma > self.model.max_gamma:
            raise ValueError(f"gamma={self.gamma}: this block draft has placeholders for "
                             f"gamma <= {self.model.max_gamma}.")
        if self.tree is not None and self.tree.depth != self.gamma:
            raise ValueError(f"tree={self.tree.branching} has depth {self.tree.depth}; the "
                             f"block drafter's gamma is {self.gamma}.")
        self.reread.check(target)
        self.layout.require(target)

    def own_model(self, needed_for: str):
        _refuse_own_model(self.model, needed_for, ". Use")

    def start(self, view, inputs, max_decode_len, target_width):
        # the call holds the catch-up chunk (G + 1 slots) and G - 1 placeholders at once
        return self.reread.start(view, inputs, max_decode_len, target_width, 2 * self.gamma,
                                 self.gamma)

    def catch_up_widths(self) -> Tuple[int, ...]:
        return self.reread.widths()

    def candidates(self, gammas, max_decode_len: int):
        """Two families: the chain of the same draft (`TargetAwareDrafter`, one call per
        draft) at `gammas`, and the block at them, capped at its placeholders (`max_gamma`)."""
        chain = TargetAwareDrafter(self.model, self.gamma).candidates(gammas, max_decode_len)
        kept = gammas_within(gammas, max_decode_len)
        blocks = sorted({min(g, int(self.model.max_gamma)) for g in kept})
        return chain + ((tuple(BlockDrafter(self.model, g) for g in blocks),) if blocks else ())

    def with_tree(self, tree):
        """The token tree `tree` filled from the block's per-position laws (one call)."""
        tree = trees.as_tree(tuple(tree))
        return BlockDrafter(self.model, tree.depth, tree=tree)

    def block_logits(self, state, start) -> Tuple[Array, Any]:
        """The round's one draft call: `(logits [B, G, V] of q_1..q_G, state holding S)`."""

        def call(dstate, tokens, features):
            return self.model.extend_block(self.model.params, dstate, tokens, features,
                                           self.gamma - 1, num_tokens=state.reread + 1)

        return self.reread.read(state, start, call)

    def propose(self, state, last, start, keys, verifier):
        del last  # the catch-up chunk ends with it
        logits, dstate = self.block_logits(state, start)
        batch = logits.shape[0]
        ones = jnp.ones((batch,), jnp.int32)
        if self.tree is not None:  # static
            tokens, q, valid = self._fill_tree(logits, keys, verifier)
            proposal = rounds.Proposal(
                tokens=tokens, q=q, valid=valid,
                num_drafted=jnp.full((batch,), self.gamma, jnp.int32), draft_calls=ones,
                drafts_read=jnp.zeros((), jnp.int32))
            return proposal, state.replace(model=dstate)
        drawn = [verifier.propose(logits[:, i], keys[i]) for i in range(self.gamma)]
        x = jnp.stack([d[0] for d in drawn], axis=1)
        q = jnp.stack([d[1] for d in drawn], axis=1)
        # A row's drafts end before the first non-finite draft distribution.
        num = jnp.sum(jnp.cumprod(sampling_lib.finite_rows(logits), axis=1), axis=1)
        proposal = rounds.Proposal(
            tokens=x, q=q, valid=jnp.arange(self.gamma)[None] < num[:, None], num_drafted=num,
            draft_calls=ones, drafts_read=jnp.zeros((), jnp.int32))
        return proposal, state.replace(model=dstate)

    def advance(self, state, outcome, proposal, last, moving):
        del proposal, last
        return self.reread.advance(state, outcome, moving)

    def _fill_tree(self, logits, keys, verifier):
        """Each level's children from that depth's q (`verifier.children`), for every node."""
        tree, levels, valids, qs = self.tree, [], [], []
        for level in range(tree.depth):
            nodes = tree.level_sizes[level]
            level_logits = jnp.broadcast_to(logits[:, level, None],
                                            (logits.shape[0], nodes, logits.shape[-1]))
            tokens, valid, q = verifier.children(level_logits, tree.branching[level],
                                                 keys[level])
            if valids:  # below an invalid node nothing is valid
                valid = valid & valids[-1][:, :, None]
            levels.append(tokens.reshape(tokens.shape[0], -1))
            valids.append(valid.reshape(valid.shape[0], -1))
            qs.append(q)
        return (jnp.concatenate(levels, 1), jnp.concatenate(qs, 1), jnp.concatenate(valids, 1))


# ----------------------------------------------------------------------------------------------
# Choosing a drafter from `speculative_decode`'s arguments.


def is_drafter(obj) -> bool:
    """Whether `obj` is already a drafter (has `propose` and `layout`), not a DecodeModel."""
    return not contract.missing(obj, _DrafterMethods)


class _DrafterMethods(Protocol):
    def propose(self, state, last, start, keys, verifier): ...

    def advance(self, state, outcome, proposal, last, moving): ...

    def start(self, view, inputs, max_decode_len, target_width): ...


def as_drafter(draft, gamma: int, tree: Optional[trees.Tree] = None, *,
               confidence: float = 0.0, schedule: str = "constant",
               initial_gamma: Optional[int] = None) -> Drafter:
    """The drafter for a draft model: `TargetAwareDrafter` for a draft that reads the target
    (`reads_target`), else `ChainDrafter` (with dynamic gamma and the schedule as given);
    wrapped in a `TreeDrafter` when `tree` is given. A drafter is returned as it is."""
    if is_drafter(draft):
        return draft
    if contract.drafts_blocks(draft):  # the whole block in one call
        return BlockDrafter(draft, int(gamma), tree=None if tree is None else trees.as_tree(tree))
    chain = TargetAwareDrafter if contract.reads_target(draft) else ChainDrafter
    base = chain(draft, int(gamma), confidence=confidence, schedule=schedule,
                 initial_gamma=initial_gamma)
    return base if tree is None else TreeDrafter(base, trees.as_tree(tree))


# ----------------------------------------------------------------------------------------------
# Choosing a drafter for speculative beam search (its paths: decode/beam_paths.py).


def beam_drafter(draft, gamma) -> beam_paths.BeamProposer:
    """The drafter speculative beam search drives for `draft`: a draft model's (`as_drafter`;
    `gamma` checked first), or `draft` itself, a drafter object, whose gamma `gamma` must
    equal (or be None). A drafter that cannot propose per-beam paths is refused in one line."""
    if is_drafter(draft):
        if gamma is not None and gamma != draft.gamma:
            raise ValueError(f"gamma={gamma!r} but the drafter drafts {draft.gamma} per round: "
                             "pass gamma=None (or the drafter's gamma).")
    else:
        validation.positive_int(gamma, "gamma", "draft steps per round")
    drafter = as_drafter(draft, gamma)
    lacks = contract.missing(drafter, beam_paths.BeamProposer)
    if lacks:
        raise TypeError(
            f"{type(drafter).__name__} cannot draft for speculative beam search: it proposes "
            f"no greedy path per beam (it lacks {', '.join(lacks)}); use a chain or "
            "target-aware draft (draft_branch=b gives each beam b first tokens).")
    return drafter


def record(drafter) -> Tuple[str, int, Optional[Tuple[int, ...]]]:
    """`(kind, gamma, tree branching or None)`: how a drafter is written down (`from_record`
    reads it back); a drafter of your own without `Capabilities` is a 'chain'."""
    tree = getattr(drafter, "tree", None)
    return (getattr(drafter, "kind", "chain"), int(drafter.gamma),
            None if tree is None else tuple(tree.branching))


def calibration_families(draft, gammas, max_decode_len: int):
    """The drafters calibration times for `draft` (`measure.speculation`): a drafter object as
    it is; else the families its own drafter offers (`candidates`: a chain at `gammas`, and a
    block draft's block beside it)."""
    if is_drafter(draft):
        return ((draft,),)
    return as_drafter(draft, 1).candidates(gammas, max_decode_len)


def from_record(draft, kind: str, gamma: int, tree: Optional[Sequence[int]] = None) -> Drafter:
    """The drafter a record names (`Capabilities.kind` and its gamma and tree, as
    `measure.speculation` and a run's plan write them): the draft's own drafter's candidate of
    that kind and gamma, or its `with_tree(tree)`. A ValueError names what the draft offers."""
    if is_drafter(draft):  # a drafter object is used as given
        return draft
    default = as_drafter(draft, int(gamma))
    if tree is not None:
        return default.with_tree(tree)
    offered = [d for family in default.candidates((gamma,), int(gamma)) for d in family]
    for drafter in offered:
        if drafter.kind == kind and drafter.gamma == int(gamma):
            return drafter
    raise ValueError(f"kind={kind!r} gamma={gamma!r}: this draft's drafters are "
                     f"{[(d.kind, d.gamma) for d in offered]}.")
