"""Acceptance along the target's own text: beta per position, alpha and its standard errors,
and the per-rank acceptance of a token tree's children (Cor. 3.6, Theorem 3.5).

    betas = collect_betas(target, draft, batches, sampling=SamplingConfig(1.0),
                          num_tokens=10_000, max_decode_len=48, lenience=1.0, rng=key)
    stats = beta_statistics(betas)               # alpha, se_cluster, lag-1 autocorrelation, ...
    ranks = rank_acceptance(target, draft, batches, sampling, max_rank=4, max_decode_len=48)

The measurement:

  1. generates with the target alone (`decoding.autoregressive_decode` under the setting),
     batch after batch of inputs, until `num_tokens` tokens;
  2. teacher-forces the target and the draft on each generated sequence: `init` with the batch's
     inputs, then one `extend` over [pending] + generated[:-1] (for an encoder-decoder the pending
     token is BOS). This uses only the `DecodeModel` contract, so T5 and n-gram drafts alike work;
  3. computes beta = sum_x min(p(x), q(x)) (Theorem 3.5) at every generated position up to and
     including EOS, with p and q the *adjusted* distributions (`sampling.adjusted_probs`: the
     same temperature / top-k / top-p for both). At temperature 0 p and q are one-hot and beta is
     1 exactly when the draft's argmax equals the target's. With lenience l < 1 the relaxed test
     of the paper's A.5 is used (`acceptance_rate(p, q, l)`; `greedy_accepts` at temperature 0);
  4. reports alpha = mean(beta) with three standard errors and the i.i.d. diagnostics:

     se_naive        std(beta) / sqrt(n): right only if the betas were independent;
     se_cluster      sequence-clustered (cluster-robust) SE, clusters = generated sequences:
                     sqrt(G / (G - 1) * sum_s (sum_{i in s} (beta_i - alpha))^2) / n;
     se_batch_means  batch means over the betas in generation order (sequences concatenated),
                     batches of floor(sqrt(n)) consecutive betas;
     lag1_autocorrelation  pooled lag-1 autocorrelation of beta within sequences,
                     sum_s sum_i (b_i - a)(b_{i+1} - a) / n_pairs  /  (sum (b_i - a)^2 / n);
                     0 under the i.i.d. assumption behind Eq. 1; null when beta is constant;
     effective_sample_size  n * (se_naive / se_cluster)^2;
     histogram       counts of beta in `histogram_bins` equal bins over [0, 1].

Every run that reports alpha (scripts/measure_alpha.py, the Table 2 rows, the reports in
`experiments/`, the feature-draft trainer) measures it here. Shape legend: B batch, L length,
N max_decode_len, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import contract, drafters, trees
from speculative.decode import kernel as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib

TREE_DRAWS = 8  # sibling tests simulated per position for rank_acceptance at T > 0
TREE_MAX_NODES = 12  # the largest token tree (drafted nodes) the demo and Table 2 consider
# The verify widths (drafted tokens) and draft rows (paths) whose costs they time; costs between
# them are interpolated (`costs.cost_curve`).
TREE_VERIFY_WIDTHS = (1, 2, 4, 6, 8, 12)
TREE_DRAFT_ROWS = (1, 2, 4, 8, 12)
# Depths at which the chooser measures a target-aware draft's rates (deeper levels use the last).
TREE_RATE_DEPTHS = 4


def _forced_logits(model, inputs, generated):
    """Teacher forcing through the DecodeModel contract: `[B, N]` -> logits `[B, N, V]`."""
    cache_len = model.prefix_length(inputs.shape[1]) + generated.shape[1] + 1
    state = model.init(model.params, inputs, cache_len)
    fed = jnp.concatenate([state.pending[:, None], generated[:, :-1]], axis=1)
    logits, _ = model.extend(model.params, state, fed)
    return jnp.asarray(logits, jnp.float32)


def _forced_target(target, draft, inputs, generated):
    """The target teacher-forced along `generated` for a target-aware `draft`: its state
    (with its context for the draft), the fed tokens [pending] + generated[:-1], its logits,
    and the features of the draft's layers after each fed token (None for a draft that reads
    none)."""
    layers = tuple(draft.feature_layers)
    cache_len = target.prefix_length(inputs.shape[1]) + generated.shape[1] + 1
    tstate = target.init_for_draft(target.params, inputs, cache_len, layers)
    fed = jnp.concatenate([tstate.pending[:, None], generated[:, :-1]], axis=1)
    if layers:
        p_logits, feats, _ = target.extend_with_features(target.params, tstate, fed, layers)
    else:
        (p_logits, _), feats = target.extend(target.params, tstate, fed), None
    return tstate, fed, jnp.asarray(p_logits, jnp.float32), feats


def _forced_pair_logits(target, draft, inputs, generated):
    """Target and draft logits teacher-forced along `generated`. A target-aware draft reads
    the target's encoder output and, at every position, the target's features of the position
    before (what its first draft of a round sees; its deeper drafts read its own states, so
    for it this alpha is the first-draft acceptance rate, and the decode's own
    `DecodeStats.alpha` is the one along its chains)."""
    if not drafters.as_drafter(draft, 1).reads_target:
        return _forced_logits(target, inputs, generated), _forced_logits(draft, inputs, generated)
    tstate, fed, p_logits, feats = _forced_target(target, draft, inputs, generated)
    if feats is not None:  # the previous position's (before the pending token: the prompt's)
        first = target.pending_features(tstate, draft.feature_layers)
        feats = jnp.concatenate([first[:, None], feats[:, :-1]], axis=1)
    dstate = draft.init(draft.params, inputs, draft.prefix_length(inputs.shape[1])
                        + fed.shape[1] + 1, context=target.context(tstate))
    q_logits, _ = draft.extend(draft.params, dstate, fed, feats)
    return p_logits, jnp.asarray(q_logits, jnp.float32)


@functools.partial(contract.jit_by_class, static_argnames=("depth",))
def _forced_depth_logits(target, draft, inputs, generated, depth: int):
    """Target logits `[B, L, V]` and draft logits `[depth, B, L, V]` teacher-forced along
    `generated`. Row d - 1 is the d-th draft of a round: for a target-aware draft that offers
    `unrolled_logits` it reads the target's features up to the round's start and its own
    states after that; any other draft sees the same prefix at every depth, so its rows are
    one forward repeated."""
    if depth == 1 or not drafters.as_drafter(draft, depth).unrolls:
        p_logits, q_logits = _forced_pair_logits(target, draft, inputs, generated)
        return p_logits, jnp.broadcast_to(q_logits[None], (depth,) + q_logits.shape)
    tstate, fed, p_logits, feats = _forced_target(target, draft, inputs, generated)
    if not draft.prefix_length(inputs.shape[1]):
        q_logits = draft.unrolled_logits(draft.params, target.context(tstate), fed, feats, depth)
        return p_logits, jnp.asarray(q_logits, jnp.float32)
    # A decoder-only target: the draft's rounds start after the prompt, so it reads each row's
    # cached prompt and then `fed`, one left-aligned sequence with the target's features of
    # every position, and the logits of the fed positions are picked out.
    tokens, features, cached = _after_prompt(inputs, tstate, target.context(tstate), fed, feats)
    q_all = draft.unrolled_logits(draft.params, None, tokens, features, depth)
    picked = cached[:, None] + jnp.arange(fed.shape[1])[None]  # [B, N]
    q_logits = jnp.take_along_axis(q_all, picked[None, :, :, None], axis=2)
    return p_logits, jnp.asarray(q_logits, jnp.float32)


def _after_prompt(inputs, tstate, prefix_features, fed, feats):
    """Each row's cached `[BOS] + prompt[:-1]` (a decoder-only target's prefill) followed by
    `fed [B, N]`, left-aligned in `[B, P + N]`, with the target's features after every
    position (`prefix_features [B, P + 1, F]`, then `feats [B, N, F]`), and where each row's
    fed tokens start (`[B]`). Positions past a row's end repeat its last fed token."""
    cached = tstate.lengths
    seq = jnp.concatenate([jnp.full((inputs.shape[0], 1), contract.BOS_ID, jnp.int32), inputs], 1)
    position = jnp.arange(inputs.shape[1] + fed.shape[1])[None]
    in_prompt = position < cached[:, None]
    from_prompt = jnp.minimum(position, seq.shape[1] - 1)
    from_fed = jnp.clip(position - cached[:, None], 0, fed.shape[1] - 1)
    tokens = jnp.where(in_prompt, jnp.take_along_axis(seq, from_prompt, 1),
                       jnp.take_along_axis(fed, from_fed, 1))
    if feats is None:  # a draft that reads no features
        return tokens, None, cached
    features = jnp.where(in_prompt[..., None],
                         jnp.take_along_axis(prefix_features, from_prompt[..., None], 1),
                         jnp.take_along_axis(feats, from_fed[..., None], 1))
    return tokens, features, cached


