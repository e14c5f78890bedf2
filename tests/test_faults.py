"""Faults and bad inputs: non-finite numbers never become accepted tokens, and bad arguments
are refused by name before any work (decode API, temperatures, cache size, run settings, the
trainer, the bundle, gin, the converter; the infer, benchmark and checkpoint suites add output
directories, interruption and corrupt checkpoints).

A target with NaN parameters must stop every row and flag it (`DecodeStats.nonfinite`) at
temperature 0 and 1, in both decoders, instead of emitting text computed from NaN; a draft with
NaN parameters must never get a token accepted (at temperature 0 the output still equals the
target's greedy output, at temperature 1 every token comes from the target alone). The kernel
rejects drafts at non-finite positions and leaves a broken q out of the residual.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from speculative import decoding
from speculative.decode import contract, drafters, sampling
from speculative.decode.sampling import SamplingConfig
from speculative.models import t5
from tests.helpers import random_params, tiny_config

TEMPERATURES = (SamplingConfig(0.0), SamplingConfig(1.0))


def _poisoned(params, leaf="decoder"):
    """params with every leaf under `leaf` (a path fragment) set to NaN."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.full_like(x, jnp.nan) if leaf in jax.tree_util.keystr(path) else x,
        params)


@pytest.fixture(scope="module")
def models():
    module = t5.Transformer(tiny_config())
    target = decoding.EncoderDecoderModel(module, random_params(module, 0))
    draft = decoding.EncoderDecoderModel(module, random_params(module, 1))
    return target, draft


INPUTS = np.asarray([[5, 6, 7, 1], [9, 3, 1, 0]], np.int32)


@pytest.mark.parametrize("cfg", TEMPERATURES, ids=["T0", "T1"])
def test_nan_target_stops_and_flags_every_row(models, cfg):
    target, draft = models
    broken = target.replace(params=_poisoned(target.params))
    key = jax.random.PRNGKey(0)
    ar = decoding.autoregressive_decode(broken, INPUTS, rng=key, sampling=cfg, max_decode_len=8)
    spec = decoding.speculative_decode(broken, draft, INPUTS, rng=key, gamma=3, sampling=cfg,
                                       max_decode_len=8)
    for out in (ar, spec):
        assert np.asarray(out.stats.nonfinite).tolist() == [True, True]
        assert np.asarray(out.lengths).tolist() == [0, 0]  # NaN from the first step: no text
        assert out.stats.summary()["nonfinite_rows"] == 2
        with pytest.raises(FloatingPointError, match=r"rows \[0, 1\]"):
            out.stats.check_finite()
    assert int(np.sum(spec.stats.accepted)) == 0


@pytest.mark.parametrize("cfg", TEMPERATURES, ids=["T0", "T1"])
def test_nan_draft_never_gets_a_token_accepted(models, cfg):
    target, draft = models
    broken = draft.replace(params=_poisoned(draft.params))
    key = jax.random.PRNGKey(1)
    spec = decoding.speculative_decode(target, broken, INPUTS, rng=key, gamma=3, sampling=cfg,
                                       max_decode_len=8)
    assert int(np.sum(spec.stats.accepted)) == 0
    assert not np.any(np.asarray(spec.stats.nonfinite))  # the target is fine: rows complete
    assert np.all(np.asarray(spec.lengths) > 0)
    assert int(np.sum(spec.stats.drafted)) == 0  # drafts end before a NaN distribution
    spec.stats.check_finite()
    if cfg.greedy:  # the target decides every token
        ar = decoding.autoregressive_decode(target, INPUTS, rng=key, sampling=cfg,
                                            max_decode_len=8)
        np.testing.assert_array_equal(ar.tokens, spec.tokens)


