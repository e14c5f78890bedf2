"""Ours against transformers (speculative/experiments/peers.py, scripts/compare_peers.py).

A tiny random T5 pair in the bundled vocabulary (so the bundled test sentences are its inputs),
whose target has a deeper decoder than encoder (transformers' default KV cache fails on it).
Known answers: transformers' logits on the converted weights equal ours; every greedy method,
ours and transformers', emits the same tokens; a perturbed converted model fails parity.
"""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.helpers import REPO

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from speculative import decoding, loading  # noqa: E402
from speculative.checkpoints import hf as hf_checkpoints  # noqa: E402
from speculative.data import bundles  # noqa: E402
from speculative.experiments import peers  # noqa: E402
from speculative.models import t5  # noqa: E402
from speculative.runs import mini  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

TARGET = tiny_config(vocab_size=4000, num_encoder_layers=1, num_decoder_layers=2)
DRAFT = tiny_config(vocab_size=4000, num_encoder_layers=1, num_decoder_layers=1)

pytestmark = pytest.mark.skipif(not mini.available(), reason="needs the bundled test sentences")


def _given(name: str, config: t5.T5Config, directory, seed: int) -> peers.Given:
    """A random model saved as a checkpoint (numpy weights: no init program to compile)."""
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map(
        lambda s: (rng.standard_normal(s.shape) * 0.3).astype(np.float32),
        t5.param_shapes(t5.Transformer(config)))
    return peers.Given(name, config, hf_checkpoints.save_hf_t5(params, config, directory / name))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """run() arguments for the tiny pair on 2 sentences, 1 repeat."""
    models_dir = tmp_path_factory.mktemp("models")
    pair = (_given("tiny_target", TARGET, models_dir, 0),
            _given("tiny_draft", DRAFT, models_dir, 1))
    return dict(pairs=[pair], num_sentences=2, repeats=1, gamma=2, max_decode_len=8,
                temperatures=(0.0,), torch_threads=1)


@pytest.fixture(scope="module")
def result(tmp_path_factory, small):
    out = tmp_path_factory.mktemp("peers")
    return out, peers.run(output_dir=str(out), **small)


def test_run_checks_parity_and_greedy_agreement_and_writes_both_files(result):
    out, data = result
    assert json.loads((out / peers.RESULTS_FILE).read_text()) == json.loads(json.dumps(data))
    assert data["schema"] == peers.SCHEMA
    assert {"torch_version", "transformers_version", "torch_num_threads", "omp_wait_policy",
            "load_average_1m", "cpu_count"} <= set(data["environment"])
    assert data["environment"]["omp_wait_policy"]  # set before torch loads (or by the user)
    (pair,) = data["pairs"]
    assert (pair["target"], pair["draft"], pair["sentences"]) == ("tiny_target", "tiny_draft", 2)
    assert pair["parity"]["target"] < 1e-4 and pair["parity"]["draft"] < 1e-4
    greedy = pair["greedy"]
    assert len(greedy["methods"]) == 5 and greedy["identical"] == greedy["sentences"] == 2
    assert set(greedy["identical_to"].values()) == {2}
    assert len(pair["methods"]) == 5
    for m in pair["methods"]:
        assert m["tokens"] > 0 and m["tokens_per_s"] > 0 and m["timing"]["median_s"] > 0
        assert m["tokens_per_target_call"] >= 1.0 - 1e-9  # every method counts its target calls
        if m["method"] in (peers.AUTOREGRESSIVE, peers.GENERATE):
            assert m["tokens_per_target_call"] == 1.0
    assert len(pair["comparisons"]) == 3
    assert pair["assistant_default"]["num_assistant_tokens"] is not None
    table = (out / peers.TABLE_FILE).read_text()
    assert "| T | ours | tokens/s |" in table and "tiny_target + tiny_draft" in table
    assert "assisted (gamma=2)" in table and "2/2 sentences" in table


def test_refuses_an_earlier_run_before_any_work(result, small):
    out, _ = result
    with pytest.raises(FileExistsError, match="--overwrite"):
        peers.run(output_dir=str(out), **small)


def test_missing_torch_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(peers.MissingDependency, match=re.escape('pip install -e ".[test]"')):
        peers.run(output_dir=str(tmp_path / "out"), pairs=[("mini_target", "mini_draft_10")])
    assert not (tmp_path / "out").exists()  # nothing done


