"""Tests of speculative/training/ (the trainer, its data, objectives and runs) and of the bundled
models it trained.

Known answers: batches pad/truncate/drop as documented and hold every example once; label
smoothing and z-loss match their closed forms; a few AdamW steps lower the loss on a tiny batch;
a checkpoint written by `train` loads back with `checkpoints.load_params` and gives the logits of
the trainer's own parameters; every bundled model scores the valid-subset loss recorded in
model_card.json.
"""

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.checkpoints import t5x as checkpoints
from speculative.data import text
from speculative.decode import contract
from speculative.models import ngram, t5
from speculative.training import data as training_data
from speculative.training import distillation as training
from speculative.training import evaluation, objectives, trainer
from speculative.training.config import TrainConfig
from tests.helpers import REPO, load_script, tiny_config

BUNDLE = os.path.join(text.MINI_DIR, "models")
EOS = contract.EOS_ID


def _card():
    path = os.path.join(BUNDLE, "model_card.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["models"]


def test_training_needs_neither_seqio_nor_tensorflow():
    # Training (BLEU included) runs on accelerator images that have JAX but not TensorFlow.
    code = ("import sys; sys.modules['seqio'] = sys.modules['tensorflow'] = None\n"
            "from speculative.training import distillation\n"
            "from speculative.measure import metrics\n"
            "s = 'das ist ein kleines Haus am See'\n"
            "print(metrics.bleu([s], [s])['bleu'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == pytest.approx(100.0)


# ------------------------------------------------------------------------------------ batching

def test_make_examples_drops_or_truncates_keeping_eos():
    inputs = [[5, 6, EOS], [5, 6, 7, 8, 9, EOS], [4, EOS]]
    targets = [[3, EOS], [3, EOS], [3, 4, 5, 6, 7, 8, EOS]]
    kept, dropped = training_data.make_examples(inputs, targets, max_length=4)
    assert dropped == 2 and len(kept) == 1
    np.testing.assert_array_equal(kept[0][0], [5, 6, EOS])
    cut, dropped = training_data.make_examples(inputs, targets, max_length=4, truncate=True)
    assert dropped == 0
    np.testing.assert_array_equal(cut[1][0], [5, 6, 7, EOS])  # seqio append_eos_after_trim
    np.testing.assert_array_equal(cut[2][1], [3, 4, 5, EOS])


def test_batches_bucket_pad_and_cover_every_example():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=(37, 2))
    examples = [(np.arange(2, 2 + a, dtype=np.int32), np.arange(10, 10 + b, dtype=np.int32))
                for a, b in lengths]
    buckets, batch_tokens = (4, 8), 16
    seen = []
    for inputs, targets in training_data.batches(examples, buckets, batch_tokens,
                                            rng=np.random.default_rng(1)):
        length = inputs.shape[1]
        assert length in buckets and inputs.shape == targets.shape == (batch_tokens // length,
                                                                        length)
        assert inputs.dtype == np.int32
        for x, y in zip(inputs, targets):
            if not x.any():  # a filler row: all padding on both sides
                assert not y.any()
                continue
            n, m = int((x > 0).sum()), int((y > 0).sum())
            assert not x[n:].any() and not y[m:].any()  # right padding only
            assert max(n, m) <= length and (length == 4 or max(n, m) > 4)  # smallest bucket
            seen.append((tuple(x[:n]), tuple(y[:m])))
    assert sorted(seen) == sorted((tuple(x), tuple(y)) for x, y in examples)


def test_tokenizer_matches_the_mini_ende_task():
    from speculative.data import tasks

    tok = text.Tokenizer()
    vocab = tasks.mini_vocabulary()
    assert text.PREFIX == tasks.EN_DE_PREFIX and tok.vocab_size == vocab.vocab_size
    src, tgt = "Select _All", "A_lles markieren"
    assert tok.encode_inputs([src])[0] == list(vocab.encode(tasks.EN_DE_PREFIX + src)) + [EOS]
    assert tok.encode_targets([tgt])[0] == list(vocab.encode(tgt)) + [EOS]
    assert tok.decode(tok.encode_targets([tgt])[0] + [0, 0]) == tgt


# -------------------------------------------------------------------------------- loss, steps

def test_token_losses_label_smoothing_and_z_loss_closed_forms():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 5)), jnp.float32)
    targets = jnp.asarray([[1, 2, 3], [4, 0, 1]])
    loss, ce = objectives.token_losses(logits, targets)
    log_p = jax.nn.log_softmax(logits)
    np.testing.assert_allclose(ce, -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0],
                               rtol=1e-6)
    np.testing.assert_allclose(loss, ce)
    smooth, _ = objectives.token_losses(logits, targets, label_smoothing=0.1)
    soft = jax.nn.one_hot(targets, 5) * 0.9 + (1 - jax.nn.one_hot(targets, 5)) * 0.1 / 4
    entropy = -(0.9 * np.log(0.9) + 4 * (0.1 / 4) * np.log(0.1 / 4))
    np.testing.assert_allclose(smooth, -jnp.sum(soft * log_p, -1) - entropy, rtol=1e-5, atol=1e-6)
    zl, _ = objectives.token_losses(logits, targets, z_loss=1e-2)
    np.testing.assert_allclose(zl - ce, 1e-2 * jax.nn.logsumexp(logits, -1) ** 2, rtol=1e-5)