def test_nan_after_some_tokens_keeps_the_exact_prefix(models):
    """A target that breaks only on some inputs' later positions: rows stop where their
    distribution turns non-finite, and what was emitted before equals the clean decode."""
    target, draft = models
    clean = decoding.autoregressive_decode(target, INPUTS, rng=jax.random.PRNGKey(0),
                                           sampling=TEMPERATURES[0], max_decode_len=8)
    # NaN in the relative-position bias of the decoder's self-attention: position 0 attends
    # only to itself (bucket 0), later positions see other buckets.
    def poison(path, x):
        name = jax.tree_util.keystr(path)
        if "decoder" in name and "relpos" in name:
            return x.at[..., 1:].set(jnp.nan) if x.shape[-1] > 1 else x
        return x

    broken = target.replace(params=jax.tree_util.tree_map_with_path(poison, target.params))
    for out in (decoding.autoregressive_decode(broken, INPUTS, rng=jax.random.PRNGKey(0),
                                               sampling=TEMPERATURES[0], max_decode_len=8),
                decoding.speculative_decode(broken, draft, INPUTS, rng=jax.random.PRNGKey(0),
                                            gamma=2, sampling=TEMPERATURES[0],
                                            max_decode_len=8)):
        flags, lengths = np.asarray(out.stats.nonfinite), np.asarray(out.lengths)
        assert flags.all()
        for b in range(len(INPUTS)):
            n = lengths[b]
            assert n < 8
            np.testing.assert_array_equal(np.asarray(out.tokens)[b, :n],
                                          np.asarray(clean.tokens)[b, :n])


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


# ----------------------------------------------------------------------------------------------
# Bad arguments: a clear error naming the argument, before anything is traced or run.

def _bad_calls(target, draft):
    key, greedy = jax.random.PRNGKey(0), SamplingConfig(0.0)
    spec = dict(rng=key, gamma=2, sampling=greedy, max_decode_len=8)
    vocab = target.vocab_size
    return [
        ("float ids", (INPUTS.astype(np.float32),), spec, TypeError, "dtype float32"),
        ("bool ids", (INPUTS > 1,), spec, TypeError, "dtype bool"),
        ("id = vocab", (np.asarray([[vocab, 1]]),), spec, ValueError, f"vocab_size={vocab}"),
        ("negative id", (np.asarray([[-3, 1]]),), spec, ValueError, "min -3"),
        ("int64 beyond 2^31", (np.asarray([[2 ** 40, 1]], np.int64),), spec, ValueError,
         "outside"),
        ("all-padding row", (np.asarray([[5, 1], [0, 0]]),), spec, ValueError, r"rows \[1\]"),
        ("zero-length rows", (np.zeros((2, 0), np.int32),), spec, ValueError, "shape"),
        ("1-D ids", (np.asarray([5, 1]),), spec, ValueError, "shape"),
        ("ragged rows", ([[5, 6, 1], [5, 1]],), spec, ValueError, "rows of different lengths"),
        ("int rng", (INPUTS,), {**spec, "rng": 0}, TypeError, "rng=0"),
        ("float rng", (INPUTS,), {**spec, "rng": jnp.zeros(2)}, TypeError, "PRNG key"),
        ("sampling None", (INPUTS,), {**spec, "sampling": None}, TypeError, "sampling=None"),
        ("sampling dict", (INPUTS,), {**spec, "sampling": {"temperature": 0}}, TypeError,
         "SamplingConfig"),
        ("gamma in the millions", (INPUTS,), {**spec, "gamma": 5_000_000}, ValueError,
         "gamma=5000000"),
        ("gamma 0", (INPUTS,), {**spec, "gamma": 0}, ValueError, "gamma=0"),
        # Dynamic gamma is a ChainDrafter's settings, passed as the draft (it brings gamma).
        ("initial_gamma with the constant schedule", (INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, initial_gamma=1)},
         ValueError, "applies to schedule='heuristic'"),
        ("initial_gamma beyond gamma", (INPUTS,),
         {**spec, "gamma": None,
          "draft": drafters.ChainDrafter(draft, 2, schedule="heuristic", initial_gamma=3)},
         ValueError, r"initial_gamma=3 is invalid: an int in \[1, gamma=2\]"),
        ("unknown schedule", (INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, schedule="adaptive")},
         ValueError, "schedule='adaptive' is invalid"),
        ("draft confidence str", (INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, confidence="0.4")},
         TypeError, "confidence='0.4'"),
        ("tree with another gamma", (INPUTS,), {**spec, "tree": (2, 2, 1)}, ValueError,
         "disagrees with tree"),
        ("tree of zeros", (INPUTS,), {**spec, "tree": (0,)}, ValueError, r"tree=\(0,\)"),
        ("gamma True", (INPUTS,), {**spec, "gamma": True}, ValueError, "gamma=True"),
        ("max_decode_len 0", (INPUTS,), {**spec, "max_decode_len": 0}, ValueError,
         "max_decode_len=0"),
        ("max_decode_len float", (INPUTS,), {**spec, "max_decode_len": 8.0}, ValueError,
         "max_decode_len=8.0"),
    ]


