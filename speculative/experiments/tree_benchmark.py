"""Chains against token trees on a bundled pair: tokens per target call, cost, speed.

For each temperature:

1. **Per-rank acceptance** a_j (`acceptance.rank_acceptance`): along the target's own output for
   `num_rank_sentences` test sources (not the timed ones), the chance that a node's child of
   rank j is kept given that the ones before it were not.
2. **Costs** (`costs.measure_costs`, `costs.draft_row_costs`, interleaved): the target's verify
   cost at every width up to `max_nodes` drafted tokens, and the draft's cost on m paths.
3. **Choice** (`theory.best_tree`): the best chain and the best tree for those rates and costs.
4. **Timing**: baseline, the chosen chain, the chosen tree and the branching shape with the most
   predicted tokens per call (within `max_nodes`) decode the timed sentences (batch 1), in
   interleaved rounds. Tokens per target call come from the decodes' own statistics.

Run it with nothing else busy on the machine:

    python scripts/tree_benchmark.py --target=large_target --output_dir=results/large/trees
"""

from __future__ import annotations

import time
from typing import Dict

import numpy as np

from speculative import files
from speculative.data import bundles
from speculative.decode import drafters, validation
from speculative.decode import stats as stats_lib
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import acceptance, host
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.runs import mini

DRAFT_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)  # paths per draft call whose cost is measured


def run(output_dir: str, target_name: str = mini.LARGE_TARGET, draft_name: str = "",
        num_sentences: int = 16, num_rank_sentences: int = 64, temperatures=(0.0, 1.0),
        max_nodes: int = 16, repeats: int = 3, overwrite: bool = False, seed: int = 0) -> Dict:
    """Measures chain vs tree for one pair; writes `trees.json` and `trees.md`."""
    validation.positive_int(num_sentences, "num_sentences", "test sentences timed")
    validation.positive_int(num_rank_sentences, "num_rank_sentences",
                           "test sentences for the per-rank acceptance rates")
    validation.positive_int(repeats, "repeats", "timed rounds")
    validation.positive_int(max_nodes, "max_nodes", "drafted tokens per verify")
    files.check_report(output_dir, "trees", overwrite)
    inputs = bundles.bundle(target_name)  # the EN->DE pairs or the decoder-only code pair
    draft_name = draft_name or inputs.best_draft(target_name)
    target, draft = inputs.load(target_name), inputs.load(draft_name)
    timed = inputs.batches(num_sentences, 1)
    rank_batches = [np.concatenate(inputs.batches(num_sentences + num_rank_sentences, 16))[
        num_sentences:]]  # the sentences after the timed ones, as one batch
    load = host.LoadAverage()
    start = time.time()
    costs = costs_lib.measure_costs(target, draft, timed[0], list(range(1, max_nodes + 1)),
                                    max_decode_len=inputs.max_decode_len, num_steps=16,
                                    repeats=5, seed=seed)
    draft_cost_rows = costs_lib.draft_row_costs(
        target, draft, timed[0], DRAFT_ROWS, c=costs.c, max_decode_len=inputs.max_decode_len,
        seed=seed)
    verify = costs.verify_curve()
    draft_cost = costs_lib.cost_curve(draft_cost_rows)
    rows = []
    unrolls = drafters.as_drafter(draft, 1).unrolls  # its deeper drafts' laws differ
    for temperature in temperatures:
        sampling = SamplingConfig(temperature)
        ranks = acceptance.rank_acceptance(
            target, draft, rank_batches, sampling, max_rank=4,
            max_decode_len=inputs.max_decode_len, seed=seed,
            max_depth=acceptance.TREE_RATE_DEPTHS if unrolls else 1)
        rates = ranks.theory_rates  # [D, R] for a target-aware draft, else [R]
        choice = theory.best_tree(rates, costs.c, verify, draft_cost=draft_cost,
                                  max_nodes=max_nodes)
        chain, tree = choice.chain, choice.tree
        most = max((s for s in theory.tree_shapes(16, max_nodes, 4) if max(s) > 1),
                   key=lambda s: theory.tree_expected_tokens(s, rates))
        shapes = {"chain": chain, "tree": tree, "most_tokens": most}
        settings = {"chain": (len(chain), 0.0)}
        for name in ("tree", "most_tokens"):
            if shapes[name] != chain and (name == "tree" or most != tree):
                settings[name] = (len(shapes[name]), 0.0, "constant", None, shapes[name])
        programs = costs_lib.decode_programs(target, [draft] * len(timed), timed, settings,
                                             sampling=sampling,
                                             max_decode_len=inputs.max_decode_len, seed=seed)
        _, times, outputs = costs_lib.interleaved(programs, repeats,
                                                  progress=f"T={temperature:g}: timing")
        base = float(np.median(times["baseline"]))
        row = {"temperature": temperature, "rank_acceptance": ranks.to_json(),
               "choice": choice.to_json()}
        for name in settings:
            stats = stats_lib.merge_stats([r.stats for r in outputs[name]]).summary()
            shape = shapes[name]
            row[name] = {
                "shape": list(shape), "nodes": theory.tree_nodes(shape),
                "verify_cost": verify(theory.tree_nodes(shape)),
                "tokens_per_target_call": stats["tokens_per_target_call"],
                "predicted_tokens_per_target_call": theory.tree_expected_tokens(
                    shape, rates),
                "speedup": base / float(np.median(times[name])),
                "predicted_speedup": theory.tree_speedup(shape, rates, costs.c,
                                                         verify, draft_cost),
                "seconds_median": float(np.median(times[name]))}
        row["baseline_seconds_median"] = base
        best = max((row[n] for n in ("tree", "most_tokens") if n in row),
                   key=lambda r: r["tokens_per_target_call"], default=None)
        if best is not None:
            row["tree_over_chain_tokens"] = (best["tokens_per_target_call"]
                                             / row["chain"]["tokens_per_target_call"])
        rows.append(row)
        print(_line(row), flush=True)
    result = {"target": target_name, "draft": draft_name, "sentences": num_sentences,
              "rank_sentences": num_rank_sentences, "repeats": repeats, "max_nodes": max_nodes,
              "c": costs.c, "verify_cost": costs.verify_cost,
              "draft_cost_rows": draft_cost_rows, "rows": rows,
              "seconds": round(time.time() - start, 1),
              "load_average_1m": load.record(),
              "environment": host.environment()}
    record.publish("trees", f"{target_name}/{draft_name}", output_dir, "trees", result, markdown,
                   load=result["load_average_1m"])
    return result