def test_a_few_steps_lower_the_loss_on_a_tiny_batch():
    module = t5.Transformer(tiny_config(vocab_size=32))
    config = TrainConfig(steps=30, batch_tokens=32, buckets=(8,), learning_rate=1e-2,
                                  warmup_steps=5)
    rng = np.random.default_rng(0)
    examples = [(np.append(rng.integers(2, 32, 6), EOS).astype(np.int32),
                 np.append(rng.integers(2, 32, 5), EOS).astype(np.int32)) for _ in range(4)]
    inputs, targets = next(training_data.batches(examples, config.buckets, config.batch_tokens))
    optimizer = trainer.make_optimizer(config)
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(0))
    step, eval_step = trainer.make_train_step(module, optimizer, config), \
        trainer.make_eval_step(module)
    before = trainer.evaluate_loss(eval_step, state.params, examples, config)
    for _ in range(config.steps):
        state, metrics = step(state, inputs, targets, jax.random.PRNGKey(1))
    after = trainer.evaluate_loss(eval_step, state.params, examples, config)
    assert int(state.step) == config.steps and float(metrics["tokens"]) == 24
    assert after < 0.5 * before, (before, after)


def test_schedule_warmup_then_cosine_to_final_fraction():
    config = TrainConfig(steps=100, warmup_steps=10, learning_rate=1.0,
                                  final_lr_fraction=0.1)
    lr = trainer.learning_rate_schedule(config)
    np.testing.assert_allclose([lr(0), lr(4), lr(9), lr(99)], [0.1, 0.5, 1.0, 0.1], rtol=1e-5)
    rsqrt = trainer.learning_rate_schedule(config.__class__(steps=100, warmup_steps=10,
                                                             learning_rate=1.0, decay="rsqrt"))
    np.testing.assert_allclose(rsqrt(39), 0.5, rtol=1e-5)


# ------------------------------------------------------------------------- the trainer's files

