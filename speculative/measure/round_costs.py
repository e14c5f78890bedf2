"""A drafter's cost per round, timed with the decode loop's own state.

    costs = round_costs(target, {"chain": chain_of, "block": block_of}, inputs,
                        RoundCostSpec(gammas=(2, 4, 7)))
    costs["c_round"]["block"][4]    # one `propose` at gamma 4, in target steps

`c_round` is what a round's drafting costs, in target steps: the drafter's `propose` (a chain's
G single-token calls, a block draft's one call and its G draws), timed inside a jitted loop of
`round_steps` proposals from the decode's first state, less the same program with no proposal
(the start alone). It is the draft's cost in Theorem 3.8 with the round's real shape in place of
G times one call's: speedup = E[tokens](alpha, G) / (c_round + verify_cost(G)). Every program
(the target's one-token step, its verify of G + 1 tokens, each drafter's start alone and with
proposals) runs in the same interleaved rounds (`costs.interleaved`), so noise hits all alike.
The reports of block drafts (`experiments/block_drafts.py`, a trained pair;
`experiments/block_costs.py`, a random pair of any size) both time their rounds here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import contract, verifiers
from speculative.decode.rounds import RoundKeys
from speculative.measure import costs as costs_lib


@dataclasses.dataclass(frozen=True)
class RoundCostSpec:
    """What `round_costs` times: each gamma, the decode length the states are sized for,
    `round_steps` proposals per timed call, `repeats` interleaved rounds, the seed."""

    gammas: Tuple[int, ...]
    max_decode_len: int = 48
    round_steps: int = 16
    repeats: int = 3
    seed: int = 0


@functools.partial(contract.jit_by_class, static_argnames=(
    "verifier", "num_steps", "max_decode_len", "reread"))
def proposals(target, drafter, inputs, rng, *, verifier, num_steps, max_decode_len,
              reread: int = 0):
    """`num_steps` proposals from the decode's first state (0: the start alone), as after a
    round that accepted `reread` drafts (a drafter with several `catch_up_widths` re-reads
    them with the committed token: a chunk of `reread + 1` real tokens). Returns the running
    sum that keeps every proposal alive and the draft calls of the last proposal (mean over
    rows; 0 with no proposal)."""
    view = drafter.view(target)
    tstate, state = drafter.start(view, inputs, max_decode_len, drafter.layout.width)
    if reread:
        state = state.replace(reread=jnp.full_like(state.reread, reread))
        tstate = tstate.replace(lengths=tstate.lengths + reread)

    def body(i, carry):
        # The drafter's state is carried, as in the decode loop: each proposal reads the state
        # the last one returned (its catch-up rewinds the draft to the same committed prefix,
        # so every iteration is the same round), which keeps XLA from hoisting it out of the
        # loop and lets the cache be updated in place. (A barrier over loop-invariant states
        # instead made XLA copy them every iteration: up to 0.1 target steps more per round.)
        # A tree's proposal returns one draft row per path (its `advance` picks the kept one):
        # that state does not fit the carry, so a tree reads the start state every time.
        acc, _, st = carry
        keys = RoundKeys.split(jax.random.fold_in(rng, i), drafter.gamma)
        proposal, out = drafter.propose(st, tstate.pending, tstate.lengths, keys.draft, verifier)
        calls = jnp.mean(jnp.asarray(proposal.draft_calls, jnp.float32))
        return acc + jnp.sum(proposal.q) + jnp.sum(proposal.tokens), calls, _same_shapes(out, st)

    # Every program starts from the sum of the start states: without it, the start alone
    # (num_steps 0, the baseline subtracted) would compile to nothing (its states unused) and
    # the prefill and the draft's init would be counted in the proposals, 1/num_steps each.
    keep = sum(jnp.sum(jnp.asarray(leaf, jnp.float32))
               for leaf in jax.tree_util.tree_leaves((tstate, state)))
    zero = jnp.zeros((), jnp.float32)
    return jax.lax.fori_loop(0, num_steps, body, (keep, zero, state))[:2]


def _same_shapes(new, old):
    """`new` where it has `old`'s structure and shapes, else `old`."""
    same = (jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(old) and all(
        jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
        for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(old))))
    return new if same else old


