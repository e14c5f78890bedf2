"""The dense kernels' layout on a CPU: T5X's `[in, out]` against `[out, in]`.

`layers.transpose_kernels` stores every dense kernel `[out, in]`, the layout `load_model` and
the bundles use on a CPU (`kernel_layout='auto'`). This measures what it changes, on one
bundled pair at batch 1:

1. **Costs** (`costs.measure_costs`, each layout's programs interleaved): the target's step,
   its verify cost at each gamma (relative to its own step) and the draft's c.
2. **Decoding** (`costs.decode_programs`, both layouts' programs in the same interleaved
   rounds): the autoregressive baseline and speculative decoding at each gamma, so that each
   layout's speedup is over its own baseline and the two baselines are compared directly
   (the new layout must not make the baseline slower, or its speedups would flatter it). At
   T > 0 each sentence is decoded `samples` times, as in the demo.
3. **Outputs**: at T = 0 every decode of both layouts must be the target's greedy output.

    python scripts/kernel_layout_benchmark.py --output_dir=results/limits/kernel_layout/large_target

writes `kernel_layout.json` and `.md` (by default into `results/limits/kernel_layout/<target>`:
the comparison depends on the host, and docs/limits.md's host table reads these runs). Run it
with nothing else busy on the machine.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Optional, Sequence

import numpy as np

from speculative import files
from speculative.data import bundles
from speculative.decode import stats as stats_lib
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import costs as costs_lib
from speculative.measure import host

LAYOUTS = ("t5x", "transposed")
DEFAULT_ROOT = os.path.join("results", "limits", "kernel_layout")  # one run per target


def run(output_dir: Optional[str] = None, target_name: str = bundles.LARGE_TARGET,
        draft_name: str = "", num_sentences: int = 8, gammas: Sequence[int] = (3, 5, 7),
        temperatures: Sequence[float] = (0.0, 1.0), samples: int = 4, repeats: int = 5,
        overwrite: bool = False, seed: int = 0) -> Dict:
    """Times both layouts (see the module docstring); writes the report into `output_dir`
    (default `results/limits/kernel_layout/<target>`)."""
    validation.positive_int(num_sentences, "num_sentences", "test sentences timed")
    validation.positive_int(samples, "samples", "decodes per sentence at T > 0")
    validation.positive_int(repeats, "repeats", "timed rounds")
    if not gammas:
        raise ValueError("gammas is empty: give one or more draft lengths, e.g. 3,5,7.")
    for g in gammas:
        validation.positive_int(g, "gammas", "drafts per round")
    for t in temperatures:
        SamplingConfig(float(t))  # a bad temperature is refused before any work
    inputs = bundles.bundle(target_name)  # (a ValueError naming the bundled targets)
    draft_name = draft_name or inputs.best_draft(target_name)
    output_dir = output_dir or os.path.join(DEFAULT_ROOT, target_name)
    files.check_report(output_dir, "kernel_layout", overwrite)
    models = {layout: (inputs.load(target_name, kernel_layout=layout),
                       inputs.load(draft_name, kernel_layout=layout)) for layout in LAYOUTS}
    batches = inputs.batches(num_sentences, 1)
    load = host.LoadAverage()
    start = time.time()
    costs = {layout: costs_lib.measure_costs(target, draft, batches[0], list(gammas),
                                             max_decode_len=inputs.max_decode_len,
                                             num_steps=16, repeats=7, seed=seed).to_json()
             for layout, (target, draft) in models.items()}
    rows = []
    for temperature in temperatures:
        sampling = SamplingConfig(float(temperature))
        timed = [x for x in batches for _ in range(samples if temperature > 0 else 1)]
        programs = {}
        for layout, (target, draft) in models.items():
            made = costs_lib.decode_programs(target, [draft] * len(timed), timed,
                                             {g: (g, 0.0) for g in gammas}, sampling=sampling,
                                             max_decode_len=inputs.max_decode_len, seed=seed)
            programs.update({(layout, name): fn for name, fn in made.items()})
        _, times, outputs = costs_lib.interleaved(programs, repeats,
                                                  progress=f"T={temperature:g}: timing")
        median = {key: float(np.median(t)) for key, t in times.items()}
        row = {"temperature": float(temperature), "decodes": len(timed),
               "baseline_s": {layout: median[(layout, "baseline")] for layout in LAYOUTS},
               "gammas": {}}
        row["baseline_ratio"] = row["baseline_s"]["transposed"] / row["baseline_s"]["t5x"]
        for g in gammas:
            cell = {}
            for layout in LAYOUTS:
                stats = stats_lib.merge_stats([o.stats for o in outputs[(layout, g)]]).summary()
                cell[layout] = {"seconds": median[(layout, g)],
                                "speedup": median[(layout, "baseline")] / median[(layout, g)],
                                "tokens_per_target_call": stats["tokens_per_target_call"]}
            cell["transposed_over_t5x_baseline"] = (median[("t5x", "baseline")]
                                                    / median[("transposed", g)])
            row["gammas"][g] = cell
        if temperature == 0:  # every decode of both layouts is the target's greedy output
            tokens = {key: np.concatenate([np.asarray(o.tokens) for o in out])
                      for key, out in outputs.items()}
            row["identical_to_greedy"] = all(np.array_equal(t, tokens[("t5x", "baseline")])
                                             for t in tokens.values())
        rows.append(row)
        print(_line(row), flush=True)
    report = {"target": target_name, "draft": draft_name, "sentences": num_sentences,
              "samples": samples, "repeats": repeats, "costs": costs, "rows": rows,
              "seconds": round(time.time() - start, 1),
              "load_average_1m": load.record(),
              "environment": host.environment()}
    record.publish("kernel_layout", f"{target_name}/{draft_name}", output_dir, "kernel_layout",
                   report, markdown, load=report["load_average_1m"])
    return report


def _line(row: Dict) -> str:
    cells = [f"{row['gammas'][g]['t5x']['speedup']:.2f}x / "
             f"{row['gammas'][g]['transposed']['speedup']:.2f}x" for g in row["gammas"]]
    return (f"| {row['temperature']:g} | {row['baseline_ratio']:.2f} | " + " | ".join(cells)
            + " |")


def markdown(report: Dict) -> str:
    gammas = list(report["rows"][0]["gammas"])
    lines = [
        f"# Dense kernel layout: T5X's [in, out] against [out, in] ({report['target']} + "
        f"{report['draft']})", "",
        "`python scripts/kernel_layout_benchmark.py` (speculative/experiments/kernel_layout.py),"
        f" batch 1, {report['sentences']} test sentences (x {report['samples']} samples at "
        f"T > 0), {report['repeats']} interleaved rounds; load average "
        f"{report['load_average_1m']['before']:.2f} before, "
        f"{report['load_average_1m']['after']:.2f} after.", "",
        "| layout | target step (ms) | c | " + " | ".join(
            f"verify cost γ {g}" for g in gammas) + " |",
        "|---|---|---|" + "---|" * len(gammas)]
    for layout, c in report["costs"].items():
        lines.append(f"| {layout} | {c['target_step_s'] * 1e3:.2f} | {c['c']:.3f} | "
                     + " | ".join(f"{c['verify_cost'][g]:.2f}" for g in gammas) + " |")
    lines += ["", "Speedup over each layout's own baseline (t5x / transposed), and the "
              "transposed baseline's time over T5X's:", "",
              "| T | baseline transposed / t5x | " + " | ".join(
                  f"γ {g}" for g in gammas) + " |",
              "|---|---|" + "---|" * len(gammas)]
    lines += [_line(row) for row in report["rows"]]
    tokens = [f"T = {row['temperature']:g}: " + ", ".join(
        f"γ {g} {row['gammas'][g]['t5x']['tokens_per_target_call']:.2f} / "
        f"{row['gammas'][g]['transposed']['tokens_per_target_call']:.2f}" for g in gammas)
        for row in report["rows"]]
    lines += ["", "Tokens per target call (t5x / transposed): " + "; ".join(tokens) + "."]
    same = [row["identical_to_greedy"] for row in report["rows"] if "identical_to_greedy" in row]
    if same:
        lines.append("At T = 0 every decode of both layouts equals the target's greedy output: "
                     + ("yes." if all(same) else "NO."))
    return "\n".join(lines) + "\n"
