"""GAMMA = 'auto': speculate or not, and how, timed on the run's first inputs.

`choose_speculation` times the baseline (autoregressive decoding), the chain at a few gammas,
a block draft's blocks and the chooser's tree on the run's first batches, through the one
timing engine (`costs.interleaved`), and picks the fastest; no speculation is one of the
choices. infer and Table 2 rows call it when GAMMA is 'auto'.

Before any speculative program compiles, a gate (`speculation_gate`) asks whether speculation
can pay at all here: the baseline decodes the slice once (its results are the run's; its
compilation is subtracted, `costs.first_call`), the target's verify of gamma + 1 tokens is timed
at the run's batch size, and the i.i.d. model's rounds for the slice's rows (a batch waits for
its slowest row) bound every speculative candidate's speedup from above, drafting free (alpha:
the draft's measured rate, e.g. its model card's; 1.0 when unknown, a perfect draft). Where the
bound is under `min_speedup` (a large batch, where verifying gamma + 1 tokens costs nearly
gamma + 1 steps) the baseline runs, and the calibration cost one small compile.

Calibration is spent only where it can pay back. When the run's length is known
(`SpeculationSearch.run_batches`), the rest of the run at the baseline's speed is what any
choice can save from; compiling a speculative program costs at least what the baseline's compile
cost (it holds the target's encoder, decoder and sampling too, and the draft besides), and each
later stage at least one compile per program it adds (the probe's, measured). A stage runs only
if the most it could save, the rest of the run from the best speed so far down to the gate's
bound, exceeds that, and if its compiles and decodes keep the calibration after the gate within
1/`CALIBRATION_SHARE` of the rest of the run at the baseline's speed (the slice itself is at
most that share of the run): a short run (a few sentences at batch 1) runs the baseline without
compiling any speculative program; a long one times every candidate. The choice's `notes` say
which stages were left out and why.

Where the run can repay a compile but no probe fits that budget (batch 1, a few hundred
examples), a prior decides instead of the baseline (`speculation_prior`): Theorem 3.8's model at
the draft's card alpha and its timed single-call cost picks the chain's gamma, that program
decodes the slice once (its results are the run's), and the baseline runs only if it was
measured slower there.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from speculative.decode import drafters
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.measure import prior as prior_lib
from speculative.measure.costs import interleaved

AUTO = "auto"  # the GAMMA that chooses (infer, Table 2 rows)
CHAIN_GAMMAS = (2, 4, 6)  # the chain's gammas `choose_speculation` times by default
CALIBRATION_ROWS = 8  # rows of the calibration slice: ceil(8 / B) batches of the run's B ...
CALIBRATION_SHARE = 8  # ... but at most 1/8 of the run's batches (at least one)


def calibration_batches(num_batches: int, batch_size: int) -> int:
    """How many of a run's first batches `choose_speculation` times: enough for
    `CALIBRATION_ROWS` rows (acceptance varies by sentence), at most 1/`CALIBRATION_SHARE` of
    the run (every candidate decodes the slice at least twice), and at least one batch."""
    wanted = -(-CALIBRATION_ROWS // batch_size)
    return max(1, min(wanted, num_batches // CALIBRATION_SHARE, num_batches))


@dataclasses.dataclass(frozen=True)
class SpeculationSearch:
    """How `choose_speculation` decodes and times its candidates.

    Attributes:
      sampling: the run's sampling (every candidate decodes under it).
      max_decode_len: the run's N (the programs compiled are the run's own).
      lenience: speculative_decode's lenience (1 = exact; token trees need 1).
      gammas: the chain's gammas (and the block draft's, capped at its `max_gamma`).
      repeats: interleaved timed rounds after each program's first (compiling) call.
      seed: batch i of the slice decodes with fold_in(PRNGKey(seed), i), as the run's batch i,
        so the chosen program's first-call results are the run's results for those batches.
      min_speedup: a speculative candidate runs only if it beat the baseline by this factor.
      alpha: the draft's acceptance rate for the gate (e.g. its model card's at this
        temperature); None: 1.0, so the gate closes only where even a perfect draft would lose.
      gate: run the gate first (`speculation_gate`); False times the candidates directly.
      run_batches: the run's batches, the slice's included; with it a stage runs only if it can
        pay back its compiles (module docstring). None: unknown, every stage runs.
      prior: where the gate says speculation pays but the calibration budget leaves no time to
        time the candidates, decide from the prior (`speculation_prior`: Theorem 3.8 at
        `alpha`, which must be known) and check it on the slice, instead of keeping the
        baseline. False: keep the baseline there.
    """

    sampling: SamplingConfig
    max_decode_len: int
    lenience: float = 1.0
    gammas: Tuple[int, ...] = CHAIN_GAMMAS
    repeats: int = 1
    seed: int = 0
    min_speedup: float = 1.0
    alpha: Optional[float] = None
    gate: bool = True
    run_batches: Optional[int] = None
    prior: bool = True

    def __post_init__(self):
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"SpeculationSearch alpha={self.alpha!r}: give the draft's "
                             "acceptance rate in [0, 1], or None (1.0, a perfect draft).")
        if self.run_batches is not None and (isinstance(self.run_batches, bool) or not isinstance(
                self.run_batches, (int, np.integer)) or self.run_batches < 1):
            raise ValueError(f"SpeculationSearch run_batches={self.run_batches!r}: give the "
                             "run's number of batches (an int >= 1), or None when unknown.")


@dataclasses.dataclass(frozen=True)
class SpeculationGate:
    """Stage 0 of `choose_speculation`: an upper bound on any speculative candidate's speedup.

    Attributes:
      alpha: the acceptance rate the bound assumes (`SpeculationSearch.alpha`, else 1.0).
      gamma: the smallest gamma searched (the cheapest round; at a batch where the verify is
        compute-bound a larger gamma costs proportionally more and gains less).
      step_s: the baseline's seconds per decode step on the slice (compilation excluded).
      verify_cost: the target's extend of gamma + 1 tokens per row, in baseline steps; 1.0 (the
        least a verify costs) where it was not timed (`verify_timed` False: the run is too
        short to repay a speculative compile, or to fit a probe in its calibration budget,
        even so).
      steps: the baseline's decode steps on the slice.
      rounds: the expected rounds of the slice at `gamma` (`theory.expected_batch_rounds`: each
        batch until its slowest row is done).
      bound: steps / (rounds * verify_cost): no candidate at `gamma` is faster, even with free
        drafting (`speculation_gate`).
      open: whether the bound reached `min_speedup`, the run can repay a compile (`pays`) and
        the least probe fits the calibration budget (`fits`); the candidates are then timed.
      seconds: the gate's walltime (the baseline's decode included).
      max_bound: the bound over every gamma searched, each priced at `verify_cost` (a wider
        verify never costs less): what the payback rule may hope for.
      compile_s: the baseline's compile seconds: the least a speculative program's costs.
      remaining_s: the rest of the run (after the slice) at the baseline's speed; None when
        the run's length is unknown.
      pays: whether the most speculation could save of `remaining_s` (down to `max_bound`)
        exceeds `compile_s` (True when `remaining_s` is None).
      fits: whether the least a probe costs (`stage_cost(1, compile_s)`) is within the
        calibration budget (`budget_s`; True when `remaining_s` is None).
      verify_timed: whether `verify_cost` was timed.
      perfect_bound: the bound of a perfect draft (alpha 1) at the deepest gamma searched: what
        a token tree (which accepts more per round than the chain's alpha) may hope for.
    """

    alpha: float
    gamma: int
    step_s: float
    verify_cost: float
    steps: int
    rounds: float
    bound: float
    open: bool
    seconds: float
    max_bound: float = float("inf")
    compile_s: float = 0.0
    remaining_s: Optional[float] = None
    pays: bool = True
    fits: bool = True
    verify_timed: bool = True
    perfect_bound: float = float("inf")

    def saving(self, speedup: float, bound: Optional[float] = None) -> float:
        """The most seconds of the rest of the run a stage could save by going from `speedup`
        (the best so far; 1.0 the baseline) to `bound` (default `max_bound`); inf when the
        run's length is unknown."""
        if self.remaining_s is None:
            return float("inf")
        top = self.max_bound if bound is None else bound
        return max(self.remaining_s * (1.0 / max(speedup, 1e-12) - 1.0 / max(top, 1e-12)), 0.0)

    @property
    def budget_s(self) -> Optional[float]:
        """What calibration after the gate may spend: 1/`CALIBRATION_SHARE` of `remaining_s`
        (None when the run's length is unknown)."""
        return None if self.remaining_s is None else self.remaining_s / CALIBRATION_SHARE

    def stage_cost(self, programs: int, compile_s: float) -> float:
        """The least a stage timing `programs` programs costs: their compiles (`compile_s` in
        all) and decodes of the slice at the baseline's speed, two per program (the first call
        and a timed one) and the baseline's timed one."""
        return compile_s + (2 * programs + 1) * self.step_s * self.steps

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SpeculationCandidate:
    """One timed way of decoding: `kind` 'baseline' (autoregressive), 'chain', 'block' (one draft
    call per round) or 'tree', with its gamma (a tree's depth) and branching.

    Attributes:
      seconds: median seconds of the slice over the timed rounds.
      first_call_s: the first call's seconds (compilation included).
      tokens: tokens generated on the slice (by the first call).
      speedup: the baseline's ms/token over this one's, timed in the same rounds.
      tokens_per_target_call: generated tokens per target call on the slice.
      stage: the timing stage (`choose_speculation`); its baseline was timed in it again.
    """

    kind: str
    gamma: Optional[int]
    tree: Optional[Tuple[int, ...]]
    seconds: float
    first_call_s: float
    tokens: int
    speedup: float
    tokens_per_target_call: float
    stage: int = 1

    @property
    def name(self) -> str:
        if not self.speculative:
            return "baseline"
        return f"{self.kind} g{self.gamma}" if self.tree is None else f"tree {self.tree}"

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / max(self.tokens, 1)

    @property
    def speculative(self) -> bool:
        return self.gamma is not None  # the baseline drafts nothing

    def to_json(self) -> Dict[str, Any]:
        return {**dataclasses.asdict(self), "tree": list(self.tree) if self.tree else None,
                "name": self.name, "ms_per_token": self.ms_per_token}


@dataclasses.dataclass(frozen=True)
class SpeculationChoice:
    """What `choose_speculation` timed and picked.

    Attributes:
      best: the candidate to run (the baseline unless a speculative one beat it by
        `min_speedup`).
      candidates: every candidate timed, in the order timed.
      batch_size, batches: the slice (`batches` batches of `batch_size` rows).
      repeats: the timed rounds.
      seconds: the calibration's walltime (compilations and every decode included).
      results: the best program's results for the slice's batches (the run's first results;
        not in the JSON).
      gate: stage 0's bound and costs (None when `search.gate` is False).
      notes: the stages not timed, and why (they could not repay their compiles, or would
        have taken calibration past its budget).
      prior: the prior's choice and its check, where it decided (`prior.SpeculationPrior`).
    """

    best: SpeculationCandidate
    candidates: Tuple[SpeculationCandidate, ...]
    batch_size: int
    batches: int
    repeats: int
    seconds: float
    results: Tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)
    gate: Optional[SpeculationGate] = None
    notes: Tuple[str, ...] = ()
    prior: Optional[prior_lib.SpeculationPrior] = None

    def to_json(self) -> Dict[str, Any]:
        return {"choice": self.best.name, "kind": self.best.kind, "gamma": self.best.gamma,
                "tree": list(self.best.tree) if self.best.tree else None,
                "speedup": self.best.speedup, "batch_size": self.batch_size,
                "calibration_batches": self.batches, "repeats": self.repeats,
                "calibration_seconds": self.seconds,
                "gate": self.gate.to_json() if self.gate else None, "notes": list(self.notes),
                "prior": self.prior.to_json() if self.prior else None,
                "candidates": [c.to_json() for c in self.candidates]}

    def line(self) -> str:
        """The choice and why, e.g. 'gamma auto: baseline 12.1 ms/token, chain g3 9.8, g5 9.1
        -> chain gamma 5 (1.33x)'."""
        order = {}  # each kind where it was first timed: the drafters' own order
        for c in self.candidates:
            order.setdefault(c.kind, len(order))
        shown = [self.candidates[0]] + sorted(
            (c for c in self.candidates if c.speculative),
            key=lambda c: (order[c.kind], c.gamma or 0))
        parts, kind = [], None
        for c in shown:  # the later stages' baselines (the same program again) left out
            label = c.name if c.kind != kind or c.tree is not None else f"g{c.gamma}"
            unit = " ms/token" if not parts else ""
            parts.append(f"{label} {c.ms_per_token:.3g}{unit}")
            kind = c.kind
        best = self.best
        verdict = ("no speculation (the baseline was fastest)" if not best.speculative
                   else f"{best.name.replace(' g', ' gamma ')} ({best.speedup:.2f}x)")
        gate = self.gate
        if gate is not None and not gate.pays:
            verdict = (f"no speculation: the rest of the run ({gate.remaining_s:.1f} s at the "
                       f"baseline's speed) could save at most {gate.saving(1.0):.1f} s (at most "
                       f"{gate.max_bound:.2f}x), less than compiling a speculative program "
                       f"(at least {gate.compile_s:.1f} s, the baseline's compile)")
        elif gate is not None and not gate.fits:
            verdict = (f"no speculation: the least probe (~{gate.stage_cost(1, gate.compile_s):.1f}"
                       f" s: a compile and three decodes of the slice) would take calibration "
                       f"past 1/{CALIBRATION_SHARE} of the rest of the run "
                       f"({gate.budget_s:.1f} s)")
        elif gate is not None and not gate.open:
            verdict = (f"no speculation: a round verifies {gate.gamma + 1} tokens for "
                       f"{gate.verify_cost:.2f} steps, and at alpha {gate.alpha:.2f} the "
                       f"batches need {gate.rounds:.0f} rounds for {gate.steps} steps: at most "
                       f"{gate.bound:.2f}x even with free drafting")
        if self.prior is not None:
            verdict = self.prior.verdict() + (f" ({'; '.join(self.notes)})" if self.notes else "")
        elif self.notes and len(self.candidates) == 1 and gate is not None and gate.open:
            verdict = f"no speculation: {self.notes[0]}"
        elif self.notes:
            verdict += f" ({'; '.join(self.notes)})"
        return (f"gamma auto: {', '.join(parts)} on {self.batches} x {self.batch_size} rows "
                f"(calibration {self.seconds:.1f} s) -> {verdict}")


