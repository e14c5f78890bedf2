"""Tests for speculative.theory against the numbers printed in [L] and values derived from it.

[L] = Leviathan et al., ICML 2023.
"""


import numpy as np
import pytest

from speculative.measure import analysis as theory

# [L] Table 1 (§3.5), c = c_hat = 0: (alpha, gamma, operations, speed).
TABLE1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha,gamma,ops,speed", TABLE1)
def test_table1(alpha, gamma, ops, speed):
    assert round(theory.operations_factor(alpha, gamma, 0.0), 2) == ops
    assert round(theory.speedup(alpha, gamma, 0.0), 2) == speed


# [L] Table 4 (A.3): (row, alpha, gamma, c, printed Exp, recomputed Exp from
# paper.md §3).
TABLE4 = [
    ("EnDe small T0", 0.75, 7, 0.02, 3.2, 3.157),
    ("EnDe base T0", 0.8, 7, 0.04, 3.3, 3.251),
    ("EnDe large T0", 0.82, 7, 0.11, 2.5, 2.497),
    ("EnDe small T1", 0.62, 7, 0.02, 2.3, 2.258),
    ("EnDe base T1", 0.68, 5, 0.04, 2.4, 2.347),
    ("EnDe large T1", 0.71, 3, 0.11, 2.0, 1.934),
    ("CNNDM small T0", 0.65, 5, 0.02, 2.4, 2.402),
    ("CNNDM base T0", 0.73, 5, 0.04, 2.6, 2.619),
    ("CNNDM large T0", 0.74, 3, 0.11, 2.0, 2.025),
    ("CNNDM small T1", 0.53, 5, 0.02, 1.9, 1.891),
    ("CNNDM base T1", 0.55, 3, 0.04, 1.8, 1.803),
    ("CNNDM large T1", 0.56, 3, 0.11, 1.6, 1.541),
]
# For three rows Thm. 3.8 on the printed alpha, c does not round to the printed
# Exp: EnDe base T1 (2.347 vs 2.4) and EnDe large T1 (1.934 vs 2.0), as
# paper.md notes, and also CNNDM large T1 (1.541 vs 1.6), which paper.md
# wrongly lists as agreeing. The paper printed alpha and c rounded to 2
# decimals (unrounded values unpublished). Speedup rises with alpha and falls
# with c, so over the rounding box the largest value is at (alpha + 0.005,
# c - 0.005); for all three rows that corner (2.423, 1.971, 1.570) does round
# to the printed Exp, so the mismatch is explained by rounding. We assert the
# recomputation to 3 decimals for all 12 rows, the printed rounding for the 9
# others, and for these 3 that the printed value is reachable in the box (and
# not reached at the printed point, so a formula change "fixing" them shows).
TABLE4_PRINT_MISMATCH = {"EnDe base T1", "EnDe large T1", "CNNDM large T1"}


@pytest.mark.parametrize("row,alpha,gamma,c,printed,recomputed", TABLE4)
def test_table4_expected_speedup(row, alpha, gamma, c, printed, recomputed):
    value = theory.speedup(alpha, gamma, c)
    assert round(value, 3) == recomputed
    if row in TABLE4_PRINT_MISMATCH:
        assert round(value, 1) != printed
    else:
        assert round(value, 1) == printed
    # Within the rounding box of the printed alpha and c every row, including
    # the 3 mismatches, can produce the printed Exp.
    assert (
        round(theory.speedup(alpha - 0.005, gamma, c + 0.005), 1)
        <= printed
        <= round(theory.speedup(alpha + 0.005, gamma, c - 0.005), 1)
    )


