"""The bundled offline models and their inputs, one `Bundle` class for every bundle:

    ende = bundles.ENDE                          # or bundles.bundle("large_target")
    name = ende.main_target()                    # "large_target" (memory-bound, the main job)
    target, draft = ende.load(name), ende.load(ende.best_draft(name))   # DecodeModels
    [inputs] = ende.batches(4, batch_size=4)     # [4, 48] int32 test sources (prefix, EOS)
    code = bundles.CODE                          # the decoder-only (GPT-like) pair
    [prompts] = code.batches(4, batch_size=4)    # [4, 128] int32 test-split prompts
    docs = bundles.bundle("docstring_target")    # code -> docstring (Table 2's summarization)
    [functions] = docs.batches(4, batch_size=4)  # [4, 384] int32 test functions, file order

**EN->DE** (`speculative/data/mini/`): two targets share one vocabulary. `large_target` (41.9M
parameters; a generated token reads 122 MB of weights, more than a CPU's caches hold, so a step
is memory-bound as on a TPU and speculative decoding pays) and `mini_target` (4.75M, 19 MB: it
sits in the L3 cache, a step is compute-bound, and speculative decoding does not pay on a CPU;
kept as the contrast). Each T5 or target-aware draft's card entry names the target it was
trained for (`"target"`; the bundle's `default_target` where absent); the n-gram drafts fit the
shared vocabulary and draft for either. Inputs are test sources of up to 48 tokens, encoded as
the `mini_ende` task does; longer sources are skipped, never cut.

**Code** (`speculative/data/code/`): the analogue in miniature of the paper's decoder-only row
(Table 3: a GPT-like target and draft on lm1b), on the standard library's Python source. The
drafts are `code_draft` (a small `t5.DecoderOnly`), unigram and bigram drafts, and prompt lookup
(no parameters, built on demand). Prompts are the first PROMPT_LENGTH tokens of the corpus'
language-model chunks (what the models were trained on), taken round-robin over the split's
documents so that one big file (`pydoc_data/topics.py` holds 80% of the test split) does not
fill the first batches; a continuation is 64 tokens, and as code rarely ends, the decode-loop
cost model is calibrated on continuations cut at CALIBRATION_LIMITS tokens in turn.

**Docstrings** (`speculative/data/docstrings/`): Table 2's summarization task offline, a
function's source in (up to DOCSTRING_INPUT_LENGTH tokens) and its docstring out (up to
DOCSTRING_MAX_DECODE_LEN): `docstring_target` (memory-bound), distilled T5 drafts of two sizes,
prompt lookup (built on demand) and the hybrid (kind 'hybrid': prompt lookup where the input
matches, a T5 draft elsewhere; `models/hybrid.py`). Inputs are the test split's functions in
`test.jsonl`'s order.

The models were trained by `scripts/train.py` (recipes: each bundle's `models/MODEL_CARD.md`);
everything here reads files inside the package, so it works offline.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from speculative.data import code_corpus, docstring_corpus, text
from speculative.decode import drafters, validation
from speculative.decode.contract import DecodeModel
from speculative.models import t5

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
BUNDLE_DIR = os.path.join(DATA_DIR, "mini")  # the EN->DE corpus, vocabulary and models
CARD_FILE = "model_card.json"  # written by training.train / fit_ngram_drafts
FEATURE_DRAFT = "feature_draft"  # the card's `kind` of a target-aware draft
BLOCK_DRAFT = "block_draft"  # a target-aware draft that proposes a whole block per call
READS_TARGET = (FEATURE_DRAFT, BLOCK_DRAFT)  # kinds that read the target's features
PROMPT_LOOKUP = "prompt_lookup"  # a draft spec: copy from the context (ngram.PromptLookupDraft)
HYBRID = "hybrid"  # the card's `kind` of a copy-or-model draft (models/hybrid.py)

MINI_TARGET = "mini_target"  # compute-bound on a CPU: the contrast
LARGE_TARGET = "large_target"  # memory-bound: the main job's target
PREFIX = text.PREFIX  # "translate English to German: " (the mini_ende task)
INPUT_LENGTH = 48  # EN->DE sources, prefix and EOS included
MAX_DECODE_LEN = 48  # EN->DE translations

CODE_TARGET = "code_target"
CHUNK_LENGTH = 256  # configs/runs/train_code.gin's training.TrainConfig.buckets
PROMPT_LENGTH = 128
CODE_MAX_DECODE_LEN = 64
CALIBRATION_LIMITS = (16, 32, 48, 64)  # code timing calibration: continuations of these lengths

DOCSTRING_TARGET = "docstring_target"
DOCSTRING_INPUT_LENGTH = 384  # a function's source with EOS (the corpus skips longer ones)
DOCSTRING_MAX_DECODE_LEN = 128  # a docstring with EOS (the corpus cuts longer ones)


# ----------------------------------------------------------------------------------------------
# Model cards.

def bundle_card(models_dir: str, recipe: str) -> dict:
    """`models_dir/model_card.json`, or FileNotFoundError naming `recipe`, the card that says
    how to train the models."""
    path = os.path.join(models_dir, CARD_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No bundled models: {path} is missing. Train them with the recipe in {recipe} "
            "(scripts/train.py), or use a full checkout.")
    with open(path) as f:
        return json.load(f)


def bundle_has(models_dir: str, target: str) -> bool:
    """Whether `models_dir` bundles `target` and at least one other model (a draft)."""
    if not os.path.exists(os.path.join(models_dir, CARD_FILE)):
        return False
    models = bundle_card(models_dir, "").get("models", {})
    return target in models and len(models) > 1


def card_config(entry: dict) -> t5.T5Config:
    """The `T5Config` a model card entry records (lists back to tuples)."""
    fields = dict(entry["config"])
    fields["mlp_activations"] = tuple(fields["mlp_activations"])
    return t5.T5Config(**fields)


# ----------------------------------------------------------------------------------------------
# Inputs.

def test_pairs(num: Optional[int] = None, split: str = "test") -> List[Tuple[str, str]]:
    """(English source, German reference) pairs of a bundled EN->DE split, in file order."""
    pairs = []
    with open(os.path.join(BUNDLE_DIR, f"{split}.tsv"), encoding="utf-8") as f:
        for line in f:
            source, target = line.rstrip("\n").split("\t")
            pairs.append((source, target))
            if num and len(pairs) == num:
                break
    return pairs


class Vocabulary(text.Tokenizer):
    """The bundled EN->DE SentencePiece model (pad 0, eos 1, unk 2), used as the `mini_ende`
    task does: `encode_sources` (prefix + source + EOS, padded; too long raises) and `decode`."""

    def __init__(self, path: str = os.path.join(BUNDLE_DIR, "spm.model")):
        super().__init__(path)


def source_batches(num: Optional[int], batch_size: int, length: int = INPUT_LENGTH,
                   split: str = "test", skip: int = 0) -> List[np.ndarray]:
    """Encoded EN->DE sources of a split that fit `length` tokens (prefix and EOS included), in
    file order after the first `skip` that fit, `num` of them (None = all), in `[batch_size,
    length]` batches (the last may be smaller). Longer sources are skipped, never cut."""
    validation.batch_request(num, batch_size, skip)
    validation.positive_int(length, "length", "tokens per encoded source")
    vocab = Vocabulary()
    rows = []
    for source, _ in test_pairs(split=split):
        try:
            rows.append(vocab.encode_sources([source], length)[0])
        except ValueError:
            continue
        if num and len(rows) == skip + num:
            break
    rows = rows[skip:]
    return [np.stack(rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]


def prompt_batches(num: Optional[int], batch_size: int, length: int = PROMPT_LENGTH,
                   split: str = "test", skip: int = 0) -> List[np.ndarray]:
    """`num` code prompts (None = all) of exactly `length` tokens from `split`, round-robin over
    its documents (module docstring), after the first `skip`, in `[batch_size, length]` int32
    batches (the last may be smaller)."""
    validation.batch_request(num, batch_size, skip)
    text.check_prompt_length(length, CHUNK_LENGTH)
    rows = _split_prompts(split, length)[skip:skip + num if num else None]
    return [np.stack(rows[i:i + batch_size]).astype(np.int32)
            for i in range(0, len(rows), batch_size)]


@functools.lru_cache(maxsize=None)
def _split_prompts(split: str, length: int) -> Tuple[np.ndarray, ...]:
    """Every prompt of `split` in round-robin order, tokenized once per process (a run asks for
    the test prompts once per draft and temperature)."""
    tokenizer = text.Tokenizer(os.path.join(code_corpus.CODE_DIR, code_corpus.SPM_MODEL))
    path = code_corpus.corpus_file(code_corpus.CODE_DIR, code_corpus.split_file(split))
    ids = tokenizer.encode_targets([doc.text for doc in code_corpus.read_documents(path)])
    per_doc = [text.lm_prompts(
        [(None, c) for c in code_corpus.lm_chunks([d], CHUNK_LENGTH)], length) for d in ids]
    return tuple(p for group in itertools.zip_longest(*per_doc) for p in group if p is not None)


def docstring_batches(num: Optional[int], batch_size: int,
                      length: int = DOCSTRING_INPUT_LENGTH, split: str = "test",
                      skip: int = 0) -> List[np.ndarray]:
    """`num` function sources (None = all) of the docstring corpus' `split`, in file order after
    the first `skip`, encoded as the `code_docstring` task does (no prefix, EOS, 0-padded to
    `length`) in `[batch_size, length]` int32 batches (the last may be smaller). A source longer
    than `length` raises: the corpus holds none longer than DOCSTRING_INPUT_LENGTH."""
    validation.batch_request(num, batch_size, skip)
    validation.positive_int(length, "length", "tokens per encoded function source")
    examples = docstring_corpus.read_split(docstring_corpus.DOCSTRING_DIR, split)
    examples = examples[skip:skip + num if num else None]
    rows = docstring_tokenizer().encode_sources([e.code for e in examples], length)
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]


@functools.lru_cache(maxsize=None)
def docstring_tokenizer() -> text.Tokenizer:
    """The docstring corpus' vocabulary as the `code_docstring` task uses it (no prefix), loaded
    once per process."""
    return text.Tokenizer(os.path.join(docstring_corpus.DOCSTRING_DIR,
                                       docstring_corpus.SPM_MODEL), prefix="")


# ----------------------------------------------------------------------------------------------
# The bundle.

@dataclasses.dataclass(frozen=True)
class Bundle:
    """A directory of bundled models with its model card, and the inputs they are measured on.

    Attributes:
      name: 'ende' or 'code'.
      models_dir: the directory holding model_card.json and the checkpoints.
      recipe: the MODEL_CARD.md that says how the models were trained (named in errors).
      decoder_only: whether the models are decoder-only (`[BOS] + prompt`, then continue).
      target_names: the targets, the memory-bound one first.
      default_target: the target a T5 draft's card entry means when it names none.
      inputs: `(num, batch_size, length, split, skip) -> [[B, length] int32]` test inputs.
      input_length: tokens per input (a source, or a prompt).
      max_decode_len: tokens per output.
      calibration_limits: max_decode_len per calibration batch, cycled (() = max_decode_len).
      built_in: drafts built on demand rather than read from a file (prompt lookup).
      time_all_drafts: whether the reports time every draft, or only the T5 ones (the EN->DE
        n-gram drafts' alpha is far too low to pay).
    """

    name: str
    models_dir: str
    recipe: str
    decoder_only: bool
    target_names: Tuple[str, ...]
    default_target: str
    inputs: Callable[..., List[np.ndarray]]
    input_length: int
    max_decode_len: int
    calibration_limits: Tuple[int, ...] = ()
    built_in: Tuple[str, ...] = ()
    time_all_drafts: bool = False

    def available(self) -> bool:
        """Whether the default target and at least one draft are bundled (a full checkout)."""
        return bundle_has(self.models_dir, self.default_target)

    def model_card(self) -> dict:
        return bundle_card(self.models_dir, self.recipe)

    def entry(self, name: str) -> dict:
        models = self.model_card()["models"]
        if name not in models:
            built = f" (and {list(self.built_in)}, built on demand)" if self.built_in else ""
            raise ValueError(f"No bundled model {name!r}; the bundle has {sorted(models)}{built}.")
        return models[name]

    def config(self, name: str) -> t5.T5Config:
        return card_config(self.entry(name))

    def is_t5(self, name: str) -> bool:
        """T5 checkpoints have a config; n-gram and target-aware drafts have a `kind`."""
        return name not in self.built_in and "kind" not in self.entry(name)

    def load(self, name: str, param_dtype: str = "float32",
             kernel_layout: str = "auto") -> DecodeModel:
        """A bundled model as a DecodeModel: a T5 checkpoint, an n-gram draft stored as .npz, a
        target-aware draft, or a built-in draft. `kernel_layout`: as `load_model`'s (on a CPU,
        'auto' stores the dense kernels `[out, in]`: `layers.transpose_kernels`)."""
        # pylint: disable=g-import-not-at-top
        from speculative.checkpoints import factory
        from speculative.models import ngram

        if name == PROMPT_LOOKUP and PROMPT_LOOKUP in self.built_in:
            return ngram.PromptLookupDraft(vocab_size=self.config(self.default_target).vocab_size,
                                           decoder_only=self.decoder_only)
        entry = self.entry(name)
        if entry.get("kind") == HYBRID:
            return self.hybrid(entry, param_dtype=param_dtype, kernel_layout=kernel_layout)
        if entry.get("kind") in READS_TARGET:
            return load_feature_draft(entry, self.models_dir, kernel_layout)
        if not self.is_t5(name):
            return ngram.load(os.path.join(self.models_dir, entry["file"]),
                              decoder_only=self.decoder_only)
        return factory.load_model(self.config(name),
                                   os.path.join(self.models_dir, entry["checkpoint"]),
                                   decoder_only=self.decoder_only, param_dtype=param_dtype,
                                   kernel_layout=kernel_layout)

    def drafter(self, name: str, gamma: int, tree=None, **load_kwargs):
        """The drafter of bundled draft `name` (`load`, then `drafters.as_drafter`): the one
        place outside the decode package where a name or a card entry's `kind` becomes a
        drafter; everything else asks the drafter what it can do (`reads_target`,
        `proposes_block`, `copies_input`, `tree`, `candidates`)."""
        return self.drafter_of(self.load(name, **load_kwargs), gamma, tree)

    @staticmethod
    def drafter_of(model: DecodeModel, gamma: int = 1, tree=None):
        """The drafter of a loaded draft model (`drafters.as_drafter`)."""
        return drafters.as_drafter(model, int(gamma), tree)

    def hybrid(self, entry: dict, param_dtype: str = "float32", kernel_layout: str = "auto"):
        """The `HybridDraft` a card entry of kind 'hybrid' describes (also before the entry is
        in the card): prompt lookup with its n-gram lengths around the bundled draft it
        names."""
        # pylint: disable=g-import-not-at-top
        from speculative.models import hybrid, ngram

        model = self.load(entry["draft"], param_dtype=param_dtype, kernel_layout=kernel_layout)
        return hybrid.HybridDraft(model, ngram.PromptLookupDraft(
            vocab_size=model.vocab_size, decoder_only=self.decoder_only,
            min_ngram=int(entry["min_ngram"]), max_ngram=int(entry["max_ngram"])))

    def targets(self) -> List[str]:
        """The bundled targets, the memory-bound one first."""
        return [n for n in self.target_names if n in self.model_card()["models"]]

    def main_target(self) -> str:
        """The main job's target: the memory-bound one when bundled."""
        return self.targets()[0]

    def target_of(self, name: str) -> Optional[str]:
        """The target a T5 or target-aware draft was trained for (None for targets, n-gram and
        built-in drafts, which fit the shared vocabulary)."""
        if name in self.target_names or name in self.built_in:
            return None
        if self.entry(name).get("kind") in READS_TARGET:
            return self.entry(name)["target"]
        if self.entry(name).get("kind") == HYBRID:
            return self.target_of(self.entry(name)["draft"])
        if not self.is_t5(name):
            return None
        return self.entry(name).get("target", self.default_target)

    def _check_target(self, target: str) -> None:
        if target not in self.target_names:
            raise ValueError(f"target={target!r} is not a bundled {self.name} target; use one "
                             f"of {list(self.target_names)}.")

    def drafts(self, target: Optional[str] = None) -> List[str]:
        """The drafts of `target`: its T5 and target-aware drafts, the n-gram drafts (shared
        vocabulary), then the built-in ones."""
        target = target or self.default_target
        self._check_target(target)
        return sorted(n for n in self.model_card()["models"]
                      if n not in self.target_names and self.target_of(n) in (None, target)) + \
            list(self.built_in)

    def t5_drafts(self, target: Optional[str] = None) -> List[str]:
        return [n for n in self.drafts(target) if self.is_t5(n)]

    def timed_drafts(self, target: str) -> List[str]:
        """The drafts the reports time for `target` (Table 2 rows): every draft with
        `time_all_drafts`, else those trained for it, T5 and target-aware (`target_of`; the
        n-gram tables get alpha only)."""
        if self.time_all_drafts:
            return self.drafts(target)
        return [n for n in self.drafts(target) if self.target_of(n) == target]

    def _card_best(self, target: str) -> Optional[str]:
        """The card's `best_draft` for `target` ({target: name}, or a name meaning the default
        target's), or None."""
        self._check_target(target)
        best = self.model_card().get("best_draft")
        if isinstance(best, dict):
            return best.get(target)
        return best if isinstance(best, str) and target == self.default_target else None

    def best_draft(self, target: Optional[str] = None) -> str:
        """The draft the card names as best for `target` (the main job's default, which may be
        a target-aware draft), else `best_t5_draft`."""
        target = target or self.default_target
        return self._card_best(target) or self.best_t5_draft(target)

    def best_t5_draft(self, target: Optional[str] = None) -> str:
        """The best separate T5 draft of `target`: the card's best where that is one, else the
        T5 draft with the highest card alpha at T=0. For what needs a draft of its own model
        (transformers' assisted generation, beam search, the limits' depth sweep, which
        changes the target under the draft)."""
        target = target or self.default_target
        named = self._card_best(target)
        if named and self.is_t5(named):
            return named

        def alpha_t0(name):
            alphas = self.entry(name).get("alpha") or [{"alpha": -1.0}]
            return alphas[0]["alpha"]

        return max(self.t5_drafts(target), key=alpha_t0)

    def batches(self, num: Optional[int], batch_size: int, split: str = "test",
                skip: int = 0) -> List[np.ndarray]:
        """`num` test inputs (None = all) of `input_length` tokens in `[batch_size, L]` batches."""
        return self.inputs(num, batch_size, self.input_length, split, skip)

    def calibration_lengths(self, num: int) -> Optional[List[int]]:
        """One max_decode_len per calibration batch (None: `max_decode_len` for all)."""
        limits = self.calibration_limits
        return [limits[i % len(limits)] for i in range(num)] if limits else None


