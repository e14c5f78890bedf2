"""A small optax trainer for `t5.Transformer` and `t5.DecoderOnly` (teacher forcing), and
sequence-level distillation.

It trains the bundled EN->DE models (`speculative/data/mini/models/`) on the gettext corpus in
`speculative/data/mini/` on CPU in minutes. The pieces, in data-flow order:

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

Loss: token-mean cross-entropy over non-padding target tokens, optionally with T5X's label
smoothing (the constant that makes the optimum 0 is subtracted) and z-loss `z * log(Z)^2`.
Reported losses are always the plain cross-entropy (nats per target token, EOS included).

Distillation (`distill_targets`): the target model translates the training sources greedily and
those outputs replace the references, so a draft learns to imitate the target's argmax (the
quantity alpha at temperature 0 measures). Drafts trained for alpha (`TrainConfig.objective`)
go further on the same text: `teacher_distributions` records the target's top-k distribution
at every position, and the draft minimises either the KL from it ('kl') or one minus the
acceptance probability sum_x min(p, q) itself ('tv', total variation), the quantity whose mean
is alpha at temperature 1.

Decoder-only language models (`train(decoder_only=True, ...)`, the paper's GPT-like row) train
on the Python-code corpus of `scripts/build_code_corpus.py` (`speculative/data/code/`) with the
same loop, optimizer, schedule, resumption and export: each document's ids plus EOS are cut into
chunks of `config.max_length` tokens (`lm_examples`), each an example with no inputs whose
targets are the chunk, so batching, losses and evaluation are the encoder-decoder's and the
model predicts every next token after BOS. Drafts are measured against a decoder-only target
on prompts made of the first tokens of valid chunks.

Cost (`decoder_flops_per_token`): multiply-adds per generated token are `L_dec * (6 E I + 3 E F
+ 2 I (l_self + l_enc)) + E V` (self-attention q/k/v/o and cross-attention q/o projections, gated
MLP, attention over l_self cached and l_enc encoder positions, output layer); FLOPs are twice
that. Cross-attention keys/values are projected once per sentence, so they are not counted. A
decoder-only model has no cross-attention: `L_dec * (4 E I + 3 E F + 2 I l_self) + E V`.

Shape legend: B batch, L length, V vocab, E embed, I = heads * head_dim, F mlp_dim.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import struct

from speculative import checkpoints, code_corpus, decoding, files
from speculative import metrics as metrics_lib
from speculative import sampling as sampling_lib
from speculative.models import adapters as models_lib
from speculative.models import t5
from speculative.training_data import MINI_DIR as MINI_DIR
from speculative.training_data import NO_INPUTS as NO_INPUTS
from speculative.training_data import PREFIX as PREFIX
from speculative.training_data import Example as Example
from speculative.training_data import Tokenizer as Tokenizer
from speculative.training_data import batches as batches
from speculative.training_data import check_prompt_length as check_prompt_length
from speculative.training_data import lm_examples as lm_examples
from speculative.training_data import lm_prompts as lm_prompts
from speculative.training_data import load_pairs as load_pairs
from speculative.training_data import load_sources as load_sources
from speculative.training_data import make_examples as make_examples
from speculative.training_data import pad_rows as pad_rows
from speculative.training_data import tokenize_pairs as tokenize_pairs

Array = jax.Array
Module = Union[t5.Transformer, t5.DecoderOnly]

PAD_ID, EOS_ID = t5.PAD_ID, t5.EOS_ID
OBJECTIVES = ("ce", "kl", "tv")


# ---------------------------------------------------------------------------------- configuration

@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and batching settings of one run (the model is a separate `T5Config`).

    Attributes:
      steps: optimizer updates.
      batch_tokens: rows per batch are `batch_tokens // L` for bucket length L (per side).
      buckets: padded lengths, ascending; the last is the maximum input and target length.
      truncate: cut over-long pairs to the last bucket (keeping EOS) instead of dropping them.
      optimizer: 'adafactor' (T5X's: relative updates, decay_rate 0.8) or 'adamw' (b1 0.9,
        b2 0.98). With T5's N(0, 1) embedding init, AdamW at 1e-3 learns the (tied) embedding
        slowly; Adafactor at 1e-2..3e-2 reached a much lower loss in the same steps.
      learning_rate: peak learning rate, reached linearly after `warmup_steps`.
      decay: after warmup, 'cosine' (to `final_lr_fraction` of the peak at `steps`), 'rsqrt'
        (`peak * sqrt(warmup / step)`) or 'constant'.
      weight_decay: AdamW decoupled weight decay on matrices (not on norms or biases tables).
      grad_clip: global-norm clipping (0 = off).
      label_smoothing: T5X-style label smoothing of the training loss (0 = off).
      z_loss: coefficient of `log(Z)^2` (T5X uses 1e-4).
      objective: what the model learns from each target position. 'ce': the token (references,
        or the teacher's greedy tokens with distillation). 'kl': the teacher's distribution at
        temperature 1 (cross-entropy against its top-`teacher_top_k` probabilities, renormalised:
        KL up to a constant). 'tv': acceptance itself, `1 - sum_x min(p(x), q(x))` over the
        teacher's top-k (the paper's beta: minimising it maximises alpha at temperature 1).
        'kl' and 'tv' need a teacher (`train(distill=True, ...)`).
      teacher_top_k: how many of the teacher's most likely tokens per position 'kl' and 'tv'
        keep (the rest of its mass, usually < 1e-3 for a trained target, is left out).
    """

    steps: int
    batch_tokens: int = 1024
    buckets: Tuple[int, ...] = (12, 16, 20, 24, 32, 48)
    truncate: bool = False
    optimizer: str = "adafactor"
    learning_rate: float = 2e-2
    warmup_steps: int = 100
    decay: str = "cosine"
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    z_loss: float = 1e-4
    objective: str = "ce"
    teacher_top_k: int = 32

    def __post_init__(self):
        b = tuple(int(x) for x in self.buckets)
        object.__setattr__(self, "buckets", b)
        for field, ok, fix in (
                ("buckets", b and list(b) == sorted(set(b)) and b[0] >= 2, "ascending, >= 2"),
                ("batch_tokens", b and self.batch_tokens >= b[-1], "at least the last bucket"),
                ("optimizer", self.optimizer in ("adamw", "adafactor"), "'adafactor' or 'adamw'"),
                ("decay", self.decay in ("cosine", "rsqrt", "constant"),
                 "'cosine', 'rsqrt' or 'constant'"),
                ("label_smoothing", 0.0 <= self.label_smoothing < 1.0, "in [0, 1)"),
                ("objective", self.objective in OBJECTIVES, f"one of {OBJECTIVES}"),
                ("teacher_top_k", self.teacher_top_k >= 1, "a positive int")):
            if not ok:
                raise ValueError(f"TrainConfig.{field}={getattr(self, field)!r} is invalid: use "
                                 f"{fix}.")

    @property
    def max_length(self) -> int:
        return self.buckets[-1]


