r"""Times speculative vs autoregressive decoding and compares the speedup with Theorem 3.8.

For a target/draft pair, gammas, batch sizes and sampling settings it times both decoders after
compilation (interleaved repeats; median and spread), measures the cost coefficient c and the
verification cost, reads alpha and tokens per target call from the decode counters, and writes
<OUTPUT_DIR>/benchmark.json (schema: docs/benchmark_schema.md) and <OUTPUT_DIR>/config.gin.
All logic is in speculative/runs/benchmark.py; configs/runs/benchmark.gin lists the macros.

Example (random-weight T5 1.1 small target and tiny draft, CPU, a few minutes):

  python scripts/benchmark.py \
      --gin_file=configs/models/t5_1_1_small.gin --gin_file=configs/models/t5_1_1_tiny.gin \
      --gin_file=configs/runs/benchmark.gin \
      --gin.TARGET_MODEL=@t5_1_1_small/t5.T5Config\(\) \
      --gin.DRAFT_MODEL=@t5_1_1_tiny/t5.T5Config\(\) \
      --gin.TARGET_CHECKPOINT=None --gin.DRAFT_CHECKPOINT=None \
      --gin.OUTPUT_DIR=\"/tmp/bench\" --gin.GAMMAS=[1,3,5] --gin.MAX_DECODE_LEN=32

Add --gin.SYNTHETIC_ACCEPTANCE=0.8 to time the machinery at a fixed acceptance rate, and
--gin.TASK=\"mini_ende\" to decode real inputs. Plot speedup against gamma (one temperature and
batch size per file reads best) with
  python scripts/plot_theory.py --output_dir=/tmp/bench \
      --benchmark_json=/tmp/bench/benchmark.json
"""

from speculative.runs import benchmark, config


def main():
    benchmark.run()


if __name__ == "__main__":
    config.run(main, gin_file="configs/runs/benchmark.gin")
