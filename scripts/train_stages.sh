# Sourced by the staged training scripts (train_large.sh, train_docstrings.sh): their flags and
# the `stage` runner. The sourcing script sets ALL (its stages, comma-separated) and then calls
# `parse_stage_args "$@"`; afterwards it sets OUT_ROOT's default, PYTHON and EXTRA's users, and
# runs `stage NAME TRAIN_ARGS...` for each stage it `wanted`.

usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; }
SCRIPT="$(basename "$0")"

# parse_stage_args ARGS...: sets STAGES, OUT_ROOT, PRINT and EXTRA from the command line.
parse_stage_args() {
  STAGES="$ALL"
  OUT_ROOT=""
  PRINT=0
  EXTRA=()
  while (( $# )); do
    case "$1" in
      --stages=*) STAGES="${1#--stages=}" ;;
      --print) PRINT=1 ;;
      -h|--help) usage; exit 0 ;;
      --) shift; EXTRA=("$@"); break ;;
      -*) echo "$SCRIPT: unknown option $1; see --help." >&2; exit 2 ;;
      *) if [[ -n "$OUT_ROOT" ]]; then
           echo "$SCRIPT: give one OUT_ROOT (got $OUT_ROOT and $1)." >&2; exit 2
         fi
         OUT_ROOT="$1" ;;
    esac
    shift
  done
  for s in ${STAGES//,/ }; do
    if [[ ! ",$ALL," == *",$s,"* ]]; then
      echo "$SCRIPT: --stages=$STAGES names '$s'; choose from $ALL." >&2
      exit 2
    fi
  done
}

wanted() { [[ ",$STAGES," == *",$1,"* ]]; }
q() { printf '"%s"' "$1"; }  # a gin string

# stage NAME ARGS...: runs train.py into OUT_ROOT/NAME unless that run already finished.
stage() {
  local name="$1" start=$SECONDS
  shift
  if (( PRINT )); then
    printf '%q ' "$PYTHON" scripts/train.py "$@" --gin.MODEL_DIR="$(q "$OUT_ROOT/$name")" "${EXTRA[@]}"
    echo
    return 0
  fi
  if [[ -f "$OUT_ROOT/$name/summary.json" ]]; then
    echo "=== $name: done before ($OUT_ROOT/$name/summary.json), skipped"
    return 0
  fi
  echo "=== $name: $(date -u +%H:%M:%S)"
  "$PYTHON" scripts/train.py "$@" --gin.MODEL_DIR="$(q "$OUT_ROOT/$name")" "${EXTRA[@]}"
  echo "=== $name: finished in $((SECONDS - start)) s"
}
