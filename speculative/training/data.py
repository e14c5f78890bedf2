"""The trainer's examples: id pairs cut to length and length-bucketed, padded batches (the
corpora's pairs, tokenizer and language-model chunks are `speculative.data.text`'s)."""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from speculative.data.text import Example, Tokenizer
from speculative.decode.contract import EOS_ID
from speculative.training.train_config import TrainConfig


def _fit(ids: Sequence[int], max_len: int, truncate: bool) -> Optional[np.ndarray]:
    if len(ids) <= max_len:
        return np.asarray(ids, np.int32)
    return np.asarray(list(ids[:max_len - 1]) + [EOS_ID], np.int32) if truncate else None


def make_examples(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                  max_length: int, truncate: bool = False,
                  target_length: Optional[int] = None) -> Tuple[List[Example], int]:
    """Pairs of id lists (each ending in EOS) -> (examples, how many were dropped); targets
    are held to `target_length` where given, else to `max_length` as the inputs."""
    target_length = target_length or max_length
    fitted = [(_fit(x, max_length, truncate), _fit(y, target_length, truncate))
              for x, y in zip(inputs, targets)]
    examples = [(x, y) for x, y in fitted if x is not None and y is not None]
    return examples, len(fitted) - len(examples)


def tokenize_pairs(pairs, tokenizer: Tokenizer, config: TrainConfig) -> Tuple[List[Example], int]:
    """(source, target) strings -> (examples, dropped count), per `config.truncate`."""
    return make_examples(tokenizer.encode_inputs([s for s, _ in pairs]),
                         tokenizer.encode_targets([t for _, t in pairs]),
                         config.input_length, config.truncate, config.target_length)


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
            rng: Optional[np.random.Generator] = None,
            target_buckets: Sequence[int] = ()) -> Iterator[Tuple[np.ndarray, ...]]:
    """One pass over `examples` as padded `(inputs [B, L], targets [B, L])` batches (and, for
    examples with a teacher's distributions, `teacher ids [B, L, k]`, `teacher probs [B, L, k]`).

    B = batch_tokens // L per bucket; the last batch of a bucket is filled with all-zero rows
    (zero loss weight). With `target_buckets`, inputs and targets are bucketed apart (inputs by
    `buckets`, targets and the teacher's arrays by `target_buckets`; B = batch_tokens //
    max(Li, Lt)), so short targets of long inputs are not padded to the input's length. With
    `rng`, examples are shuffled within buckets and batches across buckets; without it,
    buckets come in order with examples in their original order.
    """
    def bucket(i, length, lengths):
        b = int(np.searchsorted(lengths, length))  # the smallest bucket >= length
        if b == len(lengths):
            raise ValueError(f"Example {i} has {length} tokens, more than the largest bucket "
                             f"{lengths[-1]}; drop or truncate it first.")
        return b

    groups = {}
    for i, (x, y, *_) in enumerate(examples):
        key = ((bucket(i, len(x), buckets), bucket(i, len(y), target_buckets)) if target_buckets
               else (bucket(i, max(len(x), len(y)), buckets),) * 2)
        groups.setdefault(key, []).append(i)
    plan = []
    for key in sorted(groups):
        idx = np.asarray(groups[key], np.int64)
        if rng is not None:
            idx = rng.permutation(idx)
        lengths = (buckets[key[0]], (target_buckets or buckets)[key[1]])
        rows = max(1, batch_tokens // max(lengths))
        plan += [(lengths, idx[s:s + rows], rows) for s in range(0, len(idx), rows)]
    order = rng.permutation(len(plan)) if rng is not None else range(len(plan))
    for k in order:
        lengths, idx, rows = plan[k]
        yield tuple(pad_rows([examples[i][f] for i in idx], lengths[min(f, 1)], rows)
                    for f in range(len(examples[idx[0]])))
