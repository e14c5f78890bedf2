"""speculative/experiments/alpha_by_confidence.py: the report, and bad drafts refused
before any work."""

import os

import pytest

from speculative.data import bundles
from speculative.measure import acceptance
from speculative.runs import mini

pytestmark = pytest.mark.skipif(not mini.available(), reason="no bundled models")


@pytest.mark.slow  # ~14 s; CI: the bins (tests/test_benchmark.py) and the refusals below
def test_alpha_by_confidence_report(tmp_path):
    """The report's bins hold Table 3's positions once and its overall alpha is Table 3's
    (`bundle_alpha`, same positions and seed); an earlier report is not replaced."""
    from speculative.experiments import alpha_by_confidence

    out = str(tmp_path / "conf")
    report = alpha_by_confidence.run(["mini_draft_10"], target_name=mini.MINI_TARGET,
                                     output_dir=out, num_alpha_tokens=60)
    assert [(r["draft"], r["temperature"]) for r in report["rows"]] == [
        ("mini_draft_10", 0.0), ("mini_draft_10", 1.0)]
    draft, target = mini.load("mini_draft_10"), mini.load(mini.MINI_TARGET)
    for row in report["rows"]:
        assert sum(b["positions"] for b in row["bins"]) == row["positions"] == 60
        table3 = acceptance.bundle_alpha(target, draft, bundles.ENDE, row["temperature"], 60, 0)
        assert row["alpha"] == pytest.approx(table3["alpha"], abs=1e-6)
    assert "| mini_draft_10 | 0 |" in open(os.path.join(out, "alpha_by_confidence.md")).read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        alpha_by_confidence.run(["mini_draft_10"], target_name=mini.MINI_TARGET, output_dir=out)


def test_alpha_by_confidence_refuses_bad_drafts_before_any_work(tmp_path):
    from speculative.experiments import alpha_by_confidence

    kw = dict(target_name=mini.MINI_TARGET, output_dir=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"\['large_draft_kl'\] are not bundled drafts"):
        alpha_by_confidence.run(["large_draft_kl"], **kw)
    with pytest.raises(ValueError, match="drafts is empty"):
        alpha_by_confidence.run([], **kw)
    with pytest.raises(ValueError, match="num_alpha_tokens=0"):
        alpha_by_confidence.run(["mini_draft_10"], num_alpha_tokens=0, **kw)
    assert not os.path.exists(tmp_path / "x")
