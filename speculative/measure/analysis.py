"""Closed-form analysis of speculative decoding (Leviathan et al., ICML 2023, §3).

Everything here is the paper's i.i.d. model: each drafted token is accepted
independently with probability ``alpha = E[beta]`` (Cor. 3.6), so one run of
Algorithm 1 with draft length ``gamma`` emits a capped geometric number of
tokens. Notation follows [L]: target ``M_p``, draft ``M_q``, and

  * ``alpha``  acceptance rate in [0, 1] (Def. 3.1, Cor. 3.6);
  * ``gamma``  number of draft tokens per round, a non-negative integer;
  * ``c``      time of one draft step / time of one target step (Def. 3.7);
  * ``c_hat``  arithmetic ops per token of the draft / of the target (Def. 3.10);
  * ``verify_cost`` time of one target call on ``gamma + 1`` tokens / time of
    one target call on 1 token. The paper assumes 1 (spare parallel compute);
    a measured value, or a callable ``gamma -> cost``, generalises Thm. 3.8.

Functions accept Python scalars or numpy arrays and broadcast like numpy;
scalar inputs give a Python ``float`` (or ``int`` for ``optimal_gamma``).
Invalid inputs raise ``ValueError`` naming the bad value and the fix.

Example (Table 1, row alpha=0.8, gamma=5, c = c_hat = 0)::

  >>> round(speedup(0.8, 5, c=0.0), 2), round(operations_factor(0.8, 5, 0.0), 2)
  (3.69, 1.63)

This module is numpy only: no jax, no gin, no plotting (see
``scripts/plot_theory.py`` for Figure 3).
"""

import dataclasses
from typing import Callable, Tuple, Union

import numpy as np

ArrayLike = Union[float, int, np.ndarray]
VerifyCost = Union[float, Callable[[int], float]]

# The oracle's run length K is geometric; a callable verify_cost is averaged
# over K until the remaining tail mass is below this (or _ORACLE_MAX_RUN).
_ORACLE_TAIL = 1e-13
_ORACLE_MAX_RUN = 100_000


def _show(x: np.ndarray, mask: np.ndarray) -> str:
    """Formats the offending entries of `x` for an error message."""
    x = np.asarray(x)
    if x.ndim == 0:
        return repr(x.item())
    return f"{x[mask].ravel()[:5].tolist()} (first bad entries)"


def _alpha(alpha: ArrayLike) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    bad = ~((a >= 0.0) & (a <= 1.0))  # Also catches NaN.
    if np.any(bad):
        raise ValueError(
            f"alpha must lie in [0, 1], got alpha={_show(a, bad)}; pass the mean "
            "acceptance rate E[beta] = E[sum_x min(p(x), q(x))] (Cor. 3.6)."
        )
    return a


def _gamma(gamma: ArrayLike, name: str = "gamma", minimum: int = 0):
    g = np.asarray(gamma)
    gf = np.asarray(g, dtype=np.float64)
    bad = ~(np.isfinite(gf) & (gf == np.round(gf)) & (gf >= minimum))
    if g.dtype == np.bool_ or np.any(bad):
        raise ValueError(
            f"{name} must be an integer >= {minimum}, got {name}={_show(g, bad)}; "
            f"pass the number of draft tokens per round as an int (e.g. {name}=4)."
        )
    return gf.astype(np.int64)


def _nonneg(x: ArrayLike, name: str) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    bad = ~(v >= 0.0) | ~np.isfinite(v)
    if np.any(bad):
        raise ValueError(
            f"{name} must be a finite number >= 0, got {name}={_show(v, bad)}; it "
            "is a cost ratio draft/target (Def. 3.7 / 3.10), e.g. 0.02."
        )
    return v


def _verify_costs(verify_cost: VerifyCost, gamma: np.ndarray) -> np.ndarray:
    """Returns T_target(gamma+1 tokens)/T_target(1 token) for each `gamma`.

    By definition the ratio is exactly 1 at gamma = 0 (a plain decoding step), so
    a callable is only evaluated for gamma >= 1 and a scalar only applies there.
    """
    gamma = np.asarray(gamma, dtype=np.int64)
    if callable(verify_cost):
        cache = {}
        for g in np.unique(gamma[gamma > 0]).tolist():
            cache[g] = float(verify_cost(int(g)))
        costs = np.ones(gamma.shape, dtype=np.float64)
        for g, value in cache.items():
            costs[gamma == g] = value
        shown = np.array(list(cache.values()), dtype=np.float64)
        source = "verify_cost(gamma) returned"
    else:
        shown = np.asarray(verify_cost, dtype=np.float64)
        costs = np.where(gamma > 0, shown, 1.0)
        source = "got verify_cost="
    bad = ~(shown > 0.0) | ~np.isfinite(shown)
    if np.any(bad):
        raise ValueError(
            f"verify_cost must be finite and > 0, {source} {_show(shown, bad)}; it "
            "is T_target(gamma+1 tokens) / T_target(1 token), 1.0 in the paper."
        )
    return costs