def _line(row: Dict) -> str:
    parts = [f"T={row['temperature']:g} rank rates "
             + ", ".join(f"{a:.3f}" for a in row["rank_acceptance"]["rates"])]
    for name in ("chain", "tree", "most_tokens"):
        if name in row:
            r = row[name]
            parts.append(f"{name} {tuple(r['shape'])}: {r['tokens_per_target_call']:.2f} tok/call "
                         f"(pred {r['predicted_tokens_per_target_call']:.2f}), {r['speedup']:.2f}x "
                         f"(pred {r['predicted_speedup']:.2f}x)")
    return " | ".join(parts)


def markdown(result: Dict) -> str:
    head = ["T", "a_1..a_4 (per rank)", "shape", "nodes", "verify cost", "tokens/call",
            "predicted tokens/call", "speedup", "predicted speedup"]
    rows = []
    for row in result["rows"]:
        rates = " ".join(f"{a:.2f}" for a in row["rank_acceptance"]["rates"])
        for name in ("chain", "tree", "most_tokens"):
            if name not in row:
                if name == "tree":
                    rows.append([f"{row['temperature']:g}", rates, "best tree = the chain (no "
                                 "branching shape is predicted faster)"] + [""] * (len(head) - 3))
                continue
            r = row[name]
            label = {"chain": "best chain", "tree": "best tree",
                     "most_tokens": "most tokens/call"}[name]
            rows.append([
                f"{row['temperature']:g}", rates, f"{label} {tuple(r['shape'])}",
                str(r["nodes"]), f"{r['verify_cost']:.2f}",
                f"{r['tokens_per_target_call']:.2f}",
                f"{r['predicted_tokens_per_target_call']:.2f}", f"{r['speedup']:.2f}x",
                f"{r['predicted_speedup']:.2f}x"])
    verify = ", ".join(f"{n}: {v:.2f}" for n, v in sorted(
        (int(k), v) for k, v in result["verify_cost"].items()))
    drafts = ", ".join(f"{m}: {v:.3f}" for m, v in sorted(
        (int(k), v) for k, v in result["draft_cost_rows"].items()))
    env = result["environment"]["cpu"]
    load = result["load_average_1m"]
    return (f"# Chains and token trees ({result['target']} + {result['draft']}, batch 1)\n\n"
            "`python scripts/tree_benchmark.py` (speculative/experiments/tree_benchmark.py). "
            f"{result['sentences']} test sentences timed in {result['repeats']} interleaved "
            f"rounds; per-rank acceptance along the target's output for {result['rank_sentences']}"
            f" other test sentences; shapes chosen by `theory.best_tree` (up to "
            f"{result['max_nodes']} drafted nodes). Host: {env.get('model')}, load average "
            f"{load['before']:.2f} before, {load['after']:.2f} after.\n\n"
            + files.markdown_table(head, rows) + "\n"
            f"c = {result['c']:.3f}. Verify cost by drafted tokens (target steps): {verify}. "
            f"Draft call on m paths (target steps): {drafts}.\n")
