"""speculative/checkpoints/factory.py: `load_model` from T5X run directories (encoder-decoder
and decoder-only), kernel layouts, and the two ways to give a config when there is no
config.gin."""

import logging
import os
import shutil

import jax
import numpy as np
import pytest
from flax import serialization

from speculative import decoding, loading
from speculative.checkpoints import config_gin, factory, param_trees, t5x_config
from speculative.checkpoints import t5x as checkpoints
from speculative.checkpoints.param_trees import CheckpointError
from speculative.decode.kernel import SamplingConfig
from tests.helpers import tiny_config
from tests.helpers.checkpoints import (
    CFG,
    LM_CONFIG,
    LM_GIN,
    RUN_CONFIG,
    RUN_GIN,
    assert_identical,
    run_dir,
)


@pytest.mark.parametrize("how", ["orbax", "orbax_target", "flax_msgpack"])
def test_a_cpu_loaded_models_params_saved_as_they_are_load_in_t5x_names(tmp_path, how):
    """A model loaded on a CPU holds `kernel_t [out, in]` (layers.transpose_kernels). Saved as
    a T5X user would (Orbax, or flax's msgpack), they load back with T5X's names and layout;
    an in-memory tree with kernel_t is refused with the fix named."""
    from speculative.checkpoints import factory  # pylint: disable=import-outside-toplevel
    from speculative.models import layers  # pylint: disable=import-outside-toplevel
    model = factory.load_model(CFG, seed=0)
    assert layers.kernel_layout(model.params) == "transposed"
    want = jax.tree_util.tree_map(np.asarray, layers.untranspose_kernels(model.params))
    if how == "flax_msgpack":
        path = tmp_path / "params.msgpack"
        path.write_bytes(serialization.to_bytes(model.params))
    else:
        import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
        path = tmp_path / "checkpoint_1" / "state"
        tree = {"target": model.params} if how == "orbax_target" else model.params
        ocp.PyTreeCheckpointer().save(str(path), tree)
        path = tmp_path  # the model dir: its latest step's Orbax item
    param_trees.validate_params(checkpoints.load_metadata(path), CFG, source=str(path))
    assert_identical(checkpoints.load_params(path), want)
    loaded = factory.load_model(CFG, str(path), kernel_layout="t5x")
    assert layers.kernel_layout(loaded.params) == "t5x"
    with pytest.raises(CheckpointError, match=r"kernel_t is a dense kernel stored \[out, in\].*"
                                              r"save_t5x\(params, dir\).*untranspose_kernels"):
        param_trees.validate_params(model.params, CFG)


# ----------------------------------------------------------------------------------------------
# From tests/test_t5x_config.py.


def test_load_model_from_a_t5x_dir_decodes_identically(tmp_path, caplog):
    model_dir, original = run_dir(tmp_path, RUN_GIN, RUN_CONFIG)
    with caplog.at_level(logging.INFO, logger="absl"):
        loaded = loading.load_model(None, model_dir)
    assert isinstance(loaded, decoding.EncoderDecoderModel)
    assert loaded.module.config == RUN_CONFIG
    assert any("config.gin" in r.getMessage() and "Architecture" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    given = loading.load_model(RUN_CONFIG, os.path.join(model_dir, "checkpoint_3"))
    built = loading.build_model(None, os.path.join(model_dir, "checkpoint_3"))
    inputs = np.asarray([[5, 9, 3, 1], [7, 2, 1, 0]], np.int32)
    kwargs = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=6)
    want = decoding.autoregressive_decode(original, inputs, **kwargs)
    for model in (loaded, given, built):
        got = decoding.autoregressive_decode(model, inputs, **kwargs)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.lengths, want.lengths)
        for a, b in zip(jax.tree_util.tree_leaves(model.params),
                        jax.tree_util.tree_leaves(original.params)):
            np.testing.assert_array_equal(a, b)


def test_decoder_only_run_dir_loads_as_decoder_only(tmp_path):
    model_dir, original = run_dir(tmp_path, LM_GIN, LM_CONFIG, decoder_only=True)
    loaded = loading.load_model(None, model_dir)
    assert isinstance(loaded, decoding.DecoderOnlyModel)
    prompts = np.asarray([[4, 5, 6], [7, 0, 0]], np.int32)
    kwargs = dict(rng=jax.random.PRNGKey(1), sampling=SamplingConfig(0.0), max_decode_len=5)
    np.testing.assert_array_equal(
        decoding.autoregressive_decode(loaded, prompts, **kwargs).tokens,
        decoding.autoregressive_decode(original, prompts, **kwargs).tokens)
    with pytest.raises(ValueError, match=r"decoder_only=False .*decoder-only.*DECODER_ONLY = "
                                         r"True"):
        loading.build_model(None, model_dir, decoder_only=False)


