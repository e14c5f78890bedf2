"""T5X-style beam search, and exact speculative beam search (paper appendix A.4).

`beam_search(target, inputs, beam_size=w, ...)` is T5X's `decoding.beam_search`: at step i
every alive beam's next-token log-probabilities are added to its score, the best 2w of the
w x V candidates are kept, those ending in EOS join the finished set with the length penalty
`((5 + length) / 6) ** length_penalty`, the best w others stay alive, and the search stops at
`max_decode_len` or once no alive beam can beat the worst finished one even at the longest
length. Rows with no finished beam return their alive beams.

`speculative_beam_search(target, draft, inputs, beam_size=w, draft_beam=u, gamma=g)` runs that
same search with fewer target calls. A round:

  1. the draft proposes paths of g tokens: for every alive beam its own greedy continuation
     (with `draft_branch=b`, its b best first tokens, each continued greedily), plus the u
     paths of the draft's beam search of width u from the alive beams (their parents are
     alive beams);
  2. the target scores all proposed paths in one forward: its log-probabilities at the
     position after every prefix of every path;
  3. the target's beam search steps are replayed from those numbers, one step at a time, as
     long as every alive beam of the step is a prefix of some proposed path (its
     distribution was computed). Step 1 always is (each alive beam has its greedy path), so a
     round makes between 1 and g + 1 steps.

A step replayed from the round's forward is the step the target alone would take: the scores
are the same numbers (to float32 round-off: the cached forward scores a path's g + 1 tokens in
one call instead of one by one).

Each search exists twice. `beam_search` and `speculative_beam_search`, what users run, are one
jitted `lax.while_loop` each, with the KV caches reordered by beam (T5X's `cache_gather_beams`;
the encoder and its cross-attention keys and values are computed once per input).
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
)
from speculative.decode import contract, interrupts, validation
from speculative.decode.contract import reads_target, reorder_rows, take_rows

Array = jax.Array


@struct.dataclass
class _BeamState:
    """The jitted search's carry (T5X's `BeamState`), beams of row b in rows b*w .. b*w + w-1.

    Attributes:
      cache: the target's decode state, `B * w` rows (each beam's prefix; the encoder's
        cross-attention keys and values computed once per input and repeated for its beams).
      last: `[B, w]` each alive beam's last token (BOS at the start), fed next.
      alive, finished: `[B, w, N]` sequences; alive_scores `[B, w]` log-probabilities (NEG_INF
        for unused beams), finished_scores `[B, w]` length-penalised (NEG_INF = empty).
      step: `[]` the step index; done `[B]` rows whose search stopped; row_steps `[B]`;
      nonfinite `[B]` rows whose log-probabilities went NaN/inf (stopped; the caller raises).
    """

    cache: Any
    last: Array
    alive: Array
    alive_scores: Array
    finished: Array
    finished_scores: Array
    step: Array
    done: Array
    row_steps: Array
    nonfinite: Array


def _take_beams(x: Array, index: Array) -> Array:
    """`x [B, k, ...]` at beams `index [B, m]` -> `[B, m, ...]`."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _top(scores: Array, k: int) -> Array:
    """Indices of the k largest of `scores [B, n]`, ties to the lower index (numpy's stable
    argsort of the negated scores, as the host search)."""
    return jax.lax.top_k(scores, k)[1]


def _shared(model, state):
    """`model`'s shared state parts (`contract.SharedRows`), or None (the state moves whole)."""
    return None if contract.missing(model, contract.SharedRows) else model.shared(state)


def _shared_rows(model, state, rows: Array):
    """The shared parts of rows `rows` of `state` (None when nothing is shared)."""
    shared = _shared(model, state)
    return None if shared is None else take_rows(shared, rows)


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


