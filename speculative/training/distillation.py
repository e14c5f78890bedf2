"""A small optax trainer for `t5.Transformer` and `t5.DecoderOnly` (teacher forcing), and
sequence-level distillation: `train(TrainRun(...))` takes one model from the corpus to its
exported checkpoint and model-card entry; `fit_ngram_drafts` fits the unigram / bigram drafts.

It trains the bundled EN->DE models (`speculative/data/mini/models/`) on the gettext corpus in
`speculative/data/mini/` on CPU in minutes. The pieces live in one module per noun (import each
name from its module):

    data/text.py            the corpora: pairs, tokenizer, code-corpus chunks and prompts
    training/train_config.py  TrainConfig and OBJECTIVES
    training/data.py        examples cut to length, length-bucketed batches
    training/objectives.py  what is learned: teacher-forced logits, the token and teacher losses,
                            distillation targets and the teacher's distributions
    training/trainer.py     the schedule and optimizer, TrainState, the jitted train and eval
                            steps, a run's resumable state (ResumableRun)
    training/evaluation.py  greedy decoding, BLEU, a draft's alpha, decoder FLOPs and parameter
                            counts
    training/distillation.py  the runs: TrainRun and train(), fit_ngram_drafts, the model card

In data-flow order:

    pairs = load_pairs(tsv)                      # [(english, german)]
    tok = Tokenizer(spm_path)                    # inputs: PREFIX + en, + EOS; targets: de + EOS
    examples = tokenize_pairs(pairs, tok, cfg)   # drops (or truncates) pairs longer than 48
    for inputs, targets in batches(examples, cfg.buckets, cfg.batch_tokens, rng=rng): ...
    state, metrics = train_step(state, inputs, targets, rng)   # jitted, state donated

Batching: each pair goes to the smallest bucket length L >= max(len(input), len(target)); a batch
of that bucket is `[batch_tokens // L, L]` for both inputs and targets (0 = padding, all-zero rows
pad the last batch of a bucket), so a run compiles once per bucket. Pairs longer than the last
bucket are dropped (`truncate=False`, the default) or cut to it, keeping EOS last (seqio's
`append_eos_after_trim`).

Losses and distillation (references, the teacher's greedy outputs, or its distributions for
the 'kl' / 'tv' objectives that train drafts for alpha) are described in objectives.py, the
decoder FLOPs per token in training_eval.py.

Decoder-only language models (`TrainRun(decoder_only=True, ...)`, the paper's GPT-like row) train
on the Python-code corpus of `scripts/build_code_corpus.py` (`speculative/data/code/`) with the
same loop, optimizer, schedule, resumption and export: each document's ids plus EOS are cut into
chunks of `config.max_length` tokens (`lm_examples`), each an example with no inputs whose
targets are the chunk, so batching, losses and evaluation are the encoder-decoder's and the
model predicts every next token after BOS. Drafts are measured against a decoder-only target
on prompts made of the first tokens of valid chunks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np
from absl import logging

from speculative import files
from speculative.checkpoints import factory
from speculative.checkpoints import t5x as checkpoints
from speculative.data import code_corpus, docstring_corpus
from speculative.data.text import (
    MINI_DIR,
    Example,
    Tokenizer,
    check_prompt_length,
    lm_examples,
    lm_prompts,
    load_pairs,
    load_sources,
)
from speculative.decode import contract
from speculative.models import adapters as models_lib
from speculative.models import t5
from speculative.training.data import batches, make_examples, tokenize_pairs
from speculative.training.evaluation import (
    decoder_flops_per_token,
    draft_alpha,
    greedy_score,
    num_params,
)
from speculative.training.objectives import distill_targets, teacher_distributions
from speculative.training.train_config import TrainConfig
from speculative.training.trainer import (
    ResumableRun,
    TrainState,
    evaluate_loss,
    init_state,
    make_eval_step,
    make_optimizer,
    make_train_step,
)

Array = jax.Array


TASKS = ("ende", "docstrings")  # TrainRun.task


def load_task_pairs(task: str, data_dir: str, split: str) -> List[Tuple[str, str]]:
    """A split of an encoder-decoder task's corpus as (source, reference) strings."""
    if task == "docstrings":
        return [(e.code, e.docstring) for e in docstring_corpus.read_split(data_dir, split)]
    return load_pairs(os.path.join(data_dir, f"{split}.tsv"))


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """One `train` run: the model, its settings, data, teacher, evaluation and export
    (configs/runs/train.gin binds every field).

    Attributes:
      model: the `T5Config` to train (a `t5.Transformer`; a `t5.DecoderOnly` with
        `decoder_only`).
      model_dir: where the run writes (see `train`).
      config: optimisation and batching (`config.max_length`: the longest input and target).
      seed: initialisation, the data order, dropout, the `distill_pairs` pick and alpha.
      name: the model's name in the export and the card (default: the basename of `model_dir`).
      data_dir: the corpus, with `spm.model` (default: the bundled `speculative/data/mini/`;
        with `decoder_only`, `speculative/data/code/`; with `task='docstrings'`,
        `speculative/data/docstrings/`).
      task: 'ende' (source -> translation pairs of the gettext corpus, BLEU) or 'docstrings'
        (function source -> its docstring, `speculative.data.docstring_corpus`, no input
        prefix, ROUGE-1/2/L); ignored with `decoder_only`.
      decoder_only: train a `t5.DecoderOnly` language model on the code corpus: next-token
        cross-entropy on chunks of `config.max_length` tokens (`lm_examples`), valid loss on the
        valid split's chunks, no BLEU and no `valid_greedy.txt`. A decoder-only target is
        decoder-only too. It does not distill (the corpus itself is the data).
      eval_every: steps between records of `metrics.jsonl` (train loss over those steps, valid
        loss).
      log_every: steps between logged train losses and speeds.
      bleu_sentences: greedy valid BLEU on the first this many valid pairs (None: all).
      max_train_pairs: train on the first this many pairs (chunks with `decoder_only`).
      distill: train on the target's greedy translations of the training sources instead of
        the references (needs `target_model` and `target_checkpoint`); with `config.objective`
        'kl' or 'tv' the model learns the target's distributions on those outputs
        (`teacher_distributions`, cached beside `distill_cache`) rather than its tokens.
      distill_pairs: distill a random this many of the training sources (None: all).
      distill_cache: an .npz of the teacher's greedy outputs (its top-k distributions and the
        `distill_sources` outputs go beside it), read back when written for the same inputs
        and teacher (None: not cached).
      distill_sources: a file of English sentences in `data_dir`, one per line (e.g.
        `mono_en.txt` from `scripts/build_corpus.py --monolingual`): the teacher's translations
        of sources it was never trained on are added (on its own training sources an overfit
        teacher mostly repeats the references).
      target_model: the target's `T5Config`: with `target_checkpoint`, the model is measured
        as its draft (alpha at temperatures 0 and 1) and `distill` learns from it.
      target_checkpoint: the target's checkpoint.
      alpha_sentences: alpha on the first this many valid sentences (`decoder_only`: prompts,
        the first `prompt_length` tokens of valid chunks, each continued for `prompt_length`).
      alpha_gamma: gamma of the alpha measurement.
      prompt_length: the decoder-only alpha's prompt and continuation length.
      card_subset: the first this many valid examples (pairs truncated to fit), whose loss is
        recorded in float32 and, exported, in `export_dtype`.
      export_dir: also save the final parameters in `export_dtype` as
        `<export_dir>/<name>/checkpoint_<steps>` and the summary in
        `<export_dir>/model_card.json` under `name`.
      export_dtype: the exported copy's dtype.
      checkpoint_every: save the whole training state every this many steps (0: never; see
        `train`).
      init_checkpoint: start from these parameters instead of random ones (e.g. a 'tv'
        fine-tune of a 'kl' draft); the steps and schedule are this run's.
      gin_config: written to `model_dir/config.gin` if given (scripts/train.py: the resolved
        gin config).
    """

    model: t5.T5Config
    model_dir: str
    config: TrainConfig
    seed: int
    name: Optional[str] = None
    data_dir: Optional[str] = None
    task: str = "ende"
    decoder_only: bool = False
    eval_every: int = 500
    log_every: int = 50
    bleu_sentences: Optional[int] = None
    max_train_pairs: Optional[int] = None
    distill: bool = False
    distill_pairs: Optional[int] = None
    distill_cache: Optional[str] = None
    distill_sources: Optional[str] = None
    target_model: Optional[t5.T5Config] = None
    target_checkpoint: Optional[str] = None
    alpha_sentences: int = 256
    alpha_gamma: int = 4
    prompt_length: int = 64
    card_subset: int = 64
    export_dir: Optional[str] = None
    export_dtype: str = "bfloat16"
    checkpoint_every: int = 0
    init_checkpoint: Optional[str] = None
    gin_config: Optional[str] = None


