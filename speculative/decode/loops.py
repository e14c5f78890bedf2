"""Autoregressive and speculative decoding as jitted `lax.while_loop` programs.

Both loops drive models through the small `DecodeModel` contract (docs/design.md), never T5 itself:

    init(params, inputs [B, L_in], max_len) -> state       # encoder pass / prompt prefill
    extend(params, state, tokens [B, K]) -> (logits [B, K, V] f32, state)
    rewind(state, lengths [B]) -> state                     # per-row rollback

A state exposes `lengths [B]` (tokens in its cache) and `pending [B]` (the last prefix token, not
yet in the cache: BOS for an encoder-decoder, the prompt's last token for a decoder-only model).

Speculative decoding (Leviathan et al. 2023, Algorithm 1), one loop iteration = one round, rows
independent. Let S be a row's committed sequence (BOS, prompt, generated tokens); at the start of
a round the target's cache holds S[:-1] (length T) and `last = S[-1]`. A round (`_round`):

    1. draft:   proposal = drafter.propose(...)       x_i ~ q_i, i = 1..G   (decode/drafters.py)
    2. verify:  layout.score(...)                     one target forward over [last, x_1..x_G]
    3. accept:  layout.accept(verifier, ...)          n leading drafts kept, then t ~ the
                                                      residual, or the bonus from p_{G+1}
    4. commit:  S += x_1..x_n, t                      cut at EOS and at max_decode_len
    5. advance: rewind the target to T + n + 1; the drafter updates its catch-up state

Example (G = 3): S = [BOS, a], T = 1. Drafts [b, c, d]; the target scores [a, b, c, d]; n = 1,
t = e: S = [BOS, a, b, e], the target is rewound to 3 (holds BOS, a, b), last = e.

Which drafter (a chain, a draft that reads the target, a token tree, a block), which layout
(chain or tree) and which verifier (greedy, exact, lenient: decode/verifiers.py) are objects
chosen once per call; the loop body has no branch on any of them.

The baseline, `autoregressive_decode`, is the same machinery with one target `extend` of one token
per step, so speedups compare equally optimised programs.

Shape legend: B batch, L length, K chunk, G gamma, V vocab, N max_decode_len.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode import (
    capabilities,
    contract,
    drafters,
    interrupts,
    trees,
    validation,
    verifiers,
)
from speculative.decode import kernel as sampling_lib
from speculative.decode.contract import EOS_ID, DecodeModel, write_rows
from speculative.decode.rounds import RoundKeys
from speculative.decode.stats import DecodeStats

Array = jax.Array


@struct.dataclass
class DecodeResult:
    """`tokens [B, N]` int32 (0 after EOS), `lengths [B]` (tokens up to and including EOS)."""

    tokens: Array
    lengths: Array
    stats: DecodeStats


def _cache_len(model, inputs, max_decode_len, gamma):
    return model.prefix_length(inputs.shape[1]) + max_decode_len + gamma + 2


def _commit(tokens, num_generated, done, new, num_new, max_decode_len):
    """Appends `new[b, :num_new[b]]` per row, cut after EOS and at max_decode_len.

    Returns (tokens, num_generated, done, count) where count is how many were kept.
    """
    width = new.shape[1]
    idx = jnp.arange(width)[None]
    valid = idx < num_new[:, None]
    is_eos = valid & (new == EOS_ID)
    first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1) + 1, width + 1)
    count = jnp.minimum(jnp.minimum(num_new, first_eos), max_decode_len - num_generated)
    count = jnp.where(done, 0, count)
    window = jnp.where(idx < count[:, None], new, 0)
    # Rows write at their own offset; zeros past `count` are overwritten by later rounds.
    tokens = jnp.where(
        done[:, None], tokens, write_rows(tokens, window, num_generated))
    num_generated = num_generated + count
    done = done | (first_eos <= count) | (num_generated >= max_decode_len)
    return tokens, num_generated, done, count


def _python_while(cond, body, state):
    while bool(cond(state)):
        state = body(state)
    return state


# ----------------------------------------------------------------------------------------------
# Autoregressive baseline.


@struct.dataclass
class _ARState:
    """The autoregressive loop's carry.

    Attributes:
      model_state: the model's decode state (its cache holds S[:-1]).
      last: `[B]` S[-1], fed next.
      tokens: `[B, N + 1]` generated tokens (0 after EOS).
      num_generated, done: `[B]` per-row progress.
      rng: the key, split per step.
      rounds: `[]` loop iterations (batched model calls).
      calls: `[B]` steps in which each row was still decoding.
      nonfinite: `[B]` bool, rows stopped because their distribution went NaN/inf.
    """

    model_state: Any
    last: Array
    tokens: Array
    num_generated: Array
    done: Array
    rng: Array
    rounds: Array
    calls: Array
    nonfinite: Array


def _autoregressive_impl(model, inputs, rng, *, sampling, max_decode_len, debug=False):
    batch = inputs.shape[0]
    verifier = verifiers.for_sampling(sampling)
    state = model.init(model.params, inputs, _cache_len(model, inputs, max_decode_len, 0))
    init = _ARState(
        model_state=state, last=state.pending,
        tokens=jnp.zeros((batch, max_decode_len + 1), jnp.int32),
        num_generated=jnp.zeros((batch,), jnp.int32), done=jnp.zeros((batch,), bool),
        rng=rng, rounds=jnp.zeros((), jnp.int32), calls=jnp.zeros((batch,), jnp.int32),
        nonfinite=jnp.zeros((batch,), bool))

    def cond(s):
        return jnp.any(~s.done) & (s.rounds < max_decode_len)

    def body(s):
        old_len = s.model_state.lengths
        logits, mstate = model.extend(model.params, s.model_state, s.last[:, None])
        rng, step_rng = jax.random.split(s.rng)
        token, ok = verifier.next_token(logits[:, 0], step_rng)
        active = ~s.done
        broken = active & ~ok  # nothing from a NaN/inf distribution is committed
        tokens, num_generated, done, _ = _commit(
            s.tokens, s.num_generated, s.done | broken, token[:, None], jnp.ones_like(token),
            max_decode_len)
        advance = active & ~done
        mstate = model.rewind(mstate, jnp.where(advance, old_len + 1, old_len))
        return _ARState(
            model_state=mstate, last=jnp.where(active, token, s.last), tokens=tokens,
            num_generated=num_generated, done=done, rng=rng, rounds=s.rounds + 1,
            calls=s.calls + active.astype(jnp.int32), nonfinite=s.nonfinite | broken)

    s = (_python_while if debug else jax.lax.while_loop)(cond, body, init)
    zeros = jnp.zeros((batch,), jnp.int32)
    stats = DecodeStats(
        rounds=s.rounds, target_calls=s.calls, draft_calls=zeros, drafted=zeros, accepted=zeros,
        generated=s.num_generated, beta_sum=jnp.zeros((batch,), jnp.float32), tested=zeros,
        accepted_per_position=jnp.zeros((batch, 0), jnp.int32), nonfinite=s.nonfinite)
    return DecodeResult(tokens=s.tokens[:, :max_decode_len], lengths=s.num_generated, stats=stats)


_AR_STATIC = ("sampling", "max_decode_len", "debug")
_AR_JIT = contract.jit_by_class(_autoregressive_impl, _AR_STATIC)


def autoregressive_decode(
    model: DecodeModel,
    inputs: Array,
    *,
    rng: Array,
    sampling: sampling_lib.SamplingConfig,
    max_decode_len: int,
    debug: bool = False,
) -> DecodeResult:
    """Decodes `inputs [B, L_in]` one target call per token (the baseline).

    Compiles once per (input shapes, sampling, max_decode_len). `debug=True` runs the same step
    function in a Python loop without jit (slow; for stepping through with a debugger). Returns
    when the decode is done; Ctrl-C stops the wait at once (`interrupts.wait`).
    """
    inputs = validation.check_call((model,), inputs, rng, sampling)
    validation.check_lengths((model,), inputs, max_decode_len)
    if debug:
        return _autoregressive_impl(model, inputs, rng, sampling=sampling,
                                    max_decode_len=max_decode_len, debug=True)
    return interrupts.wait(
        _AR_JIT(model, inputs, rng, sampling=sampling, max_decode_len=max_decode_len),
        _what("autoregressive_decode", inputs, max_decode_len))


def _what(name: str, inputs, max_decode_len) -> str:
    """A decode call in words, for the message of a Ctrl-C (`interrupts.wait`)."""
    return f"{name} of {inputs.shape[0]} row(s) x {int(max_decode_len)} tokens"


# ----------------------------------------------------------------------------------------------
# Speculative decoding.


@struct.dataclass
class _SpecState:
    """The speculative loop's carry (module docstring: S is a row's committed sequence, T the
    target's cache length).

    Attributes:
      target_state: the target's decode state (its cache holds S[:-1]).
      draft: the drafter's state (its own struct: decode/drafters.py).
      last: `[B]` S[-1], not yet in the target's cache.
      tokens: `[B, N + G + 1]` generated tokens (0 after EOS).
      num_generated, done: `[B]` per-row progress.
      rng: the key, split per round into named keys (`RoundKeys`).
      stats: `DecodeStats`.
    """

    target_state: Any
    draft: Any
    last: Array
    tokens: Array
    num_generated: Array
    done: Array
    rng: Array
    stats: DecodeStats


def _round(drafter, view, verifier, max_decode_len, s: _SpecState) -> _SpecState:
    """One round of Algorithm 1 for every row still decoding."""
    keys = RoundKeys.split(s.rng, drafter.gamma)
    layout, active, start = drafter.layout, ~s.done, s.target_state.lengths
    # 1. Draft: G tokens x_i ~ q_i (a chain, a tree or a block: the drafter's business).
    proposal, draft = drafter.propose(s.draft, s.last, start, keys.draft, verifier)
    # 2. Verify: the target scores [S[-1], drafts] in one forward.
    scored, tstate = layout.score(view, s.target_state, s.last, proposal)
    # 3. Accept: n leading drafts kept, then a correction or bonus token t.
    outcome = layout.accept(verifier, scored, proposal, keys.accept, active)
    # 4. Commit: S += x_1..x_n, t, cut at EOS and at max_decode_len.
    # A row whose next token would come from NaN/inf keeps its accepted drafts (drawn and
    # tested at finite positions: the tokens the baseline emits) and stops before that token.
    n, broken = outcome.accepted, outcome.broken
    tokens, num_generated, done, _ = _commit(s.tokens, s.num_generated, s.done,
                                             outcome.emitted(), n + 1 - broken.astype(jnp.int32),
                                             max_decode_len)
    done = done | broken
    # 5. Advance: the target keeps S[:-1]; the drafter updates its catch-up state.
    moving = active & ~done
    tstate = layout.keep(view, tstate, start, outcome)
    tstate = view.rewind(tstate, jnp.where(moving, start + n + 1, start))
    draft = drafter.advance(draft, outcome, proposal, s.last, moving)
    stats = s.stats.update(active, n, proposal.num_drafted, proposal.draft_calls, outcome.beta,
                           num_generated, outcome.broken)
    return _SpecState(target_state=tstate, draft=draft,
                      last=jnp.where(moving, outcome.next_token, s.last), tokens=tokens,
                      num_generated=num_generated, done=done, rng=keys.next, stats=stats)


def _speculative_impl(target, drafter, inputs, rng, *, verifier, max_decode_len, debug=False):
    batch, gamma = inputs.shape[0], drafter.gamma
    view = drafter.view(target)
    tstate, draft = drafter.start(view, inputs, max_decode_len, drafter.layout.width)
    zeros = jnp.zeros((batch,), jnp.int32)
    init = _SpecState(
        target_state=tstate, draft=draft, last=tstate.pending,
        tokens=jnp.zeros((batch, max_decode_len + gamma + 1), jnp.int32),
        num_generated=zeros, done=jnp.zeros((batch,), bool), rng=rng,
        stats=DecodeStats(
            rounds=jnp.zeros((), jnp.int32), target_calls=zeros, draft_calls=zeros,
            drafted=zeros, accepted=zeros, generated=zeros,
            beta_sum=jnp.zeros((batch,), jnp.float32), tested=zeros,
            accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
            nonfinite=jnp.zeros((batch,), bool)))

    def cond(s):
        return jnp.any(~s.done) & (s.stats.rounds < max_decode_len)

    def body(s):
        return _round(drafter, view, verifier, max_decode_len, s)

    s = (_python_while if debug else jax.lax.while_loop)(cond, body, init)
    return DecodeResult(tokens=s.tokens[:, :max_decode_len], lengths=s.num_generated,
                        stats=s.stats)


_SPEC_STATIC = ("verifier", "max_decode_len", "debug")
_SPEC_JIT = contract.jit_by_class(_speculative_impl, _SPEC_STATIC)


def speculative_decode(
    target: DecodeModel,
    draft: Any,
    inputs: Array,
    *,
    rng: Array,
    gamma: Optional[int],
    sampling: sampling_lib.SamplingConfig,
    max_decode_len: int,
    lenience: float = 1.0,
    tree: Optional[Sequence[int]] = None,
    verifier: Optional[verifiers.ChainVerifier] = None,
    debug: bool = False,
    **moved: Any,
) -> DecodeResult:
    """Speculative decoding of `inputs [B, L_in]` (Algorithm 1), exact for `lenience=1`.

    `draft` is a `DecodeModel` (drafted as a chain of `gamma` tokens, or, for a draft that
    reads the target, by `TargetAwareDrafter`) or a drafter object (decode/drafters.py:
    `ChainDrafter(model, gamma, confidence=..., schedule=...)` for dynamic gamma and the +2/-1
    schedule, `TreeDrafter`, or a class of your own, docs/extending.md); a drafter brings its
    own gamma (`gamma` None or equal to it).

    `tree=(b_1, ..., b_d)` drafts a token tree instead of a chain (decode/trees.py): each node
    at depth i - 1 gets b_i children (the draft's top-b_i tokens at temperature 0, b_i tokens
    drawn without replacement at T > 0), the target verifies all of them in one forward, and
    the output keeps the target's law. `gamma` must equal the depth d; the stats count a depth
    as drafted and a depth where a child was kept as accepted. Trees need `lenience=1`.

    `verifier` replaces the policy that `sampling` and `lenience` choose
    (`verifiers.for_sampling`) by another object with the `ChainVerifier` Protocol's methods
    (`TreeVerifier`'s for a tree); it must be hashable (a frozen dataclass), as it is static
    under jit. Lenience is the policy's own (`verifier.lenience`): `lenience=` is the shorthand
    for the built-in policy, and is refused beside `verifier`.

    The output has the target's distribution under `sampling` (the same adjustment is applied to
    p and q); at temperature 0 it equals `autoregressive_decode` token for token. Rows accept
    independently and stop at EOS (id 1) or after `max_decode_len` tokens. Compiles once per
    (input shapes, drafter settings, verifier, max_decode_len). Returns when the decode is done;
    Ctrl-C stops the wait at once (`interrupts.wait`). Arguments that moved into a drafter
    (`draft_confidence`, `gamma_schedule`, `initial_gamma`) raise a TypeError giving the new form.
    """
    _refuse_moved(moved)
    drafter = _drafter(draft, gamma, tree)
    models = (target,) if drafter.model is None else (target, drafter.model)
    inputs = validation.check_call(models, inputs, rng, sampling)
    validation.check_lengths(models, inputs, max_decode_len, drafter.gamma,
                             drafter.layout.width)
    verifier = verifiers.resolve(sampling, lenience, verifier)  # lenience is the policy's
    drafter.layout.check_verifier(verifier)
    drafter.check(target)
    kwargs = dict(verifier=verifier, max_decode_len=int(max_decode_len))
    if debug:
        return _speculative_impl(target, drafter, inputs, rng, debug=True, **kwargs)
    return interrupts.wait(_SPEC_JIT(target, drafter, inputs, rng, **kwargs),
                           _what("speculative_decode", inputs, max_decode_len))


# speculative_decode's arguments that became ChainDrafter settings: old name -> new name.
_MOVED_TO_DRAFTER = {"draft_confidence": "confidence", "gamma_schedule": "schedule",
                     "initial_gamma": "initial_gamma"}


def _refuse_moved(moved) -> None:
    """A TypeError for `speculative_decode`'s unknown keywords, giving the new form of those
    that moved into `drafters.ChainDrafter`."""
    if not moved:
        return
    old = [k for k in moved if k in _MOVED_TO_DRAFTER]
    if old:
        settings = ", ".join(f"{_MOVED_TO_DRAFTER[k]}={moved[k]!r}" for k in old)
        raise TypeError(
            f"speculative_decode({', '.join(f'{k}=' for k in old)}...) moved: these are "
            "settings of the drafter now; pass draft=speculative.decode.drafters.ChainDrafter("
            f"draft, gamma, {settings}) and gamma=None (or the same gamma).")
    raise TypeError(f"speculative_decode() got an unexpected keyword argument "
                    f"{next(iter(moved))!r}.")


def _drafter(draft, gamma, tree) -> capabilities.Drafter:
    """`speculative_decode`'s drafter, its arguments checked by name."""
    if drafters.is_drafter(draft):
        if tree is not None:
            raise ValueError(f"tree={tree!r} with a drafter object: give the tree to the drafter "
                             "(tree_drafter.TreeDrafter(base, tree)) instead.")
        if gamma is not None and gamma != draft.gamma:
            raise ValueError(f"gamma={gamma!r} but the drafter drafts {draft.gamma} per round: "
                             "pass gamma=None (or the drafter's gamma).")
        drafter = draft
    else:
        if tree is not None:
            tree = trees.as_tree(tree, gamma)
            gamma = tree.depth
        if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 1:
            raise ValueError(f"gamma={gamma!r} is invalid: draft at least one token "
                             "(gamma >= 1).")
        drafter = drafters.as_drafter(draft, int(gamma), tree)
    return drafter
