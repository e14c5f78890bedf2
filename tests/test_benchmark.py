"""Tests for the benchmark and alpha runs (speculative/runs/{benchmark,alpha}.py and scripts).

Tiny random T5 models (vocab 16) keep every compilation to seconds; shapes are shared between
tests so jit caches are reused. Known answers: a draft identical to the target has alpha = 1 and
emits gamma + 1 tokens per target call except at the end of a sequence; the synthetic draft is
accepted at the requested rate; teacher-forced beta equals a full-forward computation.
"""

import itertools
import json
import math
import os
import signal
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding, files, loading
from speculative.decode.sampling import SamplingConfig
from speculative.measure import acceptance, costs, theory
from speculative.measure import timing as measure
from speculative.models import synthetic, t5
from speculative.runs import alpha as alpha_lib
from speculative.runs import benchmark
from speculative.runs import config as config_lib
from tests.helpers import REPO, run_interrupted, snapshot

TINY = dict(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
            num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
            dropout_rate=0.0)
TINY_GIN = "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n\n" + (
    "".join(f"tiny/t5.T5Config.{k} = {v!r}\n" for k, v in TINY.items()))
N, L_IN = 16, 8  # max_decode_len and input length shared by the tests (one compilation each)

RUN_KEYS = {"sampling", "batch_size", "gamma", "max_decode_len", "timings", "speedup",
            "speedup_spread", "baseline_tokens", "speculative_tokens", "speedup_per_token",
            "alpha", "tokens_per_target_call", "expected_tokens_per_call",
            "accepted_per_position", "accepted_per_position_rate", "stats", "c", "verify_cost",
            "predicted_speedup", "predicted_speedup_paper", "measured_over_predicted"}
TIMING_KEYS = {"median_s", "q25_s", "q75_s", "min_s", "max_s", "mean_s", "repeats_s",
               "first_call_s", "compile_s"}
SETTING_KEYS = {"sampling", "num_tokens", "num_sequences", "mean_sequence_length", "alpha",
                "se_naive", "se_cluster", "se_batch_means", "batch_length",
                "lag1_autocorrelation", "effective_sample_size", "histogram"}


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def tiny_gin(tmp_path):
    path = tmp_path / "tiny.gin"
    path.write_text(TINY_GIN)
    return str(path)


def _cfg():
    return t5.T5Config(**TINY)


def _common_bindings(out_dir):
    return ["TARGET_MODEL = @tiny/t5.T5Config()", "DRAFT_MODEL = @tiny/t5.T5Config()",
            "TARGET_CHECKPOINT = None", "DRAFT_CHECKPOINT = None",
            f"OUTPUT_DIR = '{out_dir}'", f"MAX_DECODE_LEN = {N}", f"INPUT_LENGTH = {L_IN}",
            "TEMPERATURES = [0.0]"]


def test_benchmark_gin_identical_draft(tmp_path, tiny_gin):
    """Draft == target: alpha = 1 and each row needs ceil(length / (gamma + 1)) target calls."""
    out = tmp_path / "bench"
    gamma = 3
    config_lib.parse_gin(
        ["configs/runs/benchmark.gin", tiny_gin],
        _common_bindings(out) + [f"GAMMAS = [{gamma}]", "BATCH_SIZES = [4]", "REPEATS = 2",
                                 "benchmark.run.draft_seed = 0", "benchmark.run.cost_steps = 2"])
    benchmark.run()
    data = json.loads((out / "benchmark.json").read_text())
    assert data["schema"] == "speculative.benchmark/1"
    assert {"config", "environment", "costs", "runs"} <= set(data)
    assert {"device", "jax_version", "platform"} <= set(data["environment"])
    assert data["config"]["gammas"] == [gamma] and data["config"]["target_checkpoint"] is None
    assert data["config"]["target_model"]["vocab_size"] == 16
    assert "benchmark.BenchmarkSettings.gammas = %GAMMAS" in (out / "config.gin").read_text()
    [run] = data["runs"]
    assert RUN_KEYS <= set(run)
    for side in ("baseline", "speculative"):
        assert TIMING_KEYS <= set(run["timings"][side])
        assert len(run["timings"][side]["repeats_s"]) == 2
    assert run["alpha"] == 1.0
    rows = run["stats"]["per_row"]
    expected_calls = [math.ceil(n / (gamma + 1)) for n in rows["generated"]]
    assert rows["target_calls"] == expected_calls
    assert run["speculative_tokens"] == run["baseline_tokens"]  # greedy: identical outputs
    assert run["speedup"] == pytest.approx(
        run["timings"]["baseline"]["median_s"] / run["timings"]["speculative"]["median_s"])
    assert run["predicted_speedup"] == pytest.approx(
        theory.speedup(1.0, gamma, run["c"], run["verify_cost"]))
    # The decode-loop cost model is fitted on CALIBRATION_BATCHES (default 8) further batches;
    # random tiny models may run every calibration batch to max_decode_len, and then say so.
    assert data["config"]["calibration_batches"] == 8
    assert "predicted_speedup_loop" in run
    if "error" in run["loop_costs"]:
        assert "different lengths" in run["loop_costs"]["error"]
    [cost] = data["costs"]
    assert cost["c"] > 0 and set(cost["verify_cost"]) == {str(gamma)}
    assert set(cost["step_spread_s"]) == {"target", "draft", str(gamma)}
    assert cost["from_min"]["c"] > 0 and set(cost["from_min"]["verify_cost"]) == {str(gamma)}