def _run_name(checkpoint: str) -> str:
    """`out/x/large_target` or `out/x/large_target/checkpoint_2000` -> `large_target`."""
    path = os.path.normpath(checkpoint)
    if os.path.basename(path).startswith("checkpoint_"):
        path = os.path.dirname(path)
    return os.path.basename(path)


def _write_json(path: str, obj) -> None:
    files.write_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def update_card(export_dir: str, name: str, entry: dict) -> None:
    """Merges `entry` into `<export_dir>/model_card.json` under `models/<name>`."""
    path = os.path.join(export_dir, "model_card.json")
    card = {}
    if os.path.exists(path):
        with open(path) as f:
            card = json.load(f)
    card.setdefault("models", {})[name] = entry
    _write_json(path, card)


def _teach(teacher, examples: Sequence[Example], config: TrainConfig,
           cache: Optional[str]) -> List[Tuple[np.ndarray, ...]]:
    """Distillation data for `examples`: the teacher's greedy outputs as targets and, for the
    'kl' and 'tv' objectives, its top-k distributions along them; cached beside `cache`."""
    t0 = time.time()
    examples = distill_targets(teacher.module, teacher.params, examples, config.target_length,
                               cache, input_length=config.input_length)
    logging.info("distillation targets for %d sources: %.0f s", len(examples), time.time() - t0)
    if config.objective == "ce":
        return examples
    t0 = time.time()
    examples = teacher_distributions(
        teacher.module, teacher.params, examples, config,
        cache and f"{os.path.splitext(cache)[0]}.top{config.teacher_top_k}.npz")
    logging.info("teacher distributions (top %d): %.0f s", config.teacher_top_k,
                 time.time() - t0)
    return examples


