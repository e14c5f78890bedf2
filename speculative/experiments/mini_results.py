"""Tables 2, 3 and 4 of the paper, in miniature, with the bundled offline models.

One command per bundled target writes its results directory (`RESULT_DIRS`: `results/large/` for
the memory-bound `large_target`, `results/mini/` for the compute-bound `mini_target`):

    python scripts/mini_results.py --targets=large_target,mini_target --overwrite

* Table 3 analogue (`table3.md`): alpha of every bundled draft (unigram, bigram, the T5 drafts)
  against the bundled target at temperature 0 and 1, measured as the paper does (Cor. 3.6: the mean
  of beta = sum_x min(p, q) along text the *target* generates from test-split sources, N tokens
  per setting), with a sequence-clustered standard error.
* Table 2 analogue (`table2.md`): each T5 draft at temperature 0 and 1 with gamma chosen by
  `theory.optimal_gamma`-style maximisation of Theorem 3.8 from the Table 3 alpha and the measured
  c and verify cost; walltime speedup of speculative over autoregressive decoding at batch 1 (the
  paper's setting) on test sentences, interleaved repeats, medians.
* Table 4 analogue (`table4.md`): for the same rows, two predictions against the measured
  speedup: Theorem 3.8 from the run's alpha and the measured c and verify cost (single model
  calls timed alone), and the decode-loop cost model (`speculative.costs`: the decode
  programs' own start-up and cost per step and per round, fitted on validation sentences timed
  in the same interleaved rounds as the decoders, and the i.i.d. model's expected rounds).
* `round_time.md`: where a round's time goes at each Table 2 row: the verify call and the draft
  calls (timed alone, as Theorem 3.8 prices them) against the round as the decode loop runs it
  (the cost model's per-round cost); the rest (acceptance kernel, commits, rewinds, statistics,
  loop carry, and any extra cost of a model call inside the loop) is `outside`.
* `objectives.md` (drafts trained for alpha): drafts of one shape and step count trained on
  data, by distillation (KL) and for acceptance (TV), with their alpha and speedups.
* `speedup_vs_gamma.png`: measured and predicted speedup over gamma = 1..8 for the best draft at
  temperature 0; `results.json` holds every number.

Alpha is deterministic for fixed seeds (rerunning reproduces it); speedups are walltime and vary
with the machine's load, which is why baseline and speculative repeats are interleaved.

The report writes tables and JSON only; results/README.md shows the tables and says what they
mean (tests/test_documents.py checks that it shows the tables as written).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from speculative import files
from speculative.data import bundles
from speculative.decode import stats as stats_lib
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import acceptance, host, plots
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib
from speculative.measure import timing as measure

TEMPERATURES = (0.0, 1.0)
NUM_CALIBRATION = 12  # validation sentences on which the decode-loop cost model is fitted
DYNAMIC_MAX_GAMMA = 6  # dynamic gamma: draft up to this many tokens ...
DYNAMIC_CONFIDENCES = (0.3, 0.5, 0.7)  # ... while the draft's top probability is at least this
HEURISTIC_START = 5  # the +2/-1 ('heuristic') schedule from 5 drafts: transformers 4.x's default
RESULT_DIRS = bundles.RESULT_DIRS


def round_breakdown(run: measure.Measurement, costs: costs_lib.StepCosts) -> Dict[str, float]:
    """Where one round's time goes (seconds and shares of the round), from a Table 2 run with
    its decode-loop costs and `costs_lib.measure_costs`' single calls: the verify call (target
    on gamma + 1 tokens), the draft calls (gamma single-token steps), and `outside`, what the
    loop spends beyond those calls as a bare loop of calls costs them. The same split of a
    baseline step: the target's single-token call and the rest."""
    gamma = run.gamma
    verify = costs.target_verify_s[gamma]
    draft = gamma * costs.draft_step_s
    round_s = run.loop.speculative.iteration_s
    step_s = run.loop.baseline.iteration_s
    return {"round_s": round_s, "verify_s": verify, "draft_s": draft,
            "outside_s": round_s - verify - draft, "verify_share": verify / round_s,
            "draft_share": draft / round_s, "outside_share": 1.0 - (verify + draft) / round_s,
            "baseline_step_s": step_s, "target_call_s": costs.target_step_s,
            "baseline_outside_share": 1.0 - costs.target_step_s / step_s}


