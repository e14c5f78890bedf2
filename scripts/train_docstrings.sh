#!/usr/bin/env bash
# Trains the code -> docstring pair (Table 2's summarization task) with scripts/train.py, the
# whole recipe as one script (stages share scripts/train_stages.sh with train_large.sh).
#
# Stages, in this order (each a scripts/train.py run, resumable: a stopped stage continues from
# its last saved state when the script is run again with the same settings; a stage whose
# OUT_ROOT/<name>/summary.json exists is skipped):
#   base    the target's first phase: BASE_STEPS steps (2000; under one epoch in all, so no
#           dropout) at learning rate 0.01 (200 warmup steps, cosine decay); not exported
#   mid     the second phase: base continued for MID_STEPS steps (2500) at 0.005 (100 warmup
#           steps, cosine decay) with seed 1, so that its batches are a new order of the corpus
#           rather than base's again (the data order follows the seed); not exported
#   target  docstring_target: mid continued for TARGET_STEPS steps (5000) at 0.005 (100 warmup
#           steps, cosine decay) with seed 2, then exported (bfloat16) to EXPORT_DIR
#   s       docstring_draft_s: distilled (the exported target's greedy docstrings of
#           DISTILL_PAIRS training functions, cached in OUT_ROOT/distill_greedy.npz), DRAFT_STEPS
#           steps at learning rate 0.03
#   m       docstring_draft_m: the same on the same cache
#   hybrid  docstring_hybrid: the model card entry of prompt lookup (n >= 2) where the source
#           matches and docstring_draft_s elsewhere, its alpha measured (scripts/add_hybrid_draft.py)
# The drafts learn from, and have their alpha measured against, the exported target.
#
# Command (from the repository root):
#   bash scripts/train_docstrings.sh [--stages=mid,target] [--print] [OUT_ROOT] [-- TRAIN_ARGS...]
# --print: print each stage's train.py command instead of running it. OUT_ROOT: default
# out/docstrings (ignored by git; keep it to resume). TRAIN_ARGS go to every train.py call.
# Environment: PYTHON (default .venv/bin/python), EXPORT_DIR (default
# speculative/data/docstrings/models), BASE_STEPS (2000), MID_STEPS (2500), TARGET_STEPS (5000),
# DRAFT_STEPS (1200), DISTILL_PAIRS (4096), CHECKPOINT_EVERY (50).
# The train split must exist first: python scripts/build_docstring_corpus.py --train_split_only
# JAX's persistent compilation cache (OUT_ROOT/jax_cache) spares a resumed run its compiles.

set -euo pipefail

ALL="base,mid,target,s,m,hybrid"
source "$(dirname "${BASH_SOURCE[0]}")/train_stages.sh"
parse_stage_args "$@"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_ROOT="${OUT_ROOT:-out/docstrings}"
PYTHON="${PYTHON:-.venv/bin/python}"
EXPORT_DIR="${EXPORT_DIR:-speculative/data/docstrings/models}"
BASE_STEPS="${BASE_STEPS:-2000}"
MID_STEPS="${MID_STEPS:-2500}"
TARGET_STEPS="${TARGET_STEPS:-5000}"
DRAFT_STEPS="${DRAFT_STEPS:-1200}"
DISTILL_PAIRS="${DISTILL_PAIRS:-4096}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$OUT_ROOT/jax_cache}"
(( PRINT )) || mkdir -p "$OUT_ROOT"

COMMON=(--gin_file=configs/models/docstring_target.gin --gin_file=configs/runs/train_docstrings.gin
        --gin.EXPORT_DIR="$(q "$EXPORT_DIR")" --gin.CHECKPOINT_EVERY="${CHECKPOINT_EVERY:-50}")
DRAFT=("${COMMON[@]}" --gin_file=configs/models/docstring_draft.gin --gin.LEARNING_RATE=0.03
       --gin.TARGET_MODEL='@docstring_target/t5.T5Config()'
       --gin.TARGET_CHECKPOINT="$(q "$EXPORT_DIR/docstring_target")"
       --gin.DISTILL=True --gin.DISTILL_PAIRS="$DISTILL_PAIRS"
       --gin.DISTILL_CACHE="$(q "$OUT_ROOT/distill_greedy.npz")" --gin.TRAIN_STEPS="$DRAFT_STEPS")

TARGET=("${COMMON[@]}" --gin.MODEL='@docstring_target/t5.T5Config()'
        --gin.docstring_target/t5.T5Config.dropout_rate=0.0)
if wanted base; then
  stage docstring_target_base "${TARGET[@]}" --gin.TRAIN_STEPS="$BASE_STEPS" \
    --gin.LEARNING_RATE=0.01 --gin.WARMUP_STEPS=200 --gin.EXPORT_DIR=None
fi
if wanted mid; then
  stage docstring_target_mid "${TARGET[@]}" --gin.TRAIN_STEPS="$MID_STEPS" \
    --gin.LEARNING_RATE=0.005 --gin.WARMUP_STEPS=100 --gin.SEED=1 --gin.EXPORT_DIR=None \
    --gin.INIT_CHECKPOINT="$(q "$OUT_ROOT/docstring_target_base/checkpoint_$BASE_STEPS")"
fi
if wanted target; then
  stage docstring_target "${TARGET[@]}" --gin.TRAIN_STEPS="$TARGET_STEPS" \
    --gin.LEARNING_RATE=0.005 --gin.WARMUP_STEPS=100 --gin.SEED=2 \
    --gin.INIT_CHECKPOINT="$(q "$OUT_ROOT/docstring_target_mid/checkpoint_$MID_STEPS")"
fi
if wanted s; then
  stage docstring_draft_s "${DRAFT[@]}" --gin.MODEL='@docstring_draft_s/t5.T5Config()'
fi
if wanted m; then
  stage docstring_draft_m "${DRAFT[@]}" --gin.MODEL='@docstring_draft_m/t5.T5Config()'
fi
if wanted hybrid; then
  HYBRID=("$PYTHON" scripts/add_hybrid_draft.py --bundle=docstrings --draft=docstring_draft_s
          --name=docstring_hybrid --min_ngram=2)
  if (( PRINT )); then printf '%q ' "${HYBRID[@]}"; echo; else "${HYBRID[@]}"; fi
fi
(( PRINT )) || echo "=== all stages done: $STAGES"
