#!/usr/bin/env bash
# The in-graph calibration (issue 25's cost-model fidelity), one device call (timeout_s 300): every signature
# timed alone, as run_h100.sh does, and also inside a CUDA graph of copies of it (calibrate.py --in-graph: each
# entry's graph_ms), then the originals and analytic-T4 graphs of MODELS timed whole, with that table in the
# fidelity column, on the same machine. Whether the sum of the in-graph costs predicts a whole model run as one
# CUDA graph better than the sum of the ops timed alone is read on the CPU afterwards (docs/gpu-speedups.md).
#
#   bash benchmarks/gpu/run_ingraph.sh                                                   # on the GPU, into $OUT
#   PYTHON=.venv/bin/python OUT=rehearsal SET=quick LIMIT=30 bash benchmarks/gpu/run_ingraph.sh --dry-run   # CPU
#
# Settings: CAL_S (170: the calibration's budget), SP_S (70: the speedups'), MODELS, SET (full), LIMIT (all
# signatures), COLD (0; N: each op also timed N times with the L2 flushed before each run, cold_ms), COLDW (0; N: the same with the
# op's activations read back into the L2 after the flush, its weights left in DRAM, coldw_ms). $OUT gets six files: <gpu>-graph.json (the table), speedup-ingraph.json and .md, and the logs.
set -u
. "$(dirname "$0")/common.sh"
common_args "$@"
if [ -n "$DRY" ]; then NAME=${NAME:-dry}; else NAME=${NAME:-$(gpu_name)}; fi
CAL_S=${CAL_S:-170}
SP_S=${SP_S:-70}
MODELS=${MODELS:-nasrnn,bert-b1,squeezenet,resnet50,inception3,vgg19}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
env_log "in-graph calibration ${DRY:-(on the GPU)}" > "$OUT/env-ingraph.log" 2>&1
# shellcheck disable=SC2086
timeout -k 5 $((CAL_S + 20)) "$PY" "$(dirname "$0")/calibrate.py" $DRY --out "$OUT/$NAME-graph.json" --name "$NAME" \
  --budget-s "$CAL_S" --in-graph 16 --cold "${COLD:-0}" --cold-weights "${COLDW:-0}" ${LIMIT:+--limit "$LIMIT"} > "$OUT/calibrate-ingraph.log" 2>&1
echo "== calibrate exit $?: $(tail -1 "$OUT/calibrate-ingraph.log")"
# shellcheck disable=SC2086
timeout -k 5 $((SP_S + 30)) "$PY" "$(dirname "$0")/speedup.py" $DRY --set "${SET:-full}" --models "$MODELS" \
  --variants analytic:t4 --later '' --budget-s "$SP_S" --table "$OUT/$NAME-graph.json" \
  --out "$OUT/speedup-ingraph.json" --markdown "$OUT/speedup-ingraph.md" > "$OUT/speedup-ingraph.log" 2>&1
echo "== speedup exit $?: $(tail -1 "$OUT/speedup-ingraph.log")"
[ -s "$OUT/$NAME-graph.json" ]