def test_fit_line():
    assert costs.fit_line([1, 2, 4], [3.0, 5.0, 9.0]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="every calibration sequence ran 16 iterations"):
        costs.fit_line([16, 16, 16], [1.0, 1.1, 0.9])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decode_loop_cost_model(temperature):
    """Calibration programs are timed with the decoders; each fitted line runs through the
    calibration points' iterations (the decoders' own round counts), and the prediction is the
    start-up plus iterations (Eq. 1's expected rounds; at alpha = 1, ceil(n / (gamma + 1)))."""
    target = loading.load_model(_cfg(), None, seed=0)
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
    target = loading.load_model(_cfg(), None, seed=0)
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


def test_synthetic_acceptance_gives_requested_alpha(tmp_path):
    """At temperature 0 the synthetic draft is accepted with the requested probability."""
    results = benchmark.run(
        target_model=_cfg(), draft_model=None, output_dir=str(tmp_path),
        synthetic_acceptance=0.6, gammas=[3], batch_sizes=[4], temperatures=[0.0],
        max_decode_len=N, input_length=L_IN, num_batches=4, repeats=1, cost_steps=2)
    [run] = results["runs"]
    assert results["config"]["synthetic_acceptance"] == 0.6
    assert run["stats"]["tested"] > 150
    assert run["alpha"] == pytest.approx(0.6, abs=0.1)
    assert run["speculative_tokens"] == run["baseline_tokens"]  # still exact greedy output
    target = loading.load_model(_cfg(), None, seed=0)
    inputs = next(benchmark.input_batches(4, vocab_size=16, input_length=L_IN, seed=0))
    for requested in (0.0, 1.0):  # the same compilation: acceptance and seed are traced
        draft = synthetic.SyntheticDraft(target, requested, seed=0)
        out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                          gamma=3, sampling=SamplingConfig(temperature=0.0),
                                          max_decode_len=N)
        assert out.stats.alpha == requested
    with pytest.raises(ValueError, match="synthetic_acceptance=1.5"):
        synthetic.SyntheticDraft(target, 1.5)


@pytest.mark.parametrize("override, message", [
    (dict(gammas=[0]), "gammas holds 0"),
    (dict(gammas=[]), r"gammas=\[\] is empty"),
    (dict(temperatures=["hot"]), "'hot' has unknown type str"),
    (dict(temperatures=[-1.0]), "temperature=-1.0"),
    (dict(batch_sizes=[0]), "batch_sizes holds 0"),
    (dict(synthetic_acceptance=1.5), "synthetic_acceptance=1.5"),
    (dict(calibration_batches=-1), "calibration_batches=-1"),
    (dict(draft_model=t5.T5Config(**{**TINY, "vocab_size": 32})),
     "Target vocab_size=16 and draft vocab_size=32 differ"),
])
def test_bad_benchmark_config_raises(tmp_path, override, message):
    kwargs = dict(target_model=_cfg(), draft_model=_cfg(), output_dir=str(tmp_path))
    kwargs.update(override)
    with pytest.raises((ValueError, TypeError), match=message):
        benchmark.run(**kwargs)


