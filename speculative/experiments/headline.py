"""The numbers the README, results/README.md and docs/limits.md show, made from the canonical
results and their index (`results/runs.jsonl`), so that no headline number is typed by hand.

    python scripts/headline.py            # prints the three tables
    python scripts/headline.py --write    # rewrites them in place, between their markers
    python scripts/headline.py --check    # exit 1 if a document differs from the results

Each table sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` in its document:

  headline  README.md: the demo's canonical runs (`HEADLINE_RUNS`), one row per draft and
            temperature, with the run id linking the JSON
  current   results/README.md: the current number of each experiment, its run id and command
  hosts     docs/limits.md: the same experiments on different hosts, one row per run

A run's record in the index (`files.append_run`) holds its run id, command, commit, date, host
and headline numbers; the latest record of a path is that path's run.
"""

import json
import os
from typing import Callable, Dict, List, Optional, Tuple

from speculative import files
from speculative.experiments import record

INDEX = os.path.join("results", "runs.jsonl")
HEADLINE_RUNS = ("results/demo/large_feature_draft.json", "results/demo/large_draft_kdtv.json")
# (path, what the row shows) of results/README.md's current numbers, in order.
CURRENT_RUNS = (
    ("results/demo/large_feature_draft.json", "demo, large_feature_draft (the default)"),
    ("results/demo/large_draft_kdtv.json", "demo, large_draft_kdtv (a separate T5 draft)"),
    ("results/large/results.json", "Table 2, memory-bound large pair, best draft"),
    ("results/mini/results.json", "Table 2, compute-bound mini pair, best draft"),
    ("results/code/results.json", "Table 2, decoder-only code pair, best draft"),
    ("results/large/target_aware/feature_ablation_48/ablation.json",
     "target-aware draft vs separate draft, 48 sentences"),
    ("results/large/trees/trees.json", "token trees, large pair"),
    ("results/large/beam/beam.json", "speculative beam search over the jitted one, w = 1 / 2 / 4"),
    ("results/limits/limits.json", "batch size where speculative stops paying (T = 0)"),
    ("results/large/target_aware/block_drafts/block_drafts.json",
     "block draft vs chains, each at its best γ (c_round: draft cost per round)"),
    ("results/limits/gamma_auto/gamma_auto.json",
     "GAMMA = 'auto' vs no speculation, whole infer.py runs (T = 0)"),
)
# (path, host) of docs/limits.md's host table: one experiment on different hosts.
HOST_RUNS = (
    ("results/demo/large_feature_draft.json", "AMD EPYC, 32 MB L3, 24 GB/s"),
    ("results/demo/large_feature_draft_slow_memory.json", "AMD EPYC, 32 MB L3, 9-11 GB/s"),
    ("results/demo/large_draft_kdtv.json", "AMD EPYC, 32 MB L3, 24 GB/s"),
    ("results/demo/large_draft_kdtv_260mb_l3.json", "Intel Xeon, 260 MB L3 (T5X layout)"),
    ("results/large/results.json", "AMD EPYC, 32 MB L3 (T5X layout)"),
    ("results/limits/kernel_layout/large_tables_slow_memory/results.json",
     "AMD EPYC, 32 MB L3, 9-11 GB/s"),
    ("results/limits/kernel_layout/large_tables_fast_memory/results.json",
     "AMD EPYC, 32 MB L3, 24 GB/s"),
    ("results/limits/kernel_layout/large_slow_memory/kernel_layout.json",
     "AMD EPYC, 32 MB L3, 9-11 GB/s"),
    ("results/limits/kernel_layout/large_fast_memory/kernel_layout.json",
     "AMD EPYC, 32 MB L3, 24 GB/s"),
)
DOCUMENTS = {"headline": "README.md", "current": os.path.join("results", "README.md"),
             "hosts": os.path.join("docs", "limits.md")}