# paper.md Appendix "Derived values": optimal gamma (and its speedup) over
# integer gamma in 1..50, rows alpha, columns c.
GRID_CS = [0.01, 0.02, 0.05, 0.1, 0.2]
GRID = {
    0.5: [(5, 1.88), (4, 1.79), (3, 1.63), (2, 1.46), (1, 1.25)],
    0.6: [(7, 2.30), (6, 2.17), (4, 1.92), (3, 1.67), (2, 1.40)],
    0.7: [(9, 2.97), (8, 2.76), (6, 2.35), (4, 1.98), (3, 1.58)],
    0.75: [(11, 3.49), (9, 3.20), (7, 2.67), (5, 2.19), (3, 1.71)],
    0.8: [(14, 4.23), (11, 3.82), (8, 3.09), (6, 2.47), (4, 1.87)],
    0.85: [(17, 5.39), (14, 4.75), (10, 3.70), (7, 2.85), (5, 2.08)],
    0.9: [(24, 7.49), (19, 6.37), (13, 4.67), (10, 3.43), (7, 2.37)],
    0.95: [(40, 12.54), (31, 9.95), (21, 6.60), (15, 4.48), (10, 2.87)],
}


@pytest.mark.parametrize("max_gamma", [50, 64])
def test_optimal_gamma_grid(max_gamma):
    alphas = np.array(sorted(GRID))
    table = theory.optimal_gamma_table(alphas, GRID_CS, max_gamma=max_gamma)
    assert table.shape == (len(alphas), len(GRID_CS))
    for i, alpha in enumerate(alphas):
        for j, c in enumerate(GRID_CS):
            gamma, speed = GRID[alpha][j]
            assert table[i, j] == gamma, (alpha, c)
            assert theory.optimal_gamma(alpha, c, max_gamma=max_gamma) == gamma
            assert round(theory.speedup(alpha, gamma, c), 2) == speed


def _brute_force_speedup(alpha, gamma, c, verify_cost=1.0):
    tokens = sum(alpha**k for k in range(gamma + 1))
    return tokens / (gamma * c + verify_cost)


def test_optimal_gamma_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        alpha = float(rng.uniform(0.0, 1.0))
        c = float(rng.choice([0.0, rng.uniform(0.0, 0.3), rng.uniform(0.0, 2.0)]))
        verify = float(rng.choice([1.0, rng.uniform(1.0, 2.0)]))
        max_gamma = int(rng.integers(1, 40))
        speeds = [_brute_force_speedup(alpha, g, c, verify) for g in range(1, max_gamma + 1)]
        expected = int(np.argmax(speeds)) + 1
        got = theory.optimal_gamma(alpha, c, max_gamma=max_gamma, verify_cost=verify)
        # Different float evaluation orders could only disagree on a near-tie.
        assert got == expected or np.isclose(speeds[got - 1], speeds[expected - 1], rtol=1e-12), (
            alpha,
            c,
            verify,
        )


def test_optimal_gamma_ties_and_edges():
    # Speedup 1/(gamma c + 1) at alpha = 0 is largest at gamma = 1.
    assert theory.optimal_gamma(0.0, 0.1) == 1
    # alpha = 0, c = 0: every gamma gives 1; ties go to the smallest gamma.
    assert theory.optimal_gamma(0.0, 0.0) == 1
    # c = 0: speedup grows forever, so the cap is returned.
    assert theory.optimal_gamma(0.5, 0.0, max_gamma=17) == 17
    assert theory.optimal_gamma(0.8, 0.02, max_gamma=1) == 1
    assert isinstance(theory.optimal_gamma(0.8, 0.02), int)


def test_min_improvement_is_speedup_at_gamma_one():
    alphas = np.linspace(0.0, 1.0, 21)
    for c in [0.0, 0.01, 0.11, 0.5, 2.0]:
        np.testing.assert_allclose(
            theory.min_improvement(alphas, c), theory.speedup(alphas, 1, c), rtol=1e-14
        )
    # Cor. 3.9: an improvement exists iff alpha > c.
    assert theory.min_improvement(0.3, 0.2) > 1.0
    assert theory.min_improvement(0.2, 0.2) == pytest.approx(1.0)


