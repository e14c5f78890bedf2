"""The one measurement of speculative against autoregressive decoding, with typed results.

`measure(target, drafts, batches, ...)` compiles the baseline and the speculative decode programs
for the same `batches` (`costs.decode_programs`), times them with the one timing engine
(`costs.interleaved`: each program's first call apart, then rounds in a rotated order, so machine
noise hits every program alike; medians), merges the decode statistics of all batches
(`stats_lib.merge_stats`), and prices each result two ways: Theorem 3.8 from the c and verify cost
that `costs.measure_costs` timed, and, given calibration batches (other inputs, timed in the same
rounds), the decode-loop cost model (`costs.fit_loop_costs`, `costs.predict_walltime`).

Every speed the project reports comes from here: `scripts/benchmark.py`, Table 2
(`reproduce_table2`), the bundled-model results (`mini_results`), the main job (`demo`) and the
batch-scaling limits (`limits`). Each gamma measured gives one `Measurement`; its
`to_json()` is an entry of benchmark.json's `runs` (and of the other results files).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from speculative.decode import stats as stats_lib
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib


def sampling_dict(s: SamplingConfig) -> Dict[str, Any]:
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p}


@dataclasses.dataclass(frozen=True)
class Timing:
    """One program's seconds: its first call (compilation included) and the timed repeats, in
    the order of the interleaved rounds."""

    repeats_s: Tuple[float, ...]
    first_call_s: float

    @property
    def median_s(self) -> float:
        return float(np.median(self.repeats_s))

    @property
    def compile_s(self) -> float:
        return self.first_call_s - self.median_s

    def to_json(self) -> Dict[str, Any]:
        return {**costs_lib.spread(self.repeats_s), "first_call_s": self.first_call_s,
                "compile_s": self.compile_s}


@dataclasses.dataclass(frozen=True)
class LoopPrediction:
    """The decode-loop cost model for one gamma: each program's start-up and cost per
    iteration (seconds) fitted on the calibration sequences, the round's cost in baseline
    steps, and the predicted walltimes (`costs.predict_walltime`)."""

    calibration_sequences: int
    baseline: costs_lib.ProgramCost
    speculative: costs_lib.ProgramCost
    walltime: costs_lib.WalltimePrediction

    @property
    def round_cost(self) -> float:
        """One round's cost in baseline steps."""
        return self.speculative.iteration_s / self.baseline.iteration_s

    @property
    def speedup(self) -> float:
        return float(self.walltime.speedup)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Speculative decoding with one gamma against the baseline, on the same batches.

    `stats` is the `DecodeStats` of the speculative runs (all batches merged); `c` and
    `verify_cost` are the single-call costs Theorem 3.8 uses; `loop` is the decode-loop model's
    prediction (None without calibration batches; `loop_error` says why
    it could not be fitted, e.g. no calibration sequence ended before max_decode_len).
    """

    sampling: SamplingConfig
    batch_size: int
    gamma: int
    max_decode_len: int
    baseline: Timing
    speculative: Timing
    baseline_tokens: int
    stats: stats_lib.DecodeStats
    c: float
    verify_cost: float
    loop: Optional[LoopPrediction] = None
    loop_error: Optional[str] = None
    tree: Optional[Tuple[int, ...]] = None  # a token tree's branching (gamma is its depth)
    # Other autoregressive decoders of the same target timed in the same rounds (e.g. the same
    # weights in another kernel layout), by name.
    other_baselines: Mapping[str, Timing] = dataclasses.field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Median baseline seconds over median speculative seconds."""
        return self.baseline.median_s / self.speculative.median_s

    @property
    def speedup_over_fastest_baseline(self) -> float:
        """The fastest median of the baseline and `other_baselines` over the speculative one."""
        fastest = min([self.baseline.median_s]
                      + [t.median_s for t in self.other_baselines.values()])
        return fastest / self.speculative.median_s

    @property
    def speedup_spread(self) -> Dict[str, float]:
        """min / median / max of the per-round ratios (both programs timed in each round)."""
        ratios = np.asarray(self.baseline.repeats_s) / np.asarray(self.speculative.repeats_s)
        return {"min": float(ratios.min()), "median": float(np.median(ratios)),
                "max": float(ratios.max())}

    @property
    def alpha(self) -> float:
        """Mean beta over the tested drafts (NaN if none was tested)."""
        alpha = float(self.stats.alpha)
        # Float sums may stray from [0, 1] by an ulp.
        return min(max(alpha, 0.0), 1.0) if math.isfinite(alpha) else alpha

    @property
    def tokens_per_target_call(self) -> float:
        return float(self.stats.tokens_per_target_call)

    @property
    def speculative_tokens(self) -> int:
        """Tokens the speculative decoders generated over all batches (at T > 0 their texts,
        and so their lengths, differ from the baseline's `baseline_tokens`)."""
        return int(self.stats.summary()["generated"])

    @property
    def predicted_speedup(self) -> float:
        """Theorem 3.8 with the measured c and verify cost."""
        if not math.isfinite(self.alpha):
            return float("nan")
        return float(theory.speedup(self.alpha, self.gamma, self.c, self.verify_cost))

    @property
    def predicted_speedup_loop(self) -> float:
        return self.loop.speedup if self.loop is not None else float("nan")

    def row(self) -> Dict[str, Any]:
        """The numbers a results table shows for this measurement (the demo's rows and the
        mini results' Table 2 rows start from it)."""
        return {"gamma": self.gamma, "tree": self.tree, "alpha": self.alpha,
                "tokens_per_target_call": self.tokens_per_target_call, "c": self.c,
                "verify_cost": self.verify_cost, "speedup": self.speedup,
                "speedup_spread": self.speedup_spread,
                "predicted_speedup": self.predicted_speedup,
                "predicted_speedup_loop": self.predicted_speedup_loop,
                "round_cost": self.loop.round_cost if self.loop else float("nan"),
                "baseline_s": self.baseline.median_s, "speculative_s": self.speculative.median_s,
                **({"other_baselines_s": {name: t.median_s
                                          for name, t in self.other_baselines.items()},
                    "speedup_over_fastest_baseline": self.speedup_over_fastest_baseline}
                   if self.other_baselines else {})}

    def to_json(self) -> Dict[str, Any]:
        """The benchmark.json `runs` entry (NaN stays NaN here; writers make it null)."""
        ok = math.isfinite(self.alpha)
        stats = self.stats.summary(per_row=True)
        base_tokens, spec_tokens = self.baseline_tokens, self.speculative_tokens
        out = {
            "sampling": sampling_dict(self.sampling),
            "batch_size": self.batch_size,
            "gamma": self.gamma,
            "tree": self.tree,
            "max_decode_len": self.max_decode_len,
            "timings": {"baseline": self.baseline.to_json(),
                        "speculative": self.speculative.to_json()},
            "speedup": self.speedup,
            "speedup_spread": self.speedup_spread,
            "baseline_tokens": base_tokens,
            "speculative_tokens": spec_tokens,
            "speedup_per_token": (self.baseline.median_s / max(base_tokens, 1))
            / (self.speculative.median_s / max(spec_tokens, 1)),
            "alpha": self.alpha,
            "tokens_per_target_call": self.tokens_per_target_call,
            "expected_tokens_per_call":
                theory.expected_tokens(self.alpha, self.gamma) if ok else float("nan"),
            "accepted_per_position": stats["accepted_per_position"],
            "accepted_per_position_rate": stats["accepted_per_position_rate"],
            "stats": stats,
            "c": self.c,
            "verify_cost": self.verify_cost,
            "predicted_speedup": self.predicted_speedup,
            "predicted_speedup_paper":
                theory.speedup(self.alpha, self.gamma, self.c) if ok else float("nan"),
            "measured_over_predicted": self.speedup / self.predicted_speedup
            if ok else float("nan"),
        }
        if self.loop_error is not None:
            out.update(loop_costs={"error": self.loop_error},
                       predicted_speedup_loop=float("nan"))
        elif self.loop is not None:
            out.update(
                loop_costs={"calibration_sequences": self.loop.calibration_sequences,
                            "baseline": self.loop.baseline.to_json(),
                            "speculative": self.loop.speculative.to_json(),
                            "round_cost": self.loop.round_cost},
                predicted_walltime=self.loop.walltime.to_json(),
                predicted_speedup_loop=self.loop.speedup,
                measured_over_predicted_loop=self.speedup / self.loop.speedup)
        return out


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """How `measure` decodes and times.

    Attributes:
      sampling: the one sampling setting of every decode.
      gammas: the speculative decoders' gammas (one `Measurement` each).
      max_decode_len: N of every decode.
      repeats: interleaved timed rounds after the compiling first call.
      lenience: speculative_decode's lenience (1 = exact).
      seed: the decode keys.
      draft_confidence: dynamic gamma (0 = always draft gamma tokens).
      calibration: other input batches (decoded with `drafts[0]`), timed in the same rounds,
        on which the decode-loop cost model is fitted; () = no loop prediction.
      calibration_lengths: one max_decode_len per calibration batch (default `max_decode_len`),
        so that sequences which rarely end still vary in length, which the fit needs.
      tree: a token tree's branching (`gammas` must be `[len(tree)]`): the speculative
        decoders draft that tree; its verify cost is the one of its node count, and alpha (the
        chance of passing a depth) and the predictions read the tree as a chain of its depth.
      other_baselines: {name: model}: other models of the same target (e.g. its weights in
        another kernel layout) whose autoregressive decodes are timed in the same rounds; each
        measurement reports them and its speedup over the fastest baseline.
    """

    sampling: SamplingConfig
    gammas: Sequence[int]
    max_decode_len: int
    repeats: int
    lenience: float
    seed: int
    draft_confidence: float = 0.0
    calibration: Sequence[np.ndarray] = ()
    calibration_lengths: Optional[Sequence[int]] = None
    tree: Optional[Sequence[int]] = None
    other_baselines: Optional[Mapping[str, Any]] = None


