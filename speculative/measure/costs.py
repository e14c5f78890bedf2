"""Timing and the cost models that predict speculative decoding's walltime.

Two predictions of the speedup of `decoding.speculative_decode` over `autoregressive_decode`:

* Theorem 3.8 (`measure_costs`): c = T(draft extend of 1 token) / T(target extend of 1 token)
  and verify_cost(gamma) = T(target extend of gamma + 1 tokens) / T(target extend of 1 token),
  each timed as a jitted `lax.fori_loop` of `extend` calls, then `theory.speedup`. It prices a
  round as gamma draft calls + one verify call, each timed alone.
* The decode-loop cost model (`calibration_programs`, `fit_loop_costs`, `predict_walltime`).
  The real loops also pay the acceptance kernel, commits and rewinds, the encoder (or prompt
  prefill) once per sequence, and a model call compiled inside the loop may cost more than in a
  bare loop of calls (20-50% more on XLA:CPU for the mini models). So the decode programs
  themselves are timed on calibration inputs (other sequences than the benchmarked ones), one
  call per sequence, and a least-squares line of time against the loop's iterations
  (`DecodeStats.rounds`) gives each program's start-up cost and its cost per iteration (one
  baseline step, one speculative round). The walltime of a set of sequences is then predicted
  from start-ups, baseline steps (one per token of the longest row) and the i.i.d. model's
  expected rounds (`theory.expected_rounds` at the measured alpha).

`interleaved` times several programs in rounds with a rotated order, so machine noise hits all of
them alike; `measure.measure` puts the calibration programs in the same rounds as the
decoders it measures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import contract, drafters
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory

Array = jax.Array


def _timed(fn: Callable[[], Any]):
    """(seconds, result) of one call, waiting for every output buffer."""
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    return time.perf_counter() - start, result


# JAX's monitoring events for the phases of a compilation (tracing, lowering, XLA's compile).
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


@dataclasses.dataclass
class _Compiles:
    seconds: float = 0.0


@contextlib.contextmanager
def compiling():
    """`with compiling() as c: ...`: `c.seconds` is what JAX spent tracing, lowering and
    compiling inside the block (its monitoring events), so a first call's run time is its
    walltime less `c.seconds` and it need not be called again to be timed."""
    got = _Compiles()

    def listener(event, duration, **_):
        if event in COMPILE_EVENTS:
            got.seconds += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield got
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def first_call(fn: Callable[[], Any]):
    """`(run seconds, compile seconds, result)` of one call that may compile: its walltime less
    the compilation inside it (`compiling`)."""
    with compiling() as c:
        seconds, result = _timed(fn)
    return max(seconds - c.seconds, 0.0), c.seconds, result


def spread(times: Sequence[float]) -> Dict[str, Any]:
    """Median, quartiles, min/max and mean of repeated timings (seconds)."""
    t = np.asarray(times, np.float64)
    return {"median_s": float(np.median(t)), "q25_s": float(np.percentile(t, 25)),
            "q75_s": float(np.percentile(t, 75)), "min_s": float(t.min()),
            "max_s": float(t.max()), "mean_s": float(t.mean()), "repeats_s": t.tolist()}


@functools.partial(contract.jit_by_class, static_argnames=("num_steps",))
def _extend_steps(model, state, tokens, *, num_steps: int):
    """`num_steps` extends of `tokens [B, K]` at one cache position (rewound after each)."""
    start = state.lengths

    def body(_, carry):
        state, acc = carry
        logits, state = model.extend(model.params, state, tokens)
        # Summing all logits keeps XLA from pruning any of the [B, K, V] work.
        return model.rewind(state, start), acc + jnp.sum(jnp.asarray(logits, jnp.float32))

    _, acc = jax.lax.fori_loop(0, num_steps, body, (state, jnp.zeros((), jnp.float32)))
    return acc


def interleaved(programs: Dict[Any, Callable[[], Any]], repeats: int,
                progress: Optional[str] = None):
    """Times each program's first call, then `repeats` rounds of every program in an order
    rotated per round. Returns (first-call seconds, per-program lists of seconds, outputs of the
    first calls). `progress`: a label for a tqdm bar over the rounds (None: no bar)."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    bar = tqdm(total=repeats + 1, desc=progress, unit="round", disable=progress is None)
    first, outputs = {}, {}
    for name, fn in programs.items():
        first[name], outputs[name] = _timed(fn)
    bar.update()
    times = {name: [] for name in programs}
    names = list(programs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(_timed(programs[name])[0])
        bar.update()
    bar.close()
    return first, times, outputs


def extend_program(model, inputs: np.ndarray, num_tokens: int, *, cache_len: int,
                    num_steps: int, seed: int, target=None,
                    zeros: bool = False) -> Callable[[], Any]:
    """A thunk running `num_steps` extends of `num_tokens` tokens per row (batch of `inputs`).
    A target-aware draft is initialised from `target`'s context and extends on its own
    hidden states (what each of its draft steps after the first costs). `zeros` (a model that
    does not read a target): the state is zeros of the shapes `init` gives (`jax.eval_shape`,
    nothing runs or compiles but the extends; an extend's cost does not depend on what the
    cache holds)."""
    reads_target = drafters.as_drafter(model, 1).reads_target  # the drafter knows
    if zeros and not reads_target:
        shapes = jax.eval_shape(lambda m, x: m.init(m.params, x, cache_len), model,
                                jnp.asarray(inputs))
        state = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    # jitted: one compile of the encoder (or prefill) instead of an op-by-op run
    elif reads_target:
        layers = tuple(model.feature_layers)
        state = jax.jit(lambda t, d, x: d.init(d.params, x, cache_len, context=t.context(
            t.init_for_draft(t.params, x, cache_len, layers))))(target, model, jnp.asarray(inputs))
    else:
        state = jax.jit(lambda m, x: m.init(m.params, x, cache_len))(model, jnp.asarray(inputs))
    state = jax.block_until_ready(state)
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(2, model.vocab_size, (inputs.shape[0], num_tokens)),
                         jnp.int32)
    return lambda: _extend_steps(model, state, tokens, num_steps=num_steps)


