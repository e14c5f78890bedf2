"""Adds a hybrid draft (prompt lookup where the input matches, a bundled T5 draft elsewhere;
speculative/models/hybrid.py) to a bundle's model card, with its alpha measured against the
target on the first valid inputs (speculative/training/hybrid_card.py).

  python scripts/add_hybrid_draft.py --bundle=docstrings --draft=docstring_draft_s \
      --name=docstring_hybrid [--min_ngram=2] [--max_ngram=3]

A minute or two on 2 CPU cores (the alpha measurement); scripts/train_docstrings.sh runs it as
its last stage.
"""

import json

from absl import app, flags

from speculative.data import bundles
from speculative.runs import config as config_lib
from speculative.training import hybrid_card

_BUNDLE = flags.DEFINE_enum("bundle", "docstrings", [b.name for b in bundles.BUNDLES],
                            "The bundle whose card gets the entry.")
_DRAFT = flags.DEFINE_string("draft", None, "The bundled T5 draft the hybrid wraps.",
                             required=True)
_NAME = flags.DEFINE_string("name", None, "The entry's name.", required=True)
_MIN = flags.DEFINE_integer("min_ngram", 2, "Shortest match the copy trusts.", lower_bound=1)
_MAX = flags.DEFINE_integer("max_ngram", 3, "Longest match searched.", lower_bound=1)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    bundle = next(b for b in bundles.BUNDLES if b.name == _BUNDLE.value)
    entry = hybrid_card.add_hybrid_draft(bundle, _DRAFT.value, name=_NAME.value,
                                         min_ngram=_MIN.value, max_ngram=_MAX.value)
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    config_lib.run_app(main)
