"""speculative/runs/infer_models.py: the models the settings name, and the refusal of models
that do not fit the settings (a missing draft, the other kind of model)."""

import pytest

from speculative.runs import config as config_lib
from speculative.runs import infer, infer_inputs, infer_models
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_models_of_the_settings_and_what_is_refused(tiny_gin, tiny_models):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None))
    settings = infer.infer(dry_run=True)
    task = infer_inputs.get_task(settings)
    target, draft = infer_models.load_models(settings)
    assert target.vocab_size == draft.vocab_size == 4000
    infer_models.check_models(settings, task, target, draft)
    with pytest.raises(ValueError, match="no draft model was given"):
        infer_models.check_models(settings, task, target, None)
    score = infer.infer(settings, dry_run=True, mode="score")
    assert not score.drafts
    infer_models.check_models(score, task, target, None)  # scoring needs no draft
    decoder_only = infer.infer(settings, dry_run=True, decoder_only=True, speculative=False,
                               target_config=settings.target_config.__class__(
                                   **{**settings.target_config.__dict__,
                                      "num_encoder_layers": 0}))
    with pytest.raises(ValueError, match="DECODER_ONLY=True but the target is an encoder-decoder"):
        infer_models.check_models(decoder_only, task, tiny_models[0], None)