def measure(target, drafts: Sequence[Any], batches: Sequence[np.ndarray],
            options: Optional[MeasureOptions] = None, *, costs: costs_lib.StepCosts,
            **fields) -> List[Measurement]:
    """Times the baseline and every gamma on `batches` (interleaved); one `Measurement` per
    gamma.

    `drafts[i]` drafts for `batches[i]` (the same model, or synthetic drafts with distinct seeds).
    `options` (a `MeasureOptions`) says how; `fields` (its fields by name) replace its values or,
    without `options`, make it: `measure(target, drafts, batches, sampling=..., gammas=...,
    costs=...)`. `costs` is `costs.measure_costs`' result (c and the verify cost of each gamma).
    With `calibration` batches the decode-loop cost model is fitted from their timings and each
    measurement gets its prediction.
    """
    o = MeasureOptions(**fields) if options is None else dataclasses.replace(options, **fields)
    if o.tree is not None and list(o.gammas) != [len(o.tree)]:
        raise ValueError(f"tree={tuple(o.tree)} is measured alone: gammas must be "
                         f"[{len(o.tree)}], got {list(o.gammas)}.")
    other_baselines = dict(o.other_baselines or {})
    programs = _programs(target, drafts, batches, o, other_baselines)
    first, times, outputs = costs_lib.interleaved(
        programs, o.repeats,
        progress=f"batch {batches[0].shape[0]}, T={o.sampling.temperature:g}: timing")
    loop_costs, loop_error = None, None
    if o.calibration:
        try:
            loop_costs = costs_lib.fit_loop_costs(times, outputs, o.gammas)
        except ValueError as e:  # e.g. no calibration sequence ended before max_decode_len
            loop_error = str(e)

    def timing(name) -> Timing:
        return Timing(tuple(times[name]), first[name])

    baseline = timing("baseline")
    base_tokens = int(sum(np.asarray(r.lengths).sum() for r in outputs["baseline"]))
    base_rounds = [int(r.stats.rounds) for r in outputs["baseline"]]
    tree = None if o.tree is None else tuple(o.tree)
    results = []
    for g in o.gammas:
        stats = stats_lib.merge_stats([r.stats for r in outputs[g]])
        result = Measurement(
            sampling=o.sampling, batch_size=int(batches[0].shape[0]), gamma=g,
            max_decode_len=o.max_decode_len, baseline=baseline, speculative=timing(g),
            baseline_tokens=base_tokens, stats=stats, c=costs.c,
            verify_cost=costs.verify_cost[g] if tree is None
            else costs.verify_curve()(theory.tree_nodes(tree)),
            loop_error=loop_error, tree=tree,
            other_baselines={name: timing(("baseline", name)) for name in other_baselines})
        if loop_costs is not None and math.isfinite(result.alpha):
            walltime = costs_lib.predict_walltime(
                result.alpha, g, loop_costs, base_rounds,
                [int(np.max(r.lengths)) for r in outputs[g]])
            result = dataclasses.replace(result, loop=LoopPrediction(
                calibration_sequences=loop_costs.calibration_sequences,
                baseline=loop_costs.baseline, speculative=loop_costs.speculative[g],
                walltime=walltime))
        results.append(result)
    return results


def _programs(target, drafts, batches, o: MeasureOptions, other_baselines) -> dict:
    """Every program `measure` times: the baseline, each gamma, the calibration decodes and the
    other baselines."""
    setting = (() if o.tree is None else ("constant", None, tuple(o.tree)))
    programs = costs_lib.decode_programs(
        target, drafts, batches, {g: (g, o.draft_confidence, *setting) for g in o.gammas},
        sampling=o.sampling, max_decode_len=o.max_decode_len, lenience=o.lenience, seed=o.seed)
    programs.update(costs_lib.calibration_programs(
        target, drafts[0], o.calibration, o.gammas, sampling=o.sampling,
        max_decode_len=(o.max_decode_len if o.calibration_lengths is None
                        else o.calibration_lengths),
        lenience=o.lenience, draft_confidence=o.draft_confidence, seed=o.seed, tree=o.tree))
    for name, model in other_baselines.items():
        programs[("baseline", name)] = costs_lib.decode_programs(
            model, drafts, batches, {}, sampling=o.sampling, max_decode_len=o.max_decode_len,
            seed=o.seed)["baseline"]
    return programs
