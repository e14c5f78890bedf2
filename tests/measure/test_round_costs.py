"""A drafter's cost per round (measure/round_costs.py): which catch-up widths are timed, how a
decode's accepted counts weight them, and the timed costs of a tiny target-aware pair."""

import math

import jax
import numpy as np
import pytest

from speculative.decode import drafters, tree_drafter, trees, verifiers
from speculative.measure import round_costs
from tests.helpers import decoding as td


def test_expected_c_round_weights_each_width_by_the_accepted_counts_that_need_it():
    by_width = {1: 0.1, 2: 0.2, 4: 0.4}  # gamma 3: a chunk of n + 1 tokens after n accepted
    # P(n > 0) = 0.5, P(n > 1) = 0.25, P(n > 2) = 0.25: n = 0, 1, 3 with 0.5, 0.25, 0.25
    got = round_costs.expected_c_round(by_width, [0.5, 0.25, 0.25])
    assert got == pytest.approx(0.5 * 0.1 + 0.25 * 0.2 + 0.25 * 0.4)
    assert round_costs.expected_c_round(by_width, [0.0, 0.0, 0.0]) == pytest.approx(0.1)
    assert round_costs.expected_c_round(by_width, [1.0, 1.0, 1.0]) == pytest.approx(0.4)
    # n = 2 needs 3 tokens: the width-4 program (there is no width 3)
    assert round_costs.expected_c_round(by_width, [1.0, 1.0, 0.0]) == pytest.approx(0.4)
    assert round_costs.expected_c_round({1: 0.3}, [0.9, 0.9]) == pytest.approx(0.3)


def test_a_chunk_reading_drafter_is_timed_at_each_width_and_a_chain_at_one():
    _, target, draft = td.aware_pair()
    assert round_costs.widths(drafters.TargetAwareDrafter(draft, 3)) == (1, 2, 4)
    assert round_costs.widths(drafters.ChainDrafter(draft, 3)) == (1,)
    # A tree over a target-aware base re-reads its accepted path as its base does.
    tree = tree_drafter.TreeDrafter(drafters.TargetAwareDrafter(draft, 3), trees.as_tree((2, 1, 1)))
    assert round_costs.widths(tree) == (1, 2, 4)
    assert round_costs.widths(object()) == (1,)  # a drafter without the method: one width
    spec = round_costs.RoundCostSpec(gammas=(2,), max_decode_len=6, round_steps=2, repeats=1)
    inputs = td.prompts([3, 4], 5)
    costs = round_costs.round_costs(
        target, {"aware": lambda g: drafters.TargetAwareDrafter(draft, g)}, inputs, spec)
    by_width = costs["c_round_by_width"]["aware"][2]
    assert sorted(by_width) == [1, 2, 3]
    assert all(math.isfinite(c) and c >= 0 for c in by_width.values())
    assert costs["c_round"]["aware"][2] == by_width[3]  # the widest: every draft accepted
    assert costs["draft_calls_per_round"]["aware"][2] == 2
    assert costs["target_step_s"] > 0 and costs["verify_cost"][2] > 0


def test_proposals_run_each_drafter_including_a_tree_whose_state_grows_per_path():
    _, target, draft = td.aware_pair()
    inputs = td.prompts([3, 4], 5)
    rng = jax.random.PRNGKey(0)
    chain = drafters.TargetAwareDrafter(draft, 2)
    for drafter in (chain, tree_drafter.TreeDrafter(chain, trees.as_tree((2, 1)))):
        acc, calls = round_costs.proposals(target, drafter, inputs, rng,
                                           verifier=verifiers.GreedyVerifier(), num_steps=3,
                                           max_decode_len=6)
        assert np.isfinite(float(acc)) and float(calls) == 2.0


def test_the_start_alone_computes_the_start_that_the_proposals_read():
    # c_round is (start + proposals - start alone) / round_steps: the start alone must still
    # run the target's prefill and the draft's init. A NaN in the target's weights reaches its
    # states, so it must reach the start-alone result too (it read 0.0 when the unused start
    # was compiled away, and c_round counted the prefill 1/round_steps per proposal).
    _, target, draft = td.aware_pair()
    broken = target.replace(params=jax.tree_util.tree_map(
        lambda a: np.full(np.shape(a), np.nan, np.asarray(a).dtype), target.params))
    chain = drafters.TargetAwareDrafter(draft, 2)
    kw = dict(verifier=verifiers.GreedyVerifier(), max_decode_len=6)
    inputs, rng = td.prompts([3, 4], 5), jax.random.PRNGKey(0)
    assert np.isfinite(float(round_costs.proposals(target, chain, inputs, rng, num_steps=0,
                                                   **kw)[0]))
    assert np.isnan(float(round_costs.proposals(broken, chain, inputs, rng, num_steps=0,
                                                **kw)[0]))