ENDE = Bundle("ende", os.path.join(BUNDLE_DIR, "models"),
              "speculative/data/mini/models/MODEL_CARD.md", decoder_only=False,
              target_names=(LARGE_TARGET, MINI_TARGET), default_target=MINI_TARGET,
              inputs=source_batches, input_length=INPUT_LENGTH, max_decode_len=MAX_DECODE_LEN)
CODE = Bundle("code", os.path.join(code_corpus.CODE_DIR, "models"),
              "speculative/data/code/models/MODEL_CARD.md", decoder_only=True,
              target_names=(CODE_TARGET,), default_target=CODE_TARGET, inputs=prompt_batches,
              input_length=PROMPT_LENGTH, max_decode_len=CODE_MAX_DECODE_LEN,
              calibration_limits=CALIBRATION_LIMITS, built_in=(PROMPT_LOOKUP,),
              time_all_drafts=True)
DOCSTRINGS = Bundle("docstrings", os.path.join(docstring_corpus.DOCSTRING_DIR, "models"),
                    "speculative/data/docstrings/models/MODEL_CARD.md", decoder_only=False,
                    target_names=(DOCSTRING_TARGET,), default_target=DOCSTRING_TARGET,
                    inputs=docstring_batches, input_length=DOCSTRING_INPUT_LENGTH,
                    max_decode_len=DOCSTRING_MAX_DECODE_LEN, built_in=(PROMPT_LOOKUP,),
                    time_all_drafts=True)