def _jitted_search(target, inputs, *, beam_size: int, max_decode_len: int,
                   length_penalty: float):
    w, n = beam_size, max_decode_len
    batch = inputs.shape[0]
    cache = target.init(target.params, inputs, n + 1)
    cache = take_rows(cache, jnp.repeat(jnp.arange(batch), w))  # per beam
    scores = jnp.full((batch, w), NEG_INF, jnp.float32).at[:, 0].set(0.0)
    init = _BeamState(
        cache=cache, last=cache.pending.reshape(batch, w),
        alive=jnp.zeros((batch, w, n), jnp.int32), alive_scores=scores,
        finished=jnp.zeros((batch, w, n), jnp.int32),
        finished_scores=jnp.full((batch, w), NEG_INF, jnp.float32),
        step=jnp.zeros((), jnp.int32), done=jnp.zeros((batch,), bool),
        row_steps=jnp.zeros((batch,), jnp.int32), nonfinite=jnp.zeros((batch,), bool))
    length_penalty = jnp.asarray(length_penalty, jnp.float32)  # traced: one compile for all
    longest = ((5.0 + n) / 6.0) ** length_penalty

    def cond(s):
        return (s.step < n) & jnp.any(~s.done)

    def body(s):
        i = s.step
        logits, cache = target.extend(target.params, s.cache, s.last.reshape(batch * w, 1))
        log_probs = jax.nn.log_softmax(jnp.asarray(logits[:, 0], jnp.float32)).reshape(
            batch, w, -1)
        new, parent, tokens, stop, broken = _beam_step(
            s, log_probs, jnp.full((batch,), i), length_penalty, longest)
        broken &= ~s.done
        # The cache follows the kept beams (T5X's cache_gather_beams).
        cache = reorder_rows(target, cache, (jnp.arange(batch)[:, None] * w + parent).reshape(-1))
        keep_old = s.done | broken
        return s.replace(
            cache=cache, last=tokens, **_pick(keep_old, s, new), step=i + 1,
            done=s.done | stop | broken, row_steps=s.row_steps + (~s.done).astype(jnp.int32),
            nonfinite=s.nonfinite | broken)

    return jax.lax.while_loop(cond, body, init)


_JITTED_SEARCH = contract.jit_by_class(_jitted_search, ("beam_size", "max_decode_len"))


@struct.dataclass
class _SpecBeamState:
    """The jitted speculative search's carry: `_BeamState`'s sets, plus the draft's cache per
    alive beam, per-row step counts (rows replay different numbers of steps per round) and
    the round count.

    Attributes:
      cache, draft_cache: the target's and the draft's decode states, `B * w` rows (beams of
        row b in rows b*w .. b*w + w-1).
      last: `[B, w]` each alive beam's last token, fed next.
      alive, finished: `[B, w, N]` sequences; alive_scores `[B, w]` log-probabilities,
        finished_scores `[B, w]` length-penalised (NEG_INF = unused / empty).
      done: `[B]` rows stopped; row_steps `[B]` beam steps each took; rounds `[]` forwards;
      nonfinite: `[B]` rows whose log-probabilities went NaN/inf (stopped; the caller raises).
      last_feature: for a target-aware draft, `[B * w, F]` the target's features of the
        position before each alive beam's `last` token (what the draft reads it with); None
        for a draft with a model of its own.
    """

    cache: Any
    draft_cache: Any
    last: Array
    alive: Array
    alive_scores: Array
    finished: Array
    finished_scores: Array
    done: Array
    row_steps: Array
    nonfinite: Array
    rounds: Array
    last_feature: Any = None


def _log_softmax(logits: Array) -> Array:
    return jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))