def _out(x: np.ndarray):
    x = np.asarray(x)
    return float(x) if x.ndim == 0 else x


def _expected_tokens(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Eq. 1 on validated arrays, accurate near alpha = 1 (no cancellation)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        # 1 - a**(g+1) = -expm1((g+1) log1p(a - 1)): no cancellation near a = 1.
        numer = -np.expm1((g + 1) * np.log1p(a - 1.0))
        value = numer / (1.0 - a)
    value = np.where(a == 0.0, 1.0, value)
    return np.where(a == 1.0, g + 1.0, value)


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike):
    """Expected tokens emitted by one run of Algorithm 1, [L] Eq. (1).

    E[#tokens] = (1 - alpha^(gamma+1)) / (1 - alpha), the mean of a geometric
    variable with success probability 1 - alpha capped at gamma + 1. At
    alpha == 1 the exact limit gamma + 1 is returned; gamma == 0 gives 1.

    Args:
      alpha: acceptance rate(s) in [0, 1].
      gamma: draft length(s), non-negative integers. Broadcasts with `alpha`.

    Returns:
      float for scalar inputs, else an array of the broadcast shape.
    """
    return _out(_expected_tokens(_alpha(alpha), _gamma(gamma)))


def _round_yield(a: float, g: int) -> list:
    """P(a round emits k tokens), k = 1 .. g + 1, under the i.i.d. model: alpha^(k-1) (1 -
    alpha) for k <= gamma, alpha^gamma for k = gamma + 1."""
    return [a ** (k - 1) * (1.0 - a) for k in range(1, g + 1)] + [a ** g]


def expected_rounds(alpha: float, gamma: int, num_tokens: int) -> float:
    """Expected rounds of Algorithm 1 until a sequence holds `num_tokens` tokens.

    Eq. (1) gives the mean yield of one round; a finite sequence also pays for its last round,
    which may emit more tokens than the sequence still needs (the rest are cut at EOS). Under the
    i.i.d. model a round emits k tokens with probability alpha^(k-1) (1 - alpha) for k <= gamma
    and alpha^gamma for k = gamma + 1, so with r(m) the expected rounds to emit at least m tokens,

      r(m) = 1 + sum_k P(k) r(m - k),   r(m <= 0) = 0,

    computed exactly in O(num_tokens * gamma). r(n) ~ n / E[#tokens] for large n; r(1) = 1.
    """
    a = float(_alpha(alpha))
    g = int(_gamma(gamma))
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) \
            or num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens!r} is invalid: give the sequence length in "
                         "tokens, an int >= 0.")
    n = int(num_tokens)
    probs = _round_yield(a, g)
    r = np.zeros(n + 1)
    for m in range(1, n + 1):
        r[m] = 1.0 + sum(p * r[max(m - k, 0)] for k, p in enumerate(probs, start=1))
    return float(r[n])


def expected_batch_rounds(alpha: float, gamma: int, lengths) -> float:
    """Expected rounds of a batch whose rows need `lengths[b]` tokens each: the loop runs until
    its slowest row is done, so this is E[max_b R_b] with R_b the rounds of row b under the
    i.i.d. model (`expected_rounds`; the rows independent). Exact: the law of the tokens a row
    holds after r rounds, P(R_b <= r) = P(T_r >= lengths[b]), and E[max] = sum_r (1 - prod_b
    P(R_b <= r)). One row gives `expected_rounds`; more rows give more (B = 64 rows of 48
    tokens at alpha 0.78, gamma 2: about 1.2x the rounds of one)."""
    a = float(_alpha(alpha))
    g = int(_gamma(gamma))
    need = np.asarray(lengths, np.int64).reshape(-1)
    if need.size and need.min() < 0:
        raise ValueError(f"lengths={lengths!r}: give each row's tokens, ints >= 0.")
    n = int(need.max()) if need.size else 0
    probs = _round_yield(a, g)
    held = np.zeros(n + 1)  # the law of min(tokens held, n) after r rounds
    held[0] = 1.0
    total = 0.0
    for _ in range(n + 1):  # every round emits at least one token
        at_least = np.cumsum(held[::-1])[::-1]  # P(T_r >= m)
        pending = 1.0 - float(np.prod(at_least[need]))
        if pending <= 1e-12:
            break
        total += pending
        moved = np.zeros(n + 1)
        moved[n] = held[n]
        for k, p in enumerate(probs, start=1):
            np.add.at(moved, np.minimum(np.arange(n) + k, n), p * held[:n])
        held = moved
    return total


