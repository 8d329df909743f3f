#!/usr/bin/env bash
# The GPU calibration of issue 24, one command from the repository root on the GPU machine (its preinstalled
# python3 with torch, CuPy and cuda-python; taso_mlir is not installed there and not needed):
#
#   bash benchmarks/gpu/run_h100.sh              # on the GPU: ~6 minutes at most, results in $OUT
#   PYTHON=.venv/bin/python OUT=rehearsal bash benchmarks/gpu/run_h100.sh --dry-run   # the rehearsal, CPU
#
# Steps: the environment (nvidia-smi, versions) into env.log; a smoke run (about 30 signatures, one or two of
# each kind, each checked against numpy, printed) within SMOKE_S seconds; then every signature of
# benchmarks/gpu/signatures.jsonl within BUDGET_S seconds into $OUT/$NAME.json, checkpointed every 5 s, so a
# time-out still leaves a usable table. Each step runs under `timeout` and the next runs whatever the last gave.
# $NAME is the GPU's short name (h100, h200; NAME=... to set it). Copy $OUT/$NAME.json to
# passes/cost/tables/$NAME.json to ship it (see docs/benchmarks.md).
set -u
. "$(dirname "$0")/common.sh"
common_args "$@"
# the table's name: the GPU's (h100, h200, ...: the device tool may hand out an H200 where no H100 is free)
if [ -n "$DRY" ]; then
  NAME=${NAME:-dry}
elif [ -z "${NAME:-}" ]; then
  NAME=$(gpu_name)
fi
SMOKE_S=${SMOKE_S:-45}
BUDGET_S=${BUDGET_S:-270}
SIGS=${SIGS:-benchmarks/gpu/signatures.jsonl}
# the logs and the smoke table go to $LOGS (default $OUT): run_all.sh packs them into one file, as the device
# tool brings back at most 8 files from $OUT; the table itself is always written to $OUT
LOGS=${LOGS:-$OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$LOGS"

env_log "GPU calibration '$NAME' ${DRY:-(on the GPU)}: smoke ${SMOKE_S} s, budget ${BUDGET_S} s" 2>&1 | tee "$LOGS/env.log"

timeout -k 5 "$(fit $((SMOKE_S + 30)) 0)" "$PY" benchmarks/gpu/calibrate.py $DRY --sigs "$SIGS" --smoke 30 \
  --budget-s "$SMOKE_S" --out "$LOGS/smoke-$NAME.json" 2>&1 | tee "$LOGS/smoke.log"
smoke_rc=${PIPESTATUS[0]}

BUDGET_S=$(fit "$BUDGET_S" 15)
timeout -k 5 "$(fit $((BUDGET_S + 40)) 0)" "$PY" benchmarks/gpu/calibrate.py $DRY --sigs "$SIGS" --name "$NAME" \
  --budget-s "$BUDGET_S" --out "$OUT/$NAME.json" 2>&1 | tee "$LOGS/calibrate.log"
rc=${PIPESTATUS[0]}

echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) smoke exit $smoke_rc, calibration exit $rc; the table: $OUT/$NAME.json" \
  | tee -a "$LOGS/calibrate.log"
# exit 0 where a table was written (complete or not: its header says which); the logs say what failed
[ -s "$OUT/$NAME.json" ]