def test_bad_alpha_config_raises(tmp_path):
    with pytest.raises(ValueError, match="num_tokens holds 0"):
        alpha_lib.run(target_model=_cfg(), draft_model=_cfg(), output_dir=str(tmp_path),
                      num_tokens=0)
    with pytest.raises(TypeError, match="draft_model='small'"):
        alpha_lib.run(target_model=_cfg(), draft_model="small", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="draft vocab_size=32 differ"):
        alpha_lib.run(target_model=_cfg(), output_dir=str(tmp_path),
                      draft_model=t5.T5Config(**{**TINY, "vocab_size": 32}))


def test_forced_betas_match_full_forward():
    """Teacher forcing through `extend` == beta from `Transformer.apply` on [BOS] + generated."""
    cfg = _cfg()
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
    cfg = _cfg()
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


def test_task_inputs():
    batches = benchmark.take_batches(2, 3, vocab_size=4000, input_length=12, seed=0,
                                     task="mini_ende", split="validation")
    assert [b.shape for b in batches] == [(3, 12), (3, 12)]
    assert all(np.any(b == 1, axis=1).all() for b in batches)  # EOS kept after truncation
    with pytest.raises(ValueError, match="vocab_size is 16"):
        benchmark.take_batches(1, 2, vocab_size=16, input_length=12, seed=0, task="mini_ende")


@pytest.mark.parametrize("input_length", [12, 48])
def test_tsv_inputs_read_without_seqio_equal_the_mini_ende_task(tmp_path, input_length):
    """A TSV path alone is read directly (no seqio/TensorFlow, as on an accelerator image) and
    gives the ids the seqio task gives for the same file, cut ones included."""
    tsv = os.path.join(REPO, "speculative", "data", "mini", "test.tsv")
    kwargs = dict(vocab_size=4000, input_length=input_length, seed=0, split="test")
    direct = benchmark.take_batches(40, 1, tsv_path=tsv, **kwargs)
    via_seqio = benchmark.take_batches(40, 1, task="mini_ende", **kwargs)
    np.testing.assert_array_equal(np.concatenate(direct), np.concatenate(via_seqio))
    lengths = (np.concatenate(direct) != 0).sum(axis=1)
    assert (lengths == input_length).any()  # the cut ones are compared too
    bad = tmp_path / "bad.tsv"
    bad.write_text("one field only\n")
    with pytest.raises(ValueError, match="bad.tsv:1: expected 'source<TAB>target'"):
        benchmark.take_batches(1, 1, tsv_path=str(bad), **kwargs)


def _script(name, *args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", name), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.parametrize("script, first_line", [
    ("benchmark.py", "Times speculative vs autoregressive decoding"),
    ("measure_alpha.py", "Measures a draft's acceptance rate alpha"),
])
def test_script_help_shows_docstring(script, first_line):
    result = _script(script, "--help")  # absl exits with 1 after printing the usage
    assert first_line in result.stdout
    assert "Example" in result.stdout and "--gin_file" in result.stdout


