r"""Compares our decoders with Hugging Face transformers' on the same T5 models and sentences.

Converts each target and draft to Hugging Face directories with the project's converter, checks
that our logits equal transformers' on the same weights (fails above --parity_atol), then times
in one process, interleaved: our autoregressive and speculative decoding against transformers'
`generate` and assisted generation (its default settings, and a constant --gamma), greedy and
sampled (temperature 1, no top-k), at batch 1 on the first --num_sentences test sentences.
Checks that all greedy methods emit the same tokens. Writes <output_dir>/peers.json and
<output_dir>/peers.md (tokens/s, ours / transformers, tokens per target call; see
docs/peers.md). Needs torch and transformers: pip install -e ".[test]".

Default pairs: the compute-bound mini pair and the memory-bound large pair, each bundled target
with its best draft. The real run (first example) takes about 15-20 minutes on 2 CPU cores; run
it with nothing else busy on the machine (the load average is recorded).

Example:
  python scripts/compare_peers.py --num_sentences=24 --repeats=9 --output_dir=results/peers
  python scripts/compare_peers.py --pairs=mini_target:mini_draft_10 --num_sentences=2 \
      --repeats=1 --output_dir=/tmp/peers                       # a quick check (a minute)
  python scripts/compare_peers.py --target_config=large_target \
      --target_checkpoint=speculative/data/mini/models/large_target \
      --draft_config=large_draft_ce --draft_checkpoint=/ckpts/my_draft/checkpoint_2000 \
      --output_dir=/tmp/peers_mine              # a given T5X checkpoint (config: a preset, a
                                                # bundled model's name or an HF config.json)
"""

import sys

from absl import app, flags

from speculative.experiments import peers
from speculative.runs import config as config_lib
from speculative.runs.config import flag_numbers

_PAIRS = flags.DEFINE_list("pairs", None, "target:draft pairs of bundled T5 models; default: "
                           "each bundled target with its best draft.")
_TARGET_CKPT = flags.DEFINE_string("target_checkpoint", None, "A given target checkpoint "
                                   "(T5X legacy, Orbax or HF) instead of --pairs.")
_TARGET_CONFIG = flags.DEFINE_string("target_config", None, "Its config: a preset "
                                     "(t5_1_1_small, ...), a bundled model name or a config.json.")
_DRAFT_CKPT = flags.DEFINE_string("draft_checkpoint", None, "A given draft checkpoint.")
_DRAFT_CONFIG = flags.DEFINE_string("draft_config", None, "Its config (as --target_config).")
_OUT = flags.DEFINE_string("output_dir", "results/peers", "Where peers.json and peers.md go.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier run in --output_dir.")
_SENTENCES = flags.DEFINE_integer("num_sentences", 24, "Test sentences, decoded at batch 1.")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Interleaved timing repeats (medians reported).")
_GAMMA = flags.DEFINE_integer("gamma", 4, "Drafts per round: ours, and transformers' constant "
                              "schedule.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "0 = greedy; > 0 = sampling.")
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 48, "Most tokens per sentence (ours "
                                       "max_decode_len = transformers' max_new_tokens).")
_INPUT_LENGTH = flags.DEFINE_integer("input_length", 48, "Encoder input length (padded).")
_ATOL = flags.DEFINE_float("parity_atol", 1e-3, "Largest max abs logit difference allowed.")
_THREADS = flags.DEFINE_integer("torch_threads", None, "torch threads (default: CPU count).")


def _pairs():
    given = [_TARGET_CKPT.value, _TARGET_CONFIG.value, _DRAFT_CKPT.value, _DRAFT_CONFIG.value]
    if not any(given):
        if _PAIRS.value is None:
            return None
        bad = [p for p in _PAIRS.value if p.count(":") != 1]
        if bad:
            raise app.UsageError(f"--pairs: {bad} are not target:draft, e.g. "
                                 "--pairs=large_target:large_draft_kdtv.")
        return [tuple(p.split(":")) for p in _PAIRS.value]
    if not all(given) or _PAIRS.value is not None:
        raise app.UsageError("A given pair needs all four of --target_checkpoint, "
                             "--target_config, --draft_checkpoint and --draft_config, and no "
                             "--pairs.")
    return [(peers.Given(_TARGET_CKPT.value,
                         peers.config_for(_TARGET_CONFIG.value, _TARGET_CKPT.value),
                         _TARGET_CKPT.value),
             peers.Given(_DRAFT_CKPT.value,
                         peers.config_for(_DRAFT_CONFIG.value, _DRAFT_CKPT.value),
                         _DRAFT_CKPT.value))]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    temperatures = flag_numbers(_TEMPERATURES.value, "temperatures", float)
    try:
        peers.run(output_dir=_OUT.value, pairs=_pairs(), num_sentences=_SENTENCES.value,
                  repeats=_REPEATS.value, gamma=_GAMMA.value, temperatures=temperatures,
                  max_decode_len=_MAX_DECODE_LEN.value, input_length=_INPUT_LENGTH.value,
                  parity_atol=_ATOL.value, torch_threads=_THREADS.value,
                  overwrite=_OVERWRITE.value)
    except peers.MissingDependency as e:  # no torch or transformers: the message names the fix
        sys.exit(f"compare_peers: {e}")


if __name__ == "__main__":
    config_lib.run_app(main)
