"""Exactness of the decode loops: greedy identity, joint law of sampled tokens, one compilation.

The joint test enumerates the target's exact law of the first three generated tokens by teacher
forcing (V^2 prefixes in one batch), draws >= 50,000 samples from `speculative_decode` as one
batch, and applies a chi-square test. A deliberately wrong kernel must fail the same test.
"""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import contract, drafters
from speculative.decode import loops as decoding
from speculative.decode import sampling as sampling_lib
from speculative.decode import stats as stats_lib
from speculative.decode.sampling import SamplingConfig
from speculative.models import adapters, t5
from tests.helpers import decoding as td
from tests.helpers import random_params, tiny_config

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def encdec():
    return td.pair(t5.Transformer(tiny_config()))


@pytest.fixture(scope="module")
def deconly():
    return td.pair(t5.DecoderOnly(tiny_config()))


# ----------------------------------------------------------------------------------------------
# Greedy identity.


@pytest.mark.parametrize("gamma", [  # CI: 1, 4 and 8 (each gamma compiles its own loop)
    g if g in (1, 4, 8) else pytest.param(g, marks=pytest.mark.slow) for g in range(1, 9)])
def test_greedy_speculative_equals_greedy_target_encdec(encdec, gamma):
    target, random_draft = encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    ar = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                        sampling=GREEDY, max_decode_len=16)
    for draft, expect_alpha in ((random_draft, None), (target, 1.0)):
        sp = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                         gamma=gamma, sampling=GREEDY, max_decode_len=16)
        np.testing.assert_array_equal(sp.tokens, ar.tokens)
        np.testing.assert_array_equal(sp.lengths, ar.lengths)
        if expect_alpha:
            assert sp.stats.alpha == expect_alpha
            assert int(sp.stats.rounds) <= -(-16 // (gamma + 1))


@pytest.mark.parametrize("gamma", [1, pytest.param(2, marks=pytest.mark.slow),
                                   pytest.param(5, marks=pytest.mark.slow), 8])
def test_greedy_speculative_equals_greedy_target_decoder_only(deconly, gamma):
    target, random_draft = deconly
    prompts = td.prompts([4, 0, 6, 2], 6, seed=1)
    ar = decoding.autoregressive_decode(target, prompts, rng=jax.random.PRNGKey(0),
                                        sampling=GREEDY, max_decode_len=12)
    for draft in (random_draft, target):
        sp = decoding.speculative_decode(target, draft, prompts, rng=jax.random.PRNGKey(0),
                                         gamma=gamma, sampling=GREEDY, max_decode_len=12)
        np.testing.assert_array_equal(sp.tokens, ar.tokens)


@pytest.mark.parametrize("confidence", [0.3, 0.9])
def test_greedy_identity_with_dynamic_gamma(encdec, confidence):
    target, draft = encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    ar = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                        sampling=GREEDY, max_decode_len=16)
    for d in (draft, target):
        sp = decoding.speculative_decode(target, drafters.ChainDrafter(d, 5, confidence),
                                         inputs, rng=jax.random.PRNGKey(0), gamma=5,
                                         sampling=GREEDY, max_decode_len=16)
        np.testing.assert_array_equal(sp.tokens, ar.tokens)
        drafted, rounds = int(jnp.sum(sp.stats.drafted)), int(jnp.sum(sp.stats.target_calls))
        assert rounds <= drafted <= 5 * rounds
        if d is draft:  # the random tiny draft is unsure: the threshold must stop rows early
            assert drafted < 5 * rounds, "dynamic gamma never stopped drafting at temperature 0"


@pytest.mark.slow  # the Python loop runs flax op by op: ~30 s on 2 cores
def test_debug_python_loop_matches_jitted(encdec):
    target, draft = encdec
    inputs = td.prompts([5, 2], 5)
    kw = dict(rng=jax.random.PRNGKey(3), gamma=2, sampling=SamplingConfig(1.0), max_decode_len=3)
    fast = decoding.speculative_decode(target, draft, inputs, **kw)
    slow = decoding.speculative_decode(target, draft, inputs, debug=True, **kw)
    np.testing.assert_array_equal(fast.tokens, slow.tokens)