def _load_target(target_model: t5.T5Config, target_checkpoint: str,
                 decoder_only: bool = False) -> contract.DecodeModel:
    """The teacher / target as a float32 `DecodeModel` (checked against `target_model`)."""
    return factory.load_model(target_model, target_checkpoint, decoder_only=decoder_only,
                                 param_dtype="float32")


def train(run: TrainRun) -> dict:
    """Trains `run.model` on the corpus in `run.data_dir` (default: the bundled one); returns a
    summary.

    Writes to `model_dir`: `config.gin` (`gin_config`, if given), `metrics.jsonl` (train loss
    over the last `eval_every` steps and valid loss), the float32 T5X checkpoint
    `checkpoint_<steps>`, `valid_greedy.txt` (not with `decoder_only`) and `summary.json`. With
    `target_model` and `target_checkpoint`, the model is measured as a draft of that target
    (alpha at temperatures 0 and 1 on `alpha_sentences` valid sentences, gamma `alpha_gamma`);
    `distill` trains it on that target's outputs; `export_dir` gets the `export_dtype` copy and
    the card entry (the fields: `TrainRun`).

    With `checkpoint_every > 0` the run is resumable: every that many steps the whole training
    state (parameters, optimizer state, step) goes atomically to `model_dir/train_state.msgpack`,
    and a later call with the same model and settings continues from it. The data stream is
    replayed up to the saved step, so a resumed run sees the same batches as an uninterrupted
    one (only the train loss of the first logged window after a resume covers fewer steps).
    """
    start = time.time()
    config, model, model_dir, decoder_only = run.config, run.model, run.model_dir, run.decoder_only
    name = run.name or os.path.basename(os.path.normpath(model_dir))
    data_dir = run.data_dir or (code_corpus.CODE_DIR if decoder_only else
                                docstring_corpus.DOCSTRING_DIR if run.task == "docstrings"
                                else MINI_DIR)
    _check_run(run)
    os.makedirs(model_dir, exist_ok=True)
    if run.gin_config is not None:
        with open(os.path.join(model_dir, "config.gin"), "w") as f:
            f.write(run.gin_config)
    tokenizer = (Tokenizer(os.path.join(data_dir, "spm.model"), prefix="")
                 if run.task == "docstrings" else Tokenizer(os.path.join(data_dir, "spm.model")))
    if model.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"Model vocab_size={model.vocab_size} but the vocabulary in {data_dir} "
                         f"has {tokenizer.vocab_size} pieces; set vocab_size="
                         f"{tokenizer.vocab_size}.")
    data = _read_data(run, tokenizer, data_dir)
    module = models_lib.make_module(model, decoder_only=decoder_only)
    teacher = (_load_target(run.target_model, run.target_checkpoint, decoder_only)
               if run.target_checkpoint else None)
    if run.distill:
        _distill(run, teacher, data)
    alpha_rng, fitted = _fit(run, module, data)
    params = jax.device_get(fitted.state.params)
    checkpoints.save_t5x(params, model_dir, step=config.steps, overwrite=True)
    summary = _summary(run, name, module, params, data, fitted, tokenizer)
    if teacher is not None:
        _measure_as_draft(run, summary, teacher, module, params, data, alpha_rng)
    summary["total_wall_s"] = round(time.time() - start, 1)
    if run.export_dir:
        _export(run, name, summary, module, params, data, fitted.eval_step, tokenizer)
    _write_json(os.path.join(model_dir, "summary.json"), summary)
    fitted.resume.finish(config.steps, fitted.train_s)
    return summary


