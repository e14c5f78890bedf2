"""T5X-style beam search, and exact speculative beam search (paper appendix A.4).

`beam_search(target, inputs, beam_size=w, ...)` is T5X's `decoding.beam_search`: at step i
every alive beam's next-token log-probabilities are added to its score, the best 2w of the
w x V candidates are kept, those ending in EOS join the finished set with the length penalty
`((5 + length) / 6) ** length_penalty`, the best w others stay alive, and the search stops at
`max_decode_len` or once no alive beam can beat the worst finished one even at the longest
length. Rows with no finished beam return their alive beams.

`speculative_beam_search(target, draft, inputs, beam_size=w, draft_beam=u, gamma=g)` runs that
same search with fewer target calls. A round:

  1. the draft proposes paths of g tokens: for every alive beam its own greedy continuation,
     plus the u paths of the draft's beam search of width u from the alive beams (their
     parents are alive beams);
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
`host_beam_search` and `host_speculative_beam_search` are Python loops around a teacher-forcing
forward that recomputes every prefix: the references the jitted ones are tested against (with
the same `rows`, `beam_search(..., rows=...)`, the two host searches match bit for bit).
`target_calls` counts target forwards (steps, or rounds); whether a round saves walltime
depends on its forward's cost (`costs.choose_beam_proposal`; `infer.py` runs the plain search
below a measured 1.1x).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative import validation
from speculative.contract import take_rows
from speculative.models import t5

EOS_ID = t5.EOS_ID
NEG_INF = -1.0e7  # T5X's decoding.NEG_INF
Array = jax.Array


@dataclasses.dataclass
class BeamSearchResult:
    """`sequences [B, w, N]` int32 (best beam first, 0 after EOS), `scores [B, w]` (the
    length-penalised log-probability of finished beams; the log-probability of alive beams
    for a row where none finished), `target_calls` (target forwards of the whole batch) and
    `steps` (beam-search steps taken, summed over rows); `row_steps [B]` per row: the target
    alone makes `max(row_steps)` forwards for the batch."""

    sequences: np.ndarray
    scores: np.ndarray
    target_calls: int
    steps: int
    rounds: int = 0
    draft_calls: int = 0
    row_steps: Optional[np.ndarray] = None


def brevity_penalty(alpha: float, length: int) -> float:
    """T5X's length penalty: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


@functools.partial(jax.jit, static_argnums=0)
def _log_probs(module, params, encoder_inputs, decoder_tokens):
    """Log-softmax of teacher-forcing logits `[R, N, V]`; position t is the distribution of the
    token after `decoder_tokens[:, :t]` (BOS first)."""
    decoder_inputs = jnp.pad(decoder_tokens[:, :-1], ((0, 0), (1, 0)))
    logits = module.apply({"params": params}, encoder_inputs, decoder_inputs)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


class _Scorer:
    """Fixed-shape forwards of one model: `rows` sequences of length `length` per call."""

    def __init__(self, model, inputs: np.ndarray, rows: int, length: int):
        module = getattr(model, "module", None)
        if not isinstance(module, t5.Transformer):
            raise TypeError(f"beam search needs encoder-decoder T5 models "
                            f"(EncoderDecoderModel); got {type(model).__name__}.")
        self.module, self.params = module, model.params
        self.inputs, self.rows, self.length = np.asarray(inputs, np.int32), rows, length
        self.calls = 0

    def __call__(self, batch_rows: List[int], sequences: List[List[int]]) -> np.ndarray:
        """Log-probs `[len(sequences), length, V]` for sequences of batch rows `batch_rows`."""
        if len(sequences) > self.rows:
            raise ValueError(f"{len(sequences)} sequences exceed the forward's {self.rows} rows.")
        enc = np.zeros((self.rows, self.inputs.shape[1]), np.int32)
        dec = np.zeros((self.rows, self.length), np.int32)
        enc[:] = self.inputs[batch_rows[0] if batch_rows else 0]
        for r, (b, seq) in enumerate(zip(batch_rows, sequences)):
            enc[r] = self.inputs[b]
            dec[r, :len(seq)] = seq
        self.calls += 1
        return np.asarray(_log_probs(self.module, self.params, enc, dec))[:len(sequences)]


