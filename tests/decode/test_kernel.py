"""Sampling policies and the speculative acceptance kernel.

The kernel law: with x ~ q, the token the kernel emits first is distributed as p. For one drafted
position (G = 1), emitting y happens either by accepting the draft y (probability q(y) a(y)) or by
rejecting whatever was drafted and drawing y from the normalised residual r:

    P(y) = q(y) a(y) + (1 - sum_x q(x) a(x)) r(y) / sum(r)

`a` and `r` are the kernel's own `accept_probability` and `residual_weights`, so this checks the
code the kernel runs, exactly (1e-6), for every edge case. A Monte-Carlo test then checks that the
sampled kernel realises that law, and a negative control shows the chi-square test has power.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative.decode import kernel as sampling
from speculative.decode.kernel import SamplingConfig


def _random_dist(rng, v, zeros=0):
    p = rng.gamma(0.5, size=v)
    if zeros:
        p[rng.choice(v, zeros, replace=False)] = 0.0
    return p / p.sum()


def _one_hot(v, i):
    p = np.zeros(v)
    p[i] = 1.0
    return p


def _kernel_law(p, q, lenience=1.0):
    p, q = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
    a = sampling.accept_probability(p, q, lenience)  # accept prob of each possible draft x
    r = sampling.residual_weights(p, q)
    reject = 1.0 - jnp.sum(q * a)
    return np.asarray(q * a + reject * r / jnp.sum(r), np.float64)


def _cases():
    rng = np.random.default_rng(0)
    v = 12
    cases = {f"random_{i}": (_random_dist(rng, v), _random_dist(rng, v)) for i in range(20)}
    p = _random_dist(rng, v)
    cases["p_equals_q"] = (p, p.copy())
    cases["disjoint_support"] = (np.r_[_random_dist(rng, 6), np.zeros(6)],
                                 np.r_[np.zeros(6), _random_dist(rng, 6)])
    cases["q_one_hot"] = (_random_dist(rng, v), _one_hot(v, 3))
    cases["p_one_hot"] = (_one_hot(v, 5), _random_dist(rng, v))
    cases["both_one_hot_same"] = (_one_hot(v, 2), _one_hot(v, 2))
    cases["both_one_hot_differ"] = (_one_hot(v, 2), _one_hot(v, 7))
    cases["zeros_in_p"] = (_random_dist(rng, v, zeros=5), _random_dist(rng, v))
    cases["zeros_in_q"] = (_random_dist(rng, v), _random_dist(rng, v, zeros=5))
    logits_p, logits_q = rng.normal(size=(2, v)) * 2
    for name, cfg in [("top_k", SamplingConfig(0.8, top_k=4)),
                      ("top_p", SamplingConfig(1.0, top_p=0.7)),
                      ("top_k_top_p", SamplingConfig(1.3, top_k=6, top_p=0.9))]:
        cases[name] = (np.asarray(sampling.adjusted_probs(logits_p, cfg)),
                       np.asarray(sampling.adjusted_probs(logits_q, cfg)))
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_law_equals_target(name):
    p, q = CASES[name]
    np.testing.assert_allclose(_kernel_law(p, q), p, atol=1e-6)


@pytest.mark.parametrize("name", ["random_0", "random_1", "zeros_in_q", "top_k", "q_one_hot"])
@pytest.mark.parametrize("lenience", [0.5, 0.1])
def test_lenience_bounds_output_by_p_over_l(name, lenience):
    p, q = CASES[name]
    out = _kernel_law(p, q, lenience)
    assert abs(out.sum() - 1.0) < 1e-6
    assert np.all(out <= p / lenience + 1e-6)
    beta = [float(sampling.acceptance_rate(jnp.asarray(p), jnp.asarray(q), len_))
            for len_ in (1.0, 0.5, 0.3, 0.1)]
    assert all(b2 >= b1 - 1e-7 for b1, b2 in zip(beta, beta[1:]))  # alpha grows as l falls


def _emitted_first_token(p, q, gamma, key, n_samples, q_declared=None):
    """Runs the sampled kernel on n_samples rows; returns the first emitted token per row."""
    v = p.shape[-1]
    kd, kk = jax.random.split(key)
    p_b = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (n_samples, gamma + 1, v))
    q_b = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (n_samples, gamma, v))
    drafts = jax.random.categorical(kd, jnp.log(q_b)).astype(jnp.int32)
    q_kernel = q_b if q_declared is None else jnp.broadcast_to(
        jnp.asarray(q_declared, jnp.float32), q_b.shape)
    n, t = jax.jit(sampling.speculative_sample)(p_b, q_kernel, drafts, kk)
    return np.asarray(jnp.where(n > 0, drafts[:, 0], t))


def _chi2_pvalue(samples, probs):
    counts = np.bincount(samples, minlength=len(probs))
    probs = np.asarray(probs, np.float64)
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token with zero target probability was emitted"
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    return stats.chisquare(counts[keep], expected).pvalue


@pytest.mark.parametrize("name", ["random_0", "disjoint_support", "q_one_hot", "top_p",
                                  "p_equals_q"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_sampled_kernel_matches_target(name, gamma):
    p, q = CASES[name]
    samples = _emitted_first_token(p, q, gamma, jax.random.PRNGKey(1), 200_000)
    assert _chi2_pvalue(samples, p) > 1e-6


def test_negative_control_wrong_q_is_detected():
    """q declared to the kernel differs from the q the drafts came from: the test must fail."""
    p, q = CASES["random_0"]
    wrong = 0.5 * q + 0.5 / len(q)
    samples = _emitted_first_token(p, q, 1, jax.random.PRNGKey(2), 200_000, q_declared=wrong)
    assert _chi2_pvalue(samples, p) < 1e-6


def test_bonus_token_when_all_accepted():
    """p == q: every draft is accepted and the bonus comes from p_{G+1}."""
    v, gamma = 6, 3
    q = np.full((1, gamma, v), 1.0 / v)
    p = np.concatenate([q, _one_hot(v, 4)[None, None]], axis=1)
    n, t = sampling.speculative_sample(p, q, jnp.array([[0, 1, 2]]), jax.random.PRNGKey(0))
    assert int(n[0]) == 3 and int(t[0]) == 4


def _numpy_adjusted(logits, temperature, top_k, top_p):
    logits = np.asarray(logits, np.float64) / temperature
    if top_k:
        kth = np.sort(logits)[::-1][top_k - 1]
        logits = np.where(logits >= kth, logits, -np.inf)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        keep = np.zeros_like(probs, bool)
        keep[order[before < top_p]] = True
        probs = np.where(keep, probs, 0)
        probs /= probs.sum()
    return probs


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 3, 1.0), (1.0, 0, 0.8), (1.5, 5, 0.6), (0.3, 1, 1.0)])
def test_adjusted_probs_against_numpy(temperature, top_k, top_p):
    logits = np.random.default_rng(3).normal(size=(4, 10)) * 2
    got = sampling.adjusted_probs(logits, SamplingConfig(temperature, top_k, top_p))
    want = np.stack([_numpy_adjusted(row, temperature, top_k, top_p) for row in logits])
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_argmax_is_one_hot_at_first_maximum():
    probs = sampling.adjusted_probs(jnp.array([[1.0, 3.0, 3.0, 0.0]]), SamplingConfig(0.0))
    np.testing.assert_array_equal(probs, [[0, 1, 0, 0]])


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.2), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
])
def test_bad_sampling_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_kernel_rejects_bad_lenience_and_mismatched_vocab():
    p, q = jnp.ones((1, 2, 4)) / 4, jnp.ones((1, 1, 4)) / 4
    with pytest.raises(ValueError, match="lenience"):
        sampling.speculative_sample(p, q, jnp.zeros((1, 1), jnp.int32), jax.random.PRNGKey(0), 0.0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        sampling.speculative_sample(p, jnp.ones((1, 1, 5)) / 5, jnp.zeros((1, 1), jnp.int32),
                                    jax.random.PRNGKey(0))


def test_sample_matches_weights_and_skips_zeros():
    """Inverse-CDF sampling: unnormalised weights, zeros (also first/last) never drawn."""
    weights = np.array([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.0])
    probs = weights / weights.sum()
    draws = np.asarray(sampling.sample(jax.random.PRNGKey(5),
                                       jnp.broadcast_to(jnp.asarray(weights), (200_000, 8))))
    assert _chi2_pvalue(draws, probs) > 1e-6
    one = np.asarray(sampling.sample(jax.random.PRNGKey(6),
                                     jnp.broadcast_to(jnp.asarray(_one_hot(8, 7)), (1000, 8))))
    assert np.all(one == 7)


# ----------------------------------------------------------------------------------------------
# From tests/test_faults.py.
def test_kernel_rejects_non_finite_positions():
    p = jnp.asarray([[[0.5, 0.5, 0.0], [jnp.nan, 0.5, 0.5], [0.2, 0.3, 0.5]]])  # [1, 3, 3]
    q = jnp.asarray([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]])
    x = jnp.asarray([[0, 1]], jnp.int32)
    for seed in range(20):
        n, _ = sampling.speculative_sample(p, q, x, jax.random.PRNGKey(seed))
        assert int(n[0]) <= 1  # position 1 holds NaN: its draft is never accepted
    # A NaN q is rejected and left out of the residual: the token comes from p alone.
    p2 = jnp.asarray([[[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])
    q2 = jnp.asarray([[[jnp.nan, jnp.nan, jnp.nan]]])
    for seed in range(20):
        n, t = sampling.speculative_sample(p2, q2, jnp.asarray([[2]], jnp.int32),
                                           jax.random.PRNGKey(seed))
        assert int(n[0]) == 0 and int(t[0]) == 2
    assert float(sampling.accept_probability(jnp.nan, 0.5)) == 0.0
    assert float(sampling.accept_probability(0.5, jnp.nan)) == 0.0
    assert np.asarray(sampling.finite_rows(jnp.asarray(
        [[0.0, 1.0], [jnp.nan, 1.0], [jnp.inf, 0.0], [-jnp.inf, -jnp.inf]]))).tolist() == [
            True, False, False, False]


@pytest.mark.parametrize("temperature", [1e-9, 1e-5, -1.0, float("nan"), float("inf"), True])
def test_unsafe_temperatures_are_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature)
    SamplingConfig(1e-4)  # the smallest allowed one decodes finite probabilities
    probs = jax.jit(lambda x: sampling.adjusted_probs(x, SamplingConfig(1e-4)))(
        jnp.asarray([[30.0, 1.0, -20.0]]))
    assert np.all(np.isfinite(np.asarray(probs)))
