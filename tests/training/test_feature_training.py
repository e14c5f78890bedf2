"""The target-aware draft's data and trainer: the feature cache is the target's own decode,
shards resume, settings are never mixed, and training learns and resumes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decode.kernel import SamplingConfig
from speculative.models import feature_draft as fd
from speculative.models import t5
from speculative.training import feature_data, feature_training
from tests.helpers import random_params, tiny_config
from tests.helpers.features import build_cache, sources


@pytest.mark.slow  # ~25 s
def test_training_lowers_the_loss_and_resumes_where_it_stopped(tmp_path, tiny_target):
    module, params = tiny_target
    build_cache(tmp_path / "cache", module, params)
    draft = fd.FeatureDraftConfig(vocab_size=16, target_emb_dim=16, feature_layers=(2,),
                                  emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                  relative_attention_num_buckets=8,
                                  relative_attention_max_distance=16)
    config = feature_training.FeatureTrainConfig(steps=40, batch_tokens=48, buckets=(32,),
                                                 depth=2, checkpoint_every=20, warmup_steps=5,
                                                 learning_rate=0.02)
    kw = dict(draft_config=draft, cache_dir=str(tmp_path / "cache"), valid_fraction=0.2)
    full = feature_training.train(config=config, model_dir=str(tmp_path / "a"), **kw)
    lines = [json.loads(x) for x in open(tmp_path / "a" / "metrics.jsonl")]
    assert lines[-1]["train"]["kl"] < lines[0]["train"]["kl"]
    # Stop after 30 steps (a piece ends with a saved state), then resume
    # to 40: the same parameters as the run that never stopped.
    part = feature_training.train(config=config, model_dir=str(tmp_path / "b"), stop_at=30,
                                  **kw)
    assert part["step"] == 30 and not part["done"]
    assert not (tmp_path / "b" / "params.msgpack").exists()
    resumed = feature_training.train(config=config, model_dir=str(tmp_path / "b"), **kw)
    assert resumed["step"] == full["step"] == 40
    a = feature_training.load_params(str(tmp_path / "a"), draft)
    b = feature_training.load_params(str(tmp_path / "b"), draft)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="other settings"):
        feature_training.train(config=feature_training.FeatureTrainConfig(**dict(
            config.__dict__, depth=1)), model_dir=str(tmp_path / "a"), **kw)
    with pytest.raises(ValueError, match="layers"):
        feature_training.train(config=config, model_dir=str(tmp_path / "c"), **dict(
            kw, draft_config=fd.FeatureDraftConfig(**dict(draft.__dict__, feature_layers=(3,)))))


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="depth"):
        feature_training.FeatureTrainConfig(depth=0)
    for objective in ("js", "kl+kl", "kl+", ""):
        with pytest.raises(ValueError, match="objective"):
            feature_training.FeatureTrainConfig(objective=objective)


def test_objectives_are_the_sum_of_their_terms_and_ce_reads_the_target_argmax():
    """'ce' is -log q of the teacher's top-1 id (the token a greedy decode accepts); an
    objective joined by '+' is the sum of its terms; with a hot vocabulary, a position whose
    argmax lies outside the hot set adds no ce (q cannot give that token)."""
    q = np.asarray([0.1, 0.6, 0.2, 0.1])
    logits = jnp.log(jnp.asarray(q, jnp.float32))[None, None, None]  # [D=1, B=1, L=1, V=4]
    top_ids = jnp.asarray([[[2, 1, 0]]], jnp.int32)  # the target prefers 2, then 1
    top_probs = jnp.asarray([[[0.5, 0.4, 0.1]]], jnp.float32)
    weights = jnp.ones((1, 1), jnp.float32)
    parts = {}
    for objective in ("kl", "tv", "ce"):
        parts[objective], m = feature_training.losses(logits, top_ids, top_probs, weights,
                                                      objective)
    assert float(parts["ce"]) == pytest.approx(-np.log(0.2), rel=1e-5)
    assert float(m["top1"]) == 0.0  # the draft's argmax (1) misses the target's (2)
    total, _ = feature_training.losses(logits, top_ids, top_probs, weights, "kl+tv+ce")
    assert float(total) == pytest.approx(sum(float(v) for v in parts.values()), rel=1e-5)
    hot_logits = logits.at[..., 2].set(fd.HOT_MASK_LOGIT)  # id 2 is not hot: q(2) = 0
    _, m = feature_training.losses(hot_logits, top_ids, top_probs, weights, "ce", (0, 1, 3))
    assert float(m["ce"]) == 0.0


@pytest.mark.slow  # ~20 s with its fixture
def test_extra_caches_join_the_training_rows_only(tmp_path, tiny_target):
    module, params = tiny_target
    build_cache(tmp_path / "greedy", module, params)
    build_cache(tmp_path / "sampled", module, params, temperature=1.0)
    main = feature_training.Corpus.load(str(tmp_path / "greedy"))
    sampled = feature_training.Corpus.load(str(tmp_path / "sampled"))
    both = feature_training.Corpus.load(str(tmp_path / "greedy"),
                                        extra_caches=[str(tmp_path / "sampled")])
    assert both.num_extra == len(sampled) and len(both) == len(sampled) + len(main)
    n = len(sampled)  # the main cache's sentences come last, arrays and offsets intact
    for i in (0, len(main) - 1):
        a, b = main.batch([i], 32, 1), both.batch([n + i], 32, 1)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(both.batch([0], 32, 1)["tokens"],
                                  sampled.batch([0], 32, 1)["tokens"])
    # The held-out rows are the main cache's last 20% whatever the extra cache adds, and the
    # extra cache's translations of their sources (the same sources, sampled) are not trained on.
    train_rows, valid_rows = both.split(0.2)
    np.testing.assert_array_equal(valid_rows - n, main.split(0.2)[1])
    held = {both.src[i].tobytes() for i in valid_rows}
    extra_held = [i for i in range(n) if both.src[i].tobytes() in held]
    assert len(extra_held) == valid_rows.size  # the sampled cache has every source once
    np.testing.assert_array_equal(
        train_rows, [i for i in range(n + main.split(0.2)[0].size) if i not in extra_held])
    draft = fd.FeatureDraftConfig(vocab_size=16, target_emb_dim=16, feature_layers=(2,),
                                  emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                  relative_attention_num_buckets=8,
                                  relative_attention_max_distance=16)
    kw = dict(steps=2, batch_tokens=48, buckets=(32,), depth=1, checkpoint_every=2)
    config = feature_training.FeatureTrainConfig(
        extra_caches=(str(tmp_path / "sampled"),), **kw)
    run = dict(draft_config=draft, cache_dir=str(tmp_path / "greedy"), valid_fraction=0.2)
    assert feature_training.train(config=config, model_dir=str(tmp_path / "a"), **run)["done"]
    settings = json.load(open(tmp_path / "a" / "train_config.json"))
    assert settings["train"]["extra_caches"] == [str(tmp_path / "sampled")]
    build_cache(tmp_path / "other", module, params, feature_layers=(1,))
    with pytest.raises(ValueError, match="extra_caches.*other settings"):
        feature_training.train(config=feature_training.FeatureTrainConfig(
            extra_caches=(str(tmp_path / "other"),), **kw), model_dir=str(tmp_path / "c"),
            **run)
    with pytest.raises(ValueError, match="sequence of cache directories"):
        feature_training.FeatureTrainConfig(extra_caches="dir")


def test_a_decoder_only_target_s_cache_is_its_teacher_forced_read_and_trains_a_draft(tmp_path):
    """A language model's cache holds corpus chunks read once by teacher forcing, in the same
    format (no sources); its held-out rows are plain rows; a draft trained on it (no
    cross-attention) learns, and decodes for the target exactly."""
    module = t5.DecoderOnly(tiny_config(vocab_size=16))
    params = random_params(module, 1)
    rng = np.random.default_rng(0)
    chunks = rng.integers(2, 16, (10, 12)).astype(np.int32)
    chunks[3, 7:] = 0  # a document's last, shorter chunk
    feature_data.build(str(tmp_path / "cache"), module, params, chunks, target_name="tiny_lm",
                       feature_layers=(1, 2), top_k=4, shard_size=4)
    assert feature_data.read_manifest(str(tmp_path / "cache"))["teacher_forced"]
    with pytest.raises(ValueError, match="nothing to sample"):
        feature_data.build(str(tmp_path / "other"), module, params, chunks, target_name="tiny_lm",
                           feature_layers=(1, 2), temperature=1.0)
    corpus = feature_training.Corpus.load(str(tmp_path / "cache"))
    assert len(corpus) == 10 and corpus.out_len[3] == 7 and not corpus.src_len.any()
    target = decoding.DecoderOnlyModel(module, params)
    batch = corpus.batch([3], 16, 1)  # row j: the state after [BOS] + chunk[:j]
    state = target.init(params, jnp.zeros((1, 0), jnp.int32), 17)
    logits, feats, _ = target.extend_with_features(params, state, jnp.asarray(batch["tokens"]),
                                                   (1, 2))
    np.testing.assert_array_equal(batch["tokens"][0, 1:7], chunks[3, :6])
    np.testing.assert_allclose(batch["features"][0, :7], np.asarray(feats[0, :7]), rtol=2e-2,
                               atol=2e-2)  # stored as bfloat16
    np.testing.assert_array_equal(batch["top_ids"][0, :7, 0], np.argmax(logits[0, :7], -1))
    train_rows, valid_rows = corpus.split(0.2)
    np.testing.assert_array_equal(train_rows, np.arange(8))
    np.testing.assert_array_equal(valid_rows, [8, 9])

    draft = fd.FeatureDraftConfig(vocab_size=16, target_emb_dim=16, feature_layers=(2,),
                                  cross_attention=False, emb_dim=8, num_heads=2, head_dim=4,
                                  mlp_dim=16, relative_attention_num_buckets=8,
                                  relative_attention_max_distance=16)
    config = feature_training.FeatureTrainConfig(steps=30, batch_tokens=48, buckets=(16,),
                                                 depth=2, checkpoint_every=10, warmup_steps=5)
    feature_training.train(draft_config=draft, config=config, cache_dir=str(tmp_path / "cache"),
                           model_dir=str(tmp_path / "draft"), valid_fraction=0.2)
    lines = [json.loads(x) for x in open(tmp_path / "draft" / "metrics.jsonl")]
    assert lines[-1]["train"]["kl"] < lines[0]["train"]["kl"]
    trained = fd.FeatureDraftModel(fd.FeatureDraft(draft), feature_training.load_params(
        str(tmp_path / "draft"), draft))
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=10)
    prompts = jnp.asarray(chunks[:3, :5])
    np.testing.assert_array_equal(
        decoding.speculative_decode(target, trained, prompts, gamma=3, **kw).tokens,
        decoding.autoregressive_decode(target, prompts, **kw).tokens)


def _head_draft(**kw):
    return fd.FeatureDraftConfig(**{**dict(
        vocab_size=16, target_emb_dim=16, feature_layers=(1, 2), emb_dim=8, num_heads=2,
        head_dim=4, mlp_dim=16, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, target_head=True), **kw})


@pytest.mark.parametrize("tied", [True, False])
def test_target_head_gives_the_targets_logits_of_its_state_guess(tied):
    """A `target_head` draft's logits are the target's own final norm and output layer applied
    to its guess of the target's top-layer state, for a tied (T5 1.0) and an untied (1.1)
    target; restricted to a hot vocabulary they are unchanged on it and masked elsewhere."""
    target_module = t5.Transformer(tiny_config(logits_via_embedding=tied))
    target_params = random_params(target_module, 3)
    config = _head_draft()
    module = fd.FeatureDraft(config)
    params = fd.with_target_head(config, fd.init_params(module, jax.random.PRNGKey(0)),
                                 target_params, target_module.config)
    hidden = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 8))
    logits = module.apply({"params": params}, hidden, method="logits")
    state = module.apply({"params": params}, hidden, method="head_state")
    expected = target_module.apply({"params": target_params}, state,
                                   method=lambda m, y: m.decoder.logits(y))
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert float(jnp.std(logits)) > 0.1  # not a degenerate copy

    hot = (0, 1, 4, 9, 15)
    hot_config, hot_params = fd.with_hot_vocab(config, params, hot)
    hot_logits = fd.FeatureDraft(hot_config).apply({"params": hot_params}, hidden,
                                                    method="logits")
    # A 5-row table against a 16-row one: the same sums in another order (float32 round-off).
    np.testing.assert_allclose(hot_logits[..., list(hot)], logits[..., list(hot)], rtol=1e-5,
                               atol=1e-6)
    others = np.setdiff1d(np.arange(16), hot)
    assert np.all(np.asarray(hot_logits[..., others]) == fd.HOT_MASK_LOGIT)
    # Copied with the hot rows straight from the target: the same parameters.
    direct = fd.with_target_head(hot_config, fd.init_params(fd.FeatureDraft(hot_config),
                                                            jax.random.PRNGKey(0)),
                                 target_params, target_module.config)
    np.testing.assert_array_equal(direct["head"]["embedding"], hot_params["head"]["embedding"])
    with pytest.raises(ValueError, match="target_head=False"):
        fd.with_target_head(_head_draft(target_head=False), params, target_params,
                            target_module.config)
    with pytest.raises(ValueError, match="width 16"):
        fd.with_target_head(_head_draft(target_emb_dim=32), params, target_params,
                            target_module.config)


@pytest.mark.slow  # ~25 s
def test_target_head_training_keeps_the_head_and_learns_the_state(tmp_path, tiny_target):
    """Training a `target_head` draft with the state regression: the copied head never moves,
    the KL and the state distance fall, and the trained draft decodes exactly."""
    module, params = tiny_target
    build_cache(tmp_path / "cache", module, params)
    target = decoding.EncoderDecoderModel(module, params)
    config = feature_training.FeatureTrainConfig(steps=40, batch_tokens=48, buckets=(32,),
                                                 depth=2, checkpoint_every=20, warmup_steps=5,
                                                 state_loss_weight=1.0)
    kw = dict(config=config, cache_dir=str(tmp_path / "cache"), valid_fraction=0.2)
    with pytest.raises(ValueError, match="pass target="):
        feature_training.train(draft_config=_head_draft(), model_dir=str(tmp_path / "x"), **kw)
    with pytest.raises(ValueError, match="top layer"):
        feature_training.train(draft_config=_head_draft(feature_layers=(1,)), target=target,
                               model_dir=str(tmp_path / "y"), **kw)
    with pytest.raises(ValueError, match="set target_head=True"):
        feature_training.train(draft_config=_head_draft(target_head=False),
                               model_dir=str(tmp_path / "z"), **kw)
    draft = _head_draft()
    feature_training.train(draft_config=draft, target=target, model_dir=str(tmp_path / "a"),
                           **kw)
    lines = [json.loads(x) for x in open(tmp_path / "a" / "metrics.jsonl")]
    for key in ("kl", "state"):
        assert lines[-1]["train"][key] < lines[0]["train"][key], key
    trained = feature_training.load_params(str(tmp_path / "a"), draft)
    copied = fd.with_target_head(draft, trained, params, module.config)
    for name in fd.FROZEN:
        jax.tree_util.tree_map(np.testing.assert_array_equal, trained[name], copied[name])
    model = fd.FeatureDraftModel(fd.FeatureDraft(draft), trained)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=12)
    np.testing.assert_array_equal(
        decoding.speculative_decode(target, model, sources()[:4], gamma=3, **kw).tokens,
        decoding.autoregressive_decode(target, sources()[:4], **kw).tokens)


# ----------------------------------------------------------------------------------------------
# From tests/models/test_feature_draft.py.
def test_hot_vocab_loss_uses_the_teacher_restricted_to_the_hot_set():
    from speculative.training import feature_training  # pylint: disable=g-import-not-at-top

    hot = (1, 2, 3)
    logits = jnp.full((1, 1, 1, 6), fd.HOT_MASK_LOGIT).at[..., 1:4].set(
        jnp.log(jnp.asarray([0.5, 0.25, 0.25])))
    top_ids = jnp.asarray([[[1, 4, 2, 3]]], jnp.int32)  # id 4 lies outside the hot set
    top_probs = jnp.asarray([[[0.4, 0.2, 0.2, 0.2]]], jnp.float32)
    weights = jnp.ones((1, 1), jnp.float32)
    total, m = feature_training.losses(logits, top_ids, top_probs, weights, "kl+tv", hot)
    p = np.asarray([0.5, 0.25, 0.25])  # the teacher renormalised on the hot set: = q here
    assert np.isfinite(float(total)) and float(m["kl"]) == pytest.approx(0.0, abs=1e-6)
    assert float(m["tv"]) == pytest.approx(1.0 - np.minimum(p, p).sum(), abs=1e-6)
    full, _ = feature_training.losses(logits, top_ids, top_probs, weights, "kl")
    assert float(full) > 1e20  # without the restriction: q = 0 where p > 0, KL blows up
