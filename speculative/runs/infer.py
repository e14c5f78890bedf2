r"""Inference over a seqio task with speculative decoding (or the autoregressive baseline).

The run behind `scripts/infer.py` and `configs/runs/infer.gin` (T5X's `infer.py` with
`mode='predict'`, plus a draft model):

    python scripts/infer.py --gin_file=configs/runs/infer.gin \
      --gin_file=configs/models/t5_1_1_xxl.gin --gin_file=configs/models/t5_1_1_small.gin \
      --gin.TARGET_MODEL="@t5_1_1_xxl/t5.T5Config()" \
      --gin.DRAFT_MODEL="@t5_1_1_small/t5.T5Config()" \
      --gin.TARGET_CHECKPOINT=\"/ckpt/xxl\" --gin.DRAFT_CHECKPOINT=\"/ckpt/small\" \
      --gin.MIXTURE_OR_TASK_NAME=\"wmt_t2t_ende_v003\" \
      --gin.TASK_FEATURE_LENGTHS="{'inputs': 256, 'targets': 256}" \
      --gin.INFER_OUTPUT_DIR=\"/tmp/infer\"

`decoder_only=True` (gin: DECODER_ONLY) decodes decoder-only (GPT-like) language models instead:
`t5.DecoderOnly` target and draft (configs with `num_encoder_layers = 0`, e.g. configs/models/
code_target.gin) on a prompt -> continuation task such as `stdlib_code`, whose inputs are
prompts without EOS that the decoder continues (`adapters.DecoderOnlyModel`: BOS + prompt is
prefilled, the continuation is the prediction). Beam search needs an encoder-decoder model.

Pipeline (`run`):

  1. check the task's data is on this machine (`tasks.check_task_data`): a paper task without its
     TFDS data raises `TaskDataUnavailableError` here, before any model is loaded;
  2. read `num_examples` examples of `split` in order (no shuffling), untrimmed;
  3. load the target (and, when speculative, the draft): `models.load_model` with the checkpoint,
     or random weights when the checkpoint is None (target seed `seed`, draft seed `seed + 1`);
  4. batch with fixed shapes: inputs `[B, L_in]` right-padded with 0 to
     `task_feature_lengths['inputs']` (encoder inputs, or decoder-only prompts),
     `max_decode_len = task_feature_lengths['targets']`; the last partial batch is filled with
     copies of its last example and those rows are dropped from every output and statistic;
  5. with GAMMA = 'auto' (the default), choose how to decode (`choose_decoding`): the baseline,
     the chain at a few gammas, a block draft's block and the token-tree chooser's tree are
     timed on the first inputs at BATCH_SIZE by the one timing engine
     (`speculation.choose_speculation`), and the fastest runs, no speculation included; the log
     line says why, metrics.json records it under `speculation_choice`, and the calibration's
     seconds count in `timing.run_seconds`;
  6. decode each batch with `decoding.speculative_decode` (or `autoregressive_decode` when
     `speculative=False`: same batches, same timing, same outputs); the first batch is decoded
     once untimed to compile (one compile: every batch has the same shapes); after a GAMMA
     'auto' calibration the chosen program is compiled and its results for the calibration
     batches (same inputs, same keys) are taken as they are;
  7. write to `output_dir`:
       predictions.jsonl  one line per example: inputs, targets (reference), prediction,
                          prediction_tokens, input_length, input_truncated, ended_with_eos,
                          generated, target_calls, draft_calls, drafted, accepted, alpha,
                          tokens_per_target_call
       metrics.json       the task's metrics (tasks.bleu for translation, tasks.rouge for
                          summarization; {} for a task without one, e.g. stdlib_code),
                          timings (decode seconds excluding compile, tokens/s), alpha and
                          tokens per target call, truncation counts, the settings
       config.gin         the resolved gin config (`config.write_config`)

Too-long inputs are never cut silently. By default they are truncated, flagged per example
(`input_truncated`), counted in `metrics.json["inputs"]["num_truncated"]` and logged; with
`truncate_inputs=False` the first too-long input raises a ValueError instead. An encoder input
is trimmed the way seqio/T5X trim (its first `L_in - 1` tokens + EOS); a decoder-only prompt
keeps its last `L_in` tokens (the context nearest the continuation; no EOS is added or needed,
since a prompt is continued, not ended). An empty prompt is decoded from BOS alone (an empty
encoder input is refused by the decode loops); a prompt holding the padding id 0 is refused,
since the decoder would read it as the prompt's end. Predictions that reach `max_decode_len`
without EOS are counted in `metrics.json["targets"]["num_hit_max_decode_len"]`.

`alpha` is the paper's alpha (mean beta = sum_x min(p, q) over the drafted positions the accept
test examined; at temperature 0 the fraction of draft tokens equal to the target's argmax);
`tokens_per_target_call` is generated tokens / target calls (Eq. 1's expectation).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import gin
import jax
import numpy as np
from absl import logging

from speculative import files as files_lib
from speculative import loading
from speculative.beam import search as beam_lib
from speculative.data import bundles, tasks
from speculative.decode import contract, drafters
from speculative.decode import loops as decoding
from speculative.measure import acceptance, speculation
from speculative.measure import costs as costs_lib
from speculative.models import partitioning, t5
from speculative.runs import config as config_lib
from speculative.runs import predictions
from speculative.runs.infer_settings import InferSettings, architecture_source, with_overrides
from speculative.runs.predictions import Example

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.gin"


@dataclasses.dataclass
class InferResult:
    """What one inference run produced.

    Attributes:
      settings: the run's settings.
      metrics: metrics.json's contents.
      records: predictions.jsonl's lines.
      output_files: {kind: path} of the files written ({} when nothing was written).
      task_metrics: the task's metrics of the predictions (e.g. {"bleu": ...}; {} for none).
      alpha: mean beta over the drafted positions (None without a draft).
      tokens_per_target_call: generated tokens per target call (None without one).
      tokens_per_second: generated tokens per decode second, compilation excluded.
    """

    settings: InferSettings
    metrics: Dict[str, Any]
    records: List[Dict[str, Any]]
    output_files: Dict[str, str]
    task_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
    alpha: Optional[float] = None
    tokens_per_target_call: Optional[float] = None
    tokens_per_second: Optional[float] = None


# ----------------------------------------------------------------------------------------------
# Data.


def get_task(settings: InferSettings):
    """The seqio task, after checking its data is here (TaskDataUnavailableError otherwise)."""
    import seqio  # pylint: disable=g-import-not-at-top

    if settings.tfds_data_dir:
        seqio.set_tfds_data_dir_override(settings.tfds_data_dir)
    try:
        task = seqio.get_mixture_or_task(settings.mixture_or_task_name)
    except ValueError as e:
        raise ValueError(
            f"infer: unknown MIXTURE_OR_TASK_NAME={settings.mixture_or_task_name!r}; "
            "use a registered task (wmt_t2t_ende_v003, cnn_dailymail_v002, mini_ende, or one "
            "added with tasks.register_tsv_task).") from e
    if not isinstance(task, seqio.Task):
        raise ValueError(
            f"infer reads one task; {settings.mixture_or_task_name!r} is a mixture of "
            f"{[t.name for t in task.tasks]}: pass one of them as MIXTURE_OR_TASK_NAME.")
    tasks.check_task_data(task, settings.split, settings.tfds_data_dir)
    return task


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def fit_input(ids: np.ndarray, limit: int, decoder_only: bool) -> np.ndarray:
    """`ids` cut to `limit` tokens: an encoder input keeps its first `limit - 1` tokens + EOS
    (seqio's `append_eos_after_trim`), a decoder-only prompt its last `limit` tokens (the
    context the continuation follows; a prompt has no EOS to keep)."""
    if len(ids) <= limit:
        return ids
    if decoder_only:
        return ids[len(ids) - limit:]
    return np.concatenate([ids[:limit - 1], [contract.EOS_ID]]).astype(np.int32)


def load_examples(settings: InferSettings, task=None) -> Tuple[Any, List[Example]]:
    """Reads the split in order (untrimmed) and fits each input to `L_in` (see module doc)."""
    task = task or get_task(settings)
    ds = task.get_dataset(None, split=settings.split, shuffle=False, num_epochs=1)
    if settings.num_examples is not None:
        ds = ds.take(settings.num_examples)
    limit = settings.input_length
    how = ("keeping each prompt's last L_in tokens" if settings.decoder_only
           else "seqio-style: the first L_in - 1 tokens + EOS")
    examples = []
    for i, ex in enumerate(ds.as_numpy_iterator()):
        if "inputs" not in ex:
            raise ValueError(f"Task {task.name!r} has no 'inputs' feature; infer decodes "
                             "inputs -> targets tasks (encoder input, or decoder-only prompt).")
        ids = np.asarray(ex["inputs"], np.int32)
        if settings.decoder_only and np.any(ids == contract.PAD_ID):
            raise ValueError(
                f"Example {i} of {task.name}/{settings.split} has the padding id "
                f"{contract.PAD_ID} in its prompt (positions "
                f"{np.nonzero(ids == contract.PAD_ID)[0].tolist()[:10]}): a decoder-only prompt is "
                "right-padded with it, so the model would read it as the prompt's end. Encode "
                "prompts with a vocabulary that keeps id 0 for padding (seqio's "
                "SentencePiece vocabularies never emit it).")
        truncated = len(ids) > limit
        if truncated and not settings.truncate_inputs:
            raise ValueError(
                f"Example {i} of {task.name}/{settings.split} has {len(ids)} input tokens, "
                f"more than TASK_FEATURE_LENGTHS['inputs']={limit}. Raise the feature length,"
                f" or set infer.truncate_inputs=True to truncate ({how}) and count them.")
        examples.append(Example(
            index=i, inputs_text=_text(ex.get("inputs_pretokenized", b"")),
            targets_text=_text(ex.get("targets_pretokenized", b"")),
            input_ids=fit_input(ids, limit, settings.decoder_only),
            input_length=int(len(ex["inputs"])), truncated=bool(truncated)))
    if not examples:
        raise ValueError(f"Task {task.name!r}, split {settings.split!r} has no examples.")
    return task, examples


def batches(examples: List[Example], batch_size: int,
            input_length: int) -> Iterator[Tuple[np.ndarray, int]]:
    """Yields `(inputs [B, L_in] int32, num_real)`; a partial last batch repeats its last row."""
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        inputs = np.zeros((batch_size, input_length), np.int32)
        for row in range(batch_size):
            ids = chunk[min(row, len(chunk) - 1)].input_ids
            inputs[row, :len(ids)] = ids
        yield inputs, len(chunk)


# ----------------------------------------------------------------------------------------------
# Models and decoding.


def load_models(settings: InferSettings) -> Tuple[contract.DecodeModel, Optional[Any]]:
    """`(target, draft)`; the draft is None for the baseline. No checkpoint = random weights.
    Both are `t5.DecoderOnly` with `decoder_only`, encoder-decoder `t5.Transformer`s otherwise."""
    logging.info("Loading target %s; its architecture from %s",
                 settings.target_checkpoint or "(random weights)",
                 architecture_source(settings.target_config, settings.target_checkpoint))
    mesh = settings.make_mesh()
    target = loading.load_model(settings.target_config, settings.target_checkpoint,
                                   decoder_only=settings.decoder_only, seed=settings.seed,
                                   param_dtype=settings.param_dtype, mesh=mesh)
    draft = None
    if settings.speculative:
        spec, checkpoint = settings.draft_config, settings.draft_checkpoint
        logging.info("Loading draft %s%s", loading.source(spec, checkpoint),
                     "; its architecture from " + architecture_source(spec, checkpoint)
                     if spec is None or isinstance(spec, t5.T5Config) else "")
        draft = loading.build_draft(
            spec, checkpoint, target, decoder_only=settings.decoder_only, seed=settings.seed,
            param_dtype=settings.param_dtype, mesh=mesh,
            rules=partitioning.standard_logical_axis_rules()
            if settings.draft_partitioned else None)
    return target, draft


def decode_batch(settings: InferSettings, target, draft, inputs: np.ndarray, rng):
    """A `decoding.DecodeResult`, or with BEAM_SIZE a `beam_lib.BeamSearchResult`."""
    if settings.beam_size is not None:
        return _beam_batch(settings, target, draft, inputs)
    mesh = getattr(target, "mesh", None)
    if mesh is not None:  # rows split over the mesh's 'data' axis
        inputs = partitioning.shard_batch(inputs, mesh)
    if settings.speculative:
        if draft is None:
            raise ValueError("speculative=True needs a draft model; load it with load_models.")
        return decoding.speculative_decode(
            target, draft, inputs, rng=rng, gamma=settings.gamma, sampling=settings.sampling,
            max_decode_len=settings.max_decode_len, lenience=settings.lenience)
    return decoding.autoregressive_decode(
        target, inputs, rng=rng, sampling=settings.sampling,
        max_decode_len=settings.max_decode_len)


def _beam_batch(settings: InferSettings, target, draft,
                inputs: np.ndarray) -> beam_lib.BeamSearchResult:
    kw = dict(beam_size=settings.beam_size, max_decode_len=settings.max_decode_len,
              length_penalty=settings.length_penalty)
    if settings.mode == "beam_search":
        return beam_lib.beam_search(target, inputs, **kw)
    draft_beam = settings.beam_size if settings.draft_beam is None else settings.draft_beam
    gamma = FORCED_BEAM_GAMMA if settings.auto_gamma else settings.gamma
    return beam_lib.speculative_beam_search(target, draft, inputs, draft_beam=draft_beam,
                                            gamma=gamma,
                                            draft_branch=settings.draft_branch, **kw)


FORCED_BEAM_GAMMA = 5  # FORCE_SPECULATIVE_BEAM with GAMMA 'auto' (nothing timed): the old default
MIN_BEAM_SPEEDUP = 1.1  # below it (a few inputs' timing noise), the plain search runs
BEAM_CALIBRATION = 4  # inputs on which choose_beam_search times the proposals


def choose_beam_search(settings: InferSettings, target, draft, all_batches):
    """With SPECULATIVE and BEAM_SIZE (and not FORCE_SPECULATIVE_BEAM): times the plain search
    and the speculative proposals (`costs.choose_beam_proposal`) on the first inputs, and
    returns `(settings, choice)`: settings that run the speculative search with the fastest
    proposal when it beat the plain one by MIN_BEAM_SPEEDUP, else the plain search (the
    same beams either way); the log says which and why."""
    calibration = [b for b, _ in all_batches[:BEAM_CALIBRATION]]
    kw = dict(beam_size=settings.beam_size, max_decode_len=settings.max_decode_len,
              length_penalty=settings.length_penalty)
    gammas = ([settings.gamma] if not settings.auto_gamma  # GAMMA 'auto': the proposals' own
              else sorted({int(c[1]) for c in costs_lib.BEAM_PROPOSALS}))
    candidates = (costs_lib.BEAM_PROPOSALS if settings.draft_beam is None  # unless fixed
                  else [(settings.draft_beam, g) for g in gammas])
    choice = costs_lib.choose_beam_proposal(target, draft, calibration, candidates=candidates,
                                            repeats=2, **kw)
    best = choice.best
    faster = best.speedup >= MIN_BEAM_SPEEDUP
    logging.warning(
        "BEAM_SIZE=%d with SPECULATIVE: on %d inputs the speculative search with draft beam %d, "
        "gamma %d and draft branch %d ran %.2fx the plain search (%.2f beam steps per round); "
        "%s.", settings.beam_size, len(calibration), best.draft_beam, best.gamma,
        best.draft_branch, best.speedup, best.replayed_per_round,
        "running it" if faster else
        f"below {MIN_BEAM_SPEEDUP}x, so beam_lib.beam_search runs (the same beams; "
        "FORCE_SPECULATIVE_BEAM = True runs the speculative one)")
    return dataclasses.replace(settings, force_speculative_beam=faster,
                               draft_beam=best.draft_beam, gamma=best.gamma,
                               draft_branch=best.draft_branch), choice



def _sharded(inputs: np.ndarray, target):
    """`inputs` as `decode_batch` passes them: rows split over the target's mesh, if any."""
    mesh = getattr(target, "mesh", None)
    return partitioning.shard_batch(inputs, mesh) if mesh is not None else inputs