def test_bad_arguments_are_refused_with_the_argument_named(models):
    target, draft = models
    for name, args, kw, error, message in _bad_calls(target, draft):
        kw = dict(kw)
        drafter = kw.pop("draft", None)
        with pytest.raises(error, match=message):
            decoding.speculative_decode(target, draft if drafter is None else drafter, *args,
                                        **kw)
        # A drafter's settings, a tree or gamma are speculative decoding's only.
        if drafter is None and "tree" not in kw and "gamma" not in name:
            kw = {k: v for k, v in kw.items() if k != "gamma"}  # the baseline: the same checks
            with pytest.raises(error, match=message):
                decoding.autoregressive_decode(target, *args, **kw)


def test_decoder_only_prompts_must_be_right_padded():
    """A left-padded prompt, or one with a 0 inside, would silently change the continuation
    (0 is padding and BOS): refused by every decode entry point, naming the row."""
    module = t5.DecoderOnly(tiny_config())
    model = decoding.DecoderOnlyModel(module, random_params(module, 0))
    kw = dict(rng=jax.random.PRNGKey(0), sampling=SamplingConfig(0.0), max_decode_len=4)
    good = np.asarray([[5, 6, 7, 0], [5, 0, 0, 0], [0, 0, 0, 0]], np.int32)  # right-padded
    decoding.autoregressive_decode(model, good, **kw)
    for bad, row in ((np.asarray([[5, 6, 7, 8], [0, 0, 5, 6]]), 1),  # left padding
                     (np.asarray([[5, 0, 6, 7]]), 0)):  # a 0 inside
        with pytest.raises(ValueError, match=rf"rows \[{row}\] have a 0 before their last"):
            decoding.autoregressive_decode(model, bad, **kw)
        with pytest.raises(ValueError, match="a decoder-only prompt is its tokens, then"):
            decoding.speculative_decode(model, model, bad, gamma=2, **kw)


@pytest.mark.parametrize("temperature", [1e-9, 1e-5, -1.0, float("nan"), float("inf"), True])
def test_unsafe_temperatures_are_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature)
    SamplingConfig(1e-4)  # the smallest allowed one decodes finite probabilities
    probs = jax.jit(lambda x: sampling.adjusted_probs(x, SamplingConfig(1e-4)))(
        jnp.asarray([[30.0, 1.0, -20.0]]))
    assert np.all(np.isfinite(np.asarray(probs)))


def test_an_unaffordable_cache_is_refused_with_its_size(models):
    target, draft = models
    with pytest.raises(ValueError, match=r"KV cache .* needs [0-9.]+ GiB"):
        decoding.autoregressive_decode(target, INPUTS, rng=jax.random.PRNGKey(0),
                                       sampling=SamplingConfig(0.0), max_decode_len=10 ** 10)


@struct.dataclass
class _NoEos(decoding.EncoderDecoderModel):
    """The tiny target with EOS masked out of every distribution: no row ever stops early."""

    def extend(self, params, state, tokens):
        logits, state = super().extend(params, state, tokens)
        return logits.at[..., contract.EOS_ID].set(-1e9), state


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the estimate is sized by CPU rates")
def test_a_length_that_cannot_finish_is_refused_before_work(models):
    """max_decode_len=10**6 on a tiny model that never emits EOS: the KV cache fits in memory,
    but each step would attend over 10**6 slots for 10**6 steps (hours). Each of the four
    decoders refuses it within seconds, naming max_decode_len, the estimate, the longest
    length that fits and the way to lift the cap."""
    import re  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top

    from speculative.decode import validation  # pylint: disable=g-import-not-at-top

    target, draft = (_NoEos(m.module, m.params) for m in models)
    key, greedy, n = jax.random.PRNGKey(0), SamplingConfig(0.0), 10**6
    calls = {
        "autoregressive_decode": lambda: decoding.autoregressive_decode(
            target, INPUTS, rng=key, sampling=greedy, max_decode_len=n),
        "speculative_decode": lambda: decoding.speculative_decode(
            target, draft, INPUTS, rng=key, gamma=4, sampling=greedy, max_decode_len=n),
        "beam search": lambda: decoding.beam_search(target, INPUTS, beam_size=2,
                                                     max_decode_len=n),
        "speculative beam search": lambda: decoding.speculative_beam_search(
            target, draft, INPUTS, beam_size=2, draft_beam=2, gamma=3, max_decode_len=n),
    }
    fits = {}
    for name, call in calls.items():
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"max_decode_len=1000000 is more than {name} can "
                                             r"finish .* at least [0-9.]+ hours on \d+ CPU "
                                             r"core.*TIME_LIMIT_S = None") as e:
            call()
        assert time.monotonic() - start < 30, name
        fits[name] = int(re.search(r"at most (\d+) fits", str(e.value)).group(1))
    # The longest length that fits is itself accepted (checks only: nothing runs).
    validation.check_lengths((target,), jnp.asarray(INPUTS), fits["autoregressive_decode"])
    with pytest.raises(ValueError, match="max_decode_len"):
        validation.check_lengths((target,), jnp.asarray(INPUTS), fits["autoregressive_decode"] + 1)
    assert 1000 < fits["beam search"] < fits["autoregressive_decode"] < n
    # The cap is stated and lifts: per check, or for every call.
    validation.check_lengths((target, draft), jnp.asarray(INPUTS), n, 4, time_limit_s=None)
    with pytest.raises(ValueError, match=r"time_limit_s=0 is invalid"):
        validation.check_lengths((target,), jnp.asarray(INPUTS), 8, time_limit_s=0)