def _int_keys(d: Dict) -> Dict[int, float]:
    """JSON object keys (strings) back to the ints they were."""
    return {int(k): float(v) for k, v in d.items()}


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """The single-call costs of one batch (`measure_costs`) that Theorem 3.8 prices a round with.

    Attributes:
      batch_size: rows per call.
      target_step_s: median seconds of one target extend of 1 token per row.
      draft_step_s: median seconds of one draft extend of 1 token per row.
      target_verify_s: {gamma: median seconds of one target extend of gamma + 1 tokens}.
      min_c: c from the fastest rounds: a check on the medians on a shared machine
        (contention inflates medians, rarely minima).
      min_verify_cost: {gamma: the verify cost from the fastest rounds}.
      step_spread_s: {program: {"min", "q25", "q75", "max"}} seconds per step, programs named
        "target", "draft" and each gamma.
    """

    batch_size: int
    target_step_s: float
    draft_step_s: float
    target_verify_s: Dict[int, float]
    min_c: float
    min_verify_cost: Dict[int, float]
    step_spread_s: Dict[str, Dict[str, float]]

    @property
    def c(self) -> float:
        """T(draft step) / T(target step)."""
        return self.draft_step_s / self.target_step_s

    @property
    def verify_cost(self) -> Dict[int, float]:
        """{gamma: T(target on gamma + 1 tokens) / T(target step)}."""
        return {g: t / self.target_step_s for g, t in self.target_verify_s.items()}

    def verify_curve(self) -> Callable[[int], float]:
        """The verify cost of any number of drafted tokens (`cost_curve`; 0 tokens cost 1)."""
        return cost_curve({0: 1.0, **self.verify_cost})

    def to_json(self) -> Dict[str, Any]:
        return {"batch_size": self.batch_size, "target_step_s": self.target_step_s,
                "draft_step_s": self.draft_step_s, "c": self.c,
                "target_verify_s": dict(self.target_verify_s), "verify_cost": self.verify_cost,
                "from_min": {"c": self.min_c, "verify_cost": dict(self.min_verify_cost)},
                "step_spread_s": self.step_spread_s}

    @classmethod
    def assumed(cls, c: float, verify_cost: Dict[int, float], batch_size: int = 1) -> "StepCosts":
        """Costs given as ratios rather than timed (a target step of 1 s): to price a setting
        with, e.g., the paper's c or a hypothetical verify cost."""
        verify = {int(g): float(v) for g, v in verify_cost.items()}
        return cls(batch_size, 1.0, float(c), verify, float(c), verify, {})

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "StepCosts":
        """The inverse of `to_json` (a results file's costs, e.g. a resumed run's)."""
        return cls(batch_size=int(d["batch_size"]), target_step_s=float(d["target_step_s"]),
                   draft_step_s=float(d["draft_step_s"]),
                   target_verify_s=_int_keys(d["target_verify_s"]),
                   min_c=float(d["from_min"]["c"]),
                   min_verify_cost=_int_keys(d["from_min"]["verify_cost"]),
                   step_spread_s=d["step_spread_s"])


