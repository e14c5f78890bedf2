"""T5X's [in, out] dense kernels against [out, in] on a CPU (experiments/kernel_layout.py).

Example (about 8 minutes on 2 CPU cores; run it with nothing else busy on the machine):
  python scripts/kernel_layout_benchmark.py --output_dir=results/limits/kernel_layout/large_target
"""

from absl import app, flags

from speculative.experiments import kernel_layout
from speculative.runs import config as config_lib
from speculative.runs.config import flag_numbers

_TARGET = flags.DEFINE_string("target", "large_target", "Bundled target.")
_DRAFT = flags.DEFINE_string("draft", "", "Bundled draft (default: the target's best).")
_OUT = flags.DEFINE_string("output_dir", None, "Where to write (default: "
                           "results/limits/kernel_layout/<target>/).")
_NUM = flags.DEFINE_integer("num_sentences", 8, "Test sentences timed (batch 1).")
_GAMMAS = flags.DEFINE_list("gammas", ["3", "5", "7"], "Draft lengths timed in both layouts.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "0 = greedy; > 0 = sampling.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "At T > 0: decodes per sentence.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved timing rounds.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier report.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    kernel_layout.run(output_dir=_OUT.value, target_name=_TARGET.value, draft_name=_DRAFT.value,
                      num_sentences=_NUM.value, gammas=flag_numbers(_GAMMAS.value, "gammas", int),
                      temperatures=flag_numbers(_TEMPERATURES.value, "temperatures", float),
                      samples=_SAMPLES.value, repeats=_REPEATS.value, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
