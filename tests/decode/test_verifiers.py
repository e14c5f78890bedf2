"""speculative/decode/verifiers.py: the greedy and sampled verifiers, and verifier objects
in place of the policy the sampling settings choose."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import kernel as sampling
from speculative.decode import loops as decoding
from speculative.decode import verifiers as verification
from speculative.decode.kernel import SamplingConfig
from speculative.models import t5
from tests.helpers import decoding as td
from tests.helpers import tiny_config

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def encdec():
    return td.pair(t5.Transformer(tiny_config()))


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


# ----------------------------------------------------------------------------------------------
# From tests/test_sampling.py.
def _one_hot(v, i):
    p = np.zeros(v)
    p[i] = 1.0
    return p


def test_num_drafted_takes_the_bonus_from_the_next_position():
    """Row drafted 1 of 3 tokens (dynamic gamma): after accepting it, t ~ p_2, not a residual."""
    v = 5
    q = np.full((1, 3, v), 1.0 / v)
    p = np.stack([q[0, 0], _one_hot(v, 3), _one_hot(v, 0), _one_hot(v, 0)])[None]
    drafts = jnp.array([[2, 3, 3]])
    n, t = sampling.speculative_sample(p, q, drafts, jax.random.PRNGKey(0),
                                       num_drafted=jnp.array([1]))
    assert (int(n[0]), int(t[0])) == (1, 3)  # x_1 ~ q = p_1 is accepted; t from p_2 = one-hot 3
    n, t = _greedy(p, drafts, num_drafted=jnp.array([1]))
    assert int(n[0]) <= 1


def _greedy(p, drafts, lenience=1.0, num_drafted=None):
    """The greedy verifier on the target's distributions p (its logits are log p)."""
    verdict = verification.GreedyVerifier(lenience).verify(jnp.log(p), None, drafts,
                                                           num_drafted, None)
    return verdict.num_accepted, verdict.next_token


def test_greedy_kernel_and_argmax_lenience():
    p = jnp.array([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]])
    n, t = _greedy(p, jnp.array([[0, 1]]))
    assert (int(n[0]), int(t[0])) == (2, 2)
    n, t = _greedy(p, jnp.array([[1, 1]]))
    assert (int(n[0]), int(t[0])) == (0, 0)
    # Lenience 0.5: x=1 has p=0.3 >= 0.5 * 0.5, so it is accepted; then x=0 at position 2 has
    # p=0.1 < 0.5 * 0.6 and is rejected; the correction is argmax p_2 = 1.
    n, t = _greedy(p, jnp.array([[1, 0]]), lenience=0.5)
    assert (int(n[0]), int(t[0])) == (1, 1)