def _draft_paths_jit(draft, s: _SpecBeamState, gamma: int, draft_beam: int, branch: int):
    """The round's proposals (module docstring, step 1), as `(paths [B, P, g], roots [B, P],
    draft state of P = w * branch + u rows per input, fed each root's last token and its
    path)`: for every alive beam k, its `branch` best first tokens by the draft, each followed
    by the draft's greedy continuation (paths k*branch .. k*branch + branch-1, rooted at beam
    k; the first is the beam's greedy path), then the paths of the draft's beam search of width
    u from the alive beams (EOS never proposed inside those)."""
    batch, w = s.last.shape
    u, g, b = draft_beam, gamma, branch
    if s.last_feature is None:
        logits, d0 = draft.extend(draft.params, s.draft_cache, s.last.reshape(-1, 1))
    else:  # a target-aware draft reads the last token with the target's features before it
        logits, d0 = draft.extend(draft.params, s.draft_cache, s.last.reshape(-1, 1),
                                  s.last_feature[:, None])
    lp0 = _log_softmax(logits[:, 0])  # [B * w, V]
    x = _top(lp0, b).reshape(-1).astype(jnp.int32)  # [B * w * b], each beam's b best first
    d = take_rows(d0, jnp.repeat(jnp.arange(batch * w), b)) if b > 1 else d0
    greedy = [x]
    for _ in range(1, g):
        logits, d = draft.extend(draft.params, d, x[:, None])
        x = jnp.argmax(_log_softmax(logits[:, 0]), axis=-1).astype(jnp.int32)
        greedy.append(x)
    _, d = draft.extend(draft.params, d, x[:, None])  # each row holds its whole path
    greedy = jnp.stack(greedy, axis=1).reshape(batch, w * b, g)
    greedy_roots = jnp.broadcast_to(jnp.repeat(jnp.arange(w), b), (batch, w * b))
    if u == 0:  # the beams' own (branched) greedy paths only
        return greedy, greedy_roots, d
    lp0 = lp0.reshape(batch, w, -1)
    vocab = lp0.shape[-1]
    no_eos = jnp.arange(vocab) == EOS_ID
    cand = jnp.where(no_eos, 2 * NEG_INF, s.alive_scores[:, :, None] + lp0)  # [B, w, V]
    top = _top(cand.reshape(batch, w * vocab), u)
    score = jnp.take_along_axis(cand.reshape(batch, -1), top, axis=1)  # [B, u]
    root, tokens = top // vocab, (top % vocab).astype(jnp.int32)
    beam_paths = jnp.zeros((batch, u, g), jnp.int32).at[:, :, 0].set(tokens)
    db = take_rows(d0, (jnp.arange(batch)[:, None] * w + root).reshape(-1))
    for t in range(1, g):
        logits, db = draft.extend(draft.params, db, beam_paths[:, :, t - 1].reshape(-1, 1))
        lp = jnp.where(no_eos, 2 * NEG_INF, _log_softmax(logits[:, 0]).reshape(batch, u, -1))
        cand = (score[:, :, None] + lp).reshape(batch, u * vocab)
        top = _top(cand, u)
        score = jnp.take_along_axis(cand, top, axis=1)
        parent, tokens = top // vocab, (top % vocab).astype(jnp.int32)
        root = jnp.take_along_axis(root, parent, axis=1)
        beam_paths = _take_beams(beam_paths, parent).at[:, :, t].set(tokens)
        db = take_rows(db, (jnp.arange(batch)[:, None] * u + parent).reshape(-1))
    _, db = draft.extend(draft.params, db, beam_paths[:, :, g - 1].reshape(-1, 1))
    paths = jnp.concatenate([greedy, beam_paths], axis=1)
    roots = jnp.concatenate([greedy_roots, root], axis=1)
    both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=0), d, db)
    order = jnp.concatenate([jnp.arange(batch)[:, None] * (w * b) + jnp.arange(w * b),
                             batch * w * b + jnp.arange(batch)[:, None] * u + jnp.arange(u)], 1)
    return paths, roots, take_rows(both, order.reshape(-1))


