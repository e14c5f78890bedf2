r"""Trains a small T5 (teacher forcing, optax) on the bundled EN->DE gettext corpus.

A thin entry point: gin picks the model (a configs/models/mini_*.gin scope) and the run settings
(configs/runs/train.gin binds `training.TrainRun`), then `speculative.training.distillation.train`
does the work. The run writes into MODEL_DIR: config.gin (the resolved gin config), metrics.jsonl
(train/valid loss), the float32 T5X checkpoint checkpoint_<steps>, valid_greedy.txt and
summary.json (losses, greedy valid BLEU, parameters, decoder FLOPs per token, and for drafts alpha
against TARGET_MODEL). With EXPORT_DIR set, a bfloat16 copy goes to EXPORT_DIR/<name>/ and its
entry to EXPORT_DIR/model_card.json.

Flags: --gin_file (repeatable, later files override earlier) and --gin.NAME=VALUE (T5X style,
rewritten into the gin binding `NAME = VALUE`; strings need inner quotes) or --gin_bindings.

With configs/runs/train_code.gin (DECODER_ONLY = True) and a configs/models/code_*.gin scope it
trains a decoder-only (GPT-like) language model on the Python-code corpus instead
(speculative/data/code/; scripts/build_code_corpus.py --train_split_only writes its train split):
the command and the expected step times are in that gin file's header.

--run=feature_cache and --run=feature_draft build the target-aware draft's feature cache and
train it (configs/runs/feature_draft.gin has the commands).

--run=ngrams fits the unigram and bigram drafts instead (training.fit_ngram_drafts); the T5
training macros (MODEL, MODEL_DIR, TRAIN_STEPS) are not needed then and default to None.

Example (from the repository root; trains the target, about 13 minutes on 2 CPU cores, valid
loss about 1.5 nats/token, greedy valid BLEU about 42; the whole recipe, drafts included, is in
speculative/data/mini/models/MODEL_CARD.md):

  python scripts/train.py \
      --gin_file=configs/models/mini_target.gin --gin_file=configs/runs/train.gin \
      --gin.MODEL=@mini_target/t5.T5Config\(\) --gin.MODEL_DIR=\"out/mini/mini_target\" \
      --gin.TRAIN_STEPS=2000
"""

import os
import re
import sys
import tokenize
from typing import List, Sequence

import gin
from absl import app, flags

from speculative.runs import config as config_lib
from speculative.runs import train_feature_draft as feature_draft
from speculative.training import distillation as training

FLAGS = flags.FLAGS

flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, e.g. 'MODEL_DIR = \"/tmp/x\"'.")
flags.DEFINE_multi_string("gin_search_paths", ["."], "Directories searched for gin files.")
flags.DEFINE_enum("run", "train", ["train", "ngrams", "feature_cache", "feature_draft"],
                  "train: training.train (one T5 model); ngrams: training.fit_ngram_drafts "
                  "(unigram + bigram drafts into EXPORT_DIR, alpha against TARGET_MODEL); "
                  "feature_cache / feature_draft: the target-aware draft's feature cache and "
                  "its training (configs/runs/feature_draft.gin).")


NGRAM_UNUSED_MACROS = ("MODEL", "MODEL_DIR", "TRAIN_STEPS")


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
    """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE` (as t5x.gin_utils.rewrite_gin_args)."""
    out = []
    for arg in argv:
        match = re.fullmatch(r"--gin\.([^=]+)=(.*)", arg, flags=re.DOTALL)
        out.append(f"--gin_bindings={match.group(1)} = {match.group(2)}" if match else arg)
    return out


def parse_gin(run: str, gin_files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str] = (".",)) -> None:
    """Parses the gin files and bindings for `run` ('train' or 'ngrams')."""
    bindings = list(bindings)
    if run == "feature_cache":  # the training run's macro is not needed to build the cache
        bindings = ["MODEL_DIR = None"] + bindings
    if run == "ngrams":  # train.gin's REQUIRED training macros do not apply; user bindings win
        bindings = [f"{name} = None" for name in NGRAM_UNUSED_MACROS] + bindings
    config_lib.check_macros(gin_files, bindings, search_paths)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), bindings)
    except (SyntaxError, tokenize.TokenError) as e:  # one line naming the fix
        raise ValueError(config_lib.parse_error_message(e, bindings)) from None


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.gin_file:
        raise ValueError("no --gin_file: the run's settings are in configs/runs/train.gin (or "
                         "train_code.gin, feature_draft.gin); pass it with a model file, as in "
                         "the example of --help.")
    for path in FLAGS.gin_search_paths:
        gin.add_config_file_search_path(os.path.abspath(path))
    parse_gin(FLAGS.run, FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
    if FLAGS.run == "feature_cache":
        feature_draft.feature_cache()
        return
    if FLAGS.run == "train":
        training.train(gin.get_configurable(training.TrainRun)(gin_config=gin.config_str()))
        return
    run = {"ngrams": training.fit_ngram_drafts,
           "feature_draft": feature_draft.train_feature_draft}[FLAGS.run]
    gin.get_configurable(run)(gin_config=gin.config_str())


if __name__ == "__main__":
    config_lib.run_app(main, argv=rewrite_gin_args(sys.argv))
