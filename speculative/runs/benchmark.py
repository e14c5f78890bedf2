"""Walltime benchmark of speculative vs autoregressive decoding, with two cost models.

For a target/draft pair, inputs, sampling settings, gammas and batch sizes, `run` measures (with
`measure.measure`, the project's one measurement, which every other run uses too)

  * the walltime of `decoding.autoregressive_decode` (the baseline) and of
    `decoding.speculative_decode` for each gamma, after compilation. The first call of each program
    is timed apart (compile_s = first call - steady-state median); then `repeats` rounds run every
    program once each, the order rotated per round, so machine noise hits baseline and speculative
    alike. Medians, quartiles and min/max are reported; speedup = baseline median / speculative
    median, with the spread of the per-round paired ratios;
  * the decode counters of `DecodeStats`: alpha (mean beta over the tested drafts), tokens per
    target call, accepted drafts per position;
  * the cost model of Theorem 3.8: c = T(draft extend of 1 token) / T(target extend of 1 token) and
    verify_cost(gamma) = T(target extend of gamma+1 tokens) / T(target extend of 1 token), each
    timed as a jitted `lax.fori_loop` of `extend` calls on the decode-size cache of the same batch
    (no per-call dispatch, as inside the decode loops; interleaved rounds, median), and the
    predicted speedup `theory.speedup(alpha, gamma, c, verify_cost)` next to the measured one;
  * the decode-loop cost model (`speculative.costs`): start-up and per-iteration cost of the
    decode programs themselves, fitted on `calibration_batches` further input batches timed in
    the same interleaved rounds, and the walltimes they predict at the measured alpha.

Results go to `<output_dir>/benchmark.json` (below) and
the resolved gin config to `<output_dir>/config.gin`.

Synthetic acceptance (`synthetic_acceptance=a`). The draft is replaced by `SyntheticDraft`, which
wraps the *target*: at each decoder position j of row b a hash of (j, b, seed) gives u in [0, 1)
(one seed per input batch). When u < a the draft's logits are the target's own logits (so q = p
after the same sampling adjustment and the drafted token is always accepted: beta = 1); otherwise
the logits are one-hot on the target's *least* likely token (at temperature 0 it is never the
argmax, so it is rejected; at temperature > 0, beta = p(least likely token), about 0, and exactly
0 under top-k/top-p). Each position is tested at most once (after a rejection the next round
drafts the following position), so the acceptances are i.i.d. Bernoulli(a) - exactly the i.i.d.
model behind Eq. 1 - and the measured alpha estimates a, within about sqrt(a (1 - a) / tested)
(tested = stats.tested). "Acceptance rate" here is therefore the paper's alpha = E[beta] with
beta a 0/1 coin of bias a per drafted position. The draft costs one target step (c is about 1,
measured as usual), so this mode times the machinery (draft loop, verification, sampling kernel,
rewinds) at a known acceptance rate: compare measured and predicted speedup, and tokens per
target call with Eq. 1; do not expect a speedup > 1.

`benchmark.json` (NaN and infinities written as null; docs/benchmark_schema.md): `config`,
`environment` (`host.environment()`), `costs` (one `costs.StepCosts.to_json()` per batch size)
and `runs` (one `measure.Measurement.to_json()` per sampling, batch size and gamma; the
dataclasses' docstrings name every field).

Shape legend: B batch, L length, K chunk, G gamma, V vocab, N max_decode_len.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

import gin
import jax
import numpy as np

from speculative import files, loading
from speculative.decode import kernel as sampling_lib
from speculative.decode import validation
from speculative.measure import costs as costs_lib
from speculative.measure import host
from speculative.measure import timing as measure
from speculative.models import partitioning, synthetic
from speculative.runs import infer_encode
from speculative.runs.infer_settings import with_overrides

Array = jax.Array
SCHEMA = "speculative.benchmark/1"
RESULTS_FILE = "benchmark.json"


# ----------------------------------------------------------------------------------------------
# Validation and configuration helpers (shared with alpha.py).


def write_json(data: Dict[str, Any], output_dir: str, name: str) -> str:
    """Writes the resolved gin config and `data` as strict JSON (NaN -> null) as one group
    (`files.write_atomic_group`: both written in full, then renamed into place, the results
    file last); returns the path."""
    path = os.path.join(output_dir, name)
    files.write_atomic_group({
        os.path.join(output_dir, "config.gin"): gin.operative_config_str(),
        path: json.dumps(files.json_ready(data), indent=1, allow_nan=False) + "\n"})
    return path


# ----------------------------------------------------------------------------------------------
# Inputs: a seqio task (or a TSV file) through speculative.tasks, or random token ids.


def _tsv_examples(tsv_path: str, spm_path: Optional[str],
                  input_length: int) -> Iterator[np.ndarray]:
    """`source<TAB>target` lines encoded as `tasks.register_tsv_task` does (prefix + source,
    cut to input_length - 1, then EOS), read directly: no seqio or TensorFlow, so an
    accelerator image without them can run the bundled pairs."""
    from speculative.data import text  # pylint: disable=import-outside-toplevel

    sources = [source for source, _ in text.load_pairs(tsv_path)]
    for ids in text.Tokenizer(spm_path).encode_inputs(sources):
        yield infer_encode.fit_input(np.asarray(ids, np.int32), input_length, decoder_only=False)


def _task_examples(task: Optional[str], tsv_path: Optional[str], spm_path: Optional[str],
                   split: str, input_length: int) -> Iterator[np.ndarray]:
    """Yields each example's `inputs` token ids (truncated to input_length, EOS kept)."""
    if tsv_path and not task:
        yield from _tsv_examples(tsv_path, spm_path, input_length)
        return
    import seqio  # pylint: disable=import-outside-toplevel

    from speculative.data import tasks  # pylint: disable=import-outside-toplevel

    if tsv_path:
        vocab = (seqio.SentencePieceVocabulary(spm_path) if spm_path
                 else tasks.mini_vocabulary())
        tasks.register_tsv_task(task, {split: tsv_path}, vocab)
    try:
        seqio_task = seqio.get_mixture_or_task(task)
    except ValueError as e:
        raise ValueError(f"task={task!r} is not a registered seqio task or mixture ({e}); use "
                         "one of speculative.tasks' (e.g. 'mini_ende') or pass tsv_path.") from e
    ds = seqio_task.get_dataset({"inputs": input_length, "targets": input_length}, split=split,
                                shuffle=False)
    for ex in ds.as_numpy_iterator():
        yield np.asarray(ex["inputs"], np.int32)[:input_length]