def _jitted_speculative_search(target, draft, inputs, *, beam_size: int, draft_beam: int,
                               draft_branch: int, gamma: int, max_decode_len: int,
                               length_penalty: float):
    """Exact speculative beam search (paper A.4) as one jitted program (`speculative_beam_search`
    documents it). Long, on purpose: the round body (draft the paths, score them in one target
    forward, replay the target's beam steps along them, reorder and rewind both caches) closes
    over a dozen per-call constants and reads best as one labelled block, like t5x's
    `beam_search`."""
    w, u, g, n = beam_size, draft_beam, gamma, max_decode_len
    p_rows, batch = w * draft_branch + u, inputs.shape[0]
    per_beam = jnp.repeat(jnp.arange(batch), w)
    layers = tuple(draft.feature_layers) if reads_target(draft) else None
    if layers is None:
        cache = take_rows(target.init(target.params, inputs, n + g + 2), per_beam)
        draft_cache = take_rows(draft.init(draft.params, inputs, n + g + 2), per_beam)
        last_feature = None
    else:  # the draft cross-attends to the target's encoder output and reads its features
        first = target.init_for_draft(target.params, inputs, n + g + 2, layers)
        draft_cache = take_rows(draft.init(draft.params, inputs, n + g + 2,
                                           context=target.context(first)), per_beam)
        last_feature = take_rows(target.pending_features(first, layers), per_beam)
        cache = take_rows(target.release_context(first), per_beam)
    init = _SpecBeamState(
        cache=cache, draft_cache=draft_cache, last=cache.pending.reshape(batch, w),
        alive=jnp.zeros((batch, w, n), jnp.int32),
        alive_scores=jnp.full((batch, w), NEG_INF, jnp.float32).at[:, 0].set(0.0),
        finished=jnp.zeros((batch, w, n), jnp.int32),
        finished_scores=jnp.full((batch, w), NEG_INF, jnp.float32),
        done=jnp.zeros((batch,), bool), row_steps=jnp.zeros((batch,), jnp.int32),
        nonfinite=jnp.zeros((batch,), bool), rounds=jnp.zeros((), jnp.int32),
        last_feature=last_feature)
    length_penalty = jnp.asarray(length_penalty, jnp.float32)
    longest = ((5.0 + n) / 6.0) ** length_penalty
    flat = jnp.arange(batch)[:, None]
    # Path k is beam k's greedy path (one path per beam): the verify reads the beams' own rows.
    own_rows = u == 0 and draft_branch == 1
    # Otherwise: the target's cross-attention keys and values for the P path rows of each input.
    path_shared = None if own_rows else _shared_rows(target, cache,
                                                    jnp.repeat(jnp.arange(batch) * w, p_rows))

    def cond(s):
        return jnp.any(~s.done) & (s.rounds < n)

    def body(s):
        # 1. The draft proposes P paths per input; 2. the target scores them in one forward.
        paths, roots, dstate = _draft_paths_jit(draft, s, g, u, draft_branch)
        tstate = s.cache if own_rows else reorder_rows(
            target, s.cache, (flat * w + roots).reshape(-1), path_shared)
        root_last = jnp.take_along_axis(s.last, roots, axis=1)
        verify = jnp.concatenate([root_last[:, :, None], paths], axis=2)  # [B, P, g + 1]
        if layers is None:
            logits, tstate = target.extend(target.params, tstate,
                                           verify.reshape(batch * p_rows, -1))
        else:  # [B * P, g + 1, F]: the target's features after each verified token
            logits, feats, tstate = target.extend_with_features(
                target.params, tstate, verify.reshape(batch * p_rows, -1), layers)
        log_probs = _log_softmax(logits).reshape(batch, p_rows, g + 1, -1)
        # Path q continues path p after s tokens iff they share the root and the s tokens.
        same = (roots[:, :, None] == roots[:, None, :])[..., None]  # [B, P, P, 1]
        prefix = jnp.cumprod(paths[:, :, None, :] == paths[:, None, :, :], axis=-1) > 0
        agree = same & jnp.concatenate([jnp.ones_like(prefix[..., :1]), prefix], axis=-1)

        # 3. The target's steps, replayed while every alive beam lies on a proposed path.
        state, going = s, ~s.done
        # The path each alive beam lies on (its first greedy path).
        on = jnp.broadcast_to(jnp.arange(w) * draft_branch, (batch, w))
        rows_of = on  # the path row holding each alive beam's prefix (for the caches)
        replayed = jnp.zeros((batch,), jnp.int32)
        for i in range(g + 1):
            index = state.row_steps
            lp = jnp.take_along_axis(log_probs[:, :, i], on[:, :, None], axis=1)  # [B, w, V]
            new, parent, tokens, stop, broken = _beam_step(state, lp, index, length_penalty,
                                                           longest)
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

        # Every alive beam's caches: its parent's path row, rewound to the replayed tokens.
        rows = (flat * p_rows + rows_of).reshape(-1)
        back = jnp.repeat(g + 1 - replayed, w)
        tstate = reorder_rows(target, tstate, rows, _shared(target, s.cache))
        dstate = reorder_rows(draft, dstate, rows, _shared(draft, s.draft_cache))
        full = tstate.lengths  # both caches hold the round's start + root's last + path
        last_feature = None
        if layers is not None:
            # The draft read its path with its own states; it re-reads the path's tokens with
            # the target's features (those after each token before them) from the position
            # after the root's last token, then keeps the replayed ones like the target.
            feats = take_rows(feats, rows)  # [B * w, g + 1, F]
            kept_path = paths.reshape(batch * p_rows, g)[rows]
            dstate = draft.rewind(dstate, full - g)
            _, dstate = draft.extend(draft.params, dstate, kept_path, feats[:, :g])
            before_last = jnp.maximum(jnp.repeat(replayed, w) - 1, 0)  # [B * w]
            last_feature = jnp.take_along_axis(feats, before_last[:, None, None], axis=1)[:, 0]
            last_feature = jnp.where(jnp.repeat(replayed > 0, w)[:, None], last_feature,
                                     s.last_feature)
        return state.replace(
            cache=target.rewind(tstate, full - back),
            draft_cache=draft.rewind(dstate, full - back), rounds=s.rounds + 1,
            last_feature=last_feature)

    return jax.lax.while_loop(cond, body, init)