@dataclasses.dataclass
class _Row:
    """The beam-search state of one input row (T5X's alive and finished sets)."""

    alive: List[List[int]]
    alive_scores: np.ndarray  # [w] log-probabilities (NEG_INF for unused beams)
    finished: List[List[int]]
    finished_scores: np.ndarray  # [w] length-penalised (NEG_INF = empty)
    done: bool = False
    steps: int = 0  # beam-search steps taken (the next step's index)


def _new_row(w: int) -> _Row:
    scores = np.full((w,), NEG_INF, np.float32)
    scores[0] = 0.0  # only the first beam is alive at the start (T5X)
    return _Row([[] for _ in range(w)], scores, [[] for _ in range(w)],
                np.full((w,), NEG_INF, np.float32))


def _step(row: _Row, log_probs: np.ndarray, step: int, w: int, alpha: float,
          max_decode_len: int) -> None:
    """One T5X beam-search step of `row` from `log_probs [w, V]` of its alive beams."""
    if not np.isfinite(log_probs).all():  # a NaN must never become a kept token
        raise FloatingPointError(
            f"beam search step {step}: the target's log-probabilities are NaN or infinite; "
            "check the checkpoint for NaN/inf parameters.")
    row.steps += 1
    vocab = log_probs.shape[-1]
    candidates = (row.alive_scores[:, None] + log_probs).reshape(-1)  # [w * V]
    top = np.argsort(-candidates, kind="stable")[:2 * w]
    top_scores = candidates[top]
    beams, tokens = top // vocab, top % vocab
    seqs = [row.alive[b] + [int(t)] for b, t in zip(beams, tokens)]
    eos = tokens == EOS_ID
    alive_scores = np.where(eos, top_scores + NEG_INF, top_scores)
    keep = np.argsort(-alive_scores, kind="stable")[:w]
    new_alive = [seqs[k] for k in keep]
    new_alive_scores = alive_scores[keep].astype(np.float32)
    penalised = (top_scores / np.float32(brevity_penalty(alpha, step + 1))).astype(np.float32)
    penalised = np.where(eos, penalised, penalised + NEG_INF)
    merged_scores = np.concatenate([row.finished_scores, penalised])
    merged = row.finished + seqs
    best = np.argsort(-merged_scores, kind="stable")[:w]
    row.finished = [merged[k] for k in best]
    row.finished_scores = merged_scores[best].astype(np.float32)
    row.alive, row.alive_scores = new_alive, new_alive_scores
    # T5X's stopping rule: no alive beam can beat the worst finished one at the longest length.
    finished_any = row.finished_scores > NEG_INF / 2
    worst_finished = row.finished_scores.min() if finished_any.all() else NEG_INF
    best_alive = row.alive_scores[0] / brevity_penalty(alpha, max_decode_len)
    row.done = step + 1 >= max_decode_len or bool(worst_finished > best_alive)


def _result(rows: List[_Row], max_decode_len: int, target_calls: int,
            rounds: int = 0, draft_calls: int = 0) -> BeamSearchResult:
    w = len(rows[0].alive)
    sequences = np.zeros((len(rows), w, max_decode_len), np.int32)
    scores = np.zeros((len(rows), w), np.float32)
    for b, row in enumerate(rows):
        none_finished = not (row.finished_scores > NEG_INF / 2).any()
        seqs, sc = (row.alive, row.alive_scores) if none_finished else (row.finished,
                                                                          row.finished_scores)
        for k, seq in enumerate(seqs):
            sequences[b, k, :len(seq)] = seq
        scores[b] = sc
    row_steps = np.asarray([row.steps for row in rows], np.int64)
    return BeamSearchResult(sequences, scores, target_calls, int(row_steps.sum()), rounds,
                            draft_calls, row_steps)


