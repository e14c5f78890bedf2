"""Where speculative decoding stops paying: larger batches, and the memory-bandwidth limit.

Speculation pays when a target step is memory-bound: the step streams every decoder weight
from memory whatever the number of tokens it scores, so verifying gamma + 1 tokens costs
little more than one step. Two measurements show where that ends, for each bundled pair (the
target and its `mini.best_t5_draft`: `large_target`, memory-bound on a CPU, and `mini_target`,
compute-bound; test-split sentences):

* Batch scaling (`batch_scaling`). The same `num_sentences` sentences are decoded at batch 1,
  4, 16, 64 (`measure.measure`: baseline and speculative programs compiled first,
  then timed in interleaved rounds, speedup = ratio of medians). A larger batch reuses each
  weight for more rows, so the step moves from memory-bound towards compute-bound and the
  verify cost (`costs.measure_costs`: target on gamma + 1 tokens / on 1 token) grows; gamma is
  chosen per batch by Theorem 3.8 (`costs.best_gamma`) from the draft's alpha on the model card
  and that batch's measured costs. `crossover` is the first batch whose speedup is below 1.
* The bandwidth bound (`host.measure_bandwidth`, `host.step_bytes`). The machine's streaming-read
  bandwidth is timed as a jitted sum over an array far larger than the last-level cache (1 GiB
  by default); a target step must read at least `host.step_bytes` (decoder weights, output layer,
  self-attention keys/values at the mean decode position, cross-attention keys/values of the
  source), so it cannot take less than bytes / bandwidth. Each row reports the measured times
  over that bound: the target step alone (a loop of 1-token `extend` calls), the verify call of
  gamma + 1 tokens (the same bytes) and the baseline decode per step (walltime / loop steps,
  encoder and sampling included). A ratio near 1 is a step at the memory limit (speculation's
  regime); a ratio far above 1 is a step bound by compute or per-operation overhead; below 1,
  the weights came from a cache faster than the streamed memory. `benchmark_bounds` gives the
  same ratios for the target of a `benchmark.json` (e.g. a random T5 1.1 large on a GPU).

* Target size (`depth_sweep`; `scripts/limits.py --depths`). Random-weight copies of a bundled
  target with more decoder layers, timed against its bundled draft: how c and the verify cost
  change as the weights grow past the last-level cache, and what Theorem 3.8 then gives at the
  draft's alpha. `run_depth_sweep` writes `depth_sweep.json` and `depth_sweep.md`.

Results (`run`): `limits.json` (below), `batch_scaling.md`, `bandwidth.md` and
`speedup_vs_batch.png` in the output directory (docs/limits.md reads them).

JSON schema (`limits.json`; NaN and infinities are written as null):

    schema      "speculative.limits/1"
    settings    targets, batch_sizes, temperatures, gammas (candidates), num_sentences,
                input_length, max_decode_len, repeats, cost_steps, bandwidth_bytes,
                benchmark_jsons, seed
    environment host.environment() plus load_average
    bandwidth   {bytes, median_s, min_s, first_call_s, gb_per_s (median), gb_per_s_best
                (fastest round)}
    rows        one per (pair, temperature, batch size): target, draft, temperature,
                batch_size, gamma, prior_alpha (the card's, for choosing gamma; null with one
                gamma), alpha (measured), speedup, speedup_spread, predicted_speedup (Theorem
                3.8), c, verify_cost, tokens_per_target_call, baseline_s, speculative_s (medians
                over repeats, all sentences), baseline_steps (loop steps: each batch's longest
                row), baseline_step_s,
                target_step_s, target_verify_s, host.mean_position, mean_source_length,
                bytes {decoder_weights, output_layer, self_kv, cross_kv, total},
                bytes_as_allocated (the same with the whole allocated caches),
                bound_s (bytes.total / bandwidth), step_over_bound, verify_over_bound,
                baseline_over_bound
    crossover   one per (pair, temperature): {target, draft, temperature, batch_size (first
                batch with speedup < 1, or null: none)}
    benchmark_bounds  one per (benchmark_jsons file, batch size): benchmark_json, batch_size,
                bytes, bound_s, target_step_s, step_over_bound, target_verify_s {gamma: s},
                verify_over_bound {gamma: ratio}
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import jax
import numpy as np

from speculative import files, loading
from speculative.data import bundles
from speculative.decode import kernel as sampling_lib
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.measure import host, plots
from speculative.measure import timing as measure
from speculative.models import t5
from speculative.runs import mini

SCHEMA = "speculative.limits/1"
RESULTS_FILE = "limits.json"
DEFAULT_DIR = "results/limits"
BATCH_SIZES = (1, 4, 16, 64)
GAMMAS = (1, 2, 3, 4, 5, 6)  # candidates; Theorem 3.8 picks one per batch size


# ----------------------------------------------------------------------------------------------
# Bytes, bandwidth and the crossover.


def crossover(rows: Sequence[Mapping[str, Any]]) -> Optional[int]:
    """The smallest batch size whose speedup is below 1 (rows of one pair and temperature), or
    None when speculation pays at every measured batch size."""
    slower = [r["batch_size"] for r in rows if r["speedup"] < 1.0]
    return min(slower) if slower else None


def prior_alpha(draft: str, temperature: float) -> float:
    """The draft's alpha at `temperature` on the model card (measured when it was trained)."""
    for entry in mini.model_card()["models"][draft].get("alpha") or []:
        if float(entry["temperature"]) == float(temperature):
            return float(entry["alpha"])
    raise ValueError(f"The model card has no alpha for {draft} at temperature {temperature:g}, "
                     "so gamma cannot be chosen by Theorem 3.8; pass one gamma (--gammas=4).")