def measure_costs(target, draft, inputs: np.ndarray, gammas: Sequence[int], *,
                  max_decode_len: int, num_steps: int, repeats: int, seed: int) -> StepCosts:
    """c and verify_cost(gamma) for one batch (see the module docstring).

    The step programs (target on 1 token, draft on 1 token, target on gamma + 1 tokens for each
    gamma) are timed in interleaved rounds, like the decoders; each step time is the median
    over rounds divided by `num_steps`.
    """
    cache_len = max_decode_len + max(gammas) + 2
    kw = dict(num_steps=num_steps, seed=seed)
    t_len = target.prefix_length(inputs.shape[1]) + cache_len
    d_len = draft.prefix_length(inputs.shape[1]) + cache_len
    programs = {"target": extend_program(target, inputs, 1, cache_len=t_len, **kw),
                "draft": extend_program(draft, inputs, 1, cache_len=d_len, target=target,
                                         **kw)}
    for g in gammas:
        programs[g] = extend_program(target, inputs, g + 1, cache_len=t_len, **kw)
    _, times, _ = interleaved(programs, repeats)
    per_step = {name: np.asarray(t) / num_steps for name, t in times.items()}
    step = {name: float(np.median(t)) for name, t in per_step.items()}
    fastest = {name: float(t.min()) for name, t in per_step.items()}
    return StepCosts(
        batch_size=int(inputs.shape[0]), target_step_s=step["target"],
        draft_step_s=step["draft"], target_verify_s={g: step[g] for g in gammas},
        min_c=fastest["draft"] / fastest["target"],
        min_verify_cost={g: fastest[g] / fastest["target"] for g in gammas},
        step_spread_s={str(name): {"min": float(t.min()), "q25": float(np.percentile(t, 25)),
                                   "q75": float(np.percentile(t, 75)), "max": float(t.max())}
                       for name, t in per_step.items()})


def draft_row_costs(target, draft, inputs: np.ndarray, rows: Sequence[int], *, c: float,
                    max_decode_len: int, num_steps: int = 16, repeats: int = 5,
                    seed: int = 0) -> Dict[int, float]:
    """The draft's cost of one call on m rows per input row (a token tree's paths), for each m
    in `rows`, relative to one target step: c times its time over the one-row call's (timed in
    interleaved rounds). `c` comes from `measure_costs`."""
    cache_len = draft.prefix_length(inputs.shape[1]) + max_decode_len + 2
    rows = sorted(set(rows) | {1})
    programs = {m: extend_program(draft, np.repeat(inputs, m, 0), 1, cache_len=cache_len,
                                   num_steps=num_steps, seed=seed, target=target)
                for m in rows}
    _, times, _ = interleaved(programs, repeats)
    step = {m: float(np.median(t)) for m, t in times.items()}
    return {m: c * step[m] / step[1] for m in rows}


def cost_curve(points: Dict[int, float]) -> Callable[[int], float]:
    """Costs measured at some widths (`{width: cost}`) as a function of any width between them
    (linear interpolation; the end values beyond them)."""
    xs = sorted(points)
    ys = [points[x] for x in xs]
    return lambda n: float(np.interp(n, xs, ys))