def _trees_apply(settings: InferSettings, target, draft) -> bool:
    """Whether the token-tree chooser can price a tree here: exact verification, one device,
    a target with tree verification and a draft model (not a drafter object, n-gram table or
    prompt lookup)."""
    return (settings.lenience == 1.0 and getattr(target, "mesh", None) is None
            and not drafters.is_drafter(draft) and getattr(draft, "module", None) is not None
            and not contract.missing(target, contract.TreeTarget))


def _chosen_tree(settings: InferSettings, target, draft, calibration, best):
    """`acceptance.choose_tree`'s tree for the calibration slice (None: the chain), with the
    step costs it prices trees with timed on the slice's first batch."""
    del best  # the tree is priced against the best chain of its own rates
    batch = np.asarray(calibration[0])
    costs = costs_lib.measure_costs(target, draft, batch, acceptance.TREE_VERIFY_WIDTHS,
                                    max_decode_len=settings.max_decode_len, num_steps=4,
                                    repeats=3, seed=settings.seed)
    row_costs = functools.partial(costs_lib.draft_row_costs, target, draft, batch,
                                  acceptance.TREE_DRAFT_ROWS, c=costs.c,
                                  max_decode_len=settings.max_decode_len, repeats=3)
    choice = acceptance.choose_tree(target, draft, calibration, settings.sampling, costs,
                                    row_costs, max_decode_len=settings.max_decode_len,
                                    max_nodes=acceptance.TREE_MAX_NODES, seed=settings.seed)
    logging.info("gamma auto, token trees: %s", choice.line())
    return choice.tree