def _check(inputs, beam_size: int, max_decode_len: int, length_penalty: float,
           model=None, cached: bool = False) -> np.ndarray:
    """The decode loops' input rules (`validation`), before any forward: ids in the model's
    vocabulary, a token in every row, counts >= 1, and a forward (or, `cached`, the jitted
    search's KV cache and sequences) that fits in memory."""
    validation.positive_int(beam_size, "beam_size", "beams kept per input")
    validation.positive_int(max_decode_len, "max_decode_len", "tokens generated at most")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or \
            not np.isfinite(length_penalty):
        raise ValueError(f"length_penalty={length_penalty!r} is invalid: give a finite float "
                         "(T5X uses 0.6; 0 = no length penalty).")
    vocab = getattr(model, "vocab_size", None)
    ids = validation.token_ids(inputs, vocab if vocab is not None else np.iinfo(np.int32).max,
                               needs_token_per_row=True)
    if cached and hasattr(model, "cache_bytes"):
        validation.fits_memory(
            model.cache_bytes(ids.shape[0] * beam_size, max_decode_len + 1),
            f"the KV cache of beam search over batch {ids.shape[0]} x beam {beam_size} x "
            f"max_decode_len={max_decode_len}", "lower max_decode_len or the batch size")
    elif vocab is not None:  # each forward returns [rows, max_decode_len, V] float32 log-probs
        validation.fits_memory(
            ids.shape[0] * beam_size * max_decode_len * vocab * 4,
            f"beam search over batch {ids.shape[0]} x beam {beam_size} x "
            f"max_decode_len={max_decode_len}", "lower max_decode_len or the batch size")
    return ids


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


def _reorder(cache, rows: Array):
    """The cache rows of the kept beams. Only what differs between the beams of one input
    moves: a T5 cache's self-attention entries (its cross-attention keys and values, encoder
    mask and lengths are the same for every beam of an input); any other state, whole."""
    if hasattr(cache, "self_kv"):
        return cache.replace(self_kv=take_rows(cache.self_kv, rows))
    return take_rows(cache, rows)


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
        cache = _reorder(cache, (jnp.arange(batch)[:, None] * w + parent).reshape(-1))
        keep_old = s.done | broken
        return s.replace(
            cache=cache, last=tokens, **_pick(keep_old, s, new), step=i + 1,
            done=s.done | stop | broken, row_steps=s.row_steps + (~s.done).astype(jnp.int32),
            nonfinite=s.nonfinite | broken)

    return jax.lax.while_loop(cond, body, init)


_JITTED_SEARCH = jax.jit(_jitted_search, static_argnames=("beam_size", "max_decode_len"))


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


def _log_softmax(logits: Array) -> Array:
    return jax.nn.log_softmax(jnp.asarray(logits, jnp.float32))


def _draft_paths_jit(draft, s: _SpecBeamState, gamma: int, draft_beam: int):
    """The round's proposals (module docstring, step 1), as `(paths [B, P, g], roots [B, P],
    draft state of P = w + u rows per input, fed each root's last token and its path)`:
    each alive beam's greedy continuation (paths 0..w-1, rooted at beams 0..w-1), then the
    paths of the draft's beam search of width u from the alive beams (EOS never proposed
    inside a path)."""
    batch, w = s.last.shape
    u, g = draft_beam, gamma
    d, x, lp0, d0, greedy = s.draft_cache, s.last.reshape(-1), None, None, []
    for t in range(g):
        logits, d = draft.extend(draft.params, d, x[:, None])
        lp = _log_softmax(logits[:, 0])
        if t == 0:
            lp0, d0 = lp.reshape(batch, w, -1), d
        x = jnp.argmax(lp, axis=-1).astype(jnp.int32)
        greedy.append(x)
    _, d = draft.extend(draft.params, d, x[:, None])  # each row holds its whole path
    greedy = jnp.stack(greedy, axis=1).reshape(batch, w, g)
    if u == 0:  # greedy paths only
        return greedy, jnp.broadcast_to(jnp.arange(w), (batch, w)), d
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
    roots = jnp.concatenate([jnp.broadcast_to(jnp.arange(w), (batch, w)), root], axis=1)
    both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=0), d, db)
    order = jnp.concatenate([jnp.arange(batch)[:, None] * w + jnp.arange(w),
                             batch * w + jnp.arange(batch)[:, None] * u + jnp.arange(u)], 1)
    return paths, roots, take_rows(both, order.reshape(-1))