def speculation_drafter(draft, kind: str, gamma: int, tree: Optional[Tuple[int, ...]] = None):
    """The drafter a candidate's record names (`drafters.from_record`: the draft's own drafter
    answers; e.g. a block draft's 'chain' is the target-aware chain it also is)."""
    return drafters.from_record(draft, kind, gamma, tree)


def speculation_families(draft, search: SpeculationSearch):
    """The drafters timed in the first stages, in families (`drafters.calibration_families`:
    the draft's drafter lists them; a drafter object is its own); gammas above
    max_decode_len are left out."""
    return drafters.calibration_families(draft, search.gammas, search.max_decode_len)


def speculation_candidates(draft, search: SpeculationSearch) -> List[Tuple[str, int]]:
    """`[(kind, gamma)]` of `speculation_families`, in order."""
    return [drafters.record(d)[:2] for family in speculation_families(draft, search)
            for d in family]


def _speculation_programs(target, batches, search: SpeculationSearch,
                          drafters_by_name: Dict[Any, Any]) -> Dict[Any, Callable[[], Any]]:
    """Thunks decoding every batch of the slice: the baseline for a drafter of None."""
    keys = [jax.random.fold_in(jax.random.PRNGKey(search.seed), i) for i in range(len(batches))]

    def program(drafter):
        if drafter is None:
            return lambda: [decoding.autoregressive_decode(
                target, x, rng=k, sampling=search.sampling,
                max_decode_len=search.max_decode_len) for x, k in zip(batches, keys)]
        return lambda: [decoding.speculative_decode(
            target, drafter, x, rng=k, gamma=None, sampling=search.sampling,
            max_decode_len=search.max_decode_len, lenience=search.lenience)
            for x, k in zip(batches, keys)]

    return {name: program(d) for name, d in drafters_by_name.items()}


