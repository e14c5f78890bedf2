"""experiments/tree_benchmark.py: the report's table and log line from a hand-made result (the
chains against trees are measured by `scripts/tree_benchmark.py`, tested end to end in
tests/experiments/test_limits.py's GPU dry run)."""

from speculative.experiments import tree_benchmark as trees


def _shape(shape, nodes, speedup):
    return {"shape": shape, "nodes": nodes, "verify_cost": 1.4, "tokens_per_target_call": 3.0,
            "predicted_tokens_per_target_call": 3.2, "speedup": speedup,
            "predicted_speedup": speedup + 0.1}


def test_a_row_without_a_better_tree_says_so_and_lists_the_chain():
    result = {"rows": [{"temperature": 0.0, "rank_acceptance": {"rates": [0.8, 0.5, 0.3, 0.1]},
                        "chain": _shape([1, 1, 1], 3, 1.9),
                        "most_tokens": _shape([2, 2, 1], 6, 1.5)}],
              "verify_cost": {"4": 1.3, "2": 1.2}, "draft_cost_rows": {"1": 0.04, "4": 0.06},
              "environment": {"cpu": {"model": "AMD EPYC"}},
              "load_average_1m": {"before": 0.5, "after": 0.7}, "target": "large_target",
              "draft": "large_draft_kdtv", "sentences": 8, "repeats": 3, "rank_sentences": 16,
              "max_nodes": 8, "c": 0.035}
    md = trees.markdown(result)
    assert md.startswith("# Chains and token trees (large_target + large_draft_kdtv, batch 1)")
    assert "by drafted tokens (target steps): 2: 1.20, 4: 1.30" in md  # sorted as ints
    assert "best tree = the chain" in md
    assert "best chain (1, 1, 1)" in md and "most tokens/call (2, 2, 1)" in md
    assert "1.90x" in md and "2.00x" in md  # measured and predicted
    line = trees._line(result["rows"][0])
    assert line.startswith("T=0 rank rates 0.800, 0.500, 0.300, 0.100")
    assert "chain (1, 1, 1): 3.00 tok/call (pred 3.20), 1.90x (pred 2.00x)" in line