def shift_right(targets: Array) -> Array:
    """Decoder inputs: BOS (0) then the targets without their last position."""
    return jnp.pad(targets[:, :-1], ((0, 0), (1, 0)), constant_values=t5.BOS_ID)


def teacher_forced_logits(module: Module, params, inputs: Array, targets: Array,
                          **kwargs) -> Array:
    """Logits `[B, L, V]` for `targets` (0 = padding) under teacher forcing: a `t5.Transformer`
    encodes `inputs`; a `t5.DecoderOnly` ignores them (its examples have none). `kwargs` go to
    `apply` (dropout)."""
    variables = {"params": params}
    if isinstance(module, t5.DecoderOnly):
        return module.apply(variables, shift_right(targets), targets, **kwargs)
    return module.apply(variables, inputs, shift_right(targets), targets, **kwargs)


# ------------------------------------------------------------------------------ loss and optimizer

def token_losses(logits: Array, targets: Array, label_smoothing: float = 0.0,
                 z_loss: float = 0.0) -> Tuple[Array, Array]:
    """Per-position (training loss, plain cross-entropy), both `[B, L]`, float32.

    As T5X's `cross_entropy_with_logits`: smoothing spreads `label_smoothing` over the other V-1
    ids and subtracts the entropy of that soft target, so a perfect model scores 0.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    log_p = logits - log_z[..., None]
    ce = -jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
    loss = ce
    if label_smoothing:
        vocab = logits.shape[-1]
        on, off = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
        const = -(on * math.log(on) + (vocab - 1) * off * math.log(off + 1e-20))
        loss = on * ce - off * (jnp.sum(log_p, axis=-1) + ce) - const
    if z_loss:
        loss = loss + z_loss * jnp.square(log_z)
    return loss, ce


def teacher_losses(logits: Array, teacher_ids: Array, teacher_probs: Array,
                   objective: str) -> Array:
    """Per-position loss `[B, L]` against the teacher's top-k `(ids, probs) [B, L, k]`.

    'kl': `-sum_k p~_k log q(id_k)` with p~ the top-k probabilities renormalised (the KL from
    the teacher up to its entropy). 'tv': `1 - sum_k min(p_k, q(id_k))`, one minus the
    acceptance probability beta of speculative sampling at temperature 1 (Leviathan et al.
    §3.1); tokens outside the teacher's top k add nothing to beta (p is ~0 there).
    """
    log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    log_q_k = jnp.take_along_axis(log_q, teacher_ids, axis=-1)
    p = teacher_probs.astype(jnp.float32)
    if objective == "kl":
        p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
        return -jnp.sum(p * log_q_k, axis=-1)
    if objective == "tv":
        return 1.0 - jnp.sum(jnp.minimum(p, jnp.exp(log_q_k)), axis=-1)
    raise ValueError(f"objective={objective!r} has no teacher loss; use 'kl' or 'tv'.")


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
    for inputs, targets in batches(examples, config.buckets, config.batch_tokens):
        ce, n = eval_step(params, inputs, targets)
        total, tokens = total + float(ce), tokens + float(n)
    return total / max(tokens, 1.0)


# ---------------------------------------------------------------------- decoding-based evaluation

def _decode_batches(inputs: Sequence[np.ndarray], batch_size: int, length: int):
    """Sorted by length (rows of similar length finish together); yields (indices, [B, length])."""
    order = np.argsort([len(x) for x in inputs], kind="stable")
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        rows = [inputs[i] for i in idx]
        # The last batch is filled with copies of its last row (not empty rows, which would
        # decode to max_decode_len and keep the loop running); callers drop rows >= len(idx).
        yield idx, pad_rows(rows + [rows[-1]] * (batch_size - len(rows)), length)


def greedy_decode(module: t5.Transformer, params, inputs: Sequence[np.ndarray], *,
                  max_decode_len: int, input_length: int,
                  batch_size: int = 256, progress: bool = False) -> List[np.ndarray]:
    """Greedy (temperature 0) outputs for each input, ids up to and including EOS.

    Inputs are padded to `input_length` and batched to `batch_size` rows, so the decode loop
    compiles once. `progress` shows a tqdm bar over the batches (minutes for tens of
    thousands of sentences).
    """
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    model = decoding.EncoderDecoderModel(module, params)
    outputs: List[Optional[np.ndarray]] = [None] * len(inputs)
    for idx, batch in tqdm(_decode_batches(inputs, batch_size, input_length),
                           total=-(-len(inputs) // batch_size), desc="greedy decoding",
                           unit="batch", disable=not progress):
        result = decoding.autoregressive_decode(
            model, batch, rng=jax.random.PRNGKey(0),  # unused: argmax needs no randomness
            sampling=sampling_lib.SamplingConfig(0.0),
            max_decode_len=max_decode_len)
        tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
        for row, i in enumerate(idx):
            outputs[i] = tokens[row, :lengths[row]]
    return outputs


def bleu(module, params, pairs, tokenizer: Tokenizer, max_length: int) -> Tuple[float, List[str]]:
    """Greedy corpus BLEU (`metrics.bleu`: sacrebleu, intl tokenizer) and the hypotheses."""
    inputs = [x[:max_length - 1] + [EOS_ID] if len(x) > max_length else x
              for x in tokenizer.encode_inputs([s for s, _ in pairs])]
    outputs = greedy_decode(module, params, [np.asarray(x, np.int32) for x in inputs],
                            max_decode_len=max_length, input_length=max_length)
    hyps = [tokenizer.decode(o) for o in outputs]
    return metrics_lib.bleu([t for _, t in pairs], hyps)["bleu"], hyps


def distill_targets(module, params, examples: Sequence[Example], max_length: int,
                    cache_path: Optional[str] = None) -> List[Example]:
    """Sequence-level distillation data: each input with the target model's greedy output.

    Outputs that hit `max_length` without EOS get EOS as their last token. With `cache_path`
    (an .npz), outputs are read from there if it was written for the same inputs and target
    parameters, and written otherwise.
    """
    inputs = pad_rows([x for x, _ in examples], max_length)
    teacher = _fingerprint(params)
    if cache_path and os.path.exists(cache_path):
        with np.load(cache_path) as data:
            if np.array_equal(data["inputs"], inputs) and np.array_equal(data["teacher"], teacher):
                logging.info("Distillation targets read from %s", cache_path)
                # Every output ends at its (only) EOS; a 0 the target emitted before it stays.
                return [(x, o[:int(np.argmax(o == EOS_ID)) + 1].astype(np.int32))
                        for (x, _), o in zip(examples, data["outputs"])]
        logging.warning("%s was written for other inputs or parameters; decoding again.",
                        cache_path)
    outputs = greedy_decode(module, params, [x for x, _ in examples], max_decode_len=max_length,
                            input_length=max_length, progress=True)
    outputs = [o if len(o) and o[-1] == EOS_ID else np.append(o[:max_length - 1], EOS_ID)
               .astype(np.int32) for o in outputs]
    if cache_path:
        os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
        np.savez_compressed(cache_path, inputs=inputs, teacher=teacher,
                            outputs=pad_rows(outputs, max_length))
    return [(x, o) for (x, _), o in zip(examples, outputs)]


def teacher_distributions(module, params, examples: Sequence[Example], config: TrainConfig,
                          cache_path: Optional[str] = None) -> List[Tuple[np.ndarray, ...]]:
    """Each example with the teacher's top-`config.teacher_top_k` distribution at every target
    position (teacher forcing, temperature 1): `(x, y, ids [len(y), k] int32, probs [len(y), k]
    float32)`. With `cache_path` (.npz), read from there when written for the same examples,
    teacher and k, and written otherwise (probabilities stored as float16)."""
    k = config.teacher_top_k
    lengths = np.asarray([len(y) for _, y in examples], np.int64)
    fingerprint = np.concatenate([
        _fingerprint(params), [float(k)],
        [float(np.sum([np.sum(x * 7 + 1) for x, _ in examples]))],
        [float(np.sum([np.sum(y * 13 + 1) for _, y in examples]))], lengths.astype(np.float64)])
    if cache_path and os.path.exists(cache_path):
        with np.load(cache_path) as data:
            if np.array_equal(data["fingerprint"], fingerprint):
                logging.info("Teacher distributions read from %s", cache_path)
                return _split_teacher(examples, data["ids"], data["probs"], lengths)
        logging.warning("%s was written for other examples or parameters; recomputing.",
                        cache_path)

    @jax.jit
    def top_k(params, inputs, targets):
        logits = teacher_forced_logits(module, params, inputs, targets)
        probs, ids = jax.lax.top_k(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), k)
        return ids, probs

    ids = np.zeros((int(lengths.sum()), k), np.int32)
    probs = np.zeros((int(lengths.sum()), k), np.float16)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    order = np.argsort(lengths, kind="stable")
    bucket_of = np.searchsorted(config.buckets, [max(len(x), len(y)) for x, y in examples])
    for b, length in enumerate(config.buckets):  # one compilation per bucket
        idx = [i for i in order if bucket_of[i] == b]
        logging.info("teacher distributions: %d examples of bucket %d", len(idx), length)
        rows = max(1, 4 * config.batch_tokens // length)  # no gradients: larger batches
        for s in range(0, len(idx), rows):
            chunk = idx[s:s + rows]
            got = jax.device_get(top_k(
                params, pad_rows([examples[i][0] for i in chunk], length, rows),
                pad_rows([examples[i][1] for i in chunk], length, rows)))
            for r, i in enumerate(chunk):
                ids[offsets[i]:offsets[i + 1]] = got[0][r, :lengths[i]]
                probs[offsets[i]:offsets[i + 1]] = got[1][r, :lengths[i]]
    if cache_path:
        os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
        np.savez_compressed(cache_path, fingerprint=fingerprint, ids=ids.astype(np.int16),
                            probs=probs)
    return _split_teacher(examples, ids, probs, lengths)


def _split_teacher(examples, ids, probs, lengths):
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [(x, y, ids[offsets[i]:offsets[i + 1]].astype(np.int32),
             probs[offsets[i]:offsets[i + 1]].astype(np.float32))
            for i, (x, y) in enumerate(examples)]


def _fingerprint(params) -> np.ndarray:
    """One float64 per parameter array (sum of absolute values): tells teachers apart."""
    return np.asarray([float(np.sum(np.abs(np.asarray(p, np.float64))))
                       for p in jax.tree_util.tree_leaves(params)])


def draft_alpha(target: decoding.DecodeModel, draft: decoding.DecodeModel,
                inputs: Sequence[np.ndarray], *, rng: Array, gamma: int, max_length: int,
                temperatures=(0.0, 1.0), batch_size: int = 256) -> List[dict]:
    """Alpha (mean beta, Leviathan et al. §3.1) of `draft` against `target` at each temperature,
    from `speculative_decode` stats on `inputs` (padded to `max_length`, also the decode limit);
    plus generated tokens per target call."""
    results = []
    for t, temperature in enumerate(temperatures):
        stats, rows = [], []
        for k, (idx, batch) in enumerate(_decode_batches(inputs, batch_size, max_length)):
            stats.append(decoding.speculative_decode(
                target, draft, batch, rng=jax.random.fold_in(jax.random.fold_in(rng, t), k),
                gamma=gamma, sampling=sampling_lib.SamplingConfig(temperature),
                max_decode_len=max_length).stats)
            rows.append(len(idx))  # the filler rows (copies) are left out of the counts
        total = decoding.merge_stats(stats, rows).summary()
        results.append({"alpha": total["alpha"], "temperature": temperature,
                        "tokens_per_target_call": total["tokens_per_target_call"],
                        "gamma": gamma, "sentences": len(inputs)})
    return results


def decoder_flops_per_token(config: t5.T5Config, self_len: int = 16, enc_len: int = 20, *,
                            decoder_only: bool = False) -> dict:
    """Decoder FLOPs per generated token (see the module docstring); 2 FLOPs per multiply-add.

    `self_len` and `enc_len` are the cached and encoder positions attended to; a decoder-only
    model has no cross-attention (`enc_len` unused)."""
    e, i, f, v = config.emb_dim, config.inner_dim, config.mlp_dim, config.vocab_size
    mlp = (len(config.mlp_activations) + 1) * e * f
    cross = 0 if decoder_only else 2 * e * i + 2 * i * enc_len  # query/out projections, scores
    attention = 4 * e * i + 2 * i * self_len + cross
    layers = config.num_decoder_layers * (attention + mlp)
    return {"decoder_layers": 2 * layers, "output_layer": 2 * e * v, "total": 2 * (layers + e * v)}


def num_params(params) -> int:
    return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


# ---------------------------------------------------------------------------------- run functions

class ResumableRun:
    """The resumable training state of one run in `model_dir` (see `train`).

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
    examples = distill_targets(teacher.module, teacher.params, examples, config.max_length,
                               cache)
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
                 decoder_only: bool = False) -> decoding.DecodeModel:
    """The teacher / target as a float32 `DecodeModel` (checked against `target_model`)."""
    return models_lib.load_model(target_model, target_checkpoint, decoder_only=decoder_only,
                                 param_dtype="float32")