BUNDLES = (ENDE, CODE, DOCSTRINGS)


# Where each bundled target's reports go (the Tables 2-4 analogues and the reports beside them).
RESULT_DIRS = {LARGE_TARGET: "results/large", MINI_TARGET: "results/mini",
               CODE_TARGET: "results/code", DOCSTRING_TARGET: "results/docstrings"}


def bundle(target_name: str) -> Bundle:
    """The bundle whose target `target_name` is."""
    for b in BUNDLES:
        if target_name in b.target_names:
            return b
    raise ValueError(f"target={target_name!r} is not a bundled target; use one of "
                     f"{[t for b in BUNDLES for t in b.target_names]}.")


def targets() -> List[str]:
    """Every bundled target: the EN->DE ones, then the code and docstring targets where
    bundled."""
    return ENDE.targets() + [b.default_target for b in (CODE, DOCSTRINGS) if b.available()]


def feature_draft_config(entry: dict):
    """The `FeatureDraftConfig` a card entry of kind 'feature_draft' records."""
    from speculative.models import feature_draft  # pylint: disable=g-import-not-at-top

    return feature_draft.FeatureDraftConfig(**entry["config"])


def _card_entry(models_dir: str, name: str) -> dict:
    """Entry `name` of the model card in `models_dir` (`bundle_card`)."""
    return bundle_card(models_dir, os.path.join(models_dir, CARD_FILE))["models"][name]


