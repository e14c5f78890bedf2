"""The README's headline table, results/README.md's current numbers and docs/limits.md's host
table, made from the canonical results and results/runs.jsonl
(speculative/experiments/headline.py).

  python scripts/headline.py            # prints the three tables
  python scripts/headline.py --write    # rewrites them between their markers in place
  python scripts/headline.py --check    # exits 1, naming the documents, if one disagrees

Takes well under a second; nothing is measured.
"""

import os
import sys

from absl import app, flags

from speculative.experiments import headline
from speculative.runs import config as config_lib

_WRITE = flags.DEFINE_bool("write", False, "Rewrite the tables in the documents.")
_CHECK = flags.DEFINE_bool("check", False, "Exit 1 if a document's table is out of date.")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _CHECK.value:
        stale = headline.stale(REPO)
        if stale:
            print(f"out of date: {', '.join(stale)}; run python scripts/headline.py --write")
            sys.exit(1)
        print("README.md, results/README.md and docs/limits.md agree with the results.")
    elif _WRITE.value:
        changed = headline.write(REPO)
        print(f"rewrote: {', '.join(changed)}" if changed else "all tables already current")
    else:
        for name, make in headline.TABLES.items():
            print(f"{headline.DOCUMENTS[name]} ({name}):\n{make(REPO)}")


if __name__ == "__main__":
    config_lib.run_app(main)
