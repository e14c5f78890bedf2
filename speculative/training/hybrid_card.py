"""The hybrid draft's model-card entry: a bundled T5 draft plus prompt lookup (models/hybrid.py),
with its alpha measured as the card measures every draft's.

    add_hybrid_draft(bundles.DOCSTRINGS, "docstring_draft_s", name="docstring_hybrid")

The entry (`kind` 'hybrid') holds no weights: it names the T5 draft it wraps and the n-gram
lengths the copy trusts; `Bundle.load` builds the `HybridDraft` from it. Alpha (T = 0 and 1,
gamma 4) is measured against the draft's target on the first `alpha_sentences` valid inputs,
as `training.train` measures a T5 draft's, so the card's rows compare.
"""

from __future__ import annotations

import time
from typing import Optional

import jax
import numpy as np

from speculative.data import bundles
from speculative.training.distillation import update_card
from speculative.training.evaluation import draft_alpha, num_params


def add_hybrid_draft(bundle: bundles.Bundle, draft: str, *, name: str, min_ngram: int = 2,
                     max_ngram: int = 3, alpha_sentences: int = 256, gamma: int = 4,
                     seed: int = 0, description: Optional[str] = None) -> dict:
    """Measures the hybrid of `draft` and writes its entry `name` into `bundle`'s card."""
    if not bundle.is_t5(draft):
        raise ValueError(f"draft={draft!r} is not a bundled T5 draft of {bundle.name}; the "
                         f"hybrid wraps one of {bundle.t5_drafts()}.")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"min_ngram={min_ngram}, max_ngram={max_ngram}: need 1 <= min_ngram "
                         "<= max_ngram.")
    target_name = bundle.target_of(draft)
    entry = {"kind": bundles.HYBRID, "draft": draft, "min_ngram": min_ngram,
             "max_ngram": max_ngram, "target": target_name,
             "description": description or f"prompt lookup where the trailing n-gram "
             f"(n >= {min_ngram}) occurs in the input or the output so far, {draft} elsewhere"}
    start = time.time()
    target, hybrid = bundle.load(target_name), bundle.hybrid(entry)
    [inputs] = bundle.batches(alpha_sentences, alpha_sentences, split="valid")
    entry["params"] = num_params(hybrid.params)
    entry["alpha"] = draft_alpha(target, hybrid, list(np.asarray(inputs)),
                                 rng=jax.random.PRNGKey(seed), gamma=gamma,
                                 max_length=bundle.max_decode_len,
                                 input_length=bundle.input_length)
    entry["alpha_wall_s"] = round(time.time() - start, 1)
    update_card(bundle.models_dir, name, entry)
    return entry