def load_feature_draft(entry: dict, models_dir: str = ENDE.models_dir,
                       kernel_layout: str = "auto"):
    """A bundled target-aware draft (bfloat16 T5X checkpoint, decoded in float32); a block
    draft (kind 'block_draft') as a `BlockDraftModel`, its checkpoint merged over the draft it
    `shares` (the frozen feature draft it was trained from)."""
    # pylint: disable=g-import-not-at-top
    from speculative.checkpoints import t5x as checkpoints
    from speculative.models import block_draft, feature_draft, layers

    if entry.get("kind") == BLOCK_DRAFT:
        module = block_draft.BlockDraft(feature_draft_config(entry),
                                        max_gamma=int(entry["max_gamma"]))
    else:
        module = feature_draft.FeatureDraft(feature_draft_config(entry))
    params = checkpoints.load_params(os.path.join(models_dir, entry["checkpoint"]),
                                     dtype="float32")
    if entry.get("shares"):  # a block draft stores its placeholder stream only: the rest is
        # the (frozen) feature draft it was trained from, bundled once
        shared = _card_entry(models_dir, entry["shares"])
        params = {**checkpoints.load_params(os.path.join(models_dir, shared["checkpoint"]),
                                            dtype="float32"), **params}
    if layers.resolve_kernel_layout(kernel_layout) == "transposed":
        params = layers.transpose_kernels(params)
    kind = (block_draft.BlockDraftModel if entry.get("kind") == BLOCK_DRAFT
            else feature_draft.FeatureDraftModel)
    return kind(module, params)


