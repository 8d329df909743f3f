#!/usr/bin/env bash
# taso-opt --taso-search{cost-model=cuda} end to end on the GPU machine (issue 24): each op signature the search
# prices measured on that GPU by the searching process. One command from the repository root, in one device
# call that carries the bundle folder (benchmarks/gpu/bundle.sh builds it on the CPU: the MLIR bindings and
# highspy for CPython 3.12, which the GPU machine lacks):
#
#   bash benchmarks/gpu/run_inprocess.sh                       # on the GPU: about 90 s at most, results in $OUT
#   PYTHON=/path/to/python3.12 OUT=rehearsal bash benchmarks/gpu/run_inprocess.sh --dry-run   # the rehearsal, CPU
#
# Steps, each under `timeout`, the whole held to TOTAL_S (90) seconds (common.sh: fit): the environment; the
# bundle unpacked into $UNPACK (Python's tarfile) and taso_mlir laid out from the working tree as pyproject.toml
# maps it (symbolic links; nothing is installed), both put on PYTHONPATH; the suite's MODELS (squeezenet nasrnn)
# written as ONNX (benchmarks/suite.py, random weights, seed 0); then, per model, taso-opt with the analytic H200
# roofline (the bundle works, nothing measured), with cost-model=cuda (each signature timed: 8 warm-ups, 32 runs,
# the median; cached per device in $LOGS/cache/cuda-costs.json) and with cost-model=cuda again (everything from
# the cache: nothing timed, the same model written), each result checked against the input in onnxruntime before
# it is written; the analytic run only for the first model. The dry run (--dry-run) runs the same steps with the
# quick variants of the models and TASO_CUDA_DRY_RUN=1 (numpy on the CPU stands in for the GPU: the times are
# numpy's, not a GPU's).
#
# The device tool brings back at most 8 files from $OUT: this writes two, inprocess.log (the summary) and
# inprocess.tgz (every log, each search's report, the cost cache, the bundle's manifest); the optimized models
# stay in $UNPACK. Settings: PYTHON (python3), OUT (benchmarks/gpu/out), BUNDLE (the archive), UNPACK
# ($TMPDIR/taso-gpu-bundle, the system temporary folder where TMPDIR is unset), MODELS, SET (full; quick in a dry run), TOTAL_S, PIPELINE_EXTRA (more taso-search
# options, e.g. "strategy=best").
set -u
. "$(dirname "$0")/common.sh"
common_args "$@"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE=${BUNDLE:-$ROOT/benchmarks/gpu/bundle/taso-gpu-bundle-cp312.tar.xz}
UNPACK=${UNPACK:-${TMPDIR:-/tmp}/taso-gpu-bundle}
MODELS=${MODELS:-squeezenet nasrnn}
TOTAL_S=${TOTAL_S:-90}
PIPELINE_EXTRA=${PIPELINE_EXTRA:-}
if [ -n "$DRY" ]; then SET=${SET:-quick}; else SET=${SET:-full}; fi
start=$(date +%s)
DEADLINE=$(( start + TOTAL_S ))
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/taso-inprocess-logs.XXXXXX")
SUMMARY=$OUT/inprocess.log
: > "$SUMMARY"
pack() { tar czf "$OUT/inprocess.tgz.tmp" -C "$LOGS" . && mv "$OUT/inprocess.tgz.tmp" "$OUT/inprocess.tgz"; }
say() { echo "== $(date -u +%H:%M:%SZ) +$(( $(date +%s) - start ))s $*" | tee -a "$SUMMARY"; }
trap 'say "stopped (signal)"; pack; exit 143' TERM INT
failed=0
export PYTHONUNBUFFERED=1

say "taso-opt{cost-model=cuda} in process ${DRY:-(on the GPU)}: models $MODELS ($SET), budget ${TOTAL_S} s"
env_log "in-process cost-model=cuda ${DRY:-(on the GPU)}" > "$LOGS/env.log" 2>&1
grep -E "^(python|numpy|onnx|onnxruntime|torch|cuda|NVIDIA|name)" "$LOGS/env.log" | head -12 | sed 's/^/   /' >> "$SUMMARY"

# the bundle, unpacked once per archive (a marker holds the archive's size and time)
if [ ! -s "$BUNDLE" ]; then
  say "error: no bundle at $BUNDLE: run 'bash benchmarks/gpu/bundle.sh' on the CPU and carry benchmarks/gpu/bundle"
  pack
  exit 2
fi
stamp="$(stat -c '%s %Y' "$BUNDLE")"
if [ "$(cat "$UNPACK/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$UNPACK"
  mkdir -p "$UNPACK"
  timeout -k 5 "$(fit 60 30)" "$PY" - "$BUNDLE" "$UNPACK" > "$LOGS/unpack.log" 2>&1 <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[2], filter="data")
    else:
        t.extractall(sys.argv[2])
EOF
  rc=$?
  if [ $rc -ne 0 ]; then say "error: unpacking the bundle failed (exit $rc): $(tail -1 "$LOGS/unpack.log")"; pack; exit 2; fi
  echo "$stamp" > "$UNPACK/.stamp"
