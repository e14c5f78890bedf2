"""The main job: speculative decoding with the bundled models, against the baseline.

Translates test-split sentences with a bundled EN->DE target (by default `large_target`, the
memory-bound one), once autoregressively (the baseline) and once speculatively with its best
bundled draft, at batch 1 as in the paper, at each temperature (default 0, then 1). Prints a
legend of its terms (`LEGEND`), the translations, then one line per temperature with alpha,
tokens per target call, the measured speedup (`speedup N.NNx`) and Theorem 3.8's prediction,
with the decode-loop model's beside it, and c and the verify cost after; with `[out, in]`
kernels (a CPU's default) also the same target's baseline in T5X's layout, timed in the same
rounds, and the speedup over the faster baseline. At a temperature above 0 each sentence is
decoded with `samples` keys
(different translations; the baseline and the speculative decoder get the same keys): one
sampled translation of 8 sentences is about 115 tokens, and its speedup moved between 1.26x and
1.92x (2.78 to 4.10 tokens per target call) with the seed alone. gamma is Theorem 3.8's best for
the measured c, verify costs and the per-rank acceptance along the target's output at that
temperature (`acceptance.choose_tree`), which also says whether a token tree is predicted faster
than the best chain and decodes with the tree if so. Timings come from `runs.benchmark`
(compiled programs, interleaved repeats, medians); the machine's load average is printed with
them, since a busy second core slows verification more than single steps. It also prints whether
the target's weights exceed 3x the CPU's last-level cache (`host.cache_regime`): a virtual
machine can land on a host whose cache holds them all, and the JSON records the CPU
(`host.environment`). Such a cache can be shared and switch between serving the weights and not
within minutes, so it also compares the target step timed before the decoders with the
baseline's loop step while they were timed, and says when the two differ by more than
`STATE_CHANGE`. Without the bundle (a partial checkout) it falls back to random tiny models and
says so.

The JSON (`output_json`, or `<runs_dir>/demo-<draft>-<UTC time>/demo.json`) records the run's
provenance (`host.provenance`: commit, command, date, host), and with `runs_index` the run is
appended to that index (`results/runs.jsonl`: run id, command, headline numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from speculative import files, loading
from speculative.data import bundles, docstring_corpus, text
from speculative.decode import loops as decoding
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.measure import acceptance, host
from speculative.measure import costs as costs_lib
from speculative.measure import timing as measure
from speculative.models import layers, t5

# What the printed terms mean (printed before the numbers).
LEGEND = """\
How to read the numbers:
  alpha        the draft's acceptance rate: the mean over drafted positions of sum_x min(p, q),
               the chance the target keeps a draft token (Cor. 3.6); 1 = always kept
  tokens per target call   tokens each target forward yields (the baseline: 1; at most gamma + 1)
  c            the draft's cost per call, in target steps (draft step time / target step time)
  verify cost  one target call scoring gamma + 1 tokens, in target steps (the paper assumes 1;
               on a CPU it is more)
  speedup      baseline time / speculative time on the same sentences, timed in alternating
               rounds
  Theorem 3.8  the predicted speedup (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + verify cost))
               with the measured alpha, c and verify cost
  decode-loop model   the same prediction with each decoder's whole loop step timed on other
               sentences (sampling and bookkeeping included); usually nearer the speedup