def round_programs(target, drafter_of: Dict[str, Callable[[int], Any]], inputs,
                   spec: RoundCostSpec) -> Dict[Any, Callable[[], Any]]:
    """Thunks: the target's one-token step ('target', 1), its verify of gamma + 1 tokens
    ('verify', g), and for each name and gamma the drafter `drafter_of[name](g)`'s start alone
    (name, g, 0) and start + `round_steps` proposals after a round that accepted w - 1 drafts
    (name, g, round_steps, w) for each of its `widths`."""
    x = jnp.asarray(inputs, jnp.int32)
    cache = target.prefix_length(x.shape[1]) + spec.max_decode_len + max(spec.gammas) + 2
    kw = dict(cache_len=cache, num_steps=spec.round_steps, seed=spec.seed)
    programs = {("target", 1): costs_lib.extend_program(target, inputs, 1, **kw)}
    for g in spec.gammas:
        programs[("verify", g)] = costs_lib.extend_program(target, inputs, g + 1, **kw)
    greedy, rng = verifiers.GreedyVerifier(), jax.random.PRNGKey(spec.seed)
    for name, make in drafter_of.items():
        for g in spec.gammas:
            drafter = make(g)
            programs[(name, g, 0)] = functools.partial(
                proposals, target, drafter, x, rng, verifier=greedy, num_steps=0,
                max_decode_len=spec.max_decode_len)
            for w in widths(drafter):
                programs[(name, g, spec.round_steps, w)] = functools.partial(
                    proposals, target, drafter, x, rng, verifier=greedy,
                    num_steps=spec.round_steps, max_decode_len=spec.max_decode_len, reread=w - 1)
    return programs


def widths(drafter) -> Tuple[int, ...]:
    """The catch-up widths whose rounds `round_costs` times for `drafter`: its
    `catch_up_widths()`, or one width for a drafter without the method (its round costs the
    same whatever was accepted)."""
    get = getattr(drafter, "catch_up_widths", None)
    return tuple(get()) if get is not None else (1,)


def expected_c_round(by_width: Dict[int, float], accepted_rate) -> float:
    """c_round averaged over the rounds of a decode: `by_width {w: cost}` (`round_costs`'s
    `c_round_by_width`) weighted by how often the previous round accepted n drafts, from the
    decode's `accepted_per_position_rate` (entry i: the share of rounds accepting more than i),
    each n priced at the narrowest width holding n + 1 tokens. One width: its cost."""
    ws = sorted(int(w) for w in by_width)
    cost = {int(w): float(c) for w, c in by_width.items()}
    if len(ws) == 1:
        return cost[ws[0]]
    more = [1.0] + [float(r) for r in accepted_rate] + [0.0]  # P(n > i - 1), i = 0..
    total = 0.0
    for n in range(len(more) - 1):
        share = more[n] - more[n + 1]  # P(n accepted)
        total += share * cost[next((w for w in ws if w >= n + 1), ws[-1])]
    return total


def round_costs(target, drafter_of: Dict[str, Callable[[int], Any]], inputs,
                spec: RoundCostSpec) -> Dict[str, Any]:
    """Times `round_programs` interleaved: the target step (s), the verify cost per gamma and,
    per name and gamma, `c_round_by_width` (target steps, after a round that accepted w - 1
    drafts: `expected_c_round` averages them over a decode), `c_round` at the widest chunk
    (after a round that accepted every draft: the most a round costs) and the draft calls per
    round."""
    _, times, outputs = costs_lib.interleaved(round_programs(target, drafter_of, inputs, spec),
                                              spec.repeats)
    med = {k: float(np.median(v)) for k, v in times.items()}
    n = spec.round_steps
    step = med[("target", 1)] / n
    out = {"target_step_s": step,
           "verify_cost": {g: med[("verify", g)] / n / step for g in spec.gammas},
           "c_round": {}, "c_round_by_width": {}, "draft_calls_per_round": {}}
    for name in drafter_of:
        by_width = {g: {} for g in spec.gammas}
        for key, seconds in med.items():
            if len(key) == 4 and key[0] == name:  # (name, g, round_steps, w)
                _, g, _, w = key
                by_width[g][w] = max(seconds - med[(name, g, 0)], 0.0) / n / step
        out["c_round_by_width"][name] = by_width
        out["c_round"][name] = {g: by_width[g][max(by_width[g])] for g in spec.gammas}
        out["draft_calls_per_round"][name] = {
            g: float(outputs[(name, g, n, max(by_width[g]))][1]) for g in spec.gammas}
    return out