# ----------------------------------------------------------------------------------------------
# Bundled names, as the model factory resolves them.

@dataclasses.dataclass(frozen=True)
class Bundled:
    """A model bundled in speculative/data: its model card entry and its bundle.

    `config` and `checkpoint` are None for an n-gram or target-aware draft (not a plain
    T5Config)."""

    name: str
    entry: Dict[str, Any]
    bundle: Bundle

    @property
    def models_dir(self) -> str:
        return self.bundle.models_dir

    @property
    def decoder_only(self) -> bool:
        return self.bundle.decoder_only

    @property
    def is_t5(self) -> bool:
        return "kind" not in self.entry and "config" in self.entry

    @property
    def config(self) -> Optional[t5.T5Config]:
        return card_config(self.entry) if self.is_t5 else None

    @property
    def checkpoint(self) -> Optional[str]:
        return os.path.join(self.models_dir, self.entry["checkpoint"]) if self.is_t5 else None

    def load(self, param_dtype: str = "float32", kernel_layout: str = "auto") -> DecodeModel:
        return self.bundle.load(self.name, param_dtype=param_dtype, kernel_layout=kernel_layout)

    def alpha(self, temperature: float) -> Optional[float]:
        """The card's measured acceptance rate at the temperature nearest `temperature` (a
        block draft's: that of the feature draft it `shares`, which its chain is), or None."""
        entry = self.entry
        if not entry.get("alpha") and entry.get("shares"):
            entry = _card_entry(self.models_dir, entry["shares"])
        rows = entry.get("alpha") or []
        if not rows:
            return None
        return float(min(rows, key=lambda r: abs(r["temperature"] - temperature))["alpha"])


