"""Training a block draft (`models/block_draft.py`) on the cached features of a frozen target.

Teacher-forced along the target's cached outputs (`feature_data`), every position of a sentence
is an anchor at once: `BlockDraft.block_logits` runs G copies of the sentence in one forward
under `block_mask` (copy 0 the real tokens, causal; copy d the d-th placeholder of the round
whose last real token is j - d, seeing the real prefix up to that anchor and the earlier
placeholders of its own block). So one forward trains all G depths of every anchor: depth d at
position j is compared with the target's cached top-k distribution p_j, with the objective of
`feature_training.losses` (KL and/or TV over the top-k, renormalised on the hot vocabulary;
per depth a mean over positions, then a mean over depths). The metrics also give, per depth,
the top-1 agreement with the target (`top1_d<d>`, the T = 0 acceptance of that depth along the
target's text) and `accept_d<d>` = sum_x min(p, q) over the top-k (the T = 1 acceptance
estimate).

A run warm-starts from a trained feature draft (`block_draft.from_feature_draft`: its
parameters, the placeholder stream's layers as copies of its own, fresh placeholders) and by
default trains the placeholder stream only (`freeze_feature_draft`), so q_1 stays the feature
draft's. It uses T5X's Adafactor with warmup and cosine decay (the
project's recipe, `trainer.make_optimizer`), saves `model_dir/train_state.msgpack` every
`checkpoint_every` steps (atomically) and resumes from it with the same data order; a finished
run writes `params.msgpack` (float32). The cost of a step is about G times a plain forward of
its real tokens: `batch_tokens` counts real tokens.

Shape legend: B batch, L length, G gamma, V vocab, k top-k.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from speculative import files
from speculative.models import block_draft as bd
from speculative.training import feature_data, feature_training, trainer
from speculative.training.config import TrainConfig

Array = jax.Array
EVAL_EPOCH = 2**31 - 1  # the seed of the held-out batches' (irrelevant) order


@dataclasses.dataclass(frozen=True)
class BlockTrainConfig:
    """Settings of one run (all recorded in `model_dir/train_config.json`).

    Attributes:
      steps: optimizer steps.
      gamma: the block size trained (all depths 1..gamma); at most the draft's `max_gamma`.
      batch_tokens: padded real tokens per batch (rows = batch_tokens // bucket length); the
        forward holds gamma times as many rows.
      buckets: padded lengths (source and output share one).
      objective: as `FeatureTrainConfig.objective` ('kl', 'tv', 'ce' joined by '+').
      optimizer, learning_rate, warmup_steps: `trainer.make_optimizer`'s; cosine decay to 10%.
      checkpoint_every: steps between saved states (and held-out evaluations).
      max_shards: the first shards of the cache only (None = all complete ones).
      extra_caches: more caches of the same target (e.g. sampled translations) for training.
      valid_sentences: the main cache's last sentences, held out and scored at checkpoints.
      seed: placeholder initialisation and batch order.
      freeze_feature_draft: train the placeholder stream only (`bd.is_block_param`): the real
        stream, so q_1, stays the warm start's exactly (False: train every parameter; the
        placeholders then pull the shared parameters away from q_1).
    """

    steps: int = 2000
    gamma: int = 8
    batch_tokens: int = 512
    buckets: Tuple[int, ...] = (16, 24, 32, 48)
    objective: str = "kl+tv"
    optimizer: str = "adafactor"
    learning_rate: float = 0.01
    warmup_steps: int = 100
    checkpoint_every: int = 250
    max_shards: Optional[int] = None
    extra_caches: Tuple[str, ...] = ()
    valid_sentences: int = 256
    seed: int = 0
    freeze_feature_draft: bool = True

    def __post_init__(self):
        feature_training.check_train_settings(
            self, ("steps", "gamma", "batch_tokens", "checkpoint_every", "valid_sentences"))


# ------------------------------------------------------------------------------------ objectives

def depth_metrics(logits: Array, top_ids: Array, top_probs: Array, weights: Array,
                  hot_ids: Tuple[int, ...] = ()) -> Dict[str, Array]:
    """Per depth d: `accept_d<d>` = sum_x min(p, q) over the teacher's top-k (renormalised on
    the hot set, as the loss), the T = 1 acceptance estimate. `logits [G, B, L, V]`."""
    out = {}
    pos = jnp.arange(logits.shape[2])
    for d in range(logits.shape[0]):
        w = weights * (pos[None] >= d)
        _, m = feature_training.losses(logits[d:d + 1], top_ids, top_probs, w, "tv", hot_ids)
        out[f"accept_d{d + 1}"] = 1.0 - m["tv"]
    return out


def _optimizer(config: BlockTrainConfig) -> optax.GradientTransformation:
    return trainer.make_optimizer(TrainConfig(
        steps=config.steps, learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps, optimizer=config.optimizer, decay="cosine",
        final_lr_fraction=0.1, grad_clip=1.0))


def step_fns(module: bd.BlockDraft, optimizer, config: BlockTrainConfig):
    """(train_step(params, opt_state, batch), eval_step(params, batch)), both jitted."""
    hot = module.config.hot_ids

    def trainable(name):
        return bd.is_block_param(name) or not config.freeze_feature_draft

    def forward(params, batch):
        params = {k: v if trainable(k) else jax.lax.stop_gradient(v) for k, v in params.items()}
        logits = module.apply({"params": params}, batch["encoded"], batch["encoder_mask"],
                              batch["tokens"], batch["features"], config.gamma,
                              method="block_logits")
        loss, metrics = feature_training.losses(logits, batch["top_ids"], batch["top_probs"],
                                                batch["weights"], config.objective, hot)
        return loss, (metrics, logits)

    def loss_fn(params, batch):
        loss, (metrics, _) = forward(params, batch)
        return loss, metrics

    @jax.jit
    def train_step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        updates = {k: v if trainable(k) else jax.tree_util.tree_map(jnp.zeros_like, v)
                   for k, v in updates.items()}
        return optax.apply_updates(params, updates), opt_state, loss, metrics

    @jax.jit
    def eval_step(params, batch):
        loss, (metrics, logits) = forward(params, batch)
        metrics = {**metrics, **depth_metrics(logits, batch["top_ids"], batch["top_probs"],
                                               batch["weights"], hot)}
        return loss, metrics

    return train_step, eval_step


# ------------------------------------------------------------------------------------ the data

def _batches(corpus: feature_training.Corpus, config: BlockTrainConfig, rows: np.ndarray,
             epoch: int, skip: int = 0) -> Iterator[Dict[str, np.ndarray]]:
    """One shuffled pass (epoch `epoch`, seeded) over `rows`, bucketed by length, from its
    batch `skip` on (skipped batches are not built: a resumed run starts at once)."""
    rng = np.random.default_rng([config.seed, epoch])
    plan = corpus.plan(config, rows, rng)
    for k in rng.permutation(len(plan))[skip:]:
        idx, length, per = plan[k]
        yield corpus.batch(idx, length, per)


def evaluate(eval_step, params, corpus, rows, config: BlockTrainConfig) -> Dict[str, float]:
    """Metrics over `rows` (token-weighted means of the batches)."""
    totals, count = {}, 0.0
    for batch in _batches(corpus, config, rows, epoch=EVAL_EPOCH):
        _, metrics = eval_step(params, batch)
        n = float(np.sum(batch["weights"]))
        for k, v in jax.device_get(metrics).items():
            totals[k] = totals.get(k, 0.0) + float(v) * n
        count += n
    return {k: v / count for k, v in totals.items()}


def load_corpus(cache_dir: str, config: BlockTrainConfig,
                feature_layers: Tuple[int, ...]) -> feature_training.Corpus:
    """The cache's sentences with the feature columns of `feature_layers` (checked against
    the manifest)."""
    manifest = feature_data.read_manifest(cache_dir)
    if not set(feature_layers) <= set(manifest["feature_layers"]):
        raise ValueError(f"The draft reads target layers {feature_layers}; the cache in "
                         f"{cache_dir} holds {manifest['feature_layers']}.")
    corpus = feature_training.Corpus.load(cache_dir, config.max_shards, config.extra_caches)
    cached = list(manifest["feature_layers"])
    if list(feature_layers) != cached:
        width = manifest["emb_dim"]
        corpus.feat = np.concatenate(
            [corpus.feat[:, cached.index(i) * width:(cached.index(i) + 1) * width]
             for i in feature_layers], axis=1) if feature_layers else corpus.feat[:, :0]
    longest = int(np.max(np.maximum(corpus.src_len, corpus.out_len)))
    if longest > config.buckets[-1]:
        raise ValueError(f"The cache holds sentences of {longest} tokens, more than the largest "
                         f"bucket {config.buckets[-1]}; add a bucket of at least {longest}.")
    return corpus


# ------------------------------------------------------------------------------------ the run

def train(*, module: bd.BlockDraft, config: BlockTrainConfig, cache_dir: str, model_dir: str,
          init_params: Callable[[], Any], stop_at: Optional[int] = None,
          log: Callable[[str], None] = print) -> dict:
    """Trains (or resumes) a block draft on the feature cache in `cache_dir`.

    `init_params()` gives the starting parameters (e.g. `bd.from_feature_draft` of a trained
    feature draft; on a resumed run, the template the saved state is read into).
    Writes `model_dir/train_config.json`, `metrics.jsonl`, `train_state.msgpack` (resumable)
    and, at the end, `params.msgpack` (float32). `stop_at` ends this call after that step.
    Returns {step, seconds, valid, done}. Long, as `feature_training.train`'s loop was before
    it was split: the resumable loop (restore, step, evaluate, checkpoint) reads best whole;
    splitting it is the next clean-up."""
    if config.gamma > module.max_gamma:
        raise ValueError(f"gamma={config.gamma} exceeds the draft's max_gamma "
                         f"{module.max_gamma}.")
    manifest = feature_data.read_manifest(cache_dir)
    if module.config.target_emb_dim != manifest["emb_dim"]:
        raise ValueError(f"target_emb_dim={module.config.target_emb_dim} but the cached target "
                         f"has width {manifest['emb_dim']}.")
    os.makedirs(model_dir, exist_ok=True)
    settings = json.loads(json.dumps(dict(
        draft=dataclasses.asdict(module.config), max_gamma=module.max_gamma,
        train=dataclasses.asdict(config), cache_dir=os.path.abspath(cache_dir))))
    settings_path = os.path.join(model_dir, "train_config.json")
    if os.path.exists(settings_path):
        with open(settings_path) as f:
            old = json.load(f)
        if old != settings:
            diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            raise ValueError(f"{model_dir} holds a run with other settings; pass another "
                             f"model_dir. Differences: {diff}")
    else:
        files.write_atomic(settings_path, json.dumps(settings, indent=1).encode())

    corpus = load_corpus(cache_dir, config, module.config.feature_layers)
    main = len(corpus) - corpus.num_extra
    train_rows, valid_rows = corpus.split(min(config.valid_sentences, main - 1) / main)
    logging.info("block training: %d train / %d valid sentences", len(train_rows),
                 len(valid_rows))
    optimizer = _optimizer(config)
    params = init_params()
    opt_state = optimizer.init(params)
    step, seconds = 0, 0.0
    state_path = os.path.join(model_dir, "train_state.msgpack")
    if os.path.exists(state_path):
        with open(state_path, "rb") as f:
            restored = flax.serialization.from_bytes(
                {"params": params, "opt_state": opt_state, "step": 0, "seconds": 0.0}, f.read())
        params, opt_state = restored["params"], restored["opt_state"]
        step, seconds = int(restored["step"]), float(restored["seconds"])
        log(f"{model_dir}: resumed at step {step}")
    train_step, eval_step = step_fns(module, optimizer, config)

    # Resuming replays the data order deterministically: the epoch and the batch within it.
    per_epoch = len(corpus.plan(config, train_rows))
    epoch, skip = divmod(step, per_epoch)
    it = _batches(corpus, config, train_rows, epoch, skip)
    metrics_path = os.path.join(model_dir, "metrics.jsonl")
    window, start, valid = [], time.time(), None
    last = config.steps if stop_at is None else min(stop_at, config.steps)
    while step < last:
        try:
            batch = next(it)
        except StopIteration:
            epoch += 1
            it = _batches(corpus, config, train_rows, epoch)
            continue
        params, opt_state, _, metrics = train_step(params, opt_state, batch)
        step += 1
        window.append(metrics)
        if step % config.checkpoint_every == 0 or step == last:
            window = jax.device_get(window)
            seconds += time.time() - start
            valid = evaluate(eval_step, params, corpus, valid_rows, config)
            row = {"step": step, "seconds": round(seconds, 1),
                   "train": {k: float(np.mean([m[k] for m in window])) for k in window[0]},
                   "valid": valid}
            window = []
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            files.write_atomic(state_path, flax.serialization.to_bytes(
                {"params": params, "opt_state": opt_state, "step": step, "seconds": seconds}))
            depths = " ".join(f"{valid[f'top1_d{d}']:.2f}/{valid[f'accept_d{d}']:.2f}"
                              for d in range(1, config.gamma + 1))
            log(f"{model_dir}: step {step}/{config.steps} {seconds:.0f}s train kl "
                f"{row['train']['kl']:.3f} tv {row['train']['tv']:.3f} | valid kl "
                f"{valid['kl']:.3f} top1/accept per depth {depths}")
            start = time.time()
    done = step == config.steps
    if done:
        files.write_atomic(os.path.join(model_dir, "params.msgpack"),
                           flax.serialization.to_bytes(params))
    return {"step": step, "seconds": seconds, "valid": valid, "done": done}


def load_params(model_dir: str, module: bd.BlockDraft) -> Any:
    """The float32 parameters a finished run wrote."""
    template = bd.init_params(module, jax.random.PRNGKey(0))
    with open(os.path.join(model_dir, "params.msgpack"), "rb") as f:
        return flax.serialization.from_bytes(template, f.read())
