"""T5X-style beam search, and exact speculative beam search (paper appendix A.4): one loop.

`beam_search(target, inputs, beam_size=w, ...)` is T5X's `decoding.beam_search`: at step i
every alive beam's next-token log-probabilities are added to its score, the best 2w of the
w x V candidates are kept, those ending in EOS join the finished set with the length penalty
`((5 + length) / 6) ** length_penalty`, the best w others stay alive, and the search stops at
`max_decode_len` or once no alive beam can beat the worst finished one even at the longest
length. Rows with no finished beam return their alive beams.

`speculative_beam_search(target, draft, inputs, beam_size=w, draft_beam=u, gamma=g)` runs that
same search with fewer target calls. A round (`_jitted_search`):

  1. propose: the drafter (decode/drafters.py, decode/beam_paths.py) proposes paths of g
     tokens: for every alive beam its own greedy continuation (with `draft_branch=b`, its b
     best first tokens, each continued greedily), plus the u paths of the draft's beam search
     of width u from the alive beams (their parents are alive beams);
  2. score: the target scores all proposed paths in one forward (the drafter's view of it,
     `rounds.TargetView`): its log-probabilities at the position after every prefix of every
     path;
  3. replay: the target's beam search steps are replayed from those numbers, one step at a
     time, as long as every alive beam of the step is a prefix of some proposed path (its
     distribution was computed). Step 1 always is (each alive beam has its greedy path), so a
     round makes between 1 and g + 1 steps;
  4. keep: both caches take each kept beam's path row, rewound to its replayed tokens (the
     drafter keeps its own state: `beam_keep`).

Exactness: a step replayed from the round's forward is the step the target alone would take,
whatever the drafter proposed: the scores are the same numbers (to float32 round-off: the
cached forward scores a path's g + 1 tokens in one call instead of one by one), and a step
whose beams were not all proposed is not replayed. `beam_search` is the same loop with a
drafter that proposes nothing (g = 0): every round is one step, one target call of one token
per beam.

The loop is one jitted `lax.while_loop`, with the KV caches reordered by beam (T5X's
`cache_gather_beams`; the encoder and its cross-attention keys and values are computed once
per input). It never asks which kind of drafter it drives: a drafter that cannot propose
per-beam paths (a token tree, a block) is refused by name before anything is traced
(`drafters.beam_drafter`).
`beam_reference.host_beam_search` and `host_speculative_beam_search` are Python loops around
a teacher-forcing forward that recomputes every prefix: the references the jitted ones are
tested against (with the same `rows`, `beam_search(..., rows=...)`, the two host searches
match bit for bit).
`target_calls` counts target forwards (steps, or rounds); whether a round saves walltime
depends on its forward's cost (`costs.choose_beam_proposal`; `infer.py` runs the plain search
below a measured 1.1x).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.beam.checks import (
    EOS_ID,
    NEG_INF,
    BeamSearchResult,
    _check,
    _check_speculative,
    _encoder_decoder,
)
from speculative.decode import beam_paths, contract, drafters, interrupts, rounds, validation
from speculative.decode.contract import reorder_rows, shared_parts, take_rows

Array = jax.Array


@struct.dataclass
class _BeamState:
    """The jitted search's carry (T5X's `BeamState`), beams of row b in rows b*w .. b*w + w-1.

    Attributes:
      cache: the target's decode state, `B * w` rows (each beam's prefix; the encoder's
        cross-attention keys and values computed once per input and repeated for its beams).
      draft: the drafter's state, one row per beam (`beam_paths.BeamDraftState`; None for the
        plain search).
      last: `[B, w]` each alive beam's last token (BOS at the start), fed next.
      alive, finished: `[B, w, N]` sequences; alive_scores `[B, w]` log-probabilities (NEG_INF
        for unused beams), finished_scores `[B, w]` length-penalised (NEG_INF = empty).
      done: `[B]` rows whose search stopped; row_steps `[B]` beam steps each took (rows replay
        different numbers of steps per round); rounds `[]` target forwards;
      nonfinite: `[B]` rows whose log-probabilities went NaN/inf (stopped; the caller raises).
    """

    cache: Any
    draft: Any
    last: Array
    alive: Array
    alive_scores: Array
    finished: Array
    finished_scores: Array
    done: Array
    row_steps: Array
    nonfinite: Array
    rounds: Array


def _take_beams(x: Array, index: Array) -> Array:
    """`x [B, k, ...]` at beams `index [B, m]` -> `[B, m, ...]`."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _top(scores: Array, k: int) -> Array:
    """Indices of the k largest of `scores [B, n]`, ties to the lower index (numpy's stable
    argsort of the negated scores, as the host search)."""
    return jax.lax.top_k(scores, k)[1]


