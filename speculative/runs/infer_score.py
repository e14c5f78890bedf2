"""Stage 5 of inference (`runs/infer.py`): score the run, and T5X's mode 'score'.

    summary, metrics = score(task, plan_mode, stats, rows, records)   # metrics.json's numbers
    infer_score.log_likelihoods(target, inputs, targets)              # mode 'score': [B]

`score` gives the decoding summary (alpha, tokens per target call, target calls; the beam
searches' forwards against the target's own) and the task's metrics of the predictions
against their references (BLEU, ROUGE; {} where there are no references, e.g. an INPUT_FILE
of inputs alone).

Mode 'score' (T5X's `infer.mode = 'score'`): each example's `score` is the target's
teacher-forced log-probability of its given target, summed over the target's tokens (its EOS
included; padding left out), as T5X's `score_batch` sums the per-token log-likelihoods. It
runs through the decode contract: the target's `init` on the inputs, then one `extend` over
`[pending token, target[:-1]]`, whose logits at position i are the distribution of
`target[i]` (float32 log-softmax).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import contract
from speculative.runs import predictions


@functools.partial(jax.jit, static_argnames=("max_len",))
def _log_likelihoods(model, inputs, targets, max_len: int):
    state = model.init(model.params, inputs, max_len)
    tokens = jnp.concatenate([state.pending[:, None], targets[:, :-1]], axis=1)
    logits, _ = model.extend(model.params, state, tokens)  # [B, N, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, N]
    # The target's tokens: up to its first EOS (included), or all of them without one.
    is_eos = targets == contract.EOS_ID
    ends = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1) + 1,
                     jnp.sum(targets != contract.PAD_ID, 1))
    mask = jnp.arange(targets.shape[1])[None] < ends[:, None]
    return jnp.sum(jnp.where(mask, picked, 0.0), axis=1)


def log_likelihoods(target, inputs: np.ndarray, targets: np.ndarray) -> jax.Array:
    """`[B]` float32: log p(targets[b] | inputs[b]) under `target` (a `DecodeModel`), summed
    over each target's tokens. `inputs [B, L_in]` and `targets [B, N]` right-padded with 0."""
    inputs = jnp.asarray(inputs, jnp.int32)
    targets = jnp.asarray(targets, jnp.int32)
    if targets.ndim != 2 or targets.shape[0] != inputs.shape[0]:
        raise ValueError(f"targets has shape {targets.shape} for inputs {inputs.shape}; give "
                         "[B, N] targets, one row per input.")
    max_len = target.prefix_length(inputs.shape[1]) + targets.shape[1] + 2
    return _log_likelihoods(target, inputs, targets, max_len=max_len)


def score(task, mode: str, stats: List[Any], rows: List[int],
          records: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, float]]:
    """`(summary, task_metrics)` of a run's batches (`stats`, each with its real `rows`)."""
    if mode == "score":
        scores = [r["score"] for r in records if r["score"] is not None]
        tokens = sum(r["target_length"] for r in records)
        return {"mean_score": float(np.mean(scores)) if scores else None,
                "target_tokens": tokens,
                "score_per_token": float(np.sum(scores)) / tokens if tokens else None,
                "generated_tokens": 0}, {}
    summarise = (predictions.beam_summary if mode.endswith("beam_search")
                 else predictions.decode_summary)
    return summarise(stats, rows), predictions.task_metrics(task, records)
