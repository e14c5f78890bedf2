"""Chains against token trees on a bundled pair: tokens per target call, cost, speed.

For each temperature:

1. **Per-rank acceptance** a_j (`rank_acceptance`): along the target's own output for
   `num_rank_sentences` validation-free test sources (not the timed ones), the chance that a
   node's child of rank j is kept given that the ones before it were not: at T = 0 from the rank
   of the target's argmax in the draft's order, at T > 0 by running the exact sibling test
   (`trees.exact_walk` on a one-level tree) `MC_DRAWS` times per position.
2. **Costs** (`costs.measure_costs`, interleaved): the target's verify cost at every width up to
   `max_nodes` drafted tokens, and the draft's cost on m paths at once.
3. **Choice** (`theory.best_tree`): the best chain and the best tree for those rates and costs.
4. **Timing**: baseline, the chosen chain and the chosen tree decode the timed sentences (batch
   1), in interleaved rounds. Tokens per target call come from the decodes' own statistics.

Run it with nothing else busy on the machine:

    python scripts/tree_benchmark.py --target=large_target --output_dir=results/large/trees
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import decoding, files, theory, trees
from speculative import sampling as sampling_lib
from speculative.runs import benchmark, mini, mini_results
from speculative.runs import costs as costs_lib
from speculative.sampling import SamplingConfig

MC_DRAWS = 8  # sibling tests simulated per position at T > 0
DRAFT_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)  # paths per draft call whose cost is measured


def _teacher_forced(model, inputs, tokens):
    """Logits `[B, N, V]` of `model` along `tokens [B, N]` (its decode cache, one extend)."""
    state = model.init(model.params, jnp.asarray(inputs), tokens.shape[1] + 2)
    feed = jnp.concatenate([state.pending[:, None], jnp.asarray(tokens[:, :-1])], 1)
    logits, _ = model.extend(model.params, state, feed)
    return logits


def rank_acceptance(target, draft, batches: Sequence[np.ndarray], sampling: SamplingConfig, *,
                    max_rank: int, max_decode_len: int, seed: int = 0) -> Dict:
    """Per-rank acceptance rates `a_1..a_max_rank` along the target's output (module docstring).
    Returns `{"rates", "positions", "kept_at_rank", "reached_rank"}`."""
    if decoding.reads_target(draft):
        raise ValueError("rank_acceptance teacher-forces the draft alone; a target-aware draft "
                         "needs the target's features at every position. Measure it with a "
                         "separate draft, or read tokens per call from a tree decode.")
    kept = np.zeros(max_rank, np.int64)
    reached = np.zeros(max_rank, np.int64)
    positions = 0
    rng = jax.random.PRNGKey(seed)
    for i, x in enumerate(batches):
        rng, decode_key, mc_key = jax.random.split(rng, 3)
        out = decoding.autoregressive_decode(target, x, rng=decode_key, sampling=sampling,
                                             max_decode_len=max_decode_len)
        tokens = np.asarray(out.tokens)
        valid = np.arange(tokens.shape[1])[None] < np.asarray(out.lengths)[:, None]
        p_logits = _teacher_forced(target, x, tokens)[valid]  # [P, V]
        q_logits = _teacher_forced(draft, x, tokens)[valid]
        positions += int(valid.sum())
        if sampling.greedy:
            best = jnp.argmax(p_logits, -1)
            own = jnp.take_along_axis(q_logits, best[:, None], 1)
            rank = np.asarray(jnp.sum(q_logits > own, -1))  # 0 = the draft's top token
            for j in range(max_rank):
                reached[j] += int(np.sum(rank >= j))
                kept[j] += int(np.sum(rank == j))
            continue
        tree = trees.Tree((max_rank,))
        p = sampling_lib.adjusted_probs(p_logits, sampling)
        q = sampling_lib.adjusted_probs(q_logits, sampling)
        for key in jax.random.split(mc_key, MC_DRAWS):
            child_key, walk_key = jax.random.split(key)
            children, ok = trees.sampled_children(q, max_rank, child_key)
            nodes = jnp.broadcast_to(p[:, None], (p.shape[0], tree.num_nodes, p.shape[-1]))
            walk = trees.exact_walk(tree, nodes, q[:, None], children, ok, walk_key)
            rank = np.where(np.asarray(walk.accepted) > 0, np.asarray(walk.path[:, 0]) - 1,
                            max_rank)
            ok = np.asarray(ok)
            for j in range(max_rank):
                reached[j] += int(np.sum((rank >= j) & ok[:, j]))
                kept[j] += int(np.sum(rank == j))
    rates = np.where(reached > 0, kept / np.maximum(reached, 1), 0.0)
    return {"rates": rates.tolist(), "positions": positions, "kept_at_rank": kept.tolist(),
            "reached_rank": reached.tolist()}


def _interpolated(points: Dict[int, float]):
    xs = sorted(points)
    return lambda n: float(np.interp(n, xs, [points[x] for x in xs]))


def measure_tree_costs(target, draft, inputs: np.ndarray, *, max_nodes: int,
                       max_decode_len: int, seed: int = 0) -> Dict:
    """Verify cost at 1..max_nodes drafted tokens (`costs.measure_costs`) and the draft's
    cost on m paths relative to one target step (`DRAFT_ROWS`), timed in interleaved rounds."""
    costs = costs_lib.measure_costs(target, draft, inputs, list(range(1, max_nodes + 1)),
                                    max_decode_len=max_decode_len, num_steps=16, repeats=5,
                                    seed=seed)
    cache_len = draft.prefix_length(inputs.shape[1]) + max_decode_len + 2
    programs = {m: costs_lib._extend_program(  # pylint: disable=protected-access
        draft, np.repeat(inputs, m, 0), 1, cache_len=cache_len, num_steps=16, seed=seed,
        target=target) for m in DRAFT_ROWS}
    _, times, _ = costs_lib.interleaved(programs, 5)
    step = {m: float(np.median(t)) / 16 for m, t in times.items()}
    return {**costs, "draft_cost_rows": {m: step[m] / step[1] * costs["c"] for m in DRAFT_ROWS}}


def run(output_dir: str, target_name: str = mini.LARGE_TARGET, draft_name: str = "",
        num_sentences: int = 16, num_rank_sentences: int = 64, temperatures=(0.0, 1.0),
        max_nodes: int = 12, repeats: int = 3, overwrite: bool = False, seed: int = 0) -> Dict:
    """Measures chain vs tree for one pair; writes `trees.json` and `trees.md`."""
    benchmark.positive_int(num_sentences, "num_sentences", "test sentences timed")
    benchmark.positive_int(num_rank_sentences, "num_rank_sentences",
                           "test sentences for the per-rank acceptance rates")
    benchmark.positive_int(repeats, "repeats", "timed rounds")
    benchmark.positive_int(max_nodes, "max_nodes", "drafted tokens per verify")
    out_json = os.path.join(output_dir, "trees.json")
    if os.path.exists(out_json) and not overwrite:
        raise FileExistsError(f"{out_json} exists; pass --overwrite or another --output_dir.")
    draft_name = draft_name or mini.best_draft(target_name)
    target, draft = mini.load(target_name), mini.load(draft_name)
    inputs = mini_results.bundle(target_name)
    timed = inputs.batches(num_sentences, 1)
    rank_batches = [b for b in inputs.batches(num_sentences + num_rank_sentences, 16)]
    rank_batches = [np.concatenate(rank_batches)[num_sentences:]]
    load_before = os.getloadavg()[0]
    start = time.time()
    costs = measure_tree_costs(target, draft, timed[0], max_nodes=max_nodes,
                               max_decode_len=inputs.max_decode_len, seed=seed)
    verify = _interpolated({0: 1.0, **costs["verify_cost"]})
    draft_cost = _interpolated(costs["draft_cost_rows"])
    rows = []
    for temperature in temperatures:
        sampling = SamplingConfig(temperature)
        ranks = rank_acceptance(target, draft, rank_batches, sampling, max_rank=4,
                                max_decode_len=inputs.max_decode_len, seed=seed)
        choice = theory.best_tree(ranks["rates"], costs["c"], verify, draft_cost=draft_cost,
                                  max_nodes=max_nodes)
        chain, tree = choice["chain"], choice["tree"]
        settings = {"chain": (len(chain), 0.0)}
        if tree != chain:
            settings["tree"] = (len(tree), 0.0, "constant", None, tree)
        programs = costs_lib.decode_programs(target, [draft] * len(timed), timed, settings,
                                             sampling=sampling,
                                             max_decode_len=inputs.max_decode_len, seed=seed)
        _, times, outputs = costs_lib.interleaved(programs, repeats,
                                                  progress=f"T={temperature:g}: timing")
        base = float(np.median(times["baseline"]))
        row = {"temperature": temperature, "rank_acceptance": ranks, "choice": choice}
        for name in settings:
            stats = decoding.merge_stats([r.stats for r in outputs[name]]).summary()
            shape = chain if name == "chain" else tree
            row[name] = {
                "shape": list(shape), "nodes": theory.tree_nodes(shape),
                "verify_cost": verify(theory.tree_nodes(shape)),
                "tokens_per_target_call": stats["tokens_per_target_call"],
                "predicted_tokens_per_target_call": theory.tree_expected_tokens(
                    shape, ranks["rates"]),
                "speedup": base / float(np.median(times[name])),
                "predicted_speedup": theory.tree_speedup(shape, ranks["rates"], costs["c"],
                                                         verify, draft_cost),
                "seconds_median": float(np.median(times[name]))}
        row["baseline_seconds_median"] = base
        rows.append(row)
        print(_line(row), flush=True)
    result = {"target": target_name, "draft": draft_name, "sentences": num_sentences,
              "rank_sentences": num_rank_sentences, "repeats": repeats, "max_nodes": max_nodes,
              "c": costs["c"], "verify_cost": costs["verify_cost"],
              "draft_cost_rows": costs["draft_cost_rows"], "rows": rows,
              "seconds": round(time.time() - start, 1),
              "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
              "environment": benchmark.environment()}
    os.makedirs(output_dir, exist_ok=True)
    files.write_atomic_group({os.path.join(output_dir, "trees.md"): markdown(result),
                              out_json: json.dumps(files.json_ready(result), indent=1)})
    return result


def _line(row: Dict) -> str:
    parts = [f"T={row['temperature']:g} rank rates "
             + ", ".join(f"{a:.3f}" for a in row["rank_acceptance"]["rates"])]
    for name in ("chain", "tree"):
        if name in row:
            r = row[name]
            parts.append(f"{name} {tuple(r['shape'])}: {r['tokens_per_target_call']:.2f} tok/call "
                         f"(pred {r['predicted_tokens_per_target_call']:.2f}), {r['speedup']:.2f}x "
                         f"(pred {r['predicted_speedup']:.2f}x)")
    return " | ".join(parts)


def markdown(result: Dict) -> str:
    head = ["T", "a_1..a_4 (per rank)", "shape", "nodes", "verify cost", "tokens/call",
            "predicted tokens/call", "speedup", "predicted speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["rows"]:
        rates = " ".join(f"{a:.2f}" for a in row["rank_acceptance"]["rates"])
        for name in ("chain", "tree"):
            if name not in row:
                lines.append(f"| {row['temperature']:g} | {rates} | tree = chain (no branching "
                             "tree is predicted faster) | | | | | | |")
                continue
            r = row[name]
            lines.append("| " + " | ".join([
                f"{row['temperature']:g}", rates, f"{name} {tuple(r['shape'])}",
                str(r["nodes"]), f"{r['verify_cost']:.2f}",
                f"{r['tokens_per_target_call']:.2f}",
                f"{r['predicted_tokens_per_target_call']:.2f}", f"{r['speedup']:.2f}x",
                f"{r['predicted_speedup']:.2f}x"]) + " |")
    verify = ", ".join(f"{n}: {v:.2f}" for n, v in sorted(
        (int(k), v) for k, v in result["verify_cost"].items()))
    drafts = ", ".join(f"{m}: {v:.3f}" for m, v in sorted(
        (int(k), v) for k, v in result["draft_cost_rows"].items()))
    env = result["environment"]["cpu"]
    load = result["load_average_1m"]
    return (f"# Chains and token trees ({result['target']} + {result['draft']}, batch 1)\n\n"
            "`python scripts/tree_benchmark.py` (speculative/experiments/trees.py). "
            f"{result['sentences']} test sentences timed in {result['repeats']} interleaved "
            f"rounds; per-rank acceptance along the target's output for {result['rank_sentences']}"
            f" other test sentences; shapes chosen by `theory.best_tree` (up to "
            f"{result['max_nodes']} drafted nodes). Host: {env.get('model')}, load average "
            f"{load['before']:.2f} before, {load['after']:.2f} after.\n\n"
            + "\n".join(lines) + "\n\n"
            f"c = {result['c']:.3f}. Verify cost by drafted tokens (target steps): {verify}. "
            f"Draft call on m paths (target steps): {drafts}.\n")