_SETS = ("alive", "alive_scores", "finished", "finished_scores")


def _beam_step(s, log_probs: Array, index: Array, length_penalty: Array, longest: Array):
    """One T5X beam-search step of every row from `log_probs [B, w, V]` of its alive beams
    (`s` holds the alive and finished sets), the step's position `index [B]` per row.

    Returns `(sets, parent [B, w], tokens [B, w], stop [B], broken [B])`: the new alive and
    finished sets (a dict of `_SETS`), each kept alive beam's parent among the old ones and its
    token, T5X's stopping rule per row, and rows whose log-probabilities are not finite."""
    batch, w, vocab = log_probs.shape
    broken = ~jnp.all(jnp.isfinite(log_probs), axis=(1, 2))
    candidates = (s.alive_scores[:, :, None] + log_probs).reshape(batch, w * vocab)
    top = _top(candidates, 2 * w)  # [B, 2w]
    top_scores = jnp.take_along_axis(candidates, top, axis=1)
    beams, tokens = top // vocab, (top % vocab).astype(jnp.int32)
    at = jnp.arange(s.alive.shape[-1])[None, None, :] == index[:, None, None]
    seqs = jnp.where(at, tokens[:, :, None], _take_beams(s.alive, beams))  # [B, 2w, N]
    eos = tokens == EOS_ID
    alive_scores = jnp.where(eos, top_scores + NEG_INF, top_scores)
    keep = _top(alive_scores, w)
    new_alive_scores = jnp.take_along_axis(alive_scores, keep, axis=1)
    penalty = ((5.0 + (index + 1).astype(jnp.float32)) / 6.0) ** length_penalty  # [B]
    penalised = top_scores / penalty[:, None]
    penalised = jnp.where(eos, penalised, penalised + NEG_INF)
    merged_scores = jnp.concatenate([s.finished_scores, penalised], axis=1)
    best = _top(merged_scores, w)
    finished_scores = jnp.take_along_axis(merged_scores, best, axis=1)
    sets = dict(alive=_take_beams(seqs, keep), alive_scores=new_alive_scores,
                finished=_take_beams(jnp.concatenate([s.finished, seqs], axis=1), best),
                finished_scores=finished_scores)
    # T5X's stopping rule: no alive beam can beat the worst finished one at the longest length.
    all_finished = jnp.all(finished_scores > NEG_INF / 2, axis=1)
    worst = jnp.where(all_finished, jnp.min(finished_scores, axis=1), NEG_INF)
    stop = (index + 1 >= s.alive.shape[-1]) | (worst > new_alive_scores[:, 0] / longest)
    parent = jnp.take_along_axis(beams, keep, axis=1)
    return sets, parent, jnp.take_along_axis(tokens, keep, axis=1), stop | broken, broken


def _pick(keep_old: Array, old, new: dict) -> dict:
    """The sets of `new`, but `old`'s for rows `keep_old [B]`."""
    return {k: jnp.where(keep_old.reshape((-1,) + (1,) * (v.ndim - 1)), getattr(old, k), v)
            for k, v in new.items()}


@struct.dataclass
class _TargetAlone:
    """The plain search's drafter: it proposes nothing (g = 0), so a round is one beam step,
    one target call of one token per beam, and it keeps no state."""

    gamma: int = struct.field(pytree_node=False, default=0)

    def view(self, target) -> rounds.TargetView:
        return rounds.TargetView(target)

    def beam_calls(self, draft_beam: int) -> int:
        del draft_beam
        return 0

    def beam_start(self, view, inputs, max_len, beams):
        per_beam = jnp.repeat(jnp.arange(inputs.shape[0]), beams)
        return take_rows(view.start(inputs, max_len), per_beam), None

    def beam_propose(self, state, last, scores, draft_beam, branch) -> beam_paths.BeamProposal:
        del state, scores, draft_beam, branch
        batch, w = last.shape
        return beam_paths.BeamProposal(paths=jnp.zeros((batch, w, 0), jnp.int32),
                                     roots=jnp.broadcast_to(jnp.arange(w), (batch, w)),
                                     model=None)

    def beam_keep(self, state, proposal, rows, lengths, replayed, scored):
        del proposal, rows, lengths, replayed, scored
        return state


