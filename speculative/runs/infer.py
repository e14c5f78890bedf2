r"""Inference over a seqio task or your own inputs, with speculative decoding (or the baseline).

The run behind `scripts/infer.py` and `configs/runs/infer.gin` (T5X's `infer.py`, plus a draft
model):

    python scripts/infer.py --gin_file=configs/runs/infer.gin \
      --gin_file=configs/models/t5_1_1_xxl.gin --gin_file=configs/models/t5_1_1_small.gin \
      --gin.TARGET_MODEL="@t5_1_1_xxl/t5.T5Config()" \
      --gin.DRAFT_MODEL="@t5_1_1_small/t5.T5Config()" \
      --gin.CHECKPOINT_PATH=\"/ckpt/xxl\" --gin.DRAFT_CHECKPOINT=\"/ckpt/small\" \
      --gin.MIXTURE_OR_TASK_NAME=\"wmt_t2t_ende_v003\" \
      --gin.TASK_FEATURE_LENGTHS="{'inputs': 256, 'targets': 256}" \
      --gin.INFER_OUTPUT_DIR=\"/tmp/infer\"

`run` is a pipeline of stages, each in its own module, over one frozen `InferSettings`
(resolved once from gin; no stage changes it):

  1. read inputs (`infer_inputs`): the task's split in order, or INPUT_FILE's lines (text,
     .tsv, .jsonl; a malformed line is named before any model loads); this shard's share;
  2. encode (`infer_encode`): a file's text with the task's prefix and vocabulary; inputs
     fitted to `TASK_FEATURE_LENGTHS['inputs']` (too-long ones truncated and counted, or an
     error with `truncate_inputs=False`); fixed-shape batches `[B, L_in]`, a partial last
     batch padded with copies of its last row (dropped from every output);
     then the models (`infer_models`): target and draft, random weights without a checkpoint;
  3. choose speculation (`infer_choice`): a frozen `DecodePlan` (GAMMA 'auto' times the
     candidates on the first batches and runs the fastest, no speculation included, or, with
     no time to time them, takes Theorem 3.8's prior checked on those batches; a choice made
     before on this host is read from `calibration_cache`; beam search times the plain search
     against the speculative one); the run's last log line repeats what runs and why
     (metrics.json's `decision`);
  4. decode in chunks (`infer_decode`): CHECKPOINT_PERIOD batches a chunk, batch i with key
     `fold_in(PRNGKey(seed), i)`; mode 'score' scores the given targets instead;
  5. score (`infer_score`): alpha, tokens per target call, the task's metric (BLEU, ROUGE)
     where there are references;
  6. write (`infer_output`): each chunk with its completion marker, then T5X's
     `<task>-<mode>.jsonl-<shard:05d>-of-<num_shards:05d>`, metrics.json and config.gin.
     A killed run, run again, resumes after its last complete chunk.

`decoder_only=True` (gin: DECODER_ONLY) decodes decoder-only (GPT-like) language models
(`t5.DecoderOnly`, configs with `num_encoder_layers = 0`) on a prompt -> continuation task such
as `stdlib_code`. Beam search needs an encoder-decoder model.

`alpha` is the paper's alpha (mean beta = sum_x min(p, q) over the drafted positions the accept
test examined); `tokens_per_target_call` is generated tokens / target calls (Eq. 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import gin
from absl import logging

from speculative.decode import validation
from speculative.runs import infer_choice, infer_decode, infer_encode, infer_inputs, infer_score
from speculative.runs import infer_models as models_lib
from speculative.runs.infer_choice import MIN_BEAM_SPEEDUP, DecodePlan, choose_beam_search
from speculative.runs.infer_encode import batches, fit_input
from speculative.runs.infer_models import load_models
from speculative.runs.infer_output import CONFIG_FILE, RunOutput, output_name
from speculative.runs.infer_settings import InferSettings, with_overrides
from speculative.runs.predictions import Example

# The stages' names as this module offered them before the split (tests, Table 2, scripts).
__all__ = ["InferResult", "InferSettings", "DecodePlan", "Example", "MIN_BEAM_SPEEDUP",
           "CONFIG_FILE", "batches", "choose_beam_search", "fit_input", "get_task", "infer",
           "load_examples", "load_models", "output_name", "run"]
get_task = infer_inputs.get_task


@dataclasses.dataclass
class InferResult:
    """What one inference run produced.

    Attributes:
      settings: the run's settings (as given; what ran is `plan`).
      plan: how it decoded (`infer_choice.DecodePlan`).
      metrics: metrics.json's contents.
      records: the output file's lines.
      output_files: {kind: path} of the files written ({} when nothing was written).
      task_metrics: the task's metrics of the predictions (e.g. {"bleu": ...}; {} for none).
      alpha: mean beta over the drafted positions (None without a draft).
      tokens_per_target_call: generated tokens per target call (None without one).
      tokens_per_second: generated tokens per decode second, compilation excluded.
    """

    settings: InferSettings
    plan: DecodePlan
    metrics: Dict[str, Any]
    records: List[Dict[str, Any]]
    output_files: Dict[str, str]
    task_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
    alpha: Optional[float] = None
    tokens_per_target_call: Optional[float] = None
    tokens_per_second: Optional[float] = None


def load_examples(settings: InferSettings, task=None) -> Tuple[Any, List[Example]]:
    """Stages 1 and 2: `(task, examples)`, read and encoded (nothing is loaded but data)."""
    task = task or get_task(settings)
    return task, infer_encode.encode(settings, task, infer_inputs.read_inputs(settings, task))


@contextlib.contextmanager
def _time_limit(seconds: Optional[float]):
    """TIME_LIMIT_S for the run's decode calls (`validation.TIME_LIMIT_S`), restored after."""
    saved = validation.TIME_LIMIT_S
    validation.TIME_LIMIT_S = seconds
    try:
        yield
    finally:
        validation.TIME_LIMIT_S = saved


