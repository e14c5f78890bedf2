r"""Measures a draft's acceptance rate alpha along text the target generates (Cor. 3.6).

For each sampling setting it generates NUM_TOKENS tokens with the target (10,000 by default, as
the paper), teacher-forces target and draft on them and averages beta = sum_x min(p, q) over the
generated positions. It prints a table of alpha, its naive, sequence-clustered and batch-means
standard errors and the lag-1 autocorrelation of beta, and writes <OUTPUT_DIR>/alpha.json (with
the beta histogram; schema: docs/benchmark_schema.md) and <OUTPUT_DIR>/config.gin.
All logic is in speculative/runs/alpha.py; configs/runs/measure_alpha.gin lists the macros.

Example (random weights; expect alpha near 0 at temperature 0 for two unrelated random models):

  python scripts/measure_alpha.py \
      --gin_file=configs/models/t5_1_1_small.gin --gin_file=configs/models/t5_1_1_tiny.gin \
      --gin_file=configs/runs/measure_alpha.gin \
      --gin.TARGET_MODEL=@t5_1_1_small/t5.T5Config\(\) \
      --gin.DRAFT_MODEL=@t5_1_1_tiny/t5.T5Config\(\) \
      --gin.TARGET_CHECKPOINT=None --gin.DRAFT_CHECKPOINT=None \
      --gin.OUTPUT_DIR=\"/tmp/alpha\" --gin.NUM_TOKENS=2000
"""

from speculative.runs import alpha, config


def main():
    alpha.run()


if __name__ == "__main__":
    config.run(main, gin_file="configs/runs/measure_alpha.gin")
