"""speculative/checkpoints/param_trees.py: parameter trees checked from metadata alone
(an XXL tree without allocating it) and integer parameters refused."""

import os
import resource

import jax
import numpy as np
import pytest
from flax import serialization

from speculative.checkpoints import param_trees
from speculative.checkpoints import t5x as checkpoints
from speculative.checkpoints.param_trees import CheckpointError
from speculative.models import t5


def test_integer_parameters_are_refused(tmp_path):
    params = {"decoder": {"decoder_norm": {"scale": np.arange(8, dtype=np.int32)}}}
    path = checkpoints.save_t5x(params, str(tmp_path / "ints"))
    with pytest.raises(CheckpointError, match=r"decoder/decoder_norm/scale .* dtype int32; "
                                              r"model parameters are floats"):
        checkpoints.load_params(path)


def test_xxl_metadata_is_validated_without_allocating(tmp_path):
    """A fake t5_1_1_xxl checkpoint (44 GB of specs, no arrays on disk) validates from the
    msgpack alone; one deliberately wrong shape is reported by name."""
    expected = checkpoints._flatten(t5.param_shapes(t5.Transformer(t5.preset("t5_1_1_xxl"))))
    bad = ("decoder", "layers_3", "mlp", "wi_0", "kernel")
    target = {}
    for key, s in expected.items():
        shape = [4096, 10000] if key == bad else list(s.shape)
        target[key] = {"driver": "zarr", "dtype": "float32",
                       "kvstore": {"driver": "file", "path": "target." + ".".join(key)},
                       "metadata": {"chunks": shape, "compressor": {"id": "gzip"}, "shape": shape}}
    os.makedirs(tmp_path / "checkpoint_1000000")
    (tmp_path / "checkpoint_1000000" / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 3, "optimizer": {"target": checkpoints._unflatten(target),
                                     "state": {"step": np.int32(1000000)}}}))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    meta = checkpoints.load_metadata(tmp_path)
    assert meta["token_embedder"]["embedding"] == jax.ShapeDtypeStruct((32128, 4096), np.float32)
    with pytest.raises(CheckpointError) as err:
        param_trees.validate_params(meta, t5.Transformer(t5.preset("t5_1_1_xxl")))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 * 1024
    assert "(0 missing, 0 extra, 1 mis-shaped)" in str(err.value)
    assert "decoder/layers_3/mlp/wi_0/kernel: expected (4096, 10240), got (4096, 10000)" in str(
        err.value)
