"""Reproduces the paper's Table 2 (walltime speedups), one gin file per row.

A row is (task, target model + checkpoint, draft model + checkpoint, temperature, gamma): a gin file
that includes `configs/runs/infer.gin` and the model files and sets MIXTURE_OR_TASK_NAME,
TARGET_MODEL, DRAFT_MODEL, TEMPERATURE, GAMMA, ... plus a `table2.RowInfo` block with the labels
printed in the table and the paper's numbers for that row (None for rows of our own, e.g. the
offline mini models). The 12 paper rows are `configs/experiments/table2/*.gin`; their checkpoints
(the paper's fine-tuned T5 1.1 models) are unpublished, so TARGET_CHECKPOINT and DRAFT_CHECKPOINT
stay REQUIRED there and are supplied per row by `checkpoints` (see `checkpoint_bindings`).

For each row `reproduce`:

  1. parses the row's gin file (+ checkpoint bindings + `row_bindings`) and resolves the infer
     settings (`infer.infer(dry_run=True)`); the task's data is checked before any model loads;
  2. loads the target and draft once, runs `infer.run` speculatively and as the baseline (the
     target alone through the same pipeline), each timed without compilation, into
     `output_dir/<row>/{speculative,baseline}/` (infer's T5X-named output file, metrics.json,
     config.gin);
  3. takes alpha from the speculative run; Speed comes from the one timing engine the benchmark,
     the mini results and the demo use (`measure.measure`): baseline and
     speculative decoding of the row's first `speed_batches` batches, compiled first, then
     timed in `speed_repeats` interleaved rounds; Speed is the ratio of the medians (the two
     infer runs' tokens/s are kept beside it);
  4. gets c (Def. 3.7, draft step time / target step time): measured with single-token `extend`
     calls of each model on the row's first batch (median of `cost_repeats`; the target is also
     timed on gamma + 1 tokens to give the verify cost), or given (`c=0.02`), or the paper's
     Table 4 value (`c='paper'`); the output says which;
  5. predicts the speedup with Theorem 3.8, `theory.speedup(alpha, gamma, c)` (the paper's
     assumption: verifying gamma + 1 tokens costs one target step), and, when measured, with the
     measured verify cost as well;

then prints and writes `output_dir/table2.md` and `output_dir/table2.json` in the paper's format
(Task, M_q, Temp, gamma, alpha, Speed) with Theorem 3.8's prediction and the paper's numbers
beside each row.

A row with GAMMA = 'auto' (the bundled rows; the paper's rows keep the paper's γ) first times
the baseline and the chain (and a block draft's block) on its first inputs with
`speculation.choose_speculation`, as `infer` does but without the gate and the calibration
budget (every candidate is timed), binds GAMMA to the chosen γ (the fastest speculative one
when the baseline won: a row measures speculative decoding), and says so in the table's notes
and in table2.json (`speculation_choice`).

A row set of our own is a directory of files like the bundled rows
(`configs/experiments/table2_bundled/`, which run here with no checkpoints), e.g.
`large_kdtv_t0.gin`:

    include 'configs/experiments/table2_bundled/pairs/ende.gin'   # task, lengths, batch 1
    TARGET_MODEL = 'large_target'        # a bundled name: its config and checkpoint
    DRAFT_MODEL = 'large_draft_kdtv'
    TEMPERATURE = 0.0
    GAMMA = 'auto'                       # or a number, e.g. 5
    table2.RowInfo.draft = 'large_draft_kdtv'
    table2.RowInfo.target = 'large_target'

run with `reproduce(rows='all', rows_dir=that_directory, ...)` or pass row files as paths
(`scripts/reproduce_table2.py --gin_file=row.gin`). A row that leaves `table2.RowInfo.target`
unset is labelled by its target checkpoint.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import itertools
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import numpy as np

from speculative import files
from speculative.measure import acceptance, speculation
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.measure import timing as measure
from speculative.runs import config as config_lib

_UNSET = object()
DEFAULT_ROWS_DIR = os.path.join(config_lib.REPO_ROOT, "configs", "experiments", "table2")

# The paper's Table 2 in its order (row name = gin file stem).
PAPER_ROWS = (
    "ende_small_t0", "ende_base_t0", "ende_large_t0",
    "ende_small_t1", "ende_base_t1", "ende_large_t1",
    "cnndm_small_t0", "cnndm_base_t0", "cnndm_large_t0",
    "cnndm_small_t1", "cnndm_base_t1", "cnndm_large_t1",
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RowInfo:
    """A row's labels in the table and the paper's numbers for it (None when not a paper row).

    Attributes:
      task: the Task column (e.g. 'EnDe').
      draft: the M_q column (e.g. 'T5-small').
      target: M_p (Table 2's target is T5-XXL throughout).
      best: the paper's star (best draft for the setting).
      paper_alpha, paper_speed: Table 2.
      paper_c, paper_expected: Table 4 (c and Theorem 3.8's expected speedup).
    """

    task: str = "?"
    draft: str = "?"
    target: str = "?"
    best: bool = False
    paper_alpha: Optional[float] = None
    paper_speed: Optional[float] = None
    paper_c: Optional[float] = None
    paper_expected: Optional[float] = None


@dataclasses.dataclass
class RowResult:
    name: str
    gin_file: str
    info: RowInfo
    gamma: Any  # an int, or 'auto' until the row's choice resolves it
    temperature: float
    alpha: Optional[float] = None
    speed: Optional[float] = None  # interleaved medians (measure.measure)
    speed_spread: Dict[str, float] = dataclasses.field(default_factory=dict)
    c: Optional[float] = None
    c_source: Optional[str] = None
    verify_cost: Optional[float] = None
    predicted: Optional[float] = None  # Thm 3.8, verify cost 1
    predicted_measured_verify: Optional[float] = None
    tree_choice: Optional[acceptance.TreeChoice] = None  # best chain vs best tree
    tree_speed: Optional[float] = None  # the chosen tree's Speed, when it is not the chain
    tree_tokens_per_target_call: Optional[float] = None
    tokens_per_target_call: Optional[float] = None
    speculative_tokens_per_second: Optional[float] = None
    baseline_tokens_per_second: Optional[float] = None
    task_metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    costs: Optional[costs_lib.StepCosts] = None
    settings: Any = None  # infer.InferSettings
    speculation_choice: Optional[speculation.SpeculationChoice] = None  # GAMMA = 'auto'
    output_dirs: Dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        typed = ("settings", "info", "costs", "tree_choice", "speculation_choice")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in typed}
        out["info"] = dataclasses.asdict(self.info)
        out["settings"] = self.settings.to_json() if self.settings is not None else None
        out["costs"] = self.costs.to_json() if self.costs is not None else {}
        out["tree_choice"] = self.tree_choice.to_json() if self.tree_choice else None
        choice = self.speculation_choice
        out["speculation_choice"] = (dict(choice.to_json(), line=choice.line()) if choice
                                     else None)
        return out


# ----------------------------------------------------------------------------------------------
# Rows and their gin.


def row_file(name: str, rows_dir: str = DEFAULT_ROWS_DIR) -> str:
    """`<rows_dir>/<name>.gin`, or `name` itself when it is a path to a .gin file."""
    path = name if name.endswith(".gin") else os.path.join(rows_dir, f"{name}.gin")
    if not os.path.exists(path):
        available = list_rows(rows_dir) if os.path.isdir(rows_dir) else []
        raise FileNotFoundError(f"No row {name!r}: {path} does not exist. Rows in {rows_dir}: "
                                f"{available}")
    return path


def row_name(path: str) -> str:
    """A row's name: its gin file's stem (the name of its output directory)."""
    return os.path.splitext(os.path.basename(path))[0]


def list_rows(rows_dir: str = DEFAULT_ROWS_DIR) -> List[str]:
    """Row names in `rows_dir`: the paper's order first, then the others sorted."""
    names = sorted(f[:-4] for f in os.listdir(rows_dir) if f.endswith(".gin"))
    return [n for n in PAPER_ROWS if n in names] + [n for n in names if n not in PAPER_ROWS]


def _load_checkpoints(checkpoints) -> Dict[str, Dict[str, Optional[str]]]:
    if checkpoints is None:
        return {}
    if isinstance(checkpoints, str):
        with open(checkpoints, encoding="utf-8") as f:
            checkpoints = json.load(f)
    if not isinstance(checkpoints, Mapping):
        raise ValueError(f"checkpoints={checkpoints!r}: give a JSON file or a mapping "
                         "{row pattern: {'target': path, 'draft': path}}.")
    for pattern, entry in checkpoints.items():
        if not isinstance(entry, Mapping) or not set(entry) <= {"target", "draft"}:
            raise ValueError(f"checkpoints[{pattern!r}]={entry!r}: each entry is "
                             "{'target': path, 'draft': path} (either key may be left out).")
    return dict(checkpoints)


def checkpoint_bindings(name: str, checkpoints) -> List[str]:
    """Gin bindings of TARGET_CHECKPOINT / DRAFT_CHECKPOINT for row `name`.

    `checkpoints` maps fnmatch patterns of row names to {'target': path, 'draft': path}; every
    matching pattern applies in order (later ones override), so the 12 paper rows need e.g.

        {"ende_*":        {"target": "/ckpt/ende/t5_1_1_xxl/checkpoint_1010000"},
         "ende_small_*":  {"draft": "/ckpt/ende/t5_1_1_small/checkpoint_1010000"},
         "ende_base_*":   {"draft": "..."}, "ende_large_*": {"draft": "..."},
         "cnndm_*":       {"target": "..."}, "cnndm_small_*": {"draft": "..."}, ...}
    """
    merged: Dict[str, Optional[str]] = {}
    for pattern, entry in _load_checkpoints(checkpoints).items():
        if fnmatch.fnmatchcase(name, pattern):
            merged.update(entry)
    macros = {"target": "TARGET_CHECKPOINT", "draft": "DRAFT_CHECKPOINT"}
    return [f"{macros[k]} = {v!r}" for k, v in merged.items()]


DRY_RUN_CHECKPOINT = "<no checkpoint: dry run>"


def resolve_row(name: str, *, rows_dir: str = DEFAULT_ROWS_DIR, checkpoints=None,
                row_bindings: Sequence[str] = (), output_dir: Any = _UNSET,
                dry_run: bool = False):
    """Parses row `name` (replacing the current gin config) -> `(RowInfo, InferSettings, path)`.

    Nothing is read or built: the run function is called with `dry_run=True`. `output_dir`, when
    given (None included), binds INFER_OUTPUT_DIR. With `dry_run`, checkpoints that
    `checkpoints` does not give are bound to a placeholder (nothing is loaded), so the paper's
    rows resolve without a checkpoints file.
    """
    from speculative.runs import infer  # pylint: disable=g-import-not-at-top

    path = row_file(name, rows_dir)
    stem = row_name(path)
    bindings = checkpoint_bindings(stem, checkpoints) + list(row_bindings)
    if output_dir is not _UNSET:
        bindings.append(f"INFER_OUTPUT_DIR = {output_dir!r}")
    gin.clear_config()
    config_lib.parse_gin([path], bindings)
    missing = [m for m in ("TARGET_CHECKPOINT", "DRAFT_CHECKPOINT") if _required(m)]
    if missing and not dry_run:
        raise ValueError(
            f"row {stem}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "%gin.REQUIRED (the paper's fine-tuned checkpoints are unpublished): give yours "
            "with --checkpoints=FILE, a JSON file {row pattern: {\"target\": path, \"draft\": "
            "path}} (scripts/reproduce_table2.py --help), or run a bundled row "
            "(configs/experiments/table2_bundled/); --dry_run needs none.")
    if dry_run:  # a checkpoint the row still needs gets a placeholder (bundled rows need none)
        gin.parse_config([f"{macro} = {DRY_RUN_CHECKPOINT!r}" for macro in
                          ("TARGET_CHECKPOINT", "DRAFT_CHECKPOINT") if _required(macro)])
    info, settings = RowInfo(), infer.infer(dry_run=True)
    if info.target == "?":  # unlabelled: name the target by its checkpoint
        checkpoint = settings.target_checkpoint
        label = (os.path.basename(os.path.normpath(checkpoint)) if checkpoint
                 and checkpoint != DRY_RUN_CHECKPOINT else "random weights")
        config = settings.target_config
        shape = (f"{config.emb_dim}d, {config.num_decoder_layers} decoder layers" if config
                 else "architecture from its config.gin")  # TARGET_MODEL = None
        info = dataclasses.replace(info, target=f"{label} ({shape})")
    return info, settings, path


def _required(macro: str) -> bool:
    """Whether gin macro `macro` is still %gin.REQUIRED (through an alias such as
    TARGET_CHECKPOINT = %CHECKPOINT_PATH)."""
    return config_lib.is_required(macro)


# ----------------------------------------------------------------------------------------------
# The table.


def _fmt(x, spec=".2f", suffix="") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:{spec}}{suffix}"


def _temp(t: float) -> str:
    return f"{t:g}"


def markdown(results: Sequence[RowResult], c_note: str) -> str:
    """The table in the paper's format, Theorem 3.8 and the paper's values beside each row."""
    lines = [
        "| Task | M_q | Temp | γ | α | Speed | tokens/call | Thm 3.8 (c) | "
        "Thm 3.8, measured verify | quality: speculative, baseline | paper α | paper Speed | "
        "paper Thm 3.8 (c) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        info = r.info
        pred = _fmt(r.predicted, ".2f", "X") + (f" ({r.c:.3f})" if r.c is not None else "")
        paper_pred = _fmt(info.paper_expected, ".1f", "X") + (
            f" ({info.paper_c:g})" if info.paper_c is not None else "")
        lines.append(
            f"| {info.task} | {info.draft}{' ★' if info.best else ''} | {_temp(r.temperature)} | "
            f"{r.gamma} | {_fmt(r.alpha)} | {_fmt(r.speed, '.2f', 'X')} | "
            f"{_fmt(r.tokens_per_target_call, '.2f')} | {pred} | "
            f"{_fmt(r.predicted_measured_verify, '.2f', 'X')} | {quality(r.task_metrics)} | "
            f"{_fmt(info.paper_alpha, 'g')} | "
            f"{_fmt(info.paper_speed, '.1f', 'X')} | {paper_pred} |")
    notes = [
        "",
        f"Target M_p: {', '.join(sorted({r.info.target for r in results}))}. "
        "Speed = median walltime of the baseline (the target alone, same jitted loop) / median "
        "walltime of speculative decoding on the row's first batches, compiled first and timed "
        "in interleaved rounds in one process (`measure.measure`). α = mean β over "
        "drafted positions (Cor. 3.6).",
        f"c: {c_note}",
        *[f"Token trees, {r.name}: {r.tree_choice.line()} (Speed times the row's own γ chain, "
          "as the paper's" + (f"; the tree ran at {r.tree_speed:.2f}X, "
                              f"{r.tree_tokens_per_target_call:.2f} tokens per target call)."
                              if r.tree_speed is not None else ").")
          for r in results if r.tree_choice],
        *[f"γ auto, {r.name}: {_auto_note(r.speculation_choice)}"
          for r in results if r.speculation_choice],
        "tokens/call: tokens per target call (Speed's upper bound for a free draft). Quality: "
        "the task's BLEU or ROUGE-L of the speculative outputs, then the baseline's (equal at "
        "T = 0, where both are the target's greedy output; two samples of one law at T = 1).",
        "Thm 3.8: (1 - α^(γ+1)) / ((1 - α)(γc + 1)) with the measured α; 'measured verify' "
        "replaces the 1 (the cost of scoring γ+1 tokens in one target call, assumed equal to one "
        "step) by the measured ratio. Paper columns: Table 2 (α, Speed) and Table 4 (Exp, c).",
        *(["★: the best draft for that task and temperature (the paper's Table 2 star; for a "
           "bundled row, its gin file's table2.RowInfo.best)."]
          if any(r.info.best for r in results) else []),
    ]
    return "\n".join(lines + notes) + "\n"


QUALITY_METRICS = (("bleu", "BLEU"), ("rougeL", "ROUGE-L"))  # the first a task reports


def quality(task_metrics: Dict[str, Any]) -> str:
    """'BLEU 21.3 = 21.3' (speculative, then the baseline; '=' where they agree, as they must
    at T = 0, ',' where sampling made them differ), or '-' for a task without BLEU or ROUGE."""
    spec, base = task_metrics.get("speculative") or {}, task_metrics.get("baseline") or {}
    for key, label in QUALITY_METRICS:
        if key in spec and key in base:
            a, b = f"{spec[key]:.1f}", f"{base[key]:.1f}"
            return f"{label} {a} {'=' if a == b else ','} {b}"
    return "-"


def _auto_note(choice: speculation.SpeculationChoice) -> str:
    """What a GAMMA 'auto' row timed and chose, and the γ its columns report."""
    line = choice.line()
    if choice.best.speculative:
        return f"{line}; the row reports γ {choice.best.gamma}."
    fastest = row_gamma(choice)
    return (f"{line}; infer would run the baseline here, and the row reports the fastest "
            f"speculative candidate, γ {fastest}.")


def row_gamma(choice: speculation.SpeculationChoice) -> int:
    """The γ a GAMMA 'auto' row decodes with: the chosen one, or when the baseline was fastest
    the fastest speculative candidate's (a Table 2 row measures speculative decoding)."""
    if choice.best.speculative:
        return int(choice.best.gamma)
    speculative = [c for c in choice.candidates if c.speculative]
    return int(max(speculative, key=lambda c: c.speedup).gamma)


def _c_note(c, measured: bool, repeats: int, dry_run: bool = False) -> str:
    if dry_run:
        return "dry run: rows resolved only, nothing decoded or measured."
    if measured:
        return (f"measured per row as draft step / target step time with single-token extend "
                f"calls on the row's first batch (median of {repeats}).")
    if c == "paper":
        return "given: the paper's Table 4 value for each row (not measured)."
    return f"given: {c} for every row (gin-bound, not measured)."


def _rebind(speculative: bool, row_out: Optional[str]):
    """Binds SPECULATIVE and that run's INFER_OUTPUT_DIR; returns the resolved settings."""
    from speculative.runs import infer  # pylint: disable=g-import-not-at-top

    subdir = "speculative" if speculative else "baseline"
    output_dir = os.path.join(row_out, subdir) if row_out else None
    gin.parse_config([f"SPECULATIVE = {speculative}", f"INFER_OUTPUT_DIR = {output_dir!r}"])
    return infer.infer(dry_run=True)


@gin.configurable
def reproduce(
    rows: Union[str, Sequence[str]] = "all",
    output_dir: Optional[str] = None,
    *,
    rows_dir: str = DEFAULT_ROWS_DIR,
    checkpoints: Union[None, str, Mapping[str, Mapping[str, Optional[str]]]] = None,
    row_bindings: Sequence[str] = (),
    c: Union[None, float, str] = None,
    cost_repeats: int = 20,
    speed_batches: int = 4,
    speed_repeats: int = 5,
    dry_run: bool = False,
    overwrite: bool = False,
    choose_trees: bool = True,
) -> List[RowResult]:
    """Runs `rows` (names in `rows_dir`, a comma-separated string, or 'all'); see module doc.

    Args:
      rows: row names in `rows_dir`, e.g. ['ende_small_t0', 'cnndm_small_t1'], paths of row gin
        files (e.g. 'configs/experiments/table2_bundled/large_kdtv_t0.gin'), or 'all'.
      output_dir: where table2.md, table2.json and the per-row runs go (None: print the table,
        write nothing).
      rows_dir: the directory of row gin files.
      checkpoints: {row pattern: {'target': path, 'draft': path}} or a JSON file of it
        (`checkpoint_bindings`).
      row_bindings: extra gin bindings for every row, e.g. ['NUM_EXAMPLES = 100'].
      c: None = measure it per row; a float = use it for every row; 'paper' = Table 4's c.
      cost_repeats: timed repetitions per step when measuring c.
      speed_batches, speed_repeats: the batches (the row's first) and interleaved rounds that
        time Speed.
      dry_run: only resolve every row's settings (no data, no models); Speed etc. stay None.
      overwrite: replace an earlier table (and its rows' runs) in `output_dir`; otherwise an
        existing table2.json there is refused before any work.
      choose_trees: also time verify widths up to `acceptance.TREE_MAX_NODES` (and the draft on
        several paths, where a tree could win), and record per row which token tree
        `acceptance.choose_tree` would pick against the best chain, and why (the row itself
        times its own gamma).

    Returns:
      one `RowResult` per row. The gin config is replaced by each row's in turn.
    """
    from speculative.runs import infer as infer_lib  # pylint: disable=g-import-not-at-top

    if overwrite:
        row_bindings = list(row_bindings) + ["OVERWRITE = True"]
    names, paths = _check_rows(rows, output_dir, rows_dir=rows_dir, c=c, dry_run=dry_run,
                               overwrite=overwrite)
    results = []
    for name, row in zip(names, paths):
        row_out = os.path.join(output_dir, name) if output_dir else None
        info, settings, path = resolve_row(
            row, rows_dir=rows_dir, checkpoints=checkpoints, row_bindings=row_bindings,
            output_dir=row_out, dry_run=dry_run)
        if settings.beam_size is not None:
            raise ValueError(
                f"row {name}: BEAM_SIZE={settings.beam_size}: reproduce_table2 times the paper's "
                "sampling decoders; for beam search run scripts/infer.py with --gin.BEAM_SIZE "
                "(its metrics.json reports the target calls saved).")
        result = RowResult(name=name, gin_file=path, info=info, gamma=settings.gamma,
                           temperature=settings.sampling.temperature, settings=settings)
        results.append(result)
        if dry_run:
            continue
        models, examples = _decode_row(result, row_out)
        batches = [b for b, _ in itertools.islice(
            infer_lib.batches(examples, settings.batch_size, settings.input_length),
            speed_batches)]
        _price_row(result, models, batches, cost_repeats=cost_repeats, choose_trees=choose_trees)
        _time_row(result, models, batches, speed_repeats)
        _predict_row(result, c)

    _write_table(results, output_dir, _c_note(c, c is None, cost_repeats, dry_run), dry_run)
    return results


def _write_table(results: List[RowResult], output_dir: Optional[str], c_note: str,
                 dry_run: bool) -> None:
    """Prints the table; with `output_dir`, writes table2.md and table2.json (the JSON last)."""
    table = markdown(results, c_note)
    print(table)
    if output_dir:  # the table and its JSON together, the JSON last
        from speculative.measure import host  # pylint: disable=g-import-not-at-top

        provenance = host.provenance()  # commit, command, date, host
        files.write_atomic_group({
            os.path.join(output_dir, "table2.md"): table + (
                f"\nCommand: `{provenance['command']}` (commit {provenance['commit']}, "
                f"{provenance['date']}, {provenance['host']['cpu_model']}).\n"),
            os.path.join(output_dir, "table2.json"): json.dumps(files.json_ready(
                {"c_source": c_note, "dry_run": dry_run, "rows": [r.to_json() for r in results],
                 "provenance": provenance}), indent=2)})


def _check_rows(rows, output_dir: Optional[str], *, rows_dir: str, c, dry_run: bool,
                overwrite: bool) -> Tuple[List[str], List[str]]:
    """Refuses an earlier table, no rows, a bad `c`, a misspelt row or two rows of one name
    before any work -> `(names, paths)` of the rows."""
    if output_dir and not dry_run and not overwrite and os.path.exists(
            os.path.join(output_dir, "table2.json")):
        raise FileExistsError(f"{output_dir} holds an earlier table2.json; choose another "
                              "--output_dir or pass --overwrite to replace that run.")
    if isinstance(rows, str):
        rows = [r.strip() for r in rows.split(",") if r.strip()]
    rows = list_rows(rows_dir) if list(rows) == ["all"] else list(rows)
    if not rows:
        raise ValueError("reproduce: no rows given; e.g. rows=['ende_small_t0'] or 'all'.")
    if c is not None and c != "paper" and (not isinstance(c, (int, float)) or c < 0):
        raise ValueError(f"c={c!r} is invalid: None (measure), a number >= 0, or 'paper'.")
    paths = [row_file(name, rows_dir) for name in rows]  # a typo fails before any decoding
    names = [row_name(p) for p in paths]
    if len(set(names)) != len(names):
        raise ValueError(f"rows={rows!r}: two rows share a name ({names}); each row's runs go to "
                         "output_dir/<row name>, so give rows with different file names.")
    return names, paths


def _decode_row(result: RowResult, row_out: Optional[str]):
    """Decodes the row speculatively and with the baseline (`infer.run`, both into `row_out`)
    and records alpha, tokens per call, tokens/s and the task metrics -> `(models, examples)`."""
    from speculative.runs import infer as infer_lib  # pylint: disable=g-import-not-at-top

    # Each run's settings come from gin again, so its config.gin reruns it with
    # scripts/infer.py (SPECULATIVE and INFER_OUTPUT_DIR as that run used them).
    spec_settings = _rebind(True, row_out)
    task, examples = infer_lib.load_examples(spec_settings)  # data check before models
    models = infer_lib.load_models(spec_settings)
    if spec_settings.auto_gamma:  # choose first; the runs then decode with a fixed GAMMA
        spec_settings = _choose_gamma(result, spec_settings, models, examples, row_out)
    spec = infer_lib.run(spec_settings, models, task=task, examples=examples)
    base_settings = _rebind(False, row_out)
    base = infer_lib.run(base_settings, models, task=task, examples=examples)
    result.alpha = spec.alpha
    result.tokens_per_target_call = spec.tokens_per_target_call
    result.speculative_tokens_per_second = spec.tokens_per_second
    result.baseline_tokens_per_second = base.tokens_per_second
    result.task_metrics = {"speculative": spec.task_metrics, "baseline": base.task_metrics}
    result.output_dirs = {"speculative": spec_settings.output_dir,
                          "baseline": base_settings.output_dir}
    return models, examples


def _choose_gamma(result: RowResult, settings, models, examples, row_out: Optional[str]):
    """GAMMA 'auto': times the baseline, the chain (and a block draft's block) on the row's
    first inputs (`speculation.choose_speculation`, as `infer` does; the row's own token-tree
    choice is `choose_trees`'), records the choice, binds GAMMA to the row's γ (`row_gamma`)
    and returns the speculative run's settings (its config.gin then reruns it)."""
    from speculative.runs import infer as infer_lib  # pylint: disable=g-import-not-at-top
    from speculative.runs import infer_choice  # pylint: disable=g-import-not-at-top

    all_batches = list(infer_lib.batches(examples, settings.batch_size, settings.input_length))
    # A row measures speculative decoding: its candidates are always timed (no gate, no
    # calibration budget), and the fastest speculative one is reported (`row_gamma`).
    calibration, search = infer_choice.calibration_slice(settings, models[0], all_batches,
                                                         gate=False)
    choice = speculation.choose_speculation(models[0], models[1], calibration, search)
    result.speculation_choice = choice
    result.gamma = row_gamma(choice)
    print(f"row {result.name}: {_auto_note(choice)}")
    gin.parse_config([f"GAMMA = {result.gamma}"])
    result.settings = _rebind(True, row_out)
    return result.settings


def _price_row(result: RowResult, models, batches, *, cost_repeats: int,
               choose_trees: bool) -> None:
    """The row's step costs (c, verify costs) and, with `choose_trees`, its token-tree choice."""
    settings = result.settings
    # With choose_trees, verify costs up to acceptance.TREE_MAX_NODES tokens price token trees.
    widths = sorted({settings.gamma, *(acceptance.TREE_VERIFY_WIDTHS if choose_trees
                                       else ())})
    result.costs = costs_lib.measure_costs(
        models[0], models[1], np.asarray(batches[0]), widths,
        max_decode_len=settings.max_decode_len, num_steps=8, repeats=cost_repeats, seed=0)
    if not choose_trees:
        return
    row_costs = functools.partial(  # timed only if a tree could win (choose_tree)
        costs_lib.draft_row_costs, models[0], models[1], np.asarray(batches[0]),
        acceptance.TREE_DRAFT_ROWS, c=result.costs.c,
        max_decode_len=settings.max_decode_len, repeats=cost_repeats)
    result.tree_choice = acceptance.choose_tree(
        models[0], models[1], batches, settings.sampling, result.costs, row_costs,
        max_decode_len=settings.max_decode_len, max_nodes=acceptance.TREE_MAX_NODES)
    print(f"row {result.name}: token trees: {result.tree_choice.line()} "
          f"(the row times its own GAMMA={settings.gamma} chain"
          + (", and the tree)" if result.tree_choice.tree else ")"))


def _time_row(result: RowResult, models, batches, speed_repeats: int) -> None:
    """Speed: the row's chain (and its chosen tree) against the baseline, interleaved."""
    settings = result.settings
    from speculative.runs import infer_encode  # pylint: disable=g-import-not-at-top

    timed_batches = [infer_encode.sharded(b, models[0]) for b in batches]
    tree = result.tree_choice.tree if result.tree_choice else None
    for shape in (None, tree) if tree else (None,):  # the row's chain, then the tree
        [timed] = measure.measure(
            models[0], [models[1]] * len(batches), timed_batches,
            sampling=settings.sampling, gammas=[len(shape) if shape else settings.gamma],
            max_decode_len=settings.max_decode_len, repeats=speed_repeats,
            lenience=settings.lenience, seed=settings.seed, costs=result.costs, tree=shape)
        if shape is None:
            result.speed, result.speed_spread = timed.speedup, timed.speedup_spread
        else:
            result.tree_speed = timed.speedup
            result.tree_tokens_per_target_call = timed.tokens_per_target_call


def _predict_row(result: RowResult, c) -> None:
    """c (measured, the paper's or given) and Theorem 3.8's predictions."""
    gamma = result.settings.gamma
    if c is None:
        result.c = result.costs.c
        result.verify_cost = result.costs.verify_cost[gamma]
        result.c_source = "measured"
    elif c == "paper":
        result.c, result.c_source = result.info.paper_c, "paper Table 4"
    else:
        result.c, result.c_source = float(c), "given"
    if result.alpha is not None and result.c is not None:
        result.predicted = theory.speedup(result.alpha, gamma, result.c)
        if result.verify_cost is not None:
            result.predicted_measured_verify = theory.speedup(
                result.alpha, gamma, result.c, verify_cost=result.verify_cost)
