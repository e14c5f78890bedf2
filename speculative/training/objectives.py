"""What a draft learns from each target position: the training losses and the distillation
targets (the trainer, speculative/training/trainer.py, minimises them).

Loss (`token_losses`): cross-entropy per target token, optionally with T5X's label smoothing
(the constant that makes the optimum 0 is subtracted) and z-loss `z * log(Z)^2`; the trainer
takes its token mean over non-padding target tokens. Reported losses are always the plain
cross-entropy (nats per target token, EOS included).

Distillation (`distill_targets`): the target model translates the training sources greedily and
those outputs replace the references, so a draft learns to imitate the target's argmax (the
quantity alpha at temperature 0 measures). Drafts trained for alpha (`TrainConfig.objective`,
one of `config.OBJECTIVES`) go further on the same text: `teacher_distributions` records the
target's top-k distribution at every position, and the draft minimises either the KL from it
('kl') or one minus the acceptance probability sum_x min(p, q) itself ('tv', total variation), the
quantity whose mean is alpha at temperature 1 (`teacher_losses`).

Shape legend: B batch, L length, V vocab, k the teacher's top-k.
"""

from __future__ import annotations

import math
import os
from typing import List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from speculative.data.text import Example
from speculative.decode import contract
from speculative.models import t5
from speculative.training.data import pad_rows
from speculative.training.evaluation import greedy_decode
from speculative.training.train_config import TrainConfig

Array = jax.Array
Module = Union[t5.Transformer, t5.DecoderOnly]


def shift_right(targets: Array) -> Array:
    """Decoder inputs: BOS (0) then the targets without their last position."""
    return jnp.pad(targets[:, :-1], ((0, 0), (1, 0)), constant_values=contract.BOS_ID)


def teacher_forced_logits(module: Module, params, inputs: Array, targets: Array,
                          **kwargs) -> Array:
    """Logits `[B, L, V]` for `targets` (0 = padding) under teacher forcing: a `t5.Transformer`
    encodes `inputs`; a `t5.DecoderOnly` ignores them (its examples have none). `kwargs` go to
    `apply` (dropout)."""
    variables = {"params": params}
    if isinstance(module, t5.DecoderOnly):
        return module.apply(variables, shift_right(targets), targets, **kwargs)
    return module.apply(variables, inputs, shift_right(targets), targets, **kwargs)


# ----------------------------------------------------------------------------------------- losses

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


# --------------------------------------------------------------------------- distillation targets

def distill_targets(module, params, examples: Sequence[Example], max_length: int,
                    cache_path: Optional[str] = None,
                    input_length: Optional[int] = None) -> List[Example]:
    """Sequence-level distillation data: each input with the target model's greedy output.

    Inputs are padded to `input_length` (default `max_length`); outputs that hit `max_length`
    without EOS get EOS as their last token. With `cache_path` (an .npz), outputs are read from
    there if it was written for the same inputs and target parameters, and written otherwise.
    """
    input_length = input_length or max_length
    inputs = pad_rows([x for x, _ in examples], input_length)
    teacher = _fingerprint(params)
    if cache_path and os.path.exists(cache_path):
        with np.load(cache_path) as data:
            if np.array_equal(data["inputs"], inputs) and np.array_equal(data["teacher"], teacher):
                logging.info("Distillation targets read from %s", cache_path)
                # Every output ends at its (only) EOS; a 0 the target emitted before it stays.
                return [(x, o[:int(np.argmax(o == contract.EOS_ID)) + 1].astype(np.int32))
                        for (x, _), o in zip(examples, data["outputs"])]
        logging.warning("%s was written for other inputs or parameters; decoding again.",
                        cache_path)
    outputs = greedy_decode(module, params, [x for x, _ in examples], max_decode_len=max_length,
                            input_length=input_length, progress=True)
    eos = contract.EOS_ID
    outputs = [o if len(o) and o[-1] == eos else np.append(o[:max_length - 1], eos)
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