def memory_access_factor(alpha: ArrayLike, gamma: ArrayLike):
    """Factor by which reads of the target's weights and KV cache shrink ([L] §3.4).

    The target's weights and KV cache are read once per run of Algorithm 1
    (one parallel call on gamma + 1 positions) instead of once per token, so
    baseline reads / speculative reads = E[#tokens per run] =
    (1 - alpha^(gamma+1)) / (1 - alpha), i.e. Eq. (1). Values > 1 mean fewer
    reads. The draft's own (much smaller) reads are not counted.
    """
    return expected_tokens(alpha, gamma)


def speedup(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike, verify_cost: VerifyCost = 1.0):
    """Expected walltime improvement factor, [L] Theorem 3.8, generalised.

    One round costs gamma * c + verify_cost target-step units and yields
    Eq. (1) tokens, so

      speedup = (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma * c + verify_cost)).

    With verify_cost = 1 this is exactly Thm. 3.8 (the paper assumes gamma + 1
    parallel target evaluations cost one serial one). At gamma = 0 the round is
    a plain decoding step and the result is 1.

    Args:
      alpha: acceptance rate(s) in [0, 1].
      gamma: draft length(s), non-negative integers.
      c: draft/target cost coefficient(s) >= 0 (Def. 3.7).
      verify_cost: T_target(gamma+1 tokens) / T_target(1 token), > 0. A scalar,
        or a callable gamma -> cost (e.g. measured per gamma).

    Returns:
      float for scalar inputs, else an array of the broadcast shape.
    """
    a, g, c = _alpha(alpha), _gamma(gamma), _nonneg(c, "c")
    cost = g * c + _verify_costs(verify_cost, g)
    return _out(_expected_tokens(a, g) / cost)


def min_improvement(alpha: ArrayLike, c: ArrayLike):
    """Guaranteed improvement (1 + alpha) / (1 + c), [L] Corollary 3.9.

    This is Thm. 3.8 at gamma = 1; it exceeds 1 exactly when alpha > c.
    """
    a, c = _alpha(alpha), _nonneg(c, "c")
    return _out((1.0 + a) / (1.0 + c))


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike):
    """Expected factor of increase in total arithmetic, [L] Theorem 3.11.

    One run costs gamma draft steps (c_hat each) plus gamma + 1 target
    positions, divided by Eq. (1) tokens:
    (1 - alpha)(gamma * c_hat + gamma + 1) / (1 - alpha^(gamma+1)).
    """
    a, g, ch = _alpha(alpha), _gamma(gamma), _nonneg(c_hat, "c_hat")
    return _out((g * ch + g + 1.0) / _expected_tokens(a, g))


def _speedup_curve(
    a: np.ndarray, c: np.ndarray, max_gamma: int, verify_cost: VerifyCost
) -> np.ndarray:
    """Thm. 3.8 for gamma = 1..max_gamma on a new trailing axis [..., max_gamma]."""
    gammas = np.arange(1, max_gamma + 1)
    costs = _verify_costs(verify_cost, gammas)
    a, c = np.broadcast_arrays(a, c)
    tokens = _expected_tokens(a[..., None], gammas)
    return tokens / (gammas * c[..., None] + costs)


def _max_gamma(max_gamma: int) -> int:
    return int(_gamma(max_gamma, name="max_gamma", minimum=1))


