"""Sampling policies and the speculative acceptance kernel (Leviathan et al. 2023, Algorithm 1).

Standardised sampling (paper §2.2): argmax, temperature, top-k and top-p are all "sample from an
adjusted distribution". `adjusted_probs` computes that distribution in float32; the decode loops
apply the *same* `SamplingConfig` to the target (p) and the draft (q), and every draft token is
sampled from exactly the q that the kernel later compares it with (comparing with another q than
the one sampled from is a known peer bug: it biases the output).

`speculative_sample` is steps 3-5 of Algorithm 1 for a batch, with rows independent:

    accept x_i  iff  u_i * l * q_i(x_i) < p_i(x_i)      (u_i ~ U[0, 1), lenience l in (0, 1])
    n = number of leading accepts
    t ~ norm(max(0, p_{n+1} - q_{n+1}))   if n < G,   else  t ~ p_{G+1}   (the bonus token)

A residual that is all zeros (p == q on the support) falls back to p. Nothing is ever divided by a
draft probability, and the residual is never normalised explicitly: `sample` draws from
unnormalised weights by inverse CDF (one uniform per row, scaled by the weights' total), so no
epsilon leaks mass onto zero-probability tokens. Temperature 0 (argmax) is `greedy_verify`, used
by `verification.GreedyVerifier`.

Worked example (G = 3, one row): drafts [7, 2, 9]; accepts [True, False, True] -> n = 1 (the
third accept does not count, it follows a rejection); t is drawn from norm(max(0, p_2 - q_2));
the row emits [7, t].

Shape legend: B batch, G gamma (draft length), V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


MIN_TEMPERATURE = 1e-4  # smallest positive temperature (see SamplingConfig)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution tokens are drawn from (hashable: static under jit).

    Attributes:
      temperature: 0 means argmax (p and q are one-hot); otherwise logits are divided by it.
        Positive values below `MIN_TEMPERATURE` (1e-4) are refused: the scaled logits would
        overflow float32's softmax, and argmax (0) is their limit.
      top_k: keep the k most likely tokens (0 = off). Applied after the temperature.
      top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1 = off).
        Applied after top-k.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if (not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool)
                or not self.temperature >= 0 or self.temperature == float("inf")):
            raise ValueError(
                f"SamplingConfig.temperature={self.temperature!r} is invalid: use 0 for argmax "
                "or a finite positive number.")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"SamplingConfig.temperature={self.temperature!r} is below {MIN_TEMPERATURE}: "
                "logits divided by it overflow float32 (the softmax turns NaN); use "
                "temperature=0, which is argmax, the limit of small temperatures.")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(
                f"SamplingConfig.top_k={self.top_k!r} is invalid: use 0 (off) or a positive int.")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"SamplingConfig.top_p={self.top_p!r} is invalid: it must lie in (0, 1] "
                "(1 turns nucleus sampling off).")
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _top_k_mask(logits: Array, k: int) -> Array:
    """True for the k largest logits (ties at the k-th value are all kept)."""
    if k >= logits.shape[-1]:
        return jnp.ones_like(logits, bool)
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return logits >= kth


def _top_p_mask(logits: Array, top_p: float) -> Array:
    """True for the smallest set of most likely tokens with total probability >= top_p."""
    probs = jax.nn.softmax(logits, axis=-1)
    order = jnp.argsort(-logits, axis=-1, stable=True)
    sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the most likely token is always kept
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(keep_sorted, inverse, axis=-1)


def adjusted_logits(logits: Array, config: SamplingConfig) -> Array:
    """float32 logits of the adjusted distribution (-inf outside the kept set).

    Order: temperature, then top-k, then top-p. For argmax, only the (first) maximum survives.
    """
    logits = jnp.asarray(logits, jnp.float32)
    if config.greedy:
        best = jnp.argmax(logits, axis=-1)
        return jnp.where(jax.nn.one_hot(best, logits.shape[-1], dtype=bool), 0.0, -jnp.inf)
    logits = logits / config.temperature
    if config.top_k:
        logits = jnp.where(_top_k_mask(logits, config.top_k), logits, -jnp.inf)
    if config.top_p < 1.0:
        logits = jnp.where(_top_p_mask(logits, config.top_p), logits, -jnp.inf)
    return logits


def adjusted_probs(logits: Array, config: SamplingConfig) -> Array:
    """The adjusted distribution (paper §2.2) in float32, `[..., V]`."""
    return jax.nn.softmax(adjusted_logits(logits, config), axis=-1)


def sample(rng: Array, probs: Array) -> Array:
    """Draws one token per row from (possibly unnormalised) probabilities `[..., V]`.

    Inverse-CDF sampling with one uniform per row: token = the first index whose cumulative
    weight exceeds `u * total`. A zero-weight token is never drawn (its cumulative weight equals
    its predecessor's); `u * total` is kept below the total so that rounding cannot run past the
    last token with weight. One uniform instead of V Gumbels matters on CPUs, where generating
    random bits for a 32k vocabulary costs more than a small model's step.
    """
    probs = jnp.asarray(probs, jnp.float32)
    cdf = jnp.cumsum(probs, axis=-1)
    total = cdf[..., -1:]
    u = jax.random.uniform(rng, total.shape, jnp.float32)
    threshold = jnp.minimum(u * total, jnp.nextafter(total, 0.0))
    index = jnp.sum(cdf <= threshold, axis=-1)
    return jnp.minimum(index, probs.shape[-1] - 1).astype(jnp.int32)


def acceptance_rate(p_probs: Array, q_probs: Array, lenience: float = 1.0) -> Array:
    """beta = sum_x min(p(x) / l, q(x)) (Theorem 3.5; A.5 with lenience l). `[..., V] -> [...]`."""
    return jnp.minimum(jnp.sum(jnp.minimum(p_probs / lenience, q_probs), axis=-1), 1.0)


def validate_lenience(lenience: float) -> None:
    if not isinstance(lenience, (int, float)) or not 0.0 < lenience <= 1.0:
        raise ValueError(
            f"lenience={lenience!r} is invalid: it must lie in (0, 1] (1 = exact; smaller values "
            "accept more draft tokens and bound each token's probability by p/l).")


def _validate_shapes(p_probs, q_probs, draft_tokens):
    if p_probs.ndim != 3 or q_probs.ndim != 3 or draft_tokens.ndim != 2:
        raise ValueError(
            "speculative_sample expects p_probs [B, G+1, V], q_probs [B, G, V] and draft_tokens "
            f"[B, G]; got {p_probs.shape}, {q_probs.shape}, {draft_tokens.shape}.")
    batch, gamma = draft_tokens.shape
    if q_probs.shape[:2] != (batch, gamma) or p_probs.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"Shape mismatch: draft_tokens {draft_tokens.shape} needs q_probs [{batch}, {gamma}, V]"
            f" and p_probs [{batch}, {gamma + 1}, V]; got {q_probs.shape} and {p_probs.shape}.")
    if p_probs.shape[-1] != q_probs.shape[-1]:
        raise ValueError(
            f"Target and draft vocabularies differ: p has V={p_probs.shape[-1]}, q has "
            f"V={q_probs.shape[-1]}; both models must share one vocabulary.")


def greedy_accepts(p_probs: Array, draft_tokens: Array, lenience: float = 1.0) -> Array:
    """Argmax acceptance (paper A.5): x is accepted iff it is p's argmax or p(x) >= l * max p.

    `p_probs [B, G(+1), V]` are the target's unadjusted distributions; returns `[B, G]` bool.
    At l = 1 only the (first) argmax is accepted, so greedy speculative output equals greedy
    target output token for token, ties included.
    """
    gamma = draft_tokens.shape[1]
    p_probs = p_probs[:, :gamma]
    accept = draft_tokens == jnp.argmax(p_probs, axis=-1)
    if lenience < 1.0:
        p_x = jnp.take_along_axis(p_probs, draft_tokens[..., None], axis=-1)[..., 0]
        accept |= p_x >= lenience * jnp.max(p_probs, axis=-1)
    return accept


def greedy_verify(target_logits: Array, draft_tokens: Array, lenience: float = 1.0,
                  num_drafted: Array | None = None) -> Tuple[Array, Array, Array]:
    """Argmax speculative decoding from the target's logits `[B, G+1, V]`.

    Returns `(num_accepted [B], next_token [B], accept [B, G])`: the next token is the target's
    argmax after the accepted drafts (a correction, or the bonus). At l = 1 this needs one argmax
    over the vocabulary and no softmax, and the argmax is taken from the logits exactly as the
    autoregressive baseline takes it. Positions with non-finite logits accept nothing; the
    caller must check the position of `next_token` (`finite_rows`) before emitting it.
    """
    batch, gamma = draft_tokens.shape
    best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, G+1]
    if lenience < 1.0:
        accept = greedy_accepts(jax.nn.softmax(jnp.asarray(target_logits, jnp.float32), -1),
                                draft_tokens, lenience)
    else:
        accept = draft_tokens == best[:, :gamma]
    accept &= finite_rows(target_logits[:, :gamma])  # a NaN's argmax is no decision
    if num_drafted is not None:
        accept &= jnp.arange(gamma)[None] < num_drafted[:, None]
    n = _leading_accepts(accept)
    return n, jnp.take_along_axis(best, n[:, None], axis=1)[:, 0], accept


def accept_probability(p_x: Array, q_x: Array, lenience: float = 1.0) -> Array:
    """min(1, p(x) / (l q(x))): the chance a draft token x ~ q is kept (paper A.5 for l < 1).

    Written so that nothing is divided by a zero draft probability: when `l * q(x) <= p(x)` the
    token is always kept (this covers q(x) = 0).
    Non-finite inputs give 0: a token whose probabilities are NaN or infinite is never kept
    (`NaN > p` is False, which would otherwise keep it always).
    """
    scaled_q = lenience * q_x
    reject_possible = scaled_q > p_x
    keep = jnp.where(reject_possible, p_x / jnp.where(reject_possible, scaled_q, 1.0), 1.0)
    return jnp.where(jnp.isfinite(p_x) & jnp.isfinite(q_x), keep, 0.0)


def residual_weights(p: Array, q: Array) -> Array:
    """Unnormalised `max(0, p - q)` over `[..., V]`, or p where that is all zeros (p == q).

    `sample` takes unnormalised weights, so the residual is never divided by its sum.
    """
    residual = jnp.maximum(p - q, 0.0)
    return jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p)


def finite_rows(probs_or_logits: Array) -> Array:
    """`[..., V] -> [...]` bool: the distribution is usable (no NaN, no +inf, not all -inf).

    One reduction: the max over the vocabulary is finite exactly then (NaN propagates).
    """
    return jnp.isfinite(jnp.max(jnp.asarray(probs_or_logits, jnp.float32), axis=-1))


def _leading_accepts(accept: Array) -> Array:
    """`[B, G]` bool -> `[B]` int32 count of leading True values."""
    return jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def speculative_sample(
    p_probs: Array,
    q_probs: Array,
    draft_tokens: Array,
    rng: Array,
    lenience: float = 1.0,
    *,
    num_drafted: Array | None = None,
) -> Tuple[Array, Array]:
    """Speculative sampling for a batch; returns `(num_accepted [B], next_token [B])`.

    Args:
      p_probs: `[B, G+1, V]` target's adjusted distributions; `p_probs[:, i]` follows the prefix
        and the drafts `x_1..x_i`.
      q_probs: `[B, G, V]` the distributions the drafts were sampled from.
      draft_tokens: `[B, G]` int32 drafts.
      rng: one PRNG key; split here into the accept test's and the correction's sub-keys.
      lenience: l in (0, 1] (paper A.5). 1 is exact speculative sampling.
    num_drafted: optional `[B]` int32 in [0, G]: row b drafted only its first `num_drafted[b]`
        tokens (dynamic gamma); later positions are ignored, and when all drafted tokens are
        accepted the bonus comes from `p_probs[:, num_drafted]`.

    Returns:
      `num_accepted` in [0, G] and the token emitted after the accepted drafts (the correction
      from the residual, or the bonus token when all G drafts were accepted).

    Non-finite numbers never become accepted tokens: a draft whose q or p position holds NaN or
    inf is rejected, and a non-finite q is left out of the residual (the correction then comes
    from p alone, which keeps the output law exact). A non-finite p at the emitted position
    makes the next token meaningless: callers check `finite_rows(p_probs)` there (the decode
    loops flag such rows in `DecodeStats.nonfinite` and stop them).
    """
    validate_lenience(lenience)
    _validate_shapes(p_probs, q_probs, draft_tokens)
    p_probs = jnp.asarray(p_probs, jnp.float32)
    q_probs = jnp.asarray(q_probs, jnp.float32)
    batch, gamma = draft_tokens.shape
    draft_tokens = draft_tokens.astype(jnp.int32)

    drafted = (jnp.ones((batch, gamma), bool) if num_drafted is None
               else jnp.arange(gamma)[None] < num_drafted[:, None])

    accept_rng, residual_rng = jax.random.split(rng)
    p_x = jnp.take_along_axis(p_probs[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(q_probs, draft_tokens[..., None], axis=-1)[..., 0]
    u = jax.random.uniform(accept_rng, (batch, gamma), jnp.float32)
    # u ~ U[0, 1), so P(u < a) = a exactly; a = 0 never accepts, a = 1 always does.
    q_ok = finite_rows(q_probs)  # [B, G]
    accept = u < accept_probability(p_x, q_x, lenience)
    accept &= q_ok & finite_rows(p_probs[:, :gamma])
    n = _leading_accepts(accept & drafted)

    p_next = jnp.take_along_axis(p_probs, n[:, None, None], axis=1)[:, 0]  # [B, V]
    q_safe = jnp.where(q_ok[..., None], q_probs, 0.0)  # a broken q contributes nothing
    q_padded = jnp.concatenate([q_safe, jnp.zeros_like(q_probs[:, :1])], axis=1)  # q_{G+1} := 0
    q_next = jnp.take_along_axis(q_padded, n[:, None, None], axis=1)[:, 0]
    if num_drafted is not None:  # all drafted tokens accepted: the bonus comes from p alone
        q_next = jnp.where((n < num_drafted)[:, None], q_next, 0.0)
    next_token = sample(residual_rng, residual_weights(p_next, q_next))
    return n, next_token


def sampling_configs(temperatures, top_k: int = 0, top_p: float = 1.0) -> List[SamplingConfig]:
    """`temperatures` (numbers >= 0, 0 = argmax, or `SamplingConfig`s) -> SamplingConfigs.

    Numbers share `top_k` and `top_p` (ignored at temperature 0, which is argmax).
    """
    if isinstance(temperatures, (int, float, SamplingConfig)) and not isinstance(temperatures,
                                                                                 bool):
        temperatures = [temperatures]
    if not isinstance(temperatures, (list, tuple)):
        raise TypeError(f"temperatures={temperatures!r} is invalid: give a list of temperatures "
                        "(floats >= 0; 0 = argmax) or SamplingConfigs.")
    if not temperatures:
        raise ValueError("temperatures=[] is empty: give at least one temperature, e.g. "
                         "[0.0, 1.0].")
    out = []
    for t in temperatures:
        if isinstance(t, SamplingConfig):
            out.append(t)
        elif isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool):
            if t == 0:
                out.append(SamplingConfig(temperature=0.0))
            else:
                out.append(SamplingConfig(temperature=float(t), top_k=top_k, top_p=top_p))
        else:
            raise TypeError(
                f"Temperature {t!r} has unknown type {type(t).__name__}: use a float >= 0 (0 = "
                "argmax) or a speculative.sampling.SamplingConfig.")
    return out