def test_beam_search_takes_numpy_length_penalties(models):
    """`length_penalty=np.float32(0.6)` is a finite float: accepted, same result as 0.6."""
    target = models[0]
    want = decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4)
    for penalty in (np.float32(0.6), np.float64(0.6)):
        got = decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4,
                                   length_penalty=penalty)
        np.testing.assert_array_equal(got.sequences, want.sequences)
    for bad in (np.float32("nan"), np.bool_(True), "0.6"):
        with pytest.raises(ValueError, match="length_penalty=.* is invalid: give a finite float"):
            decoding.beam_search(target, INPUTS, beam_size=2, max_decode_len=4,
                                 length_penalty=bad)


# ----------------------------------------------------------------------------------------------
# Bad settings of the runs, the trainer, the bundle, gin and the converter: each refused with
# its name in the message, before any model is built or any data is read.

def _run_settings_cases(tmp_path):
    from speculative import loading
    from speculative.checkpoints import hf as hf_checkpoints
    from speculative.checkpoints import t5x as checkpoints
    from speculative.data import tasks
    from speculative.experiments import demo, limits, mini_results
    from speculative.models import t5 as t5_lib
    from speculative.runs import config as config_lib
    from speculative.runs import infer, mini
    from speculative.training import distillation as training
    from speculative.training.config import TrainConfig

    cfg = tiny_config(vocab_size=40)
    base = dict(target_config=cfg, draft_config=cfg, target_checkpoint=None,
                draft_checkpoint=None, mixture_or_task_name="mini_ende",
                task_feature_lengths={"inputs": 8, "targets": 8}, output_dir=None)
    stopped = tmp_path / "stopped"  # a mini_results run stopped after a stage
    stopped.mkdir()
    (stopped / "results.partial.json").write_text('{"settings": {}}')
    used = tmp_path / "used"
    used.mkdir()
    (used / "model.safetensors").write_text("old")
    notes = tmp_path / "notes"  # an earlier export beside a user's own file
    notes.mkdir()
    (notes / "config.json").write_text("{}")
    (notes / "notes.txt").write_text("mine")
    gin_file = tmp_path / "x.gin"
    gin_file.write_text("GAMMA = 3\nTEMPERATURE = 0.0\n")
    undefined = tmp_path / "undefined.gin"  # reads a macro nothing defines
    undefined.write_text("from speculative.runs import infer\ninfer.infer.seed = %SEEED\n"
                         "SEED = 0\ninfer.infer.gamma = %SEED\n")
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("Open\tÖffnen\nClose the file\nSave\tSpeichern\n")
    typo_file = tmp_path / "typo.gin"  # a user's experiment file over the benchmark's
    typo_file.write_text('include "configs/runs/benchmark.gin"\nTEMPERATUR = 1.0\n')
    return [
        ("infer GAMMA", lambda: infer.InferSettings(**base, gamma=0), ValueError, "GAMMA=0"),
        ("infer BATCH_SIZE", lambda: infer.InferSettings(**base, batch_size=0), ValueError,
         "BATCH_SIZE=0"),
        ("infer NUM_EXAMPLES", lambda: infer.InferSettings(**base, num_examples=-2), ValueError,
         "NUM_EXAMPLES=-2"),
        ("infer TASK_FEATURE_LENGTHS", lambda: infer.InferSettings(
            **{**base, "task_feature_lengths": {"inputs": 8}}), ValueError,
         "TASK_FEATURE_LENGTHS"),
        ("infer DRAFT_MODEL vocab", lambda: infer.InferSettings(
            **{**base, "draft_config": tiny_config(vocab_size=41)}), ValueError,
         "DRAFT_MODEL.vocab_size"),
        ("infer TARGET_MODEL", lambda: infer.InferSettings(**{**base, "target_config": "x"}),
         ValueError, "TARGET_MODEL"),
        ("infer sampling", lambda: infer.InferSettings(**base, sampling=0.5), ValueError,
         "sampling"),
        ("train objective", lambda: TrainConfig(steps=1, objective="mse"), ValueError,
         "objective"),
        ("train buckets", lambda: TrainConfig(steps=1, buckets=(16, 8)), ValueError,
         "buckets"),
        ("train batch_tokens", lambda: TrainConfig(steps=1, batch_tokens=4),
         ValueError, "batch_tokens"),
        ("train optimizer", lambda: TrainConfig(steps=1, optimizer="sgd"), ValueError,
         "optimizer"),
        ("train label_smoothing", lambda: TrainConfig(steps=1, label_smoothing=1.5),
         ValueError, "label_smoothing"),
        ("train teacher_top_k", lambda: TrainConfig(steps=1, teacher_top_k=0),
         ValueError, "teacher_top_k"),
        ("train kl without teacher", lambda: training.train(training.TrainRun(
            model=tiny_config(vocab_size=4000), model_dir=str(tmp_path / "m"),
            config=TrainConfig(steps=1, objective="kl"), seed=0)), ValueError,
         "distill=True"),
        ("demo num_sentences", lambda: demo.run(num_sentences=0), ValueError,
         "num_sentences=0"),
        ("demo temperatures", lambda: demo.run(temperatures=[-1.0]), ValueError,
         "temperatures"),
        ("demo input_length", lambda: demo.run(input_length=0), ValueError, "input_length=0"),
        ("demo gamma 0", lambda: demo.run(gamma=0), ValueError, "gamma=0"),
        ("demo samples 0", lambda: demo.run(samples=0), ValueError, "samples=0"),
        ("demo tiny temperature", lambda: demo.run(temperatures=[0.0, 1e-9]), ValueError,
         r"temperatures=\[0.0, 1e-09\].*below 0.0001"),
        ("demo output_json", lambda: demo.run(output_json=str(used / "model.safetensors" / "x")),
         PermissionError, "output_json"),
        ("bundle batches num 0", lambda: mini.source_batches(0, 1, 48), ValueError, "num=0"),
        ("bundle batches skip", lambda: mini.source_batches(2, 1, 48, skip=-1), ValueError,
         "skip=-1"),
        ("bundle batches size", lambda: mini.source_batches(2, 0, 48), ValueError,
         "batch_size=0"),
        ("mini_results num_sentences 0", lambda: mini_results.run(
            str(tmp_path / "r"), num_sentences=0), ValueError, "num_sentences=0"),
        ("mini_results repeats 0", lambda: mini_results.run(str(tmp_path / "r"), repeats=0),
         ValueError, "repeats=0"),
        ("mini_results over a stopped run", lambda: mini_results.run(str(stopped)),
         FileExistsError, "--resume"),
        ("bundle model", lambda: mini.load("no_such_model"), ValueError, "no_such_model"),
        ("bundle target", lambda: mini.drafts("mini_draft_10"), ValueError,
         "target='mini_draft_10'"),
        ("gin macro typo", lambda: config_lib.check_macros([str(gin_file)], ["GAMA = 5"]),
         ValueError, "did you mean GAMMA"),
        ("gin file typo", lambda: config_lib.check_macros([str(typo_file)], []), ValueError,
         "TEMPERATUR is set but nothing reads it.*did you mean TEMPERATURES"),
        ("gin missing file", lambda: config_lib.parse_gin([str(tmp_path / "none.gin")]),
         FileNotFoundError, "none.gin"),
        ("converter used dir", lambda: hf_checkpoints.check_hf_target(used), FileExistsError,
         "overwrite"),
        ("converter over a user's files", lambda: hf_checkpoints.check_hf_target(
            notes, True), FileExistsError, r"holds \['notes.txt'\], which are not an HF"),
        # Replacing the HF directory would delete the checkpoint being converted: refused even
        # with overwrite, whether the output holds the source or lies inside it.
        ("converter over its source", lambda: hf_checkpoints.check_hf_target(
            used, True, source=used / "checkpoint_1"), ValueError, "overlap"),
        ("converter inside its source", lambda: hf_checkpoints.check_hf_target(
            used / "hf", True, source=used), ValueError, "overlap"),
        ("checkpoint path", lambda: checkpoints.load_params(tmp_path / "nope"),
         FileNotFoundError, "nope"),
        ("preset name", lambda: t5_lib.preset("t5_1_1_huge"), (KeyError, ValueError),
         "t5_1_1_huge"),
        ("gin undefined macro", lambda: config_lib.check_macros([str(undefined)], []),
         ValueError, "%SEEED is read but no gin file defines.*did you mean %SEED"),
        ("model dtype", lambda: loading.load_model(cfg, None, param_dtype="bf32"),
         ValueError, "param_dtype='bf32' is not a parameter dtype"),
        ("checkpoint dtype", lambda: checkpoints.load_params(tmp_path / "nope", "int8"),
         ValueError, "dtype='int8' is not a parameter dtype"),
        ("malformed TSV line", lambda: tasks.register_tsv_task(
            "faults_tsv", {"validation": str(tsv)}, tasks.mini_vocabulary()).get_dataset(
            {"inputs": 8, "targets": 8}, split="validation"), ValueError,
         r"pairs.tsv:2: 1 tab-separated fields in 'Close the file'"),
        ("limits depth beyond memory", lambda: limits.depth_sweep([6, 10 ** 5]), ValueError,
         r"depths=100000: .* needs [0-9.]+ GiB"),
    ]


