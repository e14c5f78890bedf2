"""Block drafts against chains on the large pair (speculative/experiments/block_drafts.py): c_round,
per-depth acceptance, tokens per target call and speedups at T = 0 and 1 for every gamma, all
timed in one interleaved run.

Example (about 15 minutes on 2 CPU cores; run it with nothing else busy):
  python scripts/block_draft_benchmark.py --overwrite
(default output: results/large/target_aware/block_drafts)
"""

from absl import app, flags

from speculative.experiments import block_drafts
from speculative.runs import config as config_lib

_DEFAULT = block_drafts.BlockBenchSettings()
_OUT = flags.DEFINE_string("output_dir", _DEFAULT.output_dir, "Where to write.")
_DRAFTS = flags.DEFINE_list("drafts", list(_DEFAULT.drafts), "Bundled drafts of the target.")
_GAMMAS = flags.DEFINE_list("gammas", [str(g) for g in _DEFAULT.gammas], "Gammas to time.")
_NUM = flags.DEFINE_integer("num_sentences", _DEFAULT.num_sentences, "Test sentences (batch 1).")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULT.repeats, "Interleaved timing rounds.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier block_drafts.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    gammas = tuple(config_lib.flag_numbers(_GAMMAS.value, "gammas", int))
    settings = block_drafts.BlockBenchSettings(
        drafts=tuple(_DRAFTS.value), gammas=gammas, num_sentences=_NUM.value,
        repeats=_REPEATS.value, output_dir=_OUT.value)
    block_drafts.run(settings, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
