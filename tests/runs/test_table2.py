"""speculative/runs/table2.py and scripts/reproduce_table2.py: the paper's rows resolve to their
gin files and bundled models, and a tiny row reproduces (gamma auto included)."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from speculative import loading
from speculative.measure import acceptance, speculation
from speculative.measure import analysis as theory
from speculative.runs import table2
from tests.helpers import REPO
from tests.helpers.runs import INFER_GIN, fake_interleaved, infer_bindings, script_env

pytestmark = pytest.mark.usefixtures("clean_gin")


def _read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# The paper's Table 2: row -> (task, draft emb_dim, temperature, gamma).
PAPER = {
    "ende_small_t0": ("wmt_t2t_ende_v003", 512, 0.0, 7, 0.75, 3.4),
    "ende_base_t0": ("wmt_t2t_ende_v003", 768, 0.0, 7, 0.8, 2.8),
    "ende_large_t0": ("wmt_t2t_ende_v003", 1024, 0.0, 7, 0.82, 1.7),
    "ende_small_t1": ("wmt_t2t_ende_v003", 512, 1.0, 7, 0.62, 2.6),
    "ende_base_t1": ("wmt_t2t_ende_v003", 768, 1.0, 5, 0.68, 2.4),
    "ende_large_t1": ("wmt_t2t_ende_v003", 1024, 1.0, 3, 0.71, 1.4),
    "cnndm_small_t0": ("cnn_dailymail_v002", 512, 0.0, 5, 0.65, 3.1),
    "cnndm_base_t0": ("cnn_dailymail_v002", 768, 0.0, 5, 0.73, 3.0),
    "cnndm_large_t0": ("cnn_dailymail_v002", 1024, 0.0, 3, 0.74, 2.2),
    "cnndm_small_t1": ("cnn_dailymail_v002", 512, 1.0, 5, 0.53, 2.3),
    "cnndm_base_t1": ("cnn_dailymail_v002", 768, 1.0, 3, 0.55, 2.2),
    "cnndm_large_t1": ("cnn_dailymail_v002", 1024, 1.0, 3, 0.56, 1.7),
}


def test_table2_gin_files_resolve_to_the_paper_rows(tmp_path):
    assert table2.list_rows() == list(PAPER) == list(table2.PAPER_ROWS)
    target_ckpt, draft_ckpt = str(tmp_path / "xxl"), str(tmp_path / "draft")
    checkpoints = {"*": {"target": target_ckpt}, "*_t?": {"draft": draft_ckpt}}
    for name, (task, draft_dim, temp, gamma, alpha, speed) in PAPER.items():
        with open(table2.row_file(name), encoding="utf-8") as f:
            header = f.read().split("\nfrom __gin__")[0]
        assert f"alpha = {alpha:g}" in header and f"{speed:g}X" in header
        assert "REQUIRED" in header and "python scripts/" in header
        info, s, _ = table2.resolve_row(name, checkpoints=checkpoints,
                                        output_dir=str(tmp_path / name))
        assert (s.mixture_or_task_name, s.draft_config.emb_dim, s.sampling.temperature,
                s.gamma) == (task, draft_dim, temp, gamma), name
        assert s.target_config.emb_dim == 4096 and s.target_config.num_decoder_layers == 24
        assert s.target_config.vocab_size == s.draft_config.vocab_size == 32128
        assert (s.target_checkpoint, s.draft_checkpoint) == (target_ckpt, draft_ckpt)
        assert s.output_dir == str(tmp_path / name)
        assert s.batch_size == 1 and s.split == "test" and s.speculative
        assert (info.paper_alpha, info.paper_speed, info.target) == (alpha, speed, "T5-XXL")
    # The checkpoints are REQUIRED: resolving a row without them fails and names them.
    with pytest.raises(ValueError, match="TARGET_CHECKPOINT, DRAFT_CHECKPOINT are %gin.REQUIRED"
                       r".*give yours with --checkpoints=FILE"):
        table2.resolve_row("ende_small_t0", output_dir=str(tmp_path))
    # The driver's dry run resolves every row and writes the paper-format table.
    results = table2.reproduce("all", str(tmp_path / "dry"), checkpoints=checkpoints,
                               dry_run=True)
    assert [r.name for r in results] == list(PAPER)
    table = (tmp_path / "dry" / "table2.md").read_text()
    assert table.startswith("| Task | M_q | Temp | γ | α | Speed |")
    assert "| EnDe | T5-small ★ | 0 | 7 |" in table and "| CNNDM | T5-large | 1 | 3 |" in table
    # A dry run needs no checkpoints file and no output directory (the docs say so).
    bare = table2.reproduce(dry_run=True)
    assert [r.name for r in bare] == list(PAPER)
    assert bare[0].settings.target_checkpoint == table2.DRY_RUN_CHECKPOINT


BUNDLED_ROWS = os.path.join(REPO, "configs", "experiments", "table2_bundled")


def test_bundled_table2_rows_resolve_to_the_bundled_models():

    names = table2.list_rows(BUNDLED_ROWS)
    assert len(names) == 24 and {n.split("_")[0] for n in names} == {"large", "mini", "code"}
    for name in names:
        info, s, path = table2.resolve_row(name, rows_dir=BUNDLED_ROWS, dry_run=True,
                                           output_dir=None)
        target = loading.bundled(info.target)
        # The bundled names became their configs and checkpoints (no placeholder in a dry run).
        assert target is not None and s.target_config == target.config, name
        assert s.target_checkpoint == target.checkpoint and os.path.isdir(s.target_checkpoint)
        draft = loading.bundled(info.draft)
        if draft is not None and draft.is_t5:
            assert (s.draft_config, s.draft_checkpoint) == (draft.config, draft.checkpoint)
        else:  # n-gram tables and prompt lookup are built by name when the run loads them
            assert s.draft_config == info.draft and s.draft_checkpoint is None, name
        assert s.decoder_only == name.startswith("code") and s.num_examples >= 16
        assert f"--gin_file=configs/experiments/table2_bundled/{name}.gin" in open(path).read()
    # --gin_file=<row>.gin: rows given as paths are named by their file.
    [r] = table2.reproduce([table2.row_file("large_kdtv_t1", BUNDLED_ROWS)], dry_run=True)
    assert (r.name, r.gamma, r.temperature, r.info.target) == ("large_kdtv_t1", "auto", 1.0,
                                                               "large_target")


@pytest.mark.slow  # ~90 s: one bundled row decoded, timed and tabled as a newcomer runs it
def test_reproduce_table2_script_runs_a_bundled_row(tmp_path):
    out = tmp_path / "t2"
    cmd = [sys.executable, os.path.join(REPO, "scripts", "reproduce_table2.py"),
           f"--gin_file={os.path.join(BUNDLED_ROWS, 'mini_10_t0.gin')}", f"--output_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=script_env(), timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"\| EnDe mini \| mini_draft_10 ★ \| 0 \| \d \|", proc.stdout)  # GAMMA auto
    assert "★: the best draft for that task and temperature" in proc.stdout
    assert "Target M_p: mini_target." in proc.stdout
    [row] = json.loads((out / "table2.json").read_text())["rows"]
    assert row["speed"] > 0 and 0 < row["alpha"] <= 1 and row["c_source"] == "measured"


@pytest.mark.parametrize("choose_trees", [
    False, pytest.param(True, marks=pytest.mark.slow)])  # the tree choice adds ~20 s
def test_reproduce_table2_on_a_tiny_row(tiny_gin, tmp_path, choose_trees, monkeypatch):
    if choose_trees:  # the chooser picks a branching tree: the row times it beside its chain
        choose = acceptance.choose_tree

        def choose_a_tree(*args, **kwargs):
            choice = choose(*args, **kwargs)
            plan = dataclasses.replace(choice.plan, tree=(2, 1))
            return dataclasses.replace(choice, plan=plan)

        monkeypatch.setattr(acceptance, "choose_tree", choose_a_tree)
    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    (rows_dir / "tiny_t0.gin").write_text(
        "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n"
        "from speculative.runs import table2\n"
        f"include '{INFER_GIN}'\ninclude '{tiny_gin}'\n"
        + "\n".join(infer_bindings(None, NUM_EXAMPLES="2"))
        + "\ntable2.RowInfo.task = 'mini'\ntable2.RowInfo.draft = 'tiny'\n")
    results = table2.reproduce(["tiny_t0"], str(tmp_path / "out"), rows_dir=str(rows_dir),
                               row_bindings=["infer.infer.progress = False"], cost_repeats=3,
                               choose_trees=choose_trees)
    (r,) = results
    assert r.c_source == "measured" and r.c > 0 and r.verify_cost > 0
    assert r.speed > 0 and 0.0 <= r.alpha <= 1.0
    # Speed is the timing engine's ratio of interleaved medians, with its per-round spread.
    assert set(r.speed_spread) == {"min", "median", "max"}
    assert r.speed_spread["min"] <= r.speed_spread["median"] <= r.speed_spread["max"]
    assert r.predicted == pytest.approx(theory.speedup(r.alpha, 3, r.c))
    assert r.predicted_measured_verify == pytest.approx(
        theory.speedup(r.alpha, 3, r.c, verify_cost=r.verify_cost))
    saved = json.loads((tmp_path / "out" / "table2.json").read_text())
    assert saved["rows"][0]["alpha"] == r.alpha and "measured" in saved["c_source"]
    table = (tmp_path / "out" / "table2.md").read_text()
    assert "| mini | tiny | 0 | 3 |" in table and "c: measured" in table
    assert "Target M_p: random weights (" in table  # unlabelled: named by its checkpoint
    # The tree chooser's verdict for the row, with its reason, in the JSON and the table.
    choice = saved["rows"][0]["tree_choice"]
    if choose_trees:
        assert len(choice["rates"]) == 4 and choice["chain_speedup"] > 0
        assert "Token trees, tiny_t0: per-rank acceptance" in table
        assert choice["tree"] == [2, 1] and r.tree_speed > 0 and r.tree_tokens_per_target_call >= 1
        assert f"the tree ran at {r.tree_speed:.2f}X" in table
    else:
        assert choice is None and "Token trees" not in table and r.tree_speed is None
    for run in ("speculative", "baseline"):
        run_dir = tmp_path / "out" / "tiny_t0" / run
        assert len(_read_jsonl(run_dir / "mini_ende-predict.jsonl-00000-of-00001")) == 2
        assert f"SPECULATIVE = {run == 'speculative'}" in (run_dir / "config.gin").read_text()


# ----------------------------------------------------------------------------------------------
# GAMMA = 'auto' (the default): the run times its choices on its first inputs and runs the
# fastest. The timings are injected; the decodes are real (their results are the run's).


def test_a_table2_row_with_gamma_auto_reports_the_chosen_gamma(tiny_gin, tmp_path, monkeypatch):
    """A row with GAMMA = 'auto' is timed first (injected timings here), decodes at the chosen
    gamma, and its choice is in the notes and the JSON; the star is explained."""
    seconds = {("baseline", None): 1.0, ("chain", 2): 0.9, ("chain", 4): 0.5, ("chain", 6): 0.7}
    choose = speculation.choose_speculation
    searched = []  # a row always times its candidates: no gate, no calibration budget
    monkeypatch.setattr(speculation, "choose_speculation", lambda t, d, b, search, **k: choose(
        t, d, b, searched.append(search) or search, **k, timer=fake_interleaved(seconds)))
    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    (rows_dir / "tiny_t0.gin").write_text(
        "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n"
        "from speculative.runs import table2\n"
        f"include '{INFER_GIN}'\ninclude '{tiny_gin}'\n"
        + "\n".join(infer_bindings(None, NUM_EXAMPLES="2", GAMMA="'auto'"))
        + "\ntable2.RowInfo.task = 'mini'\ntable2.RowInfo.draft = 'tiny'\n"
        "table2.RowInfo.best = True\n")
    [r] = table2.reproduce(["tiny_t0"], str(tmp_path / "out"), rows_dir=str(rows_dir),
                           row_bindings=["infer.infer.progress = False"], cost_repeats=2,
                           speed_repeats=1, choose_trees=False)
    assert r.gamma == 4 and r.settings.gamma == 4 and r.speculation_choice.best.gamma == 4
    assert [(x.gate, x.run_batches) for x in searched] == [(False, None)]
    table = (tmp_path / "out" / "table2.md").read_text()
    assert "| mini | tiny ★ | 0 | 4 |" in table
    assert "γ auto, tiny_t0: gamma auto: baseline" in table and "the row reports γ 4" in table
    assert "★: the best draft for that task and temperature" in table
    saved = json.loads((tmp_path / "out" / "table2.json").read_text())["rows"][0]
    assert saved["speculation_choice"]["choice"] == "chain g4" and saved["gamma"] == 4
    run_dir = tmp_path / "out" / "tiny_t0" / "speculative"
    assert "GAMMA = 4" in (run_dir / "config.gin").read_text()
    # Where the baseline won, the row still measures speculation: at the fastest candidate's.
    slow = {("baseline", None): 1.0, ("chain", 2): 1.3, ("chain", 4): 1.5, ("chain", 6): 1.1}
    choice = choose(None, types.SimpleNamespace(), [np.zeros((2, 4))],
                    speculation.SpeculationSearch(sampling=r.settings.sampling, max_decode_len=8,
                                                  gate=False),
                    timer=lambda programs, repeats: _fake_results(programs, repeats, slow))
    assert choice.best.kind == "baseline" and table2.row_gamma(choice) == 2  # the probe's
    assert "infer would run the baseline here" in table2._auto_note(choice)


def _fake_results(programs, repeats, seconds):
    result = types.SimpleNamespace(lengths=np.asarray([4, 4]),
                                   stats=types.SimpleNamespace(target_calls=np.asarray([2, 2])))
    return ({name: 1.0 for name in programs},
            {name: [seconds[name[:2]]] * repeats for name in programs},
            {name: [result] for name in programs})


def test_the_quality_column_shows_speculative_beside_the_baseline():
    assert table2.quality({"speculative": {"bleu": 21.34}, "baseline": {"bleu": 21.339}}) == \
        "BLEU 21.3 = 21.3"
    rouge = {"rouge1": 30.0, "rouge2": 10.0}
    assert table2.quality({"speculative": {**rouge, "rougeL": 25.0},
                           "baseline": {**rouge, "rougeL": 24.46}}) == "ROUGE-L 25.0 , 24.5"
    assert table2.quality({"speculative": {}, "baseline": {}}) == "-"
    assert table2.quality({}) == "-"
