"""Plots of the theory and of benchmark results (matplotlib, Agg backend).

`plot_figure3` draws the paper's Figure 3 (optimal gamma against alpha for several c, from
`theory.optimal_gamma`) and `plot_speedup_vs_gamma` measured against predicted speedup from a
benchmark JSON's `runs`. Used by `scripts/plot_theory.py` and the mini results run; the library
modules themselves never import matplotlib.
"""

import json
import os
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from speculative.measure import analysis as theory  # pylint: disable=g-import-not-at-top

FIGURE3_CS = (0.01, 0.02, 0.05, 0.1, 0.2)
FIGURE3_ALPHAS = np.round(np.arange(0.30, 0.951, 0.01), 2)
MAX_GAMMA = 64


def plot_figure3(
    path: str,
    alphas: np.ndarray = FIGURE3_ALPHAS,
    cs: Sequence[float] = FIGURE3_CS,
    max_gamma: int = MAX_GAMMA,
) -> str:
    """Draws [L] Figure 3 (optimal gamma vs. alpha) plus its speedup to `path`."""
    alphas = np.asarray(alphas, dtype=np.float64)
    cs = np.asarray(cs, dtype=np.float64)
    gammas = theory.optimal_gamma_table(alphas, cs, max_gamma=max_gamma)
    speedups = theory.speedup(alphas[:, None], gammas, cs[None, :])  # [A, C]

    fig, (ax_g, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, c in enumerate(cs):
        ax_g.step(alphas, gammas[:, j], where="mid", label=f"c = {c:g}")
        ax_s.plot(alphas, speedups[:, j], label=f"c = {c:g}")
    ax_g.set(
        xlabel=r"$\alpha$",
        ylabel=r"optimal $\gamma$",
        yscale="log",
        title=r"Optimal $\gamma$ (Thm. 3.8, [L] Fig. 3)",
    )
    ax_g.set_yticks([1, 2, 5, 10, 20, 50])
    ax_g.set_yticklabels(["1", "2", "5", "10", "20", "50"])
    ax_s.set(
        xlabel=r"$\alpha$",
        ylabel="expected walltime improvement",
        title=r"Speedup at the optimal $\gamma$",
    )
    for ax in (ax_g, ax_s):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_runs(json_path: str) -> list[Mapping[str, Any]]:
    """Reads the `runs` list of a benchmark JSON, with clear errors."""
    if not os.path.exists(json_path):
        raise FileNotFoundError(
            f"--benchmark_json={json_path} does not exist; run the benchmark first "
            "or omit the flag to plot only Figure 3."
        )
    with open(json_path, encoding="utf-8") as f:
        data = json.load(f)
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        raise ValueError(f"{json_path} must hold an object with a list 'runs'.")
    return runs


def speedup_title(runs: Sequence[Mapping[str, Any]], pair: str) -> str:
    """'<pair>' plus, where the runs record them, their temperatures and batch sizes."""
    temps = sorted({r.get("sampling", {}).get("temperature", r.get("temperature"))
                    for r in runs} - {None})
    batches = sorted({r["batch_size"] for r in runs if "batch_size" in r})
    setting = ", ".join(filter(None, [
        f"T = {', '.join(f'{t:g}' for t in temps)}" if temps else "",
        f"batch {', '.join(map(str, batches))}" if batches else ""]))
    return pair + (f"\n{setting}" if setting else "")


def describe_pair(config: Mapping[str, Any]) -> str:
    """'<target> + <draft>' from a benchmark.json `config` (checkpoint names where given)."""
    def name(role):
        checkpoint, model = config.get(f"{role}_checkpoint"), config.get(f"{role}_model")
        if checkpoint:
            return os.path.basename(os.path.normpath(checkpoint))
        if isinstance(model, str):
            return model
        if isinstance(model, Mapping):
            return f"random T5 ({model.get('emb_dim')}d)"
        return {"draft": "synthetic draft"}.get(role, "target")

    draft = name("draft")
    if config.get("synthetic_acceptance") is not None:
        draft = f"synthetic draft (alpha {config['synthetic_acceptance']:g})"
    return f"{name('target')} + {draft}"


def plot_speedup_vs_gamma(runs: Sequence[Mapping[str, Any]], path: str, *,
                          pair: str) -> str:
    """Plots measured and predicted speedup against gamma to `path`.

    Args:
      runs: dicts with keys `gamma`, `speedup` (measured) and
        `predicted_speedup` (Thm. 3.8 from measured alpha, c, verify cost); with
        `predicted_speedup_loop` in every entry, the decode-loop prediction is drawn too. The
        temperatures (`sampling.temperature`, or `temperature`) and batch sizes of the runs go
        into the title.
      path: output PNG path.
      pair: the models, for the title (e.g. 'large_target + large_draft_kdtv').
    """
    missing = [
        i for i, r in enumerate(runs) if not {"gamma", "speedup", "predicted_speedup"} <= set(r)
    ]
    if not runs or missing:
        raise ValueError(
            "runs must be a non-empty list of dicts with keys gamma, speedup and "
            f"predicted_speedup; entries {missing} lack some."
        )
    runs = sorted(runs, key=lambda r: r["gamma"])
    gamma = [r["gamma"] for r in runs]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(gamma, [r["speedup"] for r in runs], "o-", label="measured")
    ax.plot(gamma, [r["predicted_speedup"] for r in runs], "s--", label="predicted (Thm. 3.8)")
    if all("predicted_speedup_loop" in r for r in runs):
        ax.plot(gamma, [r["predicted_speedup_loop"] for r in runs], "^:",
                label="predicted (decode-loop costs)")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel=r"$\gamma$", ylabel="speedup over autoregressive")
    ax.set_title(speedup_title(runs, pair), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup_vs_batch(lines: Mapping[str, Sequence[tuple]], path: str) -> str:
    """Plots measured speedup against batch size to `path`: one line per label of `lines`
    ({label: [(batch_size, speedup), ...]}), a log2 batch axis and a line at 1.0 (below it,
    speculation loses)."""
    if not lines or not all(lines.values()):
        raise ValueError("lines must map at least one label to a non-empty list of "
                         "(batch_size, speedup) pairs.")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, points in lines.items():
        batch, speedup = zip(*sorted(points))
        ax.plot(batch, speedup, "o-", label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    batches = sorted({b for points in lines.values() for b, _ in points})
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.set(xlabel="batch size", ylabel="speedup over autoregressive",
           title="Speedup vs. batch size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