"""

# The baseline's loop step and the isolated step differ by more than this factor when the
# host changed state mid-run (by 1.6-1.8x on the Xeon host of docs/limits.md). Within one state
# they agree to about 25%: the loop adds sampling, the commit and its carry to each step (up
# to 26% of the mini target's 0.3 ms step, 1-6% of large_target's; README round breakdown).
STATE_CHANGE = 1.4
COST_REPEATS = 7  # interleaved rounds of the single-call costs (c, verify costs)


@dataclasses.dataclass(frozen=True)
class DemoTask:
    """What the demo decodes: a bundle's test inputs, how they print, and the output length.

    Attributes:
      name: the --task value.
      bundle: the bundled models (their card, targets and drafts).
      labels: the printed prefixes of an input, the target's output and the reference.
      max_decode_len: tokens per output.
      num_inputs, samples: the defaults of `run`'s num_sentences and samples.
    """

    name: str
    bundle: bundles.Bundle
    labels: Tuple[str, str, str]
    max_decode_len: int
    num_inputs: int
    samples: int

    def tokenizer(self) -> text.Tokenizer:
        if self.bundle is bundles.DOCSTRINGS:
            return bundles.docstring_tokenizer()
        return bundles.Vocabulary()

    def pairs(self, num: int, skip: int = 0) -> List[Tuple[str, str]]:
        """(input text, reference) of the test split, in file order after the first `skip`."""
        if self.bundle is bundles.DOCSTRINGS:
            examples = docstring_corpus.read_split(docstring_corpus.DOCSTRING_DIR, "test")
            return [(e.code, e.docstring) for e in examples[skip:skip + num]]
        return bundles.test_pairs(skip + num)[skip:]

    def calibration(self, num: int, length: int, skip: int) -> List[np.ndarray]:
        """`num` batches of one test input each that fit `length` tokens, after the first
        `skip` inputs (the demo's own), for the decode-loop cost model."""
        if self.bundle is not bundles.DOCSTRINGS:
            return bundles.source_batches(num, 1, length, skip=skip)
        tokenizer, out = self.tokenizer(), []
        for source, _ in self.pairs(40 * num, skip):
            ids = tokenizer.encode_inputs([source])[0]
            if len(ids) <= length:
                out.append(tokenizer.encode_sources([source], length))
            if len(out) == num:
                break
        return out

    def show(self, source: str) -> str:
        """An input as printed: a sentence whole, a function by its first line."""
        if self.bundle is bundles.DOCSTRINGS:
            return source.splitlines()[0] + " ..."
        return source


TASKS = {
    "ende": DemoTask("ende", bundles.ENDE, ("EN:  ", "DE:  ", "ref: "), bundles.MAX_DECODE_LEN,
                     num_inputs=8, samples=4),
    "docstrings": DemoTask("docstrings", bundles.DOCSTRINGS,
                           ("function:  ", "docstring: ", "reference: "),
                           bundles.DOCSTRING_MAX_DECODE_LEN, num_inputs=4, samples=2),
}


def _random_pair():
    cfg = t5.T5Config(vocab_size=4000, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=128,
                      num_encoder_layers=2, num_decoder_layers=2,
                      mlp_activations=("gelu", "linear"), dropout_rate=0.0)
    small = t5.T5Config(**{**cfg.__dict__, "emb_dim": 16, "num_decoder_layers": 1})
    return loading.load_model(cfg, seed=0), loading.load_model(small, seed=1), "random-tiny"


def _regime_line(name: str, regime, step_s: float, level: Optional[str] = None) -> str:
    """Whether the target's weights stream from memory on this CPU, and how fast a step read
    them (`step_s`: the measured target step). `level`: the last-level cache's name ('L3')."""
    mb = regime["weight_bytes"] / 1e6
    step = (f" A step took {1e3 * step_s:.1f} ms ({regime['weight_bytes'] / step_s / 1e9:.0f} "
            "GB/s of weights).")
    if regime["memory_bound"] is None:
        return (f"{name} reads {mb:.1f} MB of weights per step (this CPU's cache sizes are "
                "unknown)." + step)
    cache = cache_name(regime["last_level_cache_bytes"], level)
    if regime["memory_bound"]:
        over = regime["weights_over_cache"]
        return (f"{name} reads {mb:.1f} MB of weights per step, {over:.1f}x this CPU's "
                f"{cache}: memory-bound, so verifying gamma + 1 tokens costs far less than "
                "gamma + 1 steps." + step)
    return (f"{name} reads {mb:.1f} MB of weights per step, and this CPU's {cache} holds more "
            "than the weights." + step + " When the cache serves "
            "them (a fast step) verification is further from free and the speedup lower than "
            "when they stream from memory; a cache shared with other tenants can switch between "
            "the two within minutes (docs/limits.md).")


def cache_name(num_bytes: float, level: Optional[str] = None) -> str:
    """A cache as its maker names it, in binary megabytes: '32 MB L3' (33554432 bytes), or
    '32 MB last-level cache' when the level is unknown."""
    return f"{num_bytes / 2**20:.0f} MB " + (level or "last-level cache")


def _state_line(step_s: float, loop_steps_s: Sequence[Optional[float]]) -> str:
    """Compares the target step timed before the decoders (which chose gamma and Theorem 3.8's
    costs) with the baseline's cost per loop step while they were timed, one per temperature;
    a host whose shared cache switches state mid-run (docs/limits.md) shows as a large
    difference between any two of them."""
    during = [t for t in loop_steps_s if t is not None and t > 0]
    line = f"target step: {1e3 * step_s:.2f} ms before the timings"
    if not during:
        return line + " (no decode-loop fit to compare with)"
    line += (", " + " / ".join(f"{1e3 * t:.2f}" for t in during)
             + " ms per baseline loop step during them")
    worst = max([step_s] + during) / min([step_s] + during)
    if worst > STATE_CHANGE:
        line += (f": they differ by up to {worst:.2f}x, so this host changed state during the run "
                 "(docs/limits.md); gamma and Theorem 3.8 used the costs from before, and the "
                 "speedups mix two states. Rerun for a clean number.")
    return line


def _pick_shape(target, draft, batches, sampling, costs, row_costs, max_decode_len, seed):
    """`(gamma, tree, line)`: the depth and, for a branching token tree, the branching (None
    for the chain) of the shape `acceptance.choose_tree` predicts fastest by Theorem 3.8 for
    the measured costs and the per-rank acceptance along the target's output for `batches`,
    and a line saying why (docs/token_trees.md)."""
    choice = acceptance.choose_tree(target, draft, batches, sampling, costs, row_costs,
                                   max_decode_len=max_decode_len,
                                   max_nodes=acceptance.TREE_MAX_NODES, seed=seed)
    return len(choice.plan.tree), choice.tree, choice.line()


def run(*, num_sentences: Optional[int] = None, gamma: Optional[int] = None,
        temperatures: Sequence[float] = (0.0, 1.0), target_name: Optional[str] = None,
        draft_name: Optional[str] = None, repeats: int = 5, input_length: Optional[int] = None,
        max_decode_len: Optional[int] = None, output_json: Optional[str] = None, seed: int = 0,
        samples: Optional[int] = None, runs_dir: Optional[str] = None,
        runs_index: Optional[str] = None, command: Optional[str] = None,
        task: str = "ende") -> dict:
    """Runs the comparison and prints it; returns the numbers, with their provenance.

    `task`: 'ende' (translations, the default) or 'docstrings' (docstrings written for test
    functions; `TASKS`), whose bundle gives the models, inputs and `max_decode_len`; None for
    `num_sentences` (inputs), `samples` and `max_decode_len` takes the task's default.

    `input_length` (default: the longest sentence's tokens rounded up to a multiple of 8, so
    that the encoder, which both decoders run once per sentence, does not process padding) is
    the padded source length; the decode-loop model's calibration sentences are the next
    test sentences that fit it.

    The JSON goes to `output_json`, else (with `runs_dir`) to a new directory
    `<runs_dir>/demo-<draft>-<UTC time>/demo.json`, else nowhere; the path is printed and
    returned as `summary["json"]`. With `runs_index` the run is appended to that index
    (`files.append_run`) when its JSON lies under the index's directory (`results/`: the index
    lists the runs whose files are there). `command`: what provenance records (default: this
    process's command line). Bad arguments and names are refused before any model is loaded."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a demo task; use one of {sorted(TASKS)}.")
    task_info = TASKS[task]
    num_sentences = task_info.num_inputs if num_sentences is None else num_sentences
    samples = task_info.samples if samples is None else samples
    max_decode_len = task_info.max_decode_len if max_decode_len is None else max_decode_len
    validation.positive_int(num_sentences, "num_sentences", "test inputs decoded")
    validation.positive_int(repeats, "repeats", "timed rounds")
    validation.positive_int(samples, "samples", "sampled translations per sentence at T > 0")
    if gamma is not None:  # None chooses; 0 is not a sentinel
        validation.positive_int(gamma, "gamma", "drafts per round; None lets Theorem 3.8 choose")
    if input_length is not None:
        validation.positive_int(input_length, "input_length", "the padded source length; None "
                               "fits the longest sentence")
    if not temperatures or any(not t >= 0 for t in temperatures):
        raise ValueError(f"temperatures={list(temperatures)!r}: give one or more values >= 0 "
                         "(0 = greedy).")
    for t in temperatures:  # each refused here, not after the temperatures before it
        try:
            SamplingConfig(t)
        except ValueError as e:
            raise ValueError(f"temperatures={list(temperatures)!r}: {e}") from None
    # The decode loops' bounds that do not depend on the models (`validation.check_lengths`),
    # refused here rather than after loading and timing them.
    validation.positive_int(max_decode_len, "max_decode_len", "tokens per translation")
    if gamma is not None and gamma > max(max_decode_len, 64):
        raise ValueError(f"gamma={gamma} drafts more tokens per round than max_decode_len="
                         f"{max_decode_len} (and 64) allow; Theorem 3.8's best gamma is far "
                         "smaller (leave --gamma unset to use it).")
    # Unwritable places fail now, not after the timings.
    if output_json:
        files.check_writable(os.path.dirname(os.path.abspath(output_json)), "output_json")
    elif runs_dir:
        files.check_writable(runs_dir, "runs_dir")
    if runs_index:
        files.check_writable(os.path.dirname(os.path.abspath(runs_index)), "runs_index")
    bundle = task_info.bundle
    if bundle.available():
        target_name, draft_name = check_names(target_name, draft_name, bundle)
        target, draft = bundle.load(target_name), bundle.load(draft_name)
    elif task != "ende":
        raise FileNotFoundError(f"task={task!r} needs its bundled models ({bundle.models_dir}); "
                                f"train them with the recipe in {bundle.recipe}.")
    else:
        print("No bundled models found: using random tiny models (outputs are gibberish).")
        target, draft, draft_name = _random_pair()
        target_name = "random-tiny"
    vocab = task_info.tokenizer()
    pairs = task_info.pairs(num_sentences)
    if input_length is None:  # pad no further than the longest input needs (a multiple of 8)
        longest = max(len(ids) for ids in vocab.encode_inputs([src for src, _ in pairs]))
        input_length = -(-longest // 8) * 8
    batches = [vocab.encode_sources([src], input_length) for src, _ in pairs]
    # The models' own limits (cache length, memory), before any timing.
    validation.check_lengths((target, draft), batches[0], max_decode_len, gamma)
    # Other test inputs, on which the decode-loop cost model is fitted.
    calibration = task_info.calibration(8, input_length, skip=num_sentences)
    load = host.LoadAverage()
    # The verify cost of the fixed gamma; else of every chain up to gamma 8 and of token trees
    # up to TREE_MAX_NODES nodes (between the measured widths, interpolated), which the shape
    # chooser prices.
    widths = [gamma] if gamma else sorted({*range(1, 9), *acceptance.TREE_VERIFY_WIDTHS})
    # 7 rounds: with 3, c of the same draft read 0.039-0.053 in four calls (0.074 once, as the
    # process's first timing), and the gamma it chose moved with it; with 7, 0.046-0.047.
    costs = costs_lib.measure_costs(target, draft, batches[0], widths,
                                    max_decode_len=max_decode_len, num_steps=16,
                                    repeats=COST_REPEATS, seed=seed)
    # The draft's cost on several paths prices token trees; measured only if a tree can win.
    row_costs = functools.cache(functools.partial(
        costs_lib.draft_row_costs, target, draft, batches[0], acceptance.TREE_DRAFT_ROWS,
        c=costs.c, max_decode_len=max_decode_len, seed=seed))

    weights = host.step_bytes(target.module.config, target.params, batch_size=1, position=0,
                                encoder_length=0)["total"]
    environment = host.environment()  # the CPU and its caches, read once
    caches = environment["cpu"]["cache_bytes"]
    regime = host.cache_regime(weights, caches)
    print(f"\nTarget {target_name} | draft {draft_name} | batch 1 | {len(pairs)} test inputs "
          f"({task})")
    print(_regime_line(target_name, regime, costs.target_step_s,
                       max(caches, key=caches.get) if caches else None) + "\n")
    print(LEGEND)
    # With `[out, in]` kernels (a CPU's default) the same target in T5X's layout decodes
    # autoregressively in the same rounds: the speedup is also given over the faster baseline,
    # which is not always the new layout's (docs/limits.md, "The kernel layout").
    other_baselines = ({"t5x_layout": dataclasses.replace(
        target, params=layers.untranspose_kernels(target.params))}
        if layers.kernel_layout(target.params) == "transposed" else {})
    identical = True
    for k, ((source, reference), x) in enumerate(zip(pairs, batches)):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), k)
        greedy = SamplingConfig(0.0)
        spec = decoding.speculative_decode(target, draft, x, rng=key, gamma=gamma or 4,
                                           sampling=greedy, max_decode_len=max_decode_len)
        base = decoding.autoregressive_decode(target, x, rng=key, sampling=greedy,
                                              max_decode_len=max_decode_len)
        identical &= bool(np.array_equal(base.tokens, spec.tokens))
        said, wrote, ref = task_info.labels
        print(f"{said}{task_info.show(source)}\n{wrote}{vocab.decode(np.asarray(spec.tokens[0]))}"
              f"\n{ref}{reference}\n")
    print("speculative output identical to the target's greedy output: "
          + ("yes" if identical else "NO"))

    rows = []
    for temperature in temperatures:
        sampling = SamplingConfig(float(temperature))
        # Sampling: each sentence `samples` times (batch i gets key i, so the copies differ);
        # the acceptance rates that choose gamma read all of them too (one draw of alpha at
        # T > 0 is noisy).
        timed = [x for x in batches for _ in range(samples if temperature > 0 else 1)]
        g, tree = gamma, None
        if not gamma:
            g, tree, line = _pick_shape(target, draft, timed, sampling, costs, row_costs,
                                        max_decode_len, seed)
            print(f"T={temperature:g}: the shape, chosen before timing by Theorem 3.8 on the "
                  f"acceptance along the target's output: {line}")
        [m] = measure.measure(
            target, [draft] * len(timed), timed, sampling=sampling, gammas=[g],
            max_decode_len=max_decode_len, repeats=repeats, lenience=1.0, seed=seed,
            costs=costs, calibration=calibration, tree=tree, other_baselines=other_baselines)
        row = {"temperature": float(temperature), **m.row(),
               "samples_per_sentence": len(timed) // len(batches),
               "tokens": {"baseline": m.baseline_tokens, "speculative": m.speculative_tokens},
               # The baseline's cost per loop step while the decoders were timed (the
               # decode-loop fit), beside the isolated step measured before them.
               "baseline_step_s_loop": m.loop.baseline.iteration_s if m.loop else None}
        rows.append(row)
        shape = f"tree {tree}" if tree else f"gamma {g}"
        drawn = (f"{len(batches)} sentences x {row['samples_per_sentence']} samples, "
                 if temperature > 0 else "")
        print(f"T={temperature:g}: speedup {row['speedup']:.2f}x ({drawn}{shape}, alpha "
              f"{row['alpha']:.3f}, {row['tokens_per_target_call']:.2f} tokens per target call; "
              f"baseline {row['baseline_s']:.3f} s, speculative {row['speculative_s']:.3f} s; "
              f"Theorem 3.8 {row['predicted_speedup']:.2f}x, decode-loop model "
              f"{row['predicted_speedup_loop']:.2f}x)")
        if other_baselines:
            print(f"T={temperature:g}: the baseline with T5X's [in, out] kernels "
                  f"{row['other_baselines_s']['t5x_layout']:.3f} s: "
                  f"{row['speedup_over_fastest_baseline']:.2f}x over the faster baseline")
    load_average = load.record()
    print(_state_line(costs.target_step_s, [r["baseline_step_s_loop"] for r in rows]))
    print(f"c {costs.c:.3f} | verify cost " + ", ".join(
        f"gamma {g}: {costs.verify_cost[g]:.2f}" for g in sorted({r['gamma'] for r in rows}))
        + f" | load average {load_average['before']:.2f} before, {load_average['after']:.2f} "
        "after (2 cores: above ~1.2 another process was busy and the speedups are low)")
    summary = {
        "task": task, "target": target_name, "draft": draft_name, "sentences": len(pairs),
        "repeats": repeats, "samples": samples, "input_length": input_length,
        "identical_to_baseline": identical,
        "kernel_layout": layers.kernel_layout(target.params),  # docs/limits.md
        "rows": rows,
        "target_step_s": costs.target_step_s, "draft_step_s": costs.draft_step_s,
        "load_average_1m": load_average,
        "cache_regime": regime,
        "environment": environment,
        "provenance": host.provenance(command, load=load_average, bandwidth=True),
    }
    if not output_json and runs_dir:
        output_json = os.path.join(files.new_run_dir(runs_dir, f"demo-{draft_name}"), "demo.json")
    summary["json"] = output_json
    if output_json:
        files.write_atomic(output_json, json.dumps(files.json_ready(summary), indent=1))
        print(f"Wrote {output_json}")
    else:
        print("Nothing written (no output_json or runs_dir).")
    if runs_index and output_json:
        add_to_index(summary, output_json, runs_index)
    return summary


def add_to_index(summary: dict, path: str, runs_index: str) -> Optional[dict]:
    """Appends the run whose JSON is `path` to the run index (`index_record`'s line) and
    returns the line, when `path` lies under the index's directory (`results/`: the index lists
    the runs whose files are there); else says so and returns None."""
    results_dir = os.path.dirname(os.path.abspath(runs_index))
    if not os.path.abspath(path).startswith(results_dir + os.sep):
        print(f"Not added to {runs_index}: it lists the runs written under {results_dir}.")
        return None
    record = index_record(summary, path, runs_index)
    files.append_run(runs_index, record)
    print(f"Run {record['run_id']} added to {runs_index}")
    return record


def index_record(summary: dict, path: Optional[str], runs_index: str) -> dict:
    """The run's line in the run index (`results/runs.jsonl`): id, command, commit, date, host
    and the headline numbers per temperature. `path` is given relative to the index's parent
    directory's parent (the repository root for `results/runs.jsonl`) when inside it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(runs_index)))
    shown = path
    if path and os.path.abspath(path).startswith(root + os.sep):
        shown = os.path.relpath(os.path.abspath(path), root)
    if path and os.path.basename(path) == "demo.json":
        run_id = os.path.basename(os.path.dirname(os.path.abspath(path)))
    else:
        run_id = f"demo-{summary['draft']}-{summary['provenance']['date']}"
    keys = ("alpha", "gamma", "tree", "tokens_per_target_call", "speedup",
            "speedup_over_fastest_baseline", "predicted_speedup", "predicted_speedup_loop")
    rows = [{"T": r["temperature"], **{k: _rounded(r.get(k)) for k in keys}}
            for r in summary["rows"]]
    provenance = summary["provenance"]
    return {"run_id": run_id, "experiment": "demo",
            "pair": f"{summary['target']}/{summary['draft']}", "path": shown,
            "command": provenance["command"], "commit": provenance["commit"],
            "date": provenance["date"], "host": provenance["host"],
            "headline": {"draft": summary["draft"], "rows": rows}}


def _rounded(value, digits: int = 3):
    """Floats to `digits` decimals for the index (other values as they are)."""
    return round(value, digits) if isinstance(value, float) else value


def check_names(target_name: Optional[str], draft_name: Optional[str],
                bundle: bundles.Bundle = bundles.ENDE):
    """The bundled target and draft names (defaults filled in), or ValueError naming the one
    the bundle lacks, or a draft trained for another target; reads the model card only."""
    targets = bundle.targets()
    target_name = target_name or bundle.main_target()
    if target_name not in targets:
        raise ValueError(f"target={target_name!r} is not a bundled target; choose one of "
                         f"{targets}.")
    draft_name = draft_name or bundle.best_draft(target_name)
    drafts = bundle.drafts(target_name)
    if draft_name not in drafts:
        owner = None
        try:
            owner = bundle.target_of(draft_name)
        except ValueError:
            pass
        raise ValueError(f"draft={draft_name!r} is not a bundled draft of {target_name}"
                         + (f" (it belongs to {owner})" if owner else "")
                         + f"; choose one of {drafts}.")
    return target_name, draft_name