def _check_run(run: TrainRun) -> None:
    """Refuses settings that cannot work together, before any work."""
    config = run.config
    if run.task not in TASKS:
        raise ValueError(f"task={run.task!r} is not a training task; use one of {TASKS}.")
    if run.decoder_only and (run.distill or run.distill_sources or config.objective != "ce"):
        raise ValueError(
            f"decoder_only=True trains a language model on the corpus itself, but distill="
            f"{run.distill}, distill_sources={run.distill_sources!r}, objective="
            f"{config.objective!r} distill an encoder-decoder draft; use distill=False and "
            "objective='ce'.")
    if run.decoder_only and run.target_checkpoint:
        check_prompt_length(run.prompt_length, config.max_length)
    if run.distill and not (run.target_model and run.target_checkpoint):
        raise ValueError("distill=True needs target_model and target_checkpoint (the teacher).")
    if run.distill_sources and not run.distill:
        raise ValueError(f"distill_sources={run.distill_sources!r} are translated by the "
                         "teacher: set distill=True with target_model and target_checkpoint.")
    if config.objective != "ce" and not run.distill:
        raise ValueError(f"objective={config.objective!r} learns the teacher's distributions on "
                         "its own outputs: set distill=True with target_model and "
                         "target_checkpoint (or use objective='ce').")


@dataclasses.dataclass
class _Data:
    """A run's examples: training, valid, the card's valid subset, the valid pairs (BLEU; empty
    for a decoder-only run), the pairs dropped as too long, and the teacher's extra sources."""

    train: list
    valid: list
    subset: list
    valid_pairs: list
    dropped: int
    mono: list


def _read_data(run: TrainRun, tokenizer: Tokenizer, data_dir: str) -> _Data:
    """The corpus as examples: chunks of the code corpus (`decoder_only`) or tokenized pairs,
    plus the `distill_sources` inputs (their targets are filled in by the teacher)."""
    config, max_len = run.config, run.config.max_length
    if run.decoder_only:
        train_ex = lm_examples(data_dir, "train", tokenizer, max_len)[:run.max_train_pairs]
        valid_ex = lm_examples(data_dir, "valid", tokenizer, max_len)
        logging.info("train: %d chunks of up to %d tokens; valid: %d", len(train_ex), max_len,
                     len(valid_ex))
        return _Data(train_ex, valid_ex, valid_ex[:run.card_subset], [], 0, [])
    valid_pairs = load_task_pairs(run.task, data_dir, "valid")
    train_ex, dropped = tokenize_pairs(
        load_task_pairs(run.task, data_dir, "train")[:run.max_train_pairs], tokenizer, config)
    valid_ex, valid_dropped = tokenize_pairs(valid_pairs, tokenizer, config)
    subset_ex, _ = tokenize_pairs(valid_pairs[:run.card_subset], tokenizer,
                                  dataclasses.replace(config, truncate=True))
    logging.info("train: %d pairs (%d longer than %d / %d dropped); valid: %d (%d dropped)",
                 len(train_ex), dropped, config.input_length, config.target_length,
                 len(valid_ex), valid_dropped)
    mono_ex = []
    if run.distill_sources:
        mono_ex, _ = make_examples(  # the placeholder target is replaced by the teacher's
            tokenizer.encode_inputs(load_sources(os.path.join(data_dir, run.distill_sources))),
            itertools.repeat([contract.EOS_ID]), max_len)
    return _Data(train_ex, valid_ex, subset_ex, valid_pairs, dropped, mono_ex)