def _row(run: measure.Measurement, **extra) -> Dict:
    """A results.json row: the measurement's numbers the tables use (the loop model fitted)."""
    if run.loop is None:
        raise ValueError(f"gamma {run.gamma}: the decode-loop cost model could not be fitted "
                         f"({run.loop_error}); the calibration sentences must end before "
                         f"max_decode_len={run.max_decode_len}.")
    out = run.to_json()
    return {**extra, **run.row(), **{k: out[k] for k in (
        "measured_over_predicted", "measured_over_predicted_loop", "predicted_walltime",
        "loop_costs")}}


def dynamic_gamma(target, draft, batches, sampling: SamplingConfig, fixed_gamma: int, *,
                  repeats: int, seed: int, draft_name: str = "draft",
                  costs: Optional[costs_lib.StepCosts] = None,
                  max_decode_len: int = bundles.MAX_DECODE_LEN) -> List[Dict]:
    """Baseline, speculative decoding with `fixed_gamma`, dynamic gamma (up to
    DYNAMIC_MAX_GAMMA drafts, each of DYNAMIC_CONFIDENCES) and transformers' +2/-1 schedule
    (from HEURISTIC_START, within [1, DYNAMIC_MAX_GAMMA]), timed in one interleaved run; one row
    per schedule, with both speedups over the same baseline and the §3.5 oracle bound at the
    fixed run's alpha (c and verify cost from `costs`, if given)."""
    programs = costs_lib.decode_programs(
        target, [draft] * len(batches), batches,
        {"fixed": (fixed_gamma, 0.0), **{c: (DYNAMIC_MAX_GAMMA, c) for c in DYNAMIC_CONFIDENCES},
         "+2/-1": (DYNAMIC_MAX_GAMMA, 0.0, "heuristic", min(HEURISTIC_START, DYNAMIC_MAX_GAMMA))},
        sampling=sampling, max_decode_len=max_decode_len, seed=seed)
    _, times, outputs = costs_lib.interleaved(programs, repeats)
    base = float(np.median(times["baseline"]))

    def summary(name):
        stats = stats_lib.merge_stats([r.stats for r in outputs[name]]).summary()
        return (base / float(np.median(times[name])), stats["tokens_per_target_call"],
                stats["drafted"] / stats["target_calls"], stats["alpha"])

    fixed_speedup, fixed_tokens, _, fixed_alpha = summary("fixed")
    oracle = None
    if costs is not None:  # verify cost of k + 1 tokens: the nearest measured gamma's
        measured = costs.verify_cost
        oracle = float(theory.oracle_dynamic_gamma_speedup(
            fixed_alpha, costs.c,
            verify_cost=lambda k: measured[min(measured, key=lambda g: abs(g - k))]))
    rows = []
    for c in list(DYNAMIC_CONFIDENCES) + ["+2/-1"]:
        speedup, tokens, drafted, alpha = summary(c)
        rows.append({"draft": draft_name, "temperature": sampling.temperature,
                     "max_gamma": DYNAMIC_MAX_GAMMA, "confidence": c, "speedup": speedup,
                     "alpha": alpha,
                     "tokens_per_target_call": tokens, "drafted_per_round": drafted,
                     "fixed_gamma": fixed_gamma, "fixed_speedup": fixed_speedup,
                     "fixed_tokens_per_target_call": fixed_tokens, "oracle_bound": oracle})
    return rows


PARTIAL = "results.partial.json"  # the stages finished so far by a run that has not ended


