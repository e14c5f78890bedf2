"""Verification policies: how drafts are drawn and how the target accepts them.

One small frozen dataclass per policy (hashable, so static under jit), each with every method
the loops call, so the loops have no per-policy branches. Two Protocols say what a layout
needs: `ChainVerifier` (a chain's rounds and the autoregressive step) and `TreeVerifier` (those
and a token tree's two methods); the built-in policies are tree verifiers (`Verifier`, the old
name). The loops
split the keys (decode/rounds.py `RoundKeys`) and hand every method a real key; the greedy
policy ignores it:

    propose(logits, rng)       -> (x [B], q [B, V] or its size-1 summary [B, 1])
    top_probability(logits, q) -> [B] the draft's confidence in x (dynamic gamma)
    verify(logits, q, x, num_drafted, rng) -> Verdict
    next_token(logits, rng)    -> (token [B], finite [B])    (the autoregressive step)

    GreedyVerifier(lenience=1)        temperature 0: drafts are the draft's argmax; a draft is kept
                                      iff it is the target's argmax (or, with lenience l < 1,
                                      p(x) >= l max p, paper A.5); deterministic.
    ExactVerifier(sampling)           speculative sampling (Algorithm 1): the output has the
                                      target's law under `sampling`.
    LenientVerifier(sampling, l)      the same with the relaxed test u l q(x) < p(x) (paper A.5;
                                      faster, not exact).

    children(logits, num, rng) -> (tokens [..., num], valid, q)   (a token tree's node;
    verify_tree(tree, logits, q, node_tokens, valid, rng) -> the accepted path    TreeVerifier)

Lenience is set in one place, the policy: `for_sampling(sampling, lenience)` picks the policy
(what `speculative_decode(lenience=...)` does), and a layout reads `verifier.lenience` (a tree
needs 1: `rounds.TreeLayout.check_verifier`). Another acceptance rule is one more class with
these methods (docs/extending.md).

Shape legend: B batch, G gamma, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, Protocol, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from speculative.decode import kernel as sampling_lib
from speculative.decode import trees
from speculative.decode.kernel import SamplingConfig

Array = jax.Array


@struct.dataclass
class Verdict:
    """What one round's verification decided, per row.

    Attributes:
      num_accepted: `[B]` int32 n, leading drafts kept (0 for a row whose emitted position is
        not finite; see `broken`).
      next_token: `[B]` int32, the token emitted after them (correction or bonus).
      beta: `[B, G]` float32, sum_x min(p, q) at each drafted position (0 or 1 at temperature
        0); its mean over examined positions is the paper's alpha.
      finite: `[B, G + 1]` bool, the target's distribution is usable at each position.
    """

    num_accepted: Array
    next_token: Array
    beta: Array
    finite: Array

    def broken(self, active: Array) -> Array:
        """`[B]` bool: active rows whose next token would come from NaN/inf (never emitted)."""
        ok = jnp.take_along_axis(self.finite, self.num_accepted[:, None], axis=1)[:, 0]
        return active & ~ok


@dataclasses.dataclass(frozen=True)
class GreedyVerifier:
    """Temperature 0 (see the module docstring)."""

    lenience: float = 1.0

    def __post_init__(self):
        sampling_lib.validate_lenience(self.lenience)

    def propose(self, logits, rng):
        del rng  # deterministic
        x = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return x, jnp.ones(x.shape + (1,), jnp.float32)  # q is one-hot: only its max, 1, is kept

    def top_probability(self, logits, q):
        """The draft's confidence in its token (dynamic gamma): softmax max of its logits."""
        return jnp.max(jax.nn.softmax(jnp.asarray(logits, jnp.float32)), axis=-1)

    def verify(self, logits, q, x, num_drafted, rng) -> Verdict:
        del q, rng
        n, t, accept = sampling_lib.greedy_verify(logits, x, self.lenience, num_drafted)
        return Verdict(num_accepted=n, next_token=t, beta=accept.astype(jnp.float32),
                       finite=sampling_lib.finite_rows(logits))

    def next_token(self, logits, rng):
        del rng
        return (jnp.argmax(logits, axis=-1).astype(jnp.int32),
                sampling_lib.finite_rows(logits))

    def children(self, logits, num, rng):
        """A tree node's `num` children: the draft's top-`num` tokens; `(tokens [..., num],
        valid [..., num], q)` with q the size-1 summary (never read at temperature 0)."""
        del rng
        tokens, valid = trees.greedy_children(logits, num)
        return tokens, valid, jnp.ones(logits.shape[:-1] + (1,), jnp.float32)

    def verify_tree(self, tree, logits, q, node_tokens, valid, rng):
        """The accepted path of a verified token tree (`trees.greedy_walk`)."""
        del q, rng
        return trees.greedy_walk(tree, logits, node_tokens, valid)


