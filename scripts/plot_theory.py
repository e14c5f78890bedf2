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

  python scripts/plot_theory.py --output_dir=/tmp/theory \
      [--benchmark_json=/tmp/bench/results.json]
"""

import json
import os
from typing import Sequence

from absl import app, flags

from speculative.measure.plots import describe_pair, load_runs, plot_figure3, plot_speedup_vs_gamma
from speculative.runs import config as config_lib

FLAGS = flags.FLAGS


def _define_flags():
    """Registers the flags; only when run as a script, so tests can import it."""
    flags.DEFINE_string("output_dir", None, "Directory for the PNG files.")
    flags.DEFINE_string(
        "benchmark_json",
        None,
        "Optional JSON with a list `runs` of {gamma, speedup, predicted_speedup}.",
    )
    flags.mark_flag_as_required("output_dir")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
    runs = None
    if FLAGS.benchmark_json:  # Fail fast, before drawing anything.
        try:
            runs = load_runs(FLAGS.benchmark_json)
            with open(FLAGS.benchmark_json, encoding="utf-8") as f:
                pair = describe_pair(json.load(f).get("config", {}))
        except (OSError, ValueError) as e:
            raise SystemExit(f"plot_theory: {e}") from e
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    path = plot_figure3(os.path.join(FLAGS.output_dir, "figure3_optimal_gamma.png"))
    print(f"wrote {path}")
    if runs is not None:
        path = plot_speedup_vs_gamma(runs, os.path.join(FLAGS.output_dir, "speedup_vs_gamma.png"),
                                     pair=pair)
        print(f"wrote {path}")


if __name__ == "__main__":
    _define_flags()
    config_lib.run_app(main)