def _jitted_speculative_search(target, draft, inputs, *, beam_size: int, draft_beam: int,
                               gamma: int, max_decode_len: int, length_penalty: float):
    w, u, g, n = beam_size, draft_beam, gamma, max_decode_len
    p_rows, batch = w + u, inputs.shape[0]
    per_beam = jnp.repeat(jnp.arange(batch), w)
    cache = take_rows(target.init(target.params, inputs, n + g + 2), per_beam)
    draft_cache = take_rows(draft.init(draft.params, inputs, n + g + 2), per_beam)
    init = _SpecBeamState(
        cache=cache, draft_cache=draft_cache, last=cache.pending.reshape(batch, w),
        alive=jnp.zeros((batch, w, n), jnp.int32),
        alive_scores=jnp.full((batch, w), NEG_INF, jnp.float32).at[:, 0].set(0.0),
        finished=jnp.zeros((batch, w, n), jnp.int32),
        finished_scores=jnp.full((batch, w), NEG_INF, jnp.float32),
        done=jnp.zeros((batch,), bool), row_steps=jnp.zeros((batch,), jnp.int32),
        nonfinite=jnp.zeros((batch,), bool), rounds=jnp.zeros((), jnp.int32))
    length_penalty = jnp.asarray(length_penalty, jnp.float32)
    longest = ((5.0 + n) / 6.0) ** length_penalty
    flat = jnp.arange(batch)[:, None]

    def cond(s):
        return jnp.any(~s.done) & (s.rounds < n)

    def body(s):
        # 1. The draft proposes P paths per input; 2. the target scores them in one forward.
        paths, roots, dstate = _draft_paths_jit(draft, s, g, u)
        tstate = take_rows(s.cache, (flat * w + roots).reshape(-1))
        root_last = jnp.take_along_axis(s.last, roots, axis=1)
        verify = jnp.concatenate([root_last[:, :, None], paths], axis=2)  # [B, P, g + 1]
        logits, tstate = target.extend(target.params, tstate, verify.reshape(batch * p_rows, -1))
        log_probs = _log_softmax(logits).reshape(batch, p_rows, g + 1, -1)
        # Path q continues path p after s tokens iff they share the root and the s tokens.
        same = (roots[:, :, None] == roots[:, None, :])[..., None]  # [B, P, P, 1]
        prefix = jnp.cumprod(paths[:, :, None, :] == paths[:, None, :, :], axis=-1) > 0
        agree = same & jnp.concatenate([jnp.ones_like(prefix[..., :1]), prefix], axis=-1)

        # 3. The target's steps, replayed while every alive beam lies on a proposed path.
        state, going = s, ~s.done
        on = jnp.broadcast_to(jnp.arange(w), (batch, w))  # the path each alive beam lies on
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
        tstate = take_rows(tstate, rows)
        dstate = take_rows(dstate, rows)
        return state.replace(
            cache=target.rewind(tstate, tstate.lengths - back),
            draft_cache=draft.rewind(dstate, dstate.lengths - back), rounds=s.rounds + 1)

    return jax.lax.while_loop(cond, body, init)


_JITTED_SPECULATIVE = jax.jit(_jitted_speculative_search, static_argnames=(
    "beam_size", "draft_beam", "gamma", "max_decode_len"))


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
        return host_beam_search(target, inputs, beam_size=beam_size,
                                max_decode_len=max_decode_len, length_penalty=length_penalty,
                                rows=rows)
    inputs = _check(inputs, beam_size, max_decode_len, length_penalty, target, cached=True)
    if not hasattr(target, "prefix_length") or target.prefix_length(inputs.shape[1]) != 0:
        raise TypeError(f"beam search needs an encoder-decoder target (EncoderDecoderModel); "
                        f"got {type(target).__name__}.")
    s = jax.device_get(_JITTED_SEARCH(target, jnp.asarray(inputs), beam_size=int(beam_size),
                                      max_decode_len=int(max_decode_len),
                                      length_penalty=float(length_penalty)))
    return _jitted_result(s, target_calls=int(s.step))


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