def choose_decoding(settings: InferSettings, target, draft, all_batches):
    """GAMMA = 'auto': times the baseline, the chain at `speculation.CHAIN_GAMMAS`, a block
    draft's block and the chooser's token tree on the run's first batches
    (`speculation.calibration_batches`: about 8 rows, at most 1/8 of the run) with
    `speculation.choose_speculation`, which knows the run's length and so spends calibration
    only where it can pay back (a short run keeps the baseline without compiling anything
    speculative), logs the choice and why, and returns `(settings, draft,
    choice)`: settings that run the fastest (SPECULATIVE False when the baseline was) and the
    drafter it decodes with (None for the baseline)."""
    count = speculation.calibration_batches(len(all_batches), settings.batch_size)
    calibration = [_sharded(b, target) for b, _ in all_batches[:count]]
    search = speculation.SpeculationSearch(
        sampling=settings.sampling, max_decode_len=settings.max_decode_len,
        lenience=settings.lenience, seed=settings.seed, run_batches=len(all_batches),
        alpha=bundles.card_alpha(settings.draft_config, settings.sampling.temperature,
                                 settings.draft_checkpoint))
    tree_for = (functools.partial(_chosen_tree, settings, target, draft, calibration)
                if _trees_apply(settings, target, draft) else None)
    choice = speculation.choose_speculation(target, draft, calibration, search, tree_for=tree_for)
    logging.warning("%s", choice.line())
    best = choice.best
    if not best.speculative:
        return dataclasses.replace(settings, speculative=False), None, choice
    drafter = speculation.speculation_drafter(draft, best.kind, best.gamma, best.tree)
    return dataclasses.replace(settings, gamma=best.gamma), drafter, choice


