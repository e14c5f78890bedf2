"""speculative/decode/validation.py: bad arguments, unpadded prompts, unaffordable caches and
lengths that cannot finish are refused before any work, naming the value and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from speculative import decoding
from speculative.decode import contract, drafters
from speculative.decode.kernel import SamplingConfig
from speculative.models import t5
from tests.helpers import TINY_INPUTS, random_params, tiny_config

# ----------------------------------------------------------------------------------------------
# Bad arguments: a clear error naming the argument, before anything is traced or run.

def _bad_calls(target, draft):
    key, greedy = jax.random.PRNGKey(0), SamplingConfig(0.0)
    spec = dict(rng=key, gamma=2, sampling=greedy, max_decode_len=8)
    vocab = target.vocab_size
    return [
        ("float ids", (TINY_INPUTS.astype(np.float32),), spec, TypeError, "dtype float32"),
        ("bool ids", (TINY_INPUTS > 1,), spec, TypeError, "dtype bool"),
        ("id = vocab", (np.asarray([[vocab, 1]]),), spec, ValueError, f"vocab_size={vocab}"),
        ("negative id", (np.asarray([[-3, 1]]),), spec, ValueError, "min -3"),
        ("int64 beyond 2^31", (np.asarray([[2 ** 40, 1]], np.int64),), spec, ValueError,
         "outside"),
        ("all-padding row", (np.asarray([[5, 1], [0, 0]]),), spec, ValueError, r"rows \[1\]"),
        ("zero-length rows", (np.zeros((2, 0), np.int32),), spec, ValueError, "shape"),
        ("1-D ids", (np.asarray([5, 1]),), spec, ValueError, "shape"),
        ("ragged rows", ([[5, 6, 1], [5, 1]],), spec, ValueError, "rows of different lengths"),
        ("int rng", (TINY_INPUTS,), {**spec, "rng": 0}, TypeError, "rng=0"),
        ("float rng", (TINY_INPUTS,), {**spec, "rng": jnp.zeros(2)}, TypeError, "PRNG key"),
        ("sampling None", (TINY_INPUTS,), {**spec, "sampling": None}, TypeError, "sampling=None"),
        ("sampling dict", (TINY_INPUTS,), {**spec, "sampling": {"temperature": 0}}, TypeError,
         "SamplingConfig"),
        ("gamma in the millions", (TINY_INPUTS,), {**spec, "gamma": 5_000_000}, ValueError,
         "gamma=5000000"),
        ("gamma 0", (TINY_INPUTS,), {**spec, "gamma": 0}, ValueError, "gamma=0"),
        # Dynamic gamma is a ChainDrafter's settings, passed as the draft (it brings gamma).
        ("initial_gamma with the constant schedule", (TINY_INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, initial_gamma=1)},
         ValueError, "applies to schedule='heuristic'"),
        ("initial_gamma beyond gamma", (TINY_INPUTS,),
         {**spec, "gamma": None,
          "draft": drafters.ChainDrafter(draft, 2, schedule="heuristic", initial_gamma=3)},
         ValueError, r"initial_gamma=3 is invalid: an int in \[1, gamma=2\]"),
        ("unknown schedule", (TINY_INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, schedule="adaptive")},
         ValueError, "schedule='adaptive' is invalid"),
        ("draft confidence str", (TINY_INPUTS,),
         {**spec, "gamma": None, "draft": drafters.ChainDrafter(draft, 2, confidence="0.4")},
         TypeError, "confidence='0.4'"),
        ("tree with another gamma", (TINY_INPUTS,), {**spec, "tree": (2, 2, 1)}, ValueError,
         "disagrees with tree"),
        ("tree of zeros", (TINY_INPUTS,), {**spec, "tree": (0,)}, ValueError, r"tree=\(0,\)"),
        ("gamma True", (TINY_INPUTS,), {**spec, "gamma": True}, ValueError, "gamma=True"),
        ("max_decode_len 0", (TINY_INPUTS,), {**spec, "max_decode_len": 0}, ValueError,
         "max_decode_len=0"),
        ("max_decode_len float", (TINY_INPUTS,), {**spec, "max_decode_len": 8.0}, ValueError,
         "max_decode_len=8.0"),
    ]


def test_bad_arguments_are_refused_with_the_argument_named(tiny_models):
    target, draft = tiny_models
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


def test_an_unaffordable_cache_is_refused_with_its_size(tiny_models):
    target, draft = tiny_models
    with pytest.raises(ValueError, match=r"KV cache .* needs [0-9.]+ GiB"):
        decoding.autoregressive_decode(target, TINY_INPUTS, rng=jax.random.PRNGKey(0),
                                       sampling=SamplingConfig(0.0), max_decode_len=10 ** 10)


@struct.dataclass
class _NoEos(decoding.EncoderDecoderModel):
    """The tiny target with EOS masked out of every distribution: no row ever stops early."""

    def extend(self, params, state, tokens):
        logits, state = super().extend(params, state, tokens)
        return logits.at[..., contract.EOS_ID].set(-1e9), state


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the estimate is sized by CPU rates")
def test_a_length_that_cannot_finish_is_refused_before_work(tiny_models):
    """max_decode_len=10**6 on a tiny model that never emits EOS: the KV cache fits in memory,
    but each step would attend over 10**6 slots for 10**6 steps (hours). Each of the four
    decoders refuses it within seconds, naming max_decode_len, the estimate, the longest
    length that fits and the way to lift the cap."""
    import re  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top

    from speculative.decode import validation  # pylint: disable=g-import-not-at-top

    target, draft = (_NoEos(m.module, m.params) for m in tiny_models)
    key, greedy, n = jax.random.PRNGKey(0), SamplingConfig(0.0), 10**6
    calls = {
        "autoregressive_decode": lambda: decoding.autoregressive_decode(
            target, TINY_INPUTS, rng=key, sampling=greedy, max_decode_len=n),
        "speculative_decode": lambda: decoding.speculative_decode(
            target, draft, TINY_INPUTS, rng=key, gamma=4, sampling=greedy, max_decode_len=n),
        "beam search": lambda: decoding.beam_search(target, TINY_INPUTS, beam_size=2,
                                                     max_decode_len=n),
        "speculative beam search": lambda: decoding.speculative_beam_search(
            target, draft, TINY_INPUTS, beam_size=2, draft_beam=2, gamma=3, max_decode_len=n),
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
    validation.check_lengths((target,), jnp.asarray(TINY_INPUTS), fits["autoregressive_decode"])
    with pytest.raises(ValueError, match="max_decode_len"):
        validation.check_lengths((target,), jnp.asarray(TINY_INPUTS),
                                 fits["autoregressive_decode"] + 1)
    assert 1000 < fits["beam search"] < fits["autoregressive_decode"] < n
    # The cap is stated and lifts: per check, or for every call.
    validation.check_lengths((target, draft), jnp.asarray(TINY_INPUTS), n, 4, time_limit_s=None)
    with pytest.raises(ValueError, match=r"time_limit_s=0 is invalid"):
        validation.check_lengths((target,), jnp.asarray(TINY_INPUTS), 8, time_limit_s=0)
