"""Checkpoint helpers (tests/checkpoints): a tiny T5 config with random numpy weights, bitwise
tree equality, and T5X run directories of the config.gin files in tests/fixtures."""

import os
import shutil

import jax
import numpy as np

from speculative.checkpoints import factory
from speculative.checkpoints import t5x as checkpoints
from speculative.models import t5
from tests.helpers import FIXTURES

CFG = t5.T5Config(vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=12,
                  num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"))


def random_params(config=CFG, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(dtype),
                                  t5.param_shapes(t5.Transformer(config)))


def assert_identical(got, want):
    flat_got = checkpoints._flatten(got)  # pylint: disable=protected-access
    flat_want = checkpoints._flatten(want)  # pylint: disable=protected-access
    assert sorted(flat_got) == sorted(flat_want)
    for key, value in flat_want.items():
        assert flat_got[key].dtype == value.dtype, key
        assert flat_got[key].shape == value.shape, key
        assert flat_got[key].tobytes() == value.tobytes(), key  # bit-identical


RUN_GIN = os.path.join(FIXTURES, "t5x_run", "config.gin")
LM_GIN = os.path.join(FIXTURES, "t5x_decoder_only_run", "config.gin")

# What tests/fixtures/t5x_run/config.gin says (macros resolved; float32_attention_logits is
# accepted: attention logits are float32 here always).
RUN_CONFIG = t5.T5Config(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24,
                         num_encoder_layers=1, num_decoder_layers=2,
                         mlp_activations=("gelu", "linear"), dropout_rate=0.05,
                         logits_via_embedding=False, dtype="float32")
LM_CONFIG = t5.T5Config(vocab_size=24, emb_dim=12, num_heads=3, head_dim=4, mlp_dim=20,
                        num_encoder_layers=0, num_decoder_layers=2, mlp_activations=("relu",),
                        dropout_rate=0.0, logits_via_embedding=True, dtype="float32")


def run_dir(tmp_path, gin_file, config, decoder_only=False, step=3, seed=0):
    """A T5X-style model dir: config.gin beside checkpoint_<step> of a random model."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    shutil.copy(gin_file, model_dir / "config.gin")
    model = factory.load_model(config, decoder_only=decoder_only, seed=seed)
    checkpoints.save_t5x(model.params, str(model_dir), step=step)
    return str(model_dir), model