def _gathered(result):
    """The whole batch's result on this host: in a multi-process job the rows live on several
    hosts' devices and are all-gathered; otherwise the result as it is."""
    if jax.process_count() == 1 or isinstance(result, beam_lib.BeamSearchResult):
        return result
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return multihost_utils.process_allgather(result, tiled=True)


def _check_vocab(settings: InferSettings, vocabulary, model_vocab: Optional[int] = None) -> None:
    """The target's vocab_size (its T5Config's, or `model_vocab` where the architecture comes
    from the checkpoint's config.gin) must cover the task's vocabulary."""
    size = vocabulary.vocab_size
    if model_vocab is None:
        if settings.target_config is None:
            return  # checked with the loaded target's
        model_vocab = settings.target_config.vocab_size
    if model_vocab < size:
        raise ValueError(
            f"TARGET_MODEL.vocab_size={model_vocab} is smaller than the "
            f"task's vocabulary ({size} ids, {settings.mixture_or_task_name}); use a model "
            "trained with that vocabulary (its vocab_size must be at least the vocabulary's).")


def _check_kinds(settings: InferSettings, task, target, draft) -> None:
    """The models must be of the kind DECODER_ONLY says (preloaded ones are not built from the
    settings). The task's kind is not recorded anywhere, so it is only guessed from its inputs:
    prompts that a decoder continues carry no EOS (stdlib_code), encoder inputs end with one; a
    disagreement is logged, since a model may have been trained either way."""
    for name, model in (("target", target), ("draft", draft)):
        prefix = getattr(model, "prefix_length", None)
        if prefix is None:
            continue
        if (prefix(settings.input_length) > 0) != settings.decoder_only:
            kind = "an encoder-decoder" if settings.decoder_only else "a decoder-only"
            raise ValueError(
                f"DECODER_ONLY={settings.decoder_only} but the {name} is {kind} model "
                f"({type(model).__name__}); load the models with the same settings "
                "(infer.load_models) or set DECODER_ONLY to match them.")
    inputs = task.output_features.get("inputs")
    if inputs is not None and inputs.add_eos == settings.decoder_only:
        logging.warning(
            "Task %s's inputs %s EOS, as %s task's do, but DECODER_ONLY=%s; check that the "
            "models were trained for this task (a decoder-only language model continues a "
            "prompt, an encoder-decoder model reads an input ending with EOS).", task.name,
            "end with" if inputs.add_eos else "have no",
            "an encoder-decoder" if inputs.add_eos else "a decoder-only (prompt -> continuation)",
            settings.decoder_only)


