"""Run functions of the target-aware draft: cache the target's features, train, export.

    python scripts/train.py --run=feature_cache --gin_file=configs/runs/feature_draft.gin \
        --gin.FEATURE_CACHE="'out/feature_cache/greedy'"
    python scripts/train.py --run=feature_draft --gin_file=configs/runs/feature_draft.gin ...

The sources are the bundled training sources and the 29,650 unseen ones (`mono_en.txt`),
interleaved (shard k holds both kinds), so a cache stopped after k shards is a fair sample.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import gin
import jax
import numpy as np

from speculative import feature_data, training
from speculative.runs import mini


def distill_sources(length: int = 48) -> np.ndarray:
    """`[n, length]` encoder inputs: training sources and unseen sources, alternating, in file
    order; sources longer than `length` tokens (prefix and EOS included) are left out."""
    vocab = mini.Vocabulary()
    train = [s for s, _ in training.load_pairs(os.path.join(mini.BUNDLE_DIR, "train.tsv"))]
    mono = training.load_sources(os.path.join(mini.BUNDLE_DIR, "mono_en.txt"))
    rows = []
    for group in (train, mono):
        ids = [x for x in vocab.encode_inputs(group) if len(x) <= length]
        rows.append(ids)
    merged = []
    for k in range(max(len(r) for r in rows)):
        merged += [r[k] for r in rows if k < len(r)]
    return training.pad_rows([np.asarray(x, np.int32) for x in merged], length)


@gin.configurable(denylist=["cache_dir"])
def feature_cache(cache_dir: str, target: str = mini.LARGE_TARGET,
                  feature_layers: Sequence[int] = (2, 4, 6), temperature: float = 0.0,
                  max_shards: Optional[int] = None, shard_size: int = 2048, seed: int = 0):
    """Builds (or resumes) the feature cache of bundled `target` in `cache_dir`."""
    model = mini.load(target)
    return feature_data.build(cache_dir, model.module, model.params, distill_sources(),
                              target_name=target, feature_layers=tuple(feature_layers),
                              temperature=temperature, shard_size=shard_size, seed=seed,
                              max_shards=max_shards)