class _Stages:
    """The run's results, written to `PARTIAL` after every stage (atomically), so that a crash or
    a stop loses at most the stage in progress; with `resume`, stages already in `PARTIAL` for
    the same settings are taken from there instead of measured again."""

    def __init__(self, output_dir: str, settings: Dict, resume: bool):
        self.path = os.path.join(output_dir, PARTIAL)
        settings = files.json_ready(settings)
        self.results = {"settings": settings}
        if resume and os.path.exists(self.path):
            with open(self.path) as f:
                old = json.load(f)
            same = {k: v for k, v in old["settings"].items() if k != "environment"} == {
                k: v for k, v in settings.items() if k != "environment"}
            if not same:
                raise ValueError(f"{self.path} was written with other settings "
                                 f"({old['settings']}); delete it or run without --resume.")
            self.results = old
            print(f"resuming: {sorted(k for k in old if k != 'settings')} from {self.path}")

    def __contains__(self, key: str) -> bool:
        return key in self.results

    def __getitem__(self, key: str):
        return self.results[key]

    def done(self, key: str, value) -> None:
        self.results[key] = files.json_ready(value)
        files.write_atomic(self.path, json.dumps(self.results, indent=1))


def run(output_dir: Optional[str] = None, num_alpha_tokens: int = 10_000,
        num_sentences: int = 24, repeats: int = 15, gammas: Sequence[int] = tuple(range(1, 9)),
        seed: int = 0, num_calibration: int = NUM_CALIBRATION,
        target_name: str = bundles.MINI_TARGET, dynamic: bool = True, overwrite: bool = False,
        resume: bool = False) -> Dict:
    """Measures everything for one bundled target and its drafts and writes the tables (see the
    module docstring) into `output_dir` (default: `RESULT_DIRS[target_name]`).

    An earlier `results.json` there is replaced only with `overwrite`. Each finished stage is
    saved in `results.partial.json`; `resume` continues from it after a crash or a stop."""
    for value, name, what in ((num_alpha_tokens, "num_alpha_tokens", "tokens per alpha"),
                              (num_sentences, "num_sentences", "test sentences timed"),
                              (repeats, "repeats", "interleaved timing rounds"),
                              (num_calibration, "num_calibration", "calibration sentences")):
        validation.positive_int(value, name, what)  # 0 is no sentinel: refused before any work
    validation.positive_ints(list(gammas), "gammas", "draft lengths")
    output_dir = output_dir or RESULT_DIRS[target_name]
    final = os.path.join(output_dir, "results.json")
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} exists (an earlier run); pass overwrite=True "
                              "(--overwrite) to replace it, or another output_dir.")
    partial = os.path.join(output_dir, PARTIAL)
    if os.path.exists(partial) and not (resume or overwrite):
        raise FileExistsError(f"{partial} holds the finished stages of a stopped run; pass "
                              "resume=True (--resume) to continue it, overwrite=True "
                              "(--overwrite) to start again, or another output_dir.")
    files.check_writable(output_dir, "output_dir")  # one clear line, before any work
    load = host.LoadAverage()  # a busy second core slows every timing (results/README)
    inputs = bundles.bundle(target_name)
    max_decode_len = inputs.max_decode_len
    target = inputs.load(target_name)
    names = inputs.drafts(target_name)
    drafts = {name: inputs.load(name) for name in names}
    timed = inputs.timed_drafts(target_name)
    bench_batches = inputs.batches(num_sentences, 1)
    calibration = inputs.batches(num_calibration, 1, split="valid")
    stages = _Stages(output_dir, {
        "target": target_name, "num_alpha_tokens": num_alpha_tokens,
        "num_sentences": len(bench_batches), "repeats": repeats, "gammas": list(gammas),
        "input_length": inputs.input_length, "max_decode_len": max_decode_len,
        "num_calibration": len(calibration), "seed": seed, "dynamic": dynamic,
        "environment": host.environment()}, resume)

    if "table3" not in stages:
        table3 = {}
        for name in names:
            table3[name] = {str(t): acceptance.bundle_alpha(target, drafts[name], inputs, t,
                                                            num_alpha_tokens, seed)
                            for t in TEMPERATURES}
            print(name, {t: round(v["alpha"], 3) for t, v in table3[name].items()}, flush=True)
        stages.done("table3", table3)
    table3 = stages["table3"]

    if "costs" not in stages:
        cost_gammas = sorted(set(gammas) | {DYNAMIC_MAX_GAMMA})
        stages.done("costs", {
            name: costs_lib.measure_costs(target, drafts[name], bench_batches[0], cost_gammas,
                                          max_decode_len=max_decode_len, num_steps=32,
                                          repeats=7, seed=seed).to_json()
            for name in timed})
    costs = {name: costs_lib.StepCosts.from_json(c) for name, c in stages["costs"].items()}

    if "table2" not in stages:
        table2 = []
        for name in timed:
            for t in TEMPERATURES:
                gamma = costs_lib.best_gamma(table3[name][str(t)]["alpha"], costs[name], gammas)
                [run_] = measure.measure(
                    target, [drafts[name]] * len(bench_batches), bench_batches,
                    sampling=SamplingConfig(t), gammas=[gamma], max_decode_len=max_decode_len,
                    repeats=repeats, lenience=1.0, seed=seed, costs=costs[name],
                    calibration=calibration,
                    calibration_lengths=inputs.calibration_lengths(len(calibration)))
                table2.append(_row(run_, draft=name, temperature=t,
                                   breakdown=round_breakdown(run_, costs[name])))
                print(name, t, gamma, round(run_.speedup, 2), flush=True)
        stages.done("table2", table2)
    table2 = stages["table2"]

    best = max(timed, key=lambda n: max(r["speedup"] for r in table2
                                            if r["draft"] == n and r["temperature"] == 0.0))
    if "sweep" not in stages:
        sweep = measure.measure(
            target, [drafts[best]] * len(bench_batches), bench_batches,
            sampling=SamplingConfig(0.0), gammas=list(gammas), max_decode_len=max_decode_len,
            repeats=repeats, lenience=1.0, seed=seed, costs=costs[best],
            calibration=calibration,
            calibration_lengths=inputs.calibration_lengths(len(calibration)))
        stages.done("sweep", {"draft": best, "runs": [_row(r) for r in sweep]})

    # Dynamic gamma (beyond the paper): the best draft drafts up to DYNAMIC_MAX_GAMMA tokens and
    # stops a row when its top probability falls below a threshold; timed in one interleaved run
    # with the baseline and the fixed gamma of its Table 2 row.
    for t in TEMPERATURES if dynamic else ():
        if f"dynamic_{t:g}" in stages:
            continue
        fixed = next(r for r in table2 if r["draft"] == best and r["temperature"] == t)
        rows = dynamic_gamma(target, drafts[best], bench_batches, SamplingConfig(t),
                             fixed["gamma"], repeats=repeats, seed=seed, draft_name=best,
                             costs=costs[best], max_decode_len=max_decode_len)
        for r in rows:
            print("dynamic", t, r["confidence"], round(r["speedup"], 2),
                  round(r["fixed_speedup"], 2), flush=True)
        stages.done(f"dynamic_{t:g}", rows)

    results = {k: v for k, v in stages.results.items() if not k.startswith("dynamic_")}
    results["dynamic"] = [r for t in TEMPERATURES if dynamic for r in stages[f"dynamic_{t:g}"]]
    results["load_average_1m"] = load.record()
    results["provenance"] = host.provenance(load=results["load_average_1m"])
    # Tables, plot and results.json are written as one group (results.json last): a run
    # interrupted before the end leaves the earlier run's files as they were, and its stages.
    contents = {os.path.join(output_dir, name): text for name, text in _tables(results).items()}
    with tempfile.TemporaryDirectory() as tmp:
        png = plots.plot_speedup_vs_gamma(
            results["sweep"]["runs"], os.path.join(tmp, "plot.png"),
            pair=f"{target_name} + {results['sweep']['draft']} (T = 0, batch 1)")
        with open(png, "rb") as f:
            contents[os.path.join(output_dir, "speedup_vs_gamma.png")] = f.read()
    contents[final] = json.dumps(files.json_ready(results), indent=1)
    files.write_atomic_group(contents)
    os.remove(stages.path)
    record.index_run("tables", target_name, final, results)
    return results