def _distill(run: TrainRun, teacher, data: _Data) -> None:
    """Replaces the training targets (and the extra sources') by the teacher's (`_teach`)."""
    if run.distill_pairs:  # greedy decoding costs ~15 ms per sentence for mini_target on CPU
        pick = np.random.default_rng(run.seed).permutation(len(data.train))[:run.distill_pairs]
        data.train = [data.train[i] for i in np.sort(pick)]
    stem, ext = os.path.splitext(run.distill_cache) if run.distill_cache else (None, None)
    data.train = _teach(teacher, data.train, run.config, run.distill_cache)
    if data.mono:
        data.mono = _teach(teacher, data.mono, run.config, stem and f"{stem}.mono{ext}")
        logging.info("%d distillation pairs from the training sources, %d from %s",
                     len(data.train), len(data.mono), run.distill_sources)
        data.train = data.train + data.mono


@dataclasses.dataclass
class _Fitted:
    """The trained state, the last metrics record, the training seconds, the eval step and
    the run's resumable state."""

    state: TrainState
    record: dict
    train_s: float
    eval_step: object
    resume: ResumableRun


def replayed_order(run: TrainRun) -> Optional[str]:
    """A warning when `run` continues an `init_checkpoint` whose run drew its batches from the
    same data with the same seed: the data order follows the seed, so the continuation would
    see that run's batches again, in the same order, before anything new (None otherwise)."""
    if not run.init_checkpoint:
        return None
    path = os.path.normpath(run.init_checkpoint)
    run_dir = os.path.dirname(path) if os.path.basename(path).startswith("checkpoint_") else path
    meta = os.path.join(run_dir, "train_state.json")
    if not os.path.exists(meta):
        return None
    with open(meta) as f:
        before = json.load(f).get("settings", {})
    same_data = (before.get("task", "ende") == run.task and before.get("distill") == run.distill
                 and not run.distill)
    if not (same_data and before.get("seed") == run.seed):
        return None
    return (f"init_checkpoint={run.init_checkpoint!r} was trained with seed={run.seed} on the "
            "same data: this run sees its batches again in the same order before any new one. "
            "Give another seed (--gin.SEED=...) to draw a new order.")


