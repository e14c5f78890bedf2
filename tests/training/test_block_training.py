"""speculative/training/block_training.py: the block draft's training lowers the loss and
resumes to the same state; its config refuses bad values."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest

from speculative.models import block_draft as bd
from speculative.models import feature_draft as fd
from speculative.training import block_training, feature_data


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A feature cache in `feature_data`'s format with a learnable text: each output token is
    a function of the one before and of the source's first token (features and encoder output
    random), the teacher's top-4 puts 0.7 on it."""
    rng = np.random.default_rng(0)
    n, width, k, emb = 24, 12, 4, 16
    src = np.zeros((n, 6), np.int16)
    out = np.zeros((n, width), np.int16)
    out_len = rng.integers(6, width, n).astype(np.int32)
    top_ids, top_probs = [], []
    for i in range(n):
        m = int(rng.integers(3, 7))
        src[i, :m] = rng.integers(2, 16, m)
        prev = 0
        for j in range(out_len[i]):
            token = 1 if j == out_len[i] - 1 else (prev * 3 + int(src[i, 0])) % 14 + 2
            others = [t for t in range(16) if t != token][:k - 1]
            top_ids.append([token] + others)
            top_probs.append([0.7] + [0.1] * (k - 1))
            out[i, j] = prev = token
    src_len = np.sum(src > 0, 1)
    bits = lambda x: x.astype(ml_dtypes.bfloat16).view(np.uint16)  # noqa: E731
    path = tmp_path_factory.mktemp("cache")
    (path / "manifest.json").write_text(json.dumps(dict(
        format=feature_data.FORMAT, target="synthetic", feature_layers=[1, 2], emb_dim=emb,
        top_k=k, max_len=width, temperature=0.0, shard_size=12)))
    starts = np.concatenate([[0], np.cumsum(out_len)])
    enc_starts = np.concatenate([[0], np.cumsum(src_len)])
    for shard in range(2):
        rows = slice(12 * shard, 12 * shard + 12)
        lo, hi = starts[12 * shard], starts[12 * shard + 12]
        elo, ehi = enc_starts[12 * shard], enc_starts[12 * shard + 12]
        np.savez(path / f"shard_{shard:05d}.npz", src=src[rows], out=out[rows],
                 out_len=out_len[rows], enc=bits(rng.normal(size=(ehi - elo, emb))),
                 feat=bits(rng.normal(size=(hi - lo, 2 * emb))),
                 top_ids=np.asarray(top_ids[lo:hi], np.int16),
                 top_probs=np.asarray(top_probs[lo:hi], np.float16), dropped=np.asarray(0))
    return str(path)


def test_training_lowers_the_loss_and_resumes_to_the_same_state(tmp_path, tiny_cache):
    cfg = fd.FeatureDraftConfig(vocab_size=16, target_emb_dim=16, feature_layers=(2,),
                                emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16)
    module = bd.BlockDraft(cfg, max_gamma=3)
    config = block_training.BlockTrainConfig(steps=30, gamma=3, batch_tokens=48, buckets=(12,),
                                             checkpoint_every=10, warmup_steps=3,
                                             learning_rate=0.02, valid_sentences=4)
    kw = dict(module=module, config=config, cache_dir=tiny_cache, log=lambda s: None,
              init_params=lambda: bd.init_params(module, jax.random.PRNGKey(0)))
    full = block_training.train(model_dir=str(tmp_path / "a"), **kw)
    start = bd.init_params(module, jax.random.PRNGKey(0))
    trained = block_training.load_params(str(tmp_path / "a"), module)
    for name in trained:  # only the placeholder stream trains (freeze_feature_draft)
        same = all(np.array_equal(x, y) for x, y in zip(
            jax.tree_util.tree_leaves(start[name]), jax.tree_util.tree_leaves(trained[name])))
        assert same != bd.is_block_param(name), name
    rows = [json.loads(x) for x in open(tmp_path / "a" / "metrics.jsonl")]
    assert rows[-1]["train"]["kl"] < rows[0]["train"]["kl"]
    assert {"top1_d3", "accept_d3"} <= set(rows[-1]["valid"])
    part = block_training.train(model_dir=str(tmp_path / "b"), stop_at=20, **kw)
    assert part["step"] == 20 and not part["done"]
    assert not (tmp_path / "b" / "params.msgpack").exists()
    resumed = block_training.train(model_dir=str(tmp_path / "b"), **kw)
    assert resumed["done"] and full["done"]
    a = block_training.load_params(str(tmp_path / "a"), module)
    b = block_training.load_params(str(tmp_path / "b"), module)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="other settings"):
        block_training.train(model_dir=str(tmp_path / "a"), **dict(
            kw, config=block_training.BlockTrainConfig(**dict(config.__dict__, gamma=2))))


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="gamma"):
        block_training.BlockTrainConfig(gamma=0)
    with pytest.raises(ValueError, match="objective"):
        block_training.BlockTrainConfig(objective="kl+js")
    with pytest.raises(ValueError, match="extra_caches"):
        block_training.BlockTrainConfig(extra_caches="dir")
