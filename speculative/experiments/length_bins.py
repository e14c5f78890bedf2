"""Speedup against output length: does speculative decoding pay more on long outputs?

For each task (EN->DE translation, code -> docstring summarization) it takes the first `num`
test inputs of the bundle, decodes each greedily with the target to learn its output length,
splits the inputs into `bins` bins of equal count by that length, and times the baseline and
speculative decoding (the bundle's best draft, batch 1, gamma `gamma`) on each bin
(`timing.measure`: compiled programs, interleaved rounds, medians). Per bin it reports the
speedup, alpha, tokens per target call and Theorem 3.8's prediction from the bin's alpha with the
measured c and verify cost, so the measured and the predicted curves sit side by side.

What it shows: a round's fixed costs (the encoder, the first draft call, the last partial
round) weigh less on a long output, and alpha moves with what the output is (a short
docstring is mostly one stock phrase; a long one names arguments), so the bins differ by more
than noise. `speedup_by_length.png` plots both tasks.

    python scripts/speedup_by_length.py [--num=64] [--bins=4] [--output_dir=results]
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from speculative import files
from speculative.experiments import record

TASKS = ("ende", "docstrings")
STEM = "speedup_by_length"


def _bundle(task: str):
    from speculative.data import bundles  # pylint: disable=g-import-not-at-top

    return {"ende": bundles.ENDE, "docstrings": bundles.DOCSTRINGS}[task]


def length_bins(lengths: Sequence[int], bins: int) -> List[np.ndarray]:
    """Indices of `lengths` in `bins` bins of (nearly) equal count, shortest first (ties keep
    input order: a stable sort)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [part for part in np.array_split(order, bins) if len(part)]


def measure_task(task: str, num: int, bins: int, gamma: int, repeats: int,
                 seed: int = 0) -> Dict[str, Any]:
    """One task's rows (module docstring)."""
    # pylint: disable=g-import-not-at-top
    import jax

    from speculative.decode import loops as decoding
    from speculative.decode.kernel import SamplingConfig
    from speculative.measure import costs as costs_lib
    from speculative.measure import timing

    bundle = _bundle(task)
    target_name = bundle.main_target()
    draft_name = bundle.best_draft(target_name)
    target, draft = bundle.load(target_name), bundle.load(draft_name)
    batches = bundle.batches(num, 1)
    greedy = SamplingConfig(0.0)
    max_len = bundle.max_decode_len
    lengths = [int(np.asarray(decoding.autoregressive_decode(
        target, x, rng=jax.random.PRNGKey(seed), sampling=greedy,
        max_decode_len=max_len).lengths)[0]) for x in batches]
    costs = costs_lib.measure_costs(target, draft, batches[0], [gamma], max_decode_len=max_len,
                                    num_steps=16, repeats=7, seed=seed)
    rows = []
    for part in length_bins(lengths, bins):
        group = [batches[i] for i in part]
        [m] = timing.measure(target, [draft] * len(group), group, sampling=greedy,
                             gammas=[gamma], max_decode_len=max_len, repeats=repeats,
                             lenience=1.0, seed=seed, costs=costs)
        got = m.row()
        span = [int(lengths[i]) for i in part]
        rows.append({"min_length": min(span), "max_length": max(span),
                     "mean_length": float(np.mean(span)), "examples": len(part),
                     **{k: got[k] for k in ("alpha", "tokens_per_target_call", "speedup",
                                            "predicted_speedup", "baseline_s",
                                            "speculative_s")}})
    return {"task": task, "target": target_name, "draft": draft_name, "gamma": gamma,
            "examples": len(batches), "c": costs.c, "verify_cost": costs.verify_cost[gamma],
            "rows": rows}


def run(num: int = 64, bins: int = 4, gamma: int = 4, repeats: int = 3,
        tasks: Sequence[str] = TASKS, output_dir: str = "results",
        overwrite: bool = False) -> Dict[str, Any]:
    """Measures every task and writes `<output_dir>/speedup_by_length.{json,md,png}`."""
    # pylint: disable=g-import-not-at-top
    from speculative.decode import validation
    from speculative.measure import host

    validation.positive_int(num, "num", "test inputs per task")
    validation.positive_int(bins, "bins", "length bins per task")
    validation.positive_int(gamma, "gamma", "drafts per round")
    validation.positive_int(repeats, "repeats", "timed rounds")
    if bins > num:
        raise ValueError(f"bins={bins} is more than num={num} inputs; use bins <= num.")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"tasks={list(tasks)!r}: use one or more of {list(TASKS)}.")
    missing = [t for t in tasks if not _bundle(t).available()]
    if missing:
        raise FileNotFoundError(f"tasks {missing} need their bundled models; see "
                                f"{[_bundle(t).recipe for t in missing]}.")
    files.check_report(output_dir, STEM, overwrite)
    load = host.LoadAverage()
    result = {"num": num, "bins": bins, "gamma": gamma, "repeats": repeats, "temperature": 0.0,
              "tasks": [measure_task(t, num, bins, gamma, repeats) for t in tasks]}
    record.publish("speedup_by_length", "+".join(tasks), output_dir, STEM, result, markdown,
                   load=load.record())
    plot(result, f"{output_dir}/{STEM}.png")
    return result


def markdown(result: Dict[str, Any]) -> str:
    out = [f"# Speedup against output length (T = 0, batch 1, gamma {result['gamma']})\n",
           "Each task's first test inputs, split by the target's greedy output length into bins "
           "of equal count; per bin the measured speedup (interleaved medians), alpha, tokens "
           "per target call and Theorem 3.8's prediction (the bin's alpha, the measured c and "
           "verify cost).\n"]
    for t in result["tasks"]:
        out.append(f"\n## {t['task']}: {t['target']} with {t['draft']} ({t['examples']} inputs, "
                   f"c {t['c']:.3f}, verify cost {t['verify_cost']:.2f})\n")
        out.append(files.markdown_table(
            ["output tokens", "inputs", "alpha", "tokens/call", "speedup", "Thm 3.8"],
            [[f"{r['min_length']}-{r['max_length']} (mean {r['mean_length']:.0f})",
              r["examples"], f"{r['alpha']:.3f}", f"{r['tokens_per_target_call']:.2f}",
              f"{r['speedup']:.2f}x", f"{r['predicted_speedup']:.2f}x"] for r in t["rows"]]))
    prov = result.get("provenance", {})
    out.append(f"\n\nCommand: `{prov.get('command')}` (commit {prov.get('commit')}); the plot: "
               f"{STEM}.png.\n")
    return "\n".join(out)


def plot(result: Dict[str, Any], path: str) -> str:
    """Speedup (measured and Theorem 3.8) and tokens per call against mean output length, one
    panel per task; written atomically."""
    import io  # pylint: disable=g-import-not-at-top

    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    tasks = result["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        x = [r["mean_length"] for r in t["rows"]]
        ax.plot(x, [r["speedup"] for r in t["rows"]], "o-", label="speedup (measured)")
        ax.plot(x, [r["predicted_speedup"] for r in t["rows"]], "s--",
                label="Theorem 3.8 (bin alpha, measured c)")
        ax.plot(x, [r["tokens_per_target_call"] for r in t["rows"]], "^:",
                label="tokens per target call")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("target's output length (tokens, bin mean)")
        ax.set_title(f"{t['task']}: {t['target']} + {t['draft']}, gamma {t['gamma']}")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("x over the baseline / tokens")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return files.write_atomic(path, buf.getvalue())

