"""Sharded decoding on 8 host CPU devices equals unsharded decoding.

Runs in a subprocess because the device count must be set before jax initialises.
"""

import os
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from speculative.models import partitioning, t5
from tests.helpers import REPO, random_params, tiny_config

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    import jax, numpy as np
    from tests.helpers import random_params, tiny_config
    from speculative import decoding, partitioning, sampling
    from speculative.models import t5

    assert jax.device_count() == 8, jax.devices()
    module = t5.Transformer(tiny_config(num_heads=4, head_dim=4, mlp_dim=32))
    pt, pd = random_params(module, 0), random_params(module, 1)
    inputs = np.random.default_rng(0).integers(2, 16, (8, 6)).astype(np.int32)
    kw = dict(rng=jax.random.PRNGKey(0), gamma=3, sampling=sampling.SamplingConfig(0.0),
              max_decode_len=10)
    ref = decoding.speculative_decode(decoding.EncoderDecoderModel(module, pt),
                                      decoding.EncoderDecoderModel(module, pd), inputs, **kw)
    mesh = partitioning.make_mesh(num_partitions=4)
    target = decoding.EncoderDecoderModel(module, partitioning.shard_params(pt, module, mesh))
    draft = decoding.EncoderDecoderModel(module, partitioning.shard_params(pd, module, mesh))
    q = target.params["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "model"), q.sharding
    got = decoding.speculative_decode(target, draft, partitioning.shard_batch(inputs, mesh), **kw)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    try:
        partitioning.shard_batch(inputs[:3], mesh)
        raise AssertionError("batch 3 over 2 data shards should fail")
    except ValueError as e:
        assert "not divisible" in str(e)
    print("SHARDED_OK", mesh.shape)
""")


@pytest.mark.slow  # ~14 s; tests/test_sharded_runs.py checks the same through infer in CI
def test_sharded_speculative_decode_matches_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=REPO)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert "SHARDED_OK" in out.stdout, out.stderr[-3000:]


def test_rules_follow_t5x():
    rules = dict(partitioning.standard_logical_axis_rules())
    assert rules["joined_kv"] == "model" and rules["embed"] is None and rules["batch"] == "data"
    assert dict(partitioning.standard_logical_axis_rules(parameter_partitioning_dims=2))[
        "embed"] == "data"


def test_bad_mesh_raises():
    with pytest.raises(ValueError, match="must divide"):
        partitioning.make_mesh(num_partitions=3, devices=[object()] * 8)


def test_cache_spec_splits_batch_and_the_heads_of_every_key_value_cache():
    """The decode state's layout on a (data 2, model 4) mesh, read off a real T5 cache: the
    heads axis of each head-major `[B, H, L, D]` key/value cache goes over 'model' (beside
    the attention kernels' heads), the batch over 'data'; what does not divide is replicated."""
    mesh = types.SimpleNamespace(shape={"data": 2, "model": 4})
    config = tiny_config(num_heads=4, head_dim=4)
    module = t5.Transformer(config)
    params = random_params(module, 0)
    state = jax.eval_shape(lambda: module.apply(
        {"params": params}, np.ones((6, 5), np.int32), 12, method="init_cache"))
    kvs = [x for pair in state.self_kv + state.cross_kv for x in pair]
    assert len(kvs) == 4 * config.num_decoder_layers
    for x in kvs:
        spec = partitioning.cache_spec(x.shape, mesh)
        assert spec == P("data", "model", None, None), (x.shape, spec)
        assert x.shape[1] == config.num_heads and x.shape[3] == config.head_dim
    assert partitioning.cache_spec(state.lengths.shape, mesh) == P("data")
    assert partitioning.cache_spec((3, 6, 12, 4), mesh) == P(None, None, None, None)
