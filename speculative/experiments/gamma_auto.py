"""GAMMA = 'auto' against no speculation, as a user runs them: whole `infer.py` runs, interleaved.

    python scripts/gamma_auto_check.py                       # ~15 minutes on 2 CPU cores

For each batch size, `scripts/infer.py` decodes the task's split with the default GAMMA ('auto':
the gate, then the timed choice, `measure/speculation.py`) and with `SPECULATIVE=False`, in
alternating order `repeats` times, each in its own process (imports, model loading and
compilation as a user pays them). Compared: each process's walltime (what a user waits: the
median per mode), beside its metrics.json's `timing.run_seconds` (decode + compile +
calibration) and what 'auto' chose, its gate's bound and calibration seconds. The runs' own
directories are temporary; the report keeps their numbers.

Caches, per batch size (`caches`): 'cold' gives every run empty caches (JAX's persistent
compilation cache and GAMMA 'auto''s calibration cache, `SPECULATIVE_JAX_CACHE` and
`SPECULATIVE_CALIBRATION_CACHE` pointed at fresh folders), as a first run on a fresh machine;
'warm' gives each mode one folder pair, primed by one untimed run of that mode first, as a
rerun of the same command. Both modes get the same treatment.

Writes `<output_dir>/gamma_auto.json` and `.md` (provenance included) and indexes the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from speculative import files
from speculative.experiments import record
from speculative.measure import host


@dataclasses.dataclass(frozen=True)
class GammaAutoSettings:
    """The runs `run` compares (defaults: the large pair on the mini EN->DE task)."""

    target: str = "large_target"
    draft: str = "large_draft_kdtv"
    task: str = "mini_ende"
    lengths: Tuple[int, int] = (48, 48)
    batch_sizes: Tuple[int, ...] = (1, 1, 1, 64)
    num_examples: Tuple[int, ...] = (256, 16, 16, 128)  # per batch size; 0 = the whole split
    caches: Tuple[str, ...] = ("cold", "cold", "warm", "cold")  # per batch size (docstring)
    repeats: int = 2
    output_dir: str = os.path.join(record.REPO, "results", "limits", "gamma_auto")


def infer_command(s: GammaAutoSettings, batch_size: int, num_examples: int, auto: bool,
                  out_dir: str) -> List[str]:
    """The `scripts/infer.py` command line of one run (the README's inference command with
    the batch size, and for the baseline `SPECULATIVE=False`)."""
    cmd = [sys.executable, os.path.join(record.REPO, "scripts", "infer.py"),
           f"--gin_file={os.path.join(record.REPO, 'configs', 'runs', 'infer.gin')}",
           f"--gin.TARGET_MODEL='{s.target}'", "--gin.TARGET_CHECKPOINT=None",
           f"--gin.DRAFT_MODEL='{s.draft}'" if auto else "--gin.DRAFT_MODEL=None",
           "--gin.DRAFT_CHECKPOINT=None", f"--gin.MIXTURE_OR_TASK_NAME='{s.task}'",
           f"--gin.TASK_FEATURE_LENGTHS={{'inputs': {s.lengths[0]}, "
           f"'targets': {s.lengths[1]}}}",
           f"--gin.BATCH_SIZE={batch_size}", f"--gin.INFER_OUTPUT_DIR='{out_dir}'"]
    if num_examples:
        cmd.append(f"--gin.NUM_EXAMPLES={num_examples}")
    if not auto:
        cmd.append("--gin.SPECULATIVE=False")
    return cmd


def shown(cmd: List[str]) -> str:
    """A command as a reader types it in the repository: `python`, paths relative to it."""
    args = [a.replace(record.REPO + os.sep, "") for a in cmd[1:]]
    return " ".join(["python"] + [f'"{a}"' if set(a) & set(" '{}") else a for a in args])


CACHES = ("cold", "warm")


def cache_env(folder: str) -> Dict[str, str]:
    """The environment of a run whose caches live in `folder` (created empty if new)."""
    jax_cache, calibration = os.path.join(folder, "jax"), os.path.join(folder, "calibration")
    for path in (jax_cache, calibration):
        os.makedirs(path, exist_ok=True)
    return dict(os.environ, SPECULATIVE_JAX_CACHE=jax_cache,
                SPECULATIVE_CALIBRATION_CACHE=calibration)


def run_dir(caches: str, auto: bool, batch_size: int, num_examples: int, name: str) -> str:
    """One run's output directory: beside its caches, named by mode, row and `name`."""
    return os.path.join(caches, f"{'auto' if auto else 'base'}_b{batch_size}_n{num_examples}_"
                                f"{name}")


def _one_run(s: GammaAutoSettings, batch_size: int, num_examples: int, auto: bool,
             name: str, caches: str) -> Dict[str, Any]:
    """One infer.py process; its caches in the folder `caches`, its output beside them
    (`caches` is one run's, or one mode's of a warm row: `name` tells its runs apart)."""
    out_dir = run_dir(caches, auto, batch_size, num_examples, name)
    cmd = infer_command(s, batch_size, num_examples, auto, out_dir)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env=cache_env(caches))
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out_dir, "metrics.json")) as f:
        metrics = json.load(f)
    choice = metrics.get("speculation_choice") or {}
    return {"mode": "auto" if auto else "baseline", "batch_size": batch_size,
            "wall_seconds": wall, "run_seconds": metrics["timing"]["run_seconds"],
            "calibration_seconds": metrics["timing"]["calibration_seconds"],
            "choice": choice.get("choice"), "gate": choice.get("gate"),
            "line": choice.get("line"), "examples": metrics["num_examples"],
            "from_cache": bool(choice.get("cache_file")),
            "compile_seconds": metrics["timing"].get("compile_seconds")}


