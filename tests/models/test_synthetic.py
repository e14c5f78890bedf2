"""speculative/models/synthetic.py: a synthetic draft accepts at the requested alpha."""


import jax
import pytest

from speculative import decoding, loading
from speculative.decode.kernel import SamplingConfig
from speculative.models import synthetic
from speculative.runs import benchmark
from tests.helpers.runs import L_IN, N, bench_cfg

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_synthetic_acceptance_gives_requested_alpha(tmp_path):
    """At temperature 0 the synthetic draft is accepted with the requested probability."""
    results = benchmark.run(
        target_model=bench_cfg(), draft_model=None, output_dir=str(tmp_path),
        synthetic_acceptance=0.6, gammas=[3], batch_sizes=[4], temperatures=[0.0],
        max_decode_len=N, input_length=L_IN, num_batches=4, repeats=1, cost_steps=2)
    [run] = results["runs"]
    assert results["config"]["synthetic_acceptance"] == 0.6
    assert run["stats"]["tested"] > 150
    assert run["alpha"] == pytest.approx(0.6, abs=0.1)
    assert run["speculative_tokens"] == run["baseline_tokens"]  # still exact greedy output
    target = loading.load_model(bench_cfg(), None, seed=0)
    inputs = next(benchmark.input_batches(4, vocab_size=16, input_length=L_IN, seed=0))
    for requested in (0.0, 1.0):  # the same compilation: acceptance and seed are traced
        draft = synthetic.SyntheticDraft(target, requested, seed=0)
        out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                          gamma=3, sampling=SamplingConfig(temperature=0.0),
                                          max_decode_len=N)
        assert out.stats.alpha == requested
    with pytest.raises(ValueError, match="synthetic_acceptance=1.5"):
        synthetic.SyntheticDraft(target, 1.5)
