"""checkpoints.py: T5X legacy save/load round trips, Orbax and HF loading, error messages.

Every checkpoint here is written in the test (tiny configs; no download, no network).
"""

import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import serialization

from speculative.checkpoints import t5x as checkpoints
from speculative.checkpoints.param_trees import CheckpointError
from speculative.models import t5
from tests.helpers.checkpoints import CFG, assert_identical, random_params


@pytest.fixture
def copy(saved, tmp_path):
    """A private copy of `saved`'s step dir, to corrupt."""
    step_dir = str(tmp_path / "checkpoint_7")
    shutil.copytree(saved[2], step_dir)
    return saved[0], step_dir


# ---------------------------------------------------------------- round trips and layout

@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_save_load_round_trip_is_bit_identical(tmp_path, dtype):
    params = random_params(dtype=dtype)
    checkpoints.save_t5x(params, str(tmp_path), 3)  # positional (params, path, step)
    os.makedirs(tmp_path / "checkpoint_9.tmp-1700000000")  # an unfinished save: ignored
    for path in (tmp_path, tmp_path / "checkpoint_3", tmp_path / "checkpoint_3" / "checkpoint"):
        assert_identical(checkpoints.load_params(path, config=CFG), params)
    with pytest.raises(FileExistsError, match="checkpoint_3 exists"):
        checkpoints.save_t5x(params, str(tmp_path), 3)


def test_load_casts_and_picks_the_latest_step(saved, tmp_path):
    params, model_dir, _ = saved
    shutil.copytree(model_dir, tmp_path, dirs_exist_ok=True)
    newer = random_params(seed=1)
    checkpoints.save_t5x(newer, str(tmp_path), 12)
    loaded = checkpoints.load_params(tmp_path, dtype="bfloat16")
    assert_identical(loaded, jax.tree_util.tree_map(lambda x: x.astype(ml_dtypes.bfloat16), newer))


def test_saved_layout_is_t5x_legacy_version_3(saved):
    params, model_dir, step_dir = saved
    assert os.listdir(model_dir) == ["checkpoint_7"]  # the .tmp dir was renamed
    with open(os.path.join(step_dir, "checkpoint"), "rb") as f:
        tree = serialization.msgpack_restore(f.read())
    assert sorted(tree) == ["optimizer", "version"] and tree["version"] == 3
    state = tree["optimizer"]["state"]
    assert state["param_states"] == {} and state["step"] == 7
    assert isinstance(state["step"], np.int32)
    spec = tree["optimizer"]["target"]["decoder"]["layers_1"]["mlp"]["wi_0"]["kernel"]
    name = "target.decoder.layers_1.mlp.wi_0.kernel"
    assert spec == {"driver": "zarr", "dtype": "float32",
                    "kvstore": {"driver": "file", "path": name},
                    "metadata": {"chunks": [8, 12], "compressor": {"id": "gzip", "level": 1},
                                 "shape": [8, 12]}}
    with open(os.path.join(step_dir, "target.decoder.layers_1.mlp.wi_0.kernel", ".zarray")) as f:
        zarray = json.load(f)
    assert zarray["dimension_separator"] == "." and zarray["dtype"] == "<f4"
    assert zarray["compressor"] == {"id": "gzip", "level": 1}
    dirs = {d for d in os.listdir(step_dir) if d != "checkpoint"}
    assert dirs == {"target." + ".".join(k) for k in checkpoints._flatten(params)}


def test_chunk_shape_follows_t5x():
    target = checkpoints._CHUNK_BYTES // 4
    assert checkpoints._choose_chunk_shape([32128, 4096], target) == [4016, 4096]  # xxl embedding
    assert checkpoints._choose_chunk_shape([4096, 10240], target) == [4096, 2560]
    assert checkpoints._choose_chunk_shape([512, 384], target) == [512, 384]
    assert checkpoints._choose_chunk_shape([], target) == []
    # [6, 4] -> [3, 4] -> [3, 2] -> [2, 2]: always the currently largest dim, to its next divisor
    assert checkpoints._choose_chunk_shape([6, 4], 5) == [2, 2]