def run(settings: InferSettings, models: Optional[Tuple[Any, Any]] = None,
        task=None, examples: Optional[List[Example]] = None) -> InferResult:
    """Runs the stages of the module docstring; `models`/`examples` may be passed preloaded."""
    output = RunOutput(settings, settings.mixture_or_task_name)
    output.check()  # an earlier run or an unwritable place is refused before any work
    if examples is None:
        task, examples = load_examples(settings, task)
    elif task is None:
        task = get_task(settings)
    vocabulary = task.output_features["targets"].vocabulary
    infer_encode.check_vocab(settings, vocabulary)
    all_batches = list(batches(examples, settings.batch_size, settings.input_length))
    cached = infer_choice.cached_choice(settings, len(all_batches))
    needs_draft = cached is None or cached.speculative  # a cached baseline loads no draft
    target, draft = (models if models is not None
                     else load_models(settings, with_draft=needs_draft))
    if settings.target_config is None:  # the architecture came from the checkpoint
        infer_encode.check_vocab(settings, vocabulary, target.vocab_size)
    models_lib.check_models(settings, task, target, draft if settings.drafts else None,
                            needs_draft=needs_draft)
    truncated = infer_encode.num_truncated(examples)
    if truncated:
        logging.warning("%d of %d inputs are longer than TASK_FEATURE_LENGTHS['inputs']=%d and "
                        "were truncated to %s (counted in metrics.json).", truncated,
                        len(examples), settings.input_length,
                        "their last L_in tokens" if settings.decoder_only
                        else "their first L_in - 1 tokens + EOS")
    num_chunks = -(-len(all_batches) // settings.checkpoint_period)
    with _time_limit(settings.time_limit_s):
        done, saved_plan = output.start()
        plan = (DecodePlan.from_json(saved_plan) if saved_plan is not None
                else infer_choice.choose(settings, target, draft, all_batches, cached))
        if plan.speculative and draft is None:  # a resumed plan that drafts, a cached baseline
            draft = models_lib.load_draft(settings, target)
        output.save_plan(plan.to_json())
        timing = {"decode_seconds": 0.0, "compile_seconds": 0.0}
        for chunk in infer_decode.decode_chunks(settings, plan, target, draft, examples,
                                                all_batches, vocabulary, done=done):
            output.write_chunk(chunk)
            timing["decode_seconds"] += chunk.seconds
            timing["compile_seconds"] += chunk.compile_seconds
    records, stats, rows = output.read_chunks(num_chunks)
    summary, task_metrics = infer_score.score(task, plan.mode, stats, rows, records)
    metrics = _metrics(settings, task.name, plan, timing, summary, task_metrics, examples,
                       records, len(all_batches), output.resumed)
    files = output.finish(num_chunks, metrics)
    tokens_per_second = metrics["timing"]["tokens_per_second"]
    _log_summary(plan, len(records), task_metrics, summary, tokens_per_second)
    logging.info("*** decoded with %s; why: %s ***", metrics["decision"]["choice"],
                 metrics["decision"]["reason"])
    return InferResult(settings=settings, plan=plan, metrics=metrics, records=records,
                       output_files=files, task_metrics=task_metrics,
                       alpha=summary.get("alpha"),
                       tokens_per_target_call=summary.get("tokens_per_target_call"),
                       tokens_per_second=tokens_per_second)


def _metrics(settings: InferSettings, task_name: str, plan: DecodePlan, timing, summary,
             task_metrics, examples: List[Example], records, num_batches: int,
             resumed: List[int]) -> Dict[str, Any]:
    """metrics.json's contents (without `files`)."""
    seconds = timing["decode_seconds"]
    reused = sum(s for _, s in plan.reused) if 0 not in resumed else 0.0
    tokens_per_second = summary["generated_tokens"] / seconds if seconds else None
    out = {
        "task": task_name,
        "split": settings.split if settings.input_file is None else None,
        "input_file": settings.input_file,
        "mode": plan.mode,
        # what decoded and why (infer_choice.decision): the closing summary's last line
        "decision": plan.decision or infer_choice.decision(settings, plan),  # an old plan
        "shard": {"shard_id": settings.shard_id, "num_shards": settings.num_shards},
        "num_examples": len(records),
        "metrics": task_metrics,
        "timing": {
            "decode_seconds": seconds,
            "compile_seconds": timing["compile_seconds"],
            # GAMMA 'auto': timing the choices (their compilations included) on the first inputs
            "calibration_seconds": plan.calibration_seconds if 0 not in resumed else 0.0,
            "run_seconds": (seconds - reused + timing["compile_seconds"]
                            + (plan.calibration_seconds if 0 not in resumed else 0.0)),
            "tokens_per_second": tokens_per_second,
            "examples_per_second": len(records) / seconds if seconds else None,
            "num_batches": num_batches,
            "resumed_chunks": resumed,
            "note": "decode_seconds excludes compilation: the first batch is decoded once "
                    "untimed (compile_seconds) and then timed with the others; with GAMMA "
                    "'auto' the calibration (calibration_seconds) compiles instead, and the "
                    "calibration batches' results are the chosen program's, timed there. "
                    "run_seconds = decode + compile + calibration, less the calibration "
                    "batches' share of decode_seconds (already in calibration_seconds): what "
                    "to compare. A resumed run times only the chunks it decoded.",
        },
        "decoding": summary,
        "inputs": {"feature_length": settings.input_length,
                   "num_truncated": infer_encode.num_truncated(examples),
                   "max_input_length": max(ex.input_length for ex in examples),
                   "truncate_inputs": settings.truncate_inputs},
        "targets": {"max_decode_len": settings.max_decode_len,
                    "num_hit_max_decode_len": sum(r.get("hit_max_decode_len", False)
                                                  for r in records)},
        "plan": plan.to_json(),
        "settings": settings.to_json(),
    }
    if plan.beam_choice is not None:  # how the run chose between the plain and speculative search
        out["beam_choice"] = plan.beam_choice
    if plan.speculation is not None:  # GAMMA = 'auto': what was timed and chosen, and why
        out["speculation_choice"] = plan.speculation
    return out


def _log_summary(plan: DecodePlan, num_records: int, task_metrics, summary,
                 tokens_per_second: Optional[float]) -> None:
    if plan.mode == "score":
        logging.info("score: %d examples, mean log-likelihood %s", num_records,
                     summary["mean_score"])
        return
    if plan.beams:
        calls = (f"{summary['target_calls']} target forwards against "
                 f"{summary['target_alone_forwards']} for the target's own beam search"
                 if plan.speculative else f"{summary['target_calls']} target forwards")
    else:
        calls = (f"alpha {summary.get('alpha')}, "
                 f"{summary.get('tokens_per_target_call') or 0.0:.2f} tokens/target call")
    logging.info("%s: %d examples, %s, %s, %.1f tokens/s", plan.mode, num_records,
                 task_metrics, calls, tokens_per_second or 0.0)


# ----------------------------------------------------------------------------------------------
# The gin entry point.


@gin.configurable
def infer(settings: Optional[InferSettings] = None, *, dry_run: bool = False,
          mode: Optional[str] = None, **overrides):
    """Speculative (or baseline) inference over a seqio task; see the module docstring.

    Args:
      settings: the run's `InferSettings` (gin: `infer.infer.settings =
        @infer_settings.InferSettings()`, bound from the macros in configs/runs/infer.gin).
      dry_run: return the resolved `InferSettings` without reading data or building models.
      mode: T5X's `infer.mode`: 'predict' (the default) or 'score' (the target's
        log-likelihood of each given target); the settings' `infer_mode`.
      **overrides: `InferSettings` fields by name, replacing the bound ones (or making the
        settings when there are none), so `--gin.infer.infer.truncate_inputs=False` and
        `infer(tfds_data_dir=...)` work as before (the fields: `InferSettings`).

    Returns:
      `InferResult` (or `InferSettings` when `dry_run`).
    """
    if mode is not None:
        overrides = dict(overrides, infer_mode=mode)
    settings = with_overrides(InferSettings, settings, overrides, "infer.infer")
    if dry_run:
        return settings
    return run(settings)