def test_expected_tokens_limits():
    for gamma in [0, 1, 3, 7, 20]:
        assert theory.expected_tokens(1.0, gamma) == gamma + 1
        assert theory.expected_tokens(0.0, gamma) == 1.0
        assert theory.expected_tokens(1.0 - 1e-12, gamma) == pytest.approx(gamma + 1, rel=1e-9)
        assert theory.expected_tokens(0.5, gamma) == pytest.approx(
            sum(0.5**k for k in range(gamma + 1)), rel=1e-14
        )
    np.testing.assert_array_equal(
        theory.expected_tokens(np.array([0.0, 0.3, 0.9, 1.0]), 0), np.ones(4)
    )
    # Vectorised, broadcasting alpha [3, 1] against gamma [4].
    alphas = np.array([[0.2], [0.75], [1.0]])
    gammas = np.array([0, 1, 3, 7])
    got = theory.expected_tokens(alphas, gammas)
    assert got.shape == (3, 4)
    want = [[sum(a**k for k in range(g + 1)) for g in gammas] for a in alphas[:, 0]]
    np.testing.assert_allclose(got, want, rtol=1e-14)
    # paper.md: Eq. 1 for Table 2 rows EnDe T0 small/base/large, CNNDM T1 small.
    np.testing.assert_allclose(
        theory.expected_tokens(np.array([0.75, 0.8, 0.82, 0.53]), [7, 7, 7, 5]),
        [3.600, 4.161, 4.420, 2.081],
        atol=5e-4,
    )
    # Large gamma approaches 1/(1-alpha).
    assert theory.expected_tokens(0.9, 2000) == pytest.approx(10.0)


def test_memory_access_factor_is_eq1():
    assert theory.memory_access_factor(0.8, 5) == pytest.approx(3.68928)
    assert theory.memory_access_factor(0.0, 5) == 1.0
    assert theory.memory_access_factor(1.0, 5) == 6.0


def test_operations_factor():
    # Plain decoding costs nothing extra; a useless draft costs gamma + 1 + ...
    assert theory.operations_factor(0.7, 0, 0.3) == 1.0
    assert theory.operations_factor(0.0, 3, 0.1) == pytest.approx(4.3)
    assert theory.operations_factor(1.0, 3, 0.0) == 1.0


def test_verify_cost_lowers_speedup_and_optimal_gamma():
    alpha, c = 0.8, 0.02
    for gamma in [1, 4, 11]:
        assert theory.speedup(alpha, gamma, c, verify_cost=1.3) < theory.speedup(alpha, gamma, c)
    assert theory.speedup(alpha, 0, c, verify_cost=1.3) == 1.0
    base = theory.optimal_gamma(alpha, c)
    # Verification cost growing with the number of positions scored.
    def growing(g):
        return 1.0 + 0.05 * g
    assert theory.optimal_gamma(alpha, c, verify_cost=growing) < base
    assert theory.speedup(alpha, 4, c, verify_cost=growing) == pytest.approx(
        _brute_force_speedup(alpha, 4, c, 1.2)
    )
    # A callable equal to the constant reproduces the scalar exactly.
    np.testing.assert_allclose(
        theory.speedup(alpha, np.arange(1, 9), c, verify_cost=lambda g: 1.0),
        theory.speedup(alpha, np.arange(1, 9), c),
    )
    table = theory.optimal_gamma_table([0.6, 0.9], [0.01, 0.1], verify_cost=growing)
    assert np.all(table < theory.optimal_gamma_table([0.6, 0.9], [0.01, 0.1]))


@pytest.mark.parametrize(
    "alpha,expected", [(0.75, 3.303), (0.75, 3.303), (0.8, 3.865), (0.87, 4.907)]
)
def test_argmax_lenience_speedups(alpha, expected):
    # [L] A.5: argmax lenience l = 1, 0.5, 0.3, 0.1 -> alpha; c = 0.015, gamma=8.
    assert round(theory.speedup(alpha, 8, 0.015), 3) == expected


def test_bigram_speedup():
    # [L] §3.6 / §4.2: EnDe bigram, alpha = 0.2, c = 0, gamma = 3 -> "1.25X".
    assert theory.speedup(0.2, 3, 0.0) == pytest.approx(1.248, abs=1e-12)