def _time_candidates(target, draft, batches, search: SpeculationSearch,
                     shapes: Sequence[Any],
                     timer: Optional[Callable] = None, stage: int = 1,
                     baseline_results: Optional[Sequence[Any]] = None):
    """`(candidates, results)`: the baseline and each drafter of `shapes` (named by
    `drafters.record`: kind, gamma, tree) timed
    in `search.repeats` interleaved rounds on `batches` (`timer`: `interleaved` unless a test
    gives another), and each one's first-call results. `baseline_results`: the baseline's
    decode of `batches` already made (the gate's), returned as its first call instead of
    decoding the slice again."""
    timer = timer or interleaved
    named = {("baseline", None, None): None}
    named.update({drafters.record(d): d for d in shapes})
    programs = _speculation_programs(target, batches, search, named)
    if baseline_results is not None:
        programs[("baseline", None, None)] = _first_given(programs[("baseline", None, None)],
                                                          list(baseline_results))
    first, times, outputs = timer(programs, search.repeats)
    out, baseline_ms = [], None
    for name in named:  # the baseline first
        out.append(_candidate(name, outputs[name], float(np.median(times[name])),
                              float(first[name]), baseline_ms, stage))
        baseline_ms = out[0].ms_per_token
    return out, {c: outputs[k] for c, k in zip(out, named)}


