"""Beam search walltime: host-driven, jitted and speculative (speculative/experiments/beam.py).

Example (several minutes on 2 CPU cores; run it with nothing else busy):
  python scripts/beam_benchmark.py --target=large_target --output_dir=results/large/beam
"""

from absl import app, flags

from speculative.experiments import beam
from speculative.runs import config as config_lib

_OUT = flags.DEFINE_string("output_dir", "results/large/beam", "Where to write.")
_TARGET = flags.DEFINE_string("target", "large_target", "A bundled EN->DE target.")
_DRAFT = flags.DEFINE_string("draft", "", "A bundled draft (default: the card's best).")
_NUM = flags.DEFINE_integer("num_sentences", 16, "Test sentences decoded (batch 1).")
_BEAMS = flags.DEFINE_list("beam_sizes", ["1", "2", "4"], "Beam widths.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Interleaved timing rounds.")
_SPLIT = flags.DEFINE_integer("split_sentences", 0, "Test sentences of the untimed test-split "
                              "pass (BLEU, plain = speculative); 0 = the whole split.")
_SPLIT_BATCH = flags.DEFINE_integer("split_batch", 16, "Rows per call in the test-split pass.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier beam.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        widths = [int(w) for w in _BEAMS.value]
    except ValueError:
        raise ValueError(f"--beam_sizes={','.join(_BEAMS.value)}: give ints, e.g. 1,2,4.") from None
    beam.run(_OUT.value, _TARGET.value, _DRAFT.value, num_sentences=_NUM.value,
             beam_sizes=widths, repeats=_REPEATS.value, split_sentences=_SPLIT.value,
             split_batch=_SPLIT_BATCH.value, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