def _small_corpus(tmp_path):
    """48 train and 8 valid pairs (from the bundled valid split) with the bundled vocabulary."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(text.MINI_DIR, "spm.model"), data / "spm.model")
    pairs = text.load_pairs(os.path.join(text.MINI_DIR, "valid.tsv"))
    for split, rows in (("train", pairs[:48]), ("valid", pairs[48:56])):
        (data / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in rows), "utf-8")
    return data, pairs


@pytest.mark.slow  # ~14 s
def test_trainer_checkpoint_loads_back_with_identical_logits(tmp_path):
    data, pairs = _small_corpus(tmp_path)
    model = tiny_config(vocab_size=4000, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8,
                        num_encoder_layers=1, num_decoder_layers=1)
    config = TrainConfig(steps=3, batch_tokens=384, buckets=(48,))
    model_dir, export = tmp_path / "run", tmp_path / "bundle"
    summary = training.train(training.TrainRun(
        model=model, model_dir=str(model_dir), config=config, seed=0, data_dir=str(data),
        eval_every=3, card_subset=4, export_dir=str(export), gin_config="# resolved config\n"))
    assert (model_dir / "config.gin").read_text() == "# resolved config\n"
    assert sorted(os.listdir(model_dir)) == ["checkpoint_3", "config.gin", "metrics.jsonl",
                                             "summary.json", "train_state.json",
                                             "valid_greedy.txt"]
    assert summary["bleu_sentences"] == 8 and summary["steps"] == 3
    params = checkpoints.load_params(str(model_dir), config=model)
    assert {np.asarray(x).dtype.name for x in jax.tree_util.tree_leaves(params)} == {"float32"}
    # The trainer recorded the subset loss of its in-memory parameters; the reloaded ones
    # (identical logits) reproduce it exactly.
    tok = text.Tokenizer(str(data / "spm.model"))
    first = pairs[48:52]  # the first 4 pairs of this corpus' valid.tsv
    subset, _ = training_data.make_examples(tok.encode_inputs([s for s, _ in first]),
                                       tok.encode_targets([t for _, t in first]), 48, True)
    eval_step = trainer.make_eval_step(t5.Transformer(model))
    loss = trainer.evaluate_loss(eval_step, params, subset, config)
    assert loss == summary["valid_subset"]["loss_float32"]
    card = json.loads((export / "model_card.json").read_text())["models"]["run"]
    assert card["checkpoint"] == "run/checkpoint_3"
    exported = checkpoints.load_params(str(export / "run"))
    assert {np.asarray(x).dtype.name for x in jax.tree_util.tree_leaves(exported)} == {"bfloat16"}
    inputs, targets = next(training_data.batches(subset, (48,), 96))
    logits = t5.Transformer(model).apply({"params": params}, inputs,
                                         objectives.shift_right(targets), targets)
    again = t5.Transformer(model).apply(
        {"params": checkpoints.load_params(str(model_dir / "checkpoint_3"))}, inputs,
        objectives.shift_right(targets), targets)
    np.testing.assert_array_equal(logits, again)


def test_interrupted_run_resumes_to_the_same_parameters(tmp_path, monkeypatch):
    """A run stopped after its step-4 state was saved, then restarted with the same command,
    ends with exactly the parameters and losses of an uninterrupted run; a restart with other
    settings is refused instead of mixing two runs."""
    data, _ = _small_corpus(tmp_path)
    model = tiny_config(vocab_size=4000, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8,
                        num_encoder_layers=1, num_decoder_layers=1)
    kw = dict(model=model, config=TrainConfig(steps=6, batch_tokens=96, buckets=(48,)),
              seed=0, data_dir=str(data), eval_every=3, card_subset=4, checkpoint_every=2)
    whole = training.train(training.TrainRun(model_dir=str(tmp_path / "whole"), **kw))

    save = trainer.ResumableRun.save

    def stop_after_step_4(self, state, step, seconds):
        save(self, state, step, seconds)
        if step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer.ResumableRun, "save", stop_after_step_4)
    with pytest.raises(KeyboardInterrupt):
        training.train(training.TrainRun(model_dir=str(tmp_path / "resumed"), **kw))
    monkeypatch.setattr(trainer.ResumableRun, "save", save)
    assert "train_state.msgpack" in os.listdir(tmp_path / "resumed")
    with pytest.raises(ValueError, match="other settings.*seed"):
        training.train(training.TrainRun(model_dir=str(tmp_path / "resumed"), **{**kw, "seed": 1}))
    resumed = training.train(training.TrainRun(model_dir=str(tmp_path / "resumed"), **kw))
    assert resumed["final_valid_loss"] == whole["final_valid_loss"]
    assert "train_state.msgpack" not in os.listdir(tmp_path / "resumed")  # removed when done
    for a, b in zip(jax.tree_util.tree_leaves(checkpoints.load_params(str(tmp_path / "whole"))),
                    jax.tree_util.tree_leaves(checkpoints.load_params(str(tmp_path / "resumed")))):
        np.testing.assert_array_equal(a, b)
    steps = [json.loads(line)["step"] for line in
             (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 6]

    # The finished run's command again, now exporting: its final checkpoint is reloaded (no
    # step is trained, metrics.jsonl is untouched) and the export holds those parameters.
    monkeypatch.setattr(training, "make_train_step",
                        lambda *a: lambda *b: pytest.fail("a finished run was trained again"))
    exported = training.train(training.TrainRun(model_dir=str(tmp_path / "resumed"), **kw,
                                                export_dir=str(tmp_path / "bundle")))
    assert exported["final_valid_loss"] == whole["final_valid_loss"]
    assert exported["train_wall_s"] == resumed["train_wall_s"]
    assert [json.loads(line)["step"] for line in
            (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()] == [3, 6]
    for a, b in zip(jax.tree_util.tree_leaves(checkpoints.load_params(str(tmp_path / "whole"))),
                    jax.tree_util.tree_leaves(checkpoints.load_params(
                        str(tmp_path / "bundle" / "resumed")))):
        np.testing.assert_array_equal(np.asarray(a, jnp.bfloat16), b)


def test_teacher_losses_are_one_minus_beta_and_cross_entropy():
    """With the teacher's whole vocabulary kept, 'tv' is 1 - beta (the kernel's acceptance
    probability, sampling.acceptance_rate) and 'kl' is the cross-entropy H(p, q), which is
    smallest (= H(p)) at q = p."""
    from speculative.decode import sampling
    rng = np.random.default_rng(0)
    p_logits, q_logits = rng.normal(size=(2, 3, 7)) * 2, rng.normal(size=(2, 3, 7)) * 2
    p = jax.nn.softmax(jnp.asarray(p_logits), axis=-1)
    probs, ids = jax.lax.top_k(p, 7)
    tv = objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "tv")
    beta = sampling.acceptance_rate(p, jax.nn.softmax(jnp.asarray(q_logits), axis=-1))
    np.testing.assert_allclose(tv, 1.0 - beta, atol=1e-6)
    kl = objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "kl")
    log_q = jax.nn.log_softmax(jnp.asarray(q_logits), axis=-1)
    np.testing.assert_allclose(kl, -jnp.sum(p * log_q, axis=-1), rtol=1e-5)
    at_p = objectives.teacher_losses(jnp.asarray(p_logits), ids, probs, "kl")
    np.testing.assert_allclose(at_p, -jnp.sum(p * jnp.log(p), axis=-1), rtol=1e-5)
    assert np.all(np.asarray(at_p) < np.asarray(kl))
    np.testing.assert_allclose(objectives.teacher_losses(jnp.asarray(p_logits), ids, probs, "tv"),
                               0.0, atol=1e-6)
    with pytest.raises(ValueError, match="objective='ce'"):
        objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "ce")
    with pytest.raises(ValueError, match="objective"):
        TrainConfig(steps=1, objective="js")


def test_teacher_distributions_match_the_forward_pass_and_cache(tmp_path):
    model = tiny_config(vocab_size=40)
    module = t5.Transformer(model)
    params = t5.init_params(module, jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    examples = [(np.append(rng.integers(2, 40, n), EOS).astype(np.int32),
                 np.append(rng.integers(2, 40, m), EOS).astype(np.int32))
                for n, m in ((3, 5), (9, 2), (4, 4), (14, 11))]
    config = TrainConfig(steps=1, batch_tokens=32, buckets=(8, 16), teacher_top_k=5)
    cache = str(tmp_path / "teacher.npz")
    got = objectives.teacher_distributions(module, params, examples, config, cache)
    forward = jax.jit(lambda x, y: module.apply({"params": params}, x, objectives.shift_right(y),
                                                y))
    for (x, y), (x2, y2, ids, probs) in zip(examples, got):
        assert x2 is x and y2 is y and ids.shape == probs.shape == (len(y), 5)
        logits = forward(training_data.pad_rows([x], 16),
                         training_data.pad_rows([y], 16))[:, :len(y)]
        want_p, want_ids = jax.lax.top_k(jax.nn.softmax(logits[0], axis=-1), 5)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(probs, want_p, atol=1e-3)  # stored as float16
    again = objectives.teacher_distributions(module, params, examples, config, cache)
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
    # Batches carry the teacher's arrays beside inputs and targets, padded alike.
    inputs, targets, ids, probs = next(training_data.batches(got, (16,), 64))
    assert ids.shape == probs.shape == targets.shape + (5,)
    assert np.all(probs[targets == 0] == 0)


@pytest.mark.slow  # ~13 s
def test_tv_objective_raises_acceptance_against_the_teacher():
    """A few steps of 'tv' training move a random draft's beta against a fixed teacher up."""
    teacher_cfg, draft_cfg = tiny_config(vocab_size=24), tiny_config(vocab_size=24, emb_dim=8)
    teacher = t5.Transformer(teacher_cfg)
    t_params = t5.init_params(teacher, jax.random.PRNGKey(0))
    rng = np.random.default_rng(2)
    examples = [(np.append(rng.integers(2, 24, 6), EOS).astype(np.int32),
                 np.append(rng.integers(2, 24, 6), EOS).astype(np.int32)) for _ in range(8)]
    config = TrainConfig(steps=30, batch_tokens=64, buckets=(8,), objective="tv",
                                  teacher_top_k=24, learning_rate=0.05, warmup_steps=1)
    batch = next(training_data.batches(
        objectives.teacher_distributions(teacher, t_params, examples, config), (8,), 64))
    module = t5.Transformer(draft_cfg)
    optimizer = trainer.make_optimizer(config)
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(1))
    step = trainer.make_train_step(module, optimizer, config)
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch[0], batch[1], jax.random.PRNGKey(0), *batch[2:])
        losses.append(float(metrics["loss"] / metrics["tokens"]))
    assert losses[-1] < losses[0] - 0.05, losses
    with pytest.raises(ValueError, match="teacher distributions"):
        step(state, batch[0], batch[1], jax.random.PRNGKey(0))


