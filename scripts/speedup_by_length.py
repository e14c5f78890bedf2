"""Speedup against output length, both tasks (speculative/experiments/length_bins.py): the
first --num test inputs of each bundle, binned by the target's greedy output length, each bin
timed (baseline vs speculative with the bundle's best draft, batch 1, T = 0, interleaved) beside
Theorem 3.8's prediction.

  python scripts/speedup_by_length.py                       # results/speedup_by_length.*
  python scripts/speedup_by_length.py --tasks=docstrings --num=16 --output_dir=/tmp/len

Writes <output_dir>/speedup_by_length.json, .md and .png (an earlier report is refused unless
--overwrite). About 10 minutes on 2 CPU cores; run it with nothing else busy.
"""

from absl import app, flags

from speculative.experiments import length_bins
from speculative.runs import config as config_lib

_NUM = flags.DEFINE_integer("num", 64, "Test inputs per task.")
_BINS = flags.DEFINE_integer("bins", 4, "Length bins per task (equal counts).")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Drafts per round.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed interleaved rounds (medians).")
_TASKS = flags.DEFINE_list("tasks", list(length_bins.TASKS), "ende and/or docstrings.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "results", "Where the report goes.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier report.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    result = length_bins.run(_NUM.value, _BINS.value, _GAMMA.value, _REPEATS.value,
                             _TASKS.value, _OUTPUT_DIR.value, _OVERWRITE.value)
    print(length_bins.markdown(result))


if __name__ == "__main__":
    config_lib.run_app(main)
