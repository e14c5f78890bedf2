"""Table 3's alpha split by the target's confidence (experiments/alpha_by_confidence.py).

Example (a minute or two on 2 CPU cores; nothing is timed):
  python scripts/alpha_by_confidence.py --target=large_target \
      --drafts=large_draft_kdtv,large_feature_draft
"""

from absl import app, flags

from speculative.experiments import alpha_by_confidence
from speculative.runs import config as config_lib

_TARGET = flags.DEFINE_string("target", "large_target", "Bundled target.")
_DRAFTS = flags.DEFINE_list("drafts", ["large_draft_kdtv", "large_feature_draft"],
                            "Bundled drafts of the target, one row each per temperature.")
_OUT = flags.DEFINE_string("output_dir", None, "Where to write (default: <the target's "
                           "results directory>/target_aware/alpha_by_confidence/).")
_TOKENS = flags.DEFINE_integer("num_alpha_tokens", 5000, "Positions per alpha (Table 3: 5000).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier report.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    alpha_by_confidence.run(_DRAFTS.value, target_name=_TARGET.value, output_dir=_OUT.value,
                            num_alpha_tokens=_TOKENS.value, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