def run(settings: InferSettings, models: Optional[Tuple[Any, Any]] = None,
        task=None, examples: Optional[List[Example]] = None) -> InferResult:
    """Runs the pipeline of the module docstring; `models`/`examples` may be passed preloaded."""
    if settings.output_dir:  # refuse an earlier run or an unwritable place before any work
        files_lib.check_run_dir(settings.output_dir, {PREDICTIONS_FILE, CONFIG_FILE, METRICS_FILE},
                                settings.overwrite, "INFER_OUTPUT_DIR")
    if examples is None:
        task, examples = load_examples(settings, task)
    elif task is None:
        task = get_task(settings)
    vocabulary = task.output_features["targets"].vocabulary
    _check_vocab(settings, vocabulary)
    target, draft = models if models is not None else load_models(settings)
    if settings.target_config is None:  # the architecture came from the checkpoint
        _check_vocab(settings, vocabulary, target.vocab_size)
    if settings.speculative and draft is None:
        raise ValueError("speculative=True but no draft model was given.")
    _check_kinds(settings, task, target, draft if settings.speculative else None)
    num_truncated = sum(ex.truncated for ex in examples)
    if num_truncated:
        logging.warning("%d of %d inputs are longer than TASK_FEATURE_LENGTHS['inputs']=%d and "
                        "were truncated to %s (counted in metrics.json).", num_truncated,
                        len(examples), settings.input_length,
                        "their last L_in tokens" if settings.decoder_only
                        else "their first L_in - 1 tokens + EOS")

    all_batches = list(batches(examples, settings.batch_size, settings.input_length))
    beam_choice = None
    if settings.beam_size is not None and settings.speculative and \
            not settings.force_speculative_beam:
        settings, beam_choice = choose_beam_search(settings, target, draft, all_batches)
    speculation = None  # GAMMA = 'auto': the way of decoding timed fastest on the first inputs
    if settings.beam_size is None and settings.speculative and settings.auto_gamma:
        settings, draft, speculation = choose_decoding(settings, target, draft, all_batches)
    decoded = _decode_all(settings, target, draft, examples, all_batches, vocabulary,
                          speculation)
    summarise = (predictions.beam_summary if settings.beam_size is not None
                 else predictions.decode_summary)
    summary = summarise(decoded.batch_stats, [n for _, n in all_batches])
    task_metrics = predictions.task_metrics(task, decoded.records)
    metrics = _metrics(settings, task.name, decoded, summary, task_metrics, examples,
                       num_truncated, len(all_batches))
    if beam_choice is not None:  # how the run chose between the plain and speculative search
        metrics["beam_choice"] = beam_choice.to_json()
    if speculation is not None:  # GAMMA = 'auto': what was timed and chosen, and why
        metrics["speculation_choice"] = dict(speculation.to_json(), line=speculation.line())
    files = {}
    if settings.output_dir and config_lib.is_writer():  # multi-process: process 0 writes
        files = write_outputs(settings.output_dir, decoded.records, metrics)
    tokens_per_second = metrics["timing"]["tokens_per_second"]
    _log_summary(settings, len(decoded.records), task_metrics, summary, tokens_per_second)
    return InferResult(settings=settings, metrics=metrics, records=decoded.records,
                       output_files=files, task_metrics=task_metrics,
                       alpha=summary.get("alpha"),
                       tokens_per_target_call=summary.get("tokens_per_target_call"),
                       tokens_per_second=tokens_per_second)


