"""checkpoints.py: T5X legacy save/load round trips, Orbax and HF loading, error messages.

Every checkpoint here is written in the test (tiny configs; no download, no network).
"""

import dataclasses
import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import serialization

from speculative.checkpoints import hf as hf_checkpoints
from speculative.checkpoints import param_trees
from speculative.checkpoints import t5x as checkpoints
from speculative.checkpoints.param_trees import CheckpointError
from speculative.models import t5
from tests.helpers import REPO, load_script, run_interrupted, snapshot

CFG = t5.T5Config(vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=12,
                  num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"))


def random_params(config=CFG, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(dtype),
                                  t5.param_shapes(t5.Transformer(config)))


def assert_identical(got, want):
    flat_got = checkpoints._flatten(got)
    flat_want = checkpoints._flatten(want)
    assert sorted(flat_got) == sorted(flat_want)
    for key, value in flat_want.items():
        assert flat_got[key].dtype == value.dtype, key
        assert flat_got[key].shape == value.shape, key
        assert flat_got[key].tobytes() == value.tobytes(), key  # bit-identical


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A float32 T5X legacy checkpoint at `<model_dir>/checkpoint_7` (do not modify)."""
    model_dir = tmp_path_factory.mktemp("t5x")
    params = random_params()
    step_dir = checkpoints.save_t5x(params, str(model_dir), 7)
    return params, str(model_dir), step_dir


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


def _hf_model(tied: bool, seed: int = 0):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.T5Config(
        vocab_size=40, d_model=8, d_kv=3, num_heads=2, d_ff=12, num_layers=2,
        num_decoder_layers=2, feed_forward_proj="relu" if tied else "gated-gelu",
        tie_word_embeddings=tied, relative_attention_max_distance=40, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(cfg)
    if not tied:
        model.lm_head.weight = torch.nn.Parameter(torch.randn(40, 8))
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_hf_directory_loads(tmp_path, tied):
    model = _hf_model(tied)
    model.save_pretrained(tmp_path)
    config = hf_checkpoints.load_hf_config(tmp_path)
    assert config == t5.T5Config(
        vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=12, num_encoder_layers=2,
        num_decoder_layers=2, mlp_activations=("relu",) if tied else ("gelu", "linear"),
        logits_via_embedding=tied, dropout_rate=0.0, relative_attention_max_distance=40)
    params = checkpoints.load_params(tmp_path)
    param_trees.validate_params(params, config)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert_identical(params, hf_checkpoints.from_hf_t5(state, model.config.to_dict()))
    np.testing.assert_array_equal(params["encoder"]["layers_1"]["attention"]["query"]["kernel"],
                                  state["encoder.block.1.layer.0.SelfAttention.q.weight"].T)
    np.testing.assert_array_equal(params["decoder"]["relpos_bias"]["rel_embedding"],
                                  state["decoder.block.0.layer.0.SelfAttention."
                                        "relative_attention_bias.weight"].T)
    assert ("logits_dense" in params["decoder"]) == (not tied)
    back = hf_checkpoints.to_hf_t5(params, config)  # the inverse gives back HF's own tensors
    for name, value in back.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)
    assert set(state) - set(back) <= {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                                      "lm_head.weight"}


def test_config_from_hf_rejects_inconsistent_configs():
    hf = {"d_model": 8, "num_heads": 2, "d_kv": 4, "d_ff": 12, "num_layers": 2,
          "vocab_size": 40, "feed_forward_proj": "gated-gelu"}
    with pytest.raises(CheckpointError, match=r"num_heads \* d_kv = 2 \* 4 = 8.*"
                                              r"encoder/layers_0/attention/query/kernel has 6"):
        hf_checkpoints.config_from_hf(hf, random_params())
    with pytest.raises(CheckpointError, match="Unsupported .* feed_forward_proj='gated-swish'"):
        hf_checkpoints.config_from_hf({**hf, "feed_forward_proj": "gated-swish"})
    assert hf_checkpoints.config_from_hf({**hf, "d_kv": 3}, random_params()) == t5.T5Config(
        vocab_size=40, emb_dim=8, num_heads=2, head_dim=3, mlp_dim=12, num_encoder_layers=2,
        num_decoder_layers=2, mlp_activations=("gelu", "linear"), logits_via_embedding=False)
    # transformers 4.x: tie_word_embeddings; 5.x: scale_decoder_outputs (wins when present).
    assert hf_checkpoints.config_from_hf({**hf, "tie_word_embeddings": True}).logits_via_embedding
    assert not hf_checkpoints.config_from_hf({**hf, "tie_word_embeddings": False,
                                           "scale_decoder_outputs": False}).logits_via_embedding


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


def test_integer_parameters_are_refused(tmp_path):
    params = {"decoder": {"decoder_norm": {"scale": np.arange(8, dtype=np.int32)}}}
    path = checkpoints.save_t5x(params, str(tmp_path / "ints"))
    with pytest.raises(CheckpointError, match=r"decoder/decoder_norm/scale .* dtype int32; "
                                              r"model parameters are floats"):
        checkpoints.load_params(path)


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


# ---------------------------------------------------------------- the convert script

@pytest.fixture(scope="module")
def convert_script():
    return load_script("convert_checkpoint")


def _run(script, argv):
    script.FLAGS(["convert_checkpoint"] + argv)
    try:
        script.main(["convert_checkpoint"])
    finally:
        script.FLAGS.unparse_flags()


@pytest.mark.parametrize("tied", [False, True])
def test_convert_script_round_trips_hf_t5x_hf(tmp_path, convert_script, tied):
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    _hf_model(tied, seed=5).save_pretrained(tmp_path / "hf")
    _run(convert_script, [f"--hf_dir={tmp_path}/hf", f"--t5x_dir={tmp_path}/t5x", "--step=4"])
    assert os.listdir(tmp_path / "t5x") == ["checkpoint_4"]
    _run(convert_script, ["--to_hf", f"--t5x_dir={tmp_path}/t5x", f"--hf_dir={tmp_path}/out",
                          f"--config_json={tmp_path}/hf/config.json"])
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(
        tmp_path / "out" / "model.safetensors")
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    hf, out = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "out"))
    for key in ("d_model", "d_kv", "d_ff", "num_heads", "num_layers", "num_decoder_layers",
                "vocab_size", "feed_forward_proj", "relative_attention_num_buckets",
                "relative_attention_max_distance", "scale_decoder_outputs"):
        assert out[key] == hf[key], key


def test_convert_script_round_trips_a_bundled_model_by_name(tmp_path, convert_script):
    from speculative import loading  # pylint: disable=import-outside-toplevel
    bundled = loading.bundled("mini_target")
    if bundled is None:
        pytest.skip("no bundled models in this checkout")
    _run(convert_script, ["--to_hf", "--model=mini_target", f"--hf_dir={tmp_path}/hf"])
    assert all(os.stat(p).st_mode & 0o777 == 0o644 for p in (tmp_path / "hf").iterdir())
    _run(convert_script, [f"--hf_dir={tmp_path}/hf", f"--t5x_dir={tmp_path}/t5x"])
    before = checkpoints.load_params(bundled.checkpoint, None, bundled.config)
    after = checkpoints.load_params(tmp_path / "t5x", None, bundled.config)
    flat_before, flat_after = (jax.tree_util.tree_leaves_with_path(p) for p in (before, after))
    assert [k for k, _ in flat_before] == [k for k, _ in flat_after]
    for (key, a), (_, b) in zip(flat_before, flat_after):
        assert a.dtype == b.dtype, key
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(key))
    assert hf_checkpoints.load_hf_config(tmp_path / "hf") == dataclasses.replace(
        bundled.config, dropout_rate=hf_checkpoints.load_hf_config(tmp_path / "hf").dropout_rate)
    # A bundled name is also a --preset; a decoder-only bundled model is refused by name.
    with pytest.raises(ValueError, match="'code_target' is a decoder-only model"):
        _run(convert_script, ["--to_hf", "--model=code_target", f"--hf_dir={tmp_path}/x"])
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("signum", [  # SIGINT slow: the same unwinding as SIGTERM now
    pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_an_interrupted_export_leaves_the_earlier_one(tmp_path, convert_script, signum):
    """--to_hf --overwrite over an earlier export, stopped just before the swap: the earlier
    export stays whole and no staging directory is left."""
    from speculative import loading  # pylint: disable=import-outside-toplevel
    if loading.bundled("mini_target") is None:
        pytest.skip("no bundled models in this checkout")
    hf = tmp_path / "hf"
    _run(convert_script, ["--to_hf", "--model=mini_target", f"--hf_dir={hf}",
                          "--dtype=float32"])
    before = snapshot(hf)
    run_interrupted("convert_checkpoint.py", ["--to_hf", "--model=mini_target",
                                              f"--hf_dir={hf}", "--overwrite"],
                    result=str(hf), signum=signum)
    assert snapshot(hf) == before  # the float32 export, not the new bfloat16 one
    assert os.listdir(tmp_path) == ["hf"]


def test_convert_script_names_a_missing_input(tmp_path, convert_script):
    with pytest.raises(FileNotFoundError, match=r"--hf_dir=.*nope: no config.json there"):
        _run(convert_script, [f"--hf_dir={tmp_path}/nope", f"--t5x_dir={tmp_path}/t5x"])
    with pytest.raises(FileNotFoundError, match=r"--config_json=.*none.json does not exist"):
        _run(convert_script, ["--to_hf", f"--t5x_dir={tmp_path}", f"--hf_dir={tmp_path}/hf",
                              f"--config_json={tmp_path}/none.json"])
    assert sorted(os.listdir(tmp_path)) == []  # nothing written


def test_convert_script_help_prints_the_docstring():
    out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "convert_checkpoint.py"),
                          "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Converts T5 checkpoints between Hugging Face and T5X" in out.stdout
    assert "--to_hf" in out.stdout and "--hf_dir" in out.stdout


def test_hf_export_refuses_a_used_directory_and_leaves_no_stale_files(saved, tmp_path):
    params, config = saved[0], CFG
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "model.safetensors.index.json").write_text("{}")  # an older sharded model
    with pytest.raises(FileExistsError, match="overwrite"):
        hf_checkpoints.save_hf_t5(params, config, hf_dir)
    hf_checkpoints.save_hf_t5(params, config, hf_dir, overwrite=True)
    assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # no staging directory left behind


# ---------------------------------------------------------------- ambiguous and impossible paths

def test_convert_script_refuses_impossible_targets_before_work(saved, tmp_path, convert_script):
    """The same directory for both formats, a negative step, a --t5x_dir that is a file (or
    lies under one) or holds an HF model: each refused by name, nothing written."""
    from absl import app  # pylint: disable=import-outside-toplevel
    hf = tmp_path / "hf"
    hf_checkpoints.save_hf_t5(saved[0], CFG, hf)
    (tmp_path / "notes.txt").write_text("not a directory")
    before = snapshot(tmp_path)
    cases = [
        ([f"--hf_dir={hf}", f"--t5x_dir={hf}", "--step=3"], app.UsageError,
         r"--hf_dir and --t5x_dir are the same directory .*ambiguous"),
        ([f"--hf_dir={hf}", f"--t5x_dir={tmp_path}/t5x", "--step=-1"], app.UsageError,
         r"--step=-1 is invalid: T5X steps are >= 0"),
        ([f"--hf_dir={hf}", f"--t5x_dir={tmp_path}/notes.txt"], app.UsageError,
         r"--t5x_dir=.*notes.txt is a file; give the T5X model directory"),
        ([f"--hf_dir={hf}", f"--t5x_dir={tmp_path}/notes.txt/run"], NotADirectoryError,
         r"notes.txt is a file, not a directory"),
        ([f"--hf_dir={hf}", f"--t5x_dir={hf}/"], app.UsageError, r"the same directory"),
        (["--to_hf", f"--t5x_dir={hf}", f"--hf_dir={hf}", "--preset=t5_1_1_tiny"],
         app.UsageError, r"the same directory"),
    ]
    for argv, error, match in cases:
        with pytest.raises(error, match=match):
            _run(convert_script, argv)
        assert snapshot(tmp_path) == before, argv  # nothing written
    other = tmp_path / "other_hf"
    shutil.copytree(hf, other)
    with pytest.raises(CheckpointError, match=r"holds an HF model .*directory of its own"):
        checkpoints.save_t5x(saved[0], other, step=1)
    for step in (-1, True, 1.5):
        with pytest.raises(ValueError, match=rf"step={step!r} is invalid: give an int >= 0"):
            checkpoints.save_t5x(saved[0], tmp_path / "t5x", step=step)
    assert not (tmp_path / "t5x").exists()


def test_a_directory_with_an_hf_model_and_a_t5x_checkpoint_is_refused_naming_both(tmp_path):
    model_a, model_b = random_params(seed=1), random_params(seed=2)
    mixed = tmp_path / "mixed"
    checkpoints.save_t5x(model_b, mixed, step=3)
    hf_checkpoints.save_hf_t5(model_a, CFG, tmp_path / "hf")
    for name in ("model.safetensors", "config.json"):
        shutil.copy(tmp_path / "hf" / name, mixed / name)
    for call in (checkpoints.load_params, checkpoints.load_metadata):
        with pytest.raises(CheckpointError, match=r"holds both an HF model \(model.safetensors "
                                                  r"\+ config.json\) and a T5X checkpoint "
                                                  r"\(checkpoint_3\)"):
            call(mixed)
    # Each is read when named.
    assert_identical(checkpoints.load_params(mixed / "checkpoint_3"), model_b)
    hf = checkpoints.load_params(mixed / "model.safetensors")
    np.testing.assert_array_equal(hf["token_embedder"]["embedding"],
                                  model_a["token_embedder"]["embedding"])
    # A negative step's directory is named as such, not just listed.
    (tmp_path / "neg" / "checkpoint_-1").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"checkpoint_-1'\] are interrupted saves .* or "
                                                r"not a step >= 0"):
        checkpoints.load_params(tmp_path / "neg")


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
