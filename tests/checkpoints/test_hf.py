"""speculative/checkpoints/hf.py: HF directories load, inconsistent configs and used
directories are refused, and scripts/convert_checkpoint.py round-trips HF and T5X."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from speculative import loading
from speculative.checkpoints import hf as hf_checkpoints
from speculative.checkpoints import param_trees, t5x_config
from speculative.checkpoints import t5x as checkpoints
from speculative.checkpoints.param_trees import CheckpointError
from speculative.models import t5
from tests.helpers import REPO, load_script, run_interrupted, snapshot
from tests.helpers.checkpoints import CFG, assert_identical, random_params


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
    # The converter writes the model's config.gin beside the checkpoint, as T5X does, so the
    # converted checkpoint loads with no other configuration.
    assert sorted(os.listdir(tmp_path / "t5x")) == ["checkpoint_4", "config.gin"]
    hf_config = hf_checkpoints.load_hf_config(tmp_path / "hf")
    assert t5x_config(tmp_path / "t5x") == t5x_config(tmp_path / "t5x" / "checkpoint_4") \
        == hf_config
    loaded = loading.load_model(None, str(tmp_path / "t5x"), kernel_layout="t5x")
    assert loaded.module.config == hf_config
    assert_identical(jax.tree_util.tree_map(np.asarray, loaded.params),
                     checkpoints.load_params(tmp_path / "hf"))
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


def test_names_that_moved_out_of_speculative_checkpoints_give_their_new_place():
    """`speculative.checkpoints.save_hf_t5` (re-exported before the package split) and the
    other moved names raise naming where they live now, as an attribute and in an import."""
    import speculative.checkpoints as package  # pylint: disable=import-outside-toplevel

    new = "speculative.checkpoints.hf.save_hf_t5"
    with pytest.raises(AttributeError, match=f"moved to {new}: use `from speculative"):
        package.save_hf_t5  # noqa: B018  # pylint: disable=pointless-statement
    with pytest.raises(ImportError, match=f"moved to {new}"):
        from speculative.checkpoints import save_hf_t5  # noqa: F401  # pylint: disable=unused-import
    with pytest.raises(AttributeError, match="speculative.checkpoints.t5x.load_metadata"):
        getattr(package, "load_metadata")
    assert not hasattr(package, "no_such_name") and package.hf.save_hf_t5 is \
        hf_checkpoints.save_hf_t5