# ---------------------------------------------------------------- other formats

def test_orbax_ocdbt_checkpoint_loads(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    params = random_params(seed=2)
    params["encoder"]["encoder_norm"]["scale"] = params["encoder"]["encoder_norm"]["scale"].astype(
        ml_dtypes.bfloat16)
    slots = jax.tree_util.tree_map(lambda x: {"v": np.zeros_like(x)}, params)
    ocp.PyTreeCheckpointer(use_ocdbt=True).save(
        str(tmp_path / "checkpoint_5" / "state"),
        {"target": params, "state": {"step": np.int32(5), "param_states": slots}})
    assert os.path.exists(tmp_path / "checkpoint_5" / "state" / "manifest.ocdbt")
    for path in (tmp_path, tmp_path / "checkpoint_5", tmp_path / "checkpoint_5" / "state"):
        assert_identical(checkpoints.load_params(path, config=CFG), params)
    meta = checkpoints.load_metadata(tmp_path)
    assert meta["token_embedder"]["embedding"] == jax.ShapeDtypeStruct((40, 8), np.float32)


def test_legacy_checkpoint_with_inline_arrays_loads(tmp_path, monkeypatch):
    """All arrays inline in the msgpack (ExtType), bfloat16 too, and flax's chunked form."""
    params = random_params(seed=3)
    params["decoder"]["decoder_norm"]["scale"] = params["decoder"]["decoder_norm"]["scale"].astype(
        ml_dtypes.bfloat16)
    state = {"step": np.int32(1), "param_states": jax.tree_util.tree_map(np.ones_like, params)}
    os.makedirs(tmp_path / "checkpoint_1")
    blob = serialization.to_bytes({"version": 3, "optimizer": {"target": params, "state": state}})
    (tmp_path / "checkpoint_1" / "checkpoint").write_bytes(blob)
    assert_identical(checkpoints.load_params(tmp_path, config=CFG), params)

    monkeypatch.setattr(serialization, "MAX_CHUNK_SIZE", 64)  # -> __msgpack_chunked_array__
    blob = serialization.to_bytes({"version": 3, "optimizer": {"target": params, "state": state}})
    assert b"__msgpack_chunked_array__" in blob
    (tmp_path / "checkpoint_1" / "checkpoint").write_bytes(blob)
    assert_identical(checkpoints.load_params(tmp_path), params)


def test_plain_flax_checkpoint_without_version_loads(tmp_path):
    params = random_params(seed=4)
    for tree in (params, {"target": params, "state": {"step": 3}}):
        (tmp_path / "ckpt.msgpack").write_bytes(serialization.to_bytes(tree))
        assert_identical(checkpoints.load_params(tmp_path / "ckpt.msgpack"), params)


# ---------------------------------------------------------------- errors a user can cause

def test_corrupt_msgpack_names_the_file(copy):
    _, step_dir = copy
    msgpack_file = os.path.join(step_dir, "checkpoint")
    blob = open(msgpack_file, "rb").read()
    for bad in (blob[: len(blob) // 2], b"\x05not msgpack", blob + b"\x00\x01"):
        with open(msgpack_file, "wb") as f:
            f.write(bad)
        with pytest.raises(CheckpointError, match=f"{msgpack_file} is not a valid msgpack"):
            checkpoints.load_params(step_dir)


def test_missing_zarr_dir_names_the_parameter(copy):
    _, step_dir = copy
    shutil.rmtree(os.path.join(step_dir, "target.encoder.layers_1.mlp.wo.kernel"))
    with pytest.raises(CheckpointError, match=r"encoder/layers_1/mlp/wo/kernel: its zarr array "
                                              r".*target.encoder.layers_1.mlp.wo.kernel/ does "
                                              r"not exist.*copy the checkpoint directory again"):
        checkpoints.load_params(step_dir)


def test_truncated_or_missing_chunk_names_the_parameter(copy):
    _, step_dir = copy
    chunk = os.path.join(step_dir, "target.token_embedder.embedding", "0.0")
    data = open(chunk, "rb").read()
    with open(chunk, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"token_embedder/embedding: a chunk of .*"
                                              r"target.token_embedder.embedding/ is corrupt"):
        checkpoints.load_params(step_dir)
    os.remove(chunk)  # zarr would silently read zeros
    with pytest.raises(CheckpointError, match=r"token_embedder/embedding: 1 chunk file\(s\) "
                                              r"missing .*\['0.0'\]"):
        checkpoints.load_params(step_dir)


def test_shape_mismatch_between_msgpack_and_zarray(copy):
    params, step_dir = copy
    msgpack_file = os.path.join(step_dir, "checkpoint")
    tree = serialization.msgpack_restore(open(msgpack_file, "rb").read())
    tree["optimizer"]["target"]["decoder"]["decoder_norm"]["scale"]["metadata"]["shape"] = [9]
    with open(msgpack_file, "wb") as f:
        f.write(serialization.msgpack_serialize(tree))
    with pytest.raises(CheckpointError, match=r"decoder/decoder_norm/scale: .*checkpoint records "
                                              r"shape \(9,\) but .*\.zarray says \(8,\)"):
        checkpoints.load_params(step_dir)


def test_dtype_mismatch_between_msgpack_and_zarray(copy):
    """A stored dtype other than the recorded one (the zarr rewritten behind the msgpack) is
    refused by name instead of decoding junk."""
    _, step_dir = copy
    zarray = os.path.join(step_dir, "target.decoder.decoder_norm.scale", ".zarray")
    meta = json.load(open(zarray))
    meta["dtype"] = "<i4"
    with open(zarray, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match=r"decoder/decoder_norm/scale: .*records dtype "
                                              r"float32 but .*stores int32"):
        checkpoints.load_params(step_dir)


def test_shape_mismatch_against_the_config_lists_every_problem(saved):
    _, model_dir, _ = saved
    other = t5.T5Config(vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=10,
                        num_encoder_layers=3, num_decoder_layers=2, mlp_activations=("relu",))
    with pytest.raises(CheckpointError) as err:
        checkpoints.load_params(model_dir, config=other)
    msg = str(err.value)
    assert "missing encoder/layers_2/attention/query/kernel: expected (8, 6)" in msg
    assert "missing decoder/layers_1/mlp/wi/kernel: expected (8, 10)" in msg
    assert "extra decoder/layers_1/mlp/wi_0/kernel: (8, 12)" in msg
    assert "decoder/layers_1/mlp/wo/kernel: expected (10, 8), got (12, 8)" in msg
    assert "mlp/wi_0 and mlp/wi_1" in msg  # a hint at the fix


def test_bad_paths_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/nope does not exist"):
        checkpoints.load_params(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hi")
    with pytest.raises(FileNotFoundError, match=r"empty holds no checkpoint.*\['notes.txt'\]"):
        checkpoints.load_params(tmp_path / "empty")


def test_optimizer_state_is_never_read(copy):
    """`state.*` zarr dirs are corrupt and inline state arrays present: loading still works."""
    params, step_dir = copy
    msgpack_file = os.path.join(step_dir, "checkpoint")
    tree = serialization.msgpack_restore(open(msgpack_file, "rb").read())
    bad_dir = os.path.join(step_dir, "state.param_states.token_embedder.embedding.v")
    os.makedirs(bad_dir)
    with open(os.path.join(bad_dir, ".zarray"), "w") as f:
        f.write("{corrupt")
    tree["optimizer"]["state"]["param_states"] = {
        "token_embedder": {"embedding": {
            "v": {"driver": "zarr", "metadata": {"shape": [40, 8]},
                  "kvstore": {"driver": "file", "path": os.path.basename(bad_dir)}},
            "v_row": {"driver": "zarr", "kvstore": {"driver": "file", "path": "missing.dir"}},
            "m": np.ones((40, 8), np.float32)}}}
    tree["flax_mutables"] = {"junk": np.ones(3)}
    with open(msgpack_file, "wb") as f:
        f.write(serialization.msgpack_serialize(tree))
    assert_identical(checkpoints.load_params(step_dir, config=CFG), params)


def test_gcs_and_old_specs_resolve_against_the_checkpoint_dir():
    gcs = {"driver": "zarr", "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"},
           "path": "target.encoder.encoder_norm.scale"}
    want = {"driver": "zarr", "kvstore": {"driver": "gcs", "bucket": "t5-data",
                                          "path": "models/t5x/checkpoint_10/target.encoder."
                                                  "encoder_norm.scale/"}}
    assert checkpoints._ts_read_spec(gcs, "gs://t5-data/models/t5x/checkpoint_10") == want
    gfile = {"driver": "zarr", "kvstore": {"driver": "gfile", "path": "target.x"}}
    assert checkpoints._ts_read_spec(gfile, "gs://b/c") == {
        "driver": "zarr", "kvstore": {"driver": "gcs", "bucket": "b", "path": "c/target.x/"}}
    assert checkpoints._ts_read_spec(gfile, "/ckpt/checkpoint_1") == {
        "driver": "zarr", "kvstore": {"driver": "file", "path": "/ckpt/checkpoint_1/target.x/"}}


# ---------------------------------------------------------------- config.gin beside the checkpoint
def test_save_t5x_with_its_config_writes_a_config_gin_that_rebuilds_the_model(tmp_path):
    """With `config`, save_t5x writes T5X's config.gin beside checkpoint_<step>: the model dir
    alone then loads (load_model(None, dir)), encoder-decoder and decoder-only."""
    from speculative import loading  # pylint: disable=import-outside-toplevel
    from speculative.checkpoints import config_gin  # pylint: disable=import-outside-toplevel

    lm = t5.T5Config(vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=12,
                     num_encoder_layers=0, num_decoder_layers=1, logits_via_embedding=True)
    for name, config, decoder_only in (("encdec", CFG, False), ("lm", lm, True)):
        model = loading.load_model(config, decoder_only=decoder_only, seed=1)
        checkpoints.save_t5x(model.params, tmp_path / name, 2, config=config,
                             decoder_only=decoder_only)
        assert sorted(os.listdir(tmp_path / name)) == ["checkpoint_2", "config.gin"]
        found = config_gin.t5x_model_config(tmp_path / name / "checkpoint_2")
        assert (found.config, found.decoder_only) == (config, decoder_only)
        loaded = loading.load_model(None, str(tmp_path / name))
        assert loaded.module.config == config and type(loaded) is type(model)
        assert_identical(jax.tree_util.tree_map(np.asarray, loaded.params),
                         jax.tree_util.tree_map(np.asarray, model.params))
        # A second step of the same model keeps the config.gin; another model is refused
        # before anything is written.
        before = (tmp_path / name / "config.gin").read_text()
        checkpoints.save_t5x(model.params, tmp_path / name, 3, config=config,
                             decoder_only=decoder_only)
        assert (tmp_path / name / "config.gin").read_text() == before
    other = t5.T5Config(**{**CFG.__dict__, "mlp_dim": 10})
    with pytest.raises(CheckpointError, match="describes another model"):
        checkpoints.save_t5x(random_params(other), tmp_path / "encdec", 9, config=other)
    with pytest.raises(CheckpointError, match="mlp"):  # params that do not fit the config
        checkpoints.save_t5x(random_params(CFG), tmp_path / "bad", 0, config=other)
    assert not (tmp_path / "encdec" / "checkpoint_9").exists()
    assert not (tmp_path / "bad").exists() or not os.listdir(tmp_path / "bad")
