"""The trainer: one run's optimisation settings (`TrainConfig`), T5X's learning-rate schedule
and optimizer, the training state with its jitted train and eval steps, and the resumable state
of a run on disk (`ResumableRun`). `training.train` drives them:

    optimizer = make_optimizer(config)
    state = init_state(module, optimizer, rng)                 # or from an init_checkpoint
    train_step = make_train_step(module, optimizer, config)
    state, metrics = train_step(state, inputs, targets, rng)   # jitted, state donated
    valid_loss = evaluate_loss(make_eval_step(module), state.params, examples, config)

The step minimises `config.objective`'s loss (speculative/training/objectives.py); reported
losses are always the plain cross-entropy (nats per target token, EOS included).

Shape legend: B batch, L length, k the teacher's top-k.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import struct

from speculative import files
from speculative.checkpoints import t5x as checkpoints
from speculative.models import t5
from speculative.training.data import batches
from speculative.training.objectives import (
    Module,
    teacher_forced_logits,
    teacher_losses,
    token_losses,
)
from speculative.training.train_config import TrainConfig

Array = jax.Array


# -------------------------------------------------------------------------------------- optimizer

def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
    peak, warm = config.learning_rate, max(1, config.warmup_steps)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32) + 1.0
        warmup = peak * jnp.minimum(1.0, step / warm)
        if config.decay == "constant":
            return warmup
        if config.decay == "rsqrt":
            return jnp.where(step < warm, warmup, peak * jnp.sqrt(warm / step))
        frac = jnp.clip((step - warm) / max(1, config.steps - warm), 0.0, 1.0)
        cosine = config.final_lr_fraction + (1 - config.final_lr_fraction) * 0.5 * (
            1 + jnp.cos(jnp.pi * frac))
        return jnp.where(step < warm, warmup, peak * cosine)

    return schedule


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(config)
    chain = [optax.clip_by_global_norm(config.grad_clip)] if config.grad_clip else []
    if config.optimizer == "adafactor":
        # T5X's Adafactor: factored second moments, decay 0.8, update clipping 1, and updates
        # relative to each parameter's RMS (so the N(0, 1) embedding moves as fast as kernels).
        chain.append(optax.adafactor(schedule, decay_rate=0.8, clipping_threshold=1.0,
                                     multiply_by_parameter_scale=True))
    else:
        def decay_mask(params):
            return jax.tree_util.tree_map(lambda p: p.ndim == 2, params)
        chain.append(optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9,
                                 weight_decay=config.weight_decay, mask=decay_mask))
    return optax.chain(*chain)


@struct.dataclass
class TrainState:
    """The trainer's state, donated to each jitted step.

    Attributes:
      step: `[]` int32 optimizer steps taken.
      params: the model's parameter tree (T5X names).
      opt_state: the optax optimizer's state.
    """

    step: Array
    params: Any
    opt_state: Any


def init_state(module: Module, optimizer, rng: Array,
               init_checkpoint: Optional[str] = None) -> TrainState:
    """Step 0 with float32 parameters: T5X initialisation (`t5.init_params`), or the parameters
    of `init_checkpoint` (fine-tuning; checked against the model's names and shapes) with a
    fresh optimizer state."""
    if init_checkpoint:
        params = checkpoints.load_params(init_checkpoint, dtype="float32")
        checkpoints.validate_params(params, module, source=init_checkpoint)
        params = jax.tree_util.tree_map(jnp.asarray, params)
    else:
        params = t5.init_params(module, rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


def make_train_step(module: Module, optimizer, config: TrainConfig):
    """Returns jitted `step(state, inputs, targets, rng[, teacher_ids, teacher_probs]) ->
    (state, metrics)`; state is donated.

    The loss is `config.objective`'s (the teacher's top-k distributions `[B, L, k]` are given
    for 'kl' and 'tv'). metrics: sums over the batch (`loss`, `ce` against `targets`, `tokens`),
    so averages over many steps weight tokens equally. Dropout runs when the model's
    `dropout_rate > 0`.
    """
    dropout = module.config.dropout_rate > 0

    def loss_fn(params, inputs, targets, rng, teacher_ids, teacher_probs):
        logits = teacher_forced_logits(module, params, inputs, targets, enable_dropout=dropout,
                                       rngs={"dropout": rng} if dropout else None)
        loss, ce = token_losses(logits, targets, config.label_smoothing, config.z_loss)
        if config.objective != "ce":
            log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
            loss = (teacher_losses(logits, teacher_ids, teacher_probs, config.objective)
                    + config.z_loss * jnp.square(log_z))
        weights = (targets > 0).astype(jnp.float32)
        tokens = jnp.sum(weights)
        total = jnp.sum(loss * weights)
        return total / jnp.maximum(tokens, 1.0), (total, jnp.sum(ce * weights), tokens)

    def step(state: TrainState, inputs, targets, rng, teacher_ids=None, teacher_probs=None):
        if (config.objective != "ce") != (teacher_ids is not None):
            raise ValueError(f"objective={config.objective!r} needs teacher distributions "
                             "exactly when it is 'kl' or 'tv'.")
        grads, (total, ce, tokens) = jax.grad(loss_fn, has_aux=True)(
            state.params, inputs, targets, jax.random.fold_in(rng, state.step), teacher_ids,
            teacher_probs)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        state = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state)
        return state, {"loss": total, "ce": ce, "tokens": tokens}

    return jax.jit(step, donate_argnums=(0,))


def make_eval_step(module: Module):
    """Jitted `(params, inputs, targets) -> (summed cross-entropy, target tokens)`."""

    def step(params, inputs, targets):
        logits = teacher_forced_logits(module, params, inputs, targets)
        _, ce = token_losses(logits, targets)
        weights = (targets > 0).astype(jnp.float32)
        return jnp.sum(ce * weights), jnp.sum(weights)

    return jax.jit(step)


def evaluate_loss(eval_step, params, examples, config: TrainConfig) -> float:
    """Token-mean cross-entropy (nats) over all `examples` (independent of batching)."""
    total, tokens = 0.0, 0.0
    for inputs, targets in batches(examples, config.buckets, config.batch_tokens,
                                   target_buckets=config.target_buckets):
        ce, n = eval_step(params, inputs, targets)
        total, tokens = total + float(ce), tokens + float(n)
    return total / max(tokens, 1.0)


# ------------------------------------------------------------------------------------- resumption

class ResumableRun:
    """The resumable training state of one run in `model_dir` (see `training.train`).

    `train_state.msgpack` holds `flax.serialization.to_bytes` of the `TrainState` plus the step
    and the training seconds so far; `train_state.json` records the settings it was trained
    with, and `restore` refuses a state written under other settings instead of mixing runs.
    Both are written to a temporary name and renamed, so a run stopped mid-write leaves the
    previous state intact.

    A finished run keeps only `train_state.json`, marked `finished` with its training seconds;
    running the same command again (same settings) reloads the final float32 checkpoint
    (`checkpoint_<steps>`) instead of training again, so adding an export directory or a target
    to measure alpha against only redoes what follows training.
    """

    def __init__(self, model_dir: str, settings: dict):
        self.model_dir, self.settings = model_dir, json.loads(json.dumps(settings))
        self.path = os.path.join(model_dir, "train_state.msgpack")
        self.meta_path = os.path.join(model_dir, "train_state.json")

    def restore(self, state: TrainState) -> Tuple[TrainState, int, float]:
        """-> (state, first step to run, training seconds already spent)."""
        from flax import serialization  # pylint: disable=g-import-not-at-top

        if not os.path.exists(self.path):
            return self._finished(state)
        with open(self.meta_path) as f:
            meta = json.load(f)
        if meta["settings"] != self.settings:
            diff = sorted(k for k in set(meta["settings"]) | set(self.settings)
                          if meta["settings"].get(k) != self.settings.get(k))
            raise ValueError(f"{self.path} was written by a run with other settings ({diff}); "
                             "use another model_dir or delete the state to start over.")
        with open(self.path, "rb") as f:
            saved = serialization.from_bytes({"state": state, "step": 0, "train_s": 0.0},
                                             f.read())
        logging.info("Resuming %s from step %d", self.model_dir, int(saved["step"]))
        return saved["state"], int(saved["step"]) + 1, float(saved["train_s"])

    def _finished(self, state: TrainState) -> Tuple[TrainState, int, float]:
        """A finished run of the same settings: its final parameters, and no step left to run;
        otherwise (no run, or a finished run of other settings, which is trained anew) a fresh
        start."""
        if not os.path.exists(self.meta_path):
            return state, 1, 0.0
        with open(self.meta_path) as f:
            meta = json.load(f)
        final = os.path.join(self.model_dir, f"checkpoint_{meta.get('step')}")
        if not meta.get("finished") or meta["settings"] != self.settings or not os.path.isdir(
                final):
            return state, 1, 0.0
        params = checkpoints.load_params(final, dtype="float32")
        logging.info("%s finished at step %d: reloading %s", self.model_dir, meta["step"], final)
        return state.replace(params=params), int(meta["step"]) + 1, float(meta["train_s"])

    def save(self, state: TrainState, step: int, train_s: float) -> None:
        from flax import serialization  # pylint: disable=g-import-not-at-top

        blob = serialization.to_bytes({"state": jax.device_get(state), "step": step,
                                       "train_s": train_s})
        files.write_atomic(self.path, blob, fsync=True)
        files.write_atomic(self.meta_path, json.dumps({"settings": self.settings, "step": step},
                                                 indent=1).encode())

    def last_record(self) -> dict:
        with open(os.path.join(self.model_dir, "metrics.jsonl")) as f:
            return json.loads(f.read().splitlines()[-1])

    def finish(self, step: int, train_s: float) -> None:
        """The run is complete (checkpoint and summary written): the state is not needed, only
        the record that this run, with these settings, ended at `step` (see the class)."""
        files.write_atomic(self.meta_path, json.dumps(
            {"settings": self.settings, "step": step, "finished": True, "train_s": train_s},
            indent=1).encode())
        if os.path.exists(self.path):
            os.remove(self.path)