_JITTED_SPECULATIVE = contract.jit_by_class(_jitted_speculative_search, (
    "beam_size", "draft_beam", "draft_branch", "gamma", "max_decode_len"))


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
    if not hasattr(target, "prefix_length") or target.prefix_length(inputs.shape[1]) != 0:
        raise TypeError(f"beam search needs an encoder-decoder target (EncoderDecoderModel); "
                        f"got {type(target).__name__}.")
    s = jax.device_get(interrupts.wait(_JITTED_SEARCH(
        target, jnp.asarray(inputs), beam_size=int(beam_size),
        max_decode_len=int(max_decode_len), length_penalty=float(length_penalty)),
        _what("beam_search", inputs, beam_size, max_decode_len)))
    return _jitted_result(s, target_calls=int(s.step))


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
                            gamma: int, max_decode_len: int, length_penalty: float = 0.6,
                            draft_branch: int = 1) -> BeamSearchResult:
    """T5X's beam search of `target`, with the draft proposing `gamma` steps of beams that
    the target checks in one cached forward (paper A.4; module docstring), in one jitted
    `lax.while_loop`. Sequences equal `beam_search(target, ...)`'s, scores to float32
    round-off (the target scores a path's tokens in one call of g + 1 tokens instead of one
    by one); `target_calls` counts the rounds (one forward of `batch * (beam_size *
    draft_branch + draft_beam)` rows of gamma + 1 tokens each).

    `draft_branch = b` proposes, for every alive beam, the draft's b best first tokens, each
    followed by its greedy continuation (b = 1: the beam's greedy path): the target's second
    beam is often its first beam's second-best token, which a greedy path never covers."""
    inputs = _check_speculative(
        target, draft, inputs, beam_size, draft_beam, gamma, max_decode_len, length_penalty,
        cached=True, min_draft_beam=(0, "0 (0: only each alive beam's greedy paths; else the "
                                        "width of the draft's beam search)"))
    validation.positive_int(draft_branch, "draft_branch", "first tokens proposed per alive beam "
                            "(1: its greedy path only)")
    if draft_branch > draft.vocab_size:
        raise ValueError(f"draft_branch={draft_branch} exceeds the vocabulary's "
                         f"{draft.vocab_size} tokens.")
    for model, name in ((target, "target"), (draft, "draft")):
        if not hasattr(model, "prefix_length") or model.prefix_length(inputs.shape[1]) != 0:
            raise TypeError(f"beam search needs an encoder-decoder {name}; got "
                            f"{type(model).__name__}.")
    s = jax.device_get(interrupts.wait(_JITTED_SPECULATIVE(
        target, draft, jnp.asarray(inputs), beam_size=int(beam_size),
        draft_beam=int(draft_beam), draft_branch=int(draft_branch), gamma=int(gamma),
        max_decode_len=int(max_decode_len), length_penalty=float(length_penalty)),
        _what("speculative_beam_search", inputs, beam_size, max_decode_len)))
    rounds = int(s.rounds)
    rereads = 1 if reads_target(draft) else 0  # the path, read again with the features
    return _jitted_result(s, target_calls=rounds, rounds=rounds,
                          draft_calls=rounds * (int(gamma) + 1 + rereads
                                                + (int(gamma) if draft_beam else 0)))