def _fit(run: TrainRun, module, data: _Data):
    """The training loop (resumable; module docstring) -> `(alpha_rng, _Fitted)`."""
    warning = replayed_order(run)
    if warning:
        logging.warning("%s", warning)
    config, model = run.config, run.model
    optimizer = make_optimizer(config)
    init_rng, dropout_rng, alpha_rng = jax.random.split(jax.random.PRNGKey(run.seed), 3)
    state = init_state(module, optimizer, init_rng, run.init_checkpoint)
    resume = ResumableRun(run.model_dir, {
        "model": dataclasses.asdict(model), "seed": run.seed,
        "train_config": dataclasses.asdict(config), "distill": run.distill,
        "train_pairs": len(data.train), "distill_sources": run.distill_sources,
        "init_checkpoint": run.init_checkpoint,
        **({"decoder_only": True} if run.decoder_only else {}),
        **({"task": run.task} if run.task != "ende" else {})})
    state, first_step, prior_s = resume.restore(state)
    train_step, eval_step = make_train_step(module, optimizer, config), make_eval_step(module)
    data_rng = np.random.default_rng(run.seed)
    stream = (b for _ in itertools.count()  # endless epochs, reshuffled each time
              for b in batches(data.train, config.buckets, config.batch_tokens, rng=data_rng,
                                target_buckets=config.target_buckets))
    for _ in range(first_step - 1):  # replay the batches a resumed run has already trained on
        next(stream)
    pending, window, record = [], [], {}
    train_start = last_log = time.time() - prior_s
    with open(os.path.join(run.model_dir, "metrics.jsonl"), "a" if first_step > 1 else "w") as log:
        for step in range(first_step, config.steps + 1):
            inputs, targets, *teacher_dists = next(stream)
            state, metrics = train_step(state, inputs, targets, dropout_rng, *teacher_dists)
            pending.append(metrics)
            if step % run.log_every == 0 or step == config.steps:
                got, pending, now = jax.device_get(pending), [], time.time()
                window += got
                tokens = sum(m["tokens"] for m in got)
                logging.info("step %d  train_ce %.4f  %.0f target tok/s  %.0f s", step,
                             sum(m["ce"] for m in got) / tokens, tokens / (now - last_log),
                             now - train_start)
                last_log = now
            if step % run.eval_every == 0 or step == config.steps:
                window, pending = window + jax.device_get(pending), []  # steps not logged yet
                record = {"step": step, "train_loss": float(
                    sum(m["ce"] for m in window) / sum(m["tokens"] for m in window)),
                          "valid_loss": evaluate_loss(eval_step, state.params, data.valid,
                                                      config),
                          "elapsed_s": time.time() - train_start}
                window = []
                log.write(json.dumps(record) + "\n")
                log.flush()
                logging.info("eval %s", record)
            if run.checkpoint_every and (step % run.checkpoint_every == 0 or step == config.steps):
                resume.save(state, step, time.time() - train_start)
    if not record:  # resumed at the last step: the final record is the last one logged
        record = resume.last_record()
    # A finished run reloaded (to export) trained nothing: its time is the recorded one.
    train_s = prior_s if first_step > config.steps else time.time() - train_start
    return alpha_rng, _Fitted(state, record, train_s, eval_step, resume)


