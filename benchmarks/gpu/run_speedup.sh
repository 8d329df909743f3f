#!/usr/bin/env bash
# The GPU speedup run of issue 25, one command from the repository root on the GPU machine (its preinstalled
# python3 with torch, CuPy, cuda-python, onnx and onnxruntime; taso_mlir is not installed there and not needed:
# the models and their predicted costs were prepared on the CPU, benchmarks/gpu/models/):
#
#   bash benchmarks/gpu/run_speedup.sh               # on the GPU: about 4 minutes, results in $OUT
#   PYTHON=.venv/bin/python OUT=rehearsal bash benchmarks/gpu/run_speedup.sh --dry-run   # the rehearsal, CPU
#
# Steps: the environment into env-speedup.log; a smoke run of the quick set (tiny models: every executor
# checked against onnxruntime, a few rounds) within SMOKE_S seconds; then the full suite within BUDGET_S
# seconds into $OUT/speedup.json (checkpointed after every model and every 5 s, so a time-out still leaves
# results) and $OUT/RESULTS-gpu.md. TABLE= names a calibration table of this GPU (run_all.sh passes the one
# it just measured) for the fidelity's measured column. The graphs optimized for a measured table (cuda:<gpu>)
# are timed after every model's original and analytic ones (speedup.py --later). VARIANTS= (e.g. cuda:h100)
# times only those graphs beside the originals: the later call of a session whose first call calibrated this
# GPU, after prepare.py made the cuda:<gpu> graphs on the CPU (docs/gpu-speedups.md). Each step runs under
# `timeout`; the next runs whatever the last gave. Copy $OUT/speedup.json to benchmarks/results/gpu/ and run
# `python benchmarks/gpu/report.py` on the CPU for the chart and benchmarks/RESULTS-gpu.md.
set -u
. "$(dirname "$0")/common.sh"
common_args "$@"
SMOKE_S=${SMOKE_S:-20}
BUDGET_S=${BUDGET_S:-200}
SET=${SET:-full}
TABLE=${TABLE:-}
VARIANTS=${VARIANTS:-}
EXTRA=${EXTRA:-}
# the logs and the smoke results go to $LOGS (default $OUT): run_all.sh packs them into one file, as the device
# tool brings back at most 8 files from $OUT; speedup.json and RESULTS-gpu.md are always written to $OUT
LOGS=${LOGS:-$OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$LOGS"
VARIANTS_ARG=()
if [ -n "$VARIANTS" ]; then VARIANTS_ARG=(--variants "$VARIANTS"); fi
TABLE_ARG=()
if [ -n "$TABLE" ]; then TABLE_ARG=(--table "$TABLE"); fi

env_log "GPU speedups ${DRY:-(on the GPU)}: smoke ${SMOKE_S} s, budget ${BUDGET_S} s, set $SET${VARIANTS:+, variants $VARIANTS}" 2>&1 \
  | tee "$LOGS/env-speedup.log"

timeout -k 5 "$(fit $((SMOKE_S + 40)) 0)" "$PY" benchmarks/gpu/speedup.py $DRY --set quick --budget-s "$SMOKE_S" \
  --min-rounds 3 --max-rounds 5 ${VARIANTS_ARG[@]+"${VARIANTS_ARG[@]}"} --out "$LOGS/speedup-smoke.json" \
  --markdown "$LOGS/speedup-smoke.md" $EXTRA \
  2>&1 | tee "$LOGS/speedup-smoke.log"
smoke_rc=${PIPESTATUS[0]}

# (a file started before the budget runs out finishes: VGG-19's weights and reference take ~20 s, hence the margin)
BUDGET_S=$(fit "$BUDGET_S" 30)
timeout -k 5 "$(fit $((BUDGET_S + 60)) 0)" "$PY" benchmarks/gpu/speedup.py $DRY --set "$SET" --budget-s "$BUDGET_S" \
  ${TABLE_ARG[@]+"${TABLE_ARG[@]}"} ${VARIANTS_ARG[@]+"${VARIANTS_ARG[@]}"} --out "$OUT/speedup.json" \
  --markdown "$OUT/RESULTS-gpu.md" $EXTRA 2>&1 | tee "$LOGS/speedup.log"
rc=${PIPESTATUS[0]}

echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) smoke exit $smoke_rc, speedups exit $rc; results: $OUT/speedup.json" \
  | tee -a "$LOGS/speedup.log"
# exit 0 where results were written (complete or not: the JSON says which); the logs say what failed
[ -s "$OUT/speedup.json" ]
