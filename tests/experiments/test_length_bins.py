"""speculative/experiments/length_bins.py: equal-count length bins, refusals before any work,
and the report's table and plot from a made-up result (the timed run is the script's)."""

import numpy as np
import pytest

from speculative.experiments import length_bins


def test_bins_have_equal_counts_shortest_first_and_stable_ties():
    bins = length_bins.length_bins([5, 3, 9, 3, 7, 1, 8], 3)
    assert [list(b) for b in bins] == [[5, 1, 3], [0, 4], [6, 2]]
    assert sorted(np.concatenate(bins)) == list(range(7))
    assert len(length_bins.length_bins([4, 4], 3)) == 2  # never an empty bin


@pytest.mark.parametrize("kwargs,match", [
    (dict(num=0), "num=0"), (dict(bins=0), "bins=0"), (dict(num=2, bins=3), "bins=3"),
    (dict(tasks=["fr"]), r"tasks=\['fr'\]"), (dict(gamma=0), "gamma=0"),
])
def test_bad_arguments_are_refused_before_any_work(kwargs, match, monkeypatch):
    monkeypatch.setattr(length_bins, "measure_task", None)  # calling it would fail the test
    with pytest.raises(ValueError, match=match):
        length_bins.run(**kwargs)


def test_table_and_plot_of_a_result(tmp_path):
    row = dict(min_length=3, max_length=9, mean_length=6.0, examples=4, alpha=0.7,
               tokens_per_target_call=2.5, speedup=1.8, predicted_speedup=2.0, baseline_s=1.0,
               speculative_s=0.55)
    task = dict(task="docstrings", target="t", draft="d", gamma=4, examples=8, c=0.05,
                verify_cost=1.5, rows=[row, {**row, "mean_length": 20.0, "speedup": 2.2}])
    result = {"gamma": 4, "tasks": [task, {**task, "task": "ende"}],
              "provenance": {"command": "python x", "commit": "abc"}}
    text = length_bins.markdown(result)
    assert "| 3-9 (mean 6) | 4 | 0.700 | 2.50 | 1.80x | 2.00x |" in text
    assert "## ende: t with d" in text and "Command: `python x`" in text
    path = length_bins.plot(result, str(tmp_path / "p.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
