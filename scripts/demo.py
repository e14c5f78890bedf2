r"""Speculative decoding with the bundled EN->DE models: translations, alpha and the speedup.

Translates sentences of the bundled test split with the trained memory-bound target
(`large_target`), autoregressively (the baseline) and speculatively with its best bundled
draft (`large_feature_draft`), at batch 1; prints a legend of the terms, the translations (and
whether they equal the target's greedy output), then one line per temperature (0, then 1) with
`speedup N.NNx`, alpha, tokens per target call, and Theorem 3.8's prediction (the decode-loop
model's beside it: the same formula with each decoder's whole loop step timed). At T = 1 each
sentence is translated `--samples` times (4) with different keys, so that the timing is not one
draw of a few sampled translations. Takes about 3 minutes on 2 CPU cores; run it with nothing
else busy on the machine.

It writes its numbers, with their provenance (commit, command, date, host), to a new run
directory, out/runs/demo-<draft>-<UTC time>/demo.json (or --output_json; out/ is git-ignored,
so the working tree stays clean), prints the path, and appends the run (id, command, headline
numbers) to out/runs.jsonl. --publish writes them to results/runs/ and results/runs.jsonl
instead, the committed record (a JSON written outside the index's directory is not indexed).
Bad flags are refused before any model is loaded.

With --task=docstrings it writes docstrings for functions of the code -> docstring test split
(Table 2's summarization task) with docstring_target and its best bundled draft, the same way.

Example:
  python scripts/demo.py
  python scripts/demo.py --task=docstrings
  python scripts/demo.py --target=mini_target       # the compute-bound contrast (no speedup)
  python scripts/demo.py --draft=large_draft_kl --gamma=5 --temperatures=0 \
      --output_json=/tmp/demo.json
"""

import os

from absl import app, flags

from speculative.experiments import demo
from speculative.runs import config as config_lib
from speculative.runs.config import flag_numbers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TASK = flags.DEFINE_enum("task", "ende", ["ende", "docstrings"], "ende: translate test "
                          "sentences; docstrings: write docstrings for test functions (Table 2's "
                          "summarization task).")
_NUM = flags.DEFINE_integer("num_sentences", None, "Test inputs to decode; default: 8 sentences, "
                            "4 functions.")
_GAMMA = flags.DEFINE_integer("gamma", None, "Draft length; default: Theorem 3.8's best for the "
                              "measured alpha and costs, per temperature.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "0 = greedy; > 0 = sampling.")
_TARGET = flags.DEFINE_string("target", None, "Bundled target; default: large_target.")
_DRAFT = flags.DEFINE_string("draft", None, "Bundled draft name; default: the target's best "
                             "(large_feature_draft for large_target).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (medians are reported).")
_SAMPLES = flags.DEFINE_integer("samples", None, "At T > 0: sampled outputs per input (one "
                                "sample of 8 sentences is too few tokens to time); default: 4 "
                                "per sentence, 2 per function.")
_INPUT_LENGTH = flags.DEFINE_integer("input_length", None, "Padded source length; default: the "
                                     "longest sentence's tokens rounded up to a multiple of 8.")
_OUTPUT = flags.DEFINE_string("output_json", None, "Write the numbers here; default: "
                              "<runs_dir>/demo-<draft>-<UTC time>/demo.json.")
_RUNS_DIR = flags.DEFINE_string("runs_dir", None,
                                "Where a new run directory is made when --output_json is not "
                                "given; default: out/runs (results/runs with --publish); '' "
                                "writes no JSON.")
_RUNS_INDEX = flags.DEFINE_string("runs_index", None,
                                  "The run index the run is appended to when its JSON lies under "
                                  "the index's directory; default: out/runs.jsonl "
                                  "(results/runs.jsonl with --publish); '' for none.")
_PUBLISH = flags.DEFINE_bool("publish", False, "Publish the run: write it under results/ (the "
                             "committed runs and their index) instead of the ignored out/.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of the decode keys (batch i: fold_in(seed, i)).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    temperatures = flag_numbers(_TEMPERATURES.value, "temperatures", float)
    root = os.path.join(REPO, "results" if _PUBLISH.value else "out")
    runs_dir = os.path.join(root, "runs") if _RUNS_DIR.value is None else _RUNS_DIR.value
    runs_index = (os.path.join(root, "runs.jsonl") if _RUNS_INDEX.value is None
                  else _RUNS_INDEX.value)
    demo.run(num_sentences=_NUM.value, gamma=_GAMMA.value, temperatures=temperatures,
             target_name=_TARGET.value, draft_name=_DRAFT.value, repeats=_REPEATS.value,
             input_length=_INPUT_LENGTH.value, output_json=_OUTPUT.value,
             samples=_SAMPLES.value, seed=_SEED.value, runs_dir=runs_dir or None,
             runs_index=runs_index or None, task=_TASK.value)


if __name__ == "__main__":
    config_lib.run_app(main)
