"""Writes results/mini/: the paper's Tables 2, 3 and 4 in miniature, with the bundled models.

Measures alpha for every bundled draft at temperatures 0 and 1 along target-generated text (Table
3), picks gamma per T5 draft by Theorem 3.8 from that alpha and the measured c and verify cost,
times speculative against autoregressive decoding at batch 1 on test sentences (Table 2), puts
two predictions beside each measured speedup (Theorem 3.8, and the decode-loop cost model; Table
4), and sweeps gamma for the best draft (speedup_vs_gamma.png). About 8 minutes on 2 CPU cores.
With --readme, the README's results section is rewritten from the new files.

Example:
  python scripts/mini_results.py --output_dir=results/mini --readme=README.md
  python scripts/mini_results.py --output_dir=/tmp/quick --num_alpha_tokens=1000 --repeats=2
"""

from absl import app, flags

from speculative.runs import mini_results

_OUT = flags.DEFINE_string("output_dir", "results/mini", "Where the tables and plot go.")
_TOKENS = flags.DEFINE_integer("num_alpha_tokens", 10_000, "Tokens per alpha measurement.")
_SENTENCES = flags.DEFINE_integer("num_sentences", 24, "Test sentences timed at batch 1.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved timing repeats (medians reported).")
_README = flags.DEFINE_string("readme", None, "README to rewrite from the <!-- RESULTS --> marker "
                              "to the next section (None = leave it alone).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    results = mini_results.run(output_dir=_OUT.value, num_alpha_tokens=_TOKENS.value,
                               num_sentences=_SENTENCES.value, repeats=_REPEATS.value)
    if _README.value:
        mini_results.write_readme_section(
            _README.value, mini_results.readme_section(results, _OUT.value))


if __name__ == "__main__":
    app.run(main)
