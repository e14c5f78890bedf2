"""Sharded decoding on 8 host CPU devices equals unsharded decoding.

Runs in a subprocess because the device count must be set before jax initialises.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from speculative import partitioning

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import jax, numpy as np
    from conftest import random_params, tiny_config
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
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests)], env=env,
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