@pytest.mark.slow  # ~12 s; the benchmark CLI test covers the gin path in CI
def test_measure_alpha_cli_identical_draft_is_one(tmp_path, tiny_gin):
    """The script end to end (gin file + --gin.X flags); a draft equal to the target: alpha = 1."""
    out = tmp_path / "cli"
    result = _script(
        "measure_alpha.py", f"--gin_file={tiny_gin}", "--gin_file=configs/runs/measure_alpha.gin",
        "--gin.TARGET_MODEL=@tiny/t5.T5Config()", "--gin.DRAFT_MODEL=@tiny/t5.T5Config()",
        "--gin.TARGET_CHECKPOINT=None", "--gin.DRAFT_CHECKPOINT=None",
        "--gin.alpha.run.draft_seed=0",
        f"--gin.OUTPUT_DIR='{out}'", "--gin.TEMPERATURES=[0.0, 1.0]", "--gin.NUM_TOKENS=100",
        "--gin.BATCH_SIZE=4", f"--gin.MAX_DECODE_LEN={N}", f"--gin.INPUT_LENGTH={L_IN}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "alpha" in result.stdout and "se_seq" in result.stdout  # the printed table
    data = json.loads((out / "alpha.json").read_text())
    assert data["schema"] == "speculative.alpha/1"
    assert {"config", "environment", "settings"} <= set(data)
    assert "alpha.AlphaSettings.num_tokens = %NUM_TOKENS" in (out / "config.gin").read_text()
    greedy, sampled = data["settings"]
    for s in (greedy, sampled):
        assert SETTING_KEYS <= set(s)
        assert s["num_tokens"] == 100
        assert len(s["histogram"]["counts"]) == 20 and sum(s["histogram"]["counts"]) == 100
    assert greedy["sampling"]["temperature"] == 0.0 and greedy["alpha"] == 1.0
    assert greedy["lag1_autocorrelation"] is None  # beta is constant
    assert sampled["alpha"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow  # ~25 s each; CI: the same harness on infer, the converter and mini_results
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_benchmark_leaves_the_earlier_run(tmp_path, tiny_gin, signum):
    """scripts/benchmark.py over an earlier run (OVERWRITE=True), stopped by a real signal
    just before its results are renamed into place: the earlier benchmark.json and config.gin
    stay together, and no temporary file is left."""
    out = tmp_path / "bench"
    out.mkdir()
    before = {"benchmark.json": b'{"earlier": true}', "config.gin": b"# earlier run"}
    for name, data in before.items():
        (out / name).write_bytes(data)
    args = [f"--gin_file={tiny_gin}", "--gin_file=configs/runs/benchmark.gin"]
    args += [f"--gin_bindings={b}" for b in _common_bindings(out) + [
        "GAMMAS = [2]", "BATCH_SIZES = [2]", "REPEATS = 1", "OVERWRITE = True",
        "benchmark.run.cost_steps = 1"]]
    run_interrupted("benchmark.py", args, result=str(out), signum=signum,
                    env=dict(os.environ, PYTHONPATH=REPO))
    assert snapshot(out) == before


def test_results_writers_refuse_an_earlier_run_and_write_atomically(tmp_path):
    out = tmp_path / "bench"
    assert files.check_output_dir(str(out), benchmark.RESULTS_FILE, False) == str(out)
    path = benchmark.write_json({"x": float("nan")}, str(out), benchmark.RESULTS_FILE)
    assert json.loads(open(path).read()) == {"x": None}
    assert sorted(os.listdir(out)) == ["benchmark.json", "config.gin"]  # no temporary left
    with pytest.raises(FileExistsError, match="OVERWRITE=True"):
        files.check_output_dir(str(out), benchmark.RESULTS_FILE, False)
    files.check_output_dir(str(out), benchmark.RESULTS_FILE, True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match="cannot be written"):
        files.check_output_dir(str(tmp_path / "file" / "sub"), benchmark.RESULTS_FILE, False)
    for bad in (None, "", 3):
        with pytest.raises(ValueError, match="output_dir"):
            files.check_output_dir(bad)


def test_committed_gpu_summary_is_what_its_benchmark_jsons_give():
    """results/gpu/summary.md is benchmark.summary_markdown of the runs beside it, as
    scripts/gpu_benchmark.sh writes it: no number in it was typed by hand."""
    root = os.path.join(REPO, "results", "gpu")
    paths = sorted(os.path.join(root, d, "benchmark.json") for d in os.listdir(root)
                   if os.path.exists(os.path.join(root, d, "benchmark.json")))
    assert len(paths) == 4
    summary = benchmark.summary_markdown(paths)
    with open(os.path.join(root, "summary.md"), encoding="utf-8") as f:
        assert f.read() == summary
    rows = summary.splitlines()[2:]
    assert len(rows) == 10 and all("| NVIDIA H200 |" in row for row in rows)

    # The README's short table copies four of those rows: every cell it shares with them.
    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    header, *full = [cells(r) for r in summary.splitlines() if not r.startswith("|---")]
    by_key = {(r[0], r[2], r[3], r[4]): dict(zip(header, r)) for r in full}  # run, T, B, γ
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    table = readme.split("## What it shows", 1)[1].split("\n\n", 2)[1].splitlines()
    short_header, copied = cells(table[0]), [cells(r) for r in table[2:]]
    assert len(copied) == 4
    for row in copied:
        short = dict(zip(short_header, row))
        original = by_key[(short["run"], short["T"], short["B"], short["γ"])]
        for column, value in short.items():
            if column != "device":
                assert original[column] == value, (short["run"], column)