def _first_given(program: Callable[[], Any], results: Any) -> Callable[[], Any]:
    """`program`, whose first call returns `results` (made before) instead of running."""
    given = [results]
    return lambda: given.pop() if given else program()


def _candidate(name, results, seconds: float, first_call_s: float,
               baseline_ms: Optional[float], stage: int) -> SpeculationCandidate:
    """A timed way of decoding from its results on the slice (`baseline_ms` None: it is the
    baseline)."""
    tokens = int(sum(int(np.asarray(r.lengths).sum()) for r in results))
    calls = sum(float(np.sum(np.asarray(r.stats.target_calls))) for r in results)
    ms = 1000.0 * seconds / max(tokens, 1)
    speedup = 1.0 if baseline_ms is None else (baseline_ms / ms if ms > 0 else 0.0)
    return SpeculationCandidate(
        kind=name[0], gamma=name[1], tree=name[2], seconds=seconds, first_call_s=first_call_s,
        tokens=tokens, speedup=speedup, tokens_per_target_call=tokens / calls if calls else 0.0,
        stage=stage)


GATE_TIMING_S = 0.1  # the gate times its verify program for about this long (>= 2 steps)


def speculation_gate(target, batches: Sequence[Any], search: SpeculationSearch,
                     gammas: Sequence[int]):
    """Stage 0 of `choose_speculation`: `(gate, the baseline's candidate, its results)`.

    The baseline decodes `batches` once (its results are the run's; its compilation is not
    timed, `costs.first_call`): its seconds per decode step and each row's length. The target's
    extend of `gamma + 1` tokens (gamma = min(gammas)) at the slice's batch size, on a cache of
    zeros, is compiled and timed (about `GATE_TIMING_S`, compilation subtracted): the verify
    cost in those steps. A round verifies at least gamma + 1 tokens, and a batch runs until its
    slowest row is done (`theory.expected_batch_rounds` at the rows' lengths under the i.i.d.
    model), so even with free drafting no candidate at `gamma` beats

        bound = baseline steps / (expected rounds * verify_cost)

    (the draft calls, the kernel, the commits and the model calls' extra cost inside the loop
    only lower it). One compile, the verify's: the draft is not even loaded into a program.

    With the run's length (`search.run_batches`) the gate also asks whether speculation can
    repay a compile (`SpeculationGate.pays`) and whether the least probe fits the calibration
    budget (`fits`): first with every verify at its least, one step (then, on a run too short
    even for that, the verify is not compiled either), then at the verify cost timed."""
    start = time.perf_counter()
    gamma = min(gammas)
    program = _speculation_programs(target, batches, search, {"baseline": None})["baseline"]
    run_s, compile_s, results = costs_lib.first_call(program)
    steps = sum(int(np.asarray(r.stats.rounds)) for r in results)
    step_s = run_s / max(steps, 1)
    alpha = 1.0 if search.alpha is None else float(search.alpha)
    lengths = [np.asarray(r.lengths) for r in results]
    rounds = {g: sum(theory.expected_batch_rounds(alpha, g, n) for n in lengths)
              for g in sorted(set(gammas))}
    perfect = sum(theory.expected_batch_rounds(1.0, max(gammas), n) for n in lengths)
    remaining_s = (None if search.run_batches is None else
                   run_s / len(batches) * max(int(search.run_batches) - len(batches), 0))

    def gate(verify_cost: float, timed: bool) -> SpeculationGate:
        bounds = {g: steps / max(r * verify_cost, 1e-12) for g, r in rounds.items()}
        made = SpeculationGate(
            alpha=alpha, gamma=int(gamma), step_s=step_s, verify_cost=verify_cost, steps=steps,
            rounds=float(rounds[gamma]), bound=float(bounds[gamma]), open=False,
            seconds=time.perf_counter() - start, max_bound=float(max(bounds.values())),
            compile_s=float(compile_s), remaining_s=remaining_s, verify_timed=timed,
            perfect_bound=float(steps / max(perfect * verify_cost, 1e-12)))
        pays = made.saving(1.0) > compile_s
        fits = remaining_s is None or made.stage_cost(1, compile_s) <= made.budget_s
        return dataclasses.replace(made, pays=pays, fits=fits,
                                   open=pays and fits and made.bound >= search.min_speedup)

    baseline = _candidate(("baseline", None, None), results, run_s, run_s + compile_s, None,
                          stage=0)
    least = gate(1.0, timed=False)
    if not (least.pays and least.fits):  # too short a run: nothing more compiles
        return least, baseline, tuple(results)
    verify_cost = timed_verify_cost(target, batches[0], gamma, search, step_s)
    return gate(verify_cost, timed=True), baseline, tuple(results)