@dataclasses.dataclass
class _Decoded:
    """What decoding every batch gave: the records, each batch's stats (or beam results), the
    decode seconds (compilation excluded) and the compile seconds (the untimed first batch)."""

    records: List[Dict[str, Any]]
    batch_stats: List[Any]
    decode_seconds: float
    compile_seconds: float
    calibration_seconds: float = 0.0
    reused_seconds: float = 0.0  # the calibration batches' share of decode_seconds


def _decode_all(settings: InferSettings, target, draft, examples: List[Example], all_batches,
                vocabulary, speculation: Optional[speculation.SpeculationChoice] = None
                ) -> _Decoded:
    """Decodes the first batch once untimed (the compile), then every batch timed; stops at the
    first batch whose decode met a non-finite distribution (no text from NaN). After a GAMMA
    'auto' calibration (`speculation`) the chosen program is compiled and its results for the
    calibration batches are the run's (same inputs, same keys): they are taken, each timed at
    the calibration's median, and nothing is decoded untimed."""
    key = jax.random.PRNGKey(settings.seed)
    beams = settings.beam_size is not None
    reused = {}
    compile_seconds = 0.0
    if speculation is not None:
        per_batch = speculation.best.seconds / max(1, speculation.batches)
        reused = {i: (_gathered(r), per_batch) for i, r in enumerate(speculation.results)}
    else:
        start = time.perf_counter()  # compile (and one decode of the first batch), untimed below
        first = _gathered(jax.block_until_ready(decode_batch(
            settings, target, draft, all_batches[0][0], jax.random.fold_in(key, 0))))
        compile_seconds = time.perf_counter() - start
        # Broken (NaN/inf) parameters show on the first batch: stop before the long work (beam
        # search raises on a non-finite distribution itself).
        if not beams:
            first.stats.check_finite(f"{settings.mode} decoding, first batch")

    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    records, decode_seconds, batch_stats = [], 0.0, []
    progress = tqdm(all_batches, desc=f"{settings.mode} decoding", unit="batch",
                    disable=not settings.progress)
    offset = 0
    for i, (inputs, num_real) in enumerate(progress):
        if i in reused:
            result, seconds = reused[i]
        else:
            start = time.perf_counter()
            result = _gathered(jax.block_until_ready(
                decode_batch(settings, target, draft, inputs, jax.random.fold_in(key, i))))
            seconds = time.perf_counter() - start
        decode_seconds += seconds
        rows = examples[offset:offset + num_real]
        if beams:
            batch_stats.append(result)
            records += predictions.beam_records(rows, result, vocabulary,
                                                settings.max_decode_len)
        else:
            result.stats.check_finite(f"{settings.mode} decoding, batch {i}")  # no text from NaN
            batch_stats.append(result.stats)
            records += predictions.row_records(rows, result, vocabulary, settings.max_decode_len)
        offset += num_real
    calibration = speculation.seconds if speculation is not None else 0.0
    reused_seconds = sum(seconds for _, seconds in reused.values())
    return _Decoded(records, batch_stats, decode_seconds, compile_seconds, calibration,
                    reused_seconds)