def test_oracle_dynamic_gamma_closed_forms():
    assert theory.oracle_dynamic_gamma_speedup(0.8, 0.0) == pytest.approx(5.0)
    assert theory.oracle_dynamic_gamma_speedup(0.8, 0.02) == pytest.approx(1.0 / (0.02 * 0.8 + 0.2))
    assert theory.oracle_dynamic_gamma_speedup(
        0.8, 0.02, include_rejected_draft=True
    ) == pytest.approx(1.0 / 0.22)
    assert theory.oracle_dynamic_gamma_speedup(1.0, 0.1) == pytest.approx(10.0)
    assert theory.oracle_dynamic_gamma_speedup(1.0, 0.0) == np.inf
    assert theory.oracle_dynamic_gamma_speedup(0.0, 0.3) == 1.0
    # A callable verify_cost is averaged over the geometric run length.
    for include in [False, True]:
        for scalar in [1.0, 1.4]:
            assert theory.oracle_dynamic_gamma_speedup(
                0.7, 0.03, verify_cost=lambda g, s=scalar: s, include_rejected_draft=include
            ) == pytest.approx(
                theory.oracle_dynamic_gamma_speedup(
                    0.7, 0.03, verify_cost=scalar, include_rejected_draft=include
                ),
                rel=1e-10,
            )


def test_oracle_matches_monte_carlo():
    # Simulate rounds: K ~ Geom, tokens K + 1, cost c K + v(K) (v(0) = 1).
    rng = np.random.default_rng(1)
    alpha, c = 0.8, 0.05
    def verify(g):
        return 1.0 + 0.02 * g
    k = rng.geometric(1.0 - alpha, size=400_000) - 1
    cost = c * k + np.where(k > 0, 1.0 + 0.02 * k, 1.0)
    mc = (k + 1).sum() / cost.sum()
    assert theory.oracle_dynamic_gamma_speedup(alpha, c, verify_cost=verify) == pytest.approx(
        mc, rel=5e-3
    )


def test_expected_rounds_known_answers_and_monte_carlo():
    # alpha = 0: one token per round; alpha = 1: gamma + 1 per round (the last may overshoot).
    assert theory.expected_rounds(0.0, 3, 10) == 10.0
    assert theory.expected_rounds(1.0, 3, 10) == 3.0  # ceil(10 / 4)
    assert theory.expected_rounds(0.6, 4, 0) == 0.0
    assert theory.expected_rounds(0.6, 4, 1) == 1.0
    # gamma = 1, n = 2: one round if the draft is accepted, else two.
    assert theory.expected_rounds(0.3, 1, 2) == pytest.approx(0.3 * 1 + 0.7 * 2)
    # Long sequences: n / Eq. 1 plus a bounded overshoot term.
    n = 2000
    ratio = theory.expected_rounds(0.7, 3, n) * theory.expected_tokens(0.7, 3) / n
    assert ratio == pytest.approx(1.0, abs=2e-3)
    # Monte Carlo of Algorithm 1's round yields under the i.i.d. model.
    rng = np.random.default_rng(0)
    alpha, gamma, tokens = 0.65, 3, 13
    accepted = np.minimum(rng.geometric(1.0 - alpha, size=(100_000, tokens)) - 1, gamma)
    reached = np.cumsum(accepted + 1, axis=1) >= tokens
    rounds = np.argmax(reached, axis=1) + 1
    assert theory.expected_rounds(alpha, gamma, tokens) == pytest.approx(rounds.mean(),
                                                                         rel=5e-3)


def test_oracle_is_upper_bound_on_fixed_gamma():
    alphas = np.linspace(0.0, 0.99, 34)[:, None]
    cs = np.array([0.0, 0.01, 0.05, 0.2, 0.5, 1.0])[None, :]
    gain = theory.oracle_gain_over_fixed(alphas, cs)
    assert gain.shape == (34, 6)
    assert np.all(gain >= 1.0 - 1e-12)
    # Drafting the rejected token too is not a bound when alpha < c.
    assert theory.oracle_gain_over_fixed(0.1, 0.5, include_rejected_draft=True) < 1.0