def _replay(s: _BeamState, log_probs: Array, proposal: beam_paths.BeamProposal, branch: int,
            length_penalty: Array, longest: Array):
    """Step 3: the target's beam steps replayed from `log_probs [B, P, g + 1, V]` (after every
    prefix of every proposed path) while every alive beam lies on a proposed path.

    Returns `(s with the new sets, rows_of [B, w], replayed [B])`: the path row holding each
    alive beam's prefix (its parent's) and the steps each row replayed."""
    paths, roots = proposal.paths, proposal.roots
    batch, _, g = paths.shape
    w = s.last.shape[1]
    # Path q continues path p after t tokens iff they share the root and the t tokens.
    same = (roots[:, :, None] == roots[:, None, :])[..., None]  # [B, P, P, 1]
    prefix = jnp.cumprod(paths[:, :, None, :] == paths[:, None, :, :], axis=-1) > 0
    agree = same & jnp.concatenate([jnp.ones_like(prefix[..., :1]), prefix], axis=-1)
    state, going = s, ~s.done
    # The path each alive beam lies on (its first greedy path).
    on = jnp.broadcast_to(jnp.arange(w) * branch, (batch, w))
    rows_of = on
    replayed = jnp.zeros((batch,), jnp.int32)
    for i in range(g + 1):
        if i == 0:  # static: beam k lies on path k * branch (no gather)
            lp = log_probs[:, :w * branch:branch, 0]
        else:
            lp = jnp.take_along_axis(log_probs[:, :, i], on[:, :, None], axis=1)  # [B, w, V]
        new, parent, tokens, stop, broken = _beam_step(state, lp, state.row_steps,
                                                       length_penalty, longest)
        broken &= going
        on_parent = jnp.take_along_axis(on, parent, axis=1)
        if i < g:  # a child lies on a path that continues its parent's with its token
            hit = (jnp.take_along_axis(agree[:, :, :, i], on_parent[:, :, None], axis=1)
                   & (paths[:, None, :, i] == tokens[:, :, None]))  # [B, w, P]
            found, child_on = jnp.any(hit, axis=-1), jnp.argmax(hit, axis=-1)
        else:
            found, child_on = jnp.zeros((batch, w), bool), on_parent
        stepped = going & ~broken
        state = state.replace(
            **_pick(~stepped, state, new), last=jnp.where(stepped[:, None], tokens, state.last),
            done=state.done | (going & stop),
            row_steps=state.row_steps + stepped.astype(jnp.int32),
            nonfinite=state.nonfinite | broken)
        rows_of = jnp.where(stepped[:, None], on_parent, rows_of)
        on = jnp.where(stepped[:, None], child_on, on)
        replayed += stepped.astype(jnp.int32)
        live = new["alive_scores"] > NEG_INF / 2
        going = stepped & ~stop & jnp.all(found | ~live, axis=1)
    return state, rows_of, replayed