# ----------------------------------------------------------------------------------------------
# Batch scaling.


def batch_scaling(target, draft, sources: np.ndarray, *, batch_sizes: Sequence[int],
                  samplings: Sequence[SamplingConfig], gammas: Sequence[int],
                  alphas: Mapping[float, float], max_decode_len: int, repeats: int,
                  cost_steps: int, seed: int = 0) -> List[Dict[str, Any]]:
    """Speculative vs baseline on the rows of `sources [N, L_in]` at each batch size (N a
    multiple of each); one row per (batch size, sampling), gamma by Theorem 3.8 from
    `alphas[temperature]` and that batch's costs (the one gamma when `gammas` has one), each
    cost timed as `cost_steps / b` (at least 2) extend calls of the b-row batch."""
    rows = []
    for b in batch_sizes:
        batches = [sources[i:i + b] for i in range(0, len(sources), b)]
        # Calls of b rows take longer: fewer of them per timing (cost_steps / b, at least 2).
        costs = costs_lib.measure_costs(target, draft, batches[0], gammas,
                                        max_decode_len=max_decode_len,
                                        num_steps=max(2, cost_steps // b),
                                        repeats=max(2 * repeats, 5), seed=seed)
        for sampling in samplings:
            t = sampling.temperature
            gamma = (gammas[0] if len(gammas) == 1 else
                     costs_lib.best_gamma(alphas[t], costs, gammas))
            [run] = measure.measure(
                target, [draft] * len(batches), batches, sampling=sampling, gammas=[gamma],
                max_decode_len=max_decode_len, repeats=repeats, lenience=1.0, seed=seed,
                costs=costs)
            # The baseline loop runs until a batch's longest row ends; the speculative run
            # decodes the same sentences (identical rows at T = 0, the same law at T > 0).
            lengths = np.asarray(run.stats.generated)
            steps = int(sum(lengths[i:i + b].max() for i in range(0, len(lengths), b)))
            base_s = run.baseline.median_s
            rows.append({
                "temperature": t, "batch_size": b, "gamma": gamma,
                "prior_alpha": alphas.get(t), "alpha": run.alpha,
                "speedup": run.speedup, "speedup_spread": run.speedup_spread,
                "predicted_speedup": run.predicted_speedup, "c": run.c,
                "verify_cost": run.verify_cost, "baseline_s": base_s,
                "speculative_s": run.speculative.median_s,
                "tokens_per_target_call": run.tokens_per_target_call,
                "baseline_steps": steps, "baseline_step_s": base_s / max(steps, 1),
                "target_step_s": costs.target_step_s,
                "target_verify_s": costs.target_verify_s[gamma],
                "mean_position": host.mean_position(lengths),
                "mean_source_length": float(np.count_nonzero(sources, axis=1).mean()),
            })
    return rows


def add_bounds(rows: List[Dict[str, Any]], target, *, bandwidth: Mapping[str, float],
               input_length: int, max_decode_len: int) -> None:
    """Adds to each `batch_scaling` row the bytes a target step reads at that batch size
    (`host.step_bytes` at the row's mean position and source length, and as allocated: the whole
    caches our decode loops attend over) and the measured times over bytes / bandwidth."""
    cache_len = target.prefix_length(input_length) + max_decode_len + 2  # the baseline's cache
    for r in rows:
        model = (target.module.config, target.params)
        r["bytes"] = host.step_bytes(*model, batch_size=r["batch_size"],
                                     position=r["mean_position"],
                                     encoder_length=r["mean_source_length"])
        r["bytes_as_allocated"] = host.step_bytes(*model, batch_size=r["batch_size"],
                                                  position=cache_len, encoder_length=input_length)
        r["bound_s"] = r["bytes"]["total"] / (bandwidth["gb_per_s"] * 1e9)
        for name, key in (("step", "target_step_s"), ("verify", "target_verify_s"),
                          ("baseline", "baseline_step_s")):
            r[f"{name}_over_bound"] = r[key] / r["bound_s"]


def benchmark_config(path: str) -> Dict[str, Any]:
    """The `benchmark.json` at `path` (scripts/benchmark.py), checked to hold an encoder-decoder
    T5Config target, the only kind `benchmark_bounds` can count bytes for."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        model = data["config"]["target_model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"benchmark_json={path!r} is not a readable benchmark.json ({e!r}); "
                         "give the file scripts/benchmark.py wrote.") from e
    if not isinstance(model, dict) or model.get("type") != "T5Config" or data["config"].get(
            "decoder_only"):
        raise ValueError(f"benchmark_json={path!r} has target_model={model!r}: the bound needs "
                         "an encoder-decoder T5Config target (e.g. the synthetic-draft runs of "
                         "configs/runs/gpu_benchmark.gin).")
    return data


def benchmark_bounds(path: str, bandwidth: Mapping[str, float]) -> List[Dict[str, Any]]:
    """The bandwidth bound of each batch size of a `benchmark.json` (a T5Config target; weights
    counted in float32, as scripts/benchmark.py stores them unless param_dtype is set): its
    measured target step and verify calls (`costs`) over bytes / bandwidth, at the mean decode
    position of that batch size's runs and the full input length (random inputs have no
    padding)."""
    data = benchmark_config(path)
    fields = {k: v for k, v in data["config"]["target_model"].items() if k != "type"}
    config = t5.T5Config(**fields)
    params = t5.param_shapes(t5.Transformer(config))
    rows = []
    for cost in data["costs"]:
        b = cost["batch_size"]
        lengths = [n for r in data["runs"] if r["batch_size"] == b
                   for n in r["stats"]["per_row"]["generated"]]
        nbytes = host.step_bytes(config, params, batch_size=b, position=host.mean_position(lengths),
                            encoder_length=data["config"]["input_length"])
        bound = nbytes["total"] / (bandwidth["gb_per_s"] * 1e9)
        rows.append({"benchmark_json": path, "batch_size": b, "bytes": nbytes, "bound_s": bound,
                     "target_step_s": cost["target_step_s"],
                     "step_over_bound": cost["target_step_s"] / bound,
                     "target_verify_s": cost["target_verify_s"],
                     "verify_over_bound": {g: t / bound
                                           for g, t in cost["target_verify_s"].items()}})
    return rows


# ----------------------------------------------------------------------------------------------
# Target size: what a deeper target would verify at on this machine.

DEPTH_FILE = "depth_sweep.json"


def _check_depth_settings(depths, target, gammas, num_steps, repeats):
    depths = validation.positive_ints(depths, "depths", "decoder layers of each copy")
    gammas = validation.positive_ints(gammas, "gammas", "draft tokens per round")
    validation.positive_int(num_steps, "num_steps", "extend calls per cost timing")
    validation.positive_int(repeats, "repeats", "timed rounds after the compiling call")
    if target not in mini.targets():
        raise ValueError(f"target={target!r}: give a bundled target, from {mini.targets()}.")
    # The deepest copy's float32 weights (plus the model-building copy) must fit in memory.
    def count(layers):  # parameters of a copy with `layers` decoder layers (shapes only)
        config = dataclasses.replace(mini.config(target), num_decoder_layers=layers)
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(
            t5.param_shapes(loading.make_module(config))))

    one = count(1)
    nbytes = 2 * 4 * (one + (max(depths) - 1) * (count(2) - one))
    validation.fits_memory(nbytes, f"depths={max(depths)}: a copy of {target} with "
                           f"{max(depths)} decoder layers (float32, built once)",
                           "give fewer decoder layers in --depths")
    alphas = {t: prior_alpha(mini.best_t5_draft(target), t) for t in (0.0, 1.0)}
    return depths, gammas, alphas


def depth_sweep(depths: Sequence[int], *, target: str = "large_target",
                gammas: Sequence[int] = GAMMAS, num_steps: int = 16, repeats: int = 10,
                max_decode_len: int = bundles.MAX_DECODE_LEN, seed: int = 0
                ) -> List[Dict[str, Any]]:
    """c and the verify cost on this machine for copies of a bundled target's shape with
    `depths` decoder layers (random weights: step costs do not depend on their values), with the
    target's bundled best draft, at batch 1 on the first test sentence.

    It answers what the cache-regime rule alone cannot: how much cheaper verification and the
    draft get as the weights a step reads grow past the last-level cache. One row per depth
    (each timed by `costs.measure_costs`: its programs interleaved, ratios of medians):
    decoder_layers, bytes (`host.step_bytes`), regime (`host.cache_regime`), target_step_s,
    step_gb_per_s (bytes / step), c, verify_cost {gamma}, and per temperature of the draft's
    model-card alpha, Theorem 3.8's best gamma and speedup with the measured costs
    (`thm38`: {temperature: {alpha, gamma, speedup}}).
    """
    depths, gammas, alphas = _check_depth_settings(list(depths), target, list(gammas),
                                                   num_steps, repeats)
    base = mini.config(target)  # the shape only: the copies get random weights
    draft = mini.load(mini.best_t5_draft(target))
    cache = host.cpu_facts()["cache_bytes"]
    inputs = mini.source_batches(1, 1, bundles.INPUT_LENGTH)[0]
    rows = []
    for d in depths:
        config = dataclasses.replace(base, num_decoder_layers=d, dropout_rate=0.0)
        model = loading.load_model(config, seed=seed)
        costs = costs_lib.measure_costs(model, draft, inputs, gammas,
                                        max_decode_len=max_decode_len, num_steps=num_steps,
                                        repeats=repeats, seed=seed)
        nbytes = host.step_bytes(config, model.params, batch_size=1, position=0, encoder_length=0)
        thm = {}
        for t, alpha in alphas.items():
            g = costs_lib.best_gamma(alpha, costs, gammas)
            thm[t] = {"alpha": alpha, "gamma": g, "speedup": float(theory.speedup(
                alpha, g, costs.c, costs.verify_cost[g]))}
        rows.append({"decoder_layers": d, "bytes": nbytes,
                     "regime": host.cache_regime(nbytes["total"], cache),
                     "target_step_s": costs.target_step_s,
                     "step_gb_per_s": nbytes["total"] / costs.target_step_s / 1e9,
                     "c": costs.c, "verify_cost": costs.verify_cost, "thm38": thm})
        print(format_depth_table(rows[-1:]), flush=True)
        del model
    return rows


def format_depth_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`depth_sweep.md`: one line per depth."""
    gammas = sorted(rows[0]["verify_cost"]) if rows else []
    return files.markdown_table(
        ["decoder layers", "weights MB", "x last-level cache", "step ms", "step GB/s", "c"]
        + [f"verify γ={g}" for g in gammas]
        + [f"Thm 3.8 T={float(t):g} (α, γ)" for t in (rows[0]["thm38"] if rows else [])],
        [[r["decoder_layers"], f"{r['bytes']['total'] / 1e6:.0f}",
          "-" if r["regime"]["weights_over_cache"] is None
          else f"{r['regime']['weights_over_cache']:.2f}",
          f"{1e3 * r['target_step_s']:.2f}", f"{r['step_gb_per_s']:.1f}", f"{r['c']:.3f}"]
         + [f"{r['verify_cost'][g]:.2f}" for g in gammas]
         + [f"{v['speedup']:.2f}X ({v['alpha']:.2f}, {v['gamma']})" for v in r["thm38"].values()]
         for r in rows])


