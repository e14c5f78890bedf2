"""ROUGE of the bundled docstring target on the test split beside three trivial baselines (the
name in words, the first comment line, the most common training docstring):
speculative/experiments/docstring_quality.py.

  python scripts/docstring_quality.py                  # all 1,751 test functions
  python scripts/docstring_quality.py --num=200 --output_dir=/tmp/q

Writes <output_dir>/quality.json and quality.md (default results/docstrings; an earlier report
there is refused unless --overwrite). Needs the training split (for the most common docstring):
python scripts/build_docstring_corpus.py --train_split_only. A few minutes on 2 CPU cores.
"""

from absl import app, flags

from speculative.experiments import docstring_quality
from speculative.runs import config as config_lib

_NUM = flags.DEFINE_integer("num", None, "Score the first this many test functions (all).",
                            lower_bound=1)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "results/docstrings", "Where the report goes.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier report.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    result = docstring_quality.run(_NUM.value, _OUTPUT_DIR.value, _OVERWRITE.value)
    print(docstring_quality.markdown(result))


if __name__ == "__main__":
    config_lib.run_app(main)
