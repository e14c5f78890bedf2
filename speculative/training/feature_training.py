"""Training a target-aware draft on the cached features of a frozen target (`feature_data`).

The draft learns the target's next-token distributions along the target's own outputs: at
every position j and every unrolled depth d (training-time test, `FeatureDraft.__call__`), the
loss compares the draft's q^d_j with the cached top-k p_j (renormalised over its k tokens):

    kl:  sum_x p(x) (log p(x) - log q(x))              (the whole distribution; T = 0 and 1)
    tv:  1 - sum_x min(p(x), q(x))                     (one minus the acceptance rate at T = 1)
    ce:  -log q(argmax p)                              (the token a greedy decode accepts)

summed over the objective's terms ('kl+tv'), averaged over positions, and over depths with equal
weights. A draft with the target's output layer (`target_head`, EAGLE's) may also regress its
guess of the target's top-layer state on the cached one (`state_loss_weight`: Huber loss between
the two, each RMS-normalised, as the target's final norm sees them); the copied head itself is
frozen. T5X's Adafactor (the project's optimizer recipe) with linear warmup and cosine decay,
global-norm clipping 1. The state is saved every `checkpoint_every` steps to
`model_dir/train_state.msgpack` (atomically), and a run resumes from it.

Shape legend: B batch, L length, E embed, F feature width, k top-k, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from speculative import files
from speculative.models import feature_draft as fd
from speculative.training import feature_data, trainer
from speculative.training.train_config import TrainConfig

Array = jax.Array


OBJECTIVE_TERMS = ("kl", "tv", "ce")


@dataclasses.dataclass(frozen=True)
class FeatureTrainConfig:
    """Settings of one training run (all recorded in `model_dir/train_config.json`).

    Attributes:
      steps: optimizer steps.
      batch_tokens: padded target tokens per batch (rows = batch_tokens // bucket length).
      buckets: padded lengths (source and output share one).
      depth: unrolled draft steps per position (1 = no training-time test).
      objective: 'kl', 'tv', 'ce' or a sum of them joined by '+' ('kl+tv', 'kl+tv+ce'):
        'ce' is the cross-entropy of the target's own argmax, the token a greedy decode
        accepts (the T = 0 acceptance is the draft's argmax hitting it).
      optimizer: 'adafactor' (T5X's, relative updates) or 'adamw' (`trainer.make_optimizer`).
      learning_rate, warmup_steps: the peak rate and its linear warmup; cosine decay to 10%.
      checkpoint_every: steps between saved training states.
      max_shards: use the first shards of the cache only (None = all).
      extra_caches: more feature caches of the same target and layers (e.g. its sampled
        translations of the same sources, `feature_cache.temperature=1.0`) whose sentences
        join the training rows; the held-out rows stay the main cache's last ones.
      seed: parameter initialisation and batch order.
      init_from: a finished run's directory whose parameters start this one (a second stage,
        with its own schedule and batch order), instead of a random initialisation.
      state_loss_weight: weight of the top-layer state regression (`target_head` drafts whose
        last feature layer is the target's top layer; 0 = off).
    """

    steps: int = 4000
    batch_tokens: int = 2048
    buckets: Tuple[int, ...] = (16, 24, 32, 48)
    depth: int = 3
    objective: str = "kl"
    optimizer: str = "adafactor"
    learning_rate: float = 0.02
    warmup_steps: int = 100
    checkpoint_every: int = 250
    max_shards: Optional[int] = None
    extra_caches: Tuple[str, ...] = ()
    seed: int = 0
    init_from: Optional[str] = None
    state_loss_weight: float = 0.0

    def __post_init__(self):
        check_train_settings(self, ("steps", "batch_tokens", "depth", "checkpoint_every"))
        if not self.state_loss_weight >= 0:
            raise ValueError(f"state_loss_weight={self.state_loss_weight!r} must be >= 0.")


def check_train_settings(config, positive: Sequence[str]) -> None:
    """The checks a feature-cache training config shares (`FeatureTrainConfig`,
    `block_training.BlockTrainConfig`): `buckets` and `extra_caches` as tuples (a bare string
    refused), the `positive` fields ints >= 1, `objective` a '+'-sum of `OBJECTIVE_TERMS`, a
    positive learning rate; each message names the config's field."""
    name = type(config).__name__
    object.__setattr__(config, "buckets", tuple(int(b) for b in config.buckets))
    if isinstance(config.extra_caches, str):
        raise ValueError(f"{name}.extra_caches={config.extra_caches!r} is a sequence of cache "
                         "directories: write (\"dir\",).")
    object.__setattr__(config, "extra_caches", tuple(str(d) for d in config.extra_caches))
    for field in positive:
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}.{field}={value!r} must be an int >= 1.")
    terms = str(config.objective).split("+")
    if not set(terms) <= set(OBJECTIVE_TERMS) or len(set(terms)) != len(terms):
        raise ValueError(f"{name}.objective={config.objective!r}: use one or more of "
                         f"{OBJECTIVE_TERMS} joined by '+', each once (e.g. 'kl+tv').")
    if not config.learning_rate > 0:
        raise ValueError(f"{name}.learning_rate={config.learning_rate!r} must be > 0.")


# ------------------------------------------------------------------------------------- the data

@dataclasses.dataclass
class Corpus:
    """The cached sentences, ragged arrays with offsets (see `feature_data`)."""

    src: np.ndarray  # [n, L_in] int
    out: np.ndarray  # [n, N] int
    src_len: np.ndarray  # [n]
    out_len: np.ndarray  # [n]
    enc: np.ndarray  # [sum src_len, T] uint16 (bfloat16 bits)
    feat: np.ndarray  # [sum out_len, F] uint16
    top_ids: np.ndarray  # [sum out_len, k] int16
    top_probs: np.ndarray  # [sum out_len, k] float16
    num_extra: int = 0  # leading sentences from extra caches (never held out)
    enc_start: np.ndarray = None
    out_start: np.ndarray = None

    def __post_init__(self):
        self.enc_start = np.concatenate([[0], np.cumsum(self.src_len)[:-1]]).astype(np.int64)
        self.out_start = np.concatenate([[0], np.cumsum(self.out_len)[:-1]]).astype(np.int64)

    def __len__(self):
        return len(self.out_len)

    @classmethod
    def load(cls, cache_dir: str, max_shards: Optional[int] = None,
             extra_caches: Sequence[str] = ()) -> "Corpus":
        """The shards of `extra_caches` (all of each), then the first `max_shards` of
        `cache_dir`: its sentences come last, so the held-out tail is always its own."""
        shards = [s for d in extra_caches for s in feature_data.load_shards(d)]
        num_extra = sum(len(s["out_len"]) for s in shards)
        shards += feature_data.load_shards(cache_dir, max_shards)
        # Each key's shard arrays are dropped once joined: the peak is the corpus plus one key.
        cat = {k: np.concatenate([s.pop(k) for s in shards]) for k in
               ("out_len", "enc", "feat", "top_ids", "top_probs")}
        for k in ("src", "out"):  # caches built with other length limits: pad to the widest
            width = max(s[k].shape[1] for s in shards)
            cat[k] = np.concatenate([np.pad(s[k], ((0, 0), (0, width - s[k].shape[1])))
                                     for s in shards])
        src_len = np.sum(cat["src"] > 0, axis=1)
        return cls(src=cat["src"], out=cat["out"], src_len=src_len, out_len=cat["out_len"],
                   enc=cat["enc"], feat=cat["feat"], top_ids=cat["top_ids"],
                   top_probs=cat["top_probs"], num_extra=num_extra)

    def split(self, valid_fraction: float) -> Tuple[np.ndarray, np.ndarray]:
        """(training rows, held-out rows): the held-out rows are the last `valid_fraction`
        (at least one) of the main cache's sentences, whatever extra caches add, and no
        training row has a held-out row's source (an extra cache of the same sources, e.g. the
        target's sampled translations, would otherwise train on the held-out sentences)."""
        num_valid = max(1, int((len(self) - self.num_extra) * valid_fraction))
        valid = np.arange(len(self) - num_valid, len(self))
        held = {self.src[i].tobytes() for i in valid if self.src_len[i]}  # (a corpus chunk of a
        train = [i for i in range(len(self) - num_valid)  # decoder-only target has no source)
                 if not self.src_len[i] or self.src[i].tobytes() not in held]
        return np.asarray(train, np.int64), valid

    def batch(self, rows: Sequence[int], length: int, num_rows: int) -> Dict[str, np.ndarray]:
        """Padded arrays of `rows` (filler rows all padding, zero weight)."""
        width_t, width_f = self.enc.shape[1], self.feat.shape[1]
        k = self.top_ids.shape[1]
        out = dict(encoded=np.zeros((num_rows, length, width_t), np.float32),
                   encoder_mask=np.zeros((num_rows, length), bool),
                   tokens=np.zeros((num_rows, length), np.int32),
                   features=np.zeros((num_rows, length, width_f), np.float32),
                   top_ids=np.zeros((num_rows, length, k), np.int32),
                   top_probs=np.zeros((num_rows, length, k), np.float32),
                   weights=np.zeros((num_rows, length), np.float32))
        for r, i in enumerate(rows):
            ls, lo = int(self.src_len[i]), int(self.out_len[i])
            e, o = self.enc_start[i], self.out_start[i]
            out["encoded"][r, :ls] = feature_data.from_bits(self.enc[e:e + ls])
            out["encoder_mask"][r, :ls] = True
            out["tokens"][r, 1:lo] = self.out[i, :lo - 1]  # BOS, y_1 .. y_{m-1}
            out["features"][r, :lo] = feature_data.from_bits(self.feat[o:o + lo])
            out["top_ids"][r, :lo] = self.top_ids[o:o + lo]
            out["top_probs"][r, :lo] = self.top_probs[o:o + lo]
            out["weights"][r, :lo] = 1.0
        return out

    def plan(self, config: FeatureTrainConfig, rows: np.ndarray,
             rng: Optional[np.random.Generator] = None) -> List[Tuple[np.ndarray, int, int]]:
        """One pass over `rows` as (row indices, bucket length, rows per batch), bucketed by
        length; shuffled within buckets with `rng` (the number of batches never depends on
        it)."""
        lengths = np.maximum(self.src_len[rows], self.out_len[rows])
        bucket_of = np.searchsorted(config.buckets, lengths)
        plan = []
        for b, length in enumerate(config.buckets):
            idx = rows[bucket_of == b]
            if rng is not None:
                idx = rng.permutation(idx)
            per = max(1, config.batch_tokens // length)
            plan += [(idx[s:s + per], length, per) for s in range(0, len(idx), per)]
        return plan

    def batches(self, config: FeatureTrainConfig, rng: np.random.Generator,
                rows: Optional[np.ndarray] = None,
                skip: int = 0) -> Iterator[Dict[str, np.ndarray]]:
        """One shuffled pass over `rows` (default: all), bucketed by length, from its batch
        `skip` on (the skipped batches are not built: a resumed run starts at once)."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows)
        plan = self.plan(config, rows, rng)
        for k in rng.permutation(len(plan))[skip:]:
            idx, length, per = plan[k]
            yield self.batch(idx, length, per)


# ------------------------------------------------------------------------------------ objectives

def losses(logits: Array, top_ids: Array, top_probs: Array, weights: Array,
           objective: str, hot_ids: Tuple[int, ...] = (), states: Optional[Array] = None,
           target_states: Optional[Array] = None,
           state_loss_weight: float = 0.0) -> Tuple[Array, Dict[str, Array]]:
    """Mean loss over depths and weighted positions; `logits [D, B, L, V]`, teacher `[B, L, k]`.

    Position j at depth d counts only when j >= d - 1 (a round can draft it at that depth).
    With a hot vocabulary (`hot_ids`: q is zero elsewhere) the teacher is its top-k restricted
    to the hot set and renormalised there (KL to a distribution q cannot reach is infinite).
    With `states [D, B, L, T]` (a `target_head` draft's guesses of the target's top-layer state)
    and `target_states [B, L, T]` (the cached ones), the metrics include their Huber distance
    after RMS normalisation ("state"), added to the loss with `state_loss_weight`."""
    depth, _, length, vocab = logits.shape
    if hot_ids:
        allowed = np.zeros(vocab, bool)
        allowed[np.asarray(hot_ids)] = True
        top_probs = top_probs * jnp.asarray(allowed)[top_ids]
    p = top_probs / jnp.maximum(jnp.sum(top_probs, -1, keepdims=True), 1e-9)
    logq = jax.nn.log_softmax(logits, axis=-1)
    logq_top = jnp.take_along_axis(logq, jnp.broadcast_to(top_ids, logq.shape[:-1] + (
        top_ids.shape[-1],)), axis=-1)
    kl = jnp.sum(p * (jnp.log(jnp.maximum(p, 1e-9)) - logq_top), -1)  # [D, B, L]
    tv = 1.0 - jnp.sum(jnp.minimum(p, jnp.exp(logq_top)), -1)
    best = top_ids[..., :1]  # the target's argmax (the teacher's top-k is sorted)
    ce = -jnp.take_along_axis(logq, jnp.broadcast_to(best, logq.shape[:-1] + (1,)), -1)[..., 0]
    if hot_ids:  # an argmax outside the hot set is a token q cannot give: no gradient there
        ce = jnp.where(jnp.asarray(allowed)[best[..., 0]], ce, 0.0)
    argmax_hit = (jnp.argmax(logits, -1) == best[..., 0]).astype(jnp.float32)
    pos = jnp.arange(length)
    w = weights[None] * (pos[None, None, :] >= jnp.arange(depth)[:, None, None])
    w = w / jnp.maximum(jnp.sum(w, axis=(1, 2), keepdims=True), 1.0)  # per depth, then mean

    def mean(x):
        return jnp.sum(x * w) / depth

    metrics = {"kl": mean(kl), "tv": mean(tv), "ce": mean(ce), "top1": mean(argmax_hit)}
    total = sum(metrics[term] for term in objective.split("+"))
    if states is not None:
        def normed(x):
            return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + 1e-6)

        state = jnp.mean(optax.huber_loss(normed(states), normed(target_states)[None]), -1)
        metrics["state"] = mean(state)
        total = total + state_loss_weight * metrics["state"]
    for d in range(depth):
        metrics[f"top1_d{d + 1}"] = jnp.sum(argmax_hit[d] * w[d])
    return total, metrics


# ------------------------------------------------------------------------------------ the trainer

def optimizer_for(config) -> optax.GradientTransformation:
    """The optimizer of a feature-cache run (`FeatureTrainConfig`, `BlockTrainConfig`): the
    project's recipe (`trainer.make_optimizer`), T5X's Adafactor, whose updates are relative to
    each parameter's scale, so the N(0, 1) embedding (which is also the output layer) learns as
    fast as the kernels (plain Adam moves it ~100x too slowly), with linear warmup, cosine decay
    to 10% and global-norm clipping 1."""
    return trainer.make_optimizer(TrainConfig(
        steps=config.steps, learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps, optimizer=config.optimizer, decay="cosine",
        final_lr_fraction=0.1, grad_clip=1.0))


def _step_fns(module: fd.FeatureDraft, optimizer, config: FeatureTrainConfig):
    cfg = module.config

    def loss_fn(params, batch):
        if cfg.target_head:  # the target's copied head stays as it is
            params = {k: jax.lax.stop_gradient(v) if k in fd.FROZEN else v
                      for k, v in params.items()}
        out = module.apply({"params": params}, batch["encoded"], batch["encoder_mask"],
                           batch["tokens"], batch["features"], config.depth,
                           return_states=cfg.target_head)
        logits, states, target_states = out, None, None
        if cfg.target_head:  # the last feature layer is the target's top layer (`train`)
            logits, states = out
            target_states = batch["features"][..., -cfg.target_emb_dim:]
        return losses(logits, batch["top_ids"], batch["top_probs"], batch["weights"],
                      config.objective, cfg.hot_ids, states, target_states,
                      config.state_loss_weight)

    @jax.jit
    def train_step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, metrics

    @jax.jit
    def eval_step(params, batch):
        return loss_fn(params, batch)

    return train_step, eval_step


def train(*, draft_config: fd.FeatureDraftConfig, config: FeatureTrainConfig, cache_dir: str,
          model_dir: str, valid_fraction: float = 0.02, stop_at: Optional[int] = None,
          target=None) -> dict:
    """Trains (or resumes) a target-aware draft on the feature cache in `cache_dir`.

    A `target_head` draft needs the cache's `target` (a `t5` model with `.module.config` and
    `.params`) to copy its final norm and output table from (`fd.with_target_head`).

    Writes `model_dir/train_config.json`, `metrics.jsonl`, `train_state.msgpack` (resumable)
    and, at the end, `params.msgpack` (float32). A held-out `valid_fraction` of the sentences
    (the last ones) is scored every checkpoint. `stop_at` ends this call after that step (a
    piece of the run; call again to go on). Returns the final metrics (`run`)."""
    manifest = feature_data.read_manifest(cache_dir)
    _check_setup(draft_config, config, cache_dir, manifest, target)
    os.makedirs(model_dir, exist_ok=True)
    write_or_check_settings(model_dir, dict(
        draft=dataclasses.asdict(draft_config), train=dataclasses.asdict(config),
        cache_dir=os.path.abspath(cache_dir), valid_fraction=valid_fraction),
        dict(train=FeatureTrainConfig, draft=fd.FeatureDraftConfig))
    corpus = load_corpus(cache_dir, config, draft_config.feature_layers)
    train_rows, valid_rows = corpus.split(valid_fraction)
    logging.info("feature training: %d train / %d valid sentences", len(train_rows),
                 len(valid_rows))

    module = fd.FeatureDraft(draft_config)
    optimizer = optimizer_for(config)
    params = (load_params(config.init_from, draft_config) if config.init_from
              else fd.init_params(module, jax.random.PRNGKey(config.seed)))
    if draft_config.target_head:
        params = fd.with_target_head(draft_config, params, target.params,
                                     target.module.config)
    train_step, eval_step = _step_fns(module, optimizer, config)

    def describe(train_means, valid):
        return (f"train kl {train_means['kl']:.3f} top1 {train_means['top1']:.3f} | valid "
                + " ".join(f"{k} {v:.3f}" for k, v in valid.items()))

    return run(model_dir=model_dir, config=config, corpus=corpus, train_rows=train_rows,
               valid_rows=valid_rows, params=params, optimizer=optimizer,
               train_step=train_step, eval_step=eval_step, stop_at=stop_at, describe=describe)


# ------------------------------------------------------------------- the loop both trainers run

def run(*, model_dir: str, config, corpus: Corpus, train_rows: np.ndarray,
        valid_rows: np.ndarray, params: Any, optimizer: optax.GradientTransformation,
        train_step: Callable, eval_step: Callable, stop_at: Optional[int] = None,
        describe: Callable[[Dict[str, float], Dict[str, float]], str],
        log: Callable[[str], None] = functools.partial(print, flush=True)) -> dict:
    """The resumable loop of a feature-cache run (`train`, `block_training.train`).

    Restores `model_dir/train_state.msgpack` if there is one (else starts from `params`),
    replays the data order to the step it stopped at (epoch `step // batches per epoch`, seeded
    with `config.seed`; the skipped batches are not built), runs `train_step(params, opt_state,
    batch) -> (params, opt_state, loss, metrics)` up to `config.steps` (or `stop_at`), and every
    `config.checkpoint_every` steps and at the last: scores `valid_rows` (`evaluate`), appends
    a row to `metrics.jsonl`, `log`s `describe(train means, valid)` and saves the state
    atomically. A finished run writes `params.msgpack` (float32).
    Returns {step, seconds, valid, done}."""
    state_path = os.path.join(model_dir, "train_state.msgpack")
    params, opt_state, step, seconds = _restore(state_path, params, optimizer.init(params))
    per_epoch = len(corpus.plan(config, train_rows))
    epoch, skip = divmod(step, per_epoch)
    it = corpus.batches(config, np.random.default_rng([config.seed, epoch]), train_rows, skip)
    metrics_path = os.path.join(model_dir, "metrics.jsonl")
    window, start, valid = [], time.time(), None
    last = config.steps if stop_at is None else min(stop_at, config.steps)
    while step < last:
        try:
            batch = next(it)
        except StopIteration:
            epoch += 1
            it = corpus.batches(config, np.random.default_rng([config.seed, epoch]), train_rows)
            continue
        params, opt_state, _, metrics = train_step(params, opt_state, batch)
        step += 1
        window.append(metrics)  # fetched at the checkpoint: the steps run ahead meanwhile
        if step % config.checkpoint_every == 0 or step == last:
            window = jax.device_get(window)
            seconds += time.time() - start
            valid = evaluate(eval_step, params, corpus, valid_rows, config)
            means = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
            window = []
            with open(metrics_path, "a") as f:
                f.write(json.dumps({"step": step, "seconds": round(seconds, 1), "train": means,
                                    "valid": valid}) + "\n")
            files.write_atomic(state_path, flax.serialization.to_bytes(
                {"params": params, "opt_state": opt_state, "step": step, "seconds": seconds}))
            log(f"{model_dir}: step {step}/{config.steps} {seconds:.0f}s "
                f"{describe(means, valid)}")
            start = time.time()
    done = step == config.steps
    if done:
        files.write_atomic(os.path.join(model_dir, "params.msgpack"),
                           flax.serialization.to_bytes(params))
    return {"step": step, "seconds": seconds, "valid": valid, "done": done}


def _restore(state_path: str, params, opt_state):
    """`(params, opt_state, step, seconds)` of the run saved at `state_path`, or of a new run."""
    if not os.path.exists(state_path):
        return params, opt_state, 0, 0.0
    with open(state_path, "rb") as f:
        restored = flax.serialization.from_bytes(
            {"params": params, "opt_state": opt_state, "step": 0, "seconds": 0.0}, f.read())
    step = int(restored["step"])
    logging.info("resumed %s at step %d", os.path.dirname(state_path), step)
    return restored["params"], restored["opt_state"], step, float(restored["seconds"])


def _check_setup(draft_config: fd.FeatureDraftConfig, config: FeatureTrainConfig,
                 cache_dir: str, manifest: dict, target) -> None:
    """Refuses extra caches written with other settings and a draft the cache (or the target)
    cannot feed, before any work."""
    for extra in config.extra_caches:
        other = feature_data.read_manifest(extra)
        diff = {k: (manifest.get(k), other.get(k)) for k in
                ("format", "target", "feature_layers", "emb_dim", "top_k")
                if manifest.get(k) != other.get(k)}
        if diff:
            raise ValueError(f"extra_caches: {extra} was written with other settings than "
                             f"{cache_dir} (main, extra: {diff}); build it with the same "
                             "target, feature layers and top_k.")
    check_cache_fits(draft_config, cache_dir, manifest)
    if config.state_loss_weight and not draft_config.target_head:
        raise ValueError(f"state_loss_weight={config.state_loss_weight} regresses a "
                         "target_head draft's state guesses; set target_head=True or 0.")
    if draft_config.target_head:
        if target is None:
            raise ValueError("A target_head draft copies the target's output layer: pass "
                             "target= (the cache's target model).")
        top = target.module.config.num_decoder_layers
        if not draft_config.feature_layers or draft_config.feature_layers[-1] != top:
            raise ValueError(f"A target_head draft reads the target's top layer ({top}) as "
                             f"its last feature layer; feature_layers="
                             f"{draft_config.feature_layers}.")


def check_cache_fits(draft_config: fd.FeatureDraftConfig, cache_dir: str,
                     manifest: dict) -> None:
    """Refuses a draft that reads target layers the cache lacks, or a cache of another width."""
    if not set(draft_config.feature_layers) <= set(manifest["feature_layers"]):
        raise ValueError(f"The draft reads target layers {draft_config.feature_layers}; the "
                         f"cache in {cache_dir} holds {manifest['feature_layers']}.")
    if draft_config.target_emb_dim != manifest["emb_dim"]:
        raise ValueError(f"target_emb_dim={draft_config.target_emb_dim} but the cached target "
                         f"has width {manifest['emb_dim']}.")


def write_or_check_settings(model_dir: str, settings: dict, defaults_of: Dict[str, type]) -> None:
    """Writes `model_dir/train_config.json`, or refuses a run there with other settings.
    `defaults_of` names the dataclass of each dict-valued entry (e.g. 'train'): a field added
    since that run, at its default, is the same setting."""
    settings = json.loads(json.dumps(settings))
    settings_path = os.path.join(model_dir, "train_config.json")
    if not os.path.exists(settings_path):
        files.write_atomic(settings_path, json.dumps(settings, indent=1).encode())
        return
    with open(settings_path) as f:
        old = json.load(f)
    for key, cls in defaults_of.items():
        defaults = json.loads(json.dumps({f.name: f.default for f in dataclasses.fields(cls)
                                          if f.default is not dataclasses.MISSING}))
        old[key] = {**defaults, **old.get(key, {})}
    if old != settings:
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        raise ValueError(f"{model_dir} holds a run with other settings; pass another "
                         f"model_dir. Differences: {diff}")


def load_corpus(cache_dir: str, config, feature_layers: Sequence[int]) -> Corpus:
    """The cache's sentences (the first `config.max_shards` shards, with
    `config.extra_caches`) with the feature columns of `feature_layers` only (held by the
    cache: `check_cache_fits`); refuses sentences longer than the largest bucket."""
    manifest = feature_data.read_manifest(cache_dir)
    corpus = Corpus.load(cache_dir, config.max_shards, config.extra_caches)
    selected = _select_layers(manifest, feature_layers)
    if selected is not None:  # no layers (the encoder-output-only draft): no feature columns
        corpus.feat = (np.concatenate([corpus.feat[:, s] for s in selected], axis=1)
                       if selected else corpus.feat[:, :0])
    longest = int(np.max(np.maximum(corpus.src_len, corpus.out_len)))
    if longest > config.buckets[-1]:
        raise ValueError(f"The cache holds sentences of {longest} tokens, more than the largest "
                         f"bucket {config.buckets[-1]}; add a bucket of at least {longest}.")
    return corpus


def _select_layers(manifest, layers) -> Optional[List[slice]]:
    """Column slices of the cached features for the draft's layers (None: all, in order)."""
    cached = list(manifest["feature_layers"])
    if list(layers) == cached:
        return None
    width = manifest["emb_dim"]
    return [slice(cached.index(i) * width, (cached.index(i) + 1) * width) for i in layers]


def evaluate(eval_step, params, corpus: Corpus, rows: np.ndarray, config) -> Dict[str, float]:
    """Metrics over `rows` (token-weighted mean of the batches; `eval_step(params, batch) ->
    (loss, metrics)`)."""
    totals, count = {}, 0.0
    for batch in corpus.batches(config, np.random.default_rng(0), rows):
        _, metrics = eval_step(params, batch)
        n = float(np.sum(batch["weights"]))
        for k, v in jax.device_get(metrics).items():
            totals[k] = totals.get(k, 0.0) + float(v) * n
        count += n
    return {k: v / count for k, v in totals.items()}


def load_params(model_dir: str, draft_config: fd.FeatureDraftConfig):
    """The float32 parameters a finished run wrote."""
    module = fd.FeatureDraft(draft_config)
    template = fd.init_params(module, jax.random.PRNGKey(0))
    with open(os.path.join(model_dir, "params.msgpack"), "rb") as f:
        return flax.serialization.from_bytes(template, f.read())


def last_valid(model_dir: str) -> Optional[dict]:
    """The last held-out evaluation a training run logged in `model_dir/metrics.jsonl` (None
    before the first): a finished run's, reported when it is reloaded to export."""
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[-1]["valid"] if rows else None