def optimal_gamma(
    alpha: float, c: float, max_gamma: int = 64, verify_cost: VerifyCost = 1.0
) -> int:
    """The integer gamma in 1..max_gamma maximising `speedup` ([L] §3.5, Fig. 3).

    Ties go to the smallest gamma. With c = 0 and verify_cost = 1 the speedup
    grows with gamma forever, so the answer is max_gamma.

    Args:
      alpha: scalar acceptance rate in [0, 1].
      c: scalar cost coefficient >= 0.
      max_gamma: largest gamma searched, >= 1.
      verify_cost: as in `speedup`.

    Returns:
      The optimal gamma as a Python int.
    """
    a, c = _alpha(alpha), _nonneg(c, "c")
    if a.ndim or c.ndim:
        raise ValueError(
            f"optimal_gamma takes scalars, got shapes {a.shape} and {c.shape}; use "
            "optimal_gamma_table(alphas, cs) for a grid."
        )
    curve = _speedup_curve(a, c, _max_gamma(max_gamma), verify_cost)
    return int(np.argmax(curve)) + 1  # argmax returns the first maximum.


def optimal_gamma_table(
    alphas: ArrayLike, cs: ArrayLike, max_gamma: int = 64, verify_cost: VerifyCost = 1.0
) -> np.ndarray:
    """Optimal gamma on an alpha x c grid, the data of [L] Figure 3.

    Returns:
      int64 array [len(alphas), len(cs)]; entry [i, j] equals
      optimal_gamma(alphas[i], cs[j], max_gamma, verify_cost). Feed it back to
      `speedup(alphas[:, None], table, cs[None, :])` for the achieved speedup.
    """
    a = np.atleast_1d(_alpha(alphas)).ravel()
    c = np.atleast_1d(_nonneg(cs, "cs")).ravel()
    curve = _speedup_curve(a[:, None], c[None, :], _max_gamma(max_gamma), verify_cost)
    return np.argmax(curve, axis=-1).astype(np.int64) + 1


def oracle_dynamic_gamma_speedup(
    alpha: ArrayLike,
    c: ArrayLike,
    verify_cost: VerifyCost = 1.0,
    include_rejected_draft: bool = False,
):
    """Upper bound with an oracle choosing gamma every round, [L] §3.5.

    Model. Let K be the length of the run of drafts the target would accept
    next; under the i.i.d. assumption P(K = k) = alpha^k (1 - alpha), uncapped.
    The oracle sets this round's gamma = K: the draft proposes exactly the K
    tokens that will be accepted, the target verifies them in one call and adds
    its own token, so a round yields K + 1 tokens and E[#tokens] = 1 / (1 -
    alpha), the paper's figure. The draft does E[K] = alpha / (1 - alpha) steps.
    By renewal-reward the speedup is E[tokens] / E[cost] with
    cost = c * K + verify_cost(K) (verify_cost(0) = 1: a round with K = 0 is a
    plain target step). With verify_cost = 1:

      speedup = 1 / (c * alpha + 1 - alpha).

    Why this default: no draft step is wasted and every round still ends with a
    target token, so it is the best any gamma schedule can do in this model
    (with verify_cost = 1 and c <= 1 it is >= Thm. 3.8 at every fixed gamma:
    per token, gamma*c + alpha^(gamma+1) >= c*(alpha + ... + alpha^(gamma+1))).
    That is what an upper bound must be; as in the paper's footnote 4, target
    verification is still paid for.

    `include_rejected_draft=True` instead models "draft until the first
    rejection": the draft also generates the (K+1)-th, rejected token, which
    standard sampling needs because the correction token is drawn from
    norm(max(0, p - q)) at that position. Then cost = c (K + 1) +
    verify_cost(K + 1) and, with verify_cost = 1, speedup = 1 / (c + 1 - alpha).
    This is realisable-looking but not a bound: for alpha < c it can fall below
    fixed gamma = 1.

    Args:
      alpha: acceptance rate(s) in [0, 1]. At alpha = 1 the limit is returned
        (1 / c, or inf at c = 0) for a scalar verify_cost.
      c: cost coefficient(s) >= 0.
      verify_cost: scalar or callable gamma -> cost, as in `speedup`; a callable
        is averaged over the geometric K (requires alpha < 1).
      include_rejected_draft: see above.

    Returns:
      float for scalar inputs, else an array of the broadcast shape.
    """
    a, c = np.broadcast_arrays(_alpha(alpha), _nonneg(c, "c"))
    extra = 1.0 if include_rejected_draft else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        if not callable(verify_cost):
            v = float(_verify_costs(verify_cost, np.array(1)))
            # Per token: E[cost] * (1 - alpha), using P(K = 0) = 1 - alpha.
            if include_rejected_draft:
                per_token = c + (1.0 - a) * v
            else:
                per_token = c * a + (1.0 - a) * ((1.0 - a) + a * v)
            return _out(1.0 / per_token)
        if np.any(a == 1.0):
            raise ValueError(
                "alpha=1 with a callable verify_cost has no finite oracle rounds; "
                "pass alpha < 1 or a scalar verify_cost."
            )
        a_max = float(np.max(a)) if a.size else 0.0
        n = (
            _ORACLE_MAX_RUN
            if a_max >= 1.0
            else int(
                min(_ORACLE_MAX_RUN, np.ceil(np.log(_ORACLE_TAIL) / np.log(max(a_max, 1e-300))) + 1)
            )
        )
        k = np.arange(max(n, 1))
        v = _verify_costs(verify_cost, k + int(extra))
        probs = (1.0 - a[..., None]) * a[..., None] ** k
        probs[..., -1] += 1.0 - probs.sum(axis=-1)  # Tail mass on the last run.
        mean_cost = c * (a / (1.0 - a) + extra) + probs @ v
        return _out((1.0 / (1.0 - a)) / mean_cost)


