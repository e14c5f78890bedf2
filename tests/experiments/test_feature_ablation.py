"""speculative/experiments/feature_ablation.py: an ablation row with a hot vocabulary of a
trained draft."""

import dataclasses
import json

import flax
import jax
import numpy as np
import pytest

from speculative.experiments import feature_ablation
from speculative.models import feature_draft as fd
from speculative.training import feature_training
from tests.helpers.features import fake_cache


def test_ablation_row_with_a_hot_vocabulary_of_a_trained_draft(tmp_path):
    cache = fake_cache(tmp_path / "cache", [[4, 4, 9, 1], [4, 9, 2, 1]])
    config = fd.FeatureDraftConfig(vocab_size=12, target_emb_dim=6, feature_layers=(1,),
                                   emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16)
    params = fd.init_params(fd.FeatureDraft(config), jax.random.PRNGKey(0))
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text(json.dumps({
        "draft": dataclasses.asdict(config), "cache_dir": cache,
        "train": dataclasses.asdict(feature_training.FeatureTrainConfig(steps=3))}))
    (run / "params.msgpack").write_bytes(flax.serialization.to_bytes(params))
    label, full = feature_ablation.load_draft(f"ttt={run}")
    assert label == "ttt" and full.module.config.hot_ids == ()
    label, hot = feature_ablation.load_draft(f"ttt_hot={run}@3")
    assert label == "ttt_hot" and hot.module.config.hot_ids == (1, 4, 9)
    reads = feature_ablation._description(hot)["reads"]
    assert "hot vocabulary of 3 (87.5% of the cache's tokens)" in reads
    np.testing.assert_array_equal(hot.params["hot_output"]["embedding"],
                                  np.asarray(params["token_embedder"]["embedding"])[[1, 4, 9]])
    for bad in ("@x", "@0"):
        with pytest.raises(ValueError, match="hot vocabulary's size"):
            feature_ablation.load_draft(f"ttt={run}{bad}")
