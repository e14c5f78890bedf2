"""Predictions as an inference run (`runs/infer.py`) writes them: one record per example
(`row_records`, or `beam_records` for beam search, `score_records` for mode 'score': the
lines of `<task>-<mode>.jsonl-<shard>-of-<num_shards>`, in T5X's layout: `inputs` holds the
pretokenized features, beside `prediction` or `score`) and the run's
decoding summary over its batches (`decode_summary`, `beam_summary`) and task metrics
(`task_metrics`) for metrics.json."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import jax
import numpy as np

from speculative import files
from speculative.beam import search as beam_lib
from speculative.decode import contract
from speculative.decode import stats as stats_lib


@dataclasses.dataclass
class Example:
    """One task example: texts, its input ids (possibly truncated) and its original length."""

    index: int
    inputs_text: str
    targets_text: str
    input_ids: np.ndarray  # [<= L_in] int32: encoder input (ends with EOS), or prompt
    input_length: int  # before truncation
    truncated: bool
    target_ids: Optional[np.ndarray] = None  # [<= N] int32: the given target (mode 'score')


def inputs_field(ex: Example) -> Dict[str, str]:
    """T5X's `inputs` of a line: the example's pretokenized features."""
    return {"inputs_pretokenized": ex.inputs_text, "targets_pretokenized": ex.targets_text}


def record(ex: Example, ids: List[int], vocabulary, max_decode_len: int) -> Dict[str, Any]:
    """The fields every prediction record has: the example, the prediction and how it ended."""
    ended = bool(ids and ids[-1] == contract.EOS_ID)
    return {"index": ex.index, "inputs": inputs_field(ex),
            "prediction": vocabulary.decode(ids), "prediction_tokens": ids,
            "input_length": ex.input_length, "input_truncated": ex.truncated,
            "ended_with_eos": ended,
            "hit_max_decode_len": bool(len(ids) >= max_decode_len and not ended)}


def row_records(examples, result, vocabulary, max_decode_len) -> List[Dict[str, Any]]:
    tokens = np.asarray(result.tokens)
    lengths = np.asarray(result.lengths)
    st = jax.device_get(result.stats)
    records = []
    for row, ex in enumerate(examples):
        n = int(lengths[row])
        ids = tokens[row, :n].tolist()
        tested = int(st.tested[row])
        calls = int(st.target_calls[row])
        records.append({
            **record(ex, ids, vocabulary, max_decode_len),
            "generated": int(st.generated[row]),
            "target_calls": calls,
            "draft_calls": int(st.draft_calls[row]),
            "drafted": int(st.drafted[row]),
            "accepted": int(st.accepted[row]),
            "tested": tested,
            "beta_sum": float(st.beta_sum[row]),
            "alpha": float(st.beta_sum[row]) / tested if tested else None,
            "tokens_per_target_call": int(st.generated[row]) / calls if calls else None,
            "accepted_per_position": np.asarray(st.accepted_per_position[row]).tolist(),
        })
    return records


def decode_summary(stats: List[stats_lib.DecodeStats], rows: List[int]) -> Dict[str, Any]:
    """The run's statistics: `stats_lib.merge_stats` over its batches (filler rows left out)."""
    total = stats_lib.merge_stats(stats, rows).summary()
    return {
        "alpha": files.json_ready(total["alpha"]),
        "tokens_per_target_call": files.json_ready(total["tokens_per_target_call"]),
        "generated_tokens": total["generated"],
        "mean_generated": total["generated"] / sum(rows),
        "target_calls": total["target_calls"],
        "target_forwards": total["rounds"],  # batched target calls the run paid for
        "draft_calls": total["draft_calls"],
        "drafted": total["drafted"],
        "accepted": total["accepted"],
        "accepted_per_position": total["accepted_per_position"],
    }


def best_beam(tokens: np.ndarray) -> List[int]:
    """A beam's tokens up to and including its EOS (all of them if it has none)."""
    ids = tokens.tolist()
    return ids[:ids.index(contract.EOS_ID) + 1] if contract.EOS_ID in ids else ids


def beam_records(examples, result: beam_lib.BeamSearchResult, vocabulary,
                 max_decode_len) -> List[Dict[str, Any]]:
    """One record per example: the best beam as the prediction, every beam with its score.
    Target calls are the batch's (a beam-search forward serves all its rows at once)."""
    records = []
    for row, ex in enumerate(examples):
        beams = [best_beam(result.sequences[row, k]) for k in range(result.sequences.shape[1])]
        records.append({
            **record(ex, beams[0], vocabulary, max_decode_len),
            "score": files.json_ready(float(result.scores[row, 0])),
            "beams": [{"prediction": vocabulary.decode(b), "score": files.json_ready(float(s))}
                      for b, s in zip(beams, result.scores[row])],
            "generated": len(beams[0]),
        })
    return records


def beam_summary(results: List[beam_lib.BeamSearchResult], rows: List[int]) -> Dict[str, Any]:
    """Target forwards, against the forwards of the target's own beam search on the same
    batches (one per step of a batch's longest search: `max(row_steps)`); the speculative
    search makes one per round, and `target_calls_saved` is the fraction it saved."""
    calls = sum(r.target_calls for r in results)
    alone = sum(int(np.max(r.row_steps[:n])) for r, n in zip(results, rows))
    generated = sum(len(best_beam(r.sequences[b, 0])) for r, n in zip(results, rows)
                    for b in range(n))
    return {
        "generated_tokens": generated,
        "mean_generated": generated / sum(rows),
        "target_calls": calls,
        "target_forwards": calls,
        "target_alone_forwards": alone,
        "target_calls_saved": 1.0 - calls / alone if alone else None,
        "rounds": sum(r.rounds for r in results),
        "draft_calls": sum(r.draft_calls for r in results),
    }


def score_records(examples, scores) -> List[Dict[str, Any]]:
    """Mode 'score': one record per example, T5X's `score` (the target's log-likelihood of the
    given target, summed over its tokens) beside the inputs."""
    return [{"index": ex.index, "inputs": inputs_field(ex),
             "score": files.json_ready(float(score)), "target_length": len(ex.target_ids)}
            for ex, score in zip(examples, scores)]


def task_metrics(task, records) -> Dict[str, float]:
    """The task's metrics of the predictions against the references ({} without references:
    an INPUT_FILE of inputs alone)."""
    targets = [r["inputs"]["targets_pretokenized"] for r in records]
    if not all(targets) or "prediction" not in records[0]:
        return {}
    predictions = [r["prediction"] for r in records]
    metrics = {}
    for fn in task.predict_metric_fns:
        metrics.update({k: float(v) for k, v in fn(targets, predictions).items()})
    return metrics