def test_oracle_gain_typical_values():
    # [L] §3.5: "up to ~60% higher ... for typical values of c and alpha".
    # Over alpha in [0.6, 0.9] x c in [0.01, 0.05] we find gains 1.072 .. 1.4755
    # (max at alpha = 0.9, c = 0.05; 1.426 with include_rejected_draft=True).
    # Beyond the box, alpha = 0.95, c = 0.05 gives 1.554, i.e. the paper's ~60%.
    alphas = np.linspace(0.6, 0.9, 31)[:, None]
    cs = np.linspace(0.01, 0.05, 41)[None, :]
    for include in [False, True]:
        gain = theory.oracle_gain_over_fixed(alphas, cs, include_rejected_draft=include)
        assert np.all(gain > 1.0)
        assert np.all(gain < 1.7)
    gain = theory.oracle_gain_over_fixed(alphas, cs)
    assert gain.max() == pytest.approx(1.4755, abs=1e-4)
    assert theory.oracle_gain_over_fixed(0.95, 0.05) == pytest.approx(1.554, abs=1e-3)


@pytest.mark.parametrize(
    "call,bad",
    [
        (lambda: theory.expected_tokens(1.2, 3), "1.2"),
        (lambda: theory.expected_tokens(-0.1, 3), "-0.1"),
        (lambda: theory.expected_tokens(np.array([0.5, 1.5]), 3), "1.5"),
        (lambda: theory.expected_tokens(float("nan"), 3), "nan"),
        (lambda: theory.expected_tokens(0.5, -1), "-1"),
        (lambda: theory.expected_tokens(0.5, 2.5), "2.5"),
        (lambda: theory.speedup(0.5, 3, -0.01), "-0.01"),
        (lambda: theory.speedup(0.5, 3, 0.01, verify_cost=0.0), "0.0"),
        (lambda: theory.speedup(0.5, 3, 0.01, verify_cost=lambda g: -2.0), "-2.0"),
        (lambda: theory.operations_factor(0.5, 3, -1.0), "-1.0"),
        (lambda: theory.min_improvement(2.0, 0.1), "2.0"),
        (lambda: theory.optimal_gamma(0.5, 0.01, max_gamma=0), "0"),
        (lambda: theory.optimal_gamma(0.5, 0.01, max_gamma=3.5), "3.5"),
        (lambda: theory.optimal_gamma_table([0.5], [0.01], max_gamma=-4), "-4"),
        (lambda: theory.oracle_dynamic_gamma_speedup(1.01, 0.1), "1.01"),
        (lambda: theory.oracle_gain_over_fixed(0.8, -0.5), "-0.5"),
        (lambda: theory.expected_rounds(0.5, 3, -2), "num_tokens=-2"),
        (lambda: theory.expected_rounds(1.5, 3, 10), "1.5"),
    ],
)
def test_bad_inputs_raise(call, bad):
    with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
        call()


# ----------------------------------------------------------------------------------------------
# Token trees.


def test_tree_tokens_reduce_to_eq1_for_chains_and_count_by_hand():
    for a in (0.0, 0.3, 0.8, 1.0):
        for g in (1, 3, 6):
            assert theory.tree_expected_tokens((1,) * g, [a]) == pytest.approx(
                theory.expected_tokens(a, g))
    # (2, 1): depth 1 passed w.p. 1 - (1 - .6)(1 - .5) = .8, then depth 2 w.p. .6.
    assert theory.tree_expected_tokens((2, 1), [0.6, 0.5]) == pytest.approx(1 + 0.8 + 0.8 * 0.6)
    assert theory.tree_nodes((2, 3)) == 8
    with pytest.raises(ValueError, match="rank_accept"):
        theory.tree_expected_tokens((2,), [1.2, 0.1])
    with pytest.raises(ValueError, match="measure more ranks"):
        theory.tree_expected_tokens((3,), [0.5, 0.1])


