"""What beam search and speculative beam search share: the result, the brevity penalty and the
argument checks (the jitted searches in beam/search.py, the host-driven reference in
beam/reference.py)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import numpy as np

from speculative.decode import contract, validation

Array = jax.Array

EOS_ID = contract.EOS_ID
NEG_INF = -1.0e7  # T5X's decoding.NEG_INF


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


def _check(inputs, beam_size: int, max_decode_len: int, length_penalty: float,
           model=None, cached: bool = False, *, draft=None, gamma: Optional[int] = None,
           time_limit_s=validation.DEFAULT_LIMIT) -> np.ndarray:
    """The decode loops' input rules (`validation`), before any forward: ids in the model's
    vocabulary, a token in every row, counts >= 1, a forward (or, `cached`, the jitted
    search's KV cache and sequences) that fits in memory, and a worst case (no beam ends)
    within `time_limit_s` (`validation.bounded_work`; with `draft` and `gamma`, the
    speculative search's rounds)."""
    validation.positive_int(beam_size, "beam_size", "beams kept per input")
    validation.positive_int(max_decode_len, "max_decode_len", "tokens generated at most")
    if isinstance(length_penalty, (bool, np.bool_)) or not isinstance(
            length_penalty, (int, float, np.integer, np.floating)) or \
            not np.isfinite(length_penalty):
        raise ValueError(f"length_penalty={length_penalty!r} is invalid: give a finite float "
                         "(T5X uses 0.6; 0 = no length penalty).")
    vocab = getattr(model, "vocab_size", None)
    ids = validation.token_ids(inputs, vocab if vocab is not None else np.iinfo(np.int32).max,
                               needs_token_per_row=True)
    cache_bytes = validation.cache_bytes(model, ids.shape[0] * beam_size,
                                         max_decode_len + 1) if cached else None
    if cache_bytes is not None:
        validation.fits_memory(
            cache_bytes,
            f"the KV cache of beam search over batch {ids.shape[0]} x beam {beam_size} x "
            f"max_decode_len={max_decode_len}", "lower max_decode_len or the batch size")
    elif vocab is not None:  # each forward returns [rows, max_decode_len, V] float32 log-probs
        validation.fits_memory(
            ids.shape[0] * beam_size * max_decode_len * vocab * 4,
            f"beam search over batch {ids.shape[0]} x beam {beam_size} x "
            f"max_decode_len={max_decode_len}", "lower max_decode_len or the batch size")
    if not contract.missing(model, contract.DecodeModel):
        models = (model,) if draft is None else (model, draft)
        validation.bounded_work(
            models, ids.shape[0], ids.shape[1], max_decode_len,
            ("speculative " if draft is not None else "") + "beam search",
            time_limit_s=time_limit_s, gamma=None if draft is None else gamma, beams=beam_size,
            gather=cached, recompute=not cached)
    return ids


def _check_speculative(target, draft, inputs, beam_size, draft_beam, gamma, max_decode_len,
                       length_penalty, cached: bool, min_draft_beam) -> np.ndarray:
    """`draft`: the draft model. `min_draft_beam`: (the least draft_beam the search takes, the
    message saying why)."""
    validation.positive_int(gamma, "gamma", "draft steps per round")
    inputs = _check(inputs, beam_size, max_decode_len, length_penalty, target, cached=cached,
                    draft=draft, gamma=gamma)
    least, why = min_draft_beam
    if isinstance(draft_beam, bool) or not isinstance(draft_beam, (int, np.integer)) or (
            draft_beam < least):
        raise ValueError(f"draft_beam={draft_beam!r} is invalid: give an int >= {why}.")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft vocab_size={draft.vocab_size} differs from the target's "
                         f"{target.vocab_size}.")
    return inputs


def _encoder_decoder(model, name: str, input_length: int) -> None:
    """TypeError unless `model` is a DecodeModel whose decoder starts empty (beam search keeps
    every beam's prefix from BOS)."""
    if contract.missing(model, contract.DecodeModel) or model.prefix_length(input_length) != 0:
        raise TypeError(f"beam search needs an encoder-decoder {name} (EncoderDecoderModel); "
                        f"got {type(model).__name__}.")