def timed_verify_cost(target, x, gamma: int, search: SpeculationSearch, step_s: float) -> float:
    """The target's extend of `gamma + 1` tokens per row of `x` (a cache of zeros, about
    `GATE_TIMING_S`, compilation subtracted) in baseline decode steps of `step_s` seconds."""
    num = int(np.clip(np.ceil(GATE_TIMING_S / max(step_s, 1e-9)), 2, 64))
    x = np.asarray(x)
    verify = costs_lib.extend_program(
        target, x, gamma + 1, num_steps=num, seed=search.seed, zeros=True,
        cache_len=target.prefix_length(x.shape[1]) + search.max_decode_len + gamma + 2)
    verify_s = costs_lib.first_call(verify)[0]  # compilation subtracted
    return verify_s / num / step_s if step_s > 0 else float("inf")


def prior_applies(gate: Optional[SpeculationGate], search: SpeculationSearch) -> bool:
    """Whether the prior decides (`prior.SpeculationPrior`): the draft's alpha is known, the run can
    repay a speculative compile and the gate's bound reaches `min_speedup`."""
    return (gate is not None and search.prior and search.alpha is not None and gate.pays
            and gate.bound >= search.min_speedup)


def speculation_prior(target, draft, batches: Sequence[Any], search: SpeculationSearch,
                      gate: SpeculationGate, baseline: SpeculationCandidate,
                      base_results: Sequence[Any], families) -> SpeculationChoice:
    """The choice where the gate says speculation pays but no candidate can be timed
    (`prior.SpeculationPrior`): the chain's gamma Theorem 3.8's model favours
    (`prior.predicted_speedups` at the card's alpha, the draft's timed step cost and the
    target's verify timed at the deepest gamma, `prior.verify_costs`); if it predicts at least
    `min_speedup`, that program decodes the slice once (compilation subtracted, its results the
    run's) and runs unless it measured under `min_speedup` by more than `prior.PRIOR_NOISE`
    against the gate's baseline; else the baseline, with the gate's results."""
    start = time.perf_counter()
    c = prior_lib.draft_step_cost(target, draft, batches[0], seed=search.seed,
                                  max_decode_len=search.max_decode_len, step_s=gate.step_s)
    chain = {d.gamma: d for d in families[0]}  # the first family: the draft's chain
    gammas = sorted(chain)
    verify = prior_lib.verify_costs(  # one compile: the verify at the deepest gamma, timed
        timed_verify_cost(target, batches[0], gammas[-1], search, gate.step_s), gammas)
    predicted = prior_lib.predicted_speedups(
        alpha=gate.alpha, c=c, verify_cost=verify, steps=gate.steps,
        lengths=[r.lengths for r in base_results], gammas=gammas)
    gamma = max(predicted, key=lambda g: (predicted[g], -g))
    tried, results, measured = None, (), None
    if predicted[gamma] >= search.min_speedup:
        name = drafters.record(chain[gamma])
        program = _speculation_programs(target, batches, search, {name: chain[gamma]})[name]
        run_s, compile_s, results = costs_lib.first_call(program)
        tried = _candidate(name, results, run_s, run_s + compile_s, baseline.ms_per_token, 1)
        measured = float(tried.speedup)
    kept = measured is not None and measured >= search.min_speedup * (1 - prior_lib.PRIOR_NOISE)
    prior = prior_lib.SpeculationPrior(
        alpha=gate.alpha, c=float(c), verify_cost=float(verify[gamma]), gamma=int(gamma),
        predicted=float(predicted[gamma]), measured=measured, kept=kept,
        seconds=time.perf_counter() - start)
    return SpeculationChoice(
        best=tried if kept else baseline,
        candidates=(baseline,) + ((tried,) if tried is not None else ()),
        batch_size=int(np.shape(batches[0])[0]), batches=len(batches), repeats=0,
        seconds=0.0, results=tuple(results) if kept else tuple(base_results), gate=gate,
        prior=prior)


