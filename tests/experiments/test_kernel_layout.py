"""speculative/experiments/kernel_layout.py: the report, and bad settings refused before any
work."""

import os

import pytest

from speculative.runs import mini

pytestmark = pytest.mark.skipif(not mini.available(), reason="no bundled models")


@pytest.mark.slow  # ~1 minute of compiles; CI: the refusals below and tests/test_t5.py's layout
def test_kernel_layout_report(tmp_path):
    """Both layouts decode the same greedy text, each speedup is over its own baseline, and an
    earlier report is not replaced."""
    from speculative.experiments import kernel_layout

    out = str(tmp_path / "layout")
    report = kernel_layout.run(out, target_name=mini.MINI_TARGET, draft_name="mini_draft_10",
                               num_sentences=1, gammas=(2,), temperatures=(0.0,), repeats=1)
    [row] = report["rows"]
    assert row["identical_to_greedy"] and set(report["costs"]) == {"t5x", "transposed"}
    cell = row["gammas"][2]
    for layout in ("t5x", "transposed"):
        assert cell[layout]["speedup"] == pytest.approx(
            row["baseline_s"][layout] / cell[layout]["seconds"])
    assert "| 0 |" in open(os.path.join(out, "kernel_layout.md")).read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        kernel_layout.run(out, target_name=mini.MINI_TARGET)


def test_kernel_layout_refuses_bad_settings_before_any_work(tmp_path):
    from speculative.experiments import kernel_layout

    kw = dict(output_dir=str(tmp_path / "x"), target_name=mini.MINI_TARGET)
    with pytest.raises(ValueError, match="gammas is empty"):
        kernel_layout.run(gammas=(), **kw)
    with pytest.raises(ValueError, match="gammas=0"):
        kernel_layout.run(gammas=(2, 0), **kw)
    with pytest.raises(ValueError, match="samples=0"):
        kernel_layout.run(samples=0, **kw)
    with pytest.raises(ValueError, match="temperature"):
        kernel_layout.run(temperatures=(-1.0,), **kw)
    assert not os.path.exists(tmp_path / "x")