def run_depth_sweep(output_dir: str, depths: Sequence[int], *, target: str = "large_target",
                    gammas: Sequence[int] = GAMMAS, num_steps: int = 16, repeats: int = 10,
                    overwrite: bool = False, seed: int = 0) -> Dict[str, Any]:
    """`depth_sweep` with the streaming bandwidth beside it; writes `depth_sweep.md` and
    `depth_sweep.json` (last) into `output_dir`, refusing an earlier JSON there unless
    `overwrite`. Schema: {schema, settings, environment, bandwidth (`host.measure_bandwidth`),
    rows (`depth_sweep`)}."""
    settings = dict(target=target, gammas=list(gammas), num_steps=num_steps, repeats=repeats,
                    seed=seed)
    _check_depth_settings(list(depths), target, list(gammas), num_steps, repeats)
    path = os.path.join(output_dir, DEPTH_FILE)
    if not overwrite and os.path.exists(path):
        raise FileExistsError(f"{path} holds an earlier run; choose another --output_dir or pass "
                              "--overwrite to replace it.")
    files.check_output_dir(output_dir)
    bandwidth = host.measure_bandwidth()
    print(f"bandwidth: {bandwidth['gb_per_s']:.1f} GB/s", flush=True)
    rows = depth_sweep(depths, **settings)
    environment = host.environment()
    environment["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = {"schema": SCHEMA, "settings": {"depths": list(depths), **settings},
               "environment": environment, "bandwidth": bandwidth, "rows": rows,
               "provenance": _provenance(bandwidth)}
    files.write_atomic(os.path.join(output_dir, "depth_sweep.md"), format_depth_table(rows))
    files.write_atomic(path, json.dumps(files.json_ready(results), indent=1, allow_nan=False)
                       + "\n")
    print(f"wrote {path}", flush=True)
    record.index_run("depth_sweep", target, path, results)
    return results


