"""speculative/measure/acceptance.py: the forced betas equal the full forward's, their
statistics, and alpha binned by the target's top probability."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding, loading
from speculative.decode.kernel import SamplingConfig
from speculative.measure import acceptance
from speculative.runs import benchmark
from tests.helpers.runs import L_IN, N, bench_cfg

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_forced_betas_match_full_forward():
    """Teacher forcing through `extend` == beta from `Transformer.apply` on [BOS] + generated."""
    cfg = bench_cfg()
    target = loading.load_model(cfg, None, seed=0)
    draft = loading.load_model(cfg, None, seed=1)
    inputs = jnp.asarray(next(benchmark.input_batches(4, vocab_size=16, input_length=L_IN,
                                                      seed=0)))
    forward = jax.jit(lambda params, enc, dec: target.module.apply({"params": params}, enc, dec))
    for temperature in (0.0, 1.0):
        sampling = SamplingConfig(temperature=temperature)
        out = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(3),
                                             sampling=sampling, max_decode_len=N)
        betas = np.asarray(acceptance.forced_betas(target, draft, inputs, out.tokens,
                                                  sampling=sampling))
        dec_in = jnp.concatenate([jnp.zeros((4, 1), jnp.int32), out.tokens[:, :-1]], axis=1)
        p_logits = forward(target.params, inputs, dec_in)
        q_logits = forward(draft.params, inputs, dec_in)
        if temperature == 0.0:
            expected = np.asarray(jnp.argmax(p_logits, -1) == jnp.argmax(q_logits, -1), float)
            # The target's argmax along its own greedy text is the text itself.
            valid = np.arange(N)[None] < np.asarray(out.lengths)[:, None]
            assert np.all(np.asarray(jnp.argmax(p_logits, -1))[valid]
                          == np.asarray(out.tokens)[valid])
        else:
            p, q = jax.nn.softmax(p_logits, -1), jax.nn.softmax(q_logits, -1)
            expected = np.asarray(jnp.sum(jnp.minimum(p, q), -1))
        valid = np.arange(N)[None] < np.asarray(out.lengths)[:, None]
        np.testing.assert_allclose(betas[valid], expected[valid], atol=1e-5)
        if temperature == 1.0:
            assert 0.0 < betas[valid].mean() < 1.0


def test_alpha_by_confidence_bins_the_betas_by_the_targets_top_probability():
    """The bins hold every position of `collect_betas` once, binned by the target's top
    probability from a full forward; each bin's alpha is the mean of its positions' betas."""
    cfg = bench_cfg()
    target = loading.load_model(cfg, None, seed=0)
    draft = loading.load_model(cfg, None, seed=1)
    batches = list(itertools.islice(
        benchmark.input_batches(4, vocab_size=16, input_length=L_IN, seed=0), 2))
    sampling, edges = SamplingConfig(1.0), (0.0, 0.2, 0.3, 1.0)
    kw = dict(sampling=sampling, num_tokens=30, max_decode_len=N)
    got = acceptance.alpha_by_confidence(target, draft, batches, edges=edges, **kw)
    betas = np.concatenate(acceptance.collect_betas(target, draft, batches, lenience=1.0,
                                                    rng=jax.random.PRNGKey(0), **kw))
    assert got["positions"] == len(betas) == 30
    assert got["alpha"] == pytest.approx(betas.mean(), abs=1e-6)
    forward = jax.jit(lambda params, enc, dec: target.module.apply({"params": params}, enc, dec))
    tops = []
    for i, inputs in enumerate(batches):  # collect_betas' decode keys: fold_in(PRNGKey(0), i)
        inputs = jnp.asarray(inputs)
        out = decoding.autoregressive_decode(target, inputs, sampling=sampling, max_decode_len=N,
                                             rng=jax.random.fold_in(jax.random.PRNGKey(0), i))
        dec_in = jnp.concatenate([jnp.zeros((4, 1), jnp.int32), out.tokens[:, :-1]], axis=1)
        top = np.asarray(jax.nn.softmax(forward(target.params, inputs, dec_in), -1).max(-1))
        tops += [row[:n] for row, n in zip(top, np.asarray(out.lengths))]
    top = np.concatenate(tops)[:30]
    for b in got["bins"]:
        mask = (top >= b["low"]) & ((top < b["high"]) | (b["high"] == 1.0))
        assert b["positions"] == mask.sum() and b["share"] == pytest.approx(mask.mean())
        if mask.any():
            assert b["alpha"] == pytest.approx(betas[mask].mean(), abs=1e-5)
            assert b["mean_top"] == pytest.approx(top[mask].mean(), abs=1e-5)
    assert sum(b["positions"] for b in got["bins"]) == 30 and sum(
        b["positions"] > 0 for b in got["bins"]) >= 2, got  # the edges split these positions
    with pytest.raises(ValueError, match="increasing bin edges"):
        acceptance.alpha_by_confidence(target, draft, batches, edges=(0.0, 0.5), **kw)


def test_beta_statistics_known_answer():
    stats = acceptance.beta_statistics([np.array([1.0, 0.0, 1.0]), np.array([1.0, 1.0])], bins=4)
    assert stats["alpha"] == pytest.approx(0.8)
    assert stats["num_tokens"] == 5 and stats["num_sequences"] == 2
    assert stats["se_naive"] == pytest.approx(np.std([1, 0, 1, 1, 1], ddof=1) / math.sqrt(5))
    # Cluster sums of (beta - 0.8): -0.4 and 0.4 -> sqrt(2 * 0.32) / 5.
    assert stats["se_cluster"] == pytest.approx(math.sqrt(2 * 0.32) / 5)
    # Within-sequence pairs: (0.2, -0.8), (-0.8, 0.2), (0.2, 0.2); variance 0.16.
    assert stats["lag1_autocorrelation"] == pytest.approx((-0.16 - 0.16 + 0.04) / 3 / 0.16)
    assert stats["histogram"]["counts"] == [1, 0, 0, 4]
    # Independent betas: all three standard errors agree and lag-1 is near 0.
    rng = np.random.default_rng(0)
    seqs = [rng.random(50) < 0.7 for _ in range(200)]
    iid = acceptance.beta_statistics(seqs)
    assert abs(iid["lag1_autocorrelation"]) < 0.05
    assert iid["se_cluster"] == pytest.approx(iid["se_naive"], rel=0.2)
    assert iid["se_batch_means"] == pytest.approx(iid["se_naive"], rel=0.3)
    # Sequence-level correlation (each sequence all 0 or all 1) inflates the clustered SE.
    blocks = [np.full(50, float(rng.random() < 0.7)) for _ in range(200)]
    corr = acceptance.beta_statistics(blocks)
    assert corr["se_cluster"] > 5 * corr["se_naive"]