fi
cp "$UNPACK/BUNDLE.json" "$LOGS/BUNDLE.json"
# taso_mlir from the working tree, as pyproject.toml's package-dir maps it (links, nothing installed)
"$PY" - "$ROOT" "$UNPACK/pkg" >> "$LOGS/unpack.log" 2>&1 <<'EOF'
import os, shutil, sys, tomllib
root, dest = sys.argv[1], sys.argv[2]
dirs = tomllib.load(open(os.path.join(root, "pyproject.toml"), "rb"))["tool"]["setuptools"]["package-dir"]
shutil.rmtree(dest, ignore_errors=True)
top = os.path.join(dest, "taso_mlir")
os.makedirs(top)
for pkg, d in dirs.items():
    src = os.path.join(root, d)
    if pkg == "taso_mlir":  # the top package: its own files (the subpackages are linked below)
        for f in os.listdir(src):
            if f.endswith(".py"):
                os.symlink(os.path.join(src, f), os.path.join(top, f))
    else:
        os.symlink(src, os.path.join(dest, *pkg.split(".")))
EOF
export PYTHONPATH="$UNPACK/pkg:$UNPACK/site${PYTHONPATH:+:$PYTHONPATH}"
# (not the current folder first on sys.path: the repository root's taso_mlir/ holds only the top package's files)
export PYTHONSAFEPATH=1
export TASO_CACHE_DIR="$LOGS/cache"
if [ -n "$DRY" ]; then export TASO_CUDA_DRY_RUN=1; else unset TASO_CUDA_DRY_RUN; fi
"$PY" -c "import taso_mlir.tools.taso_opt, torch_mlir.ir, highspy, onnx, onnxruntime; print('imports ok')" \
  > "$LOGS/imports.log" 2>&1
rc=$?
say "bundle $(stat -c %s "$BUNDLE" | awk '{printf "%.1f MiB", $1 / 1048576}') unpacked; imports: $(tail -1 "$LOGS/imports.log")"
if [ $rc -ne 0 ]; then pack; exit 2; fi

# the models: the suite's, written here (SET=full, or quick: the tiny variants; a dry run's default, as numpy
# takes about 40 s to time the full-size SqueezeNet's signatures)
QUICK=""
if [ "$SET" = quick ]; then QUICK="--quick"; fi
# shellcheck disable=SC2086
timeout -k 5 "$(fit 60 20)" "$PY" -m taso_mlir.benchmarks.suite $QUICK --out "$UNPACK/models" $MODELS \
  > "$LOGS/models.log" 2>&1 || { say "error: writing the models failed: $(tail -1 "$LOGS/models.log")"; pack; exit 2; }

# run NAME TARGET: taso-opt on one model; its log in $LOGS/NAME.log, its one-line summary in the summary
run() {
  local name=$1 target=$2 m=$3 t0 ms rc before after
  local opts="target=$target${PIPELINE_EXTRA:+ $PIPELINE_EXTRA}"
  rm -f "$UNPACK/models/$m.$name.onnx"  # (an earlier run's must not stand for this one's)
  before=$(cache_count)
  t0=$(date +%s%N)
  timeout -k 5 "$(fit 60 3)" "$PY" -m taso_mlir.tools.taso_opt "$UNPACK/models/$m.onnx" -o "$UNPACK/models/$m.$name.onnx" \
    --pass-pipeline="builtin.module(taso-search{$opts},taso-dce)" --taso-report --summary --no-progress \
    > "$LOGS/$m.$name.log" 2>&1
  rc=$?
  after=$(cache_count)
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  say "$m, $name ($target): exit $rc in $(( ms / 1000 )).$(( ms % 1000 / 100 )) s; signatures in the cost cache: $before -> $after"
  grep -E "^taso-opt: |^taso-search: target|had no measurement|error|warning" "$LOGS/$m.$name.log" | head -8 \
    | sed 's/^/   /' >> "$SUMMARY"
  if [ $rc -ne 0 ]; then failed=$(( failed + 1 )); fi
  return $rc
}
# the signatures in the cost cache (over every device in it)
cache_count() {
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1]))['devices']; print(sum(len(v) for v in d.values()))" \
    "$TASO_CACHE_DIR/cuda-costs.json" 2>/dev/null || echo 0
}

first=1
for m in $MODELS; do
  if [ $(( DEADLINE - $(date +%s) )) -lt 10 ]; then say "budget: $m not run"; failed=$(( failed + 1 )); continue; fi
  if [ $first = 1 ]; then run analytic analytic:h200 "$m"; first=0; fi
  run cuda cuda "$m" && run cuda-cached cuda "$m"
  if [ -s "$UNPACK/models/$m.cuda.onnx" ] && [ -s "$UNPACK/models/$m.cuda-cached.onnx" ]; then
    if cmp -s "$UNPACK/models/$m.cuda.onnx" "$UNPACK/models/$m.cuda-cached.onnx"; then
      say "$m: the cached run wrote the same model"
    else
      say "$m: the cached run wrote a different model"
      failed=$(( failed + 1 ))
    fi
  fi
done
say "done: $failed failure(s), $(( $(date +%s) - start )) s in all; logs in $OUT/inprocess.tgz"
pack
rm -rf "$LOGS"
[ "$failed" -eq 0 ]
