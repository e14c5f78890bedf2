#!/usr/bin/env bash
# Benchmarks speculative decoding on an accelerator machine (e.g. one H200) and writes JSON.
#
# Steps, each into OUT_DIR/<step>/ (JSON and tables; its log in OUT_DIR/logs/<step>.log):
#   install                  pip install -e . into .venv (created if missing), then
#                            jax[cuda12|cuda13] pinned to the jax version that installed
#                            (CUDA 13 when nvidia-smi's driver supports it); checks the GPU
#   synthetic                scripts/benchmark.py with configs/runs/gpu_benchmark.gin on a random
#                            T5 1.1 base- and large-sized target with the synthetic draft
#                            (alpha 0.8): batch 1 and 16, gamma 4, 64 tokens, 5 repeats
#   limits                   scripts/limits.py: both bundled pairs (target + best draft, 64 test
#                            sentences) at batch 1, 4, 16, 64, gamma from {2, 4, 6}; the device's
#                            bandwidth and each step over its bandwidth bound, the synthetic
#                            targets' included
#   pairs                    scripts/benchmark.py on each bundled pair: 16 test sentences at
#                            batch 1, gamma 2, 4, 6, Theorem 3.8 and decode-loop predictions
#   trees                    scripts/tree_benchmark.py on each bundled pair: per-rank acceptance,
#                            verify cost at every width up to 32 drafted nodes, the best chain
#                            and the best tree (theory.best_tree), timed at T = 0 and T = 1
#   beam                     scripts/beam_benchmark.py on each bundled pair: 16 test sentences,
#                            batch 1, beam 1, 2 and 4, length penalty 0.6: the host-driven, the
#                            jitted and the speculative beam search (its proposal chosen by
#                            measured verify cost), interleaved 3 times, target forwards, BLEU;
#                            then the whole test split in batches of 64: BLEU, plain = speculative
#   feature                  large_feature_draft's recipe (configs/runs/feature_draft.gin,
#                            the model card's CPU recipe, unchanged): the greedy feature cache
#                            of large_target and its sampled one (12 shards; FEATURE_CACHE,
#                            default /tmp/feature_cache: 6 GB, kept out of OUT_DIR), then the
#                            one-layer draft with training-time test on both (FEATURE_STEPS,
#                            default 5000) into OUT_DIR/feature/ttt1s, restricted to its 2500
#                            hottest ids and exported in bfloat16 to OUT_DIR/feature/models with
#                            its card entry; then scripts/feature_ablation.py against
#                            large_draft_kdtv and the bundled large_feature_draft
#   block                    chain against block drafts, each run twice: with XLA's GPU command
#                            buffers covering the decode loop's while and conditional bodies
#                            (OUT_DIR/block/command_buffers/) and without command buffers
#                            (OUT_DIR/block/no_command_buffers/). Each time,
#                            scripts/block_draft_benchmark.py on the large pair (large_block_draft
#                            against large_feature_draft as a chain: 4 test sentences, batch 1,
#                            gamma 2, 4, 7, T = 0 and 1, 2 repeats; c_round, per-depth
#                            acceptance, speedups) and scripts/block_cost_benchmark.py on a
#                            random T5 1.1 base-sized target with a random one-layer block draft
#                            reading its features (costs only: the target step, verify cost and
#                            c_round of the chain's gamma calls and the block's one at gamma 2,
#                            4, 7, 3 repeats; Theorem 3.8 at an assumed alpha of 0.8). Sized for
#                            under 8 minutes on one H200 (an estimate from the 2026-12-01 run's
#                            ~4-8 s per compiled program, not yet measured): each program
#                            compiles once per flag setting, ~34 for the large pair (16 round
#                            costs, 14 decodes, 4 acceptance) and 16 for the base pair (4 target
#                            programs, 12 proposal loops), about 3.5 minutes a setting; the
#                            separate T5 draft large_draft_kdtv is left out to fit
# summary.md: one markdown line per benchmark.py run in OUT_DIR (benchmark.summary_markdown).
# A failed step is reported and the next one runs; OUT_DIR/steps.tsv lists each step's exit
# code and seconds, and the script exits 1 if any failed. Results already in OUT_DIR are kept
# (each script refuses to overwrite them) unless OVERWRITE=1.
#
# Command:
#   bash scripts/gpu_benchmark.sh [--dry-run | --no-install]
#       [--steps=synthetic,limits,pairs,trees,beam,feature,block]
#       [OUT_DIR]
# OUT_DIR: default $OUT (the device machine's result folder), else /tmp/gpu_benchmark.
# Expected: a few minutes to install (tensorflow comes with seqio, the CUDA wheels with jax),
# then, on one H200 (2026-12-01, --no-install): synthetic base 86 s and large 131 s, the pairs
# 52 s and 38 s, limits over 283 s (stopped there at a time limit); mostly compilation
# (steps.tsv has the seconds; results/gpu/ holds that run). The
# compilation cache $JAX_COMPILATION_CACHE_DIR (default /tmp/speculative_jax_cache) serves
# programs compiled before.
# --dry-run: the same steps on CPU with tiny settings (t5_1_1_tiny as the synthetic target,
# mini_target as the bundled pair, 2 sentences, 1 repeat, 8 tokens; the feature step caches 32
# sentences of mini_target and trains 2 steps, without the ablation; the block step times
# t5_1_1_tiny's random pair only, both XLA flag settings, gamma 2, 1 repeat), no install: a few
# minutes on 2 cores.
# --no-install: no install step, for machines without a package registry whose Python already
# has JAX for the GPU (e.g. a lent H200's image): PYTHON (default python3) must import jax, flax,
# optax, orbax, tensorstore, sentencepiece and gin (gin-config can be carried as a wheel and
# installed with pip --target); seqio and TensorFlow are not needed, as the pairs read the test
# split's TSV directly (the ids the mini_ende task gives); the first step checks that JAX sees
# a GPU.
# Environment: PYTHON (default .venv/bin/python), JAX_CUDA=cuda12|cuda13 (instead of the driver
# check), JAX_VERSION (pin jax and its CUDA plugin to this version), OVERWRITE=1.

