"""GAMMA = 'auto' against SPECULATIVE=False: whole infer.py runs, interleaved
(speculative/experiments/gamma_auto.py).

Example (about 10 minutes on 2 CPU cores; run it with nothing else busy):
  python scripts/gamma_auto_check.py --overwrite
(default output: results/limits/gamma_auto)
"""

from absl import app, flags

from speculative.experiments import gamma_auto
from speculative.runs import config as config_lib

_DEFAULT = gamma_auto.GammaAutoSettings()
_OUT = flags.DEFINE_string("output_dir", _DEFAULT.output_dir, "Where to write.")
_BATCHES = flags.DEFINE_list("batch_sizes", [str(b) for b in _DEFAULT.batch_sizes],
                             "Batch sizes.")
_NUM = flags.DEFINE_list("num_examples", [str(n) for n in _DEFAULT.num_examples],
                         "Examples per batch size (0 = the whole split).")
_CACHES = flags.DEFINE_list("caches", list(_DEFAULT.caches),
                            "Per batch size: cold (empty caches every run) or warm (caches "
                            "primed by one untimed run of each mode).")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULT.repeats, "Runs of each mode per batch size.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier gamma_auto.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    batches = tuple(config_lib.flag_numbers(_BATCHES.value, "batch_sizes", int))
    nums = tuple(config_lib.flag_numbers(_NUM.value, "num_examples", int))
    settings = gamma_auto.GammaAutoSettings(batch_sizes=batches, num_examples=nums,
                                            caches=tuple(_CACHES.value),
                                            repeats=_REPEATS.value, output_dir=_OUT.value)
    gamma_auto.run(settings, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
