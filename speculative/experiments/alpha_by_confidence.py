"""Where a draft loses alpha: Table 3's alpha split by how sure the target is.

Along the same 5,000 positions of the target's own test-split text as Table 3
(`acceptance.bundle_alpha`), each position's beta is binned by the target's top probability
there (temperature 1; `acceptance.alpha_by_confidence`). A draft that agrees with the target
wherever the target is sure can only gain where it hesitates, and the bins say how much of the
text that is:

    python scripts/alpha_by_confidence.py --target=large_target \
        --drafts=large_draft_kdtv,large_feature_draft

writes `alpha_by_confidence.json` and `.md` into `results/large/target_aware/alpha_by_confidence/`
(by default `<the target's results dir>/target_aware/alpha_by_confidence`).
Nothing is timed: the numbers do not depend on the machine or its load.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

from speculative import files
from speculative.data import bundles
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import acceptance, host

TEMPERATURES = (0.0, 1.0)


def run(drafts: Sequence[str], target_name: str = bundles.LARGE_TARGET,
        output_dir: Optional[str] = None, num_alpha_tokens: int = 5000,
        edges: Sequence[float] = acceptance.CONFIDENCE_EDGES, seed: int = 0,
        overwrite: bool = False) -> Dict:
    """Bins every draft's Table 3 alpha at T = 0 and 1; writes the report (see the module
    docstring) into `output_dir` (default `<the target's results dir>/target_aware/
    alpha_by_confidence`)."""
    validation.positive_int(num_alpha_tokens, "num_alpha_tokens", "positions per alpha")
    inputs = bundles.bundle(target_name)  # (a ValueError naming the bundled targets)
    if not drafts:
        raise ValueError("drafts is empty: name one or more bundled drafts, e.g. "
                         f"{inputs.best_draft(target_name)}.")
    known = inputs.drafts(target_name)
    unknown = [d for d in drafts if d not in known]
    if unknown:
        raise ValueError(f"drafts {unknown} are not bundled drafts of {target_name}; "
                         f"use some of {known}.")
    output_dir = output_dir or os.path.join(bundles.RESULT_DIRS[target_name], "target_aware",
                                            "alpha_by_confidence")
    files.check_report(output_dir, "alpha_by_confidence", overwrite)
    os.makedirs(output_dir, exist_ok=True)
    target = inputs.load(target_name)
    rows = []
    for name in drafts:
        draft = inputs.load(name)
        for temperature in TEMPERATURES:
            result = acceptance.alpha_by_confidence(
                target, draft, inputs.batches(None, 64), sampling=SamplingConfig(temperature),
                num_tokens=num_alpha_tokens, max_decode_len=inputs.max_decode_len, seed=seed,
                edges=edges)
            rows.append({"draft": name, "temperature": temperature, **result})
            print(_line(rows[-1]), flush=True)
    report = {"target": target_name, "alpha_tokens": num_alpha_tokens, "seed": seed,
              "edges": [float(e) for e in edges], "rows": rows,
              "environment": host.environment()}
    record.publish("alpha_by_confidence", target_name, output_dir, "alpha_by_confidence", report,
                   markdown)
    return report


def _cell(b: Dict) -> str:
    alpha = "-" if b["alpha"] is None else f"{b['alpha']:.3f}"
    return f"{alpha} ({b['share']:.0%})"


def _line(row: Dict) -> str:
    return f"| {row['draft']} | {row['temperature']:g} | {row['alpha']:.3f} | " + " | ".join(
        _cell(b) for b in row["bins"]) + " |"


def markdown(report: Dict) -> str:
    edges = report["edges"]
    heads = [f"[{lo:g}, {hi:g}{']' if hi == 1.0 else ')'}" for lo, hi in zip(edges, edges[1:])]
    lines = [
        f"# Alpha by the target's confidence ({report['target']})", "",
        "`python scripts/alpha_by_confidence.py` (speculative/experiments/alpha_by_confidence.py)."
        f" Table 3's method: {report['alpha_tokens']:,} positions of the target's own test-split "
        "text at each temperature; each position's acceptance (T = 0: the draft's argmax is the "
        "target's; T = 1: Σ min(p, q)) is binned by the target's top probability there at "
        "temperature 1. Each cell: the bin's alpha (its share of the positions).", "",
        "| draft | T | alpha | " + " | ".join(f"top p in {h}" for h in heads) + " |",
        "|---|---|---|" + "---|" * len(heads),
    ]
    lines += [_line(row) for row in report["rows"]]
    lines += ["", "The target's mean top probability in each bin (at T = 0, how often a draft "
              "that sampled from the target's own distribution would hit its argmax):", "",
              "| text of | T | all | " + " | ".join(heads) + " |",
              "|---|---|---|" + "---|" * len(heads)]
    seen = set()
    for row in report["rows"]:  # the text depends on the temperature only
        if row["temperature"] in seen:
            continue
        seen.add(row["temperature"])
        lines.append(f"| {report['target']} | {row['temperature']:g} | {row['mean_top']:.3f} | "
                     + " | ".join("-" if b["mean_top"] is None else f"{b['mean_top']:.3f}"
                                  for b in row["bins"]) + " |")
    return "\n".join(lines) + "\n"