set -euo pipefail

usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; }
DRY_RUN=0
NO_INSTALL=0
OUT_DIR=""
STEPS_WANTED="synthetic,limits,pairs,trees,beam,feature,block"
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --no-install) NO_INSTALL=1 ;;
    --steps=*) STEPS_WANTED="${arg#--steps=}" ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu_benchmark.sh: unknown option $arg; see --help." >&2; exit 2 ;;
    *) if [[ -n "$OUT_DIR" ]]; then
         echo "gpu_benchmark.sh: give one OUT_DIR (got $OUT_DIR and $arg)." >&2; exit 2
       fi
       OUT_DIR="$arg" ;;
  esac
done
if (( DRY_RUN && NO_INSTALL )); then
  echo "gpu_benchmark.sh: --dry-run runs on CPU without installing; drop --no-install." >&2
  exit 2
fi
for s in ${STEPS_WANTED//,/ }; do
  if [[ ! "$s" =~ ^(synthetic|limits|pairs|trees|beam|feature|block)$ ]]; then
    echo "gpu_benchmark.sh: --steps=$STEPS_WANTED names '$s'; choose from synthetic,limits,pairs,trees,beam,feature,block." >&2
    exit 2
  fi
done
wanted() { [[ ",$STEPS_WANTED," == *",$1,"* ]]; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="${OUT_DIR:-${OUT:-/tmp/gpu_benchmark}}"
mkdir -p "$OUT_DIR/logs"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
STEPS="$OUT_DIR/steps.tsv"
printf 'step\texit_code\tseconds\n' > "$STEPS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/speculative_jax_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
FAILED=()

# step NAME COMMAND...: runs the command, its output into logs/NAME.log and to stdout.
step() {
  local name="$1" start=$SECONDS code=0
  shift
  echo "=== $name: $*"
  "$@" > >(tee "$OUT_DIR/logs/$name.log") 2>&1 || code=$?
  printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" >> "$STEPS"
  if (( code )); then
    FAILED+=("$name")
    echo "=== $name failed (exit $code); its log: $OUT_DIR/logs/$name.log"
  fi
  return 0
}

GPU_CHECK='import jax; print(jax.devices()); assert jax.default_backend() == "gpu", "no GPU"'

install() {  # every command checked: `set -e` does not apply inside `step`'s `||`
  if [[ ! -x "$PY" ]]; then python3 -m venv .venv || return; fi
  "$PY" -m pip install -q --upgrade pip setuptools wheel || return
  "$PY" -m pip install -q -e . || return
  local version cuda="${JAX_CUDA:-}" driver=""
  version="${JAX_VERSION:-$("$PY" -c 'import jax; print(jax.__version__)')}" || return
  if [[ -z "$cuda" ]]; then
    driver="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)"
    if [[ "${driver:-12}" -ge 13 ]]; then cuda=cuda13; else cuda=cuda12; fi
  fi
  echo "driver CUDA ${driver:-?}: installing jax[$cuda]==$version"
  "$PY" -m pip install -q "jax[$cuda]==$version" || return
  "$PY" -c "$GPU_CHECK"
}

if (( DRY_RUN )); then
  PY="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"  # fast compiles
  SIZES=(t5_1_1_tiny)
  PAIRS=(mini_target)
  SYNTHETIC=(--gin.BATCH_SIZES=[1] --gin.GAMMAS=[2] --gin.MAX_DECODE_LEN=8
             --gin.INPUT_LENGTH=8 --gin.REPEATS=1)
  PAIR=(--gin.NUM_BATCHES=2 --gin.GAMMAS=[2] --gin.MAX_DECODE_LEN=8 --gin.REPEATS=1
        --gin.CALIBRATION_BATCHES=0)
  LIMITS=(--batch_sizes=1 --num_sentences=2 --gammas=2 --repeats=1 --max_decode_len=8
          --bandwidth_mb=16)
  TREES=(--num_sentences=2 --num_rank_sentences=4 --repeats=1 --max_nodes=4 --temperatures=0)
  BLOCK=()  # the large pair's block benchmark is not part of the CPU dry run
  BLOCK_COSTS=(--target=t5_1_1_tiny --gammas=2 --repeats=1 --round_steps=2 --max_decode_len=8
               --input_length=8)
  BEAM=(--num_sentences=2 --beam_sizes=1,2 --repeats=1 --split_sentences=2 --split_batch=2)
  FEATURE_TARGET=mini_target FEATURE_NAME=mini_draft_feature
  FEATURE=(--gin.FEATURE_LAYERS="(1,2,3)" --gin.feature_cache.feature_layers="(1,2,3)"
           --gin.feature_draft.FeatureDraftConfig.target_emb_dim=192
           --gin.feature_cache.shard_size=32)
  FEATURE_SHARDS=(1 1)  # greedy, sampled
  FEATURE_TRAIN=(--gin.TRAIN_STEPS=2 --gin.feature_draft.FeatureTrainConfig.batch_tokens=128
                 --gin.train_feature_draft.alpha_sentences=2 --gin.train_feature_draft.hot_vocab=50)
  FEATURE_ABLATION=()
else
  PY="${PYTHON:-$( (( NO_INSTALL )) && echo python3 || echo .venv/bin/python)}"
  SIZES=(t5_1_1_base t5_1_1_large)
  PAIRS=(large_target mini_target)
  SYNTHETIC=()
  PAIR=(--gin.NUM_BATCHES=16 --gin.GAMMAS=[2,4,6] --gin.CALIBRATION_BATCHES=8)
  LIMITS=(--batch_sizes=1,4,16,64 --num_sentences=64 --gammas=2,4,6)
  TREES=(--num_sentences=16 --num_rank_sentences=64 --repeats=3 --max_nodes=32)
  BLOCK=(--drafts=large_block_draft,large_feature_draft --num_sentences=4 --repeats=2
         --gammas=2,4,7)
  BLOCK_COSTS=(--target=t5_1_1_base --gammas=2,4,7 --repeats=3)
  BEAM=(--num_sentences=16 --beam_sizes=1,2,4 --repeats=3 --split_batch=64)
  FEATURE_TARGET=large_target FEATURE_NAME=large_draft_feature
  FEATURE=()
  FEATURE_SHARDS=(None 12)
  FEATURE_TRAIN=(--gin.TRAIN_STEPS="${FEATURE_STEPS:-5000}" --gin.train_feature_draft.hot_vocab=2500)
  FEATURE_ABLATION=(--num_sentences=16 --repeats=3)
  if (( NO_INSTALL )); then
    step check_gpu "$PY" -c "$GPU_CHECK"
  else
    step install install
  fi
  if (( ${#FAILED[@]} )); then
    echo "gpu_benchmark.sh: ${FAILED[0]} failed; nothing else can run." >&2
    exit 1
  fi
fi
OVERWRITE_GIN=()
OVERWRITE_FLAG=()
if [[ "${OVERWRITE:-0}" == 1 ]]; then
  OVERWRITE_GIN=(--gin.OVERWRITE=True)
  OVERWRITE_FLAG=(--overwrite)
fi
"$PY" -c 'import jax; print("devices:", jax.devices())'

BENCHMARK_JSONS=()  # the synthetic runs in OUT_DIR (this call's or an earlier one's)
for size in "${SIZES[@]}"; do
  if wanted synthetic; then
    step "${size}_synthetic" "$PY" scripts/benchmark.py \
      --gin_file="configs/models/$size.gin" --gin_file=configs/runs/gpu_benchmark.gin \
      "--gin.TARGET_MODEL=@$size/t5.T5Config()" \
      "--gin.OUTPUT_DIR='$OUT_DIR/${size}_synthetic'" "${SYNTHETIC[@]}" "${OVERWRITE_GIN[@]}"
  fi
  if [[ -f "$OUT_DIR/${size}_synthetic/benchmark.json" ]]; then
    BENCHMARK_JSONS+=("$OUT_DIR/${size}_synthetic/benchmark.json")
  fi
done

if wanted limits; then
  step limits "$PY" scripts/limits.py --output_dir="$OUT_DIR/limits" \
    --targets="$(IFS=,; echo "${PAIRS[*]}")" \
    --benchmark_json="$(IFS=,; echo "${BENCHMARK_JSONS[*]}")" "${LIMITS[@]}" \
    "${OVERWRITE_FLAG[@]}"
fi

for target in "${PAIRS[@]}"; do
  wanted pairs || break
  draft="$("$PY" -c "from speculative.runs import mini; print(mini.best_draft('$target'))")"
  step "${target}_pair" "$PY" scripts/benchmark.py --gin_file=configs/runs/gpu_benchmark.gin \
    "--gin.TARGET_MODEL=@target/mini.load()" "--gin.target/mini.load.name='$target'" \
    "--gin.DRAFT_MODEL=@draft/mini.load()" "--gin.draft/mini.load.name='$draft'" \
    --gin.SYNTHETIC_ACCEPTANCE=None "--gin.SPLIT='test'" \
    "--gin.benchmark.run.tsv_path='speculative/data/mini/test.tsv'" \
    --gin.BATCH_SIZES=[1] --gin.INPUT_LENGTH=48 --gin.MAX_DECODE_LEN=48 \
    "--gin.OUTPUT_DIR='$OUT_DIR/${target}_pair'" "${PAIR[@]}" "${OVERWRITE_GIN[@]}"
done

for target in "${PAIRS[@]}"; do
  wanted trees || break
  step "${target}_trees" "$PY" scripts/tree_benchmark.py --target="$target" \
    --output_dir="$OUT_DIR/${target}_trees" "${TREES[@]}" "${OVERWRITE_FLAG[@]}"
done

for target in "${PAIRS[@]}"; do
  wanted beam || break
  step "${target}_beam" "$PY" scripts/beam_benchmark.py --target="$target" \
    --output_dir="$OUT_DIR/${target}_beam" "${BEAM[@]}" "${OVERWRITE_FLAG[@]}"
done

# Chains against block drafts, with XLA's GPU command buffers covering the decode loop's
# while/conditional bodies and without them (launch costs are what a block saves): the large
# pair (not in the dry run) and a random T5 1.1 pair (costs only), each setting into its folder.
if wanted block; then
  CMD_BUFFERS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL"
  for mode in command_buffers no_command_buffers; do
    if [[ "$mode" == command_buffers ]]; then FLAGS="$CMD_BUFFERS"
    else FLAGS="--xla_gpu_enable_command_buffer="; fi
    if (( ${#BLOCK[@]} )); then
      step "block_$mode" env XLA_FLAGS="${XLA_FLAGS:-} $FLAGS" \
        "$PY" scripts/block_draft_benchmark.py --output_dir="$OUT_DIR/block/$mode" \
        "${BLOCK[@]}" "${OVERWRITE_FLAG[@]}"
    fi
    step "block_costs_$mode" env XLA_FLAGS="${XLA_FLAGS:-} $FLAGS" \
      "$PY" scripts/block_cost_benchmark.py --output_dir="$OUT_DIR/block/$mode" \
      "${BLOCK_COSTS[@]}" "${OVERWRITE_FLAG[@]}"
  done
fi

if wanted feature; then
  FCACHE="${FEATURE_CACHE:-/tmp/feature_cache}/$FEATURE_TARGET"
  FGIN=(--gin_file=configs/runs/feature_draft.gin --gin.FEATURE_CACHE="'$FCACHE'"
        --gin.feature_cache.target="'$FEATURE_TARGET'"
        --gin.train_feature_draft.target="'$FEATURE_TARGET'" "${FEATURE[@]}")
  step feature_cache "$PY" scripts/train.py --run=feature_cache "${FGIN[@]}" \
    --gin.feature_cache.max_shards="${FEATURE_SHARDS[0]}"
  step feature_cache_sampled "$PY" scripts/train.py --run=feature_cache "${FGIN[@]}" \
    --gin.FEATURE_CACHE="'$FCACHE.sampled'" --gin.feature_cache.temperature=1.0 \
    --gin.feature_cache.max_shards="${FEATURE_SHARDS[1]}"
  step feature_train "$PY" scripts/train.py --run=feature_draft "${FGIN[@]}" "${FEATURE_TRAIN[@]}" \
    "--gin.feature_draft.FeatureTrainConfig.extra_caches=(\"$FCACHE.sampled\",)" \
    --gin.MODEL_DIR="'$OUT_DIR/feature/ttt1s'" \
    --gin.EXPORT_DIR="'$OUT_DIR/feature/models'" --gin.NAME="'$FEATURE_NAME'"
  if (( ${#FEATURE_ABLATION[@]} )); then
    step feature_ablation "$PY" scripts/feature_ablation.py \
      --drafts="large_draft_kdtv,large_feature_draft,ttt1s_hot2500=$OUT_DIR/feature/ttt1s@2500" \
      --output_dir="$OUT_DIR/feature/ablation" "${FEATURE_ABLATION[@]}" "${OVERWRITE_FLAG[@]}"
  fi
fi

JSONS=("$OUT_DIR"/*/benchmark.json)  # this call's and earlier calls' runs in OUT_DIR
if [[ -e "${JSONS[0]}" ]]; then
  "$PY" -c 'import sys; from speculative.runs import benchmark
sys.stdout.write(benchmark.summary_markdown(sys.argv[1:]))' "${JSONS[@]}" > "$OUT_DIR/summary.md"
  cat "$OUT_DIR/summary.md"
fi
echo "=== steps (exit code, seconds):"
column -t "$STEPS" 2>/dev/null || cat "$STEPS"
if (( ${#FAILED[@]} )); then
  echo "gpu_benchmark.sh: failed steps: ${FAILED[*]} (logs in $OUT_DIR/logs/)" >&2
  exit 1
fi
echo "gpu_benchmark.sh: results in $OUT_DIR"
