r"""Decodes a seqio task (or your own inputs) with speculative decoding; writes T5X's outputs.

Reads MIXTURE_OR_TASK_NAME's SPLIT (or INPUT_FILE: a text file, one input a line, a .tsv
input<TAB>reference or a .jsonl {"input": ..., "target": ...} a line, encoded with the task's
vocabulary and prefix), decodes it with TARGET_MODEL checked by DRAFT_MODEL (SPECULATIVE=False:
the target alone; MODE='score': the target's log-likelihood of each given target) and writes, as
T5X's infer.py does, INFER_OUTPUT_DIR/<task>-<mode>.jsonl-<shard>-of-<num_shards> (one line per
example: inputs, prediction, our alpha and target calls) in chunks of CHECKPOINT_PERIOD batches,
so that the same command run again after a kill resumes where it stopped; then metrics.json
(BLEU or ROUGE where there are references, decode seconds excluding compile, tokens/s, alpha,
tokens per target call, what GAMMA 'auto' chose and why) and config.gin. SHARD_ID / NUM_SHARDS
split the inputs; CHECKPOINT_PATH is T5X's name for TARGET_CHECKPOINT. Settings and macros:
configs/runs/infer.gin; the run: speculative/runs/infer.py. A paper task whose TFDS data is not
on this machine stops with one TaskDataUnavailableError message before any model is loaded.

Example (offline: bundled mini_ende task, random-weight models because the checkpoints are None):

  python scripts/infer.py --gin_file=configs/runs/infer.gin \
    --gin_file=configs/models/t5_1_1_small.gin --gin_file=configs/models/t5_1_1_tiny.gin \
    --gin.TARGET_MODEL="@t5_1_1_small/t5.T5Config()" \
    --gin.DRAFT_MODEL="@t5_1_1_tiny/t5.T5Config()" \
    --gin.TARGET_CHECKPOINT=None --gin.DRAFT_CHECKPOINT=None \
    --gin.MIXTURE_OR_TASK_NAME=\"mini_ende\" \
    --gin.TASK_FEATURE_LENGTHS="{'inputs': 64, 'targets': 32}" \
    --gin.INFER_OUTPUT_DIR=\"out/infer_mini\" --gin.NUM_EXAMPLES=8

(about a minute on 2 CPU cores; random weights: alpha ~ 0, BLEU ~ 0.)

A paper row (Table 2; checkpoints are yours, the paper's fine-tuned ones are unpublished):

  python scripts/infer.py --gin_file=configs/experiments/table2/ende_small_t0.gin \
    --gin.TARGET_CHECKPOINT=\"/ckpt/ende_t5_1_1_xxl\" --gin.DRAFT_CHECKPOINT=\"/ckpt/ende_small\" \
    --gin.INFER_OUTPUT_DIR=\"/tmp/ende_small_t0\"

Decoder-only (GPT-like) models continue prompts instead: the bundled code pair on the
stdlib_code task (16 lines of a standard-library file -> the next 16; no metric, alpha and
tokens per target call in metrics.json; prompts longer than 'inputs' keep their last tokens):

  python scripts/infer.py --gin_file=configs/runs/infer.gin \
    --gin_file=configs/models/code_target.gin --gin_file=configs/models/code_draft.gin \
    --gin.TARGET_MODEL="@code_target/t5.T5Config()" --gin.DRAFT_MODEL="@code_draft/t5.T5Config()" \
    --gin.TARGET_CHECKPOINT=\"speculative/data/code/models/code_target\" \
    --gin.DRAFT_CHECKPOINT=\"speculative/data/code/models/code_draft\" --gin.DECODER_ONLY=True \
    --gin.MIXTURE_OR_TASK_NAME=\"stdlib_code\" \
    --gin.TASK_FEATURE_LENGTHS="{'inputs': 256, 'targets': 64}" \
    --gin.INFER_OUTPUT_DIR=\"out/infer_code\" --gin.NUM_EXAMPLES=16

Add --gin.SPECULATIVE=False for the baseline (at TEMPERATURE=0 its predictions are identical).
"""

import sys

from absl import flags

from speculative.runs import config

flags.DEFINE_string("tfds_data_dir", None,
                    "Where the paper tasks' prepared TFDS data is (as T5X's flag).")

FLAGS = flags.FLAGS


def main():
    from speculative.data import tasks  # pylint: disable=g-import-not-at-top
    from speculative.runs import infer  # pylint: disable=g-import-not-at-top

    kwargs = {"tfds_data_dir": FLAGS.tfds_data_dir} if FLAGS.tfds_data_dir else {}
    try:
        infer.infer(**kwargs)
    except tasks.TaskDataUnavailableError as e:  # one message, without gin's call-site suffix
        sys.exit(f"TaskDataUnavailableError: {str(e).split(chr(10) + '  In call to')[0]}")


if __name__ == "__main__":
    config.run(main, gin_file="configs/runs/infer.gin")
