"""speculative/training/feature_data.py: the feature cache is the target's own greedy decode
with its features, in shards that resume; the hot vocabulary is the most frequent outputs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decode.kernel import SamplingConfig
from speculative.training import feature_data, feature_training
from tests.helpers.features import build_cache, fake_cache


@pytest.mark.slow  # ~15 s
def test_cache_is_the_targets_greedy_decode_with_its_features(tmp_path, tiny_target):
    module, params = tiny_target
    build_cache(tmp_path, module, params)
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
    paths = build_cache(tmp_path, module, params)
    assert len(paths) == 3  # 12 sources in shards of 5
    with np.load(paths[1]) as data:
        before = {k: data[k] for k in data.files}
    os.remove(paths[1])
    build_cache(tmp_path, module, params)  # writes only the missing shard, identically
    with np.load(paths[1]) as data:
        for k, v in before.items():
            np.testing.assert_array_equal(data[k], v)
    with pytest.raises(ValueError, match="other settings"):
        build_cache(tmp_path, module, params, temperature=1.0)
    assert json.load(open(tmp_path / "manifest.json"))["temperature"] == 0.0


# ----------------------------------------------------------------------------------------------
# From tests/training/test_feature_data_hot_tmp.py.


def test_hot_vocabulary_is_the_most_frequent_outputs_ascending(tmp_path):
    # Counts: 5 x4, 3 x3, 7 x2, 2 x2, 1 (EOS) x3; the padding after each length is not counted.
    cache = fake_cache(tmp_path / "cache", [[5, 5, 3, 7, 1], [5, 3, 2, 1], [5, 3, 7, 2, 1]])
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
