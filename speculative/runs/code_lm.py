"""The bundled decoder-only (GPT-like) pair on Python code (`speculative/data/code/models/`).

The paper's Table 3 has a decoder-only row (a 97M-parameter GPT-like target, a 6M draft, text
from lm1b); this is its analogue in miniature, on the standard library's source code that
`scripts/build_code_corpus.py` turns into a corpus:

    card = code_lm.model_card()                 # model_card.json: configs, losses, alpha
    target = code_lm.load(code_lm.TARGET)       # a DecoderOnlyModel (T5X checkpoint, bfloat16)
    drafts = {n: code_lm.load(n) for n in code_lm.drafts()}
    [prompts] = code_lm.prompt_batches(4, 4)    # [4, PROMPT_LENGTH] int32 test-split prompts

The drafts are `code_draft` (a small `t5.DecoderOnly` trained on the same text), the unigram and
bigram drafts fitted on the train split, and prompt lookup (copying from the context, no
parameters; not a file, built here). Every draft is decoder-only: it holds `[BOS] + prompt` and
continues it, as the target does (`decoding.DecoderOnlyModel`, `ngram.*(decoder_only=True)`).

Prompts: the code corpus' language-model chunks of CHUNK_LENGTH tokens (`training.lm_examples`,
what the models were trained on), the first PROMPT_LENGTH tokens of each chunk that goes on
after them, taken round-robin over the split's documents (one prompt of each file in turn), so
that a split dominated by one big file (the test split's `pydoc_data/topics.py` holds 80% of its
tokens) does not fill the first batches. A continuation is MAX_DECODE_LEN tokens.

The recipe that trained the models is `speculative/data/code/models/MODEL_CARD.md`.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import List, Optional, Tuple

import numpy as np

from speculative import code_corpus, decoding, training, validation
from speculative.models import ngram, t5
from speculative.runs import models as models_lib

MODELS_DIR = os.path.join(code_corpus.CODE_DIR, "models")
TARGET = "code_target"
PROMPT_LOOKUP = "prompt_lookup"  # built here, not a file: PromptLookupDraft has no parameters
CHUNK_LENGTH = 256  # configs/runs/train_code.gin's training.TrainConfig.buckets
PROMPT_LENGTH = 128
MAX_DECODE_LEN = 64
CALIBRATION_LIMITS = (16, 32, 48, 64)  # timing calibration: continuations of these lengths


def available() -> bool:
    """Whether the target and at least one draft are bundled."""
    return models_lib.bundle_has(MODELS_DIR, TARGET)


def model_card() -> dict:
    return models_lib.bundle_card(MODELS_DIR, "speculative/data/code/models/MODEL_CARD.md")


def _entry(name: str) -> dict:
    models = model_card()["models"]
    if name not in models:
        raise ValueError(f"No bundled code model {name!r}; the bundle has {sorted(models)} "
                         f"(and {PROMPT_LOOKUP!r}, built on demand).")
    return models[name]


def config(name: str) -> t5.T5Config:
    return models_lib.card_config(_entry(name))


def is_t5(name: str) -> bool:
    return name != PROMPT_LOOKUP and "kind" not in _entry(name)


def load(name: str, param_dtype: str = "float32") -> decoding.DecodeModel:
    """A bundled model (or prompt lookup) as a decoder-only `DecodeModel`."""
    if name == PROMPT_LOOKUP:
        return ngram.PromptLookupDraft(vocab_size=config(TARGET).vocab_size, decoder_only=True)
    entry = _entry(name)
    if not is_t5(name):
        return ngram.load(os.path.join(MODELS_DIR, entry["file"]), decoder_only=True)
    return models_lib.load_model(config(name), os.path.join(MODELS_DIR, entry["checkpoint"]),
                                 decoder_only=True, param_dtype=param_dtype)


def drafts(target: str = TARGET) -> List[str]:
    """The drafts of the target: the bundled T5 and n-gram drafts, then prompt lookup."""
    if target != TARGET:
        raise ValueError(f"target={target!r} is not the bundled code target; use {TARGET!r}.")
    return sorted(n for n in model_card()["models"] if n != TARGET) + [PROMPT_LOOKUP]


def t5_drafts(target: str = TARGET) -> List[str]:
    return [n for n in drafts(target) if is_t5(n)]


def prompt_batches(num: Optional[int], batch_size: int, length: int = PROMPT_LENGTH,
                   split: str = "test", skip: int = 0) -> List[np.ndarray]:
    """`num` prompts (None = all) of exactly `length` tokens from `split`, round-robin over its
    documents (see the module docstring), after the first `skip`, in `[batch_size, length]`
    int32 batches (the last may be smaller)."""
    validation.batch_request(num, batch_size, skip)
    training.check_prompt_length(length, CHUNK_LENGTH)
    rows = _split_prompts(split, length)[skip:skip + num if num else None]
    return [np.stack(rows[i:i + batch_size]).astype(np.int32)
            for i in range(0, len(rows), batch_size)]


@functools.lru_cache(maxsize=None)
def _split_prompts(split: str, length: int) -> Tuple[np.ndarray, ...]:
    """Every prompt of `split` in round-robin order, tokenized once per process (a run asks for
    the test prompts once per draft and temperature)."""
    tokenizer = training.Tokenizer(os.path.join(code_corpus.CODE_DIR, code_corpus.SPM_MODEL))
    path = code_corpus.corpus_file(code_corpus.CODE_DIR, code_corpus.split_file(split))
    ids = tokenizer.encode_targets([doc.text for doc in code_corpus.read_documents(path)])
    per_doc = [training.lm_prompts([(None, c) for c in code_corpus.lm_chunks([d], CHUNK_LENGTH)],
                                   length) for d in ids]
    return tuple(p for group in itertools.zip_longest(*per_doc) for p in group if p is not None)
