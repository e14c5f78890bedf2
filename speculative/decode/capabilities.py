"""What every drafter is and can say about itself: the `Drafter` protocol the loop calls
(decode/drafters.py documents it) and `Capabilities`, the answers a drafter gives so that no
caller asks its draft model what it is."""

from __future__ import annotations

from typing import Any, Protocol, Tuple

import jax

from speculative.decode import rounds

Array = jax.Array


class Drafter(Protocol):
    """What the speculative loop calls on a drafter (module docstring). `model` is the draft
    model whose vocabulary and cache `speculative_decode` checks (None for a drafter without
    one)."""

    model: Any

    @property
    def layout(self) -> Any: ...

    @property
    def gamma(self) -> int: ...

    def view(self, target) -> rounds.TargetView: ...

    def check(self, target) -> None: ...

    def start(self, view, inputs: Array, max_decode_len: int,
              target_width: int) -> Tuple[Any, Any]: ...

    def propose(self, state, last: Array, start: Array, keys: Array,
                verifier) -> Tuple[rounds.Proposal, Any]: ...

    def advance(self, state, outcome: rounds.Outcome, proposal: rounds.Proposal, last: Array,
                moving: Array) -> Any: ...


def gammas_within(gammas, max_decode_len: int) -> Tuple[int, ...]:
    """`gammas` as sorted distinct ints in [1, max_decode_len]."""
    return tuple(sorted({int(g) for g in gammas if 1 <= int(g) <= int(max_decode_len)}))


class Capabilities:
    """What a drafter can tell about itself, so that no caller asks its draft model what it is
    (no `hasattr`, no kind strings): the defaults of a chain from a plain `DecodeModel`; each
    drafter class overrides what differs.

        reads_target     it reads the target's context and features (`FeatureTarget`)
        proposes_block   its whole block comes from one draft call per round
        copies_input     its draft copies from the input (prompt lookup, the hybrid)
        has_network      its draft is a network (a T5 or target-aware draft), not an n-gram
                         table or a copy
        tree             the token tree it drafts (None: a chain); `needs_tree`: not None
        unrolls          its deeper drafts read its own states, so their laws change with the
                         depth (per-depth acceptance is worth measuring: `measure.acceptance`)
        kind             its name in records ('chain', 'block', 'tree'); never branched on
        candidates(gammas, max_decode_len)  the settings calibration times
                         (`measure.speculation`): families of drafters, each by gamma
        with_tree(tree)  the drafter of the token tree `tree` from the same draft
    """

    reads_target = False
    proposes_block = False
    unrolls = False
    tree = None
    kind = "chain"

    @property
    def copies_input(self) -> bool:
        return bool(getattr(self.model, "copies_input", False))

    @property
    def has_network(self) -> bool:
        return getattr(self.model, "module", None) is not None

    @property
    def needs_tree(self) -> bool:
        return self.tree is not None