class _Budget:
    """What `choose_speculation`'s later stages may spend (module docstring): a stage runs only
    if it can repay its compiles and fits 1/`CALIBRATION_SHARE` of the rest of the run, counted
    from the gate's end; `notes` says which did not, and why."""

    def __init__(self, gate: Optional[SpeculationGate], candidates: List[SpeculationCandidate]):
        self.gate, self.candidates, self.notes = gate, candidates, []
        self.opened = time.perf_counter()
        self.over_budget = False  # a stage was refused for time, not for its payback

    def allows(self, label: str, programs: int, bound: float, speedup: float) -> bool:
        """Whether a stage compiling `programs` programs can repay them (from `speedup`, the
        best so far, to `bound`) and fits the budget; always without a gate or the run's
        length."""
        gate = self.gate
        if gate is None or gate.remaining_s is None:
            return True
        compiled = [c.first_call_s - c.seconds for c in self.candidates if c.speculative]
        compile_s = programs * max(compiled + [gate.compile_s])
        cost, budget = gate.stage_cost(programs, compile_s), gate.budget_s
        saving = gate.saving(speedup, bound)
        if saving <= compile_s:
            self.notes.append(f"{label} not timed: it could save at most {saving:.1f} s, less "
                              f"than its compiles (~{compile_s:.1f} s)")
        elif time.perf_counter() - self.opened + cost > budget:
            self.over_budget = True
            self.notes.append(f"{label} not timed: its ~{cost:.1f} s would take calibration "
                              f"past 1/{CALIBRATION_SHARE} of the rest of the run "
                              f"({budget:.1f} s)")
        else:
            return True
        return False


