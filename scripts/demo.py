"""Speculative decoding with the bundled EN->DE models: translations, alpha and the speedup.

Translates sentences of the bundled test split with the trained target, autoregressively (the
baseline) and speculatively with the best bundled draft, at batch 1; prints the translations,
alpha, tokens per target call, the measured speedup and Theorem 3.8's prediction.

Example:
  python scripts/demo.py --num_sentences=8 --temperature=0
  python scripts/demo.py --draft=mini_draft_30 --gamma=5 --output_json=/tmp/demo.json
"""

from absl import app, flags

from speculative.runs import demo

_NUM = flags.DEFINE_integer("num_sentences", 8, "Test sentences to translate.")
_GAMMA = flags.DEFINE_integer("gamma", None, "Draft length; default: Theorem 3.8's best for the "
                              "measured alpha and costs.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy; > 0 = sampling.")
_DRAFT = flags.DEFINE_string("draft", None, "Bundled draft name; default: the best one.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (medians are reported).")
_OUTPUT = flags.DEFINE_string("output_json", None, "Also write the numbers here.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    demo.run(num_sentences=_NUM.value, gamma=_GAMMA.value, temperature=_TEMPERATURE.value,
             draft_name=_DRAFT.value, repeats=_REPEATS.value, output_json=_OUTPUT.value)


if __name__ == "__main__":
    app.run(main)