class _Sampled:
    """The methods exact and lenient verification share: drafts drawn from the adjusted q,
    the target's law p under the same `sampling`. Subclasses set `sampling` and `lenience`."""

    sampling: SamplingConfig
    lenience: float

    def propose(self, logits, rng):
        q = sampling_lib.adjusted_probs(logits, self.sampling)
        return sampling_lib.sample(rng, q), q

    def top_probability(self, logits, q):
        del logits
        return jnp.max(q, axis=-1)

    def verify(self, logits, q, x, num_drafted, rng) -> Verdict:
        gamma = x.shape[1]
        p = sampling_lib.adjusted_probs(logits, self.sampling)
        n, t = sampling_lib.speculative_sample(p, q, x, rng, self.lenience,
                                               num_drafted=num_drafted)
        finite = sampling_lib.finite_rows(p)
        beta = sampling_lib.acceptance_rate(p[:, :gamma], q, self.lenience)
        beta = jnp.where(finite[:, :gamma] & sampling_lib.finite_rows(q), beta, 0.0)
        return Verdict(num_accepted=n, next_token=t, beta=beta, finite=finite)

    def next_token(self, logits, rng):
        p = sampling_lib.adjusted_probs(logits, self.sampling)
        return sampling_lib.sample(rng, p), sampling_lib.finite_rows(p)

    def children(self, logits, num, rng):
        """`num` children drawn without replacement from the adjusted q; `(tokens, valid, q)`."""
        q = sampling_lib.adjusted_probs(logits, self.sampling)
        tokens, valid = trees.sampled_children(q, num, rng)
        return tokens, valid, q

    def verify_tree(self, tree, logits, q, node_tokens, valid, rng):
        """Recursive rejection sampling down the tree (`trees.exact_walk`): exact."""
        p = sampling_lib.adjusted_probs(logits, self.sampling)
        return trees.exact_walk(tree, p, q, node_tokens, valid, rng)


@dataclasses.dataclass(frozen=True)
class ExactVerifier(_Sampled):
    """Speculative sampling under `sampling` (temperature > 0), exact."""

    sampling: SamplingConfig
    lenience: float = dataclasses.field(default=1.0, init=False)


@dataclasses.dataclass(frozen=True)
class LenientVerifier(_Sampled):
    """Speculative sampling with lenience l < 1 (paper A.5): more drafts kept, not exact."""

    sampling: SamplingConfig
    lenience: float = 1.0

    def __post_init__(self):
        sampling_lib.validate_lenience(self.lenience)


class ChainVerifier(Protocol):
    """What a chain's rounds call on a verification policy (`rounds.ChainLayout`), and the
    autoregressive step. `lenience` is the policy's own: the one place it is set."""

    lenience: float

    def propose(self, logits: Array, rng: Array) -> Tuple[Array, Array]: ...

    def top_probability(self, logits: Array, q: Array) -> Array: ...

    def verify(self, logits: Array, q: Array, x: Array, num_drafted: Array,
               rng: Array) -> Verdict: ...

    def next_token(self, logits: Array, rng: Array) -> Tuple[Array, Array]: ...


class TreeVerifier(ChainVerifier, Protocol):
    """A policy that also verifies token trees (`rounds.TreeLayout`): a node's children and the
    walk down the verified tree. Trees verify exactly: the tree layout takes lenience 1."""

    def children(self, logits: Array, num: int, rng: Array) -> Tuple[Array, Array, Array]: ...

    def verify_tree(self, tree, logits: Array, q: Array, node_tokens: Array, valid: Array,
                    rng: Array): ...


Verifier = TreeVerifier  # the old name: every method (the built-in policies have them all)


def for_sampling(sampling: SamplingConfig, lenience: float = 1.0) -> TreeVerifier:
    """The policy for a sampling setting: greedy at temperature 0, else exact (l = 1) or
    lenient. This is where `speculative_decode(lenience=...)` becomes the policy's lenience."""
    sampling_lib.validate_lenience(lenience)
    if sampling.greedy:
        return GreedyVerifier(lenience)
    if lenience == 1.0:
        return ExactVerifier(sampling)
    return LenientVerifier(sampling, lenience)


def methods(protocol) -> Tuple[str, ...]:
    """The methods of a verifier Protocol, its bases' first (`ChainVerifier`'s for a tree)."""
    names = []
    for cls in reversed(protocol.__mro__):
        if cls not in (object, Protocol, Generic):
            names += [n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")]
    return tuple(dict.fromkeys(names))


POLICY_METHODS = methods(TreeVerifier)  # every method of a built-in policy


def resolve(sampling: SamplingConfig, lenience: float = 1.0, verifier=None) -> ChainVerifier:
    """`speculative_decode`'s policy: `verifier` as given (checked by `check_policy`), else the
    one `sampling` and `lenience` choose (`for_sampling`). Lenience is the policy's: giving it
    beside a verifier is refused with the form to use instead."""
    if verifier is None:
        return for_sampling(sampling, lenience)
    check_policy(verifier, lenience)
    return verifier


def check_policy(verifier, lenience: float = 1.0, protocol=ChainVerifier) -> None:
    """A verification policy given to `speculative_decode(verifier=...)`: it has `protocol`'s
    methods (a tree layout asks for `TreeVerifier`'s), is hashable (static under jit), and no
    `lenience` argument competes with its own."""
    missing = [m for m in methods(protocol) if not callable(getattr(verifier, m, None))]
    if missing:
        raise TypeError(f"verifier={verifier!r} lacks {missing}: a verification policy has the "
                        f"methods {list(methods(protocol))} (the {protocol.__name__} Protocol "
                        "in speculative/decode/verifiers.py).")
    try:
        hash(verifier)
    except TypeError:
        raise TypeError(f"verifier={verifier!r} is not hashable; it is static under jit: make "
                        "it a frozen dataclass.") from None
    if lenience != 1.0:
        raise ValueError(f"lenience={lenience!r} and verifier={verifier!r} both set the "
                         "acceptance rule: give the lenience to the verifier instead "
                         f"(e.g. LenientVerifier(sampling, {lenience!r})).")