# ----------------------------------------------------------------------------------------------
# Joint law of the first three sampled tokens.


@pytest.fixture(scope="module")
def joint_models():
    module = t5.Transformer(tiny_config(vocab_size=td.VOCAB))
    target, draft = td.pair(module, seeds=(3, 4))
    return module, target, draft, np.array([[3, 5, 2, 7, 1]], np.int32)


@pytest.mark.parametrize("gamma", [pytest.param(1, marks=pytest.mark.slow), 3])  # CI: gamma 3
@pytest.mark.parametrize("name", [  # CI: T = 1 and T = 0.7 + top-k; top-p slow
    pytest.param(n, marks=pytest.mark.slow) if n == "topp0.8" else n
    for n in sorted(td.JOINT_CONFIGS)])
def test_joint_law_of_three_tokens_matches_target(joint_models, name, gamma):
    module, target, draft, enc = joint_models
    cfg = td.JOINT_CONFIGS[name]
    probs = td.exact_joint(module, target.params, enc, cfg)
    assert np.sum(probs * td.N_SAMPLES >= 5) >= 20, "law too concentrated for a meaningful test"
    samples, _ = td.sample_three(target, draft, enc, cfg, gamma, seed=gamma)
    assert td.joint_pvalue(samples, probs) > 1e-6


def test_joint_law_with_dynamic_gamma(joint_models):
    """Rows stop drafting when the draft is unsure (`confidence`): still the target's law."""
    module, target, draft, enc = joint_models
    cfg = td.JOINT_CONFIGS["t1"]
    probs = td.exact_joint(module, target.params, enc, cfg)
    samples, stats = td.sample_three(target, draft, enc, cfg, gamma=3, seed=9, confidence=0.4)
    drafted, rounds = int(jnp.sum(stats.drafted)), int(jnp.sum(stats.target_calls))
    assert rounds <= drafted < 3 * rounds, "the threshold should stop some rows early"
    assert td.joint_pvalue(samples, probs) > 1e-6


def test_joint_law_with_the_heuristic_gamma_schedule(joint_models):
    """transformers' +2 / -1 schedule (per row, from 1 draft up to gamma): the target's law."""
    module, target, draft, enc = joint_models
    cfg = td.JOINT_CONFIGS["t1"]
    probs = td.exact_joint(module, target.params, enc, cfg)
    samples, stats = td.sample_three(target, draft, enc, cfg, gamma=3, seed=11,
                                   schedule="heuristic", initial_gamma=1)
    drafted, rounds = int(jnp.sum(stats.drafted)), int(jnp.sum(stats.target_calls))
    assert rounds <= drafted < 3 * rounds  # budgets of 1 (the start) and more after accepts
    assert td.joint_pvalue(samples, probs) > 1e-6


def test_heuristic_schedule_greedy_identity_and_budget_rule(encdec):
    target, draft = encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    ar = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                        sampling=GREEDY, max_decode_len=16)
    for d in (draft, target):
        drafter = drafters.ChainDrafter(d, 6, schedule="heuristic", initial_gamma=2)
        sp = decoding.speculative_decode(target, drafter, inputs, rng=jax.random.PRNGKey(0),
                                         gamma=None, sampling=GREEDY, max_decode_len=16)
        np.testing.assert_array_equal(sp.tokens, ar.tokens)
    # With the target as its own draft every draft is accepted: 2, 4, 6, 6, ... per round.
    rounds = int(sp.stats.rounds)
    assert int(sp.stats.drafted[0]) <= 2 + 4 + 6 * (rounds - 2)
    got = drafter._next_budget(jnp.array([2, 2, 5, 1]), jnp.array([2, 1, 5, 0]),
                               jnp.array([2, 2, 5, 1]))
    np.testing.assert_array_equal(got, [4, 1, 6, 1])  # +2, -1, capped at gamma, floor 1
    kw = dict(rng=jax.random.PRNGKey(0), gamma=None, sampling=GREEDY, max_decode_len=4)
    with pytest.raises(ValueError, match="schedule='linear'"):
        decoding.speculative_decode(
            target, drafters.ChainDrafter(draft, 3, schedule="linear"), inputs, **kw)
    with pytest.raises(ValueError, match="initial_gamma=7"):
        decoding.speculative_decode(target, drafters.ChainDrafter(
            draft, 3, schedule="heuristic", initial_gamma=7), inputs, **kw)
    with pytest.raises(ValueError, match="gamma=4 but the drafter drafts 3"):
        decoding.speculative_decode(target, drafters.ChainDrafter(draft, 3), inputs,
                                    **{**kw, "gamma": 4})


