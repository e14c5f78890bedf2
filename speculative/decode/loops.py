"""Autoregressive and speculative decoding as jitted `lax.while_loop` programs.

Both loops drive models through the small `DecodeModel` contract (docs/design.md), never T5 itself:

    init(params, inputs [B, L_in], max_len) -> state       # encoder pass / prompt prefill
    extend(params, state, tokens [B, K]) -> (logits [B, K, V] f32, state)
    rewind(state, lengths [B]) -> state                     # per-row rollback

A state exposes `lengths [B]` (tokens in its cache) and `pending [B]` (the last prefix token, not
yet in the cache: BOS for an encoder-decoder, the prompt's last token for a decoder-only model).

Speculative decoding (Leviathan et al. 2023, Algorithm 1), one loop iteration = one round, rows
independent. Let S be a row's committed sequence (BOS, prompt, generated tokens). Invariants at the
start of a round: the target cache holds S[:-1] (length T) and `last = S[-1]`; the draft cache
holds S[:-1], or S[:-2] when the previous round accepted all G drafts (`lag`, the draft never saw
x_G). A round:

    draft:   rewind the draft to T - lag and feed two tokens, [S[-2], S[-1]] if lag else
             [S[-1], S[-1]] (the second copy is a junk slot overwritten next); the logits at index
             `lag` are q_1 and the draft now holds S. Then G - 1 single-token steps (`lax.scan`)
             give q_2..q_G. x_i ~ q_i.                                   -> G draft calls
    verify:  target.extend([last, x_1, .., x_G]) -> p_1..p_{G+1}         -> 1 target call
    accept:  n, t = speculative_sample(p, q, x)   (sampling.py)
    commit:  S += x_1..x_n, t  (cut at EOS and at max_decode_len); rewind the target to T + n + 1;
             lag = (n == G).

Example (G = 3): S = [BOS, a], T = 1. Drafts [b, c, d]; the target scores [a, b, c, d]; n = 1,
t = e: S = [BOS, a, b, e], the target is rewound to 3 (holds BOS, a, b), last = e; the draft held
[BOS, a, b, c] and will be rewound to 3 as well.

The accept step is a verification policy (`verification.py`: greedy, exact or lenient), chosen
once per call from the sampling settings; the loop has no per-policy branches.

A target-aware draft (`reads_target`, models/feature_draft.py) is initialised with the target's
context (an encoder-decoder's encoder output; a decoder-only model's features of the prompt,
`init_for_draft`) and reads the target's hidden states: the verify call also returns them
(`extend_with_features`), and the next round's first draft call re-reads the accepted tokens
x_1..x_n, t with them (`lag = n`, `catch_tokens`, `catch_features`), replacing the entries the
draft made from its own states (docs/design.md, "Target-aware drafts", has a worked example).

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

from speculative.decode import sampling as sampling_lib
from speculative.decode import trees, validation
from speculative.decode import verifiers as verification
from speculative.decode.contract import EOS_ID as EOS_ID
from speculative.decode.contract import DecodeModel as DecodeModel
from speculative.decode.contract import check_target_aware, take_rows, write_rows
from speculative.decode.contract import reads_target as reads_target
from speculative.decode.stats import DecodeStats as DecodeStats  # re-exported: the decoding API
from speculative.decode.stats import merge_stats as merge_stats

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
    verifier = verification.for_sampling(sampling)
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
        rng, step_rng = verifier.split_step(s.rng)
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
_AR_JIT = jax.jit(_autoregressive_impl, static_argnames=_AR_STATIC)


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
    function in a Python loop without jit (slow; for stepping through with a debugger).
    """
    inputs = validation.check_call((model,), inputs, rng, sampling)
    validation.check_lengths((model,), inputs, max_decode_len)
    if debug:
        return _autoregressive_impl(model, inputs, rng, sampling=sampling,
                                    max_decode_len=max_decode_len, debug=True)
    return _AR_JIT(model, inputs, rng, sampling=sampling, max_decode_len=max_decode_len)