def host_beam_search(target, inputs, *, beam_size: int, max_decode_len: int,
                     length_penalty: float = 0.6, rows: Optional[int] = None
                     ) -> BeamSearchResult:
    """The host-driven search (a Python loop over steps around a fixed-shape teacher-forcing
    forward of `rows` rows, default `batch * beam_size`, that recomputes every prefix): the
    reference the jitted search is tested against, and the one `speculative_beam_search`
    matches bit for bit."""
    inputs = _check(inputs, beam_size, max_decode_len, length_penalty, target)
    w, batch = beam_size, inputs.shape[0]
    scorer = _Scorer(target, inputs, rows or batch * w, max_decode_len)
    state = [_new_row(w) for _ in range(batch)]
    for i in range(max_decode_len):
        active = [b for b in range(batch) if not state[b].done]
        if not active:
            break
        lp = scorer([b for b in active for _ in range(w)],
                    [seq for b in active for seq in state[b].alive])
        for n, b in enumerate(active):
            _step(state[b], lp[n * w:(n + 1) * w, i], i, w, length_penalty, max_decode_len)
    return _result(state, max_decode_len, scorer.calls)


def _forward_rows(batch: int, beam_size: int, draft_beam: int) -> int:
    return batch * (beam_size + draft_beam)


def _draft_paths(scorer: _Scorer, rows: List[_Row], steps: dict, gamma: int, draft_beam: int,
                 max_decode_len: int) -> dict:
    """Per row b of `steps` (its step index), proposed paths `(alive beam index, up to gamma
    tokens)`: each alive beam's greedy draft continuation, then the paths of the draft's beam
    search of width `draft_beam` from the alive beams (scored with the target's alive scores
    plus draft log-probabilities)."""
    active = list(steps)
    greedy = {b: [list(s) for s in rows[b].alive] for b in active}
    beams = {b: [(k, list(rows[b].alive[k]), float(rows[b].alive_scores[k]))
                 for k in range(len(rows[b].alive)) if rows[b].alive_scores[k] > NEG_INF / 2]
             for b in active}
    for t in range(gamma):
        going = [b for b in active if steps[b] + t < max_decode_len]
        if not going:
            break
        seqs = [(b, s) for b in going for s in greedy[b]]
        seqs += [(b, s) for b in going for _, s, _ in beams[b]]
        lp = scorer([b for b, _ in seqs], [s for _, s in seqs])
        n = 0
        for b in going:
            for s in greedy[b]:
                s.append(int(np.argmax(lp[n, steps[b] + t])))
                n += 1
        for b in going:
            candidates = []
            for k, s, score in beams[b]:
                row_lp = lp[n, steps[b] + t]
                candidates += [(score + float(row_lp[x]), k, s + [int(x)])
                               for x in np.argsort(-row_lp)[:draft_beam] if x != EOS_ID]
                n += 1
            candidates.sort(key=lambda c: -c[0])
            beams[b] = [(k, s, score) for score, k, s in candidates[:draft_beam]]
    return {b: [(k, s[len(rows[b].alive[k]):]) for k, s in enumerate(greedy[b])]
            + [(k, s[len(rows[b].alive[k]):]) for k, s, _ in beams[b]] for b in active}


def _check_speculative(target, draft, inputs, beam_size, draft_beam, gamma, max_decode_len,
                       length_penalty, cached: bool, min_draft_beam) -> np.ndarray:
    """`min_draft_beam`: (the least draft_beam the search takes, the message saying why)."""
    inputs = _check(inputs, beam_size, max_decode_len, length_penalty, target, cached=cached)
    validation.positive_int(gamma, "gamma", "draft steps per round")
    least, why = min_draft_beam
    if isinstance(draft_beam, bool) or not isinstance(draft_beam, (int, np.integer)) or (
            draft_beam < least):
        raise ValueError(f"draft_beam={draft_beam!r} is invalid: give an int >= {why}.")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft vocab_size={draft.vocab_size} differs from the target's "
                         f"{target.vocab_size}.")
    return inputs