def input_batches(batch_size: int, *, vocab_size: int, input_length: int, seed: int,
                  task: Optional[str] = None, split: str = "validation",
                  tsv_path: Optional[str] = None, spm_path: Optional[str] = None
                  ) -> Iterator[np.ndarray]:
    """Yields `[B, L_in]` int32 batches: task inputs right-padded with 0, or random ids.

    Random ids are uniform over [2, V) (no PAD/EOS) and the source is endless; a task source
    stops at the end of its split (a last partial batch is dropped).
    """
    if task is None and tsv_path is None:
        rng = np.random.default_rng(seed)
        while True:
            yield rng.integers(2, vocab_size, size=(batch_size, input_length), dtype=np.int32)
    rows: List[np.ndarray] = []
    for ids in _task_examples(task, tsv_path, spm_path, split, input_length):
        if ids.size and int(ids.max()) >= vocab_size:
            raise ValueError(
                f"Task {task or tsv_path!r} has token id {int(ids.max())} but the models' "
                f"vocab_size is {vocab_size}; use models built for the task's vocabulary.")
        rows.append(ids)
        if len(rows) == batch_size:
            yield infer_encode.pad_rows(rows, batch_size, input_length)
            rows = []


def take_batches(num_batches: int, batch_size: int, **kwargs) -> List[np.ndarray]:
    batches = list(itertools.islice(input_batches(batch_size, **kwargs), num_batches))
    if len(batches) < num_batches:
        raise ValueError(
            f"The task {kwargs.get('task') or kwargs.get('tsv_path')!r} (split "
            f"{kwargs.get('split')!r}) has only {len(batches)} full batches of {batch_size}; "
            f"lower num_batches={num_batches} or the batch size.")
    return batches


# ----------------------------------------------------------------------------------------------
# The printed table.


