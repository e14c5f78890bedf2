#!/usr/bin/env bash
# Trains the memory-bound EN->DE pair (large_target and its drafts) with scripts/train.py: the
# recipe of speculative/data/mini/models/MODEL_CARD.md ("The memory-bound pair") as one script.
#
# Stages, in this order (each one a scripts/train.py run, resumable: a stopped stage continues
# from its last saved state when the script is run again with the same settings):
#   target  large_target: 4000 steps, dropout 0.1, learning rate 0.01 (200 warmup steps)
#   kd      KL on the target's greedy translations of 24,000 training sources and of the
#           unseen sources in mono_en.txt, 4000 steps (first stage of kdtv; not exported)
#   kdtv    large_draft_kdtv: TV (acceptance) fine-tune of kd, 2000 steps at 0.01
#   kl      large_draft_kl: KL on the 24,000 training sources' translations, 2000 steps
#   tv      large_draft_tv: TV on the same text from a random start, 2000 steps
#   ce      large_draft_ce: the references (plain data), 2000 steps
# The drafts learn from the exported (bfloat16-stored) target in EXPORT_DIR, and their alpha is
# measured against it. Every exported model goes to EXPORT_DIR/<name>/ with its entry in
# EXPORT_DIR/model_card.json; runs write OUT_ROOT/<name>/ (metrics.jsonl, summary.json, the
# float32 checkpoint, the resumable train state) and the teacher caches OUT_ROOT/distill_*.npz.
# A stage whose run finished (its OUT_ROOT/<name>/summary.json exists) is skipped.
#
# Command (from the repository root):
#   bash scripts/train_large.sh [--stages=target,kd,kdtv,kl,tv,ce] [--print] [OUT_ROOT]
#       [-- TRAIN_ARGS...]
# --print: print each stage's train.py command (shell-quoted, one per line) instead of running it.
# OUT_ROOT: default out/large (any directory outside the repository will do). TRAIN_ARGS are
# appended to every train.py call (e.g. --gin.training.TrainRun.data_dir="'/tmp/tiny'" for a
# quick check on a small corpus).
# Environment: PYTHON (default .venv/bin/python), EXPORT_DIR (default
# speculative/data/mini/models), TARGET_STEPS (4000), DRAFT_STEPS (2000), KD_STEPS (4000),
# DISTILL_PAIRS (24000), CHECKPOINT_EVERY (100).
# Expected: on 2 CPU cores about 3 hours for the target (2.8 s a step) and 1.5 hours for the
# teacher caches and the drafts; on one H200 a few minutes in all.

set -euo pipefail

ALL="target,kd,kdtv,kl,tv,ce"
source "$(dirname "${BASH_SOURCE[0]}")/train_stages.sh"
parse_stage_args "$@"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_ROOT="${OUT_ROOT:-out/large}"
PYTHON="${PYTHON:-.venv/bin/python}"
EXPORT_DIR="${EXPORT_DIR:-speculative/data/mini/models}"
TARGET_STEPS="${TARGET_STEPS:-4000}"
DRAFT_STEPS="${DRAFT_STEPS:-2000}"
KD_STEPS="${KD_STEPS:-4000}"
DISTILL_PAIRS="${DISTILL_PAIRS:-24000}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
(( PRINT )) || mkdir -p "$OUT_ROOT"

COMMON=(--gin_file=configs/models/large_target.gin --gin_file=configs/runs/train.gin
        --gin.EXPORT_DIR="$(q "$EXPORT_DIR")" --gin.CHECKPOINT_EVERY="${CHECKPOINT_EVERY:-100}")
DRAFT=("${COMMON[@]}" --gin_file=configs/models/large_draft.gin
       --gin.MODEL='@large_draft/t5.T5Config()' --gin.LEARNING_RATE=0.03
       --gin.TARGET_MODEL='@large_target/t5.T5Config()'
       --gin.TARGET_CHECKPOINT="$(q "$EXPORT_DIR/large_target")")
TEACH=(--gin.DISTILL=True --gin.DISTILL_PAIRS="$DISTILL_PAIRS"
       --gin.DISTILL_CACHE="$(q "$OUT_ROOT/distill_large_24k.npz")")
UNSEEN=(--gin.DISTILL_SOURCES="'mono_en.txt'")


if wanted target; then
  stage large_target "${COMMON[@]}" --gin.MODEL='@large_target/t5.T5Config()' \
    --gin.large_target/t5.T5Config.dropout_rate=0.1 --gin.TRAIN_STEPS="$TARGET_STEPS" \
    --gin.LEARNING_RATE=0.01 --gin.WARMUP_STEPS=200
fi
if wanted kd; then
  stage large_draft_kd "${DRAFT[@]}" "${TEACH[@]}" "${UNSEEN[@]}" --gin.OBJECTIVE="'kl'" \
    --gin.TRAIN_STEPS="$KD_STEPS" --gin.EXPORT_DIR=None
fi
if wanted kdtv; then
  stage large_draft_kdtv "${DRAFT[@]}" "${TEACH[@]}" "${UNSEEN[@]}" --gin.OBJECTIVE="'tv'" \
    --gin.TRAIN_STEPS="$DRAFT_STEPS" --gin.LEARNING_RATE=0.01 --gin.WARMUP_STEPS=100 \
    --gin.INIT_CHECKPOINT="$(q "$OUT_ROOT/large_draft_kd/checkpoint_$KD_STEPS")"
fi
if wanted kl; then
  stage large_draft_kl "${DRAFT[@]}" "${TEACH[@]}" --gin.OBJECTIVE="'kl'" \
    --gin.TRAIN_STEPS="$DRAFT_STEPS"
fi
if wanted tv; then
  stage large_draft_tv "${DRAFT[@]}" "${TEACH[@]}" --gin.OBJECTIVE="'tv'" \
    --gin.TRAIN_STEPS="$DRAFT_STEPS"
fi
if wanted ce; then
  stage large_draft_ce "${DRAFT[@]}" --gin.TRAIN_STEPS="$DRAFT_STEPS"
fi
(( PRINT )) || echo "=== all stages done: $STAGES"