def oracle_gain_over_fixed(
    alpha: ArrayLike,
    c: ArrayLike,
    max_gamma: int = 64,
    verify_cost: VerifyCost = 1.0,
    include_rejected_draft: bool = False,
):
    """Oracle dynamic-gamma speedup / best fixed-gamma speedup ([L] §3.5).

    The paper says the oracle's improvement "can be up to ~60% higher" than
    with a fixed gamma "for typical values of c and alpha". With the default
    model (max_gamma = 64, verify_cost = 1) the gain over alpha in [0.6, 0.9],
    c in [0.01, 0.05] ranges from 1.07 to 1.475 (at alpha = 0.9, c = 0.05);
    it reaches 1.55 at alpha = 0.95, c = 0.05, close to the paper's ~60%.
    With include_rejected_draft=True the same box peaks at 1.43.

    Returns:
      float for scalar inputs, else an array of the broadcast shape.
    """
    a, c = np.broadcast_arrays(_alpha(alpha), _nonneg(c, "c"))
    best = np.max(_speedup_curve(a, c, _max_gamma(max_gamma), verify_cost), axis=-1)
    oracle = oracle_dynamic_gamma_speedup(a, c, verify_cost, include_rejected_draft)
    return _out(np.asarray(oracle) / best)


# ----------------------------------------------------------------------------------------------
# Token trees (speculative/decode/trees.py): b_k children per node at depth k.


def _rank_rates(rank_accept) -> np.ndarray:
    """Per-rank rates as `[D, R]`: a `[R]` sequence (the same at every depth) is one row; with
    `[D, R]`, depth i (1-based) uses row min(i, D) - 1, so the last row serves deeper levels."""
    a = np.asarray(rank_accept, dtype=np.float64)
    a = a.reshape(1, -1) if a.ndim <= 1 else a
    if (a.ndim != 2 or a.size == 0 or np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1))):
        raise ValueError(f"rank_accept={rank_accept!r} must be probabilities in [0, 1], per rank "
                         "([R]: a_j = P(the rank-j child is kept | the children before it were "
                         "rejected)) or per depth and rank ([D, R]).")
    return a


def _branching(branching) -> tuple:
    b = tuple(branching)
    if not b or any(isinstance(x, bool) or int(x) != x or x < 1 for x in b):
        raise ValueError(f"branching={branching!r} must be a non-empty tuple of ints >= 1.")
    return tuple(int(x) for x in b)


def tree_nodes(branching) -> int:
    """Drafted nodes of a tree (the root excluded): b_1 + b_1 b_2 + ... + b_1 ... b_d."""
    return int(sum(np.prod(branching[:i + 1]) for i in range(len(branching))))