def _cards():
    """(bundle, {name: card entry}) of each bundle present (EN->DE, code)."""
    for b in BUNDLES:
        if os.path.exists(os.path.join(b.models_dir, CARD_FILE)):
            yield b, b.model_card().get("models", {})


def bundled(name: str) -> Optional[Bundled]:
    """The bundled model called `name` (e.g. 'large_target', 'code_draft'), or None."""
    if not isinstance(name, str):
        return None
    for b, models in _cards():
        if name in models:
            return Bundled(name, models[name], b)
    return None


def card_alpha(name, temperature: float, checkpoint: Optional[str] = None) -> Optional[float]:
    """The measured acceptance rate on the card of the bundled draft `name` (or the bundled T5
    whose checkpoint is `checkpoint`, as a run resolves a bundled name) at the temperature
    nearest `temperature` (`Bundled.alpha`); None for any other draft."""
    found = bundled(name)
    if found is None and checkpoint:
        path = os.path.realpath(checkpoint)
        found = next((Bundled(n, entry, b) for b, models in _cards() for n, entry in
                      models.items() if entry.get("checkpoint") and os.path.realpath(
                          os.path.join(b.models_dir, entry["checkpoint"])) == path), None)
    return found.alpha(temperature) if found is not None else None


def bundled_names() -> set:
    """Names of the models bundled in speculative/data, EN->DE and code (empty in a checkout
    without them)."""
    return {name for _, models in _cards() for name in models}
