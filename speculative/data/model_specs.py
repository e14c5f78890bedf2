"""The model factory behind `speculative.loading`: from any model spec a run accepts (a
`T5Config`, a T5X checkpoint, an n-gram file, a bundled model's name, a ready `DecodeModel`) to
a `DecodeModel`, optionally placed on a mesh; `build_draft` adds the draft's checks. It lives in
the data room because a spec may name a bundled model (`bundles`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional

from speculative.checkpoints.factory import load_model
from speculative.data.bundles import PROMPT_LOOKUP, bundled, bundled_names
from speculative.decode import contract
from speculative.models import partitioning, t5


def is_decode_model(obj) -> bool:
    return not contract.missing(obj, contract.DecodeModel)


def build_model(spec, checkpoint: Optional[str] = None, *, name: str = "target",
                decoder_only: Optional[bool] = None, seed: int = 0,
                param_dtype: Optional[str] = None, mesh: Optional[Any] = None,
                rules: Optional[partitioning.LogicalRules] = None) -> contract.DecodeModel:
    """A `DecodeModel` from any model spec a run accepts:

    - a `T5Config` (+ `checkpoint`, or random weights with `seed`): `load_model`;
    - None with a T5X `checkpoint`: `load_model(None, checkpoint)`, the architecture from the
      config.gin T5X wrote into its model directory (`checkpoints.t5x_config`);
    - a path to an n-gram draft (`.npz` written by `UnigramDraft/BigramDraft.save`);
    - the name of a bundled model (`speculative.bundles`, e.g. 'large_draft_kdtv');
    - a ready `DecodeModel` (e.g. `ngram.PromptLookupDraft(...)`), used as it is.

    `name` ('target' or 'draft') only words the errors; with `mesh` the model is placed there.
    `decoder_only` None is False, or for `spec=None` what the config.gin says.
    """
    if isinstance(spec, t5.T5Config) or (spec is None and checkpoint):
        return load_model(spec, checkpoint, decoder_only=decoder_only, seed=seed,
                          param_dtype=param_dtype, mesh=mesh, rules=rules)
    decoder_only = bool(decoder_only)
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
        model = found.load(param_dtype or "float32",
                           kernel_layout="t5x" if mesh is not None else "auto")
    elif is_decode_model(spec):
        if checkpoint:
            raise ValueError(
                f"{name}_checkpoint={checkpoint!r} was given but {name}_model is a ready "
                f"{type(spec).__name__}; checkpoints only apply to a T5Config.")
        model = spec
    else:
        raise TypeError(
            f"{name}_model={spec!r} is invalid: give a speculative.models.t5.T5Config (e.g. "
            f"@t5_1_1_small/t5.T5Config()), None with a T5X {name}_checkpoint whose model dir "
            "holds T5X's config.gin, the path of an n-gram draft (.npz), a bundled model's "
            f"name (one of {sorted(bundled_names())}), 'prompt_lookup' (drafts only) or a "
            "DecodeModel.")
    if mesh is not None and getattr(model, "params", None) is not None:
        model = partitioning.place_model(model, mesh, rules)
    return model




def check_same_vocab(target, draft) -> None:
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"Target vocab_size={target.vocab_size} and draft vocab_size="
                         f"{draft.vocab_size} differ; the draft must use the target's vocabulary.")


def build_draft(spec, checkpoint: Optional[str], target, *, decoder_only: bool = False,
                seed: int = 0, draft_seed: Optional[int] = None,
                param_dtype: Optional[str] = None, mesh: Optional[Any] = None,
                rules: Optional[partitioning.LogicalRules] = None) -> contract.DecodeModel:
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


def source(spec, checkpoint: Optional[str]) -> str:
    """What `build_model(spec, checkpoint)` loads, for a log line: the checkpoint, random
    weights (a T5Config alone), or the model `spec` names."""
    if checkpoint:
        return checkpoint
    return "(random weights)" if isinstance(spec, t5.T5Config) else repr(spec)


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
