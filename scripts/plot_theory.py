r"""Plots the speculative decoding theory: [L] Figure 3 and measured vs. predicted speedup.

Writes into --output_dir:
  figure3_optimal_gamma.png  left: the optimal gamma (Thm. 3.8 maximised over
                             integer gamma) against alpha for c in
                             {0.01, 0.02, 0.05, 0.1, 0.2}, as in [L] Figure 3;
                             right: the speedup that gamma achieves.
  speedup_vs_gamma.png       only with --benchmark_json: measured and predicted
                             speedup against gamma.

--benchmark_json is a JSON file holding {"runs": [{"gamma": 4, "speedup": 2.1,
"predicted_speedup": 2.3}, ...]}; other keys are ignored. All numbers come from
speculative/theory.py; this script only draws them.

Example (from the repository root; expect e.g. gamma* = 14 at alpha = 0.8,
c = 0.01, matching the grid in the paper notes):

  PYTHONPATH=. .venv/bin/python scripts/plot_theory.py --output_dir=/tmp/theory \
      [--benchmark_json=/tmp/bench/results.json]
"""

import json
import os
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from speculative import theory  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS

FIGURE3_CS = (0.01, 0.02, 0.05, 0.1, 0.2)
FIGURE3_ALPHAS = np.round(np.arange(0.30, 0.951, 0.01), 2)
MAX_GAMMA = 64


def _define_flags():
    """Registers the flags; only when run as a script, so tests can import it."""
    flags.DEFINE_string("output_dir", None, "Directory for the PNG files.")
    flags.DEFINE_string(
        "benchmark_json",
        None,
        "Optional JSON with a list `runs` of {gamma, speedup, predicted_speedup}.",
    )
    flags.mark_flag_as_required("output_dir")


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


def plot_speedup_vs_gamma(runs: Sequence[Mapping[str, Any]], path: str) -> str:
    """Plots measured and predicted speedup against gamma to `path`.

    Args:
      runs: dicts with keys `gamma`, `speedup` (measured) and
        `predicted_speedup` (Thm. 3.8 from measured alpha, c, verify cost).
      path: output PNG path.
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
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel=r"$\gamma$", ylabel="speedup over autoregressive", title=r"Speedup vs. $\gamma$")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    runs = None
    if FLAGS.benchmark_json:  # Fail fast, before drawing anything.
        try:
            runs = load_runs(FLAGS.benchmark_json)
        except (OSError, ValueError) as e:
            raise SystemExit(f"plot_theory: {e}") from e
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    path = plot_figure3(os.path.join(FLAGS.output_dir, "figure3_optimal_gamma.png"))
    print(f"wrote {path}")
    if runs is not None:
        path = plot_speedup_vs_gamma(runs, os.path.join(FLAGS.output_dir, "speedup_vs_gamma.png"))
        print(f"wrote {path}")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