# ----------------------------------------------------------------------------------------------
# The run.


def check_settings(*, targets: Sequence[str], batch_sizes, temperatures, gammas,
                   num_sentences: int, repeats: int, cost_steps: int, max_decode_len: int,
                   bandwidth_bytes: int) -> Dict[str, Any]:
    """Every user-given setting, checked before any work (errors name the value and the fix)."""
    unknown = sorted(set(targets) - set(mini.targets()))
    if unknown or not targets:
        raise ValueError(f"targets={list(targets)!r}: give bundled targets, from "
                         f"{mini.targets()}.")
    batch_sizes = validation.positive_ints(batch_sizes, "batch_sizes", "rows decoded together")
    gammas = validation.positive_ints(gammas, "gammas", "draft tokens per round")
    samplings = sampling_lib.sampling_configs(temperatures)
    validation.positive_int(repeats, "repeats", "timed rounds after the compiling call")
    validation.positive_int(cost_steps, "cost_steps", "extend calls per cost timing")
    validation.positive_int(max_decode_len, "max_decode_len",
                           "tokens generated per sentence at most")
    validation.positive_int(bandwidth_bytes, "bandwidth_bytes", "1 << 30 is typical")
    validation.positive_int(num_sentences, "num_sentences",
                           "the same sentences at every batch size")
    uneven = [b for b in batch_sizes if num_sentences % b]
    if uneven:
        raise ValueError(f"num_sentences={num_sentences} is not a multiple of batch sizes "
                         f"{uneven}: every batch size decodes the same sentences in full batches; "
                         f"use a multiple of {int(np.lcm.reduce(batch_sizes))}.")
    available = sum(len(b) for b in mini.source_batches(num_sentences, num_sentences,
                                                        bundles.INPUT_LENGTH))
    if available < num_sentences:
        raise ValueError(f"num_sentences={num_sentences}: the test split has only {available} "
                         f"sentences that fit {bundles.INPUT_LENGTH} tokens; lower it.")
    if len(gammas) > 1:  # gamma by Theorem 3.8 needs the card's alpha
        for target in targets:
            for s in samplings:
                prior_alpha(mini.best_t5_draft(target), s.temperature)
    return {"batch_sizes": batch_sizes, "gammas": gammas, "samplings": samplings}