def tree_expected_tokens(branching, rank_accept) -> float:
    """Expected tokens per target call of a token tree under the i.i.d. model.

    At every depth the walk tries a node's children in their drawn order; the child of rank j is
    kept with probability a_j given that the ones before it were rejected. A depth with b
    children is passed with P(b) = 1 - prod_{j <= b} (1 - a_j), so

      E[tokens] = 1 + sum_{i=1}^{d} prod_{k=1}^{i} P_k(b_k).

    `rank_accept` is `[R]` (the same rates at every depth) or `[D, R]` (per depth: depth k uses
    row min(k, D), so a draft whose later guesses read its own states rather than the target's,
    as a target-aware one, can say so). A chain (all b_k = 1) with `[R]` rates gives Eq. (1)
    with alpha = a_1.
    """
    b, a = _branching(branching), _rank_rates(rank_accept)
    if max(b) > a.shape[1]:
        raise ValueError(f"branching={b} has {max(b)} children at a depth but rank_accept "
                         f"gives rates for {a.shape[1]} ranks; measure more ranks.")
    passed = 1.0 - np.cumprod(1.0 - a, axis=1)  # [D, R]: P(b) for b = 1..R at each depth
    rows = np.minimum(np.arange(len(b)), a.shape[0] - 1)
    return float(1.0 + np.sum(np.cumprod([passed[r, k - 1] for r, k in zip(rows, b)])))


def tree_speedup(branching, rank_accept, c: float, verify_cost: VerifyCost = 1.0,
                 draft_cost: Union[None, Callable[[int], float]] = None) -> float:
    """Theorem 3.8 for a tree: E[tokens] / (d draft calls + one verify of all nodes).

    `verify_cost(n)` is T_target(n + 1 tokens) / T_target(1 token) for the n drafted nodes (as
    for chains); `draft_cost(m)`, the cost of one draft call on m paths relative to a target
    step, defaults to c (drafting a tree extends every root-to-leaf path, m = b_1 ... b_d)."""
    b = _branching(branching)
    c = float(_nonneg(c, "c"))
    leaves = int(np.prod(b))
    draft = c if draft_cost is None else float(draft_cost(leaves))
    verify = float(_verify_costs(verify_cost, np.asarray(tree_nodes(b))))
    # The first draft call serves every path (batch 1 per row); the other d - 1 run on m paths.
    cost = c + (len(b) - 1) * draft + verify
    return tree_expected_tokens(b, rank_accept) / cost


def tree_shapes(max_depth: int, max_nodes: int, max_children: int):
    """Every tree with non-increasing branching b_1 >= b_2 >= ... (a wider level below a
    narrower one is never better under the i.i.d. model), depth <= max_depth, at most
    max_nodes drafted nodes and max_children children per node."""
    def grow(prefix):
        if prefix:
            yield tuple(prefix)
        if len(prefix) == max_depth:
            return
        top = min(prefix[-1] if prefix else max_children, max_children)
        for b in range(1, top + 1):
            if tree_nodes(prefix + [b]) <= max_nodes:
                yield from grow(prefix + [b])
    yield from grow([])


@dataclasses.dataclass(frozen=True)
class TreePlan:
    """The fastest chain and the fastest token tree `best_tree` found.

    Attributes:
      chain: the best chain's shape, (1,) * gamma.
      chain_speedup: its predicted speedup.
      chain_tokens: its expected tokens per target call.
      tree: the best shape (the chain when no branching shape is predicted faster).
      tree_speedup: its predicted speedup.
      tree_tokens: its expected tokens per target call.
    """

    chain: Tuple[int, ...]
    chain_speedup: float
    chain_tokens: float
    tree: Tuple[int, ...]
    tree_speedup: float
    tree_tokens: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def best_tree(rank_accept, c: float, verify_cost: VerifyCost = 1.0, *,
              draft_cost: Union[None, Callable[[int], float]] = None, max_depth: int = 8,
              max_nodes: int = 16) -> TreePlan:
    """The tree shape, and the chain, with the highest predicted speed (an exact search over
    `tree_shapes`)."""
    a = _rank_rates(rank_accept)
    best = {}
    for shape in tree_shapes(max_depth, max_nodes, a.shape[1]):
        kind = "chain" if max(shape) == 1 else "tree"
        s = tree_speedup(shape, a, c, verify_cost, draft_cost)
        if kind not in best or s > best[kind][1]:
            best[kind] = (shape, s)
    chain, chain_s = best["chain"]
    tree, tree_s = best.get("tree", (chain, -1.0))
    if tree_s < chain_s:  # no branching tree beats the chain
        tree, tree_s = chain, chain_s
    return TreePlan(tuple(chain), chain_s, tree_expected_tokens(chain, a), tuple(tree), tree_s,
                    tree_expected_tokens(tree, a))