def test_a_t5x_decoder_only_checkpoint_loads(tmp_path):
    """T5X's decoder-only network keeps its embedding under `decoder/token_embedder`; such a
    checkpoint beside its config.gin loads as our DecoderOnly, unchanged."""
    model_dir = tmp_path / "lm"
    model_dir.mkdir()
    shutil.copy(LM_GIN, model_dir / "config.gin")
    original = factory.load_model(LM_CONFIG, decoder_only=True, seed=2, kernel_layout="t5x")
    params = dict(original.params)
    params["decoder"] = {**params["decoder"], "token_embedder": params.pop("token_embedder")}
    checkpoints.save_t5x(params, str(model_dir), step=1)
    loaded = loading.load_model(None, str(model_dir), kernel_layout="t5x")
    assert isinstance(loaded, decoding.DecoderOnlyModel)
    for a, b in zip(jax.tree_util.tree_leaves(loaded.params),
                    jax.tree_util.tree_leaves(original.params)):
        np.testing.assert_array_equal(a, b)


def test_no_config_gin_names_the_two_ways(tmp_path):
    model = factory.load_model(RUN_CONFIG, seed=0)
    step = checkpoints.save_t5x(model.params, str(tmp_path / "bare"), step=0)
    for call in (lambda: t5x_config(step), lambda: loading.load_model(None, step),
                 lambda: loading.build_model(None, step)):
        with pytest.raises(config_gin.ConfigGinError) as e:
            call()
        message = str(e.value)
        assert "No T5X config.gin" in message and step in message
        assert "(1) a T5Config" in message and "(2) the config.gin" in message
    with pytest.raises(ValueError, match="needs a checkpoint"):
        loading.load_model(None, None)


# ----------------------------------------------------------------------------------------------
# From tests/models/test_t5.py.
def test_load_model_kernel_layout(tmp_path):
    """'auto' is the transposed layout on a CPU without a mesh; 't5x' keeps T5X's; a transposed
    model saves as a T5X checkpoint; bad values and a transposed sharded model are refused by
    name."""
    from speculative.checkpoints import factory  # pylint: disable=g-import-not-at-top
    from speculative.checkpoints import t5x as checkpoints  # pylint: disable=g-import-not-at-top
    from speculative.models import layers  # pylint: disable=g-import-not-at-top

    cfg = tiny_config()
    auto = factory.load_model(cfg, seed=0)
    t5x = factory.load_model(cfg, seed=0, kernel_layout="t5x")
    assert jax.default_backend() == "cpu"
    q = auto.params["decoder"]["layers_0"]["self_attention"]["query"]
    assert set(q) == {"kernel_t"}
    np.testing.assert_array_equal(
        q["kernel_t"], t5x.params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"].T)
    saved = checkpoints.save_t5x(auto.params, tmp_path, step=1)
    again = factory.load_model(cfg, saved, kernel_layout="t5x")  # validates T5X's names first
    for a, b in zip(jax.tree_util.tree_leaves(again.params), jax.tree_util.tree_leaves(t5x.params)):
        np.testing.assert_array_equal(a, b)
    # Placed on a mesh, a CPU-loaded model is sharded in T5X's layout, which the rules name.
    from speculative.models import partitioning  # pylint: disable=g-import-not-at-top
    placed = partitioning.place_model(auto, partitioning.make_mesh(mesh_shape=(1, 1)))
    assert layers.kernel_layout(placed.params) == "t5x" == layers.kernel_layout(t5x.params)
    assert layers.kernel_layout(auto.params) == "transposed"
    with pytest.raises(ValueError, match="kernel_layout='columns'"):
        factory.load_model(cfg, seed=0, kernel_layout="columns")
    with pytest.raises(ValueError, match="unsharded"):
        layers.resolve_kernel_layout("transposed", sharded=True)
    assert layers.resolve_kernel_layout("auto", sharded=True) == "t5x"
