"""speculative/decode/stats.py: merging the statistics of several decode calls."""


import jax
import numpy as np
import pytest

from speculative.decode import loops as decoding
from speculative.decode import stats as stats_lib
from speculative.decode.kernel import SamplingConfig
from speculative.models import t5
from tests.helpers import decoding as td
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def encdec():
    return td.pair(t5.Transformer(tiny_config()))


def test_merge_stats_concatenates_rows_drops_fillers_and_sums_forwards(encdec):
    """The one stats reduction: two batches merged (the second's filler row left out) give
    the totals of their rows, and `rounds` counts the target forwards of both calls."""
    target, draft = encdec
    kw = dict(rng=jax.random.PRNGKey(0), gamma=3, sampling=SamplingConfig(1.0),
              max_decode_len=10)
    a = decoding.speculative_decode(target, draft, td.prompts([4, 6], 8, seed=1), **kw).stats
    b = decoding.speculative_decode(target, draft, td.prompts([5, 5], 8, seed=2), **kw).stats
    merged = stats_lib.merge_stats([a, b], rows=[2, 1])
    got = merged.summary(per_row=True)
    assert got["rounds"] == int(a.rounds) + int(b.rounds)
    for name in ("generated", "tested", "target_calls", "beta_sum"):
        want = np.concatenate([np.asarray(getattr(a, name)), np.asarray(getattr(b, name))[:1]])
        np.testing.assert_array_equal(got["per_row"][name], want.tolist())
    tested = int(np.sum(got["per_row"]["tested"]))
    assert got["tested"] == tested
    np.testing.assert_allclose(got["alpha"], np.sum(got["per_row"]["beta_sum"]) / tested)
    assert got["tokens_per_target_call"] == got["generated"] / got["target_calls"]
    np.testing.assert_array_equal(
        got["accepted_per_position"],
        np.asarray(a.accepted_per_position).sum(0) + np.asarray(b.accepted_per_position)[0])
    other = decoding.speculative_decode(target, draft, td.prompts([4, 6], 8), **{**kw, "gamma": 2})
    with pytest.raises(ValueError, match="different gammas"):
        stats_lib.merge_stats([a, other.stats])


def test_str_says_rounds_are_per_batch_and_target_calls_summed_over_rows(encdec):
    """At batch > 1, `rounds` < `target_calls` is no error: the one line says why."""
    target, draft = encdec
    out = decoding.speculative_decode(target, draft, td.prompts([4, 6, 5], 8, seed=1),
                                      rng=jax.random.PRNGKey(0), gamma=3,
                                      sampling=SamplingConfig(1.0), max_decode_len=10)
    calls = np.asarray(out.stats.target_calls).tolist()
    line = str(out.stats)
    assert line.startswith(f"rounds {int(out.stats.rounds)} (batched target forwards, all 3 "
                           "rows in each) | ")
    assert f"target_calls {sum(calls)} (summed over rows: {' + '.join(map(str, calls))}, " \
        in line
    assert f"tokens per target call {out.stats.tokens_per_target_call:.2f}" in line