def test_flops_per_token_arithmetic():
    cfg = t5.T5Config(vocab_size=4000, emb_dim=10, num_heads=2, head_dim=8, mlp_dim=32,
                      num_encoder_layers=1, num_decoder_layers=1,
                      mlp_activations=("gelu", "linear"), logits_via_embedding=True)
    f = evaluation.decoder_flops_per_token(cfg, self_len=16, enc_len=20)
    layer = 6 * 10 * 16 + 3 * 10 * 32 + 2 * 16 * (16 + 20)
    assert f == {"decoder_layers": 2 * layer, "output_layer": 2 * 10 * 4000,
                 "total": 2 * (layer + 10 * 4000)}


# ------------------------------------------------------------------------------ bundled models

@pytest.mark.parametrize("name", sorted(n for n, e in _card().items()
                                        if "checkpoint" in e and "kind" not in e))
def test_bundled_model_valid_subset_loss_matches_card(name):
    entry = _card()[name]
    config = t5.T5Config(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in entry["config"].items()})
    params = checkpoints.load_params(os.path.join(BUNDLE, entry["checkpoint"]), dtype="float32",
                                     config=config)
    n = entry["valid_subset"]["first_n_valid_pairs"]
    pairs = text.load_pairs(os.path.join(text.MINI_DIR, "valid.tsv"))[:n]
    tok = text.Tokenizer()
    examples, _ = training_data.make_examples(tok.encode_inputs([s for s, _ in pairs]),
                                         tok.encode_targets([t for _, t in pairs]), 48, True)
    train_config = TrainConfig(steps=1, buckets=(48,), batch_tokens=48 * n)
    loss = trainer.evaluate_loss(trainer.make_eval_step(t5.Transformer(config)), params,
                                  examples, train_config)
    assert loss == pytest.approx(entry["valid_subset"]["loss_bfloat16"], abs=2e-3)


@pytest.mark.parametrize("name", sorted(n for n, e in _card().items()
                                        if e.get("kind") in ("unigram", "bigram")))
def test_bundled_ngram_drafts_load(name):
    entry = _card()[name]
    cls = ngram.UnigramDraft if entry["kind"] == "unigram" else ngram.BigramDraft
    draft = cls.load(os.path.join(BUNDLE, entry["file"]))
    log_probs = np.asarray(draft.params["log_probs"])
    assert draft.vocab_size == 4000
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-4)