def _jitted_search(target, drafter, inputs, *, beam_size: int, draft_beam: int,
                   draft_branch: int, max_decode_len: int, length_penalty: float):
    """T5X's beam search of `target` with `drafter` proposing paths (module docstring: the
    round's steps 1-4), as one jitted `lax.while_loop`; the plain search with `_TargetAlone`."""
    w, u, g, n = beam_size, draft_beam, drafter.gamma, max_decode_len
    p_rows, batch = w * draft_branch + u, inputs.shape[0]
    view = drafter.view(target)
    # Room for every step and one round's g + 1 tokens past a row's last (n - 1) steps.
    cache, draft = drafter.beam_start(view, inputs, n + g + 1, w)
    init = _BeamState(
        cache=cache, draft=draft, last=cache.pending.reshape(batch, w),
        alive=jnp.zeros((batch, w, n), jnp.int32),
        alive_scores=jnp.full((batch, w), NEG_INF, jnp.float32).at[:, 0].set(0.0),
        finished=jnp.zeros((batch, w, n), jnp.int32),
        finished_scores=jnp.full((batch, w), NEG_INF, jnp.float32),
        done=jnp.zeros((batch,), bool), row_steps=jnp.zeros((batch,), jnp.int32),
        nonfinite=jnp.zeros((batch,), bool), rounds=jnp.zeros((), jnp.int32))
    length_penalty = jnp.asarray(length_penalty, jnp.float32)  # traced: one compile for all
    longest = ((5.0 + n) / 6.0) ** length_penalty
    flat = jnp.arange(batch)[:, None]
    # Path k is beam k's greedy path (one path per beam): the forward reads the beams' own rows.
    own_rows = u == 0 and draft_branch == 1
    # Otherwise: the target's cross-attention keys and values for the P path rows of each input.
    path_shared = None if own_rows else shared_parts(
        target, cache, jnp.repeat(jnp.arange(batch) * w, p_rows))

    def cond(s):
        return jnp.any(~s.done) & (s.rounds < n)

    def body(s):
        # 1. Propose: P paths of g tokens per input.
        proposal = drafter.beam_propose(s.draft, s.last, s.alive_scores, u, draft_branch)
        # 2. Score: the target reads each path after its root's last token, in one forward.
        tstate = s.cache if own_rows else reorder_rows(
            target, s.cache, (flat * w + proposal.roots).reshape(-1), path_shared)
        root_last = jnp.take_along_axis(s.last, proposal.roots, axis=1)
        verify = jnp.concatenate([root_last[:, :, None], proposal.paths], axis=2)
        scored, tstate = view.score(tstate, verify.reshape(batch * p_rows, g + 1))
        log_probs = jax.nn.log_softmax(jnp.asarray(scored.logits, jnp.float32)).reshape(
            batch, p_rows, g + 1, -1)
        # 3. Replay the target's steps while every alive beam lies on a proposed path.
        state, rows_of, replayed = _replay(s, log_probs, proposal, draft_branch,
                                           length_penalty, longest)
        # 4. Keep: every alive beam's caches are its parent's path row, rewound to the
        # replayed tokens (the cache held the round's start, the root's last token and g more).
        rows = (flat * p_rows + rows_of).reshape(-1)
        tstate = reorder_rows(target, tstate, rows, shared_parts(target, s.cache))
        replayed = jnp.repeat(replayed, w)
        lengths = tstate.lengths - (g + 1) + replayed
        draft = drafter.beam_keep(s.draft, proposal, rows, lengths, replayed, scored)
        return state.replace(cache=view.rewind(tstate, lengths), draft=draft,
                             rounds=s.rounds + 1)

    return jax.lax.while_loop(cond, body, init)


_JITTED_SEARCH = contract.jit_by_class(_jitted_search, (
    "beam_size", "draft_beam", "draft_branch", "max_decode_len"))


def beam_search(target, inputs, *, beam_size: int, max_decode_len: int,
                length_penalty: float = 0.6, rows: Optional[int] = None) -> BeamSearchResult:
    """T5X's beam search with the target alone (module docstring), one jitted
    `lax.while_loop` with the target's KV cache reordered by beam at every step (T5X's
    `cache_gather_beams`): one cached target call of `batch * beam_size` rows per step.

    `rows` runs the host-driven search instead (`host_beam_search`: every forward has `rows`
    rows and recomputes each prefix), whose numbers `speculative_beam_search` reproduces bit for
    bit when given the same `rows`.
    """
    if rows is not None:
        from speculative.beam.reference import host_beam_search  # pylint: disable=g-import-not-at-top
        return host_beam_search(target, inputs, beam_size=beam_size,
                                max_decode_len=max_decode_len, length_penalty=length_penalty,
                                rows=rows)
    inputs = _check(inputs, beam_size, max_decode_len, length_penalty, target, cached=True)
    _encoder_decoder(target, "target", inputs.shape[1])
    s = jax.device_get(interrupts.wait(_JITTED_SEARCH(
        target, _TargetAlone(), jnp.asarray(inputs), beam_size=int(beam_size), draft_beam=0,
        draft_branch=1, max_decode_len=int(max_decode_len),
        length_penalty=float(length_penalty)),
        _what("beam_search", inputs, beam_size, max_decode_len)))
    return _jitted_result(s, target_calls=int(s.rounds))


