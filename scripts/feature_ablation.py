"""The target-aware draft's ablation table (speculative/experiments/feature_ablation.py).

Example (about 10 minutes on 2 CPU cores; run it with nothing else busy):
  python scripts/feature_ablation.py --output_dir=results/large/target_aware/feature_ablation \
      --drafts=large_draft_kdtv,enc=out/feature/enc,feat=out/feature/feat,large_feature_draft
"""

from absl import app, flags

from speculative.experiments import feature_ablation
from speculative.runs import config as config_lib

_OUT = flags.DEFINE_string("output_dir", "results/large/target_aware/feature_ablation",
                           "Where to write.")
_DRAFTS = flags.DEFINE_list("drafts", ["large_draft_kdtv", "large_feature_draft"],
                            "Bundled names or label=training_dir, one row each.")
_NUM = flags.DEFINE_integer("num_sentences", 16, "Test sentences timed (batch 1).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved timing rounds.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier ablation.json.")
_TARGET = flags.DEFINE_string("target", "large_target", "Bundled target (large_target, or "
                              "code_target for the decoder-only code pair).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    feature_ablation.run(_OUT.value, _DRAFTS.value, num_sentences=_NUM.value,
                         repeats=_REPEATS.value, overwrite=_OVERWRITE.value,
                         target_name=_TARGET.value)


if __name__ == "__main__":
    config_lib.run_app(main)