def choose_speculation(target, draft, batches: Sequence[Any], search: SpeculationSearch, *,
                       tree_for: Optional[Callable[[SpeculationCandidate],
                                                   Optional[Tuple[int, ...]]]] = None,
                       timer: Optional[Callable] = None) -> SpeculationChoice:
    """Which way of decoding is fastest here: the baseline (no speculation), the chain at
    `search.gammas`, a block draft's block (the draft's drafter lists them:
    `drafters.calibration_families`) and, where speculation paid and `tree_for` proposes one,
    a token tree; timed on `batches` (the run's first inputs
    at its batch size) by the one timing engine (`interleaved`: compiled first, then
    `search.repeats` rounds in a rotated order), compared by milliseconds per generated token.

    In stages, each timed against the baseline in its own rounds, so that where speculation
    does not pay (a large batch) little is spent finding that out:

      0. the gate (`speculation_gate`, unless `search.gate` is False);
      1. the probe: each kind (chain, block) at its smallest gamma, the cheapest round;
      2. if a probe beat the baseline by `search.min_speedup`: the other gammas;
      3. if speculation still paid and `tree_for(best)` (e.g. `acceptance.choose_tree`'s
         tree; None for the chain) names a branching tree: that tree.

    With the run's length known (`search.run_batches`), stages 2 and 3 also have to be able to
    pay back their compiles (`SpeculationGate.saving` from the best speed so far to the gate's
    `max_bound`, or `perfect_bound` for a tree, against one compile like the probe's per program,
    four for the tree: its pricing and its program) and keep calibration within its budget
    (`_Budget`); the probe too must fit the budget. `notes` says what was left out.

    The fastest speculative candidate runs when it beat its baseline by `search.min_speedup`,
    else the baseline. The chosen program's first-call results are the run's results for these
    batches (same inputs, same keys), so the run need not decode them again.

    It is long because its stages share the gate, the budget and the results found so far,
    which its small closures (`stage`, `baseline_only`, `from_prior`) keep in one place.
    """
    if not batches:
        raise ValueError("choose_speculation needs at least one calibration batch.")
    start = time.perf_counter()
    families = speculation_families(draft, search)
    shapes = [d for family in families for d in family]
    gate = None

    def baseline_only(notes=()) -> SpeculationChoice:
        """The gate's baseline runs (its decode of the slice is the run's), nothing timed."""
        return SpeculationChoice(
            best=baseline, candidates=(baseline,), batch_size=int(np.shape(batches[0])[0]),
            batches=len(batches), repeats=0, seconds=time.perf_counter() - start,
            results=base_results, gate=gate, notes=tuple(notes))

    def from_prior(notes=()) -> SpeculationChoice:
        """No time to time candidates: the prior decides, checked on the slice."""
        return dataclasses.replace(
            speculation_prior(target, draft, batches, search, gate, baseline, base_results,
                              families), notes=tuple(notes), seconds=time.perf_counter() - start)

    if search.gate and shapes:
        gate, baseline, base_results = speculation_gate(target, batches, search,
                                                        [d.gamma for d in shapes])
        if not gate.open:
            return from_prior() if prior_applies(gate, search) else baseline_only()
    probes = [family[0] for family in families]  # each family at its smallest gamma
    candidates, results, stages = [], {}, []
    budget = _Budget(gate, candidates)

    def stage(stage_shapes) -> Optional[SpeculationCandidate]:
        timed, timed_results = _time_candidates(  # stage 1's baseline: the gate's decode
            target, draft, batches, search, stage_shapes, timer, stage=1 + len(stages),
            baseline_results=None if stages or gate is None else base_results)
        stages.append(stage_shapes)
        candidates.extend(timed)
        results.update(timed_results)
        best = max((c for c in candidates if c.speculative), key=lambda c: c.speedup)
        return best if best.speedup >= search.min_speedup else None

    if gate is not None and not budget.allows("the probe", len(probes), gate.max_bound, 1.0):
        if budget.over_budget and prior_applies(gate, search):
            return from_prior(budget.notes)
        return baseline_only(budget.notes)
    paid = stage(probes)
    rest = [s for s in shapes if all(s is not p for p in probes)]
    if paid is not None and rest and budget.allows(
            "the other gammas", len(rest), gate.max_bound if gate else 0.0, paid.speedup):
        paid = stage(rest)
    # The tree stage compiles about four programs: its pricing (the verify at several widths,
    # the acceptance program) and the tree's own.
    tree = (tree_for(paid) if paid is not None and tree_for is not None and budget.allows(
        "a token tree", 4, gate.perfect_bound if gate else 0.0, paid.speedup) else None)
    if tree and any(b > 1 for b in tree):  # a branching tree, not the chain
        paid = stage([drafters.from_record(draft, "tree", len(tree), tuple(tree))])
    best = paid or candidates[0]
    return SpeculationChoice(
        best=best, candidates=tuple(candidates), batch_size=int(np.shape(batches[0])[0]),
        batches=len(batches), repeats=search.repeats, seconds=time.perf_counter() - start,
        results=tuple(results[best]), gate=gate, notes=tuple(budget.notes))
