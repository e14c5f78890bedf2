"""speculative/measure/plots.py and scripts/plot_theory.py: Figure 3 and speedup against gamma
are written as PNGs."""

import os

import pytest

from tests.helpers import load_script


def _load_plot_script():
    return load_script("plot_theory")


def test_plot_figure3(tmp_path):
    plot_theory = _load_plot_script()
    path = plot_theory.plot_figure3(str(tmp_path / "figure3_optimal_gamma.png"))
    assert os.path.exists(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000


def test_plot_speedup_vs_gamma(tmp_path):
    plot_theory = _load_plot_script()
    runs = [
        {"gamma": g, "speedup": s, "predicted_speedup": p}
        for g, s, p in [(4, 2.2, 2.5), (1, 1.5, 1.7), (2, 1.9, 2.1)]
    ]
    path = plot_theory.plot_speedup_vs_gamma(runs, str(tmp_path / "s.png"), pair="p + q")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 5_000
    with pytest.raises(ValueError, match="predicted_speedup"):
        plot_theory.plot_speedup_vs_gamma([{"gamma": 1, "speedup": 1.0}], str(tmp_path / "t.png"),
                                          pair="p + q")
    # The title names the pair, and the temperatures and batch sizes the runs record.
    from speculative.measure import plots  # pylint: disable=import-outside-toplevel
    recorded = [dict(r, sampling={"temperature": t}, batch_size=1)
                for r, t in zip(runs, (0.0, 1.0, 0.0))]
    assert plots.speedup_title(recorded, "large_target + large_draft_kdtv") == (
        "large_target + large_draft_kdtv\nT = 0, 1, batch 1")
    assert plots.speedup_title(runs, "p + q") == "p + q"
    assert plots.describe_pair({"target_checkpoint": "/ckpt/xxl/checkpoint_5/",
                                "draft_model": "prompt_lookup"}) == "checkpoint_5 + prompt_lookup"
    assert plots.describe_pair({"target_model": {"emb_dim": 768}, "synthetic_acceptance": 0.8}) \
        == "random T5 (768d) + synthetic draft (alpha 0.8)"
    with pytest.raises(FileNotFoundError, match="missing.json"):
        plot_theory.load_runs(str(tmp_path / "missing.json"))