def run(output_dir: str = DEFAULT_DIR, *, targets: Optional[Sequence[str]] = None,
        batch_sizes: Sequence[int] = BATCH_SIZES, temperatures: Sequence[float] = (0.0,),
        gammas: Sequence[int] = GAMMAS, num_sentences: int = 64, repeats: int = 5,
        cost_steps: int = 16, max_decode_len: int = bundles.MAX_DECODE_LEN,
        bandwidth_bytes: int = host.BANDWIDTH_BYTES, benchmark_jsons: Sequence[str] = (),
        overwrite: bool = False, seed: int = 0) -> Dict[str, Any]:
    """Measures the bandwidth, then each bundled target in `targets` (default: all) with its best
    draft at every batch size and temperature, and the bound of each `benchmark_jsons` file
    (`benchmark_bounds`); writes the tables, the plot and `limits.json` (last) into
    `output_dir`, refusing an earlier `limits.json` there unless `overwrite`."""
    targets = list(targets) if targets is not None else mini.targets()
    checked = check_settings(targets=targets, batch_sizes=batch_sizes, temperatures=temperatures,
                             gammas=gammas, num_sentences=num_sentences, repeats=repeats,
                             cost_steps=cost_steps, max_decode_len=max_decode_len,
                             bandwidth_bytes=bandwidth_bytes)
    for path in benchmark_jsons:
        benchmark_config(path)
    if not isinstance(output_dir, str) or not output_dir:
        raise ValueError(f"output_dir={output_dir!r} is invalid: give a directory path, e.g. "
                         f"--output_dir={DEFAULT_DIR}.")
    if not overwrite and os.path.exists(os.path.join(output_dir, RESULTS_FILE)):
        raise FileExistsError(f"{os.path.join(output_dir, RESULTS_FILE)} holds an earlier run; "
                              "choose another --output_dir or pass --overwrite to replace it.")
    files.check_output_dir(output_dir)  # writable
    input_length = bundles.INPUT_LENGTH
    bandwidth = host.measure_bandwidth(bandwidth_bytes)
    print(f"bandwidth: {bandwidth['gb_per_s']:.1f} GB/s (sum over "
          f"{bandwidth['bytes'] / 2**20:.0f} MiB)", flush=True)
    sources = mini.source_batches(num_sentences, num_sentences, input_length)[0]
    rows, crossovers = [], []
    for name in targets:
        target, draft_name = mini.load(name), mini.best_t5_draft(name)
        draft = mini.load(draft_name)
        alphas = {s.temperature: prior_alpha(draft_name, s.temperature)
                  for s in checked["samplings"]} if len(checked["gammas"]) > 1 else {}
        pair = batch_scaling(target, draft, sources, batch_sizes=checked["batch_sizes"],
                             samplings=checked["samplings"], gammas=checked["gammas"],
                             alphas=alphas, max_decode_len=max_decode_len, repeats=repeats,
                             cost_steps=cost_steps, seed=seed)
        add_bounds(pair, target, bandwidth=bandwidth, input_length=input_length,
                   max_decode_len=max_decode_len)
        for r in pair:
            r.update(target=name, draft=draft_name)
        for s in checked["samplings"]:
            same = [r for r in pair if r["temperature"] == s.temperature]
            crossovers.append({"target": name, "draft": draft_name,
                               "temperature": s.temperature, "batch_size": crossover(same)})
        rows += pair
        print(format_batch_table(pair), flush=True)
    environment = host.environment()
    environment["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = {
        "schema": SCHEMA,
        "settings": {"targets": targets, "batch_sizes": checked["batch_sizes"],
                     "temperatures": [s.temperature for s in checked["samplings"]],
                     "gammas": checked["gammas"], "num_sentences": num_sentences,
                     "input_length": input_length, "max_decode_len": max_decode_len,
                     "repeats": repeats, "cost_steps": cost_steps,
                     "bandwidth_bytes": bandwidth_bytes, "benchmark_jsons": list(benchmark_jsons),
                     "seed": seed},
        "environment": environment, "bandwidth": bandwidth, "rows": rows,
        "crossover": crossovers,
        "benchmark_bounds": [r for path in benchmark_jsons
                             for r in benchmark_bounds(path, bandwidth)]}
    results["provenance"] = _provenance(bandwidth)
    path = write_results(results, output_dir)
    record.index_run("limits", "+".join(targets), path, results)
    return results