def _row_runs(s: GammaAutoSettings, batch_size: int, num: int, cache: str,
              scratch: str) -> List[Dict[str, Any]]:
    """A row's timed runs, alternating modes; 'warm' primes each mode's caches first."""
    row = os.path.join(scratch, f"b{batch_size}_n{num}_{cache}")
    if cache == "warm":
        for auto in (True, False):
            _one_run(s, batch_size, num, auto, "prime", os.path.join(row, str(auto)))
    return [_one_run(s, batch_size, num, auto, str(i),
                     os.path.join(row, str(auto) if cache == "warm" else f"{auto}_{i}"))
            for i in range(s.repeats) for auto in (i % 2 == 0, i % 2 == 1)]


def run(s: GammaAutoSettings = GammaAutoSettings(), overwrite: bool = False) -> Dict[str, Any]:
    """Every batch size's interleaved runs (module docstring); returns the report it writes."""
    check(s)
    files.check_report(s.output_dir, "gamma_auto", overwrite)
    load = host.LoadAverage()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for batch_size, num, cache in zip(s.batch_sizes, s.num_examples, s.caches):
            runs = _row_runs(s, batch_size, num, cache, scratch)
            seconds = {mode: [r["wall_seconds"] for r in runs if r["mode"] == mode]
                       for mode in ("auto", "baseline")}
            rows.append({"batch_size": batch_size, "examples": runs[0]["examples"],
                         "caches": cache, "runs": runs,
                         "auto_s": float(np.median(seconds["auto"])),
                         "baseline_s": float(np.median(seconds["baseline"])),
                         "choices": sorted({r["choice"] for r in runs if r["mode"] == "auto"})})
            rows[-1]["auto_over_baseline"] = rows[-1]["auto_s"] / rows[-1]["baseline_s"]
    result = {"settings": dataclasses.asdict(s), "rows": rows,
              "commands": {"auto": shown(infer_command(s, 64, 0, True, "OUT")),
                           "baseline": shown(infer_command(s, 64, 0, False, "OUT"))}}
    record.publish("gamma_auto", s.target, s.output_dir, "gamma_auto", result, markdown,
                   load=load)
    return result


def markdown(result: Dict[str, Any]) -> str:
    """One line per batch size, then each run."""
    prov = result["provenance"]
    best = [[r["batch_size"], r["runs"][0]["examples"], r.get("caches", "-"),
             f"{r['auto_s']:.1f}", f"{r['baseline_s']:.1f}",
             f"{r['auto_over_baseline']:.3f}", ", ".join(str(c) for c in r["choices"])]
            for r in result["rows"]]
    each = [[r["batch_size"], x["examples"], x["mode"], f"{x['wall_seconds']:.1f}",
             f"{x['run_seconds']:.1f}",
             f"{x['calibration_seconds']:.1f}", x["choice"] or "", _gate_cell(x["gate"])]
            for r in result["rows"] for x in r["runs"]]
    return "\n".join([
        "# GAMMA = 'auto' against no speculation", "",
        f"`{prov['command']}` at {prov['commit']}, {prov['date']}. Whole `scripts/infer.py` "
        "runs, alternating, each its own process; wall: the process's walltime (what a user "
        "waits; the medians compared); run: decode + compile + calibration (metrics.json). "
        f"'auto' runs: `{result['commands']['auto']}`; baseline: "
        f"`{result['commands']['baseline']}` (batch size and examples per row).", "",
        files.markdown_table(["batch", "examples", "caches", "auto (wall s)",
                              "SPECULATIVE=False (wall s)",
                              "auto / baseline", "auto chose"], best), "",
        "## Every run", "",
        files.markdown_table(["batch", "examples", "mode", "wall s", "run s", "calibration s",
                              "choice", "gate"], each), ""])


def _gate_cell(gate: Optional[Dict[str, Any]]) -> str:
    """What the gate decided and why: open with its bound, or closed by the bound, by a run
    too short to repay a compile ('payback') or by the calibration budget ('budget')."""
    if not gate:
        return ""
    if gate.get("open"):
        return f"open (bound {gate['bound']:.2f})"
    if not gate.get("pays", True):
        return "closed: payback"
    if not gate.get("fits", True):
        return "closed: budget"
    return f"closed: bound {gate['bound']:.2f}"


def check(s: GammaAutoSettings) -> None:
    """Refuses bad settings before any run."""
    if len(s.batch_sizes) != len(s.num_examples) or not s.batch_sizes:
        raise ValueError(f"batch_sizes={s.batch_sizes!r} and num_examples={s.num_examples!r}: "
                         "give one number of examples (0 = the split) per batch size.")
    if len(s.caches) != len(s.batch_sizes) or not set(s.caches) <= set(CACHES):
        raise ValueError(f"caches={s.caches!r}: give one of {CACHES} per batch size "
                         f"({len(s.batch_sizes)}).")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in s.batch_sizes):
        raise ValueError(f"batch_sizes={s.batch_sizes!r}: give ints >= 1.")
    if isinstance(s.repeats, bool) or not isinstance(s.repeats, int) or s.repeats < 1:
        raise ValueError(f"repeats={s.repeats!r}: give an int >= 1.")
