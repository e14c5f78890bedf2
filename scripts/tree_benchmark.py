"""Chains against token trees on a bundled pair (speculative/experiments/tree_benchmark.py).

Example (about 10 minutes on 2 CPU cores; run it with nothing else busy):
  python scripts/tree_benchmark.py --target=large_target --output_dir=results/large/trees
"""

from absl import app, flags

from speculative.experiments import tree_benchmark as trees
from speculative.runs import config as config_lib

_OUT = flags.DEFINE_string("output_dir", "results/large/trees", "Where to write.")
_TARGET = flags.DEFINE_string("target", "large_target", "A bundled target.")
_DRAFT = flags.DEFINE_string("draft", "", "A bundled draft (default: the card's best).")
_NUM = flags.DEFINE_integer("num_sentences", 16, "Test sentences timed (batch 1).")
_RANK = flags.DEFINE_integer("num_rank_sentences", 64,
                             "Other test sentences for the per-rank acceptance rates.")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_NODES = flags.DEFINE_integer("max_nodes", 16, "Most drafted tokens one verify call checks.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved timing rounds.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier trees.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    temperatures = []
    for t in _TEMPS.value:
        try:
            temperatures.append(float(t))
        except ValueError:
            raise ValueError(f"--temperatures: {t!r} is not a number (e.g. 0,1).") from None
    trees.run(_OUT.value, _TARGET.value, _DRAFT.value, num_sentences=_NUM.value,
              num_rank_sentences=_RANK.value, temperatures=temperatures,
              max_nodes=_NODES.value, repeats=_REPEATS.value, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
