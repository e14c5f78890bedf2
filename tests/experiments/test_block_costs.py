"""The block step's cost experiment on a random pair (experiments/block_costs.py): the chain's
and the block's cost per round at every gamma, on t5_1_1_tiny with tiny settings."""

import json
import math

import pytest

from speculative.experiments import block_costs, record

TINY = dict(target="t5_1_1_tiny", gammas=(2, 3), repeats=1, round_steps=4, max_decode_len=8,
            input_length=8)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow  # ~40 s: compiles 16 programs; the GPU script's dry run also runs it
def test_chain_and_block_costs_at_every_gamma(tmp_path):
    settings = block_costs.BlockCostSettings(**TINY, output_dir=str(tmp_path))
    block_costs.run(settings)
    report = json.loads((tmp_path / "block_costs.json").read_text())
    assert "block c_round" in (tmp_path / "block_costs.md").read_text()
    assert report["provenance"]["command"] and report["alpha_assumed"] == 0.8
    costs = report["costs"]
    assert _positive(costs["target_step_s"])
    for g in TINY["gammas"]:
        assert _positive(costs["verify_cost"][str(g)])
        for kind in ("chain", "block"):
            assert _positive(costs["c_round"][kind][str(g)]), (kind, g, costs)
        assert costs["draft_calls_per_round"]["chain"][str(g)] == g
        assert costs["draft_calls_per_round"]["block"][str(g)] == 1
    assert [r["gamma"] for r in report["rows"]] == list(TINY["gammas"])
    for row in report["rows"]:
        assert all(_positive(row[k]["theorem_3_8_round_cost"]) for k in ("chain", "block"))
    headline = record.headline_numbers("block_costs", report)
    assert [r["gamma"] for r in headline["rows"]] == list(TINY["gammas"])
    with pytest.raises(FileExistsError, match="overwrite"):
        block_costs.run(settings)


@pytest.mark.parametrize("field,value,message", [
    ("gammas", (2, 0), r"gammas=\(2, 0\)"),
    ("gammas", (), r"gammas=\(\)"),
    ("target", "t5_1_0_base", "target='t5_1_0_base'"),
    ("alpha", 1.0, "alpha=1.0"),
    ("hot_vocab", -1, "hot_vocab=-1"),
    ("feature_layers", (3,), r"feature_layers=\(3,\)"),
])
def test_bad_settings_are_refused_by_name(tmp_path, field, value, message):
    settings = block_costs.BlockCostSettings(**{**TINY, field: value},
                                             output_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=message):
        block_costs.run(settings)
    assert not (tmp_path / "out").exists()


def test_default_feature_layers_are_thirds_of_the_decoder():
    assert block_costs.draft_layers(2) == (1, 2)
    assert block_costs.draft_layers(6) == (2, 4, 6)  # the bundled drafts' layers
    assert block_costs.draft_layers(12) == (4, 8, 12)