def test_negative_control_wrong_residual_fails(joint_models, monkeypatch):
    module, target, draft, enc = joint_models
    cfg = td.JOINT_CONFIGS["t1"]
    probs = td.exact_joint(module, target.params, enc, cfg)
    jax.clear_caches()
    monkeypatch.setattr(sampling_lib, "speculative_sample", td.kernel_resampling_from_p)
    try:
        samples, _ = td.sample_three(target, draft, enc, cfg, gamma=3, seed=5)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert td.joint_pvalue(samples, probs) < 1e-6


# ----------------------------------------------------------------------------------------------
# Statistics, lenience, compilation, ends of sequences.


def test_self_draft_accepts_everything_and_emits_gamma_plus_one(encdec):
    target, _ = encdec
    inputs = np.repeat(td.prompts([6], 6), 64, 0)
    out = decoding.speculative_decode(target, target, inputs, rng=jax.random.PRNGKey(1), gamma=3,
                                      sampling=SamplingConfig(1.0), max_decode_len=16)
    s = out.stats
    assert int(jnp.sum(s.accepted)) >= 0.999 * int(jnp.sum(s.drafted))
    # Each round emits gamma + 1 = 4 tokens unless the row ends (EOS or max_decode_len).
    full_rounds = np.asarray(out.lengths) // 4
    assert np.all(np.asarray(s.target_calls) <= full_rounds + 1)
    assert s.alpha > 0.999


@pytest.mark.slow  # ~13 s; lenience (paper A.5) is not exact by design
def test_alpha_grows_as_lenience_falls(encdec):
    target, draft = encdec
    inputs = np.repeat(td.prompts([6], 6), 256, 0)
    alphas = []
    for lenience in (1.0, 0.5, 0.1):
        out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(2),
                                          gamma=3, sampling=SamplingConfig(1.0),
                                          max_decode_len=8, lenience=lenience)
        alphas.append(out.stats.alpha)
    assert alphas[0] < alphas[1] < alphas[2], alphas


def test_a_verifier_object_replaces_the_policy_sampling_chooses(encdec):
    """`verifier=` plugs in an acceptance rule: the built-in policies given as objects decode
    as the arguments that choose them do, and a policy the loop cannot use is refused."""
    from speculative.decode import verifiers as verification  # pylint: disable=import-outside-toplevel

    target, draft = encdec
    inputs = np.repeat(td.prompts([6], 6), 8, 0)
    t1 = SamplingConfig(1.0)
    kw = dict(rng=jax.random.PRNGKey(3), gamma=3, max_decode_len=8, sampling=t1)
    # lenience=0.5 decodes differently from the exact default (test_alpha_grows_as_lenience_
    # falls); the same policy given as an object decodes the same tokens and statistics.
    a = decoding.speculative_decode(target, draft, inputs, **kw, lenience=0.5)
    b = decoding.speculative_decode(target, draft, inputs, **kw,
                                    verifier=verification.LenientVerifier(t1, 0.5))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.stats.summary() == b.stats.summary()
    kw["sampling"] = GREEDY

    class Unhashable(verification.GreedyVerifier):
        __hash__ = None

    with pytest.raises(TypeError, match="not hashable"):
        decoding.speculative_decode(target, draft, inputs, **kw, verifier=Unhashable())
    with pytest.raises(TypeError, match=r"lacks \['propose', 'top_probability'"):
        decoding.speculative_decode(target, draft, inputs, **kw, verifier=object())
    with pytest.raises(ValueError, match="give the lenience to the verifier"):
        decoding.speculative_decode(target, draft, inputs, **kw, lenience=0.5,
                                    verifier=verification.GreedyVerifier())


