"""How a report records where its numbers came from, and indexes its run.

    record.publish("trees", target_name, output_dir, "trees", result, markdown, load=load)

stamps the result with its provenance (`host.provenance`: commit, command, date, host, load),
writes `<output_dir>/trees.json` and `trees.md` atomically (`files.write_report`) and indexes
the run (`index_run`). `index_run` appends the run's line to `results/runs.jsonl`
(`files.append_run`) when the file it wrote lies under this repository's `results/`: the index
lists the committed runs, so a run written elsewhere (`--output_dir=/tmp/x`) is not added. The
line holds the run id (`<experiment>-<pair>-<UTC yyyymmdd-HHMMSS>`), the path relative to the
repository, the provenance and the headline numbers (`headline_numbers`).
"""

import os
import re
from typing import Any, Callable, Dict, List, Optional

from speculative import files

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INDEX = os.path.join(REPO, "results", "runs.jsonl")


def _r(x: Optional[float], n: int = 3) -> Optional[float]:
    return None if x is None else round(float(x), n)


def best_rows(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each draft's fastest row at each temperature of a block-draft report
    (experiments/block_drafts.py), its temperature added."""
    out = []
    for block in report["temperatures"]:
        for name in report["settings"]["drafts"]:
            rows = [r for r in block["rows"] if r["draft"] == name]
            out.append({"temperature": block["temperature"],
                        **max(rows, key=lambda r: r["speedup"])})
    return out


def headline_numbers(experiment: str, report: Dict[str, Any]) -> Dict[str, Any]:
    """The few numbers of `report` the index shows, by experiment (empty for an unknown one)."""
    rows = report.get("rows") or []
    if experiment == "tables":
        out = {}
        for t in (0.0, 1.0):
            table2 = [r for r in report["table2"] if r["temperature"] == t]
            if table2:
                best = max(table2, key=lambda r: r["speedup"])
                out[f"best_T{t:g}"] = {"draft": best["draft"], "gamma": best["gamma"],
                                       "alpha": _r(best["alpha"]), "speedup": _r(best["speedup"])}
        return out
    if experiment == "feature_ablation":
        return {"rows": [{"draft": r["draft"], "c": _r(r["c"]),
                          **{f"speedup_{k.upper()}": _r(r[k]["speedup"]) for k in ("t0", "t1")
                             if k in r},
                          **{f"tokens_per_target_call_{k.upper()}":
                             _r(r[k]["tokens_per_target_call"]) for k in ("t0", "t1") if k in r}}
                         for r in rows]}
    if experiment == "alpha_by_confidence":
        return {"rows": [{"draft": r["draft"], "T": r["temperature"], "alpha": _r(r["alpha"])}
                         for r in rows]}
    if experiment == "beam":
        return {"rows": [{"beam_size": r["beam_size"],
                          "speculative_over_jitted": _r((r.get("proposal") or {}).get("speedup"))}
                         for r in rows]}
    if experiment == "block_drafts":
        return {"best": [{"T": r["temperature"], "draft": r["draft"], "gamma": r["gamma"],
                          "speedup": _r(r["speedup"]), "c_round": _r(r["c_round"]),
                          "tokens_per_target_call": _r(r["tokens_per_target_call"])}
                         for r in best_rows(report)]}
    if experiment == "gamma_auto":
        return {"rows": [{"batch_size": r["batch_size"], "examples": r.get("examples"),
                          "auto_s": _r(r["auto_s"], 1),
                          "baseline_s": _r(r["baseline_s"], 1),
                          "auto_over_baseline": _r(r["auto_over_baseline"]),
                          "choices": r["choices"]} for r in rows]}
    if experiment == "block_costs":
        return {"alpha_assumed": report["alpha_assumed"],
                "rows": [{"gamma": r["gamma"], "verify_cost": _r(r["verify_cost"]),
                          **{f"c_round_{k}": _r(r[k]["c_round"]) for k in ("chain", "block")},
                          "block_over_chain": _r(r["block_over_chain"])}
                         for r in report["rows"]]}
    if experiment == "trees":
        return {"rows": [{"T": r["temperature"], "chain_speedup": _r(r["chain"]["speedup"]),
                          "widest_tree_speedup": _r(r["most_tokens"]["speedup"]),
                          "tree_over_chain_tokens": _r(r["tree_over_chain_tokens"])}
                         for r in rows]}
    if experiment == "kernel_layout":
        out = []
        for r in rows:
            g = max(r["gammas"], key=int)
            out.append({"T": r["temperature"], "gamma": int(g),
                        "speedup_t5x": _r(r["gammas"][g]["t5x"]["speedup"]),
                        "speedup_out_in": _r(r["gammas"][g]["transposed"]["speedup"])})
        return {"rows": out}
    if experiment == "limits":
        return {"crossover": report.get("crossover"),
                "bandwidth_gb_per_s": _r((report.get("bandwidth") or {}).get("gb_per_s"), 1)}
    if experiment == "depth_sweep":
        return {"rows": [{"decoder_layers": r["decoder_layers"], "c": _r(r["c"])} for r in rows]}
    if experiment == "peers":
        return {"pairs": [f"{p['target']}/{p['draft']}" for p in report.get("pairs", [])]}
    return {}


def run_id(experiment: str, pair: str, date: str) -> str:
    """`<experiment>-<pair>-<yyyymmdd-HHMMSS>` from an ISO-8601 UTC date."""
    digits = re.sub(r"\D", "", date)[:14]
    return f"{experiment}-{re.sub(r'[^A-Za-z0-9_.]+', '-', pair)}-{digits[:8]}-{digits[8:]}"


def index_run(experiment: str, pair: str, path: str, report: Dict[str, Any],
              index_path: str = INDEX) -> Optional[Dict[str, Any]]:
    """Appends the run that wrote `path` (whose `report` holds its `provenance`) to the index
    and returns the record, when `path` lies under the index's `results/` directory; else does
    nothing and returns None."""
    results_dir = os.path.dirname(os.path.abspath(index_path))
    path = os.path.abspath(path)
    if not path.startswith(results_dir + os.sep):
        return None
    provenance = report["provenance"]
    record = {"run_id": run_id(experiment, pair, provenance["date"]), "experiment": experiment,
              "pair": pair, "path": os.path.relpath(path, os.path.dirname(results_dir)),
              **{k: provenance[k] for k in ("commit", "command", "date", "host")},
              "headline": headline_numbers(experiment, report)}
    files.append_run(index_path, record)
    print(f"Run {record['run_id']} added to {index_path}")
    return record


def publish(experiment: str, pair: str, output_dir: str, stem: str, result: Dict[str, Any],
            markdown: Callable[[Dict[str, Any]], str], *, load: Any = None,
            bandwidth: bool = False) -> Optional[Dict[str, Any]]:
    """The end of every report: `result["provenance"]` (`host.provenance(load=load,
    bandwidth=bandwidth)`), `<output_dir>/<stem>.json` and `.md` written atomically, and the
    run added to the index (`index_run`; returns its record, or None outside `results/`).
    `host` (and with it jax) is imported here, not with the module: the readers of the index
    (`headline.py`) need neither."""
    from speculative.measure import host  # pylint: disable=g-import-not-at-top

    result["provenance"] = host.provenance(load=load, bandwidth=bandwidth)
    files.write_report(output_dir, stem, result, markdown(result))
    return index_run(experiment, pair, os.path.join(output_dir, f"{stem}.json"), result)