def _task(target_name: str) -> str:
    if target_name == bundles.CODE_TARGET:
        return "Code (GPT-like)"
    if target_name == bundles.DOCSTRING_TARGET:
        return "Code → docstring"
    return "EnDe " + target_name.split("_")[0]


def _objective(entry: Dict) -> str:
    """How a bundled T5 draft was trained, from its card entry."""
    objective = entry.get("train_config", {}).get("objective", "ce")
    if objective == "ce":
        text = "target's greedy tokens (CE)" if entry.get("distilled") else "references (CE)"
    else:
        text = {"kl": "target's distributions (KL)",
                "tv": "acceptance, 1 - Σ min(p, q) (TV)"}[objective]
    sources = entry.get("distill_sources")
    if sources:
        text += f", + {sources['pairs'] / 1000:.0f}k unseen sources"
    if entry.get("init_checkpoint"):
        text += f", from {entry['init_checkpoint']}"
    return text


def _quality(entry: Dict) -> str:
    """A model's valid BLEU (EN->DE), ROUGE-L (docstrings) or valid loss (a language model),
    from its card entry."""
    for key in ("valid_bleu", "valid_rougeL"):
        if key in entry:
            return f"{entry[key]:.1f}"
    return f"{entry['final_valid_loss']:.3f}" if "final_valid_loss" in entry else "-"