def test_tree_rates_per_depth():
    """`[D, R]` rates: depth k uses row min(k, D); equal rows are the `[R]` rates; a draft whose
    later guesses are weaker gets shorter chains."""
    same = [[0.7, 0.4], [0.7, 0.4]]
    for shape in [(1, 1, 1), (2, 1), (2, 2, 1)]:
        assert theory.tree_expected_tokens(shape, same) == pytest.approx(
            theory.tree_expected_tokens(shape, [0.7, 0.4]))
    falling = [[0.9], [0.5]]  # depth 1: 0.9; depth 2 and deeper: 0.5
    assert theory.tree_expected_tokens((1, 1), falling) == pytest.approx(1 + 0.9 + 0.9 * 0.5)
    assert theory.tree_expected_tokens((1, 1, 1), falling) == pytest.approx(
        1 + 0.9 + 0.45 + 0.225)
    two = [[0.9, 0.5], [0.5, 0.4]]  # a second child at depth 2: P = 1 - 0.5 * 0.6
    assert theory.tree_expected_tokens((1, 2), two) == pytest.approx(1 + 0.9 + 0.9 * 0.7)
    steady = theory.best_tree([0.9], 0.02, 1.2, max_nodes=8)
    weaker = theory.best_tree([[0.9], [0.5]], 0.02, 1.2, max_nodes=8)
    assert len(weaker.chain) < len(steady.chain)
    for bad in ([[[0.5]]], [[0.5], [1.5]]):
        with pytest.raises(ValueError, match="per depth and rank"):
            theory.tree_expected_tokens((1,), bad)


def test_best_tree_branches_only_when_verification_is_cheap():
    rates = [0.7, 0.4, 0.2, 0.1]
    costly = theory.best_tree(rates, 0.02, lambda n: 1 + 0.15 * n, max_nodes=16)
    assert costly.tree == costly.chain  # every extra node costs more than it gains
    free = theory.best_tree(rates, 0.02, 1.0, max_nodes=16)
    assert max(free.tree) > 1 and free.tree_speedup > free.chain_speedup
    assert free.tree_tokens == pytest.approx(theory.tree_expected_tokens(free.tree, rates))
    # The search is exhaustive over its shapes: no listed shape predicts more.
    best = max(theory.tree_speedup(s, rates, 0.02, 1.0)
               for s in theory.tree_shapes(8, 16, len(rates)))
    assert free.tree_speedup == pytest.approx(best)


def test_expected_batch_rounds_waits_for_the_slowest_row():
    # one row: expected_rounds; known answers at alpha 0 and 1; more rows never fewer rounds
    assert theory.expected_batch_rounds(0.7, 3, [20]) == pytest.approx(
        theory.expected_rounds(0.7, 3, 20))
    assert theory.expected_batch_rounds(1.0, 2, [7, 9, 3]) == pytest.approx(3.0)  # ceil(9 / 3)
    assert theory.expected_batch_rounds(0.0, 4, [5, 2]) == pytest.approx(5.0)
    assert theory.expected_batch_rounds(0.5, 2, []) == 0.0
    one = theory.expected_batch_rounds(0.78, 2, [48])
    many = theory.expected_batch_rounds(0.78, 2, [48] * 64)
    assert one < many < 1.3 * one
    # two independent rows: E[max] = sum_r 1 - P(R_1 <= r) P(R_2 <= r), checked by sampling
    rng = np.random.default_rng(0)

    def rounds(n):
        held, r = 0, 0
        while held < n:
            accepted = 0
            while accepted < 2 and rng.random() < 0.6:
                accepted += 1
            held, r = held + accepted + 1, r + 1
        return r

    sampled = np.mean([max(rounds(10), rounds(6)) for _ in range(20000)])
    assert theory.expected_batch_rounds(0.6, 2, [10, 6]) == pytest.approx(sampled, abs=0.05)
    with pytest.raises(ValueError, match="lengths"):
        theory.expected_batch_rounds(0.5, 2, [3, -1])
