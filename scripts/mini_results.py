"""Writes results/large/, results/mini/ and results/code/: the paper's Tables 2, 3 and 4 in
miniature.

For each bundled target (large_target: memory-bound on a CPU; mini_target: compute-bound;
code_target: the decoder-only GPT-like row, whose drafts are all timed, prompt lookup too),
measures alpha for its drafts at temperatures 0 and 1 along target-generated text (Table 3),
picks gamma per T5 draft by Theorem 3.8 from that alpha and the measured c and verify cost,
times speculative against autoregressive decoding at batch 1 on test sentences (Table 2), puts
two predictions beside each measured speedup (Theorem 3.8, and the decode-loop cost model; Table
4), splits each round's time into the verify call, the draft calls and the rest, and sweeps
gamma for the best draft (speedup_vs_gamma.png). About 25 minutes for large_target, 8 for
mini_target and 20 for code_target (--nodynamic) on 2 CPU cores; run it with nothing else busy
on the machine.
An earlier results.json is replaced only with --overwrite. Every finished stage (alpha, costs,
Table 2, the gamma sweep, dynamic gamma) is saved in results.partial.json as it ends, and
--resume continues a run that crashed or was stopped.

Example:
  python scripts/mini_results.py --overwrite
  python scripts/mini_results.py --targets=mini_target --output_dir=/tmp/quick \
      --num_alpha_tokens=1000 --repeats=2
"""


from absl import app, flags

from speculative.data import bundles
from speculative.experiments import mini_results
from speculative.runs import config as config_lib

_TARGETS = flags.DEFINE_list("targets", None, "Bundled targets to measure (default: all).")
_OUT = flags.DEFINE_string("output_dir", None, "Where the tables and plot go (one target only; "
                           "default: results/large, results/mini or results/code).")
_TOKENS = flags.DEFINE_integer("num_alpha_tokens", 10_000, "Tokens per alpha measurement.")
_SENTENCES = flags.DEFINE_integer("num_sentences", 24, "Test sentences timed at batch 1.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved timing repeats (medians reported).")
_DYNAMIC = flags.DEFINE_bool("dynamic", True, "Also time dynamic gamma (draft_confidence).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the results.json of an earlier run.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue a stopped run from the stages it saved in "
                            "results.partial.json (same settings).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    bundled = bundles.targets()
    targets = _TARGETS.value if _TARGETS.value is not None else bundled
    unknown = sorted(set(targets) - set(bundled))
    if unknown:
        raise app.UsageError(f"--targets: {unknown} not bundled; choose from {bundled}.")
    if _OUT.value and len(targets) != 1:
        raise app.UsageError("--output_dir needs exactly one --targets entry.")
    for target in targets:
        mini_results.run(output_dir=_OUT.value, num_alpha_tokens=_TOKENS.value,
                         num_sentences=_SENTENCES.value, repeats=_REPEATS.value,
                         target_name=target, dynamic=_DYNAMIC.value,
                         overwrite=_OVERWRITE.value, resume=_RESUME.value)


if __name__ == "__main__":
    config_lib.run_app(main)