def test_bad_run_settings_are_refused_with_their_names(tmp_path):
    from speculative.runs import mini
    for name, call, error, message in _run_settings_cases(tmp_path):
        if name.startswith(("bundle", "demo", "limits", "malformed")) and not mini.available():
            continue
        with pytest.raises(error, match=message):
            call()


def test_beam_search_checks_inputs_like_the_decode_loops():
    """Negative ids, ids >= vocab, an all-padding row, zero length, an empty batch and a
    forward too large for memory: each refused before any forward, naming the input."""
    from speculative import decoding
    from speculative.models import t5 as t5_lib
    from tests.helpers import random_params, tiny_config

    module = t5_lib.Transformer(tiny_config())
    model = decoding.EncoderDecoderModel(module, random_params(module, 0))
    ok = np.asarray([[3, 4, 1]], np.int32)
    cases = [
        (np.asarray([[3, -1, 1]]), ValueError, r"min -1"),
        (np.asarray([[3, 16, 1]]), ValueError, r"vocab_size=16"),
        (np.asarray([[3, 4, 1], [0, 0, 0]]), ValueError, r"rows \[1\] are all padding"),
        (np.zeros((1, 0), np.int32), ValueError, r"shape \(1, 0\)"),
        (np.zeros((0, 3), np.int32), ValueError, r"shape \(0, 3\)"),
        (np.asarray([[3.0, 4.0]]), TypeError, "float"),
    ]
    for search in (
            lambda x, **kw: decoding.beam_search(model, x, beam_size=2, **kw),
            lambda x, **kw: decoding.speculative_beam_search(model, model, x, beam_size=2,
                                                             draft_beam=2, gamma=2, **kw)):
        for inputs, error, message in cases:
            with pytest.raises(error, match=message):
                search(inputs, max_decode_len=4)
        with pytest.raises(ValueError, match=r"max_decode_len=1000000000.*needs [0-9.]+ GiB"):
            search(ok, max_decode_len=10**9)
        with pytest.raises(ValueError, match="max_decode_len=0"):
            search(ok, max_decode_len=0)


def test_incomplete_multihost_flags_are_refused_before_any_work():
    """--num_processes=2 --process_id=1 without a coordinator used to run one process that
    wrote outputs as if alone."""
    from speculative.runs import config as config_lib

    with pytest.raises(ValueError, match="give all three"):
        config_lib.initialize_distributed(None, 2, 1)
    with pytest.raises(ValueError, match=r"process_id=2 must lie in \[0, num_processes=2\)"):
        config_lib.initialize_distributed("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="distributed_timeout=0"):
        config_lib.initialize_distributed("localhost:1234", 2, 1, timeout_s=0)
