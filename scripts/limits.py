r"""Where speculative decoding stops paying: speedup against batch size, and the bandwidth limit.

For each bundled target (large_target: memory-bound on a CPU; mini_target: compute-bound) and
its best draft, times speculative against autoregressive decoding on the same test sentences at
every --batch_sizes (gamma per batch by Theorem 3.8), measures the machine's streaming-read
bandwidth, and compares each target step, verify call and baseline step with the time the
bytes it must read take at that bandwidth. Writes into --output_dir: batch_scaling.md (with
the batch at which speculation stops paying), bandwidth.md, speedup_vs_batch.png and
limits.json (schema and method: speculative/experiments/limits.py; how to read it: docs/limits.md).
An earlier limits.json there is kept unless --overwrite.

Example (temperatures 0 and 1; about 20 minutes on 2 CPU cores with nothing else running,
mostly the large_target rows; the default --temperatures=0 takes about half):
  python scripts/limits.py --output_dir=results/limits --temperatures=0,1
How a deeper copy of large_target (random weights) would verify on this machine (writes
depth_sweep.md and depth_sweep.json; about 5 minutes for 6, 12, 24 and 48 decoder layers):
  python scripts/limits.py --output_dir=/tmp/depth --depths=6,12,24,48
Quick check (about a minute):
  python scripts/limits.py --output_dir=/tmp/limits --targets=mini_target --batch_sizes=1,2 \
      --num_sentences=2 --gammas=2 --repeats=1 --max_decode_len=8 --bandwidth_mb=64
"""

from absl import app, flags

from speculative.data import bundles
from speculative.experiments import limits
from speculative.measure import host
from speculative.runs import config as config_lib
from speculative.runs.config import flag_numbers

_OUT = flags.DEFINE_string("output_dir", limits.DEFAULT_DIR, "Where the results go.")
_TARGETS = flags.DEFINE_list("targets", None, "Bundled targets (default: all bundled).")
_BATCH = flags.DEFINE_list("batch_sizes", [str(b) for b in limits.BATCH_SIZES],
                           "Batch sizes; --num_sentences must be a multiple of each.")
_TEMPS = flags.DEFINE_list("temperatures", ["0"], "Temperatures (0 = argmax); 0,1 doubles "
                           "the decode timings.")
_GAMMAS = flags.DEFINE_list("gammas", [str(g) for g in limits.GAMMAS],
                            "Candidate gammas (Theorem 3.8 picks one per batch from the card's "
                            "alpha and the measured costs); a single value fixes gamma.")
_SENTENCES = flags.DEFINE_integer("num_sentences", 64, "Test sentences decoded at every batch "
                                  "size.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved timing rounds (medians reported).")
_COST_STEPS = flags.DEFINE_integer("cost_steps", 16, "Extend calls per cost-model timing at "
                                  "batch 1 (at batch B: cost_steps / B, at least 2).")
_MAX_LEN = flags.DEFINE_integer("max_decode_len", bundles.MAX_DECODE_LEN,
                                "Tokens generated per sentence at most.")
_BW_MB = flags.DEFINE_integer("bandwidth_mb", host.BANDWIDTH_BYTES >> 20,
                              "MiB summed by the bandwidth measurement (far above the "
                              "last-level cache).")
_BENCH = flags.DEFINE_list("benchmark_json", [], "benchmark.json files of scripts/benchmark.py "
                           "with a T5Config target (e.g. configs/runs/gpu_benchmark.gin's "
                           "synthetic runs): their target step and verify calls get the bound too.")
_DEPTHS = flags.DEFINE_list("depths", [], "Instead of the batch scaling: decoder-layer counts of "
                            "random-weight copies of large_target whose c and verify cost are "
                            "measured (limits.depth_sweep), e.g. 6,24,48.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier limits.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Every setting is checked (errors name the value and the fix) before any timing.
    if _DEPTHS.value:
        limits.run_depth_sweep(_OUT.value, flag_numbers(_DEPTHS.value, "depths", int),
                               gammas=flag_numbers(_GAMMAS.value, "gammas", int),
                               repeats=2 * _REPEATS.value, num_steps=_COST_STEPS.value,
                               overwrite=_OVERWRITE.value)
        return
    limits.run(_OUT.value, targets=_TARGETS.value,
               batch_sizes=flag_numbers(_BATCH.value, "batch_sizes", int),
               temperatures=flag_numbers(_TEMPS.value, "temperatures", float),
               gammas=flag_numbers(_GAMMAS.value, "gammas", int),
               num_sentences=_SENTENCES.value, repeats=_REPEATS.value,
               cost_steps=_COST_STEPS.value, max_decode_len=_MAX_LEN.value,
               bandwidth_bytes=_BW_MB.value << 20, benchmark_jsons=_BENCH.value,
               overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