def _feature_drafts():
    """(bundle, name) of every bundled target-aware draft, both pairs."""
    from speculative.data import bundles
    return [(b, n) for b in bundles.BUNDLES if b.available()
            for n, e in b.model_card()["models"].items() if e.get("kind") == "feature_draft"]


@pytest.mark.parametrize("bundle,name", [  # CI: the EN-DE draft; the code pair's (~50 s) slow
    pytest.param(b, n, marks=[pytest.mark.slow] if b.decoder_only else [])
    for b, n in _feature_drafts()], ids=lambda x: x if isinstance(x, str) else x.name)
def test_bundled_target_aware_draft_reproduces_its_card(bundle, name):
    """The stored (bfloat16) target-aware draft: its forced alpha on the card's first valid
    sentences (code: prompts continued for PROMPT_LENGTH tokens) is what the card records."""
    from speculative.data import bundles
    from speculative.runs import feature_draft as runs_feature_draft

    entry = bundle.entry(name)
    length = bundles.PROMPT_LENGTH if bundle.decoder_only else 48
    got = runs_feature_draft.valid_subset(
        bundle.load(entry["target"]), bundle.load(name),
        num=entry["valid_subset"]["first_n_valid_sentences"], length=length,
        decoder_only=bundle.decoder_only)
    assert got["positions"] == entry["valid_subset"]["positions"]
    for key in ("forced_alpha_t0", "forced_alpha_t1"):
        assert got[key] == pytest.approx(entry["valid_subset"][key], abs=1e-3)


def test_bundle_fits_the_size_budget():
    if not os.path.isdir(BUNDLE):
        pytest.skip("no bundled models")
    def size(top):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)

    large = os.path.join(BUNDLE, "large_target")
    large_size = size(large) if os.path.isdir(large) else 0
    assert large_size <= 100e6, large_size  # the memory-bound target, bfloat16
    assert size(BUNDLE) - large_size <= 25e6, size(BUNDLE) - large_size


def test_train_script_ngrams_run_needs_no_training_macros():
    """`scripts/train.py --run=ngrams` parses train.gin without MODEL/MODEL_DIR/TRAIN_STEPS (gin
    rejects REQUIRED macros left unset); the plain training run still requires them."""
    import gin  # pylint: disable=g-import-not-at-top

    repo = REPO
    script = load_script("train")
    files = [os.path.join(repo, "configs", "models", "mini_target.gin"),
             os.path.join(repo, "configs", "runs", "train.gin")]
    bindings = ["TARGET_MODEL = @mini_target/t5.T5Config()", "EXPORT_DIR = '/tmp/ngrams'"]
    try:
        gin.clear_config()
        script.parse_gin("ngrams", files, bindings)
        assert gin.query_parameter("EXPORT_DIR/macro.value") == "/tmp/ngrams"
        assert gin.query_parameter("MODEL/macro.value") is None
        gin.clear_config()
        with pytest.raises(ValueError, match="MODEL"):
            script.parse_gin("train", files, bindings)
    finally:
        gin.clear_config()


@pytest.mark.slow  # ~13 s, trains twice; teacher distributions, TV and the cache run in CI
def test_distill_sources_add_the_teachers_translations_of_unseen_sentences(tmp_path):
    """`distill_sources` (one English sentence per line) become distillation pairs whose
    targets are the teacher's greedy outputs, cached beside `distill_cache`; asking for them
    without a teacher is refused before any work."""
    data, pairs = _small_corpus(tmp_path)
    mono = [s for s, _ in pairs[100:110]]
    (data / "mono.txt").write_text("\n".join(mono) + "\n\n", "utf-8")
    small = dict(vocab_size=4000, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8,
                 num_encoder_layers=1, num_decoder_layers=1)
    config = TrainConfig(steps=2, batch_tokens=384, buckets=(48,))
    kw = dict(config=config, seed=0, data_dir=str(data), eval_every=2, card_subset=4,
              bleu_sentences=2, alpha_sentences=2)
    teacher_cfg = tiny_config(**small)
    training.train(training.TrainRun(model=teacher_cfg, model_dir=str(tmp_path / "teacher"), **kw))
    with pytest.raises(ValueError, match="distill_sources='mono.txt'.*distill=True"):
        training.train(training.TrainRun(model=teacher_cfg, model_dir=str(tmp_path / "x"),
                                          distill_sources="mono.txt", **kw))
    cache = tmp_path / "cache" / "greedy.npz"
    summary = training.train(training.TrainRun(
        model=tiny_config(**small), model_dir=str(tmp_path / "draft"), distill=True,
        distill_cache=str(cache), distill_sources="mono.txt", target_model=teacher_cfg,
        target_checkpoint=str(tmp_path / "teacher"), **kw))
    assert summary["distill_sources"] == {"file": "mono.txt", "pairs": 10}
    assert summary["train_pairs"] == 48 - summary["train_dropped"] + 10
    module = t5.Transformer(teacher_cfg)
    params = checkpoints.load_params(str(tmp_path / "teacher"), config=teacher_cfg)
    tok = text.Tokenizer(str(data / "spm.model"))
    inputs = [np.asarray(x, np.int32) for x in tok.encode_inputs(mono)]
    greedy = evaluation.greedy_decode(module, params, inputs, max_decode_len=48, input_length=48)
    with np.load(tmp_path / "cache" / "greedy.mono.npz") as got:
        for row, want in zip(got["outputs"], greedy):
            want = want if want[-1] == EOS else np.append(want[:47], EOS)
            np.testing.assert_array_equal(row[:len(want)], want)
            assert not row[len(want):].any()


