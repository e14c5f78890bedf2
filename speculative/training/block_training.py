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
draft's. The optimizer and the resumable loop are the feature draft's
(`feature_training.optimizer_for`, `feature_training.run`: T5X's Adafactor with warmup and
cosine decay; the state saved atomically every `checkpoint_every` steps, a run resumed with the
same data order, `params.msgpack` (float32) at the end). The cost of a step is about G times
a plain forward of its real tokens: `batch_tokens` counts real tokens.

Shape legend: B batch, L length, G gamma, V vocab, k top-k.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import optax
from absl import logging

from speculative.models import block_draft as bd
from speculative.training import feature_data, feature_training

Array = jax.Array


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
      optimizer, learning_rate, warmup_steps: `feature_training.optimizer_for`'s.
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


# ------------------------------------------------------------------------------------ the run

def train(*, module: bd.BlockDraft, config: BlockTrainConfig, cache_dir: str, model_dir: str,
          init_params: Callable[[], Any], stop_at: Optional[int] = None,
          log: Callable[[str], None] = print) -> dict:
    """Trains (or resumes) a block draft on the feature cache in `cache_dir`.

    `init_params()` gives the starting parameters (e.g. `bd.from_feature_draft` of a trained
    feature draft; on a resumed run, the template the saved state is read into).
    Writes `model_dir/train_config.json`, `metrics.jsonl`, `train_state.msgpack` (resumable)
    and, at the end, `params.msgpack` (float32): the loop is `feature_training.run`, the
    feature draft's own (`log` gets its line at each checkpoint). `stop_at` ends this call
    after that step. Returns {step, seconds, valid, done}."""
    if config.gamma > module.max_gamma:
        raise ValueError(f"gamma={config.gamma} exceeds the draft's max_gamma "
                         f"{module.max_gamma}.")
    feature_training.check_cache_fits(module.config, cache_dir,
                                      feature_data.read_manifest(cache_dir))
    os.makedirs(model_dir, exist_ok=True)
    feature_training.write_or_check_settings(model_dir, dict(
        draft=dataclasses.asdict(module.config), max_gamma=module.max_gamma,
        train=dataclasses.asdict(config), cache_dir=os.path.abspath(cache_dir)),
        dict(train=BlockTrainConfig, draft=type(module.config)))
    corpus = feature_training.load_corpus(cache_dir, config, module.config.feature_layers)
    main = len(corpus) - corpus.num_extra
    train_rows, valid_rows = corpus.split(min(config.valid_sentences, main - 1) / main)
    logging.info("block training: %d train / %d valid sentences", len(train_rows),
                 len(valid_rows))
    optimizer = feature_training.optimizer_for(config)
    train_step, eval_step = step_fns(module, optimizer, config)

    def describe(train_means, valid):
        depths = " ".join(f"{valid[f'top1_d{d}']:.2f}/{valid[f'accept_d{d}']:.2f}"
                          for d in range(1, config.gamma + 1))
        return (f"train kl {train_means['kl']:.3f} tv {train_means['tv']:.3f} | valid kl "
                f"{valid['kl']:.3f} top1/accept per depth {depths}")

    return feature_training.run(
        model_dir=model_dir, config=config, corpus=corpus, train_rows=train_rows,
        valid_rows=valid_rows, params=init_params(), optimizer=optimizer,
        train_step=train_step, eval_step=eval_step, stop_at=stop_at, describe=describe, log=log)


def load_params(model_dir: str, module: bd.BlockDraft) -> Any:
    """The float32 parameters a finished run wrote."""
    template = bd.init_params(module, jax.random.PRNGKey(0))
    with open(os.path.join(model_dir, "params.msgpack"), "rb") as f:
        return flax.serialization.from_bytes(template, f.read())