def _flops_kw(run: TrainRun) -> dict:
    # Decoding a prompt_length continuation after a prompt_length prompt attends to 1.5x that.
    return (dict(decoder_only=True, self_len=run.prompt_length * 3 // 2) if run.decoder_only
            else {})


def _summary(run: TrainRun, name: str, module, params, data: _Data, fitted: _Fitted,
             tokenizer: Tokenizer) -> dict:
    """summary.json's entry: the model, its training, losses, and (not decoder-only) BLEU,
    whose greedy valid outputs go to `valid_greedy.txt`."""
    config, model, record = run.config, run.model, fitted.record
    summary = {
        "name": name, "config": dataclasses.asdict(model),
        "train_config": dataclasses.asdict(config),
        "params": num_params(params),
        "decoder_flops_per_token": decoder_flops_per_token(model, **_flops_kw(run)),
        "steps": config.steps, "seed": run.seed,
        "init_checkpoint": run.init_checkpoint and _run_name(run.init_checkpoint),
        "train_wall_s": round(fitted.train_s, 1), "final_train_loss": record["train_loss"],
        "final_valid_loss": record["valid_loss"],
    }
    subset_loss = evaluate_loss(fitted.eval_step, params, data.subset, config)
    if run.decoder_only:
        summary.update({
            "decoder_only": True, "train_chunks": len(data.train),
            "valid_chunks": len(data.valid), "chunk_length": config.max_length,
            "valid_subset": {"first_n_valid_chunks": run.card_subset,
                             "loss_float32": subset_loss}})
        return summary
    bleu_pairs = _bleu_pairs(run, data)
    scores, hyps = _greedy_score(run, module, params, bleu_pairs, tokenizer)
    if run.task == "docstrings":  # multi-line outputs: one JSON string a line
        files.write_atomic(os.path.join(run.model_dir, "valid_greedy.jsonl"),
                           "".join(json.dumps(h, ensure_ascii=False) + "\n" for h in hyps))
    else:
        files.write_atomic(os.path.join(run.model_dir, "valid_greedy.txt"),
                           "\n".join(hyps) + "\n")
    logging.info("valid %s on %d examples", scores, len(bleu_pairs))
    summary.update({"task": run.task} if run.task != "ende" else {})
    summary.update({"valid_" + k: v for k, v in scores.items()})
    summary.update({
        "distilled": run.distill, "train_pairs": len(data.train), "train_dropped": data.dropped,
        "distill_sources": run.distill_sources and {"file": run.distill_sources,
                                                    "pairs": len(data.mono)},
        "bleu_sentences": len(bleu_pairs),
        "valid_subset": {"first_n_valid_pairs": run.card_subset, "truncate": True,
                         "loss_float32": subset_loss}})
    return summary


def _greedy_score(run: TrainRun, module, params, pairs, tokenizer) -> Tuple[dict, List[str]]:
    """BLEU (EN->DE) or ROUGE (docstrings) of greedy outputs on `pairs`."""
    config = run.config
    return greedy_score(module, params, pairs, tokenizer, config.input_length,
                        config.target_length, "rouge" if run.task == "docstrings" else "bleu",
                        truncate=run.task == "ende")


def _bleu_pairs(run: TrainRun, data: _Data) -> list:
    return data.valid_pairs[:run.bleu_sentences] if run.bleu_sentences else data.valid_pairs


def _measure_as_draft(run: TrainRun, summary: dict, teacher, module, params, data: _Data,
                      alpha_rng) -> None:
    """Adds the model's alpha as a draft of the target, the target's name and the FLOPs ratio."""
    if run.decoder_only:
        inputs, alpha_len = lm_prompts(data.valid, run.prompt_length), run.prompt_length
    else:
        inputs, alpha_len = [x for x, _ in data.valid], run.config.target_length
    summary["alpha"] = draft_alpha(
        teacher, models_lib.as_decode_model(module, params), inputs[:run.alpha_sentences],
        rng=alpha_rng, gamma=run.alpha_gamma, max_length=alpha_len,
        input_length=None if run.decoder_only else run.config.input_length)
    summary["target"] = _run_name(run.target_checkpoint)
    summary["flops_ratio_to_target"] = (
        summary["decoder_flops_per_token"]["total"]
        / decoder_flops_per_token(run.target_model, **_flops_kw(run))["total"])
    logging.info("alpha %s", summary["alpha"])


def _export(run: TrainRun, name: str, summary: dict, module, params, data: _Data, eval_step,
            tokenizer: Tokenizer) -> None:
    """Saves the `export_dtype` copy, records its loss (and BLEU) and updates the card."""
    exported = jax.tree_util.tree_map(lambda x: np.asarray(x, run.export_dtype), params)
    path = checkpoints.save_t5x(exported, os.path.join(run.export_dir, name),
                                step=run.config.steps, overwrite=True, config=run.model,
                                decoder_only=run.decoder_only)  # config.gin beside it
    bundled = checkpoints.load_params(path, dtype="float32")
    summary["valid_subset"]["loss_" + run.export_dtype] = evaluate_loss(
        eval_step, bundled, data.subset, run.config)
    if not run.decoder_only:  # what users decode is the stored copy (upcast): its BLEU too
        scores = _greedy_score(run, module, bundled, _bleu_pairs(run, data), tokenizer)[0]
        summary.update({f"valid_{k}_{run.export_dtype}": v for k, v in scores.items()})
    summary["checkpoint"] = os.path.relpath(path, run.export_dir)
    update_card(run.export_dir, name, summary)


@dataclasses.dataclass(frozen=True)
class NgramRun:
    """One `fit_ngram_drafts` run (configs/runs/train.gin binds every field).

    Attributes:
      export_dir: where the drafts' `.npz` files and their `model_card.json` entries go.
      target_model, target_checkpoint: the target their alpha is measured against.
      seed: the alpha measurement's keys.
      model_dir: gets `config.gin` (`gin_config`, if given) and `summary.json`.
      data_dir: the corpus (default: the bundled `speculative/data/mini/`; with `decoder_only`,
        `speculative/data/code/`).
      max_length: pairs over it are dropped (the chunk length with `decoder_only`).
      smoothing: added to every count before normalising.
      alpha_sentences, alpha_gamma: alpha on the first this many valid sentences (prompts with
        `decoder_only`), at this gamma.
      decoder_only: fit on the code corpus' language-model chunks (below).
      prompt_length: the decoder-only alpha's prompt and continuation length.
      gin_config: written to `model_dir/config.gin` if given.
    """

    export_dir: str
    target_model: t5.T5Config
    target_checkpoint: str
    seed: int
    model_dir: str
    data_dir: Optional[str] = None
    max_length: int = 48
    smoothing: float = 0.01
    alpha_sentences: int = 256
    alpha_gamma: int = 4
    decoder_only: bool = False
    prompt_length: int = 64
    gin_config: Optional[str] = None


def fit_ngram_drafts(run: Optional[NgramRun] = None, **fields) -> dict:
    """Fits unigram and bigram drafts (models/ngram.py), saves them compressed in `export_dir`
    (`ngram.load` reads them) and records them, with their alpha against the target, in its
    `model_card.json`; `model_dir` gets `config.gin` and `summary.json`.

    `run` is an `NgramRun`; `fields` (its fields by name) replace its values or, without `run`,
    make it: `fit_ngram_drafts(export_dir=..., ...)` and gin bindings on `fit_ngram_drafts`
    itself work as on the settings.

    Encoder-decoder (the EN->DE bundle): `mini_{unigram,bigram}.npz`, fitted on the tokenized
    training references (target side, EOS included; pairs over `max_length` dropped); alpha on
    the first `alpha_sentences` valid sources. Decoder-only (`decoder_only=True`, the code
    corpus): `code_{unigram,bigram}.npz`, fitted on the train split's language-model chunks of
    `max_length` tokens (`lm_examples`, each read after BOS as the target reads it); alpha on
    `alpha_sentences` prompts of `prompt_length` tokens from valid chunks (`lm_prompts`), each
    continued for `prompt_length` tokens, as `train` measures a decoder-only draft."""
    from speculative.models import ngram  # pylint: disable=g-import-not-at-top

    run = NgramRun(**fields) if run is None else dataclasses.replace(run, **fields)
    max_length, decoder_only = run.max_length, run.decoder_only
    data_dir = run.data_dir or (code_corpus.CODE_DIR if decoder_only else MINI_DIR)
    tokenizer = Tokenizer(os.path.join(data_dir, "spm.model"))
    if decoder_only:
        check_prompt_length(run.prompt_length, max_length)
        train_ex, dropped = lm_examples(data_dir, "train", tokenizer, max_length), 0
        prompts = lm_prompts(lm_examples(data_dir, "valid", tokenizer, max_length),
                             run.prompt_length)
        alpha_inputs, alpha_len = prompts[:run.alpha_sentences], run.prompt_length
        prefix = "code"
    else:
        config = TrainConfig(steps=1, buckets=(max_length,))
        train_ex, dropped = tokenize_pairs(load_pairs(os.path.join(data_dir, "train.tsv")),
                                           tokenizer, config)
        valid_ex, _ = tokenize_pairs(load_pairs(os.path.join(data_dir, "valid.tsv")), tokenizer,
                                     config)
        alpha_inputs = [x for x, _ in valid_ex[:run.alpha_sentences]]
        alpha_len, prefix = max_length, "mini"
    target = _load_target(run.target_model, run.target_checkpoint, decoder_only)
    os.makedirs(run.export_dir, exist_ok=True)
    os.makedirs(run.model_dir, exist_ok=True)
    if run.gin_config is not None:
        with open(os.path.join(run.model_dir, "config.gin"), "w") as f:
            f.write(run.gin_config)
    summaries = {}
    for k, (kind, fit) in enumerate((("unigram", ngram.fit_unigram), ("bigram", ngram.fit_bigram))):
        start, name = time.time(), f"{prefix}_{kind}"
        draft = fit([y for _, y in train_ex], tokenizer.vocab_size, run.smoothing)
        path = os.path.join(run.export_dir, name + ".npz")
        np.savez_compressed(path, kind=np.asarray(kind),
                            log_probs=np.asarray(draft.params["log_probs"], np.float32))
        summaries[name] = {
            "name": name, "kind": kind, "file": os.path.basename(path),
            "smoothing": run.smoothing, "params": num_params(draft.params),
            ("train_chunks" if decoder_only else "train_pairs"): len(train_ex),
            "train_dropped": dropped, "fit_wall_s": round(time.time() - start, 1),
            "alpha": draft_alpha(target, type(draft).load(path, decoder_only=decoder_only),
                                 alpha_inputs,
                                 rng=jax.random.fold_in(jax.random.PRNGKey(run.seed), k),
                                 gamma=run.alpha_gamma, max_length=alpha_len)}
        if decoder_only:
            summaries[name].update(decoder_only=True, chunk_length=max_length)
        logging.info("%s: %s", name, summaries[name])
        update_card(run.export_dir, name, summaries[name])
    _write_json(os.path.join(run.model_dir, "summary.json"), summaries)
    return summaries