def test_compiles_once_for_new_inputs_and_acceptance_patterns(encdec, monkeypatch):
    target, draft = encdec
    counted = jax.jit(chex.assert_max_traces(decoding._speculative_impl, n=1),
                      static_argnames=decoding._SPEC_STATIC)
    monkeypatch.setattr(decoding, "_SPEC_JIT", counted)
    kw = dict(gamma=3, sampling=SamplingConfig(1.0), max_decode_len=10)
    a = decoding.speculative_decode(target, draft, td.prompts([5, 3], 5, seed=1),
                                    rng=jax.random.PRNGKey(0), **kw)
    b = decoding.speculative_decode(target, target, td.prompts([2, 4], 5, seed=2),
                                    rng=jax.random.PRNGKey(1), **kw)
    assert a.stats.summary()["accepted_per_position"] != b.stats.summary()["accepted_per_position"]


def test_eos_and_lengths(encdec):
    target, draft = encdec
    out = decoding.speculative_decode(target, draft, np.repeat(td.prompts([6], 6), 128, 0),
                                      rng=jax.random.PRNGKey(4), gamma=4,
                                      sampling=SamplingConfig(1.5), max_decode_len=12)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    assert np.any(lengths < 12), "expected some rows to end at EOS"
    for row, n in zip(tokens, lengths):
        assert not np.any(row[:n - 1] == contract.EOS_ID)
        if n < 12:
            assert row[n - 1] == contract.EOS_ID
        assert np.all(row[n:] == 0)
    np.testing.assert_array_equal(out.stats.generated, lengths)


def test_bad_inputs_raise_clear_errors(encdec, deconly):
    target, draft = encdec
    inputs = td.prompts([3], 3)
    kw = dict(rng=jax.random.PRNGKey(0), sampling=GREEDY)
    with pytest.raises(ValueError, match="gamma=0"):
        decoding.speculative_decode(target, draft, inputs, gamma=0, max_decode_len=4, **kw)
    with pytest.raises(ValueError, match="max_decode_len=0"):
        decoding.speculative_decode(target, draft, inputs, gamma=2, max_decode_len=0, **kw)
    with pytest.raises(ValueError, match="max_decode_len=0"):
        decoding.autoregressive_decode(target, inputs, max_decode_len=0, **kw)
    with pytest.raises(ValueError, match="lenience"):
        decoding.speculative_decode(target, draft, inputs, gamma=2, max_decode_len=4,
                                    lenience=1.5, **kw)
    with pytest.raises(ValueError, match="confidence"):
        decoding.speculative_decode(target, drafters.ChainDrafter(draft, 2, confidence=-0.1),
                                    inputs, gamma=None, max_decode_len=4, **kw)
    other = t5.Transformer(tiny_config(vocab_size=17))
    big_draft = adapters.EncoderDecoderModel(other, random_params(other, 0))
    with pytest.raises(ValueError, match="vocabularies differ"):
        decoding.speculative_decode(target, big_draft, inputs, gamma=2, max_decode_len=4, **kw)
    limited, _ = td.pair(t5.DecoderOnly(tiny_config()), max_length=16)
    with pytest.raises(ValueError, match="cache holds 16 tokens"):
        decoding.speculative_decode(limited, deconly[1], td.prompts([12], 12), gamma=2,
                                    max_decode_len=4, **kw)
    with pytest.raises(ValueError, match="read `inputs` differently"):
        decoding.speculative_decode(deconly[0], draft, inputs, gamma=2, max_decode_len=4, **kw)
    with pytest.raises(TypeError, match="t5.Transformer"):
        adapters.EncoderDecoderModel(deconly[0].module, deconly[0].params)


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