def format_table(runs: Sequence[measure.Measurement]) -> str:
    """One line per measurement: timings, speedup, both predictions (pred = Theorem 3.8, loop =
    the decode-loop cost model, '-' without calibration), alpha and the cost ratios."""
    head = (f"{'temp':>5} {'B':>3} {'G':>3} {'base ms':>9} {'spec ms':>9} {'speedup':>8} "
            f"{'pred':>6} {'loop':>6} {'alpha':>6} {'tok/call':>8} {'c':>6} {'verify':>6}")
    lines = [head]
    for r in runs:
        loop = r.predicted_speedup_loop
        loop = f"{loop:>6.3f}" if math.isfinite(loop) else f"{'-':>6}"
        lines.append(
            f"{r.sampling.temperature:>5g} {r.batch_size:>3} {r.gamma:>3} "
            f"{1e3 * r.baseline.median_s:>9.2f} {1e3 * r.speculative.median_s:>9.2f} "
            f"{r.speedup:>8.3f} {r.predicted_speedup:>6.3f} {loop} {r.alpha:>6.3f} "
            f"{r.tokens_per_target_call:>8.3f} {r.c:>6.3f} {r.verify_cost:>6.3f}")
    return "\n".join(lines)


def summary_markdown(json_paths: Sequence[str]) -> str:
    """A markdown table of the `runs` of earlier `benchmark.json` files, one line per run (the
    run named by its folder), with the device each was measured on: what
    scripts/gpu_benchmark.sh writes to `summary.md`. The times are medians of the whole timed
    set of batches; '-' where a number is missing (no decode-loop calibration)."""
    def num(value, fmt, unit=""):
        return "-" if value is None or not math.isfinite(value) else format(value, fmt) + unit

    lines = ["| run | device | T | B | γ | baseline ms | speculative ms | speedup | Thm 3.8 | "
             "loop model | α | tokens/call | c | verify cost |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in json_paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
        device = data["environment"]["device_kind"]
        for r in data["runs"]:
            t = r["timings"]
            lines.append(
                f"| {name} | {device} | {r['sampling']['temperature']:g} | {r['batch_size']} | "
                f"{r['gamma']} | {1e3 * t['baseline']['median_s']:.2f} | "
                f"{1e3 * t['speculative']['median_s']:.2f} | {num(r['speedup'], '.2f', 'x')} | "
                f"{num(r['predicted_speedup'], '.2f', 'x')} | "
                f"{num(r.get('predicted_speedup_loop'), '.2f', 'x')} | {num(r['alpha'], '.3f')} | "
                f"{num(r['tokens_per_target_call'], '.2f')} | {num(r['c'], '.3f')} | "
                f"{num(r['verify_cost'], '.2f')} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# The run function.


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """Everything one benchmark run needs (configs/runs/benchmark.gin binds every field from its
    macros: `benchmark.run.settings = @benchmark.BenchmarkSettings()`).

    Attributes:
      target_model, draft_model: each a bundled model's name (checkpoint None: its trained
        weights), a `T5Config` with a checkpoint path (or None with a checkpoint: the
        architecture from the T5X config.gin beside it), a `T5Config` with checkpoint None
        (random weights), or a ready `DecodeModel` (e.g. an n-gram draft). `draft_model` is
        unused (may be None) with `synthetic_acceptance`.
      target_checkpoint, draft_checkpoint: checkpoint paths (`checkpoints.load_params`), or None
        (random weights for a T5Config: seeds `seed` and `seed + 1`).
      output_dir: where `benchmark.json` and `config.gin` are written.
      gammas, batch_sizes: lists of ints >= 1.
      temperatures: floats >= 0 (0 = argmax) sharing `top_k`/`top_p`, or `SamplingConfig`s.
      lenience: speculative_decode's lenience (1 = exact).
      draft_confidence: dynamic gamma (speculative_decode): a row stops drafting when the
        draft's top probability falls below it; 0 = always draft gamma tokens.
      max_decode_len, input_length: decode length N and encoder input / prompt length L_in.
      task / tsv_path (+ spm_path, default the mini corpus vocabulary), split: where inputs come
        from (`speculative.data.tasks`); neither = random token ids. A tsv_path alone is read
        without seqio (the ids its TSV task would give); with a task it is registered as one.
      num_batches: input batches per timed repeat (each batch size).
      repeats: timed repeats per program after the compiling first call.
      cost_steps: extend calls per timing of the cost model.
      calibration_batches: further input batches (after the `num_batches` timed ones) on which
        the decode-loop cost model is fitted (`speculative.measure.costs`), timed in the same
        interleaved rounds as the decoders; 0 = skip that prediction. It needs sequences of
        different lengths (trained models on real inputs), not random ones that never end.
      synthetic_acceptance: None, or a float in [0, 1]: use `SyntheticDraft` (module docstring).
      decoder_only: build `t5.DecoderOnly` models (inputs are prompts).
      param_dtype: cast loaded parameters (e.g. 'bfloat16').
      seed: seeds random weights, random inputs and the decode PRNG keys.
      draft_seed: seed of the draft's random weights (None = seed + 1; equal to `seed` with the
        same config gives a draft identical to the target, alpha = 1).
      overwrite: replace an earlier `benchmark.json` in `output_dir` (otherwise refused before
        any work).
      mesh_shape: None (one device) or (data, model): the target sharded by T5X's standard
        rules, the draft replicated, caches batch over 'data' and heads over 'model', and each
        batch's rows split over 'data' (batch sizes must be multiples of data).
    """

    target_model: Any
    draft_model: Any
    output_dir: str
    target_checkpoint: Optional[str] = None
    draft_checkpoint: Optional[str] = None
    gammas: Sequence[int] = (1, 2, 3, 5, 7)
    batch_sizes: Sequence[int] = (1,)
    temperatures: Sequence[Any] = (0.0, 1.0)
    top_k: int = 0
    top_p: float = 1.0
    lenience: float = 1.0
    draft_confidence: float = 0.0
    max_decode_len: int = 64
    input_length: int = 64
    task: Optional[str] = None
    split: str = "validation"
    tsv_path: Optional[str] = None
    spm_path: Optional[str] = None
    num_batches: int = 1
    repeats: int = 5
    cost_steps: int = 16
    calibration_batches: int = 8
    synthetic_acceptance: Optional[float] = None
    decoder_only: bool = False
    param_dtype: Optional[str] = None
    seed: int = 0
    draft_seed: Optional[int] = None
    overwrite: bool = False
    mesh_shape: Optional[Sequence[int]] = None


def _checked(s: BenchmarkSettings):
    """Refuses bad settings before any work -> `(output_dir, mesh, gammas, batch_sizes,
    samplings, synthetic_acceptance)`."""
    output_dir = files.check_output_dir(s.output_dir, RESULTS_FILE, s.overwrite)
    mesh = (None if s.mesh_shape is None
            else partitioning.make_mesh(mesh_shape=tuple(s.mesh_shape)))
    gammas = validation.positive_ints(s.gammas, "gammas", "draft tokens per round")
    batch_sizes = validation.positive_ints(s.batch_sizes, "batch_sizes", "rows decoded together")
    samplings = sampling_lib.sampling_configs(s.temperatures, s.top_k, s.top_p)
    for name in ("max_decode_len", "input_length", "num_batches", "repeats", "cost_steps"):
        validation.positive_ints([getattr(s, name)], name, "an int >= 1")
    if mesh is not None and any(b % mesh.shape["data"] for b in batch_sizes):
        raise ValueError(f"batch_sizes={list(batch_sizes)} must be multiples of the mesh's data "
                         f"axis ({mesh.shape['data']} of mesh_shape={tuple(s.mesh_shape)}).")
    if (isinstance(s.calibration_batches, bool) or not isinstance(s.calibration_batches, int)
            or s.calibration_batches < 0):
        raise ValueError(f"calibration_batches={s.calibration_batches!r} is invalid: give an int "
                         ">= 0 (0 skips the decode-loop cost prediction; 8 is typical).")
    synthetic_acceptance = s.synthetic_acceptance
    if synthetic_acceptance is not None:
        synthetic_acceptance = synthetic.check_acceptance(synthetic_acceptance)
    elif s.draft_model is None:
        raise ValueError("draft_model=None needs synthetic_acceptance (a float in [0, 1]); "
                         "otherwise give a draft T5Config or DecodeModel.")
    return output_dir, mesh, gammas, batch_sizes, samplings, synthetic_acceptance


def _models(s: BenchmarkSettings, mesh, synthetic_acceptance):
    """`(target, draft, drafts)`: `drafts` holds the draft of each timed input batch (one
    `SyntheticDraft` per batch with `synthetic_acceptance`, else the one draft)."""
    target = loading.build_model(s.target_model, s.target_checkpoint, name="target",
                                 decoder_only=s.decoder_only, seed=s.seed,
                                 param_dtype=s.param_dtype, mesh=mesh)
    if synthetic_acceptance is not None:
        # One hash seed per input batch, so batches (rows 0..B-1 each) see fresh decisions.
        drafts = [synthetic.SyntheticDraft(target, synthetic_acceptance, s.seed * 1_000_003 + i)
                  for i in range(s.num_batches)]
        return target, drafts[0], drafts
    draft = loading.build_draft(s.draft_model, s.draft_checkpoint, target,
                                decoder_only=s.decoder_only, seed=s.seed,
                                draft_seed=s.draft_seed, param_dtype=s.param_dtype, mesh=mesh)
    return target, draft, [draft] * s.num_batches


def _config_json(s: BenchmarkSettings, mesh, gammas, batch_sizes, samplings,
                 synthetic_acceptance) -> Dict[str, Any]:
    """benchmark.json's `config`."""
    return {
        "target_model": loading.describe_model(s.target_model),
        "draft_model": loading.describe_model(s.draft_model),
        "target_checkpoint": s.target_checkpoint,
        "draft_checkpoint": s.draft_checkpoint,
        "decoder_only": s.decoder_only,
        "synthetic_acceptance": synthetic_acceptance,
        "lenience": s.lenience,
        "draft_confidence": s.draft_confidence,
        "gammas": gammas,
        "batch_sizes": batch_sizes,
        "samplings": [measure.sampling_dict(x) for x in samplings],
        "max_decode_len": s.max_decode_len,
        "input_length": s.input_length,
        "inputs": {"source": "random" if s.task is None and s.tsv_path is None else "task",
                   "task": s.task, "tsv_path": s.tsv_path, "split": s.split,
                   "num_batches": s.num_batches},
        "repeats": s.repeats,
        "cost_steps": s.cost_steps,
        "calibration_batches": s.calibration_batches,
        "seed": s.seed,
        "mesh_shape": None if mesh is None else [mesh.shape["data"], mesh.shape["model"]],
    }


def _measure_batch_size(s: BenchmarkSettings, target, draft, drafts, mesh, batch_size: int,
                        gammas, samplings):
    """The cost model and every sampling's measurements at one batch size -> `(costs JSON,
    [measurement JSON])`; prints each sampling's table."""
    batches = take_batches(s.num_batches + s.calibration_batches, batch_size,
                           vocab_size=target.vocab_size, input_length=s.input_length,
                           seed=s.seed, task=s.task, split=s.split, tsv_path=s.tsv_path,
                           spm_path=s.spm_path)
    if mesh is not None:  # rows split over the mesh's 'data' axis
        batches = [partitioning.shard_batch(b, mesh) for b in batches]
    batches, calibration = batches[:s.num_batches], batches[s.num_batches:]
    cost = costs_lib.measure_costs(target, draft, batches[0], gammas,
                                   max_decode_len=s.max_decode_len, num_steps=s.cost_steps,
                                   repeats=max(2 * s.repeats, 5), seed=s.seed)
    runs = []
    for sampling in samplings:
        measured = measure.measure(
            target, drafts, batches, sampling=sampling, gammas=gammas,
            max_decode_len=s.max_decode_len, repeats=s.repeats, lenience=s.lenience,
            seed=s.seed, costs=cost, draft_confidence=s.draft_confidence,
            calibration=calibration)
        print(format_table(measured), flush=True)
        runs.extend(m.to_json() for m in measured)
    return cost.to_json(), runs


@gin.configurable
def run(settings: Optional[BenchmarkSettings] = None, **overrides) -> Dict[str, Any]:
    """Benchmarks speculative vs autoregressive decoding; writes `benchmark.json` + `config.gin`.

    Args:
      settings: the run's `BenchmarkSettings` (gin: `benchmark.run.settings =
        @benchmark.BenchmarkSettings()`, bound from the macros in configs/runs/benchmark.gin).
      **overrides: `BenchmarkSettings` fields by name, replacing the bound ones (or making the
        settings when there are none): `--gin.benchmark.run.tsv_path=...` and
        `run(target_model=..., draft_model=..., output_dir=...)` work as before.

    Returns:
      The results dict written to `benchmark.json`.
    """
    s = with_overrides(BenchmarkSettings, settings, overrides, "benchmark.run")
    output_dir, mesh, gammas, batch_sizes, samplings, synthetic_acceptance = _checked(s)
    target, draft, drafts = _models(s, mesh, synthetic_acceptance)
    config = _config_json(s, mesh, gammas, batch_sizes, samplings, synthetic_acceptance)
    costs, runs = [], []
    for batch_size in batch_sizes:
        cost, measured = _measure_batch_size(s, target, draft, drafts, mesh, batch_size,
                                             gammas, samplings)
        costs.append(cost)
        runs.extend(measured)
    results = {"schema": SCHEMA, "config": config, "environment": host.environment(),
               "costs": costs, "runs": runs}
    path = write_json(results, output_dir, RESULTS_FILE)
    print(f"wrote {path}", flush=True)
    return results