def _betas(p_logits, q_logits, sampling: SamplingConfig, lenience: float):
    if sampling.greedy:
        p = jax.nn.softmax(p_logits, axis=-1)
        x = jnp.argmax(q_logits, axis=-1).astype(jnp.int32)
        return sampling_lib.greedy_accepts(p, x, lenience).astype(jnp.float32)
    p = sampling_lib.adjusted_probs(p_logits, sampling)
    q = sampling_lib.adjusted_probs(q_logits, sampling)
    return sampling_lib.acceptance_rate(p, q, lenience)


@functools.partial(contract.jit_by_class, static_argnames=("sampling", "lenience"))
def forced_betas(target, draft, inputs, generated, *, sampling: SamplingConfig,
                 lenience: float = 1.0):
    """beta at every position of `generated [B, N]` (positions past a row's end are junk)."""
    p_logits, q_logits = _forced_pair_logits(target, draft, inputs, generated)
    return _betas(p_logits, q_logits, sampling, lenience)


@functools.partial(contract.jit_by_class, static_argnames=("sampling", "lenience"))
def _forced_betas_and_confidence(target, draft, inputs, generated, *, sampling, lenience):
    """`forced_betas` and, at each position, the target's top probability at temperature 1."""
    p_logits, q_logits = _forced_pair_logits(target, draft, inputs, generated)
    top = jnp.max(jax.nn.softmax(p_logits, axis=-1), axis=-1)
    return jnp.stack([_betas(p_logits, q_logits, sampling, lenience), top])


