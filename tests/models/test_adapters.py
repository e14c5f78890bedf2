"""models/adapters.py: the adapter for each kind of T5 module and what each tells a
target-aware draft (the decode contract through them: every tests/decode test)."""

import jax.numpy as jnp
import pytest

from speculative.models import adapters, t5
from tests.helpers import random_params, tiny_config


@pytest.mark.parametrize("decoder_only", [False, True])
def test_each_module_kind_gets_its_adapter_and_prefix(decoder_only):
    module = adapters.make_module(tiny_config(), decoder_only=decoder_only)
    assert isinstance(module, t5.DecoderOnly if decoder_only else t5.Transformer)
    model = adapters.as_decode_model(module, random_params(module, 0))
    kind = adapters.DecoderOnlyModel if decoder_only else adapters.EncoderDecoderModel
    assert type(model) is kind and model.vocab_size == 16
    # the decoder cache starts empty after an encoder; after BOS + prompt for a decoder-only LM
    assert model.prefix_length(5) == (6 if decoder_only else 0)


def test_an_encoder_decoder_gives_its_context_only_when_kept():
    module = t5.Transformer(tiny_config())
    model = adapters.as_decode_model(module, random_params(module, 0))
    inputs = jnp.asarray([[3, 4, 1, 0]], jnp.int32)
    kept = model.init_for_draft(model.params, inputs, 8)
    encoded, mask = model.context(kept)
    assert encoded.shape == (1, 4, 16) and mask.tolist() == [[True, True, True, False]]
    with pytest.raises(ValueError, match="keep_encoded=True"):
        model.context(model.init(model.params, inputs, 8))
