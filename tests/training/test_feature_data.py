"""speculative/training/feature_data.py: the feature cache is the target's own greedy decode
with its features, in shards that resume; the hot vocabulary is the most frequent outputs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decode import contract
from speculative.decode.sampling import SamplingConfig
from speculative.models import t5
from speculative.training import feature_data, feature_training
from tests.helpers import random_params, tiny_config


@pytest.fixture(scope="module")
def tiny_target():
    """A random target that ends its outputs: its EOS logit is a scaled copy of the logit of
    the token its greedy outputs emit most, so EOS wins wherever that token would."""
    module = t5.Transformer(tiny_config(vocab_size=16))
    params = random_params(module, 0)
    ar = decoding.autoregressive_decode(
        decoding.EncoderDecoderModel(module, params), _sources(), rng=jax.random.PRNGKey(0),
        sampling=SamplingConfig(0.0), max_decode_len=30)
    common = int(np.argmax(np.bincount(np.asarray(ar.tokens).ravel(), minlength=16)[2:])) + 2
    kernel = params["decoder"]["logits_dense"]["kernel"]
    params["decoder"]["logits_dense"] = {
        "kernel": kernel.at[:, contract.EOS_ID].set(kernel[:, common] * 1.5)}
    return module, params


def _sources(n=12, width=6, seed=0):
    rng = np.random.default_rng(seed)
    out = np.zeros((n, width), np.int32)
    for b in range(n):
        k = int(rng.integers(1, width + 1))
        out[b, :k] = rng.integers(2, 16, k)
    return out


def _build(path, module, params, **kw):
    kw = {**dict(target_name="tiny", feature_layers=(1, 2), top_k=4, max_len=30,
                 shard_size=5), **kw}
    return feature_data.build(str(path), module, params, _sources(), **kw)


@pytest.mark.slow  # ~15 s
def test_cache_is_the_targets_greedy_decode_with_its_features(tmp_path, tiny_target):
    module, params = tiny_target
    _build(tmp_path, module, params)
    corpus = feature_training.Corpus.load(str(tmp_path))
    assert len(corpus) >= 8  # of 12 (the others reached max_len without EOS)
    # Sentences that end within max_len: each output is the greedy decode of its source.
    model = decoding.EncoderDecoderModel(module, params)
    for i in range(len(corpus)):
        src = corpus.src[i:i + 1].astype(np.int32)
        ar = decoding.autoregressive_decode(model, src, rng=jax.random.PRNGKey(0),
                                            sampling=SamplingConfig(0.0), max_decode_len=30)
        m = int(corpus.out_len[i])
        np.testing.assert_array_equal(corpus.out[i, :m], np.asarray(ar.tokens[0, :m]))
        # Feature row j = the state after reading decoder input j (teacher forcing).
        batch = corpus.batch([i], 32, 1)
        state = model.init(params, jnp.asarray(src), 34, keep_encoded=True)
        _, feats, _ = model.extend_with_features(params, state, jnp.asarray(batch["tokens"]),
                                                 (1, 2))
        np.testing.assert_allclose(batch["features"][0, :m], np.asarray(feats[0, :m]),
                                   rtol=2e-2, atol=2e-2)  # stored as bfloat16
        np.testing.assert_allclose(batch["encoded"][0, :int(corpus.src_len[i])],
                                   np.asarray(state.encoded[0, :int(corpus.src_len[i])]),
                                   rtol=2e-2, atol=2e-2)
        assert batch["weights"][0].sum() == m


@pytest.mark.slow  # ~20 s with its fixture
def test_shards_resume_and_other_settings_are_refused(tmp_path, tiny_target):
    module, params = tiny_target
    paths = _build(tmp_path, module, params)
    assert len(paths) == 3  # 12 sources in shards of 5
    with np.load(paths[1]) as data:
        before = {k: data[k] for k in data.files}
    os.remove(paths[1])
    _build(tmp_path, module, params)  # writes only the missing shard, identically
    with np.load(paths[1]) as data:
        for k, v in before.items():
            np.testing.assert_array_equal(data[k], v)
    with pytest.raises(ValueError, match="other settings"):
        _build(tmp_path, module, params, temperature=1.0)
    assert json.load(open(tmp_path / "manifest.json"))["temperature"] == 0.0


# ----------------------------------------------------------------------------------------------
# From tests/training/test_feature_data_hot_tmp.py.
def _fake_cache(path, outputs):
    """A cache directory holding only what the hot vocabulary reads: outputs and lengths."""
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"format": feature_data.FORMAT}))
    width = max(len(o) for o in outputs)
    out = np.zeros((len(outputs), width), np.int16)
    for i, o in enumerate(outputs):
        out[i, :len(o)] = o
    np.savez(path / "shard_00000.npz", out=out,
             out_len=np.asarray([len(o) for o in outputs], np.int32))
    return str(path)


def test_hot_vocabulary_is_the_most_frequent_outputs_ascending(tmp_path):
    # Counts: 5 x4, 3 x3, 7 x2, 2 x2, 1 (EOS) x3; the padding after each length is not counted.
    cache = _fake_cache(tmp_path / "cache", [[5, 5, 3, 7, 1], [5, 3, 2, 1], [5, 3, 7, 2, 1]])
    def ids(size):
        return feature_data.hot_vocabulary(cache, size, 10)[0]

    assert ids(1) == (5,)
    assert ids(2) == (1, 5)  # 1 and 3 tie: the lower id
    assert ids(3) == (1, 3, 5)
    assert ids(4) == (1, 2, 3, 5)  # 2 and 7 tie
    assert feature_data.hot_vocabulary(cache, 3, 10)[1] == pytest.approx(10 / 14)
    assert feature_data.hot_vocabulary(cache, 10, 10) == (tuple(range(10)), 1.0)
    for bad in (0, 11, True):
        with pytest.raises(ValueError, match="size="):
            feature_data.hot_vocabulary(cache, bad, 10)