def collect_betas(target, draft, batches, *, sampling: SamplingConfig, num_tokens: int,
                  max_decode_len: int, lenience: float, rng,
                  with_confidence: bool = False) -> List[np.ndarray]:
    """Per generated sequence, its betas (up to EOS); stops after exactly `num_tokens` betas
    (the last sequence is cut) or when `batches` run out. With `with_confidence`, each
    sequence is `[2, n]`: its betas and the target's top probability (temperature 1) there."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    forced = _forced_betas_and_confidence if with_confidence else forced_betas
    sequences: List[np.ndarray] = []
    total = 0
    bar = tqdm(total=num_tokens, desc=f"alpha at T={sampling.temperature:g}", unit="tok")
    for i, inputs in enumerate(batches):
        inputs = jnp.asarray(inputs, jnp.int32)
        out = decoding.autoregressive_decode(target, inputs, rng=jax.random.fold_in(rng, i),
                                             sampling=sampling, max_decode_len=max_decode_len)
        values = np.asarray(forced(target, draft, inputs, out.tokens, sampling=sampling,
                                   lenience=lenience), np.float64)  # [B, N] or [2, B, N]
        for j, length in enumerate(np.asarray(out.lengths)):
            take = min(int(length), num_tokens - total)
            if take > 0:
                sequences.append(values[..., j, :take])
                total += take
                bar.update(take)
        if total >= num_tokens:
            break
    bar.close()
    return sequences


CONFIDENCE_EDGES = (0.0, 0.4, 0.6, 0.8, 0.95, 1.0)


def alpha_by_confidence(target, draft, batches, *, sampling: SamplingConfig, num_tokens: int,
                        max_decode_len: int, seed: int = 0,
                        edges: Sequence[float] = CONFIDENCE_EDGES) -> Dict[str, Any]:
    """Table 3's alpha split by how sure the target is: along the same `num_tokens` positions
    of the target's own text (`collect_betas`), each position's beta is binned by the target's
    top probability there at temperature 1 (bins `[edges[i], edges[i + 1])`, the last one
    closed). Where the target is sure, any good draft agrees; where it hesitates between
    tokens, a small draft's guess is close to a coin flip, and that is where alpha is lost.

    `mean_top` is the mean top probability: at T = 0 it is how often a draft that *sampled*
    from the target's own distribution would hit the target's argmax, a yardstick for how
    well a draft guesses where the target hesitates.

    Returns `{"alpha", "mean_top", "positions", "bins": [{"low", "high", "positions", "share",
    "alpha", "mean_top"}]}` (a bin with no positions has alpha and mean_top None)."""
    edges = [float(e) for e in edges]
    if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or sorted(set(edges)) != edges:
        raise ValueError(f"edges={edges}: give increasing bin edges from 0.0 to 1.0, "
                         "e.g. (0.0, 0.5, 0.9, 1.0).")
    rows = collect_betas(target, draft, batches, sampling=sampling, num_tokens=num_tokens,
                         max_decode_len=max_decode_len, lenience=1.0,
                         rng=jax.random.PRNGKey(seed), with_confidence=True)
    betas, top = np.concatenate(rows, axis=1) if rows else np.zeros((2, 0))
    which = np.clip(np.searchsorted(edges, top, side="right") - 1, 0, len(edges) - 2)
    bins = []
    for i in range(len(edges) - 1):
        mask = which == i
        count = int(mask.sum())
        bins.append({"low": edges[i], "high": edges[i + 1], "positions": count,
                     "share": count / max(len(betas), 1),
                     "alpha": float(betas[mask].mean()) if count else None,
                     "mean_top": float(top[mask].mean()) if count else None})
    return {"alpha": float(betas.mean()) if len(betas) else None,
            "mean_top": float(top.mean()) if len(top) else None,
            "positions": int(len(betas)), "bins": bins}


@dataclasses.dataclass(frozen=True)
class RankAcceptance:
    """Per-rank acceptance of a token tree's children (`rank_acceptance`).

    Attributes:
      rates: [R] a_j = P(the child of rank j is kept | the ones before it were not).
      positions: the generated positions measured.
      kept_at_rank: [R] how often the child of rank j was kept.
      reached_rank: [R] how often rank j was tested (every rank before it rejected).
      depth_rates: [D, R] the same rates for the d-th draft of a round (row 0 = `rates`), when
        measured with `max_depth` > 1; what `theory.best_tree` takes for a target-aware draft,
        whose deeper drafts read its own states instead of the target's.
      depth_positions: [D] the positions measured at each depth (depth d needs j >= d - 1).
    """

    rates: Tuple[float, ...]
    positions: int
    kept_at_rank: Tuple[int, ...]
    reached_rank: Tuple[int, ...]
    depth_rates: Tuple[Tuple[float, ...], ...] = ()
    depth_positions: Tuple[int, ...] = ()

    @property
    def theory_rates(self):
        """What `theory` takes: `[D, R]` when measured per depth, else `[R]`."""
        return self.depth_rates if len(self.depth_rates) > 1 else self.rates

    def to_json(self) -> Dict[str, Any]:
        return {k: [list(r) if isinstance(r, tuple) else r for r in v] if isinstance(v, tuple)
                else v for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True)
class TreeChoice:
    """What `choose_tree` measured and predicted: the per-rank rates and the best chain and
    tree for them (`plan`)."""

    rates: Tuple[float, ...]
    plan: theory.TreePlan
    depth_rates: Tuple[Tuple[float, ...], ...] = ()  # [D, R] when measured per depth

    @property
    def tree(self) -> Optional[Tuple[int, ...]]:
        """The shape to decode with: None (the chain) unless a branching tree is faster."""
        return None if self.plan.tree == self.plan.chain else self.plan.tree

    def to_json(self) -> Dict[str, Any]:
        out = {"rates": list(self.rates), **self.plan.to_json()}
        if self.depth_rates:
            out["depth_rates"] = [list(r) for r in self.depth_rates]
        return out

    def line(self) -> str:
        """What was decided, and why, in one line."""
        plan = self.plan
        rates = ", ".join(f"{a:.2f}" for a in self.rates)
        if len(self.depth_rates) > 1:
            rates += (" at depth 1, "
                      + ", ".join(f"{r[0]:.2f}" for r in self.depth_rates[1:])
                      + f" for the top rank at depths 2-{len(self.depth_rates)}")
        line = (f"per-rank acceptance {rates}; best chain gamma {len(plan.chain)} predicted "
                f"{plan.chain_speedup:.2f}x")
        if self.tree is None:
            return line + ("; no token tree is predicted faster (verifying more tokens costs "
                           "more than the extra ones gain): the chain")
        return line + (f"; best tree {plan.tree} ({theory.tree_nodes(plan.tree)} nodes) "
                       f"predicted {plan.tree_speedup:.2f}x: the tree")


def rank_acceptance(target, draft, batches: Sequence[np.ndarray], sampling: SamplingConfig, *,
                    max_rank: int, max_decode_len: int, max_depth: int = 1,
                    seed: int = 0) -> RankAcceptance:
    """Per-rank acceptance of a token tree's children along the target's own output (`batches`
    decoded by the target under `sampling`, both models teacher-forced along it): a_j = P(the
    child of rank j is kept | the ones before it were not), what `theory.tree_expected_tokens`
    takes. At T = 0 it comes from the rank of the target's argmax in the draft's order; at T > 0
    the exact sibling test (`trees.exact_walk` on a one-level tree) runs `TREE_DRAWS` times per
    position.

    With `max_depth` D > 1 the rates are also measured for the d-th draft of a round, d <= D
    (`depth_rates`): a target-aware draft's d-th draft reads the target's features up to the
    round's start and its own states after it (`unrolled_logits`), so its rates can fall with
    depth; a separate draft sees the same prefix at every depth. The text is the target's, so
    depth d's rates are conditioned on the d - 1 drafts before it being the target's tokens,
    the path a tree's depth-d node continues. Rows share one decode and one Monte Carlo draw.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth={max_depth!r} must be an int >= 1 (1 = first drafts only).")
    kept = np.zeros((max_depth, max_rank), np.int64)
    reached = np.zeros((max_depth, max_rank), np.int64)
    positions = np.zeros(max_depth, np.int64)
    rng = jax.random.PRNGKey(seed)
    for x in batches:
        rng, decode_key, mc_key = jax.random.split(rng, 3)
        out = decoding.autoregressive_decode(target, x, rng=decode_key, sampling=sampling,
                                             max_decode_len=max_decode_len)
        tokens = np.asarray(out.tokens)
        valid = np.arange(tokens.shape[1])[None] < np.asarray(out.lengths)[:, None]
        p_all, q_all = _forced_depth_logits(target, draft, jnp.asarray(x, jnp.int32),
                                            jnp.asarray(tokens), max_depth)
        # T = 0 ranks each position once; T > 0 simulates TREE_DRAWS sibling tests at each.
        draw_keys = jax.random.split(mc_key, 1 if sampling.greedy else TREE_DRAWS)
        for d in range(max_depth):
            at_depth = valid & (np.arange(tokens.shape[1])[None] >= d)  # a round began at j - d
            positions[d] += int(at_depth.sum())
            # Every position is ranked (one shape, one program for all depths); `at_depth`
            # picks the counted ones. rank [draws, B, N]: 0 = the draft's top token, max_rank
            # = none kept; ok [draws, B, N, max_rank]: which children were drawn.
            rank, ok = _ranks(p_all, q_all[d], draw_keys, sampling=sampling, max_rank=max_rank)
            rank, ok = np.asarray(rank)[:, at_depth], np.asarray(ok)[:, at_depth]
            for j in range(max_rank):
                reached[d, j] += int(np.sum((rank >= j) & ok[..., j]))
                kept[d, j] += int(np.sum(rank == j))
    rates = np.where(reached > 0, kept / np.maximum(reached, 1), 0.0)
    by_depth = tuple(tuple(r) for r in rates.tolist()) if max_depth > 1 else ()
    return RankAcceptance(tuple(rates[0].tolist()), int(positions[0]),
                          tuple(kept[0].tolist()), tuple(reached[0].tolist()),
                          depth_rates=by_depth,
                          depth_positions=tuple(positions.tolist()) if max_depth > 1 else ())


