#!/usr/bin/env bash
# Both prepared GPU runs in one command (one device call with timeout_s 480): the calibration of issue 24
# (run_h100.sh, shortened) and then the speedups of issue 25 (run_speedup.sh), the latter reading the table
# the former just measured for its fidelity column. Budgets (seconds, each step under `timeout`):
#
#   calibration: smoke CAL_SMOKE_S (30) + signatures CAL_BUDGET_S (150)
#   speedups:    smoke SMOKE_S (20) + suite BUDGET_S (180)
#   = 380 s of budgets, plus process starts and the environment logs (~40-60 s): more than fits, so the
#   whole run is held to TOTAL_S (450) s: the calibration ends by TOTAL_S - SMOKE_S - BUDGET_S - 70 (its
#   signature budget shortened to fit), the speedups by TOTAL_S (common.sh: fit).
#
#   bash benchmarks/gpu/run_all.sh                    # on the GPU
#   PYTHON=.venv/bin/python OUT=rehearsal bash benchmarks/gpu/run_all.sh --dry-run      # the rehearsal, CPU
set -u
. "$(dirname "$0")/common.sh"
common_args "$@"
if [ -n "$DRY" ]; then NAME=${NAME:-dry}; else NAME=${NAME:-$(gpu_name)}; fi
# the device tool brings back at most 8 files from $OUT: the table, speedup.json and RESULTS-gpu.md are written
# there as they are checkpointed, run_all.log too, and the other logs and smoke results go to $LOGS, packed into
# $OUT/logs.tgz at the end (or when the run is stopped): five files in all
mkdir -p "$OUT"
TMP_LOGS=""
if [ -z "${LOGS:-}" ]; then TMP_LOGS=$(mktemp -d "${TMPDIR:-/tmp}/taso-gpu-logs.XXXXXX"); LOGS=$TMP_LOGS; fi
export PY PYTHON="$PY" OUT NAME LOGS
pack() { tar czf "$OUT/logs.tgz.tmp" -C "$LOGS" . && mv "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"; }
trap 'pack; exit 143' TERM INT
start=$(date +%s)
# the whole run ends by TOTAL_S (450: under the device call's 480 s with room for the last writes); the
# calibration by then less what the speedups need, so that a slow step shortens the next budgets instead of
# running into the device call's limit (each script caps its steps by its DEADLINE: common.sh's fit)
TOTAL_S=${TOTAL_S:-450}
SP_SMOKE_S=${SMOKE_S:-20}
SP_BUDGET_S=${BUDGET_S:-180}
DEADLINE=$(( start + TOTAL_S - SP_SMOKE_S - SP_BUDGET_S - 70 )) SMOKE_S=${CAL_SMOKE_S:-30} \
  BUDGET_S=${CAL_BUDGET_S:-150} bash "$(dirname "$0")/run_h100.sh" $DRY
cal_rc=$?
DEADLINE=$(( start + TOTAL_S )) SMOKE_S=$SP_SMOKE_S BUDGET_S=$SP_BUDGET_S TABLE="$OUT/$NAME.json" \
  bash "$(dirname "$0")/run_speedup.sh" $DRY
sp_rc=$?
echo "== run_all: calibration exit $cal_rc, speedups exit $sp_rc, $(( $(date +%s) - start )) s in all; $OUT" \
  | tee "$OUT/run_all.log"
pack
if [ -n "$TMP_LOGS" ]; then rm -rf "$TMP_LOGS"; fi
[ -s "$OUT/speedup.json" ] || [ -s "$OUT/$NAME.json" ]
