"""The bundled offline models: two EN->DE targets and their drafts (`speculative/data/mini/`).

    card = mini.model_card()                     # model_card.json: configs, losses, BLEU, alpha
    name = mini.main_target()                    # "large_target" (memory-bound, the main job)
    target = mini.load(name)                     # a DecodeModel (T5X checkpoint in the bundle)
    draft = mini.load(mini.best_draft(name))
    inputs = mini.Vocabulary().encode_sources(["Open file"], length=48)  # [1, 48] int32

Two targets share one vocabulary: `large_target` (41.9M parameters; a generated token reads
122 MB of weights, more than the CPU's caches hold, so a step is memory-bound as on a TPU and
speculative decoding pays) and `mini_target` (4.75M parameters, 19 MB: it sits in the L3
cache, a step is compute- and overhead-bound, and speculative decoding does not pay on a CPU;
kept as the contrast). Each T5 draft's card entry names the target it was trained for
(`"target"`; `mini_target` where absent); the n-gram drafts fit the shared vocabulary and
draft for either.

The models were trained by `scripts/train.py` on the gettext corpus of `scripts/build_corpus.py`
(see `speculative/data/mini/models/MODEL_CARD.md`). Everything here reads files inside the
package, so it works on a machine without the original catalogs.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from speculative import decoding, training, validation
from speculative.models import t5

BUNDLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                          "mini")
MODELS_DIR = os.path.join(BUNDLE_DIR, "models")
MINI_TARGET = "mini_target"  # compute-bound on a CPU: the contrast
LARGE_TARGET = "large_target"  # memory-bound: the main job's target
TARGET = MINI_TARGET  # the default of the functions below (the first bundled target)
PREFIX = training.PREFIX  # "translate English to German: " (the mini_ende task)


def available() -> bool:
    """Whether the trained target and at least one draft are bundled (a full checkout)."""
    from speculative.runs import models  # pylint: disable=g-import-not-at-top

    return models.bundle_has(MODELS_DIR, TARGET)


def model_card() -> dict:
    from speculative.runs import models  # pylint: disable=g-import-not-at-top

    return models.bundle_card(MODELS_DIR, "speculative/data/mini/models/MODEL_CARD.md")


def _entry(name: str) -> dict:
    models = model_card()["models"]
    if name not in models:
        raise ValueError(f"No bundled model {name!r}; the bundle has {sorted(models)}.")
    return models[name]


def config(name: str) -> t5.T5Config:
    from speculative.runs import models  # pylint: disable=g-import-not-at-top

    return models.card_config(_entry(name))


def load(name: str, param_dtype: str = "float32") -> decoding.DecodeModel:
    """A bundled model as a DecodeModel: T5 checkpoints, or n-gram drafts stored as .npz."""
    entry = _entry(name)
    from speculative.runs import models  # pylint: disable=g-import-not-at-top

    if entry.get("kind") == FEATURE_DRAFT:
        return load_feature_draft(entry)
    if not is_t5(name):
        return models.build_model(os.path.join(MODELS_DIR, entry["file"]), name="draft")
    return models.load_model(config(name), os.path.join(MODELS_DIR, entry["checkpoint"]),
                             param_dtype=param_dtype)


FEATURE_DRAFT = "feature_draft"  # the card's `kind` of a target-aware draft


def feature_draft_config(entry: dict):
    """The `FeatureDraftConfig` a card entry of kind 'feature_draft' records."""
    from speculative.models import feature_draft  # pylint: disable=g-import-not-at-top

    return feature_draft.FeatureDraftConfig(**entry["config"])


def load_feature_draft(entry: dict, models_dir: str = MODELS_DIR):
    """A bundled target-aware draft (bfloat16 T5X checkpoint, decoded in float32)."""
    from speculative import checkpoints  # pylint: disable=g-import-not-at-top
    from speculative.models import feature_draft  # pylint: disable=g-import-not-at-top

    module = feature_draft.FeatureDraft(feature_draft_config(entry))
    params = checkpoints.load_params(os.path.join(models_dir, entry["checkpoint"]),
                                     dtype="float32")
    return feature_draft.FeatureDraftModel(module, params)


def is_t5(name: str) -> bool:
    """T5 checkpoints have a config; n-gram drafts are `.npz` files of a `kind`."""
    return "kind" not in _entry(name)


def targets() -> List[str]:
    """The bundled targets, the memory-bound one first."""
    return [n for n in (LARGE_TARGET, MINI_TARGET) if n in model_card()["models"]]


def main_target() -> str:
    """The main job's target: `large_target` when bundled, else `mini_target`."""
    return targets()[0]


def target_of(name: str) -> Optional[str]:
    """The target a T5 or target-aware draft was trained for (None for n-gram drafts, which
    fit the shared vocabulary, and for targets)."""
    if name in (LARGE_TARGET, MINI_TARGET):
        return None
    if _entry(name).get("kind") == FEATURE_DRAFT:
        return _entry(name)["target"]
    if not is_t5(name):
        return None
    return _entry(name).get("target", MINI_TARGET)


def _check_target(target: str) -> None:
    if target not in (LARGE_TARGET, MINI_TARGET):
        raise ValueError(f"target={target!r} is not a bundled target; use one of "
                         f"{[LARGE_TARGET, MINI_TARGET]}.")


def drafts(target: str = TARGET) -> List[str]:
    """The drafts of `target`: its T5 drafts and the n-gram drafts (shared vocabulary)."""
    _check_target(target)
    return sorted(n for n in model_card()["models"]
                  if n not in (LARGE_TARGET, MINI_TARGET)
                  and target_of(n) in (None, target))


def t5_drafts(target: str = TARGET) -> List[str]:
    return [n for n in drafts(target) if is_t5(n)]


def best_draft(target: str = TARGET) -> str:
    """The draft the card names as best for `target` (`best_draft`: a name for mini_target, or
    {target: name}), else its T5 draft with the highest alpha at T=0."""
    _check_target(target)
    best = model_card().get("best_draft")
    if isinstance(best, dict) and best.get(target):
        return best[target]
    if isinstance(best, str) and target == MINI_TARGET:
        return best

    def alpha_t0(name):
        alphas = _entry(name).get("alpha") or [{"alpha": -1.0}]
        return alphas[0]["alpha"]

    return max(t5_drafts(target), key=alpha_t0)


def test_pairs(num: Optional[int] = None, split: str = "test") -> List[Tuple[str, str]]:
    """(English source, German reference) pairs of a bundled split, in file order."""
    pairs = []
    with open(os.path.join(BUNDLE_DIR, f"{split}.tsv"), encoding="utf-8") as f:
        for line in f:
            source, target = line.rstrip("\n").split("\t")
            pairs.append((source, target))
            if num and len(pairs) == num:
                break
    return pairs


def source_batches(num: Optional[int], batch_size: int, length: int, split: str = "test",
                   skip: int = 0) -> List[np.ndarray]:
    """Encoded sources of a bundled split that fit `length` tokens (prefix and EOS included), in
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


class Vocabulary(training.Tokenizer):
    """The bundled SentencePiece model (pad 0, eos 1, unk 2), used as the `mini_ende` task does:
    `encode_sources` (prefix + source + EOS, padded; too long raises) and `decode`."""

    def __init__(self, path: str = os.path.join(BUNDLE_DIR, "spm.model")):
        super().__init__(path)