@functools.partial(jax.jit, static_argnames=("sampling", "max_rank"))
def _ranks(p_logits: jax.Array, q_logits: jax.Array, keys: jax.Array, *,
           sampling: SamplingConfig, max_rank: int) -> Tuple[jax.Array, jax.Array]:
    """The rank of the child a token tree of `max_rank` children keeps at each position of
    `p_logits, q_logits [..., V]` (`rank_acceptance`), once per key of `keys [draws]`: at
    T = 0 the draft's rank of the target's argmax (the same for every key, all children
    drawn); at T > 0 the child recursive rejection sampling accepts among `max_rank` drawn
    without replacement from q (max_rank: none). Returns `(rank [draws, ...], ok [draws, ...,
    max_rank])`, ok saying which children were drawn (q's support can run out)."""
    if sampling.greedy:
        best = jnp.argmax(p_logits, -1)
        own = jnp.take_along_axis(q_logits, best[..., None], -1)
        rank = jnp.sum(q_logits > own, -1)
        ok = jnp.ones(rank.shape + (max_rank,), bool)
        return (jnp.broadcast_to(rank, keys.shape[:1] + rank.shape),
                jnp.broadcast_to(ok, keys.shape[:1] + ok.shape))
    lead, vocab = p_logits.shape[:-1], p_logits.shape[-1]
    p = sampling_lib.adjusted_probs(p_logits, sampling).reshape(-1, vocab)
    q = sampling_lib.adjusted_probs(q_logits, sampling).reshape(-1, vocab)
    tree = trees.Tree((max_rank,))
    nodes = jnp.broadcast_to(p[:, None], (p.shape[0], tree.num_nodes, vocab))

    def draw(key):
        child_key, walk_key = jax.random.split(key)
        children, ok = trees.sampled_children(q, max_rank, child_key)
        walk = trees.exact_walk(tree, nodes, q[:, None], children, ok, walk_key)
        rank = jnp.where(walk.accepted > 0, walk.path[:, 0] - 1, max_rank)
        return rank.reshape(lead), ok.reshape(lead + (max_rank,))

    return jax.lax.map(draw, keys)