def test_init_checkpoint_starts_from_its_parameters_and_refuses_another_shape(tmp_path):
    model = tiny_config(vocab_size=40)
    module = t5.Transformer(model)
    params = t5.init_params(module, jax.random.PRNGKey(3))
    path = checkpoints.save_t5x(jax.device_get(params), str(tmp_path / "ckpt"), step=5)
    optimizer = trainer.make_optimizer(TrainConfig(steps=1))
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(0), path)
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert int(state.step) == 0
    other = t5.Transformer(tiny_config(vocab_size=40, emb_dim=24))
    with pytest.raises(ValueError, match="shape"):
        trainer.init_state(other, optimizer, jax.random.PRNGKey(0), path)


def test_distill_cache_reads_back_outputs_holding_a_zero_token(tmp_path, monkeypatch):
    """A teacher output may hold id 0 before its EOS (an untrained or odd teacher): the cache
    returns it whole, so its teacher-distribution cache (keyed on the outputs) still matches."""
    outputs = [np.array([5, 0, 7, EOS], np.int32), np.array([9, EOS], np.int32),
               np.array([3] * 8, np.int32)]  # the last hits max_length: EOS replaces its end
    monkeypatch.setattr(objectives, "greedy_decode", lambda *a, **k: [o.copy() for o in outputs])
    examples = [(np.array([4, EOS], np.int32), np.array([EOS], np.int32))] * 3
    cache = str(tmp_path / "d.npz")
    fresh = objectives.distill_targets(None, None, examples, 8, cache)
    monkeypatch.setattr(objectives, "greedy_decode", lambda *a, **k: pytest.fail("decoded again"))
    again = objectives.distill_targets(None, None, examples, 8, cache)
    for (_, a), (_, b) in zip(fresh, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again[0][1], [5, 0, 7, EOS])
    np.testing.assert_array_equal(again[2][1], [3] * 7 + [EOS])