def train(*, model: t5.T5Config, model_dir: str, config: TrainConfig, seed: int,
          name: Optional[str] = None, data_dir: Optional[str] = None,
          decoder_only: bool = False, eval_every: int = 500, log_every: int = 50,
          bleu_sentences: Optional[int] = None, max_train_pairs: Optional[int] = None,
          distill: bool = False, distill_pairs: Optional[int] = None,
          distill_cache: Optional[str] = None, distill_sources: Optional[str] = None,
          target_model: Optional[t5.T5Config] = None, target_checkpoint: Optional[str] = None,
          alpha_sentences: int = 256, alpha_gamma: int = 4, prompt_length: int = 64,
          card_subset: int = 64, export_dir: Optional[str] = None,
          export_dtype: str = "bfloat16", checkpoint_every: int = 0,
          init_checkpoint: Optional[str] = None, gin_config: Optional[str] = None) -> dict:
    """Trains `model` on the corpus in `data_dir` (default: the bundled one); returns a summary.

    Writes to `model_dir`: `config.gin` (`gin_config`, if given), `metrics.jsonl` (train loss
    over the last `eval_every` steps and valid loss), the float32 T5X checkpoint
    `checkpoint_<steps>`, `valid_greedy.txt` and `summary.json`. With `target_model` and
    `target_checkpoint`, the model is measured as a draft of that target (alpha at temperatures
    0 and 1 on the first `alpha_sentences` valid sentences, gamma `alpha_gamma`); `distill=True`
    also trains it on the target's greedy translations of the training sources (a random
    `distill_pairs` of them, if set) instead of the references, and with `config.objective`
    'kl' or 'tv' it learns the target's distributions on those outputs (`teacher_distributions`,
    cached beside `distill_cache`) rather than its tokens. `distill_sources` (a file of English
    sentences in `data_dir`, one per line, e.g. `mono_en.txt` from `scripts/build_corpus.py
    --monolingual`) adds the teacher's translations of sources it was never trained on: on
    its own training sources an overfit teacher mostly repeats the references. With
    `export_dir`, the final parameters are also saved in `export_dtype` as
    `<export_dir>/<name>/checkpoint_<steps>` and the summary goes into
    `<export_dir>/model_card.json` under `name` (default: the basename of `model_dir`).

    `decoder_only=True` trains a `t5.DecoderOnly` language model on the code corpus in
    `data_dir` (default `speculative/data/code/`): next-token cross-entropy on chunks of
    `config.max_length` tokens (`lm_examples`; `max_train_pairs` caps the chunks), valid loss
    on the valid split's chunks, no BLEU and no `valid_greedy.txt`. A decoder-only target is
    decoder-only too, and alpha is measured on `alpha_sentences` prompts, the first
    `prompt_length` tokens of valid chunks, each continued for `prompt_length` tokens. It does
    not distill (the corpus itself is the data).

    `init_checkpoint` starts from those parameters instead of random ones (e.g. a 'tv'
    fine-tune of a 'kl' draft); the steps and schedule are this run's.

    With `checkpoint_every > 0` the run is resumable: every that many steps the whole training
    state (parameters, optimizer state, step) goes atomically to `model_dir/train_state.msgpack`,
    and a later call with the same model and settings continues from it. The data stream is
    replayed up to the saved step, so a resumed run sees the same batches as an uninterrupted
    one (only the train loss of the first logged window after a resume covers fewer steps).
    """
    start = time.time()
    name = name or os.path.basename(os.path.normpath(model_dir))
    data_dir = data_dir or (code_corpus.CODE_DIR if decoder_only else MINI_DIR)
    max_len = config.max_length
    if decoder_only and (distill or distill_sources or config.objective != "ce"):
        raise ValueError(
            f"decoder_only=True trains a language model on the corpus itself, but distill="
            f"{distill}, distill_sources={distill_sources!r}, objective={config.objective!r} "
            "distill an encoder-decoder draft; use distill=False and objective='ce'.")
    if decoder_only and target_checkpoint:
        check_prompt_length(prompt_length, max_len)
    os.makedirs(model_dir, exist_ok=True)
    if gin_config is not None:
        with open(os.path.join(model_dir, "config.gin"), "w") as f:
            f.write(gin_config)
    tokenizer = Tokenizer(os.path.join(data_dir, "spm.model"))
    if model.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"Model vocab_size={model.vocab_size} but the vocabulary in {data_dir} "
                         f"has {tokenizer.vocab_size} pieces; set vocab_size="
                         f"{tokenizer.vocab_size}.")
    if distill and not (target_model and target_checkpoint):
        raise ValueError("distill=True needs target_model and target_checkpoint (the teacher).")
    if distill_sources and not distill:
        raise ValueError(f"distill_sources={distill_sources!r} are translated by the teacher: "
                         "set distill=True with target_model and target_checkpoint.")
    if config.objective != "ce" and not distill:
        raise ValueError(f"objective={config.objective!r} learns the teacher's distributions on "
                         "its own outputs: set distill=True with target_model and "
                         "target_checkpoint (or use objective='ce').")
    if decoder_only:
        train_ex = lm_examples(data_dir, "train", tokenizer, max_len)[:max_train_pairs]
        valid_ex = lm_examples(data_dir, "valid", tokenizer, max_len)
        subset_ex, dropped = valid_ex[:card_subset], 0
        logging.info("train: %d chunks of up to %d tokens; valid: %d", len(train_ex), max_len,
                     len(valid_ex))
    else:
        valid_pairs = load_pairs(os.path.join(data_dir, "valid.tsv"))
        train_ex, dropped = tokenize_pairs(
            load_pairs(os.path.join(data_dir, "train.tsv"))[:max_train_pairs], tokenizer, config)
        valid_ex, valid_dropped = tokenize_pairs(valid_pairs, tokenizer, config)
        subset_ex, _ = tokenize_pairs(valid_pairs[:card_subset], tokenizer,
                                      dataclasses.replace(config, truncate=True))
        logging.info("train: %d pairs (%d longer than %d dropped); valid: %d (%d dropped)",
                     len(train_ex), dropped, max_len, len(valid_ex), valid_dropped)
    module = models_lib.make_module(model, decoder_only=decoder_only)
    teacher = (_load_target(target_model, target_checkpoint, decoder_only) if target_checkpoint
               else None)
    mono_ex = []
    if distill_sources:
        mono_ex, _ = make_examples(  # the placeholder target is replaced by the teacher's
            tokenizer.encode_inputs(load_sources(os.path.join(data_dir, distill_sources))),
            itertools.repeat([EOS_ID]), max_len)
    if distill:
        if distill_pairs:  # greedy decoding costs ~15 ms per sentence for mini_target on CPU
            pick = np.random.default_rng(seed).permutation(len(train_ex))[:distill_pairs]
            train_ex = [train_ex[i] for i in np.sort(pick)]
        stem, ext = os.path.splitext(distill_cache) if distill_cache else (None, None)
        train_ex = _teach(teacher, train_ex, config, distill_cache)
        if mono_ex:
            mono_ex = _teach(teacher, mono_ex, config, stem and f"{stem}.mono{ext}")
            logging.info("%d distillation pairs from the training sources, %d from %s",
                         len(train_ex), len(mono_ex), distill_sources)
            train_ex = train_ex + mono_ex

    optimizer = make_optimizer(config)
    init_rng, dropout_rng, alpha_rng = jax.random.split(jax.random.PRNGKey(seed), 3)
    state = init_state(module, optimizer, init_rng, init_checkpoint)
    resume = ResumableRun(model_dir, {"model": dataclasses.asdict(model), "seed": seed,
                                      "train_config": dataclasses.asdict(config),
                                      "distill": distill, "train_pairs": len(train_ex),
                                      "distill_sources": distill_sources,
                                      "init_checkpoint": init_checkpoint,
                                      **({"decoder_only": True} if decoder_only else {})})
    state, first_step, prior_s = resume.restore(state)
    train_step, eval_step = make_train_step(module, optimizer, config), make_eval_step(module)
    data_rng = np.random.default_rng(seed)
    stream = (b for _ in itertools.count()  # endless epochs, reshuffled each time
              for b in batches(train_ex, config.buckets, config.batch_tokens, rng=data_rng))
    for _ in range(first_step - 1):  # replay the batches a resumed run has already trained on
        next(stream)
    pending, window, record = [], [], {}
    train_start = last_log = time.time() - prior_s
    with open(os.path.join(model_dir, "metrics.jsonl"), "a" if first_step > 1 else "w") as log:
        for step in range(first_step, config.steps + 1):
            inputs, targets, *teacher_dists = next(stream)
            state, metrics = train_step(state, inputs, targets, dropout_rng, *teacher_dists)
            pending.append(metrics)
            if step % log_every == 0 or step == config.steps:
                got, pending, now = jax.device_get(pending), [], time.time()
                window += got
                tokens = sum(m["tokens"] for m in got)
                logging.info("step %d  train_ce %.4f  %.0f target tok/s  %.0f s", step,
                             sum(m["ce"] for m in got) / tokens, tokens / (now - last_log),
                             now - train_start)
                last_log = now
            if step % eval_every == 0 or step == config.steps:
                window, pending = window + jax.device_get(pending), []  # steps not logged yet
                record = {"step": step, "train_loss": float(
                    sum(m["ce"] for m in window) / sum(m["tokens"] for m in window)),
                          "valid_loss": evaluate_loss(eval_step, state.params, valid_ex, config),
                          "elapsed_s": time.time() - train_start}
                window = []
                log.write(json.dumps(record) + "\n")
                log.flush()
                logging.info("eval %s", record)
            if checkpoint_every and (step % checkpoint_every == 0 or step == config.steps):
                resume.save(state, step, time.time() - train_start)
    if not record:  # resumed at the last step: the final record is the last one logged
        record = resume.last_record()
    train_s = time.time() - train_start
    params = jax.device_get(state.params)
    checkpoints.save_t5x(params, model_dir, step=config.steps, overwrite=True)

    # Decoding a prompt_length continuation after a prompt_length prompt attends to 1.5x that.
    flops_kw = dict(decoder_only=True, self_len=prompt_length * 3 // 2) if decoder_only else {}
    flops = decoder_flops_per_token(model, **flops_kw)
    summary = {
        "name": name, "config": dataclasses.asdict(model),
        "train_config": dataclasses.asdict(config),
        "params": num_params(params), "decoder_flops_per_token": flops, "steps": config.steps,
        "seed": seed, "init_checkpoint": init_checkpoint and _run_name(init_checkpoint),
        "train_wall_s": round(train_s, 1), "final_train_loss": record["train_loss"],
        "final_valid_loss": record["valid_loss"],
    }
    subset_loss = evaluate_loss(eval_step, params, subset_ex, config)
    if decoder_only:
        summary.update({
            "decoder_only": True, "train_chunks": len(train_ex), "valid_chunks": len(valid_ex),
            "chunk_length": max_len,
            "valid_subset": {"first_n_valid_chunks": card_subset, "loss_float32": subset_loss}})
    else:
        bleu_pairs = valid_pairs[:bleu_sentences] if bleu_sentences else valid_pairs
        bleu_score, hyps = bleu(module, params, bleu_pairs, tokenizer, max_len)
        with open(os.path.join(model_dir, "valid_greedy.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(hyps) + "\n")
        logging.info("valid BLEU %.2f on %d sentences", bleu_score, len(bleu_pairs))
        summary.update({
            "distilled": distill, "train_pairs": len(train_ex), "train_dropped": dropped,
            "distill_sources": distill_sources and {"file": distill_sources, "pairs": len(mono_ex)},
            "valid_bleu": bleu_score, "bleu_sentences": len(bleu_pairs),
            "valid_subset": {"first_n_valid_pairs": card_subset, "truncate": True,
                             "loss_float32": subset_loss}})
    if teacher is not None:
        if decoder_only:
            inputs, alpha_len = lm_prompts(valid_ex, prompt_length), prompt_length
        else:
            inputs, alpha_len = [x for x, _ in valid_ex], max_len
        summary["alpha"] = draft_alpha(
            teacher, models_lib.as_decode_model(module, params), inputs[:alpha_sentences],
            rng=alpha_rng, gamma=alpha_gamma, max_length=alpha_len)
        summary["target"] = _run_name(target_checkpoint)
        summary["flops_ratio_to_target"] = flops["total"] / decoder_flops_per_token(
            target_model, **flops_kw)["total"]
        logging.info("alpha %s", summary["alpha"])
    summary["total_wall_s"] = round(time.time() - start, 1)
    if export_dir:
        exported = jax.tree_util.tree_map(lambda x: np.asarray(x, export_dtype), params)
        path = checkpoints.save_t5x(exported, os.path.join(export_dir, name), step=config.steps,
                                    overwrite=True)
        bundled = checkpoints.load_params(path, dtype="float32")
        summary["valid_subset"]["loss_" + export_dtype] = evaluate_loss(
            eval_step, bundled, subset_ex, config)
        if not decoder_only:  # what users decode is the stored copy (upcast): its BLEU too
            summary["valid_bleu_" + export_dtype] = bleu(module, bundled, bleu_pairs, tokenizer,
                                                         max_len)[0]
        summary["checkpoint"] = os.path.relpath(path, export_dir)
        update_card(export_dir, name, summary)
    _write_json(os.path.join(model_dir, "summary.json"), summary)
    resume.finish(config.steps, train_s)
    return summary


def fit_ngram_drafts(*, export_dir: str, target_model: t5.T5Config, target_checkpoint: str,
                     seed: int, model_dir: str, data_dir: Optional[str] = None,
                     max_length: int = 48, smoothing: float = 0.01, alpha_sentences: int = 256,
                     alpha_gamma: int = 4, decoder_only: bool = False, prompt_length: int = 64,
                     gin_config: Optional[str] = None) -> dict:
    """Fits unigram and bigram drafts (models/ngram.py), saves them compressed in `export_dir`
    (`ngram.load` reads them) and records them, with their alpha against the target, in its
    `model_card.json`; `model_dir` gets `config.gin` and `summary.json`.

    Encoder-decoder (the EN->DE bundle): `mini_{unigram,bigram}.npz`, fitted on the tokenized
    training references (target side, EOS included; pairs over `max_length` dropped); alpha on
    the first `alpha_sentences` valid sources. Decoder-only (`decoder_only=True`, the code
    corpus): `code_{unigram,bigram}.npz`, fitted on the train split's language-model chunks of
    `max_length` tokens (`lm_examples`, each read after BOS as the target reads it); alpha on
    `alpha_sentences` prompts of `prompt_length` tokens from valid chunks (`lm_prompts`), each
    continued for `prompt_length` tokens, as `train` measures a decoder-only draft."""
    from speculative.models import ngram  # pylint: disable=g-import-not-at-top

    data_dir = data_dir or (code_corpus.CODE_DIR if decoder_only else MINI_DIR)
    tokenizer = Tokenizer(os.path.join(data_dir, "spm.model"))
    if decoder_only:
        check_prompt_length(prompt_length, max_length)
        train_ex, dropped = lm_examples(data_dir, "train", tokenizer, max_length), 0
        prompts = lm_prompts(lm_examples(data_dir, "valid", tokenizer, max_length),
                             prompt_length)
        alpha_inputs, alpha_len, prefix = prompts[:alpha_sentences], prompt_length, "code"
    else:
        config = TrainConfig(steps=1, buckets=(max_length,))
        train_ex, dropped = tokenize_pairs(load_pairs(os.path.join(data_dir, "train.tsv")),
                                           tokenizer, config)
        valid_ex, _ = tokenize_pairs(load_pairs(os.path.join(data_dir, "valid.tsv")), tokenizer,
                                     config)
        alpha_inputs = [x for x, _ in valid_ex[:alpha_sentences]]
        alpha_len, prefix = max_length, "mini"
    target = _load_target(target_model, target_checkpoint, decoder_only)
    os.makedirs(export_dir, exist_ok=True)
    os.makedirs(model_dir, exist_ok=True)
    if gin_config is not None:
        with open(os.path.join(model_dir, "config.gin"), "w") as f:
            f.write(gin_config)
    summaries = {}
    for k, (kind, fit) in enumerate((("unigram", ngram.fit_unigram), ("bigram", ngram.fit_bigram))):
        start, name = time.time(), f"{prefix}_{kind}"
        draft = fit([y for _, y in train_ex], tokenizer.vocab_size, smoothing)
        path = os.path.join(export_dir, name + ".npz")
        np.savez_compressed(path, kind=np.asarray(kind),
                            log_probs=np.asarray(draft.params["log_probs"], np.float32))
        summaries[name] = {
            "name": name, "kind": kind, "file": os.path.basename(path), "smoothing": smoothing,
            "params": num_params(draft.params),
            ("train_chunks" if decoder_only else "train_pairs"): len(train_ex),
            "train_dropped": dropped, "fit_wall_s": round(time.time() - start, 1),
            "alpha": draft_alpha(target, type(draft).load(path, decoder_only=decoder_only),
                                 alpha_inputs,
                                 rng=jax.random.fold_in(jax.random.PRNGKey(seed), k),
                                 gamma=alpha_gamma, max_length=alpha_len)}
        if decoder_only:
            summaries[name].update(decoder_only=True, chunk_length=max_length)
        logging.info("%s: %s", name, summaries[name])
        update_card(export_dir, name, summaries[name])
    _write_json(os.path.join(model_dir, "summary.json"), summaries)
    return summaries