def choose_tree(target, draft, batches, sampling: SamplingConfig, costs: costs_lib.StepCosts,
                row_costs: Callable[[], Dict[int, float]], *, max_decode_len: int,
                max_nodes: int, seed: int = 0) -> TreeChoice:
    """The token tree `theory.best_tree` predicts fastest, against the best chain: per-rank
    acceptance along the target's output for `batches` (`rank_acceptance`, 4 ranks; per depth
    up to `TREE_RATE_DEPTHS` for a draft whose deeper drafts differ, i.e. one that offers
    `unrolled_logits`), the verify costs of `costs` (`costs.measure_costs` at widths up to
    `max_nodes`) and the draft's cost on m paths, `{m: cost}` from `row_costs()` (a function
    that measures them with `costs.draft_row_costs`). It is called only if some tree beats the
    best chain with the draft's call priced at its one-row cost c whatever its rows (a bound:
    more rows never cost less): where verifying more tokens is what loses, as on a CPU, no tree
    can win and the draft's timing is skipped."""
    depths = TREE_RATE_DEPTHS if drafters.as_drafter(draft, 1).unrolls else 1
    ranks = rank_acceptance(target, draft, [np.concatenate([np.asarray(b) for b in batches])],
                            sampling, max_rank=4, max_decode_len=max_decode_len,
                            max_depth=depths, seed=seed)

    def plan_for(draft_cost):
        return theory.best_tree(ranks.theory_rates, costs.c, costs.verify_curve(),
                                draft_cost=draft_cost, max_nodes=max_nodes)

    plan = plan_for(None)  # every draft call at c: the trees' best case
    if plan.tree != plan.chain:
        plan = plan_for(costs_lib.cost_curve(row_costs()))
    return TreeChoice(ranks.rates, plan, depth_rates=ranks.depth_rates)