def _metrics(settings: InferSettings, task_name: str, decoded: _Decoded, summary, task_metrics,
             examples: List[Example], num_truncated: int, num_batches: int) -> Dict[str, Any]:
    """metrics.json's contents (without `files` and `beam_choice`)."""
    records, seconds = decoded.records, decoded.decode_seconds
    tokens_per_second = summary["generated_tokens"] / seconds if seconds else None
    return {
        "task": task_name,
        "split": settings.split,
        "mode": settings.mode,
        "num_examples": len(records),
        "metrics": task_metrics,
        "timing": {
            "decode_seconds": seconds,
            "compile_seconds": decoded.compile_seconds,
            # GAMMA 'auto': timing the choices (their compilations included) on the first inputs
            "calibration_seconds": decoded.calibration_seconds,
            "run_seconds": (seconds - decoded.reused_seconds + decoded.compile_seconds
                            + decoded.calibration_seconds),
            "tokens_per_second": tokens_per_second,
            "examples_per_second": len(records) / seconds if seconds else None,
            "num_batches": num_batches,
            "note": "decode_seconds excludes compilation: the first batch is decoded once "
                    "untimed (compile_seconds) and then timed with the others; with GAMMA "
                    "'auto' the calibration (calibration_seconds) compiles instead, and the "
                    "calibration batches' results are the chosen program's, timed there. "
                    "run_seconds = decode + compile + calibration, less the calibration "
                    "batches' share of decode_seconds (already in calibration_seconds): what "
                    "to compare.",
        },
        "decoding": summary,
        "inputs": {"feature_length": settings.input_length, "num_truncated": num_truncated,
                   "max_input_length": max(ex.input_length for ex in examples),
                   "truncate_inputs": settings.truncate_inputs},
        "targets": {"max_decode_len": settings.max_decode_len,
                    "num_hit_max_decode_len": sum(r["hit_max_decode_len"] for r in records)},
        "settings": settings.to_json(),
    }


