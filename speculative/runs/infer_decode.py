"""Stage 4 of inference (`runs/infer.py`): decode the batches in chunks, as the plan says.

    for chunk in decode_chunks(settings, plan, target, draft, examples, all_batches, vocab,
                               done=completed):
        writer.write_chunk(chunk)

A chunk is `CHECKPOINT_PERIOD` consecutive batches (T5X's `checkpoint_period`); chunks in
`done` (already written by an interrupted run) are skipped. Batch i decodes with
`fold_in(PRNGKey(seed), i)` whatever chunk it falls in, so a resumed run gives the same lines
as an uninterrupted one. The first batch decoded is run once untimed (the compile; every
batch has the same shapes) unless the plan brings the calibration's results for the first
batches, which are then taken as they are. Decoding stops at the first batch whose decode
met a non-finite distribution (no text from NaN).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Iterator, List

import jax
import numpy as np

from speculative.beam import search as beam_lib
from speculative.decode import loops as decoding
from speculative.runs import infer_score, predictions
from speculative.runs.infer_choice import DecodePlan
from speculative.runs.infer_encode import sharded, target_batch
from speculative.runs.infer_settings import InferSettings


@dataclasses.dataclass
class Chunk:
    """One chunk's output.

    Attributes:
      index: the chunk's number (0, 1, ...).
      records: its lines (predictions.py's records), in example order.
      stats: one entry per batch: its `DecodeStats`, `BeamSearchResult` or (mode 'score') None.
      rows: each batch's real rows (a last partial batch is padded).
      seconds: decode seconds (compilation excluded).
      compile_seconds: the untimed first decode, where this chunk made it.
    """

    index: int
    records: List[Dict[str, Any]]
    stats: List[Any]
    rows: List[int]
    seconds: float = 0.0
    compile_seconds: float = 0.0


def decode_batch(settings: InferSettings, plan: DecodePlan, target, draft, inputs: np.ndarray,
                 rng):
    """A `decoding.DecodeResult`, a `beam_lib.BeamSearchResult` (beam modes), or the scores
    `[B]` (mode 'score', where `inputs` is `(inputs, targets)`)."""
    if plan.mode == "score":
        return infer_score.log_likelihoods(target, *inputs)
    if plan.beams:
        kw = dict(beam_size=settings.beam_size, max_decode_len=settings.max_decode_len,
                  length_penalty=settings.length_penalty)
        if plan.mode == "beam_search":
            return beam_lib.beam_search(target, inputs, **kw)
        return beam_lib.speculative_beam_search(
            target, draft, inputs, draft_beam=plan.draft_beam, gamma=plan.gamma,
            draft_branch=plan.draft_branch, **kw)
    inputs = sharded(inputs, target)  # rows split over the mesh's 'data' axis
    if plan.speculative:
        if draft is None:
            raise ValueError("speculative=True needs a draft model; load it with load_models.")
        return decoding.speculative_decode(
            target, draft, inputs, rng=rng, gamma=plan.gamma, sampling=settings.sampling,
            max_decode_len=settings.max_decode_len, lenience=settings.lenience)
    return decoding.autoregressive_decode(
        target, inputs, rng=rng, sampling=settings.sampling,
        max_decode_len=settings.max_decode_len)


def gathered(result):
    """The whole batch's result on this host: in a multi-process job the rows live on several
    hosts' devices and are all-gathered; otherwise the result as it is."""
    if jax.process_count() == 1 or isinstance(result, beam_lib.BeamSearchResult):
        return result
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return multihost_utils.process_allgather(result, tiled=True)


def _records(settings, plan, rows, result, vocabulary, where):
    if plan.mode == "score":
        return None, predictions.score_records(rows, np.asarray(result)[:len(rows)])
    if plan.beams:
        return result, predictions.beam_records(rows, result, vocabulary,
                                                settings.max_decode_len)
    result.stats.check_finite(where)  # no text from NaN
    return result.stats, predictions.row_records(rows, result, vocabulary,
                                                 settings.max_decode_len)


def decode_chunks(settings: InferSettings, plan: DecodePlan, target, draft, examples,
                  all_batches, vocabulary, done=frozenset()) -> Iterator[Chunk]:
    """Yields each chunk not in `done`, decoded (module docstring)."""
    key = jax.random.PRNGKey(settings.seed)
    drafter = plan.drafter(draft)
    period = settings.checkpoint_period
    starts = np.cumsum([0] + [n for _, n in all_batches])  # each batch's first example
    reused = dict(enumerate(plan.reused))
    compiled = bool(reused)

    def inputs_of(i):
        inputs, num_real = all_batches[i]
        if plan.mode != "score":
            return inputs
        rows = examples[starts[i]:starts[i] + num_real]
        return inputs, target_batch(rows, settings.batch_size, settings.max_decode_len)

    def run(i):
        return gathered(jax.block_until_ready(decode_batch(
            settings, plan, target, drafter, inputs_of(i), jax.random.fold_in(key, i))))

    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    progress = tqdm(total=len(all_batches), desc=f"{plan.mode} decoding", unit="batch",
                    disable=not settings.progress)
    for index, first in enumerate(range(0, len(all_batches), period)):
        last = min(first + period, len(all_batches))
        if index in done:
            progress.update(last - first)
            continue
        chunk = Chunk(index, [], [], [])
        if not compiled:  # compile (and one decode of this batch), untimed below
            start = time.perf_counter()
            result = run(first)
            chunk.compile_seconds = time.perf_counter() - start
            if not plan.beams and plan.mode != "score":  # broken weights show here
                result.stats.check_finite(f"{plan.mode} decoding, first batch")
            compiled = True
        for i in range(first, last):
            if i in reused:
                result, seconds = reused[i]
                result = gathered(result)
            else:
                start = time.perf_counter()
                result = run(i)
                seconds = time.perf_counter() - start
            num_real = all_batches[i][1]
            rows = examples[starts[i]:starts[i] + num_real]
            stats, records = _records(settings, plan, rows, result, vocabulary,
                                      f"{plan.mode} decoding, batch {i}")
            chunk.records += records
            chunk.stats.append(stats)
            chunk.rows.append(num_real)
            chunk.seconds += seconds
            progress.update(1)
        yield chunk
    progress.close()
