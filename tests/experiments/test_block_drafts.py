"""experiments/block_drafts.py: its refusals, each draft's best row and the report's tables
(from a hand-made result; the measurement itself runs in `scripts/block_draft_benchmark.py`)."""

import pytest

from speculative.experiments import block_drafts, record


def _row(draft, gamma, speedup):
    return {"draft": draft, "gamma": gamma, "speedup": speedup, "alpha": 0.6,
            "tokens_per_target_call": 2.0, "draft_calls_per_round": 1.0, "c_round": 0.15,
            "verify_cost": 1.3, "theorem_3_8_round_cost": 1.5, "depth_rates": [0.8, 0.4]}


RESULT = {"settings": {"drafts": ["large_block_draft", "large_feature_draft"]},
          "costs": {"target_step_s": 0.0056, "c_round_by_width": {
              # JSON keys: after a round that accepted nothing (width 1) 0.1 + 0.01 (g - 1)
              "large_block_draft": {str(g): {"1": 0.1 + 0.01 * (g - 1), "2": 9.0}
                                    for g in (2, 3, 5)},
              "large_feature_draft": {"7": {"1": 0.3}}}},  # one gamma: no fit
          "temperatures": [{"temperature": 0.0, "rows": [
              _row("large_block_draft", 2, 1.3), _row("large_block_draft", 3, 1.4),
              _row("large_feature_draft", 2, 1.6), _row("large_feature_draft", 7, 2.0)]}],
          "provenance": {"command": "c", "commit": "abc", "date": "d"}}


def test_best_rows_are_each_drafts_fastest_gamma():
    best = record.best_rows(RESULT)
    assert [(r["draft"], r["gamma"], r["temperature"]) for r in best] == [
        ("large_block_draft", 3, 0.0), ("large_feature_draft", 7, 0.0)]
    head = record.headline_numbers("block_drafts", RESULT)
    assert [(b["draft"], b["gamma"]) for b in head["best"]] == [
        ("large_block_draft", 3), ("large_feature_draft", 7)]


def test_markdown_has_both_tables_and_the_target_step():
    md = block_drafts.markdown(RESULT)
    assert "target step 5.60 ms" in md
    assert "| 0.0 | large_feature_draft | 7 | 2.00x | 2.00 | 0.150 |" in md
    assert "| 0.0 | large_block_draft | 2 | 1.30x | 0.600 | 2.00 | 1.00 | 0.150 | 1.30 | 1.50x " \
           "| 0.80 0.40 |" in md


def test_the_cost_split_is_the_least_squares_line_through_the_one_token_catch_ups():
    split = block_drafts.cost_split(RESULT)
    assert list(split) == ["large_block_draft"]
    assert split["large_block_draft"]["fixed"] == pytest.approx(0.1)
    assert split["large_block_draft"]["per_draft"] == pytest.approx(0.01)
    assert "| large_block_draft | 0.100 | 0.0100 |" in block_drafts.markdown(RESULT)


@pytest.mark.parametrize("field,value,message", [
    ("gammas", (2, 0), r"gammas=\(2, 0\)"), ("gammas", (), r"gammas=\(\)"),
    ("drafts", ("large_target_x",), "large_target_x"),
])
def test_bad_settings_are_refused_by_name(field, value, message):
    settings = block_drafts.BlockBenchSettings(**{field: value})
    with pytest.raises(ValueError, match=message):
        block_drafts.check(settings)
