"""Block drafts against chains: one draft call per round against gamma calls.

    python scripts/block_draft_benchmark.py                 # ~10-15 minutes on 2 CPU cores

For each draft of the large pair (the block draft, the target-aware chain, the best separate
T5) and each gamma: the draft's cost per round c_round (one `propose`, timed, in target steps;
a target-aware or block draft's catch-up chunk is as wide as the last round's accepted drafts
need, so its `propose` is timed after a round accepting w - 1 drafts for each compiled width w
and averaged over the decode's own accepted counts, `round_costs.expected_c_round`),
the verify cost, per-depth acceptance along the target's text (Table 3's method:
`acceptance.rank_acceptance`), tokens per target call, and the speedup over the baseline at
T = 0 and T = 1 (each sentence sampled 4 times), every program timed in the same interleaved
rounds in one process. Theorem 3.8 with the round's cost: speedup = E[tokens](alpha, gamma) /
(c_round + verify_cost(gamma)), which is the paper's gamma c + 1 with the draft's measured
cost per round in place of gamma c and the verify's in place of 1.

Writes `<output_dir>/block_drafts.json` and `.md` (provenance included) and indexes the run.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Dict, List, Tuple

import numpy as np

from speculative import files
from speculative.decode import drafters
from speculative.decode import stats as stats_lib
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import acceptance, host
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.measure import round_costs as round_costs_lib
from speculative.runs import mini


@dataclasses.dataclass(frozen=True)
class BlockBenchSettings:
    """What `run` measures (defaults: the demo's pair and sentences)."""

    target: str = "large_target"
    drafts: Tuple[str, ...] = ("large_block_draft", "large_feature_draft", "large_draft_kdtv")
    gammas: Tuple[int, ...] = (2, 3, 5, 7)
    temperatures: Tuple[float, ...] = (0.0, 1.0)
    num_sentences: int = 8
    samples_at_t1: int = 4
    max_decode_len: int = 48
    repeats: int = 3
    round_steps: int = 16
    output_dir: str = os.path.join(record.REPO, "results", "large", "target_aware", "block_drafts")
    seed: int = 0


def round_costs(target, drafts, inputs, s: BlockBenchSettings) -> Dict[str, Any]:
    """Target step (s), verify cost, and c_round and draft calls per (draft, gamma), in target
    steps (`measure.round_costs`: each draft's drafter timed with the loop's own state)."""
    spec = round_costs_lib.RoundCostSpec(gammas=tuple(s.gammas), max_decode_len=s.max_decode_len,
                                         round_steps=s.round_steps, repeats=s.repeats,
                                         seed=s.seed)
    drafter_of = {name: functools.partial(drafters.as_drafter, draft)
                  for name, draft in drafts.items()}
    return round_costs_lib.round_costs(target, drafter_of, inputs, spec)


def _decode_rows(target, drafts, batches, sampling, s: BlockBenchSettings):
    """Interleaved timing of the baseline and every (draft, gamma) decode of `batches`."""
    programs = {}
    for name, draft in drafts.items():
        spec = costs_lib.decode_programs(
            target, [draft] * len(batches), batches, {g: (g, 0.0) for g in s.gammas},
            sampling=sampling, max_decode_len=s.max_decode_len, seed=s.seed)
        programs.setdefault("baseline", spec.pop("baseline"))
        programs.update({(name, g): fn for g, fn in spec.items()})
    _, times, outputs = costs_lib.interleaved(programs, s.repeats)
    base = float(np.median(times["baseline"]))
    rows = []
    for (name, g), outs in ((k, v) for k, v in outputs.items() if k != "baseline"):
        merged = stats_lib.merge_stats([o.stats for o in outs]).summary()
        speedup = base / float(np.median(times[(name, g)]))
        rows.append({"draft": name, "gamma": g, "speedup": speedup,
                     "alpha": merged["alpha"],
                     "tokens_per_target_call": merged["tokens_per_target_call"],
                     "draft_calls_per_round": merged["draft_calls_per_round"],
                     "accepted_per_position_rate": merged["accepted_per_position_rate"]})
    return base, rows


def _batches(s: BlockBenchSettings, temperature: float) -> List[np.ndarray]:
    sources = [src for src, _ in mini.test_pairs(s.num_sentences)]
    copies = 1 if temperature == 0.0 else s.samples_at_t1
    x = mini.Vocabulary().encode_sources(sources, 32)
    return [x[i:i + 1] for i in range(len(sources)) for _ in range(copies)]


def run(s: BlockBenchSettings = BlockBenchSettings(), overwrite: bool = False) -> Dict[str, Any]:
    """Measures every draft and gamma (module docstring); returns the report it writes."""
    check(s)
    files.check_report(s.output_dir, "block_drafts", overwrite)
    load = host.LoadAverage()
    target = mini.load(s.target)
    drafts = {name: mini.load(name) for name in s.drafts}
    costs = round_costs(target, drafts, _batches(s, 0.0)[0], s)
    result = {"settings": dataclasses.asdict(s), "costs": costs, "temperatures": []}
    for t in s.temperatures:
        sampling = SamplingConfig(temperature=t)
        base_s, rows = _decode_rows(target, drafts, _batches(s, t), sampling, s)
        for name, draft in drafts.items():
            rates = acceptance.rank_acceptance(
                target, draft, _batches(s, 0.0), sampling, max_rank=1,
                max_decode_len=s.max_decode_len, max_depth=max(s.gammas), seed=s.seed)
            depth = [float(r[0]) for r in np.asarray(rates.depth_rates)]
            for row in (r for r in rows if r["draft"] == name):
                g = row["gamma"]
                row["depth_rates"] = depth[:g]
                row["c_round"] = round_costs_lib.expected_c_round(
                    costs["c_round_by_width"][name][g], row["accepted_per_position_rate"])
                row["c_round_widest"] = costs["c_round"][name][g]
                row["verify_cost"] = costs["verify_cost"][g]
                row["theorem_3_8_round_cost"] = theory.speedup(
                    row["alpha"], g, row["c_round"] / g, costs["verify_cost"][g])
        result["temperatures"].append({"temperature": t, "baseline_s": base_s, "rows": rows})
    record.publish("block_drafts", s.target, s.output_dir, "block_drafts", result, markdown,
                   load=load, bandwidth=True)
    return result


def cost_split(result: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """Where each draft's round time goes: c_round after a round that accepted nothing (a
    catch-up of one token), fitted over gamma by least squares as `fixed + per_draft * (gamma -
    1)`: what every round pays whatever its gamma (the catch-up, the sampling, the state's
    upkeep), and what each further draft adds (one more call of a chain, one more placeholder
    row of a block). Needs two gammas or more."""
    out = {}
    for name, by_gamma in result["costs"]["c_round_by_width"].items():
        at_one = {int(g): float({int(w): c for w, c in by_width.items()}[1])
                  for g, by_width in by_gamma.items()}  # JSON keys are strings
        gammas = sorted(at_one)
        if len(gammas) < 2:
            continue
        cost = [at_one[g] for g in gammas]
        slope, fixed = np.polyfit(np.asarray(gammas, np.float64) - 1.0, cost, 1)
        out[name] = {"fixed": float(fixed), "per_draft": float(slope)}
    return out


def markdown(result: Dict[str, Any]) -> str:
    """The report's tables: each draft's best, where the draft's time goes, every row."""
    header = ["T", "draft", "γ", "speedup", "α", "tokens / target call", "draft calls / round",
              "c_round", "verify cost", "Thm 3.8 (c_round)", "per-depth acceptance"]
    body = [[b["temperature"], r["draft"], r["gamma"], f"{r['speedup']:.2f}x",
             f"{r['alpha']:.3f}", f"{r['tokens_per_target_call']:.2f}",
             f"{r['draft_calls_per_round']:.2f}", f"{r['c_round']:.3f}",
             f"{r['verify_cost']:.2f}", f"{r['theorem_3_8_round_cost']:.2f}x",
             " ".join(f"{x:.2f}" for x in r["depth_rates"])]
            for b in result["temperatures"] for r in b["rows"]]
    best = [[r["temperature"], r["draft"], r["gamma"], f"{r['speedup']:.2f}x",
             f"{r['tokens_per_target_call']:.2f}", f"{r['c_round']:.3f}"]
            for r in record.best_rows(result)]
    prov = result["provenance"]
    return "\n".join([
        "# Block drafts against chains", "",
        f"`{prov['command']}` at {prov['commit']}, {prov['date']}; target step "
        f"{result['costs']['target_step_s'] * 1e3:.2f} ms. c_round: the draft's cost per round "
        "in target steps (one `propose`, averaged over the decode's accepted counts, which set "
        "the catch-up chunk's width); per-depth acceptance: the d-th draft's rate along "
        "the target's text; Thm 3.8 (c_round): E[tokens] / (c_round + verify cost).", "",
        "## Each draft at its fastest γ", "",
        files.markdown_table(["T", "draft", "γ", "speedup", "tokens / target call",
                              "c_round"], best), "",
        "## Where the draft's time goes", "",
        "c_round after a round that accepted nothing (a one-token catch-up), fitted over γ as "
        "fixed + per draft × (γ - 1): the fixed part every round pays, and what each further "
        "draft adds (a chain's call, a block's placeholder row).", "",
        files.markdown_table(["draft", "fixed (target steps)", "per further draft"],
                             [[name, f"{v['fixed']:.3f}", f"{v['per_draft']:.4f}"]
                              for name, v in cost_split(result).items()]), "",
        "## Every row", "", files.markdown_table(header, body), ""])


def check(s: BlockBenchSettings) -> None:
    """Refuses bad settings before any model loads."""
    bad = [g for g in s.gammas if isinstance(g, bool) or not isinstance(g, int) or g < 1]
    if bad or not s.gammas:
        raise ValueError(f"gammas={s.gammas!r}: give ints >= 1.")
    unknown = [d for d in s.drafts if d not in mini.drafts(s.target)]
    if unknown:
        raise ValueError(f"drafts {unknown} are not bundled drafts of {s.target!r}: choose from "
                         f"{sorted(mini.drafts(s.target))}.")

