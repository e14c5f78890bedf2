"""Host-measure helpers (tests/measure/test_host.py, tests/experiments/test_limits.py): a decode
step's bytes counted by hand, and a T5 with random numpy weights."""

import jax
import numpy as np
import pytest

from speculative import decoding
from speculative.models import t5
from speculative.runs import mini

needs_bundle = pytest.mark.skipif(not mini.available(), reason="no bundled models")


def tiny_bytes(tied: bool, batch: int, position: float, encoder_length: float) -> int:
    """By hand for conftest's tiny config: E = 16, H * D = 2 * 8 = 16, mlp 32 (gated: wi_0,
    wi_1, wo), 2 decoder layers, 8 relative-position buckets, vocab 16, float32."""
    per_layer = (4 * 16 * 16      # self-attention query, key, value, out
                 + 2 * 16 * 16    # cross-attention query and out (key/value: once per sequence)
                 + 3 * 16 * 32    # MLP
                 + 3 * 16)        # three RMSNorm scales
    decoder = 2 * per_layer + 8 * 2 + 16  # + relative position table + final norm
    output = 16 * 16 if tied else 16 * 16 + batch * 16  # tied embedding | logits + B lookups
    kv_per_position = 2 * 2 * batch * 16  # keys and values, 2 layers, B rows, H * D
    return 4 * (decoder + output + kv_per_position * (position + encoder_length))


def random_model(config):
    """A T5 DecodeModel with random numpy weights (T5X's initialisers would compile first)."""
    rng = np.random.default_rng(0)
    module = t5.Transformer(config)
    params = jax.tree_util.tree_map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(s.dtype),
                                    t5.param_shapes(module))
    return decoding.EncoderDecoderModel(module, params)
