"""The one model factory: from configuration to a `DecodeModel`, optionally on a mesh.

    target = load_model(T5Config(...), checkpoint="/ckpts/t5_1_1_xxl/checkpoint_1000000")
    draft = load_model(T5Config(...), checkpoint=None, seed=1)    # random weights (tests, timing)
    mesh = partitioning.make_mesh(mesh_shape=(2, 4))
    target = load_model(config, checkpoint, mesh=mesh)            # sharded by T5X's rules
    draft = build_model("bigram.npz", name="draft", mesh=mesh)    # an n-gram draft, replicated

Every run (infer, benchmark, alpha, Table 2, the mini results and the demo), the trainer and the
notebook build their models here, so a new draft kind is one branch in `build_model` plus a test.

A checkpoint path is anything `checkpoints.load_params` accepts (T5X legacy or Orbax dir, step
dir, msgpack file, HF directory); its tree is validated against the config before use, so a
mismatched checkpoint fails with the list of wrong parameters rather than deep inside jit.
With a mesh, T5 parameters are placed by `rules` (a checkpoint is read block by block
straight into that layout: `checkpoints.load_params(shardings=...)`) (T5X's
`standard_logical_axis_rules` for a
target, `partitioning.replicated_rules()` for a draft by default) and the model's decode state
is pinned to batch over 'data' and heads over 'model' inside the jitted loops.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Optional

from speculative import decoding, partitioning
from speculative.models import t5
from speculative.models.adapters import as_decode_model as as_decode_model  # (re-exported)
from speculative.models.adapters import load_model as load_model
from speculative.models.adapters import make_module as make_module


def is_decode_model(obj) -> bool:
    return all(hasattr(obj, a) for a in ("init", "extend", "rewind", "prefix_length"))


def build_model(spec, checkpoint: Optional[str] = None, *, name: str = "target",
                decoder_only: bool = False, seed: int = 0, param_dtype: Optional[str] = None,
                mesh: Optional[Any] = None,
                rules: Optional[partitioning.LogicalRules] = None) -> decoding.DecodeModel:
    """A `DecodeModel` from any model spec a run accepts:

    - a `T5Config` (+ `checkpoint`, or random weights with `seed`): `load_model`;
    - a path to an n-gram draft (`.npz` written by `UnigramDraft/BigramDraft.save`);
    - the name of a bundled model (`speculative.runs.mini`, e.g. 'large_draft_kdtv');
    - a ready `DecodeModel` (e.g. `ngram.PromptLookupDraft(...)`), used as it is.

    `name` ('target' or 'draft') only words the errors; with `mesh` the model is placed there.
    """
    if isinstance(spec, t5.T5Config):
        return load_model(spec, checkpoint, decoder_only=decoder_only, seed=seed,
                          param_dtype=param_dtype, mesh=mesh, rules=rules)
    if isinstance(spec, (str, os.PathLike)) and os.fspath(spec).endswith(".npz"):
        from speculative.models import ngram  # pylint: disable=g-import-not-at-top

        if checkpoint:
            raise ValueError(f"{name}_checkpoint={checkpoint!r} was given but {name}_model is the "
                             f"n-gram file {os.fspath(spec)!r}; give only the file.")
        model = ngram.load(spec, decoder_only=decoder_only)
    elif (found := bundled(spec)) is not None:
        if checkpoint:
            raise ValueError(f"{name}_checkpoint={checkpoint!r} was given but {name}_model is the "
                             f"bundled model {spec!r}; give only the name.")
        if found.decoder_only != decoder_only:
            kind = "decoder-only" if found.decoder_only else "encoder-decoder"
            raise ValueError(f"{name}_model={spec!r} is a bundled {kind} model but decoder_only="
                             f"{decoder_only}; set DECODER_ONLY = {found.decoder_only}.")
        model = found.load(param_dtype or "float32")
    elif is_decode_model(spec):
        if checkpoint:
            raise ValueError(
                f"{name}_checkpoint={checkpoint!r} was given but {name}_model is a ready "
                f"{type(spec).__name__}; checkpoints only apply to a T5Config.")
        model = spec
    else:
        raise TypeError(
            f"{name}_model={spec!r} is invalid: give a speculative.models.t5.T5Config (e.g. "
            "@t5_1_1_small/t5.T5Config()), the path of an n-gram draft (.npz), a bundled model's "
            f"name (one of {sorted(bundled_names())}), 'prompt_lookup' (drafts only) or a "
            "DecodeModel.")
    if mesh is not None and getattr(model, "params", None) is not None:
        model = partitioning.place_model(model, mesh, rules)
    return model


@dataclasses.dataclass(frozen=True)
class Bundled:
    """A model bundled in speculative/data: its model card entry and where its files are.

    The EN->DE models (mini and large) are encoder-decoder T5s in speculative/data/mini/models;
    the code models are decoder-only, in speculative/data/code/models. `config` and
    `checkpoint` are None for an n-gram or target-aware draft (not a plain T5Config)."""

    name: str
    entry: Dict[str, Any]
    models_dir: str
    decoder_only: bool

    @property
    def is_t5(self) -> bool:
        return "kind" not in self.entry and "config" in self.entry

    @property
    def config(self) -> Optional[t5.T5Config]:
        return card_config(self.entry) if self.is_t5 else None

    @property
    def checkpoint(self) -> Optional[str]:
        return os.path.join(self.models_dir, self.entry["checkpoint"]) if self.is_t5 else None

    def load(self, param_dtype: str = "float32") -> decoding.DecodeModel:
        # pylint: disable=g-import-not-at-top
        from speculative.runs import code_lm, mini

        return (code_lm if self.decoder_only else mini).load(self.name, param_dtype=param_dtype)


def _cards():
    """(models_dir, decoder_only, {name: card entry}) of each bundle present (EN->DE, code)."""
    from speculative.runs import code_lm, mini  # pylint: disable=g-import-not-at-top

    for models_dir, decoder_only in ((mini.MODELS_DIR, False), (code_lm.MODELS_DIR, True)):
        if os.path.exists(os.path.join(models_dir, CARD_FILE)):
            yield models_dir, decoder_only, bundle_card(models_dir, "").get("models", {})


def bundled(name: str) -> Optional[Bundled]:
    """The bundled model called `name` (e.g. 'large_target', 'code_draft'), or None."""
    if not isinstance(name, str):
        return None
    for models_dir, decoder_only, models in _cards():
        if name in models:
            return Bundled(name, models[name], models_dir, decoder_only)
    return None


def bundled_names() -> set:
    """Names of the models bundled in speculative/data, EN->DE and code (empty in a checkout
    without them)."""
    return {name for _, _, models in _cards() for name in models}


PROMPT_LOOKUP = "prompt_lookup"  # a draft spec: copy from the context (ngram.PromptLookupDraft)


def check_same_vocab(target, draft) -> None:
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"Target vocab_size={target.vocab_size} and draft vocab_size="
                         f"{draft.vocab_size} differ; the draft must use the target's vocabulary.")


def build_draft(spec, checkpoint: Optional[str], target, *, decoder_only: bool = False,
                seed: int = 0, draft_seed: Optional[int] = None,
                param_dtype: Optional[str] = None, mesh: Optional[Any] = None,
                rules: Optional[partitioning.LogicalRules] = None) -> decoding.DecodeModel:
    """The draft for `target` (`build_model`; random weights seeded `seed + 1` unless
    `draft_seed`; replicated on a mesh unless `rules`), checked to share its vocabulary.
    `spec='prompt_lookup'` is the parameter-free copying draft for the target's vocabulary."""
    if spec == PROMPT_LOOKUP:
        from speculative.models import ngram  # pylint: disable=g-import-not-at-top

        return ngram.PromptLookupDraft(vocab_size=target.vocab_size, decoder_only=decoder_only)
    draft = build_model(spec, checkpoint, name="draft", decoder_only=decoder_only,
                        seed=seed + 1 if draft_seed is None else draft_seed,
                        param_dtype=param_dtype, mesh=mesh,
                        rules=partitioning.replicated_rules() if rules is None else rules)
    check_same_vocab(target, draft)
    return draft


def describe_model(spec) -> Optional[Dict[str, Any]]:
    """JSON-ready description of a model spec."""
    if spec is None:
        return None
    if isinstance(spec, t5.T5Config):
        return {"type": "T5Config", **{k: (list(v) if isinstance(v, tuple) else v)
                                       for k, v in dataclasses.asdict(spec).items()}}
    if isinstance(spec, (str, os.PathLike)):
        return {"type": "ngram", "path": os.fspath(spec)}
    return {"type": type(spec).__name__}


# ----------------------------------------------------------------------------------------------
# Bundled models: a directory with model_card.json (written by training.train / fit_ngram_drafts).

CARD_FILE = "model_card.json"


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
