"""Paths for speculative beam search (beam/search.py, paper A.4): what a drafter proposes for
the `B * w` alive beams of a round, and the state it carries per beam.

A drafter that takes part (`BeamProposer`; `ChainDrafter` and `TargetAwareDrafter` in
decode/drafters.py) proposes, for every alive beam, its b best first tokens each continued
greedily by the draft, then the u paths of the draft's own beam search from the alive beams
(`propose`: one draft call reads every beam's last token, then single-token `step`s). The
search scores them in one target forward and replays the target's steps along them (why any
proposal leaves the beams exact: beam/search.py's docstring).

Shape legend: B batch, w beams, P = w * b + u paths per input, G gamma, V vocab, F feature
width.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from speculative.decode import contract
from speculative.decode.contract import take_rows

Array = jax.Array


class BeamProposer(Protocol):
    """What speculative beam search calls on a drafter (`ChainDrafter`'s methods; its state, a
    `BeamDraftState`, holds `B * w` rows, beam k of input b in row b * w + k):

        view(target) -> TargetView          how the target scores the paths (the Drafter's)
        beam_check(target)                  refuses, by name, what it cannot do
        beam_calls(draft_beam) -> int       draft calls per round (the result's count)
        beam_start(view, inputs, max_len, w) -> (target state, state)   B * w rows each,
                                            caches of max_len slots
        beam_propose(state, last [B, w], scores [B, w], u, b) -> BeamProposal
        beam_keep(state, proposal, rows, lengths, replayed, scored) -> state

    `beam_keep` gets, per kept beam (`[B * w]` each), the proposal row holding its prefix
    (`rows`), the cache length to keep (`lengths`: its prefix, the round's replayed tokens
    included) and the steps replayed this round (`replayed`), and the target's forward over
    every path (`scored`, a `rounds.Scored` of `B * P` rows of G + 1 positions, with the
    target's features for a draft that reads them). The search never asks which kind of
    drafter it drives."""

    def beam_check(self, target) -> None: ...

    def beam_calls(self, draft_beam: int) -> int: ...

    def beam_start(self, view, inputs, max_len, beams): ...

    def beam_propose(self, state, last, scores, draft_beam, branch): ...

    def beam_keep(self, state, proposal, rows, lengths, replayed, scored): ...


@struct.dataclass
class BeamDraftState:
    """A drafter's state in speculative beam search, one row per alive beam.

    Attributes:
      model: the draft's decode state (each row holds its beam's prefix without `last`).
      feature: `[B * w, F]` the target's features of the position before each beam's last
        token, for a draft that reads them; None for a draft with a model of its own.
    """

    model: Any
    feature: Optional[Array]


@struct.dataclass
class BeamProposal:
    """A round's proposed paths, P = w * b + u per input.

    Attributes:
      paths: `[B, P, G]` for every alive beam k, its b best first tokens each followed by the
        draft's greedy continuation (paths k * b .. k * b + b - 1; the first is the beam's
        greedy path), then the u paths of the draft's beam search of width u from the alive
        beams (EOS never proposed inside those).
      roots: `[B, P]` the alive beam each path continues.
      model: the draft's state, `B * P` rows, each holding its root's prefix, last token and
        path.
    """

    paths: Array
    roots: Array
    model: Any


_NO_EOS = -2.0e7  # below every candidate score (T5X's NEG_INF is -1e7): EOS never drafted


def _top(scores: Array, k: int) -> Array:
    """Indices of the k largest of `scores [R, n]`, ties to the lower index."""
    return jax.lax.top_k(scores, k)[1]


def propose(drafter, state: BeamDraftState, last: Array, scores: Array, draft_beam: int,
               branch: int) -> BeamProposal:
    """`BeamProposal` from `drafter`'s `beam_first` (the call reading each beam's `last
    [B, w]`) and single-token `step`s; `scores [B, w]` are the alive beams' log-probabilities
    (T5X's NEG_INF for unused beams), from which the draft's beam search of width u =
    `draft_beam` starts."""
    batch, w = last.shape
    u, g, b = draft_beam, drafter.gamma, branch
    logits, d0 = drafter.beam_first(state, last.reshape(-1))
    lp0 = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))  # [B * w, V]
    x = _top(lp0, b).reshape(-1).astype(jnp.int32)  # [B * w * b], each beam's b best first
    d = take_rows(d0, jnp.repeat(jnp.arange(batch * w), b)) if b > 1 else d0
    greedy = [x]
    for _ in range(1, g):
        logits, d = drafter.step(d, x)
        x = jnp.argmax(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)),
                       axis=-1).astype(jnp.int32)
        greedy.append(x)
    _, d = drafter.step(d, x)  # each row holds its whole path
    greedy = jnp.stack(greedy, axis=1).reshape(batch, w * b, g)
    greedy_roots = jnp.broadcast_to(jnp.repeat(jnp.arange(w), b), (batch, w * b))
    if u == 0:  # static: the beams' own (branched) greedy paths only
        return BeamProposal(paths=greedy, roots=greedy_roots, model=d)
    lp0 = lp0.reshape(batch, w, -1)
    vocab = lp0.shape[-1]
    eos = jnp.arange(vocab) == contract.EOS_ID
    cand = jnp.where(eos, _NO_EOS, scores[:, :, None] + lp0)  # [B, w, V]
    top = _top(cand.reshape(batch, w * vocab), u)
    score = jnp.take_along_axis(cand.reshape(batch, -1), top, axis=1)  # [B, u]
    root, tokens = top // vocab, (top % vocab).astype(jnp.int32)
    beam = jnp.zeros((batch, u, g), jnp.int32).at[:, :, 0].set(tokens)
    db = take_rows(d0, (jnp.arange(batch)[:, None] * w + root).reshape(-1))
    for t in range(1, g):
        logits, db = drafter.step(db, beam[:, :, t - 1].reshape(-1))
        lp = jnp.where(eos, _NO_EOS, jax.nn.log_softmax(
            jnp.asarray(logits, jnp.float32)).reshape(batch, u, -1))
        cand = (score[:, :, None] + lp).reshape(batch, u * vocab)
        top = _top(cand, u)
        score = jnp.take_along_axis(cand, top, axis=1)
        parent, tokens = top // vocab, (top % vocab).astype(jnp.int32)
        root = jnp.take_along_axis(root, parent, axis=1)
        beam = jnp.take_along_axis(beam, parent[:, :, None], axis=1).at[:, :, t].set(tokens)
        db = take_rows(db, (jnp.arange(batch)[:, None] * u + parent).reshape(-1))
    _, db = drafter.step(db, beam[:, :, g - 1].reshape(-1))
    both = jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), d, db)
    order = jnp.concatenate([jnp.arange(batch)[:, None] * (w * b) + jnp.arange(w * b),
                             batch * w * b + jnp.arange(batch)[:, None] * u + jnp.arange(u)], 1)
    return BeamProposal(paths=jnp.concatenate([greedy, beam], axis=1),
                        roots=jnp.concatenate([greedy_roots, root], axis=1),
                        model=take_rows(both, order.reshape(-1)))