def speculative_beam_search(target, draft, inputs, *, beam_size: int, draft_beam: int,
                            gamma: int, max_decode_len: int,
                            length_penalty: float = 0.6) -> BeamSearchResult:
    """T5X's beam search of `target`, with the draft proposing `gamma` steps of beams that
    the target checks in one cached forward (paper A.4; module docstring), in one jitted
    `lax.while_loop`. Sequences equal `beam_search(target, ...)`'s, scores to float32
    round-off (the target scores a path's tokens in one call of g + 1 tokens instead of one
    by one); `target_calls` counts the rounds (one forward of `batch * (beam_size +
    draft_beam)` rows of gamma + 1 tokens each)."""
    inputs = _check_speculative(
        target, draft, inputs, beam_size, draft_beam, gamma, max_decode_len, length_penalty,
        cached=True, min_draft_beam=(0, "0 (0: only each alive beam's greedy path; else the "
                                        "width of the draft's beam search)"))
    for model, name in ((target, "target"), (draft, "draft")):
        if not hasattr(model, "prefix_length") or model.prefix_length(inputs.shape[1]) != 0:
            raise TypeError(f"beam search needs an encoder-decoder {name}; got "
                            f"{type(model).__name__}.")
    s = jax.device_get(_JITTED_SPECULATIVE(
        target, draft, jnp.asarray(inputs), beam_size=int(beam_size),
        draft_beam=int(draft_beam), gamma=int(gamma), max_decode_len=int(max_decode_len),
        length_penalty=float(length_penalty)))
    rounds = int(s.rounds)
    return _jitted_result(s, target_calls=rounds, rounds=rounds,
                          draft_calls=rounds * (int(gamma) + 1 + (int(gamma) if draft_beam else 0)))


def host_speculative_beam_search(target, draft, inputs, *, beam_size: int, draft_beam: int,
                                 gamma: int, max_decode_len: int,
                                 length_penalty: float = 0.6) -> BeamSearchResult:
    """The host-driven speculative search (a Python loop over rounds around teacher-forcing
    forwards that recompute every prefix): the reference, equal bit for bit to
    `beam_search(..., rows=batch * (beam_size + draft_beam))`."""
    inputs = _check_speculative(
        target, draft, inputs, beam_size, draft_beam, gamma, max_decode_len, length_penalty,
        cached=False, min_draft_beam=(beam_size, f"beam_size={beam_size}: the draft proposes "
                                                 "at least as many beams as the target keeps"))
    w, batch = beam_size, inputs.shape[0]
    rows_per_call = _forward_rows(batch, w, draft_beam)
    scorer = _Scorer(target, inputs, rows_per_call, max_decode_len)
    draft_scorer = _Scorer(draft, inputs, rows_per_call, max_decode_len)
    state = [_new_row(w) for _ in range(batch)]
    rounds = 0
    while True:
        active = [b for b in range(batch) if not state[b].done]
        if not active:
            break
        # One round for all active rows; rows at different steps are fine (each sequence
        # carries its own positions).
        proposals = _draft_paths(draft_scorer, state, {b: state[b].steps for b in active}, gamma,
                                 draft_beam, max_decode_len)
        flat = [(b, k, path) for b in active for k, path in proposals[b]]
        lp = scorer([b for b, _, _ in flat], [state[b].alive[k] + path for b, k, path in flat])
        rounds += 1
        for b in active:
            row, start = state[b], state[b].steps
            rows_b = [(n, k, path) for n, (bb, k, path) in enumerate(flat) if bb == b]
            roots = [list(s) for s in row.alive]  # alive beams at the round's start
            for s in range(gamma + 1):
                if row.done:
                    break
                i = start + s
                found = []
                for seq in row.alive:
                    hit = None
                    for n, k, path in rows_b:
                        full = roots[k] + path
                        if len(full) >= len(seq) and full[:len(seq)] == seq and len(seq) == i:
                            hit = n
                            break
                    found.append(hit)
                # Unused alive slots (score NEG_INF) are scored from any row: their candidates
                # never enter the top 2w (T5X gives them the same treatment).
                if any(h is None for h, sc in zip(found, row.alive_scores) if sc > NEG_INF / 2):
                    break
                fallback = next(h for h in found if h is not None)
                log_probs = np.stack([lp[fallback if h is None else h, i] for h in found])
                _step(row, log_probs, i, w, length_penalty, max_decode_len)
    return _result(state, max_decode_len, scorer.calls, rounds, draft_scorer.calls)
