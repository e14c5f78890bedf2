"""The host-driven beam searches: the references the jitted ones in `beam_search` are tested
against.

`host_beam_search` is T5X's beam search as a Python loop over steps around a fixed-shape
teacher-forcing forward that recomputes every prefix; `host_speculative_beam_search` is the
speculative search (paper A.4) the same way, over rounds. With forwards of the same shape the
two are equal bit for bit (`beam_search(..., rows=batch * (beam_size + draft_beam))`), and the
jitted searches equal them to float32 round-off. Slow (every forward re-reads the whole
prefix): for tests and for the walltime comparison of `experiments/beam.py`, not for users.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from speculative.beam.checks import (
    EOS_ID,
    NEG_INF,
    BeamSearchResult,
    _check,
    _check_speculative,
    brevity_penalty,
)
from speculative.decode import contract, drafters


@contract.jit_by_class
def _log_probs(model, encoder_inputs, decoder_tokens):
    """Log-softmax of teacher-forcing logits `[R, N, V]` through the decode contract (one
    `extend` of the whole prefix); position t is the distribution of the token after
    `decoder_tokens[:, :t]` (BOS first)."""
    state = model.init(model.params, encoder_inputs, decoder_tokens.shape[1] + 1)
    tokens = jnp.concatenate([state.pending[:, None], decoder_tokens[:, :-1]], axis=1)
    logits, _ = model.extend(model.params, state, tokens)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


class _Scorer:
    """Fixed-shape forwards of one model: `rows` sequences of length `length` per call."""

    def __init__(self, model, inputs: np.ndarray, rows: int, length: int):
        if model.prefix_length(np.shape(inputs)[1]) != 0:
            raise TypeError(f"beam search needs encoder-decoder models whose decoder starts "
                            f"empty (EncoderDecoderModel, or a separate draft); got "
                            f"{type(model).__name__}.")
        self.model = model
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
        return np.asarray(_log_probs(self.model, enc, dec))[:len(sequences)]


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
    draft = drafters.as_drafter(draft, gamma).own_model(
        "The host-driven speculative beam search")
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