def _provenance(bandwidth: Dict[str, Any]) -> Dict[str, Any]:
    """`host.provenance()` with the bandwidth this run measured (1 GiB reads)."""
    provenance = host.provenance()
    provenance["host"]["bandwidth_gb_per_s"] = bandwidth["gb_per_s"]
    return provenance


# ----------------------------------------------------------------------------------------------
# Tables, plot and files.


def format_batch_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`batch_scaling.md`: one line per (pair, temperature, batch size)."""
    return files.markdown_table(
        ["target", "draft", "T", "B", "γ", "α", "baseline ms/step", "speedup", "Thm 3.8", "c",
         "verify cost", "step / bound"],
        [[r["target"], r["draft"], f"{r['temperature']:g}",
          r["batch_size"], r["gamma"], f"{r['alpha']:.2f}", f"{1e3 * r['baseline_step_s']:.2f}",
          f"{r['speedup']:.2f}X", f"{r['predicted_speedup']:.2f}X", f"{r['c']:.3f}",
          f"{r['verify_cost']:.2f}", f"{r['step_over_bound']:.2f}"] for r in rows])


def format_crossover_table(crossovers: Sequence[Mapping[str, Any]]) -> str:
    return files.markdown_table(
        ["target", "draft", "T", "stops paying at batch (first speedup < 1)"],
        [[c["target"], c["draft"], f"{c['temperature']:g}",
          "none" if c["batch_size"] is None else c["batch_size"]] for c in crossovers])


def format_bandwidth_table(results: Mapping[str, Any]) -> str:
    """`bandwidth.md`: per target at the smallest batch size and the first temperature, then
    per batch size of each `benchmark_bounds` file."""
    bw = results["bandwidth"]["gb_per_s"]
    first = []
    for name in results["settings"]["targets"]:
        rows = [r for r in results["rows"] if r["target"] == name]
        first.append(min(rows, key=lambda r: (r["batch_size"], r["temperature"])))
    table = files.markdown_table(
        ["target", "B", "weights MB", "KV MB (self + cross)", "bytes MB", "as allocated MB",
         "bandwidth GB/s", "bound ms", "target step ms (x bound)",
         "baseline ms/step (x bound)", "verify γ+1 ms (x bound)"],
        [[r["target"], r["batch_size"],
          f"{(r['bytes']['decoder_weights'] + r['bytes']['output_layer']) / 1e6:.1f}",
          f"{(r['bytes']['self_kv'] + r['bytes']['cross_kv']) / 1e6:.2f}",
          f"{r['bytes']['total'] / 1e6:.1f}", f"{r['bytes_as_allocated']['total'] / 1e6:.1f}",
          f"{bw:.1f}", f"{1e3 * r['bound_s']:.3f}",
          f"{1e3 * r['target_step_s']:.3f} ({r['step_over_bound']:.2f}x)",
          f"{1e3 * r['baseline_step_s']:.3f} ({r['baseline_over_bound']:.2f}x)",
          f"{1e3 * r['target_verify_s']:.3f} ({r['verify_over_bound']:.2f}x, γ={r['gamma']})"]
         for r in first])
    if not results.get("benchmark_bounds"):
        return table
    return table + "\n" + files.markdown_table(
        ["benchmark run", "B", "bytes MB", "bound ms", "target step ms (x bound)",
         "verify γ+1 ms (x bound)"],
        [[os.path.basename(os.path.dirname(os.path.abspath(r["benchmark_json"]))),
          r["batch_size"], f"{r['bytes']['total'] / 1e6:.1f}",
          f"{1e3 * r['bound_s']:.3f}",
          f"{1e3 * r['target_step_s']:.3f} ({r['step_over_bound']:.2f}x)",
          ", ".join(f"γ={g}: {1e3 * t:.3f} ({r['verify_over_bound'][g]:.2f}x)"
                    for g, t in r["target_verify_s"].items())]
         for r in results["benchmark_bounds"]])


def write_results(results: Dict[str, Any], output_dir: str) -> str:
    """The tables and the plot, then `limits.json` (where it exists, the run is complete)."""
    files.write_atomic(os.path.join(output_dir, "batch_scaling.md"),
                       format_batch_table(results["rows"]) + "\n"
                       + format_crossover_table(results["crossover"]))
    files.write_atomic(os.path.join(output_dir, "bandwidth.md"), format_bandwidth_table(results))
    lines = {}
    for r in results["rows"]:
        lines.setdefault(f"{r['target']} + {r['draft']}, T={r['temperature']:g}", []).append(
            (r["batch_size"], r["speedup"]))
    plots.plot_speedup_vs_batch(lines, os.path.join(output_dir, "speedup_vs_batch.png"))
    path = os.path.join(output_dir, RESULTS_FILE)
    files.write_atomic(path, json.dumps(files.json_ready(results), indent=1, allow_nan=False)
                       + "\n")
    print(f"wrote {path}", flush=True)
    return path