def best_gamma(alpha: float, costs: StepCosts, gammas: Sequence[int]) -> int:
    """The gamma in `gammas` that Theorem 3.8 favours, with the measured c and verify cost of
    `costs` (from `measure_costs`, which must cover every gamma)."""
    verify = costs.verify_cost
    return max(gammas, key=lambda g: theory.speedup(alpha, g, costs.c, verify[g]))


# ----------------------------------------------------------------------------------------------
# The decode-loop cost model.


def decode_programs(target, drafts: Sequence[Any], batches: Sequence[np.ndarray],
                    speculative: Dict[Any, Tuple[int, float]], *, sampling: SamplingConfig,
                    max_decode_len: int, lenience: float = 1.0, seed: int = 0
                    ) -> Dict[Any, Callable[[], Any]]:
    """Thunks that decode every batch: "baseline" (`autoregressive_decode`) and, for each key of
    `speculative`, `speculative_decode` with its (gamma, draft_confidence[, gamma_schedule[,
    initial_gamma[, tree]]]); `drafts[i]` drafts for `batches[i]`. Batch i uses the PRNG key
    fold_in(PRNGKey(seed), i) in every program."""
    keys = [jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(len(batches))]
    batches = [jnp.asarray(b, jnp.int32) for b in batches]

    def baseline():
        return [decoding.autoregressive_decode(target, x, rng=k, sampling=sampling,
                                               max_decode_len=max_decode_len)
                for x, k in zip(batches, keys)]

    def run(gamma, confidence, schedule="constant", initial_gamma=None, tree=None):
        drafter = [drafters.as_drafter(draft, gamma, tree, confidence=confidence,
                                       schedule=schedule, initial_gamma=initial_gamma)
                   for draft in drafts]
        return lambda: [decoding.speculative_decode(
            target, d, x, rng=k, gamma=None, sampling=sampling, max_decode_len=max_decode_len,
            lenience=lenience) for d, x, k in zip(drafter, batches, keys)]

    return {"baseline": baseline, **{name: run(*setting) for name, setting in speculative.items()}}


