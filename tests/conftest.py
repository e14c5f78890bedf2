"""Shared fixtures: tiny T5 configs that compile in seconds on 2 CPU cores."""

import jax
import pytest

from speculative.models import t5


def tiny_config(**overrides) -> t5.T5Config:
    base = dict(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                dropout_rate=0.0, relative_attention_num_buckets=8,
                relative_attention_max_distance=16)
    base.update(overrides)
    return t5.T5Config(**base)


@pytest.fixture
def tiny_cfg():
    return tiny_config()


def random_params(module, seed):
    return t5.init_params(module, jax.random.PRNGKey(seed))