def _what(name: str, inputs, beam_size, max_decode_len) -> str:
    """A search call in words, for the message of a Ctrl-C (`interrupts.wait`: the jitted
    search returns to Python only when done, so the wait is where Ctrl-C stops it)."""
    return (f"{name} of {inputs.shape[0]} row(s) x {int(beam_size)} beams x "
            f"{int(max_decode_len)} tokens")


def _jitted_result(s, *, target_calls: int, rounds: int = 0,
                   draft_calls: int = 0) -> BeamSearchResult:
    """A jitted search's final carry as a `BeamSearchResult`; NaN rows raise."""
    rows_broken = np.nonzero(np.asarray(s.nonfinite))[0]
    if rows_broken.size:
        raise FloatingPointError(
            f"beam search: the target's log-probabilities are NaN or infinite for rows "
            f"{rows_broken.tolist()[:20]}; check the checkpoint for NaN/inf parameters.")
    none_finished = ~np.any(np.asarray(s.finished_scores) > NEG_INF / 2, axis=1)
    sequences = np.where(none_finished[:, None, None], s.alive, s.finished).astype(np.int32)
    scores = np.where(none_finished[:, None], s.alive_scores, s.finished_scores)
    row_steps = np.asarray(s.row_steps, np.int64)
    return BeamSearchResult(sequences, scores.astype(np.float32), target_calls,
                            int(row_steps.sum()), rounds, draft_calls, row_steps)


def speculative_beam_search(target, draft, inputs, *, beam_size: int, draft_beam: int,
                            gamma: Optional[int], max_decode_len: int,
                            length_penalty: float = 0.6,
                            draft_branch: int = 1) -> BeamSearchResult:
    """T5X's beam search of `target`, with the draft proposing `gamma` steps of beams that
    the target checks in one cached forward (paper A.4; module docstring), in one jitted
    `lax.while_loop`. Sequences equal `beam_search(target, ...)`'s, scores to float32
    round-off (the target scores a path's tokens in one call of g + 1 tokens instead of one
    by one); `target_calls` counts the rounds (one forward of `batch * (beam_size *
    draft_branch + draft_beam)` rows of gamma + 1 tokens each).

    `draft` is a draft model (drafted by the drafter `speculative_decode` would pick:
    `ChainDrafter` for any DecodeModel, prompt lookup and n-gram tables included,
    `TargetAwareDrafter` for a draft that reads the target) or a drafter object with the
    `beam_paths.BeamProposer` methods, which brings its own gamma (`gamma` None or equal to it).
    A drafter that cannot propose a path per beam (a token tree, a block) is refused by name.

    `draft_branch = b` proposes, for every alive beam, the draft's b best first tokens, each
    followed by its greedy continuation (b = 1: the beam's greedy path): the target's second
    beam is often its first beam's second-best token, which a greedy path never covers."""
    drafter = drafters.beam_drafter(draft, gamma)
    gamma = drafter.gamma
    inputs = _check_speculative(
        target, drafter.model, inputs, beam_size, draft_beam, gamma, max_decode_len,
        length_penalty, cached=True, min_draft_beam=(
            0, "0 (0: only each alive beam's greedy paths; else the width of the draft's beam "
               "search)"))
    drafter.beam_check(target)
    validation.positive_int(draft_branch, "draft_branch", "first tokens proposed per alive beam "
                            "(1: its greedy path only)")
    if draft_branch > drafter.model.vocab_size:
        raise ValueError(f"draft_branch={draft_branch} exceeds the vocabulary's "
                         f"{drafter.model.vocab_size} tokens.")
    _encoder_decoder(target, "target", inputs.shape[1])
    _encoder_decoder(drafter.model, "draft", inputs.shape[1])
    s = jax.device_get(interrupts.wait(_JITTED_SEARCH(
        target, drafter, jnp.asarray(inputs), beam_size=int(beam_size),
        draft_beam=int(draft_beam), draft_branch=int(draft_branch),
        max_decode_len=int(max_decode_len), length_penalty=float(length_penalty)),
        _what("speculative_beam_search", inputs, beam_size, max_decode_len)))
    rounds_run = int(s.rounds)
    return _jitted_result(s, target_calls=rounds_run, rounds=rounds_run,
                          draft_calls=rounds_run * drafter.beam_calls(int(draft_beam)))
