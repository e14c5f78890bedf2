r"""Reproduces rows of the paper's Table 2: alpha, gamma, speedup, and Theorem 3.8's prediction.

Each row is a gin file, configs/experiments/table2/<row>.gin (the paper's 12: ende_{small,base,
large}_t{0,1} and cnndm_{small,base,large}_t{0,1}; target T5-XXL, the paper's gamma, its alpha
and speedup in the header). For every row this runs speculative decoding and the baseline (the
target alone, same pipeline, both timed without compilation; scripts/infer.py's run), measures
c = draft step / target step time with single-token extend calls (or takes --c=0.02, or
--c=paper for Table 4's values), and writes OUTPUT_DIR/table2.md and table2.json in the paper's
format (Task, M_q, Temp, gamma, alpha, Speed) with Theorem 3.8 beside each row, plus every run's
outputs (<task>-predict.jsonl-00000-of-00001, metrics.json, config.gin) under
OUTPUT_DIR/<row>/{speculative,baseline}/.
A ★ after M_q marks the best draft for that task and temperature: the paper's (its Table 2's
star), or for a bundled row the one its gin file names (`table2.RowInfo.best = True`).

Rows that run anywhere, with the bundled models and no checkpoint flags (large, mini and code
pairs, each draft at T = 0 and T = 1; a row takes 1-3 minutes on 2 CPU cores):

  python scripts/reproduce_table2.py \
    --gin_file=configs/experiments/table2_bundled/large_kdtv_t0.gin --output_dir=out/table2

  python scripts/reproduce_table2.py --rows_dir=configs/experiments/table2_bundled \
    --rows=large_kdtv_t0,large_kdtv_t1 --output_dir=out/table2_large

Checkpoints: the paper's fine-tuned T5 1.1 checkpoints are unpublished, so every paper row needs
yours. Give them as a JSON file mapping row-name patterns (fnmatch, applied in order) to paths:

  {"ende_*": {"target": "/ckpt/ende/t5_1_1_xxl"},
   "ende_small_*": {"draft": "/ckpt/ende/t5_1_1_small"},
   "ende_base_*": {"draft": "/ckpt/ende/t5_1_1_base"}, ...,
   "cnndm_*": {"target": "/ckpt/cnndm/t5_1_1_xxl"}, "cnndm_small_*": {"draft": "..."}, ...}

Example (two rows, the first 100 examples of each; expect alpha near 0.75 / 0.62 and speedups
of roughly 3.4X / 2.6X on a TPU v4 with the paper's checkpoints):

  python scripts/reproduce_table2.py --rows=ende_small_t0,ende_small_t1 \
    --checkpoints=checkpoints.json --output_dir=/tmp/table2 \
    --row_gin="NUM_EXAMPLES = 100"

Check the rows resolve (no data, no models, no checkpoints file): add --dry_run. Other row
sets are gin files of the same form in another directory: --rows_dir=DIR --rows=all. The run
function is speculative.runs.table2.reproduce; --gin.reproduce.X=... binds its other arguments
(e.g. --gin.reproduce.cost_repeats=50).
"""

from absl import flags

from speculative.runs import config, table2

flags.DEFINE_list("rows", None, "Row names (gin file stems in --rows_dir), or 'all'; or give "
                  "row files with --gin_file.")
flags.DEFINE_string("output_dir", None, "Where table2.md, table2.json and the runs go (default: "
                    "print the table only).")
flags.DEFINE_string("checkpoints", None, "JSON file: {row pattern: {target:, draft:}}.")
flags.DEFINE_string("rows_dir", None, "Directory of row gin files (default: the paper's 12).")
flags.DEFINE_multi_string("row_gin", [], "Gin binding applied to every row, e.g. 'SEED = 1'.")
flags.DEFINE_string("c", None, "c for Theorem 3.8: a number or 'paper'; default: measure it.")
flags.DEFINE_bool("dry_run", False, "Only resolve each row's settings.")
flags.DEFINE_bool("overwrite", False, "Replace an earlier run in --output_dir (else refused).")
flags.DEFINE_string("tfds_data_dir", None, "Where the paper tasks' prepared TFDS data is.")

FLAGS = flags.FLAGS


def main():
    # A dry run resolves the rows only: no checkpoints file and no output directory needed.
    kwargs = {"dry_run": True, "output_dir": None} if FLAGS.dry_run else {}
    if FLAGS.gin_file and FLAGS.rows is None:  # --gin_file=<row>.gin: those rows
        kwargs["rows"] = list(FLAGS.gin_file)
    elif FLAGS.gin_file:
        raise ValueError(f"--gin_file={FLAGS.gin_file} and --rows={FLAGS.rows}: give the rows one "
                         "way, row gin files (--gin_file) or names in --rows_dir (--rows).")
    if not FLAGS.dry_run and FLAGS.output_dir is None:
        print("No --output_dir: the table is printed, nothing is written.")
    if FLAGS.overwrite:
        kwargs["overwrite"] = True
    for name in ("rows", "output_dir", "checkpoints", "rows_dir"):
        if FLAGS[name].value is not None:
            kwargs[name] = FLAGS[name].value
    row_bindings = list(FLAGS.row_gin)
    if FLAGS.tfds_data_dir:
        row_bindings.append(f"infer.infer.tfds_data_dir = {FLAGS.tfds_data_dir!r}")
    if row_bindings:
        kwargs["row_bindings"] = row_bindings
    if FLAGS.c is not None:
        kwargs["c"] = FLAGS.c if FLAGS.c == "paper" else float(FLAGS.c)
    table2.reproduce(**kwargs)


if __name__ == "__main__":
    config.run(main)