def _log_summary(settings: InferSettings, num_records: int, task_metrics, summary,
                 tokens_per_second: Optional[float]) -> None:
    if settings.beam_size is not None:
        calls = (f"{summary['target_calls']} target forwards against "
                 f"{summary['target_alone_forwards']} for the target's own beam search"
                 if settings.speculative else f"{summary['target_calls']} target forwards")
    else:
        calls = (f"alpha {summary.get('alpha')}, "
                 f"{summary.get('tokens_per_target_call') or 0.0:.2f} tokens/target call")
    logging.info("%s: %d examples, %s, %s, %.1f tokens/s", settings.mode, num_records,
                 task_metrics, calls, tokens_per_second or 0.0)


def write_outputs(output_dir: str, records, metrics) -> Dict[str, str]:
    """Writes predictions.jsonl, config.gin and metrics.json (last) as one unit; returns their
    paths.

    The files go to a staging directory beside `output_dir`, which then takes its place (an
    earlier run there is moved aside first and deleted after): an interruption leaves either
    the earlier complete run or the new complete run at `output_dir`, never a mix (in the
    instant between the two renames, the earlier run waits complete in `<output_dir>.old-*`).
    """
    final = os.path.abspath(output_dir)
    staging = f"{final}.tmp-{os.getpid()}"
    if os.path.exists(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)
    names = {"predictions": PREDICTIONS_FILE, "config": CONFIG_FILE, "metrics": METRICS_FILE}
    files = {k: os.path.join(output_dir, v) for k, v in names.items()}
    try:
        with open(os.path.join(staging, PREDICTIONS_FILE), "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        config_lib.write_config(staging, CONFIG_FILE)
        with open(os.path.join(staging, METRICS_FILE), "w", encoding="utf-8") as f:
            json.dump(dict(metrics, files=files), f, indent=2, ensure_ascii=False)
    except BaseException:  # interrupted or failed: the earlier run stays as it was
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files_lib.replace_directory(staging, final)
    return files


# ----------------------------------------------------------------------------------------------
# The gin entry point.


@gin.configurable
def infer(settings: Optional[InferSettings] = None, *, dry_run: bool = False, **overrides):
    """Speculative (or baseline) inference over a seqio task; see the module docstring.

    Args:
      settings: the run's `InferSettings` (gin: `infer.infer.settings =
        @infer_settings.InferSettings()`, bound from the macros in configs/runs/infer.gin).
      dry_run: return the resolved `InferSettings` without reading data or building models.
      **overrides: `InferSettings` fields by name, replacing the bound ones (or making the
        settings when there are none), so `--gin.infer.infer.truncate_inputs=False` and
        `infer(tfds_data_dir=...)` work as before (the fields: `InferSettings`).

    Returns:
      `InferResult` (or `InferSettings` when `dry_run`).
    """
    settings = with_overrides(InferSettings, settings, overrides, "infer.infer")
    if dry_run:
        return settings
    return run(settings)