# ----------------------------------------------------------------------------------------------
# Speculative decoding.


@struct.dataclass
class _SpecState:
    """The speculative loop's carry (module docstring: S is a row's committed sequence, T the
    target's cache length).

    Attributes:
      target_state, draft_state: the two models' decode states.
      last: `[B]` S[-1], not yet in the target's cache.
      prev: `[B]` S[-2] (read when `lag` for a plain draft).
      lag: `[B]` int32, committed tokens before `last` that the draft must (re)read before it
        drafts: 0 or 1 for a plain draft (1 when it never saw x_G); for a target-aware draft the
        n drafts accepted last round, whose draft-cache entries were made from its own states
        and are re-read with the target's features.
      catch_tokens: `[B, G + 1]` a target-aware draft's catch-up chunk: S[T - lag .. T]
        (padded); None for a plain draft.
      catch_features: `[B, G + 1, F]` the target's features of the positions before those
        tokens (the last verification's); None for a plain draft or one without features.
      tokens: `[B, N + G + 1]` generated tokens (0 after EOS).
      num_generated, done: `[B]` per-row progress.
      rng: the key, split per round.
      stats: `DecodeStats`.
      budget: `[B]` drafts allowed next round (the +2/-1 schedule; gamma otherwise).
    """

    target_state: Any
    draft_state: Any
    last: Array
    prev: Array
    lag: Array
    catch_tokens: Optional[Array]
    catch_features: Optional[Array]
    tokens: Array
    num_generated: Array
    done: Array
    rng: Array
    stats: DecodeStats
    budget: Array


def _first_draft_call(draft, s: _SpecState):
    """The round's first draft call: the draft catches up with S and gives q_1 `[B, V]` logits;
    its cache then holds S."""
    target_len = s.target_state.lengths
    lag = s.lag
    dstate = draft.rewind(s.draft_state, target_len - lag)
    if s.catch_tokens is None:  # plain draft: [S[-2], S[-1]] or [S[-1], junk copy]
        first = jnp.stack([jnp.where(lag > 0, s.prev, s.last), s.last], axis=1)
        logits, dstate = draft.extend(draft.params, dstate, first)
    else:  # target-aware: re-read S[T - lag .. T] with the target's features
        logits, dstate = draft.extend(draft.params, dstate, s.catch_tokens, s.catch_features)
    dstate = draft.rewind(dstate, target_len + 1)  # holds S; the junk slots are masked
    return dstate, jnp.take_along_axis(logits, lag[:, None, None], axis=1)[:, 0]


def _draft(draft, s: _SpecState, rngs, verifier, gamma, confidence, active):
    """Proposes up to G tokens per row.

    Returns (draft_state, x [B, G], q [B, G, V], num_drafted [B] in [0, G], fed []); a row's
    drafts end before the first draft distribution holding NaN/inf. For argmax sampling q
    is `[B, G, 1]` (its max, 1: the one-hot itself is never needed). A row stops drafting
    before x_i (i >= 2) when the draft's top probability for it (the max of q; at temperature 0,
    of the softmax of the draft's logits) is below `confidence` (dynamic gamma; 0 = always G).
    The loop exits once every active row has stopped, so stopped rows save draft steps; `fed`
    counts the single-token draft steps run after the first (the draft cache holds
    S + x_1..x_fed). Drafts past `num_drafted` are junk that the kernel ignores.
    """
    dstate, logits = _first_draft_call(draft, s)
    x1, q1 = verifier.propose(logits, None if rngs is None else rngs[0])
    batch = x1.shape[0]
    x = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)
    q = jnp.zeros((batch, gamma) + q1.shape[1:], q1.dtype).at[:, 0].set(q1)  # [B, G, V or 1]
    # A draft distribution with NaN/inf ends the row's drafts before that token (0 drafts if it
    # is the first): a token proposed from non-finite numbers is never offered to the target.
    finite = sampling_lib.finite_rows(logits)
    num = finite.astype(jnp.int32)
    active = active & finite

    def cond(carry):
        i, _, _, _, _, going = carry
        return (i < gamma) & jnp.any(going)

    def body(carry):
        i, dstate, x, q, num, going = carry
        logits, dstate = draft.extend(draft.params, dstate,
                                      jax.lax.dynamic_slice_in_dim(x, i - 1, 1, axis=1))
        xi, qi = verifier.propose(logits[:, 0], None if rngs is None else rngs[i])
        if confidence > 0.0:  # static: no cost without dynamic gamma
            going = going & (verifier.top_probability(logits[:, 0], qi) >= confidence)
        going = going & sampling_lib.finite_rows(logits[:, 0]) & (i < s.budget)
        x = jax.lax.dynamic_update_slice_in_dim(x, xi[:, None], i, axis=1)
        q = jax.lax.dynamic_update_slice_in_dim(q, qi[:, None], i, axis=1)
        return i + 1, dstate, x, q, num + going.astype(jnp.int32), going

    fed, dstate, x, q, num, _ = jax.lax.while_loop(
        cond, body, (jnp.ones((), jnp.int32), dstate, x, q, num, active))
    return dstate, x, q, num, fed - 1


