# Shared by the prepared GPU runs (run_h100.sh, run_speedup.sh, run_all.sh): sourced, not run.

# gpu_name: the GPU's short name from nvidia-smi (h100, h200, ...; "gpu" where none is recognized)
gpu_name() {
  local n
  n=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o -i -E '[a-z]+[0-9]+' \
      | grep -i -E '^(h|a|b|l|v|t|gh)[0-9]+$' | head -1 | tr 'A-Z' 'a-z')
  echo "${n:-gpu}"
}

# env_log TITLE: the environment (date, commit, nvidia-smi, the Python packages the runs use) on stdout
env_log() {
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $1"
  echo "== git: $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit,pstate --format=csv
  else
    echo "no nvidia-smi"
  fi
  "$PY" - <<'PYEOF'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for m in ("numpy", "onnx", "onnxruntime", "torch", "cupy", "cuda.core", "cuda.bindings"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "unavailable:", type(e).__name__, e)
try:
    import torch
    if torch.cuda.is_available():
        print("torch cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))
except Exception as e:
    print("torch cuda: unavailable:", e)
PYEOF
}

# fit SECONDS MARGIN: SECONDS, or less where the deadline $DEADLINE (epoch seconds, set by run_all.sh to end the
# whole run inside the device call's limit) leaves less than SECONDS + MARGIN from now; never under 5
fit() {
  local s=$1 left
  if [ -n "${DEADLINE:-}" ]; then
    left=$(( DEADLINE - $(date +%s) - $2 ))
    if [ "$left" -lt "$s" ]; then s=$left; fi
    if [ "$s" -lt 5 ]; then s=5; fi
  fi
  echo "$s"
}

# common_args "$@": the settings every run takes: DRY ("--dry-run" where the first argument asks for the
# rehearsal), PY (the interpreter: $PYTHON, else python3), OUT (the results folder: $OUT, as the device tool
# sets it, else benchmarks/gpu/out)
common_args() {
  DRY=""
  if [ "${1:-}" = "--dry-run" ]; then DRY="--dry-run"; fi
  PY=${PYTHON:-python3}
  OUT=${OUT:-benchmarks/gpu/out}
}
