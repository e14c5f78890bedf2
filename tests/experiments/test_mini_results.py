"""speculative/experiments/mini_results.py: stages resume and refuse to overwrite, tables are
their results JSON's, and the committed results meet their targets."""

import json
import os
import signal

import pytest

from speculative.data import bundles
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import mini_results
from speculative.measure import costs as costs_lib
from speculative.runs import mini
from tests.helpers import REPO, run_interrupted, snapshot

pytestmark = pytest.mark.skipif(not mini.available(), reason="no bundled models")

RESULTS = os.path.join(REPO, "results", "mini")
GREEDY = SamplingConfig(0.0)


def _written():
    """(results, directory) of every bundled target whose results are written."""
    return [(mini_results.load_results(os.path.join(REPO, mini_results.RESULT_DIRS[t])),
             mini_results.RESULT_DIRS[t]) for t in bundles.targets()
            if os.path.exists(os.path.join(REPO, mini_results.RESULT_DIRS[t], "results.json"))]


def test_results_stages_resume_and_refuse_to_overwrite(tmp_path):
    """Each finished stage is on disk at once; a resumed run takes it from there (same settings
    only), and a finished run's results.json is replaced only when asked."""
    settings = {"target": "t", "repeats": 3, "environment": {"time": "then"}}
    stages = mini_results._Stages(str(tmp_path), settings, resume=False)
    stages.done("table3", {"d": {"0.0": {"alpha": float("nan")}}})
    resumed = mini_results._Stages(str(tmp_path), {**settings, "environment": {"time": "now"}},
                                   resume=True)
    assert "table3" in resumed and "costs" not in resumed
    assert resumed["table3"] == {"d": {"0.0": {"alpha": None}}}  # strict JSON on disk
    assert "table3" not in mini_results._Stages(str(tmp_path), settings, resume=False)
    with pytest.raises(ValueError, match="other settings"):
        mini_results._Stages(str(tmp_path), {**settings, "repeats": 4}, resume=True)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(FileExistsError, match="overwrite"):
        mini_results.run(output_dir=str(tmp_path), target_name=mini.TARGET)


@pytest.mark.skipif(not mini.available(), reason="no bundled models")
def test_an_interrupted_overwrite_leaves_the_earlier_run_and_its_stages(tmp_path):
    """scripts/mini_results.py --overwrite, resumed from a stopped run whose every stage is
    done (the committed mini results, as results.partial.json), and sent SIGTERM just before
    its tables, plot and results.json are renamed into place: the earlier run's files are
    left as they were (no new plot beside old tables), and so are the stages, to resume."""
    committed = json.loads(open(os.path.join(REPO, "results", "mini", "results.json")).read())
    partial = {k: v for k, v in committed.items() if k != "dynamic"}
    for t in mini_results.TEMPERATURES:
        partial[f"dynamic_{t:g}"] = [r for r in committed["dynamic"] if r["temperature"] == t]
    out = tmp_path / "mini"
    out.mkdir()
    for name in ("results.json", "table2.md", "speedup_vs_gamma.png"):
        (out / name).write_bytes(b"earlier run: " + name.encode())
    (out / mini_results.PARTIAL).write_text(json.dumps(partial))
    before = snapshot(out)
    settings = committed["settings"]
    run_interrupted("mini_results.py", [
        "--targets=mini_target", f"--output_dir={out}", "--resume", "--overwrite",
        f"--num_alpha_tokens={settings['num_alpha_tokens']}",
        f"--num_sentences={settings['num_sentences']}", f"--repeats={settings['repeats']}"],
        result=str(out), signum=signal.SIGTERM)
    assert snapshot(out) == before


def test_results_tables_are_what_their_results_json_gives(tmp_path):
    """Every committed table (Tables 2/3/4, models, objectives, round time, dynamic gamma) is
    what `mini_results` writes from the committed results.json beside it."""
    for results, directory in _written():
        tables = mini_results._tables(results)  # pylint: disable=protected-access
        assert {"table2.md", "table3.md", "table4.md", "models.md"} <= set(tables)
        for name, text in tables.items():
            assert text == open(os.path.join(REPO, directory, name)).read(), \
                f"{directory}/{name} differs from what its results.json gives"


@pytest.mark.skipif(not os.path.exists(os.path.join(RESULTS, "results.json")),
                    reason="results/mini not written yet")
def test_mini_results_meet_the_targets():
    for results, directory in _written():
        _check_results(results, directory)


def _check_results(results, directory):
    best_t0 = max(v["0.0"]["alpha"] for v in results["table3"].values())
    assert best_t0 >= 0.6
    # Every Table 2 row records its prediction from the same run's alpha, c and verify cost, and
    # the decode-loop cost model predicts each measured speedup within 15%.
    for row in results["table2"]:
        assert row["predicted_speedup"] > 0 and row["speedup"] > 0
        assert abs(row["measured_over_predicted_loop"] - 1.0) <= 0.15, (directory, row)
    if results["settings"].get("target") == mini.LARGE_TARGET:  # the memory-bound pair pays
        best = max(r["speedup"] for r in results["table2"] if r["temperature"] == 0.0)
        assert best > 1.0, best


@pytest.mark.slow  # ~19 s (six decode programs compile); mini_results saves each stage
def test_dynamic_gamma_rows_share_one_baseline():
    """mini_results.dynamic_gamma: fixed and dynamic gamma against one interleaved baseline; a
    higher confidence threshold drafts fewer tokens per round (at temperature 0, deterministic)."""
    target, draft = mini.load(mini.TARGET), mini.load("mini_draft_30")
    batches = mini.source_batches(4, 1, bundles.INPUT_LENGTH)
    costs = costs_lib.StepCosts.assumed(0.1, {2: 1.5, mini_results.DYNAMIC_MAX_GAMMA: 2.0})
    rows = mini_results.dynamic_gamma(target, draft, batches, GREEDY, 2, repeats=1, seed=0,
                                      draft_name="mini_draft_30", costs=costs)
    assert [r["confidence"] for r in rows] == list(mini_results.DYNAMIC_CONFIDENCES) + ["+2/-1"]
    assert len({r["fixed_speedup"] for r in rows}) == 1  # one fixed-gamma program
    *rows, heuristic = rows
    assert 1.0 <= heuristic["drafted_per_round"] <= mini_results.DYNAMIC_MAX_GAMMA
    # The section 3.5 bound at the fixed run's alpha and these costs, on every row.
    assert len({r["oracle_bound"] for r in rows + [heuristic]}) == 1
    assert heuristic["oracle_bound"] > 0
    drafted = [r["drafted_per_round"] for r in rows]
    assert all(1.0 <= d <= mini_results.DYNAMIC_MAX_GAMMA for d in drafted)
    assert drafted == sorted(drafted, reverse=True) and drafted[0] > drafted[-1]
    assert all(r["speedup"] > 0 and r["draft"] == "mini_draft_30" for r in rows)