def _draft_tree(draft, s: _SpecState, rngs, verifier, tree: trees.Tree):
    """Drafts a token tree (trees.py). After the first call (batch B) the draft state is
    repeated once per root-to-leaf path (B * M rows) and each path is extended as a chain, one
    call per level; a node's children are drawn from the draft's distribution on its first
    path. Returns (draft state [B * M rows], node tokens [B, N], valid [B, N], q at every
    internal node [B, N + 1 - M, V or 1])."""
    dstate, logits = _first_draft_call(draft, s)
    batch, paths = logits.shape[0], tree.num_leaves
    key = (lambda level: None) if rngs is None else (lambda level: rngs[level])
    tokens, valid, q = verifier.children(logits, tree.branching[0], key(0))
    levels, valids, qs = [tokens], [valid], [q[:, None]]
    dstate = take_rows(dstate, jnp.repeat(jnp.arange(batch), paths))
    for level in range(1, tree.depth):
        under = tree.leaves_under(level)
        feed = levels[-1][:, np.arange(paths) // under]  # each path's node at this level
        logits, dstate = draft.extend(draft.params, dstate, feed.reshape(batch * paths, 1))
        logits = logits[:, 0].reshape(batch, paths, -1)[:, np.arange(tree.level_sizes[level])
                                                         * under]  # [B, n_level, V]
        tokens, valid, q = verifier.children(logits, tree.branching[level], key(level))
        valid = valid & valids[-1][:, :, None]  # below an invalid node nothing is valid
        levels.append(tokens.reshape(batch, -1))
        valids.append(valid.reshape(batch, -1))
        qs.append(q)
    return (dstate, jnp.concatenate(levels, 1), jnp.concatenate(valids, 1),
            jnp.concatenate(qs, 1))


def _tree_round(target, draft, s: _SpecState, rngs, accept_rng, verifier, tree: trees.Tree,
                layers, active):
    """One round with a token tree: draft it, verify every node in one target forward, keep
    the accepted path. Returns what a chain round gives the commit step:
    (draft state, target state, n, accepted tokens [B, d], t, features [B, d + 1, F] or None,
    beta [B, d], drafted [B], fed [], broken [B])."""
    target_len = s.target_state.lengths
    dstate, node_tokens, valid, q = _draft_tree(draft, s, rngs, verifier, tree)
    logits, features, tstate = target.extend_tree(
        target.params, s.target_state, jnp.concatenate([s.last[:, None], node_tokens], 1),
        tree.attention(), layers)
    walk = verifier.verify_tree(tree, logits, q, node_tokens, valid, accept_rng)
    broken = active & ~jnp.take_along_axis(sampling_lib.finite_rows(logits),
                                           walk.stop[:, None], 1)[:, 0]
    n = jnp.where(broken, 0, walk.accepted)
    depth = jnp.arange(tree.depth)[None]
    x = jnp.where(depth < n[:, None],
                  jnp.take_along_axis(node_tokens, jnp.maximum(walk.path - 1, 0), 1), 0)
    offsets = jnp.concatenate([jnp.zeros_like(walk.path[:, :1]), walk.path], 1)  # [B, d + 1]
    tstate = target.keep_path(tstate, target_len, offsets)
    if features is not None:
        features = jnp.take_along_axis(features, offsets[..., None], 1)
    batch = n.shape[0]
    dstate = take_rows(dstate, jnp.arange(batch) * tree.num_leaves + walk.leaf)  # the kept path's
    beta = (depth < n[:, None]).astype(jnp.float32)  # 1 where a child was kept, 0 where not
    drafted = jnp.full((batch,), tree.depth, jnp.int32)
    return (dstate, tstate, n, x, walk.token, features, beta, drafted,
            jnp.asarray(tree.depth - 1, jnp.int32), broken)


def _chain_round(target, draft, s: _SpecState, rngs, accept_rng, verifier, gamma, confidence,
                 layers, active):
    """One round with a chain of up to G drafts (module docstring); returns what the commit
    step needs, as `_tree_round` does."""
    dstate, x, q, num_drafted, fed = _draft(draft, s, rngs, verifier, gamma, confidence, active)
    verify_tokens = jnp.concatenate([s.last[:, None], x], axis=1)  # [B, G+1]
    if layers:
        logits, features, tstate = target.extend_with_features(
            target.params, s.target_state, verify_tokens, layers)
    else:
        logits, tstate = target.extend(target.params, s.target_state, verify_tokens)
        features = None
    verdict = verifier.verify(logits, q, x, num_drafted, accept_rng)
    # Accepted drafts passed finite positions; the emitted token needs position n finite.
    broken = verdict.broken(active)
    n = jnp.where(broken, 0, verdict.num_accepted)  # a stopped row commits nothing
    return (dstate, tstate, n, x, verdict.next_token, features, verdict.beta, num_drafted, fed,
            broken)


def _speculative_impl(target, draft, inputs, rng, *, gamma, sampling, max_decode_len,
                      lenience=1.0, draft_confidence=0.0, gamma_schedule="constant",
                      initial_gamma=None, tree=None, verifier=None, debug=False):
    batch = inputs.shape[0]
    verifier = verifier or verification.for_sampling(sampling, lenience)
    aware = reads_target(draft)
    width = gamma if tree is None else tree.num_nodes - 1  # drafted tokens the target verifies
    layers = ()
    if aware:  # the draft starts from the target's context and reads its features
        layers = tuple(draft.feature_layers)
        tstate = target.init_for_draft(target.params, inputs,
                                       _cache_len(target, inputs, max_decode_len, width), layers)
        dstate = draft.init(draft.params, inputs, _cache_len(draft, inputs, max_decode_len, gamma),
                            context=target.context(tstate))
        catch_tokens = jnp.zeros((batch, gamma + 1), jnp.int32).at[:, 0].set(tstate.pending)
        catch_features = None
        if layers:  # the first round reads the pending token with the feature before it
            first = target.pending_features(tstate, layers)
            catch_features = jnp.zeros((batch, gamma + 1, draft.feature_dim),
                                       jnp.float32).at[:, 0].set(first)
    else:
        tstate = target.init(target.params, inputs,
                             _cache_len(target, inputs, max_decode_len, width))
        dstate = draft.init(draft.params, inputs, _cache_len(draft, inputs, max_decode_len, gamma))
        catch_tokens = catch_features = None
    zeros = jnp.zeros((batch,), jnp.int32)
    init = _SpecState(
        target_state=tstate, draft_state=dstate, last=tstate.pending, prev=tstate.pending,
        lag=zeros, catch_tokens=catch_tokens, catch_features=catch_features,
        tokens=jnp.zeros((batch, max_decode_len + gamma + 1), jnp.int32),
        num_generated=zeros, done=jnp.zeros((batch,), bool), rng=rng,
        budget=jnp.full((batch,), gamma if initial_gamma is None else initial_gamma, jnp.int32),
        stats=DecodeStats(
            rounds=jnp.zeros((), jnp.int32), target_calls=zeros, draft_calls=zeros,
            drafted=zeros, accepted=zeros, generated=zeros,
            beta_sum=jnp.zeros((batch,), jnp.float32), tested=zeros,
            accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
            nonfinite=jnp.zeros((batch,), bool)))

    def cond(s):
        return jnp.any(~s.done) & (s.stats.rounds < max_decode_len)

    def body(s):
        rng, draft_rngs, accept_rng = verifier.split(s.rng, gamma)
        active = ~s.done
        target_len = s.target_state.lengths

        if tree is None:
            dstate, tstate, n, x, t, features, beta, num_drafted, fed, broken = _chain_round(
                target, draft, s, draft_rngs, accept_rng, verifier, gamma, draft_confidence,
                layers, active)
        else:
            dstate, tstate, n, x, t, features, beta, num_drafted, fed, broken = _tree_round(
                target, draft, s, draft_rngs, accept_rng, verifier, tree, layers, active)

        idx = jnp.arange(gamma + 1)[None]
        x_pad = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
        new = jnp.where(idx < n[:, None], x_pad, jnp.where(idx == n[:, None], t[:, None], 0))
        tokens, num_generated, done, count = _commit(
            s.tokens, s.num_generated, s.done | broken, new, n + 1, max_decode_len)

        advance = active & ~done
        tstate = target.rewind(tstate, jnp.where(advance, target_len + n + 1, target_len))
        prev = jnp.where(n > 0, jnp.take_along_axis(x_pad, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0],
                         s.last)

        stats = s.stats.update(active, n, num_drafted, fed, beta, num_generated, broken)
        if aware:  # next round re-reads x_1..x_n, t with the features just computed
            lag = jnp.where(advance, n, s.lag)
            catch_tokens = jnp.where(advance[:, None], new, s.catch_tokens)
            catch_features = (None if features is None else
                              jnp.where(advance[:, None, None], features, s.catch_features))
        else:
            lag = jnp.where(advance, (n > fed).astype(jnp.int32), s.lag)
            catch_tokens = catch_features = None
        return _SpecState(
            target_state=tstate, draft_state=dstate,
            last=jnp.where(advance, t, s.last), prev=jnp.where(advance, prev, s.prev),
            lag=lag, catch_tokens=catch_tokens, catch_features=catch_features, tokens=tokens,
            num_generated=num_generated, done=done, rng=rng, stats=stats,
            budget=_next_budget(s.budget, n, num_drafted, gamma, gamma_schedule))

    s = (_python_while if debug else jax.lax.while_loop)(cond, body, init)
    return DecodeResult(tokens=s.tokens[:, :max_decode_len], lengths=s.num_generated,
                        stats=s.stats)


def _check_tree(target, tree, gamma, lenience, draft_confidence, gamma_schedule) -> trees.Tree:
    tree = trees.as_tree(tree, gamma)
    if lenience != 1.0 or draft_confidence != 0.0 or gamma_schedule != "constant":
        raise ValueError(
            f"tree={tree.branching} verifies exactly with a fixed shape: it needs lenience=1, "
            f"draft_confidence=0 and gamma_schedule='constant' (got {lenience}, "
            f"{draft_confidence}, {gamma_schedule!r}).")
    if not (hasattr(target, "extend_tree") and hasattr(target, "keep_path")):
        raise TypeError(f"tree={tree.branching} needs a target that verifies token trees "
                        f"(extend_tree, keep_path); {type(target).__name__} has none. The T5 "
                        "adapters (EncoderDecoderModel, DecoderOnlyModel) do.")
    return tree


def _next_budget(budget, accepted, drafted, gamma, schedule):
    """Drafts each row may propose next round. 'constant': gamma. 'heuristic' (HF's default
    for assistant models): +2 after a round whose drafts were all accepted, -1 otherwise,
    within [1, gamma]. It depends only on past rounds, so the output law is unchanged."""
    if schedule == "constant":
        return budget
    all_accepted = (accepted >= drafted) & (drafted > 0)
    return jnp.clip(jnp.where(all_accepted, budget + 2, budget - 1), 1, gamma)


_SPEC_STATIC = ("gamma", "sampling", "max_decode_len", "lenience", "draft_confidence",
                "gamma_schedule", "initial_gamma", "tree", "verifier", "debug")
_SPEC_JIT = jax.jit(_speculative_impl, static_argnames=_SPEC_STATIC)


def speculative_decode(
    target: DecodeModel,
    draft: DecodeModel,
    inputs: Array,
    *,
    rng: Array,
    gamma: int,
    sampling: sampling_lib.SamplingConfig,
    max_decode_len: int,
    lenience: float = 1.0,
    draft_confidence: float = 0.0,
    gamma_schedule: str = "constant",
    initial_gamma: Optional[int] = None,
    tree: Optional[Sequence[int]] = None,
    verifier: Optional[verification.Verifier] = None,
    debug: bool = False,
) -> DecodeResult:
    """Speculative decoding of `inputs [B, L_in]` (Algorithm 1), exact for `lenience=1`.

    `tree=(b_1, ..., b_d)` drafts a token tree instead of a chain (speculative/trees.py): each
    node at depth i - 1 gets b_i children (the draft's top-b_i tokens at temperature 0, b_i
    tokens drawn without replacement at T > 0), the target verifies all of them in one forward,
    and the output keeps the target's law. `gamma` must equal the depth d; the stats count a
    depth as drafted and a depth where a child was kept as accepted. Trees need `lenience=1`,
    `draft_confidence=0` and the constant schedule. `tree=None` (the default) is the chain.

    `gamma` is the most drafts per round. With `draft_confidence > 0` a row stops drafting
    early when the draft's top probability for the next draft falls below it (dynamic gamma, as
    HF's `assistant_confidence_threshold`); the stopping rule sees only the draft, so the output
    stays exact. The draft loop exits when every row has stopped.

    `gamma_schedule='heuristic'` adapts each row's drafts per round the way transformers does
    by default for assistant models: start at `initial_gamma` (default `gamma`), +2 after a
    round whose drafts were all accepted, -1 otherwise, within [1, gamma] (`gamma` is the
    buffer); 'constant' always drafts `gamma`. Both rules look only at past rounds, so the
    output stays exact.

    `verifier` replaces the policy that `sampling` and `lenience` choose
    (`verification.for_sampling`) by another object with the same methods, e.g. a new
    acceptance rule (docs/extending.md); it must be hashable (a frozen dataclass), as it is
    static under jit.

    The output has the target's distribution under `sampling` (the same adjustment is applied to
    p and q); at temperature 0 it equals `autoregressive_decode` token for token. Rows accept
    independently and stop at EOS (id 1) or after `max_decode_len` tokens. Compiles once per
    (input shapes, gamma, sampling, max_decode_len, lenience).
    """
    inputs = validation.check_call((target, draft), inputs, rng, sampling)
    if tree is not None:
        tree = _check_tree(target, tree, gamma, lenience, draft_confidence, gamma_schedule)
    validation.check_lengths((target, draft), inputs, max_decode_len, gamma,
              None if tree is None else tree.num_nodes - 1)
    sampling_lib.validate_lenience(lenience)
    if reads_target(draft):
        check_target_aware(target, draft)
    validation.schedule(draft_confidence, gamma_schedule, initial_gamma, gamma)
    if verifier is not None:
        verification.check_policy(verifier, lenience)
    kwargs = dict(gamma=int(gamma), sampling=sampling, max_decode_len=int(max_decode_len),
                  lenience=float(lenience), draft_confidence=float(draft_confidence),
                  gamma_schedule=gamma_schedule,
                  initial_gamma=None if initial_gamma is None else int(initial_gamma), tree=tree,
                  verifier=verifier)
    if debug:
        return _speculative_impl(target, draft, inputs, rng, debug=True, **kwargs)
    return _SPEC_JIT(target, draft, inputs, rng, **kwargs)
