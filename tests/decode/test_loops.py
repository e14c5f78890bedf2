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
from speculative.decode.kernel import SamplingConfig
from speculative.models import adapters, t5
from tests.helpers import TINY_INPUTS, random_params, tiny_config
from tests.helpers import decoding as td

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
    samples = td.sample_three_with_wrong_kernel(monkeypatch, target, draft, enc, cfg, 3, 5)
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


def test_moved_arguments_name_their_new_form(encdec):
    """draft_confidence / gamma_schedule / initial_gamma became ChainDrafter settings: passing
    them gives the new call, not a bare 'unexpected keyword argument'."""
    target, draft = encdec
    kw = dict(rng=jax.random.PRNGKey(0), sampling=GREEDY, max_decode_len=4, gamma=2)
    with pytest.raises(TypeError, match=r"ChainDrafter\(draft, gamma, confidence=0.4\)"):
        decoding.speculative_decode(target, draft, TINY_INPUTS, draft_confidence=0.4, **kw)
    with pytest.raises(TypeError, match="schedule='heuristic', initial_gamma=1"):
        decoding.speculative_decode(target, draft, TINY_INPUTS, gamma_schedule="heuristic",
                                    initial_gamma=1, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'gama'"):
        decoding.speculative_decode(target, draft, TINY_INPUTS, gama=2, **kw)


# ----------------------------------------------------------------------------------------------
# From tests/test_faults.py.
TEMPERATURES = (SamplingConfig(0.0), SamplingConfig(1.0))


def _poisoned(params, leaf="decoder"):
    """params with every leaf under `leaf` (a path fragment) set to NaN."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.full_like(x, jnp.nan) if leaf in jax.tree_util.keystr(path) else x,
        params)



@pytest.mark.parametrize("cfg", TEMPERATURES, ids=["T0", "T1"])
def test_nan_target_stops_and_flags_every_row(tiny_models, cfg):
    target, draft = tiny_models
    broken = target.replace(params=_poisoned(target.params))
    key = jax.random.PRNGKey(0)
    ar = decoding.autoregressive_decode(broken, TINY_INPUTS, rng=key, sampling=cfg,
                                        max_decode_len=8)
    spec = decoding.speculative_decode(broken, draft, TINY_INPUTS, rng=key, gamma=3, sampling=cfg,
                                       max_decode_len=8)
    for out in (ar, spec):
        assert np.asarray(out.stats.nonfinite).tolist() == [True, True]
        assert np.asarray(out.lengths).tolist() == [0, 0]  # NaN from the first step: no text
        assert out.stats.summary()["nonfinite_rows"] == 2
        with pytest.raises(FloatingPointError, match=r"rows \[0, 1\]"):
            out.stats.check_finite()
    assert int(np.sum(spec.stats.accepted)) == 0


@pytest.mark.parametrize("cfg", TEMPERATURES, ids=["T0", "T1"])
def test_nan_draft_never_gets_a_token_accepted(tiny_models, cfg):
    target, draft = tiny_models
    broken = draft.replace(params=_poisoned(draft.params))
    key = jax.random.PRNGKey(1)
    spec = decoding.speculative_decode(target, broken, TINY_INPUTS, rng=key, gamma=3, sampling=cfg,
                                       max_decode_len=8)
    assert int(np.sum(spec.stats.accepted)) == 0
    assert not np.any(np.asarray(spec.stats.nonfinite))  # the target is fine: rows complete
    assert np.all(np.asarray(spec.lengths) > 0)
    assert int(np.sum(spec.stats.drafted)) == 0  # drafts end before a NaN distribution
    spec.stats.check_finite()
    if cfg.greedy:  # the target decides every token
        ar = decoding.autoregressive_decode(target, TINY_INPUTS, rng=key, sampling=cfg,
                                            max_decode_len=8)
        np.testing.assert_array_equal(ar.tokens, spec.tokens)


def test_nan_after_some_tokens_keeps_the_exact_prefix(tiny_models):
    """A target that breaks only on some inputs' later positions: rows stop where their
    distribution turns non-finite, and what was emitted before equals the clean decode."""
    target, draft = tiny_models
    clean = decoding.autoregressive_decode(target, TINY_INPUTS, rng=jax.random.PRNGKey(0),
                                           sampling=TEMPERATURES[0], max_decode_len=8)
    # NaN in the relative-position bias of the decoder's self-attention: position 0 attends
    # only to itself (bucket 0), later positions see other buckets.
    def poison(path, x):
        name = jax.tree_util.keystr(path)
        if "decoder" in name and "relpos" in name:
            return x.at[..., 1:].set(jnp.nan) if x.shape[-1] > 1 else x
        return x

    broken = target.replace(params=jax.tree_util.tree_map_with_path(poison, target.params))
    for out in (decoding.autoregressive_decode(broken, TINY_INPUTS, rng=jax.random.PRNGKey(0),
                                               sampling=TEMPERATURES[0], max_decode_len=8),
                decoding.speculative_decode(broken, draft, TINY_INPUTS, rng=jax.random.PRNGKey(0),
                                            gamma=2, sampling=TEMPERATURES[0],
                                            max_decode_len=8)):
        flags, lengths = np.asarray(out.stats.nonfinite), np.asarray(out.lengths)
        assert flags.all()
        for b in range(len(TINY_INPUTS)):
            n = lengths[b]
            assert n < 8
            np.testing.assert_array_equal(np.asarray(out.tokens)[b, :n],
                                          np.asarray(clean.tokens)[b, :n])
