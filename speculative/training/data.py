"""The trainer's examples: id pairs cut to length and length-bucketed, padded batches (the
corpora's pairs, tokenizer and language-model chunks are `speculative.data.text`'s)."""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from speculative.data.text import Example, Tokenizer
from speculative.decode.contract import EOS_ID
from speculative.training.config import TrainConfig


def _fit(ids: Sequence[int], max_len: int, truncate: bool) -> Optional[np.ndarray]:
    if len(ids) <= max_len:
        return np.asarray(ids, np.int32)
    return np.asarray(list(ids[:max_len - 1]) + [EOS_ID], np.int32) if truncate else None


def make_examples(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                  max_length: int, truncate: bool = False) -> Tuple[List[Example], int]:
    """Pairs of id lists (each ending in EOS) -> (examples, how many were dropped)."""
    fitted = [(_fit(x, max_length, truncate), _fit(y, max_length, truncate))
              for x, y in zip(inputs, targets)]
    examples = [(x, y) for x, y in fitted if x is not None and y is not None]
    return examples, len(fitted) - len(examples)


def tokenize_pairs(pairs, tokenizer: Tokenizer, config: TrainConfig) -> Tuple[List[Example], int]:
    """(source, target) strings -> (examples, dropped count), per `config.truncate`."""
    return make_examples(tokenizer.encode_inputs([s for s, _ in pairs]),
                         tokenizer.encode_targets([t for _, t in pairs]),
                         config.max_length, config.truncate)


def pad_rows(rows: Sequence[np.ndarray], length: int, num_rows: Optional[int] = None) -> np.ndarray:
    """Right-pads arrays `[l, ...]` with 0 into `[num_rows, length, ...]` (extra rows all
    padding); int32 for id rows, else the rows' dtype."""
    first = np.asarray(rows[0]) if len(rows) else np.zeros((0,), np.int32)
    dtype = np.int32 if np.issubdtype(first.dtype, np.integer) else first.dtype
    out = np.zeros((num_rows or len(rows), length) + first.shape[1:], dtype)
    for i, r in enumerate(rows):
        if len(r) > length:
            raise ValueError(f"Row {i} has {len(r)} tokens, more than the padded length {length}.")
        out[i, :len(r)] = r
    return out


def batches(examples: Sequence[Example], buckets: Sequence[int], batch_tokens: int, *,
            rng: Optional[np.random.Generator] = None) -> Iterator[Tuple[np.ndarray, ...]]:
    """One pass over `examples` as padded `(inputs [B, L], targets [B, L])` batches (and, for
    examples with a teacher's distributions, `teacher ids [B, L, k]`, `teacher probs [B, L, k]`).

    B = batch_tokens // L per bucket; the last batch of a bucket is filled with all-zero rows
    (zero loss weight). With `rng`, examples are shuffled within buckets and batches across
    buckets; without it, buckets come in order with examples in their original order.
    """
    groups = [[] for _ in buckets]
    for i, (x, y, *_) in enumerate(examples):
        b = int(np.searchsorted(buckets, max(len(x), len(y))))  # smallest bucket >= length
        if b == len(buckets):
            raise ValueError(f"Example {i} has {max(len(x), len(y))} tokens, more than the "
                             f"largest bucket {buckets[-1]}; drop or truncate it first.")
        groups[b].append(i)
    plan = []
    for b, idx in enumerate(groups):
        idx = np.asarray(idx, np.int64)
        if rng is not None:
            idx = rng.permutation(idx)
        rows = max(1, batch_tokens // buckets[b])
        plan += [(b, idx[s:s + rows], rows) for s in range(0, len(idx), rows)]
    order = rng.permutation(len(plan)) if rng is not None else range(len(plan))
    for k in order:
        b, idx, rows = plan[k]
        yield tuple(pad_rows([examples[i][f] for i in idx], buckets[b], rows)
                    for f in range(len(examples[idx[0]])))
