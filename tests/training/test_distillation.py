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
from speculative.training.train_config import TrainConfig
from tests.helpers import REPO, load_script, tiny_config

EOS = contract.EOS_ID


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


def test_continuing_a_run_with_its_seed_warns_that_the_batches_repeat(tmp_path):
    """The data order follows the seed: continuing an init_checkpoint's run with its seed on the
    same data replays its batches (the docstring target's second phase did, at first)."""
    run_dir = tmp_path / "base"
    run_dir.mkdir()
    (run_dir / "train_state.json").write_text(json.dumps(
        {"settings": {"seed": 0, "task": "docstrings", "distill": False}, "step": 2000}))
    kw = dict(model=tiny_config(), model_dir=str(tmp_path / "next"), config=TrainConfig(steps=1),
              task="docstrings", init_checkpoint=str(run_dir / "checkpoint_2000"))
    warning = training.replayed_order(training.TrainRun(seed=0, **kw))
    assert "seed=0 on the same data" in warning and "--gin.SEED" in warning
    assert training.replayed_order(training.TrainRun(seed=1, **kw)) is None
    assert training.replayed_order(training.TrainRun(seed=0, **{**kw, "task": "ende"})) is None
    assert training.replayed_order(training.TrainRun(seed=0, **{
        **kw, "init_checkpoint": str(tmp_path / "elsewhere" / "checkpoint_1")})) is None
