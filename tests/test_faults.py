"""Faults and bad inputs: non-finite numbers never become accepted tokens, and bad arguments
are refused by name before any work (decode API, temperatures, cache size, run settings, the
trainer, the bundle, gin, the converter; the infer, benchmark and checkpoint suites add output
directories, interruption and corrupt checkpoints).

A target with NaN parameters must stop every row and flag it (`DecodeStats.nonfinite`) at
temperature 0 and 1, in both decoders, instead of emitting text computed from NaN; a draft with
NaN parameters must never get a token accepted (at temperature 0 the output still equals the
target's greedy output, at temperature 1 every token comes from the target alone). The kernel
rejects drafts at non-finite positions and leaves a broken q out of the residual.
"""

import pytest

from tests.helpers import tiny_config

# ----------------------------------------------------------------------------------------------
# Bad settings of the runs, the trainer, the bundle, gin and the converter: each refused with
# its name in the message, before any model is built or any data is read.

def _run_settings_cases(tmp_path):
    from speculative import loading
    from speculative.checkpoints import hf as hf_checkpoints
    from speculative.checkpoints import t5x as checkpoints
    from speculative.data import tasks
    from speculative.experiments import demo, limits, mini_results
    from speculative.models import t5 as t5_lib
    from speculative.runs import config as config_lib
    from speculative.runs import infer, mini
    from speculative.training import distillation as training
    from speculative.training.train_config import TrainConfig

    cfg = tiny_config(vocab_size=40)
    base = dict(target_config=cfg, draft_config=cfg, target_checkpoint=None,
                draft_checkpoint=None, mixture_or_task_name="mini_ende",
                task_feature_lengths={"inputs": 8, "targets": 8}, output_dir=None)
    stopped = tmp_path / "stopped"  # a mini_results run stopped after a stage
    stopped.mkdir()
    (stopped / "results.partial.json").write_text('{"settings": {}}')
    used = tmp_path / "used"
    used.mkdir()
    (used / "model.safetensors").write_text("old")
    notes = tmp_path / "notes"  # an earlier export beside a user's own file
    notes.mkdir()
    (notes / "config.json").write_text("{}")
    (notes / "notes.txt").write_text("mine")
    gin_file = tmp_path / "x.gin"
    gin_file.write_text("GAMMA = 3\nTEMPERATURE = 0.0\n")
    undefined = tmp_path / "undefined.gin"  # reads a macro nothing defines
    undefined.write_text("from speculative.runs import infer\ninfer.infer.seed = %SEEED\n"
                         "SEED = 0\ninfer.infer.gamma = %SEED\n")
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("Open\tÖffnen\nClose the file\nSave\tSpeichern\n")
    typo_file = tmp_path / "typo.gin"  # a user's experiment file over the benchmark's
    typo_file.write_text('include "configs/runs/benchmark.gin"\nTEMPERATUR = 1.0\n')
    return [
        ("infer GAMMA", lambda: infer.InferSettings(**base, gamma=0), ValueError, "GAMMA=0"),
        ("infer BATCH_SIZE", lambda: infer.InferSettings(**base, batch_size=0), ValueError,
         "BATCH_SIZE=0"),
        ("infer NUM_EXAMPLES", lambda: infer.InferSettings(**base, num_examples=-2), ValueError,
         "NUM_EXAMPLES=-2"),
        ("infer TASK_FEATURE_LENGTHS", lambda: infer.InferSettings(
            **{**base, "task_feature_lengths": {"inputs": 8}}), ValueError,
         "TASK_FEATURE_LENGTHS"),
        ("infer DRAFT_MODEL vocab", lambda: infer.InferSettings(
            **{**base, "draft_config": tiny_config(vocab_size=41)}), ValueError,
         "DRAFT_MODEL.vocab_size"),
        ("infer TARGET_MODEL", lambda: infer.InferSettings(**{**base, "target_config": "x"}),
         ValueError, "TARGET_MODEL"),
        ("infer sampling", lambda: infer.InferSettings(**base, sampling=0.5), ValueError,
         "sampling"),
        ("train objective", lambda: TrainConfig(steps=1, objective="mse"), ValueError,
         "objective"),
        ("train buckets", lambda: TrainConfig(steps=1, buckets=(16, 8)), ValueError,
         "buckets"),
        ("train batch_tokens", lambda: TrainConfig(steps=1, batch_tokens=4),
         ValueError, "batch_tokens"),
        ("train optimizer", lambda: TrainConfig(steps=1, optimizer="sgd"), ValueError,
         "optimizer"),
        ("train label_smoothing", lambda: TrainConfig(steps=1, label_smoothing=1.5),
         ValueError, "label_smoothing"),
        ("train teacher_top_k", lambda: TrainConfig(steps=1, teacher_top_k=0),
         ValueError, "teacher_top_k"),
        ("train kl without teacher", lambda: training.train(training.TrainRun(
            model=tiny_config(vocab_size=4000), model_dir=str(tmp_path / "m"),
            config=TrainConfig(steps=1, objective="kl"), seed=0)), ValueError,
         "distill=True"),
        ("demo num_sentences", lambda: demo.run(num_sentences=0), ValueError,
         "num_sentences=0"),
        ("demo temperatures", lambda: demo.run(temperatures=[-1.0]), ValueError,
         "temperatures"),
        ("demo input_length", lambda: demo.run(input_length=0), ValueError, "input_length=0"),
        ("demo gamma 0", lambda: demo.run(gamma=0), ValueError, "gamma=0"),
        ("demo samples 0", lambda: demo.run(samples=0), ValueError, "samples=0"),
        ("demo tiny temperature", lambda: demo.run(temperatures=[0.0, 1e-9]), ValueError,
         r"temperatures=\[0.0, 1e-09\].*below 0.0001"),
        ("demo output_json", lambda: demo.run(output_json=str(used / "model.safetensors" / "x")),
         PermissionError, "output_json"),
        ("bundle batches num 0", lambda: mini.source_batches(0, 1, 48), ValueError, "num=0"),
        ("bundle batches skip", lambda: mini.source_batches(2, 1, 48, skip=-1), ValueError,
         "skip=-1"),
        ("bundle batches size", lambda: mini.source_batches(2, 0, 48), ValueError,
         "batch_size=0"),
        ("mini_results num_sentences 0", lambda: mini_results.run(
            str(tmp_path / "r"), num_sentences=0), ValueError, "num_sentences=0"),
        ("mini_results repeats 0", lambda: mini_results.run(str(tmp_path / "r"), repeats=0),
         ValueError, "repeats=0"),
        ("mini_results over a stopped run", lambda: mini_results.run(str(stopped)),
         FileExistsError, "--resume"),
        ("bundle model", lambda: mini.load("no_such_model"), ValueError, "no_such_model"),
        ("bundle target", lambda: mini.drafts("mini_draft_10"), ValueError,
         "target='mini_draft_10'"),
        ("gin macro typo", lambda: config_lib.check_macros([str(gin_file)], ["GAMA = 5"]),
         ValueError, "did you mean GAMMA"),
        ("gin file typo", lambda: config_lib.check_macros([str(typo_file)], []), ValueError,
         "TEMPERATUR is set but nothing reads it.*did you mean TEMPERATURES"),
        ("gin missing file", lambda: config_lib.parse_gin([str(tmp_path / "none.gin")]),
         FileNotFoundError, "none.gin"),
        ("converter used dir", lambda: hf_checkpoints.check_hf_target(used), FileExistsError,
         "overwrite"),
        ("converter over a user's files", lambda: hf_checkpoints.check_hf_target(
            notes, True), FileExistsError, r"holds \['notes.txt'\], which are not an HF"),
        # Replacing the HF directory would delete the checkpoint being converted: refused even
        # with overwrite, whether the output holds the source or lies inside it.
        ("converter over its source", lambda: hf_checkpoints.check_hf_target(
            used, True, source=used / "checkpoint_1"), ValueError, "overlap"),
        ("converter inside its source", lambda: hf_checkpoints.check_hf_target(
            used / "hf", True, source=used), ValueError, "overlap"),
        ("checkpoint path", lambda: checkpoints.load_params(tmp_path / "nope"),
         FileNotFoundError, "nope"),
        ("preset name", lambda: t5_lib.preset("t5_1_1_huge"), (KeyError, ValueError),
         "t5_1_1_huge"),
        ("gin undefined macro", lambda: config_lib.check_macros([str(undefined)], []),
         ValueError, "%SEEED is read but no gin file defines.*did you mean %SEED"),
        ("model dtype", lambda: loading.load_model(cfg, None, param_dtype="bf32"),
         ValueError, "param_dtype='bf32' is not a parameter dtype"),
        ("checkpoint dtype", lambda: checkpoints.load_params(tmp_path / "nope", "int8"),
         ValueError, "dtype='int8' is not a parameter dtype"),
        ("malformed TSV line", lambda: tasks.register_tsv_task(
            "faults_tsv", {"validation": str(tsv)}, tasks.mini_vocabulary()).get_dataset(
            {"inputs": 8, "targets": 8}, split="validation"), ValueError,
         r"pairs.tsv:2: 1 tab-separated fields in 'Close the file'"),
        ("limits depth beyond memory", lambda: limits.depth_sweep([6, 10 ** 5]), ValueError,
         r"depths=100000: .* needs [0-9.]+ GiB"),
    ]


def test_bad_run_settings_are_refused_with_their_names(tmp_path):
    from speculative.runs import mini
    for name, call, error, message in _run_settings_cases(tmp_path):
        if name.startswith(("bundle", "demo", "limits", "malformed")) and not mini.available():
            continue
        with pytest.raises(error, match=message):
            call()
