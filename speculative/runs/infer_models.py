"""Inference's models (`runs/infer.py`, between encoding and choosing how to speculate): the
target and draft the settings name, and the checks that they fit the settings and the task.

    target, draft = load_models(settings)     # draft None for the baseline and mode 'score'
    check_models(settings, task, target, draft)

No checkpoint means random weights (target seed `seed`, draft seed `seed + 1`); both models are
`t5.DecoderOnly` with DECODER_ONLY, encoder-decoder `t5.Transformer`s otherwise.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from absl import logging

from speculative import loading
from speculative.decode import contract
from speculative.models import partitioning, t5
from speculative.runs.infer_settings import InferSettings, architecture_source


def load_models(settings: InferSettings,
                with_draft: bool = True) -> Tuple[contract.DecodeModel, Optional[Any]]:
    """`(target, draft)`; the draft is None for the baseline, for mode 'score', and where the
    run needs none (`with_draft` False: GAMMA 'auto''s cached choice is the baseline)."""
    logging.info("Loading target %s; its architecture from %s",
                 settings.target_checkpoint or "(random weights)",
                 architecture_source(settings.target_config, settings.target_checkpoint))
    mesh = settings.make_mesh()
    target = loading.load_model(settings.target_config, settings.target_checkpoint,
                                decoder_only=settings.decoder_only, seed=settings.seed,
                                param_dtype=settings.param_dtype, mesh=mesh)
    draft = load_draft(settings, target, mesh) if settings.drafts and with_draft else None
    return target, draft


def load_draft(settings: InferSettings, target, mesh=None) -> Any:
    """The draft the settings name, for `target`, on the settings' mesh (`mesh`: that mesh,
    made already)."""
    mesh = settings.make_mesh() if mesh is None else mesh
    spec, checkpoint = settings.draft_config, settings.draft_checkpoint
    logging.info("Loading draft %s%s", loading.source(spec, checkpoint),
                 "; its architecture from " + architecture_source(spec, checkpoint)
                 if spec is None or isinstance(spec, t5.T5Config) else "")
    return loading.build_draft(
        spec, checkpoint, target, decoder_only=settings.decoder_only, seed=settings.seed,
        param_dtype=settings.param_dtype, mesh=mesh,
        rules=partitioning.standard_logical_axis_rules() if settings.draft_partitioned else None)


def check_models(settings: InferSettings, task, target, draft,
                 needs_draft: bool = True) -> None:
    """The models must be of the kind DECODER_ONLY says (preloaded ones are not built from the
    settings), and a speculative run needs its draft. The task's kind is not recorded anywhere,
    so it is only guessed from its inputs: prompts that a decoder continues carry no EOS
    (stdlib_code), encoder inputs end with one; a disagreement is logged, since a model may
    have been trained either way."""
    if settings.drafts and needs_draft and draft is None:
        raise ValueError("speculative=True but no draft model was given.")
    for name, model in (("target", target), ("draft", draft)):
        prefix = getattr(model, "prefix_length", None)
        if prefix is None:
            continue
        if (prefix(settings.input_length) > 0) != settings.decoder_only:
            kind = "an encoder-decoder" if settings.decoder_only else "a decoder-only"
            raise ValueError(
                f"DECODER_ONLY={settings.decoder_only} but the {name} is {kind} model "
                f"({type(model).__name__}); load the models with the same settings "
                "(infer.load_models) or set DECODER_ONLY to match them.")
    inputs = task.output_features.get("inputs")
    if inputs is not None and inputs.add_eos == settings.decoder_only:
        logging.warning(
            "Task %s's inputs %s EOS, as %s task's do, but DECODER_ONLY=%s; check that the "
            "models were trained for this task (a decoder-only language model continues a "
            "prompt, an encoder-decoder model reads an input ending with EOS).", task.name,
            "end with" if inputs.add_eos else "have no",
            "an encoder-decoder" if inputs.add_eos else "a decoder-only (prompt -> continuation)",
            settings.decoder_only)