def fit_line(x: Sequence[float], y: Sequence[float]):
    """(intercept, slope) of the least-squares line y = intercept + slope * x."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if np.unique(x).size < 2:
        raise ValueError(
            f"Cannot fit a cost per loop iteration: every calibration sequence ran "
            f"{int(x[0]) if x.size else 0} iterations. Calibrate on sequences of different "
            "lengths (real inputs and trained models end at EOS; random ones rarely do).")
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def calibration_programs(target, draft, batches: Sequence[np.ndarray], gammas: Sequence[int], *,
                         sampling: SamplingConfig, max_decode_len: Union[int, Sequence[int]],
                         lenience: float = 1.0, draft_confidence: float = 0.0, seed: int = 0,
                         tree: Optional[Sequence[int]] = None) -> Dict[Any, Callable[[], Any]]:
    """One thunk per (decoder, calibration batch): keys ("calibration", None, i) for the
    baseline and ("calibration", gamma, i) for speculative decoding with that gamma.

    `max_decode_len` is one limit for every batch or one per batch: text that rarely ends
    (a language model continuing code) needs several limits, since the line `fit_loop_costs`
    fits through the timings needs sequences of different lengths."""
    limits = ([max_decode_len] * len(batches) if isinstance(max_decode_len, int)
              else list(max_decode_len))
    if len(limits) != len(batches):
        raise ValueError(f"max_decode_len has {len(limits)} limits for {len(batches)} "
                         "calibration batches; give one int or one limit per batch.")
    programs = {}
    for i, x in enumerate(batches):  # one program per batch, each with its own PRNG key
        single = decode_programs(
            target, [draft], [x],
            {g: (g, draft_confidence, *(() if tree is None else ("constant", None, tuple(tree))))
             for g in gammas}, sampling=sampling,
            max_decode_len=limits[i], lenience=lenience, seed=seed + 7919 + i)
        for kind, name in [(None, "baseline")] + [(g, g) for g in gammas]:
            programs[("calibration", kind, i)] = lambda f=single[name]: f()[0]  # its one result
    return programs


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """One decode program's cost, fitted on the calibration sequences (`fit_loop_costs`).

    Attributes:
      start_s: seconds before the loop's first iteration (encoder or prefill, set-up).
      iteration_s: seconds per loop iteration (a baseline step, or a speculative round).
      iterations: the loop iterations of each calibration sequence.
      median_s: the median seconds of each calibration sequence.
    """

    start_s: float
    iteration_s: float
    iterations: Tuple[int, ...]
    median_s: Tuple[float, ...]

    def to_json(self) -> Dict[str, Any]:
        return {"start_s": self.start_s, "iteration_s": self.iteration_s,
                "iterations": list(self.iterations), "median_s": list(self.median_s)}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProgramCost":
        return cls(float(d["start_s"]), float(d["iteration_s"]), tuple(d["iterations"]),
                   tuple(d["median_s"]))


@dataclasses.dataclass(frozen=True)
class LoopCosts:
    """The decode-loop cost model: each program's start-up and per-iteration cost.

    Attributes:
      calibration_sequences: how many calibration sequences the lines were fitted on.
      baseline: the autoregressive program's cost.
      speculative: {gamma: the speculative program's cost}.
    """

    calibration_sequences: int
    baseline: ProgramCost
    speculative: Dict[int, ProgramCost]

    @property
    def round_cost(self) -> Dict[int, float]:
        """{gamma: one speculative round's cost in baseline steps}."""
        return {g: s.iteration_s / self.baseline.iteration_s for g, s in self.speculative.items()}

    def to_json(self) -> Dict[str, Any]:
        return {"calibration_sequences": self.calibration_sequences,
                "baseline": self.baseline.to_json(),
                "speculative": {g: s.to_json() for g, s in self.speculative.items()},
                "round_cost": self.round_cost}


def fit_loop_costs(times: Dict[Any, Sequence[float]], outputs: Dict[Any, Any],
                   gammas: Sequence[int]) -> LoopCosts:
    """Start-up and per-iteration cost of each decode program, from `calibration_programs`'
    timings (`interleaved`'s times and first-call outputs)."""
    num = len({k[2] for k in times if isinstance(k, tuple) and k[0] == "calibration"})

    def fit(kind) -> ProgramCost:
        iterations = [int(outputs[("calibration", kind, i)].stats.rounds) for i in range(num)]
        medians = [float(np.median(times[("calibration", kind, i)])) for i in range(num)]
        start, per_iteration = fit_line(iterations, medians)
        return ProgramCost(start, per_iteration, tuple(iterations), tuple(medians))

    return LoopCosts(num, fit(None), {g: fit(g) for g in gammas})


@dataclasses.dataclass(frozen=True)
class WalltimePrediction:
    """Both decoders' predicted seconds over a set of batches (`predict_walltime`).

    Attributes:
      baseline_s: the autoregressive decoder's seconds.
      speculative_s: the speculative decoder's seconds.
      speedup_per_token: the long-sequence limit, Eq. 1 / round cost (Theorem 3.8 with the
        decode programs' own costs).
    """

    baseline_s: float
    speculative_s: float
    speedup_per_token: float

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.speculative_s

    def to_json(self) -> Dict[str, float]:
        return {"baseline_s": self.baseline_s, "speculative_s": self.speculative_s,
                "speedup": self.speedup, "speedup_per_token": self.speedup_per_token}


def predict_walltime(alpha: float, gamma: int, loop_costs: LoopCosts,
                     baseline_iterations: Sequence[int], speculative_lengths: Sequence[int]
                     ) -> WalltimePrediction:
    """Walltime of both decoders over a set of batches, from `fit_loop_costs`.

    A batch costs its program's start-up plus one iteration per loop step: the baseline runs
    `baseline_iterations[b]` steps (one per token of the batch's longest row); the speculative
    loop runs `theory.expected_rounds(alpha, gamma, n)` rounds for its longest row of n =
    `speculative_lengths[b]` tokens (the i.i.d. model).
    """
    b, s = loop_costs.baseline, loop_costs.speculative[gamma]
    base = sum(b.start_s + n * b.iteration_s for n in baseline_iterations)
    spec = sum(s.start_s + theory.expected_rounds(alpha, gamma, n) * s.iteration_s
               for n in speculative_lengths)
    return WalltimePrediction(base, spec, theory.expected_tokens(alpha, gamma)
                              / loop_costs.round_cost[gamma])


# (draft_beam, gamma[, draft_branch]); "w" = the beam width. A branched proposal (each alive
# beam's 2 best first tokens) replays more steps per round for a wider verify.
BEAM_PROPOSALS = ((0, 2), (0, 3), (0, 5), (0, 2, 2), ("w", 2), ("w", 3))


@dataclasses.dataclass(frozen=True)
class BeamProposal:
    """One timed speculative beam-search proposal.

    Attributes:
      draft_beam: the draft's beam u (0: greedy paths only).
      gamma: drafted steps per path.
      draft_branch: first tokens proposed per alive beam (1: its greedy path).
      seconds: median seconds over the calibration inputs.
      speedup: the plain search's median seconds over these.
      replayed_per_round: target beam steps replayed per row-round.
    """

    draft_beam: int
    gamma: int
    seconds: float
    speedup: float
    replayed_per_round: float
    draft_branch: int = 1

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BeamChoice:
    """What `choose_beam_proposal` timed and picked.

    Attributes:
      best: the fastest proposal.
      candidates: every proposal timed.
      plain_seconds: the plain (jitted) beam search's median seconds.
    """

    best: BeamProposal
    candidates: Tuple[BeamProposal, ...]
    plain_seconds: float

    def to_json(self) -> Dict[str, Any]:
        return {"draft_beam": self.best.draft_beam, "gamma": self.best.gamma,
                "draft_branch": self.best.draft_branch, "speedup": self.best.speedup,
                "replayed_per_round": self.best.replayed_per_round,
                "candidates": [c.to_json() for c in self.candidates],
                "plain_seconds": self.plain_seconds}


def choose_beam_proposal(target, draft, batches: Sequence[np.ndarray], *, beam_size: int,
                         max_decode_len: int, length_penalty: float = 0.6,
                         candidates: Sequence[Tuple[Any, ...]] = BEAM_PROPOSALS,
                         repeats: int = 1) -> BeamChoice:
    """Which speculative beam-search proposal (draft_beam u, gamma g[, draft_branch b]) is
    fastest here, and by how much against the plain search, timed on `batches` (calibration
    inputs, not the ones being reported): each candidate and the plain search, compiled first,
    then in `repeats` interleaved rounds. A round verifies batch * (w * b + u) paths of g + 1
    tokens in one target forward; its worth is the steps it replays per unit of that forward's
    cost, which only a measurement on this machine tells.
    """
    # pylint: disable=g-import-not-at-top
    from speculative.beam.search import beam_search, speculative_beam_search

    w = beam_size
    kw = dict(beam_size=w, max_decode_len=max_decode_len, length_penalty=length_penalty)
    configs = list(dict.fromkeys((w if c[0] == "w" else int(c[0]), int(c[1]),
                                  int(c[2]) if len(c) > 2 else 1) for c in candidates))
    programs = {"plain": lambda: [beam_search(target, x, **kw) for x in batches]}
    for u, g, b in configs:
        programs[(u, g, b)] = functools.partial(
            lambda u, g, b: [speculative_beam_search(target, draft, x, draft_beam=u, gamma=g,
                                                     draft_branch=b, **kw) for x in batches],
            u, g, b)
    _, times, outputs = interleaved(programs, repeats)
    plain = float(np.median(times["plain"]))
    rows = []
    for u, g, b in configs:
        seconds = float(np.median(times[(u, g, b)]))
        results = outputs[(u, g, b)]
        row_rounds = sum(r.rounds * len(x) for r, x in zip(results, batches))
        rows.append(BeamProposal(u, g, seconds, plain / seconds,
                                 sum(r.steps for r in results) / max(1, row_rounds), b))
    return BeamChoice(max(rows, key=lambda r: r.speedup), tuple(rows), plain)