def beta_statistics(sequences: Sequence[np.ndarray], bins: int = 20) -> Dict[str, Any]:
    """alpha, its standard errors, lag-1 autocorrelation and histogram (module docstring)."""
    sequences = [np.asarray(s, np.float64) for s in sequences if len(s)]
    if not sequences:
        raise ValueError("No generated tokens to measure alpha on; check the inputs/task.")
    beta = np.concatenate(sequences)
    n = beta.size
    alpha = float(beta.mean())
    dev = beta - alpha
    var = float(np.mean(dev ** 2))
    nan = float("nan")
    se_naive = float(beta.std(ddof=1) / math.sqrt(n)) if n > 1 else nan
    groups = len(sequences)
    sums = np.array([np.sum(s - alpha) for s in sequences])
    se_cluster = (float(math.sqrt(groups / (groups - 1) * np.sum(sums ** 2)) / n)
                  if groups > 1 else nan)
    length = max(1, int(math.sqrt(n)))
    num_batches = n // length
    if num_batches > 1:
        means = beta[:num_batches * length].reshape(num_batches, length).mean(axis=1)
        se_batch = float(means.std(ddof=1) / math.sqrt(num_batches))
    else:
        se_batch = nan
    pairs = [((s[:-1] - alpha) * (s[1:] - alpha)) for s in sequences if len(s) > 1]
    num_pairs = sum(p.size for p in pairs)
    lag1 = (float(sum(p.sum() for p in pairs) / num_pairs / var)
            if num_pairs and var > 0 else nan)
    ess = n * (se_naive / se_cluster) ** 2 if se_cluster and se_cluster > 0 else nan
    counts, edges = np.histogram(beta, bins=bins, range=(0.0, 1.0))
    return {
        "num_tokens": int(n),
        "num_sequences": groups,
        "mean_sequence_length": n / groups,
        "alpha": alpha,
        "se_naive": se_naive,
        "se_cluster": se_cluster,
        "se_batch_means": se_batch,
        "batch_length": length,
        "lag1_autocorrelation": lag1,
        "effective_sample_size": ess,
        "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
    }


def bundle_alpha(target, draft, inputs, temperature: float, num_tokens: int,
                 seed: int) -> Dict[str, Any]:
    """alpha of `draft` along `target`'s text (Table 3's method) on a bundle's test inputs
    (`bundles.Bundle`: `inputs.batches`, `inputs.max_decode_len`), in batches of 64:
    `{"alpha", "se_cluster", "num_tokens", "lag1_autocorrelation"}`."""
    betas = collect_betas(
        target, draft, inputs.batches(None, 64), sampling=SamplingConfig(temperature),
        num_tokens=num_tokens, max_decode_len=inputs.max_decode_len, lenience=1.0,
        rng=jax.random.PRNGKey(seed))
    stats = beta_statistics(betas)
    return {k: stats[k] for k in ("alpha", "se_cluster", "num_tokens", "lag1_autocorrelation")}
