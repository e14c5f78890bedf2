"""speculative/measure/costs.py: line fits, the decode loop's cost model, calibration limits
and predicted wall times."""

import itertools
import math

import jax
import numpy as np
import pytest

from speculative import decoding, loading
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory
from speculative.measure import costs
from speculative.measure import timing as measure
from speculative.runs import benchmark
from tests.helpers.runs import L_IN, N, bench_cfg

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_fit_line():
    assert costs.fit_line([1, 2, 4], [3.0, 5.0, 9.0]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="every calibration sequence ran 16 iterations"):
        costs.fit_line([16, 16, 16], [1.0, 1.1, 0.9])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decode_loop_cost_model(temperature):
    """Calibration programs are timed with the decoders; each fitted line runs through the
    calibration points' iterations (the decoders' own round counts), and the prediction is the
    start-up plus iterations (Eq. 1's expected rounds; at alpha = 1, ceil(n / (gamma + 1)))."""
    target = loading.load_model(bench_cfg(), None, seed=0)
    batches = list(itertools.islice(
        benchmark.input_batches(1, vocab_size=16, input_length=L_IN, seed=1), 10))
    sampling = SamplingConfig(temperature=temperature)
    [measured] = measure.measure(
        target, [target] * 2, batches[:2], sampling=sampling, gammas=[3], max_decode_len=N,
        repeats=3, lenience=1.0, seed=0, costs=costs.StepCosts.assumed(1.0, {3: 1.0}),
        calibration=batches[2:])
    run = measured.to_json()  # the typed result and its benchmark.json entry agree
    assert measured.loop.round_cost == run["loop_costs"]["round_cost"]
    assert measured.speedup == run["speedup"] == pytest.approx(
        np.median(measured.baseline.repeats_s) / np.median(measured.speculative.repeats_s))
    assert measured.predicted_speedup_loop == run["predicted_speedup_loop"]
    loop = run["loop_costs"]
    assert loop["calibration_sequences"] == 8
    for kind, decode in (("baseline", lambda x, k: decoding.autoregressive_decode(
            target, x, rng=k, sampling=sampling, max_decode_len=N)),
                         ("speculative", lambda x, k: decoding.speculative_decode(
            target, target, x, rng=k, gamma=3, sampling=sampling, max_decode_len=N))):
        rounds = [int(decode(x, jax.random.fold_in(jax.random.PRNGKey(7919 + i), 0)).stats.rounds)
                  for i, x in enumerate(batches[2:])]
        assert loop[kind]["iterations"] == rounds
        assert len(set(rounds)) > 1  # the tiny random model ends rows at EOS at varied lengths
        # The least-squares line through (iterations, median seconds); its sign is not asserted:
        # a tiny model's step is close to the timing noise.
        slope, intercept = np.polyfit(rounds, loop[kind]["median_s"], 1)
        assert (loop[kind]["start_s"], loop[kind]["iteration_s"]) == pytest.approx(
            (intercept, slope))
    assert loop["round_cost"] == pytest.approx(loop["speculative"]["iteration_s"]
                                               / loop["baseline"]["iteration_s"])
    assert run["alpha"] == pytest.approx(1.0, abs=1e-6)  # draft == target
    walltime = run["predicted_walltime"]
    base, spec = loop["baseline"], loop["speculative"]
    lengths = run["stats"]["per_row"]["generated"]
    assert walltime["speculative_s"] == pytest.approx(
        sum(spec["start_s"] + math.ceil(n / 4) * spec["iteration_s"] for n in lengths))
    # Batch 1: the baseline runs one step per token it generates.
    assert walltime["baseline_s"] == pytest.approx(
        2 * base["start_s"] + run["baseline_tokens"] * base["iteration_s"])
    assert run["measured_over_predicted_loop"] == pytest.approx(
        run["speedup"] / run["predicted_speedup_loop"])


def test_calibration_limits_per_batch():
    """Text that rarely ends (a language model continuing code) is calibrated with one
    max_decode_len per batch: each program decodes up to its own limit; a count that does not
    match the batches is refused."""
    target = loading.load_model(bench_cfg(), None, seed=0)
    batches = list(itertools.islice(
        benchmark.input_batches(1, vocab_size=16, input_length=L_IN, seed=1), 3))
    programs = costs.calibration_programs(target, target, batches[:2], [],
                                          sampling=SamplingConfig(0.0), max_decode_len=[2, 5])
    assert sorted(programs) == [("calibration", None, 0), ("calibration", None, 1)]
    for i, limit in enumerate([2, 5]):  # the baseline's programs (a gamma's are built alike)
        assert np.asarray(programs[("calibration", None, i)]().tokens).shape[1] == limit
    with pytest.raises(ValueError, match="2 limits for 3 calibration batches"):
        costs.calibration_programs(target, target, batches, [2], sampling=SamplingConfig(0.0),
                                   max_decode_len=[2, 3])


def test_predict_walltime_known_answer():
    loop = costs.LoopCosts(2, costs.ProgramCost(2.0, 1.0, (), ()),
                           {2: costs.ProgramCost(3.0, 2.5, (), ())})
    assert loop.round_cost == {2: 2.5}
    out = costs.predict_walltime(0.5, 2, loop, [10, 4], [10, 5])
    assert out.baseline_s == pytest.approx(2 * 2.0 + 14 * 1.0)
    rounds = theory.expected_rounds(0.5, 2, 10) + theory.expected_rounds(0.5, 2, 5)
    assert out.speculative_s == pytest.approx(2 * 3.0 + 2.5 * rounds)
    assert out.speedup == pytest.approx(out.baseline_s / out.speculative_s)
    assert out.speedup_per_token == pytest.approx(theory.expected_tokens(0.5, 2) / 2.5)
    assert out.to_json()["speedup"] == out.speedup