def _quality_heading(target_entry: Dict) -> str:
    """The heading of `_quality`'s column, from the target's card entry."""
    if "valid_bleu" in target_entry:
        return "valid BLEU"
    return "valid ROUGE-L" if "valid_rougeL" in target_entry else "valid loss (nats/token)"


def _tables(results: Dict) -> Dict[str, str]:
    """{file name: markdown} of every table written from `results`."""
    target = results["settings"].get("target", bundles.MINI_TARGET)
    models = bundles.bundle(target)
    card = models.model_card()["models"]
    t3 = files.markdown_table(
        ["M_p", "M_q", "α (T=0)", "α (T=1)"],
        [[target, name, f"{v['0.0']['alpha']:.2f} ± {v['0.0']['se_cluster']:.2f}",
          f"{v['1.0']['alpha']:.2f} ± {v['1.0']['se_cluster']:.2f}"]
         for name, v in results["table3"].items()])
    t2 = files.markdown_table(
        ["Task", "M_q", "Temp", "γ", "α", "Speed"],
        [[_task(target), r["draft"], int(r["temperature"]), r["gamma"], f"{r['alpha']:.2f}",
          f"{r['speedup']:.2f}X"] for r in results["table2"]])
    t4 = files.markdown_table(
        ["M_q", "Temp", "γ", "α", "c", "verify cost", "Exp (Thm 3.8)", "round cost",
         "Exp (loop)", "Emp", "Emp/Exp (Thm 3.8)", "Emp/Exp (loop)"],
        [[r["draft"], int(r["temperature"]), r["gamma"], f"{r['alpha']:.2f}", f"{r['c']:.3f}",
          f"{r['verify_cost']:.2f}", f"{r['predicted_speedup']:.2f}", f"{r['round_cost']:.2f}",
          f"{r['predicted_speedup_loop']:.2f}", f"{r['speedup']:.2f}",
          f"{r['measured_over_predicted']:.2f}", f"{r['measured_over_predicted_loop']:.2f}"]
         for r in results["table2"]])
    sizes = files.markdown_table(
        ["model", "params", "decoder FLOPs/token vs target",
         _quality_heading(card[target])],
        [[n, card.get(n, {}).get("params", "-"),
          f"{card[n].get('flops_ratio_to_target', 1.0):.3f}"
          if "flops_ratio_to_target" in card.get(n, {}) or n == target else "-",
          _quality(card.get(n, {}))]
         for n in [target] + list(results["table3"])])
    tables = {"table2.md": t2, "table3.md": t3, "table4.md": t4, "models.md": sizes}
    rows = results["table2"]  # each row records its round breakdown
    if rows:
        tables["round_time.md"] = files.markdown_table(
            ["M_q", "Temp", "γ", "round (ms)", "verify call", "draft calls", "outside",
             "baseline step (ms)", "outside (baseline)"],
            [[r["draft"], int(r["temperature"]), r["gamma"],
              f"{1e3 * r['breakdown']['round_s']:.2f}",
              f"{100 * r['breakdown']['verify_share']:.0f}%",
              f"{100 * r['breakdown']['draft_share']:.0f}%",
              f"{100 * r['breakdown']['outside_share']:.0f}%",
              f"{1e3 * r['breakdown']['baseline_step_s']:.2f}",
              f"{100 * r['breakdown']['baseline_outside_share']:.0f}%"] for r in rows])
    # Drafts trained by one of the objectives (data, KL, TV), with the BLEU the table shows.
    trained = [n for n in results["table3"] if "valid_bleu" in card.get(n, {})
               and "objective" in card[n].get("train_config", {})]
    if trained:
        speed = {(r["draft"], r["temperature"]): r["speedup"] for r in results["table2"]}
        tables["objectives.md"] = files.markdown_table(
            ["M_q", "trained on", "steps", "valid BLEU", "α (T=0)", "α (T=1)", "Speed (T=0)",
             "Speed (T=1)"],
            [[n, _objective(card[n]),
              card[n]["steps"] + card[n].get("init_stage", {}).get("steps", 0),
              f"{card[n]['valid_bleu']:.1f}",
              f"{results['table3'][n]['0.0']['alpha']:.2f}",
              f"{results['table3'][n]['1.0']['alpha']:.2f}",
              f"{speed.get((n, 0.0), float('nan')):.2f}X",
              f"{speed.get((n, 1.0), float('nan')):.2f}X"] for n in trained])
    if results.get("dynamic"):
        tables["dynamic_gamma.md"] = files.markdown_table(
            ["M_q", "Temp", "fixed γ", "speed (fixed)", "tokens/call (fixed)", "γ max",
             "schedule", "drafts/round", "tokens/call", "speed (dynamic)", "oracle bound"],
            [[r["draft"], int(r["temperature"]), r["fixed_gamma"], f"{r['fixed_speedup']:.2f}X",
              f"{r['fixed_tokens_per_target_call']:.2f}", r["max_gamma"],
              r["confidence"] if r["confidence"] == "+2/-1" else f"confidence {r['confidence']}",
              f"{r['drafted_per_round']:.2f}", f"{r['tokens_per_target_call']:.2f}",
              f"{r['speedup']:.2f}X",
              f"{r['oracle_bound']:.2f}X" if r.get("oracle_bound") else "-"]
             for r in results["dynamic"]])
    return tables


def _range(values: Sequence[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def _verify_cost(results: Dict, draft: str, gamma: int) -> float:
    """The measured verify cost of `gamma` (dict keys are ints in memory, strings in JSON)."""
    costs = results["costs"][draft]["verify_cost"]
    return costs[gamma] if gamma in costs else costs[str(gamma)]


def load_results(output_dir: str) -> Dict:
    with open(os.path.join(output_dir, "results.json")) as f:
        return json.load(f)