@pytest.mark.parametrize("override, message", [
    ({"num_sentences": 0}, "num_sentences"),
    ({"gamma": 0}, "gamma"),
    ({"temperatures": [-1.0]}, "temperatures"),
    ({"parity_atol": 0.0}, "parity_atol"),
    ({"pairs": [("mini_target", "mini_bigram")]}, "n-gram"),
    ({"pairs": [("no_such_model", "mini_draft_10")]}, "no_such_model"),
    ({"pairs": [("mini_target",)]}, "target, draft"),
])
def test_bad_values_fail_before_any_work(tmp_path, override, message):
    kwargs = {"pairs": [("mini_target", "mini_draft_10")], **override}
    with pytest.raises(ValueError, match=message):
        peers.run(output_dir=str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not bundles.CODE.available(), reason="needs the bundled code models")
def test_a_model_of_the_code_bundle_is_named_as_such(tmp_path):
    """code_target is bundled, just not in the EN->DE bundle the comparison runs: the error
    says so and lists what can be compared, instead of 'No bundled model'."""
    for call in (lambda: peers.run(output_dir=str(tmp_path / "out"),
                                   pairs=[("code_target", "code_draft")]),
                 lambda: peers.config_for("code_target", str(tmp_path))):
        with pytest.raises(ValueError, match="'code_target' is a model of the 'code' bundle") as e:
            call()
        assert "No bundled model" not in str(e.value) and "large_target" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_run_records_its_provenance(result):
    out, data = result
    provenance = json.loads((out / peers.RESULTS_FILE).read_text())["provenance"]
    assert provenance["command"].startswith("python ") and provenance["date"]
    assert set(provenance["host"]["load"]) == {"before", "after"}
    assert provenance == json.loads(json.dumps(data["provenance"]))


def test_parity_error_names_the_difference(tmp_path, small):
    given = small["pairs"][0][0]
    target = loading.load_model(given.config, given.checkpoint)
    hf = peers.to_transformers(target, str(tmp_path / "hf"))
    with torch.no_grad():
        hf.lm_head.weight.add_(0.05)  # a conversion bug
    inputs = [mini.source_batches(1, 1, 48)[0]]
    tokens = np.full((1, 8), 5, np.int32)
    greedy = [decoding.DecodeResult(tokens=tokens, lengths=np.array([8]), stats=None)]
    with pytest.raises(peers.ParityError, match=r"Logits of the target differ .* > parity_atol"):
        peers.check_parity({"target": (target, hf)}, inputs, greedy, atol=1e-3)


def test_a_draft_with_a_shallower_encoder_is_refused(tmp_path, small):
    """transformers builds an assistant's cache itself, by the encoder's depth (IndexError)."""
    target = small["pairs"][0][0]
    deep = _given("deep_draft", TARGET, tmp_path, 2)
    pair = [loading.load_model(g.config, g.checkpoint) for g in (target, deep)]
    with pytest.raises(ValueError, match="1 encoder and 2 decoder layers"):
        peers.compare(*pair, [], gamma=2, temperatures=[0.0], max_decode_len=8, repeats=1,
                      parity_atol=1e-3, seed=0)


@pytest.mark.slow
def test_script_on_the_bundled_mini_pair_greedy_and_sampled(tmp_path):
    """The script end to end (about a minute): real models, both temperatures."""
    repo = REPO
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=repo)

    def script(*args):
        return subprocess.run([sys.executable, os.path.join(repo, "scripts", "compare_peers.py"),
                               *args], capture_output=True, text=True, cwd=repo, env=env,
                              timeout=600)

    bad = script("--pairs=mini_target")
    assert bad.returncode != 0 and "not target:draft" in bad.stderr
    out = tmp_path / "out"
    result = script("--pairs=mini_target:mini_draft_10", "--num_sentences=2", "--repeats=1",
                    f"--output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    (pair,) = json.loads((out / peers.RESULTS_FILE).read_text())["pairs"]
    assert pair["parity"]["target"] < 1e-3 and pair["greedy"]["identical"] == 2
    assert {m["temperature"] for m in pair["methods"]} == {0.0, 1.0}
    assert "| 1 | speculative |" in (out / peers.TABLE_FILE).read_text()