def test_train_large_recipe_commands_parse(tmp_path):
    """scripts/train_large.sh --print: every stage's train.py command is valid gin with the
    settings MODEL_CARD.md states (so a typo in the recipe fails here, not hours into a run)."""
    import shlex  # pylint: disable=g-import-not-at-top

    import gin  # pylint: disable=g-import-not-at-top

    from speculative.runs import config as config_lib  # pylint: disable=g-import-not-at-top

    repo = REPO
    out = subprocess.run(["bash", os.path.join(repo, "scripts", "train_large.sh"), "--print",
                          str(tmp_path / "large")], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 6 and not os.path.exists(tmp_path / "large")  # printed, nothing run
    expected = {  # model dir -> (steps, objective, distill, learning rate, exported)
        "large_target": (4000, "ce", False, 0.01, True),
        "large_draft_kd": (4000, "kl", True, 0.03, False),
        "large_draft_kdtv": (2000, "tv", True, 0.01, True),
        "large_draft_kl": (2000, "kl", True, 0.03, True),
        "large_draft_tv": (2000, "tv", True, 0.03, True),
        "large_draft_ce": (2000, "ce", False, 0.03, True),
    }
    seen = set()
    for line in lines:
        argv = shlex.split(line)
        args = argv[argv.index("scripts/train.py") + 1:]
        files = [a.split("=", 1)[1] for a in args if a.startswith("--gin_file=")]
        bindings = [f"{m.group(1)} = {m.group(2)}" for m in
                    (re.fullmatch(r"--gin\.([^=]+)=(.*)", a) for a in args) if m]
        gin.clear_config()
        try:
            config_lib.parse_gin(files, bindings, search_paths=(repo,))
            name = os.path.basename(gin.query_parameter("%MODEL_DIR"))
            steps, objective, distill, lr, exported = expected[name]
            assert gin.query_parameter("%TRAIN_STEPS") == steps
            assert gin.query_parameter("%OBJECTIVE") == objective
            assert gin.query_parameter("%DISTILL") is distill
            assert gin.query_parameter("%LEARNING_RATE") == lr
            assert (gin.query_parameter("%EXPORT_DIR") is not None) == exported
            dropout = gin.query_parameter("large_target/t5.T5Config.dropout_rate")
            assert dropout == (0.1 if name == "large_target" else 0.0)
        finally:
            gin.clear_config()
        seen.add(name)
    assert seen == set(expected)


# --------------------------------------------------------------------- decoder-only (GPT-like)

def _lm_model(**overrides):
    return tiny_config(vocab_size=400, num_encoder_layers=0, **overrides)


def test_decoder_only_training_lowers_the_loss_and_exports_a_reloadable_checkpoint(
        tiny_code_corpus, tmp_path):
    """`TrainRun(decoder_only=True)` on the code corpus: next-token loss falls within 20 steps; the
    float32 checkpoint reproduces the subset loss of the trainer's own parameters exactly, and
    the bfloat16 export is those parameters rounded to bfloat16, logit for logit."""
    from speculative import loading  # pylint: disable=g-import-not-at-top

    model = _lm_model()
    config = TrainConfig(steps=20, batch_tokens=256, buckets=(32,), learning_rate=1e-2,
                                  warmup_steps=5)
    model_dir, export = tmp_path / "run", tmp_path / "bundle"
    summary = training.train(training.TrainRun(
        model=model, model_dir=str(model_dir), config=config, seed=0,
        data_dir=str(tiny_code_corpus), decoder_only=True, eval_every=10, card_subset=4,
        export_dir=str(export)))
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    assert records[1]["train_loss"] < records[0]["train_loss"] < np.log(400) + 1
    assert records[1]["valid_loss"] < records[0]["valid_loss"]
    assert sorted(os.listdir(model_dir)) == ["checkpoint_20", "metrics.jsonl", "summary.json",
                                             "train_state.json"]  # the finished run's record
    tok = text.Tokenizer(str(tiny_code_corpus / "spm.model"))
    train_ex = text.lm_examples(str(tiny_code_corpus), "train", tok, 32)
    valid_ex = text.lm_examples(str(tiny_code_corpus), "valid", tok, 32)
    assert summary["decoder_only"] and "valid_bleu" not in summary
    assert (summary["train_chunks"], summary["valid_chunks"]) == (len(train_ex), len(valid_ex))
    assert all(len(x) == 0 and 0 < len(y) <= 32 for x, y in train_ex)

    module = t5.DecoderOnly(model)
    params = checkpoints.load_params(str(model_dir / "checkpoint_20"))
    checkpoints.validate_params(params, module)
    eval_step = trainer.make_eval_step(module)
    loss = trainer.evaluate_loss(eval_step, params, valid_ex[:4], config)
    assert loss == summary["valid_subset"]["loss_float32"]
    bundled = loading.load_model(model, str(export / "run"), decoder_only=True,
                                 kernel_layout="t5x")  # the same program as `rounded`
    assert isinstance(bundled, decoding.DecoderOnlyModel)
    _, targets = next(training_data.batches(valid_ex[:4], (32,), 128))
    rounded = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
    np.testing.assert_array_equal(
        module.apply({"params": bundled.params}, objectives.shift_right(targets), targets),
        module.apply({"params": rounded}, objectives.shift_right(targets), targets))
    assert json.loads((export / "model_card.json").read_text())["models"]["run"][
        "checkpoint"] == "run/checkpoint_20"


@pytest.mark.slow  # ~15 s
def test_decoder_only_draft_equal_to_its_target_has_alpha_one(tiny_code_corpus, tmp_path):
    """A decoder-only draft is measured against a decoder-only target on prompts cut from valid
    chunks; a draft that is the target (its checkpoint, learning rate 0) accepts everything."""
    model = _lm_model(num_decoder_layers=1)
    kw = dict(model=model, seed=0, data_dir=str(tiny_code_corpus), decoder_only=True,
              eval_every=2, card_subset=2)
    training.train(training.TrainRun(
        model_dir=str(tmp_path / "target"), **kw,
        config=TrainConfig(steps=2, batch_tokens=128, buckets=(32,))))
    summary = training.train(training.TrainRun(
        model_dir=str(tmp_path / "draft"), **kw, init_checkpoint=str(tmp_path / "target"),
        config=TrainConfig(steps=1, batch_tokens=128, buckets=(32,),
                                    learning_rate=0.0),
        target_model=model, target_checkpoint=str(tmp_path / "target"), alpha_sentences=3,
        alpha_gamma=2, prompt_length=8))
    assert [a["temperature"] for a in summary["alpha"]] == [0.0, 1.0]
    for a in summary["alpha"]:
        assert a["sentences"] == 3 and a["gamma"] == 2
        assert a["alpha"] == pytest.approx(1.0, abs=1e-5)
        # 8 tokens per prompt in rounds of gamma + 1 = 3 (the last one cut to 8): 3 target calls.
        assert a["tokens_per_target_call"] == pytest.approx(8 / 3)
    assert summary["flops_ratio_to_target"] == 1.0 and summary["target"] == "target"


def test_decoder_only_ngram_drafts_fit_the_chunks_the_target_reads(tiny_code_corpus, tmp_path,
                                                                    monkeypatch):
    """`fit_ngram_drafts(decoder_only=True)`: code_unigram / code_bigram count the train split's
    chunks (each after BOS, as the target reads them), and their alpha is measured against the
    decoder-only target on valid prompts (`draft_alpha`, tested on its own above, is recorded
    here instead of run: its compiles would take a minute) and written to the card."""
    from speculative.models import ngram  # pylint: disable=g-import-not-at-top

    calls = []

    def fake_alpha(target, draft, inputs, *, rng, gamma, max_length):
        calls.append((target, draft, inputs, gamma, max_length))
        return [{"alpha": 0.5, "temperature": t, "sentences": len(inputs)} for t in (0.0, 1.0)]

    monkeypatch.setattr(training, "draft_alpha", fake_alpha)

    from speculative import loading  # pylint: disable=g-import-not-at-top

    model = _lm_model(num_decoder_layers=1)  # a random target: alpha is measured, not judged
    target = loading.load_model(model, None, decoder_only=True, seed=0)
    checkpoints.save_t5x(jax.device_get(target.params), str(tmp_path / "target"), step=1)
    export = tmp_path / "bundle"
    summaries = training.fit_ngram_drafts(
        export_dir=str(export), target_model=model, target_checkpoint=str(tmp_path / "target"),
        seed=0, model_dir=str(tmp_path / "ngrams"), data_dir=str(tiny_code_corpus),
        max_length=32, alpha_sentences=3, alpha_gamma=2, decoder_only=True, prompt_length=8)
    assert sorted(summaries) == ["code_bigram", "code_unigram"]
    tok = text.Tokenizer(str(tiny_code_corpus / "spm.model"))
    chunks = [y for _, y in text.lm_examples(str(tiny_code_corpus), "train", tok, 32)]
    card = json.loads((export / "model_card.json").read_text())["models"]
    for name, fit in (("code_unigram", ngram.fit_unigram), ("code_bigram", ngram.fit_bigram)):
        draft = ngram.load(str(export / f"{name}.npz"), decoder_only=True)
        assert draft.decoder_only
        np.testing.assert_allclose(draft.params["log_probs"],
                                   fit(chunks, tok.vocab_size).params["log_probs"], rtol=1e-6)
        entry = card[name]
        assert entry["decoder_only"] and entry["train_chunks"] == len(chunks)
        assert [a["temperature"] for a in entry["alpha"]] == [0.0, 1.0]
        assert all(a["sentences"] == 3 for a in entry["alpha"])
    valid = text.lm_examples(str(tiny_code_corpus), "valid", tok, 32)
    prompts = text.lm_prompts(valid, 8)[:3]
    assert len(calls) == 2 and len(prompts) == 3
    for target, draft, inputs, gamma, max_length in calls:
        assert isinstance(target, decoding.DecoderOnlyModel) and draft.decoder_only
        assert (gamma, max_length) == (2, 8)
        np.testing.assert_array_equal(np.stack(inputs), np.stack(prompts))
    with pytest.raises(ValueError, match="prompt_length=32 must be in"):
        training.fit_ngram_drafts(
            export_dir=str(export), target_model=model,
            target_checkpoint=str(tmp_path / "target"), seed=0,
            model_dir=str(tmp_path / "ngrams"), data_dir=str(tiny_code_corpus), max_length=32,
            decoder_only=True, prompt_length=32)


def test_decoder_only_refuses_distillation_and_a_missing_train_split(tiny_code_corpus, tmp_path):
    config = TrainConfig(steps=1, buckets=(32,))
    kw = dict(model=_lm_model(), config=config, seed=0, decoder_only=True)
    with pytest.raises(ValueError, match="distill=True.*use distill=False"):
        training.train(training.TrainRun(model_dir=str(tmp_path / "a"),
                                          data_dir=str(tiny_code_corpus), distill=True, **kw))
    data = tmp_path / "no_train"
    shutil.copytree(tiny_code_corpus, data)
    (data / "train.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="build_code_corpus.py.*--train_split_only"):
        training.train(training.TrainRun(model_dir=str(tmp_path / "b"), data_dir=str(data),
                                          **kw))


def test_code_models_and_run_file_parse_with_the_papers_proportions():
    """configs/runs/train_code.gin with code_target/code_draft: a decoder-only run on 256-token
    chunks; the draft costs 1/15-1/30 of the target's decoder FLOPs per token (paper: 6M/97M)
    and the target is a scaled-down 97M GPT."""
    import gin  # pylint: disable=g-import-not-at-top

    from speculative.runs import config as config_lib  # pylint: disable=g-import-not-at-top

    repo = REPO
    files = [f"configs/models/{m}.gin" for m in ("code_target", "code_draft")] + [
        "configs/runs/train_code.gin"]
    bindings = ["MODEL = @code_draft/t5.T5Config()", "MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 800",
                "TARGET_MODEL = @code_target/t5.T5Config()"]
    gin.clear_config()
    try:
        config_lib.parse_gin(files, bindings, search_paths=(repo,))
        assert gin.query_parameter("%DECODER_ONLY") is True
        assert gin.query_parameter("TrainConfig.buckets") == (256,)
        assert gin.query_parameter("%BATCH_TOKENS") == 4096
        configs = {scope: t5.T5Config(**{
            f.name: gin.query_parameter(f"{scope}/t5.T5Config.{f.name}")
            for f in dataclasses.fields(t5.T5Config)}) for scope in ("code_target", "code_draft")}
    finally:
        gin.clear_config()
    flops = {k: evaluation.decoder_flops_per_token(c, decoder_only=True, self_len=96)["total"]
             for k, c in configs.items()}
    assert 15 <= flops["code_target"] / flops["code_draft"] <= 30
    params = {k: sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(
        t5.param_shapes(t5.DecoderOnly(c)))) for k, c in configs.items()}
    assert 5e6 < params["code_target"] < 97e6 / 5 and params["code_draft"] < 6e6 / 5
    assert configs["code_target"].vocab_size == 4000  # the bundled code vocabulary's size