def load_runs(repo: str) -> Dict[str, Dict]:
    """{path: record} of the index's runs, the latest record of each path."""
    runs = {}
    with open(os.path.join(repo, INDEX), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                runs[record["path"]] = record
    return runs


def _load(repo: str, path: str) -> Dict:
    with open(os.path.join(repo, path), encoding="utf-8") as f:
        return json.load(f)


def _x(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def headline_table(repo: str) -> str:
    """README.md's table: every row of the `HEADLINE_RUNS` demo files."""
    runs = load_runs(repo)
    rows = []
    for path in HEADLINE_RUNS:
        report = _load(repo, path)
        for row in report["rows"]:
            rows.append([report["draft"], f"{row['temperature']:g}", _x(row["speedup"]),
                         _x(row.get("speedup_over_fastest_baseline")), row["gamma"],
                         f"{row['alpha']:.2f}", f"{row['tokens_per_target_call']:.2f}",
                         _x(row["predicted_speedup"]), _x(row.get("predicted_speedup_loop")),
                         f"[{runs[path]['run_id']}]({path})"])
    return files.markdown_table(
        ["draft", "T", "speedup", "over the faster baseline", "γ", "α", "tokens / target call",
         "Theorem 3.8", "decode-loop model", "run"], rows)


def _best(results: Dict, t: float) -> Dict:
    return max((r for r in results["table2"] if r["temperature"] == t),
               key=lambda r: r["speedup"])


def _layout_cells(report: Dict, template: str) -> Dict[float, str]:
    """kernel_layout.json's cell per temperature at its deepest gamma: `template` with `g`,
    `t5x` and `transposed` (the two layouts' speedups)."""
    cells = {}
    for r in report["rows"]:
        g = max(r["gammas"], key=int)
        cells[r["temperature"]] = template.format(
            g=g, t5x=_x(r["gammas"][g]["t5x"]["speedup"]),
            transposed=_x(r["gammas"][g]["transposed"]["speedup"]))
    return cells


def _summary(report: Dict, path: str) -> Tuple[str, str]:
    """(T = 0 cell, T = 1 cell) of one results file, whatever its experiment."""
    name = os.path.basename(path)
    if "rows" in report and "draft" in report and "identical_to_baseline" in report:  # demo
        cells = {r["temperature"]: f"{_x(r['speedup'])} (γ {r['gamma']}, α {r['alpha']:.2f}, "
                 f"{r['tokens_per_target_call']:.2f} tokens/call)" for r in report["rows"]}
        return cells.get(0.0, "-"), cells.get(1.0, "-")
    if name == "results.json":  # Tables 2-4
        return tuple(f"{_x(b['speedup'])} ({b['draft']}, γ {b['gamma']}, α {b['alpha']:.2f})"
                     for b in (_best(report, 0.0), _best(report, 1.0)))
    if name == "ablation.json":
        return tuple(", ".join(f"{r['draft']} {_x(r[t]['speedup'])}" for r in report["rows"])
                     for t in ("t0", "t1"))
    if name == "kernel_layout.json":
        cells = _layout_cells(report, "γ {g}: T5X layout {t5x}, [out, in] {transposed}")
        return cells.get(0.0, "-"), cells.get(1.0, "-")
    if name == "trees.json":
        cells = {r["temperature"]: f"chain {_x(r['chain']['speedup'])}, widest tree "
                 f"{_x(r['most_tokens']['speedup'])} ({r['tree_over_chain_tokens']:.2f}x the "
                 "chain's tokens/call)" for r in report["rows"]}
        return cells.get(0.0, "-"), cells.get(1.0, "-")
    if name == "beam.json":
        speeds = " / ".join(_x(r["proposal"]["speedup"]) for r in report["rows"])
        return speeds, "-"
    if name == "limits.json":
        return tuple("; ".join(f"{c['target']} from batch {c['batch_size']}"
                               for c in report["crossover"] if c["temperature"] == t) or "-"
                     for t in (0.0, 1.0))
    if name == "block_drafts.json":
        best = record.best_rows(report)
        return tuple(", ".join(f"{r['draft']} {_x(r['speedup'])} (γ {r['gamma']}, c_round "
                               f"{r['c_round']:.2f})" for r in best if r["temperature"] == t)
                     or "-" for t in (0.0, 1.0))
    if name == "gamma_auto.json":  # walltime auto / baseline per batch x sentences
        return "walltime auto / baseline: " + "; ".join(
            f"{r['batch_size']} × {r.get('examples', '?')}"
            f"{' ' + r['caches'] if 'caches' in r else ''} {r['auto_over_baseline']:.2f} "
            f"({', '.join(map(str, r['choices']))})" for r in report["rows"]), "-"
    raise ValueError(f"no summary for {path}")


def current_table(repo: str) -> str:
    """results/README.md's table: `CURRENT_RUNS`, each with its run id and command."""
    runs = load_runs(repo)
    rows = []
    for path, what in CURRENT_RUNS:
        t0, t1 = _summary(_load(repo, path), path)
        link = os.path.relpath(path, "results")
        rows.append([what, t0, t1, f"[{runs[path]['run_id']}]({link})",
                     f"`{runs[path]['command']}`"])
    return files.markdown_table(["result", "T = 0", "T = 1", "run", "command"], rows)


def _host_cells(report: Dict, path: str) -> Tuple[str, str, str]:
    """(what ran, T = 0 cell, T = 1 cell) of one host table row: the speedups only."""
    name = os.path.basename(path)
    if name == "results.json":
        best = [_best(report, t) for t in (0.0, 1.0)]
        return (f"Tables 2-4, best: {best[0]['draft']}",
                *(f"{_x(b['speedup'])} (γ {b['gamma']})" for b in best))
    if name == "kernel_layout.json":
        cells = _layout_cells(report, "{t5x} → {transposed} (γ {g})")
        return (f"kernel layout, T5X → `[out, in]`, {report['draft']}", cells.get(0.0, "-"),
                cells.get(1.0, "-"))
    cells = {r["temperature"]: f"{_x(r['speedup'])} (γ {r['gamma']})" for r in report["rows"]}
    return f"demo, {report['draft']}", cells.get(0.0, "-"), cells.get(1.0, "-")


def hosts_table(repo: str) -> str:
    """docs/limits.md's table: `HOST_RUNS`, one row per run."""
    runs = load_runs(repo)
    rows = []
    for path, where in HOST_RUNS:
        what, t0, t1 = _host_cells(_load(repo, path), path)
        rows.append([where, what, t0, t1, f"[{runs[path]['run_id']}](../{path})"])
    return files.markdown_table(["host", "run", "T = 0", "T = 1", "run id"], rows)


TABLES: Dict[str, Callable[[str], str]] = {"headline": headline_table, "current": current_table,
                                           "hosts": hosts_table}


def replace_block(text: str, name: str, table: str) -> str:
    """`text` with what lies between `<!-- name:start -->` and `<!-- name:end -->` replaced by
    `table`; a ValueError when the markers are missing."""
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    if start not in text or end not in text.split(start, 1)[1]:
        raise ValueError(f"markers {start.strip()} ... {end} not found")
    head, rest = text.split(start, 1)
    return head + start + table + end + rest.split(end, 1)[1]


def stale(repo: str) -> List[str]:
    """The documents whose table differs from what the results give (empty: all agree)."""
    out = []
    for name, make in TABLES.items():
        path = os.path.join(repo, DOCUMENTS[name])
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if replace_block(text, name, make(repo)) != text:
            out.append(DOCUMENTS[name])
    return out


def write(repo: str) -> List[str]:
    """Rewrites every document's table from the results; returns the documents changed."""
    changed = stale(repo)
    for name, make in TABLES.items():
        path = os.path.join(repo, DOCUMENTS[name])
        if DOCUMENTS[name] in changed:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            files.write_atomic(path, replace_block(text, name, make(repo)))
    return changed
