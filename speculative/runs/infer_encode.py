"""Stage 2 of inference (`runs/infer.py`): encode the inputs and batch them with fixed shapes.

    examples = encode(settings, task, sources)            # [predictions.Example]
    for inputs, num_real in batches(examples, B, L_in):   # [B, L_in] int32, rows that count
        ...

A file's line is encoded as the task encodes its own inputs: the task's prefix (the `prefix`
of its `tasks.prefix_pair` step, e.g. 'translate English to German: ') + the text, with the
task's vocabulary, EOS appended where the task's inputs carry one. A task's example keeps the
token ids seqio gave it.

Too-long inputs are never cut silently. By default they are truncated (`fit_input`), flagged
per example and counted; with `truncate_inputs=False` the first one raises instead. An
encoder input keeps its first `L_in - 1` tokens + EOS (seqio's `append_eos_after_trim`); a
decoder-only prompt keeps its last `L_in` tokens (the context nearest the continuation). A
decoder-only prompt holding the padding id 0 is refused (the decoder would read it as the
prompt's end). Targets (mode 'score') are fitted the same way to `max_decode_len`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

import numpy as np

from speculative.decode import contract
from speculative.models import partitioning
from speculative.runs.infer_settings import InferSettings
from speculative.runs.predictions import Example

if TYPE_CHECKING:  # stage 1's type; seqio (behind it) is imported only where a task is read
    from speculative.runs.infer_inputs import Source


def task_prefix(task) -> str:
    """The text the task puts before each input (its `tasks.prefix_pair` step's), or ''."""
    from speculative.data import tasks  # pylint: disable=g-import-not-at-top

    for step in getattr(task, "preprocessors", ()):
        if isinstance(step, functools.partial) and step.func is tasks.prefix_pair:
            return step.keywords.get("prefix", "")
    return ""


def fit_input(ids: np.ndarray, limit: int, decoder_only: bool) -> np.ndarray:
    """`ids` cut to `limit` tokens: an encoder input keeps its first `limit - 1` tokens + EOS
    (seqio's `append_eos_after_trim`), a decoder-only prompt its last `limit` tokens (the
    context the continuation follows; a prompt has no EOS to keep)."""
    if len(ids) <= limit:
        return ids
    if decoder_only:
        return ids[len(ids) - limit:]
    return np.concatenate([ids[:limit - 1], [contract.EOS_ID]]).astype(np.int32)


def _encode_text(vocabulary, text: str, add_eos: bool) -> np.ndarray:
    ids = list(vocabulary.encode(text))
    return np.asarray(ids + [contract.EOS_ID] if add_eos else ids, np.int32)


def encode(settings: InferSettings, task, sources: List[Source]) -> List[Example]:
    """Each source as an `Example`: its ids (encoded here for a file's line) fitted to L_in."""
    limit = settings.input_length
    how = ("keeping each prompt's last L_in tokens" if settings.decoder_only
           else "seqio-style: the first L_in - 1 tokens + EOS")
    examples = []
    for source in sources:
        where = (f"INPUT_FILE={settings.input_file!r} line {source.line}" if source.line
                 else f"Example {source.index} of {task.name}/{settings.split}")
        if source.input_ids is None:  # a file's line
            features = task.output_features
            text = task_prefix(task) + source.inputs_text
            ids = _encode_text(features["inputs"].vocabulary, text, features["inputs"].add_eos)
            target_ids = (_encode_text(features["targets"].vocabulary, source.targets_text,
                                       features["targets"].add_eos)
                          if source.targets_text else None)
        else:
            text, ids, target_ids = source.inputs_text, source.input_ids, source.target_ids
        if settings.decoder_only and np.any(ids == contract.PAD_ID):
            raise ValueError(
                f"{where} has the padding id {contract.PAD_ID} in its prompt (positions "
                f"{np.nonzero(ids == contract.PAD_ID)[0].tolist()[:10]}): a decoder-only prompt "
                "is right-padded with it, so the model would read it as the prompt's end. Encode "
                "prompts with a vocabulary that keeps id 0 for padding (seqio's "
                "SentencePiece vocabularies never emit it).")
        truncated = len(ids) > limit
        if truncated and not settings.truncate_inputs:
            raise ValueError(
                f"{where} has {len(ids)} input tokens, more than "
                f"TASK_FEATURE_LENGTHS['inputs']={limit}. Raise the feature length, or set "
                f"infer.truncate_inputs=True to truncate ({how}) and count them.")
        if target_ids is not None:
            target_ids = fit_input(target_ids, settings.max_decode_len, settings.decoder_only)
        examples.append(Example(
            index=source.index, inputs_text=text, targets_text=source.targets_text,
            input_ids=fit_input(ids, limit, settings.decoder_only), input_length=len(ids),
            truncated=bool(truncated), target_ids=target_ids))
    return examples


def batches(examples: List[Example], batch_size: int,
            input_length: int) -> Iterator[Tuple[np.ndarray, int]]:
    """Yields `(inputs [B, L_in] int32, num_real)`; a partial last batch repeats its last row."""
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        yield pad_rows([ex.input_ids for ex in chunk], batch_size, input_length), len(chunk)


def pad_rows(rows: List[np.ndarray], batch_size: int, length: int) -> np.ndarray:
    """`[B, length]` int32: each row right-padded with 0; missing rows repeat the last one."""
    out = np.zeros((batch_size, length), np.int32)
    for row in range(batch_size):
        ids = rows[min(row, len(rows) - 1)]
        out[row, :len(ids)] = ids
    return out


def sharded(inputs: np.ndarray, target):
    """`inputs` as the decode calls take them: rows split over the target's mesh, if any."""
    mesh = getattr(target, "mesh", None)
    return partitioning.shard_batch(inputs, mesh) if mesh is not None else inputs


def target_batch(examples: List[Example], batch_size: int, length: int) -> np.ndarray:
    """`[B, length]` int32 targets of a batch's examples (mode 'score')."""
    return pad_rows([ex.target_ids for ex in examples], batch_size, length)


def num_truncated(examples: List[Example]) -> int:
    return sum(ex.truncated for ex in examples)


def check_vocab(settings: InferSettings, vocabulary, model_vocab: Optional[int] = None) -> None:
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
