#!/usr/bin/env bash
# The runtime packages taso-opt needs that the GPU machine lacks, packed to travel with the repository to it
# (issue 24: `taso-opt --taso-search{cost-model=cuda}` on the GPU machine). Run here, on the CPU, with network
# access to the package index:
#
#   bash benchmarks/gpu/bundle.sh          # -> benchmarks/gpu/bundle/taso-gpu-bundle-cp312.tar.xz (git-ignored)
#
# The GPU machine (Python 3.12, x86-64, glibc 2.39) has numpy, onnx, onnxruntime (CPU), torch, CuPy and
# cuda-python, and no network; a device call takes the working tree plus the ignored paths it carries, 64 MiB in
# all. What taso-opt imports beyond those (traced with PYTHONPROFILEIMPORTTIME: the MLIR bindings of the
# torch-mlir wheel; highspy for strategy=eqsat and best) comes as the cp312 manylinux wheels pinned in
# pyproject.toml, unpacked, their shared libraries stripped (`strip --strip-unneeded`: symbol tables and debug
# sections; the exported symbols and the unwind tables stay), the files taso-opt never loads dropped
# (torch-mlir's torch-mlir-opt binary and the Python extensions of dialects and passes taso-mlir does not use,
# caches, type stubs), and packed with xz -9 beside a manifest (BUNDLE.json: versions, wheels' digests, what
# was dropped, sizes). Python's tarfile unpacks it (benchmarks/gpu/run_inprocess.sh), so the GPU machine
# needs no xz. taso_mlir itself is not in it: run_inprocess.sh imports it from the working tree.
#
# Settings (environment): PYTHON (python3, 3.11+ for tomllib), DEST (benchmarks/gpu/bundle), WHEELS (a folder
# of the wheels already downloaded; default: downloaded into a temporary folder), PACKAGES (torch-mlir highspy),
# LIMIT_MIB (45: the archive must be smaller, to travel beside the tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=${DEST:-benchmarks/gpu/bundle}
PACKAGES=${PACKAGES:-torch-mlir highspy}
LIMIT_MIB=${LIMIT_MIB:-45}
NAME=taso-gpu-bundle-cp312.tar.xz
TMP=$(mktemp -d "${TMPDIR:-/tmp}/taso-bundle.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
WHEELS=${WHEELS:-$TMP/wheels}
STAGE=$TMP/stage
mkdir -p "$DEST" "$WHEELS" "$STAGE/site"
start=$(date +%s)

# the pins: pyproject.toml's, so that the bundle is what `pip install -e .` installs here
PINS=$("$PY" - $PACKAGES <<'EOF'
import sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
pins = {d.split("==")[0].strip().lower(): d.strip() for d in deps if "==" in d}
missing = [p for p in sys.argv[1:] if p.lower() not in pins]
if missing:
    sys.exit(f"bundle: no '==' pin in pyproject.toml for {missing}")
print(" ".join(pins[p.lower()] for p in sys.argv[1:]))
EOF
)
echo "== bundle: $PINS for CPython 3.12, manylinux x86-64"
# shellcheck disable=SC2086
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$WHEELS" $PINS

# unpack, drop, strip, and write the manifest
"$PY" - "$WHEELS" "$STAGE" $PINS <<'EOF'
import datetime, fnmatch, hashlib, json, os, shutil, subprocess, sys, zipfile

wheels, stage, pins = sys.argv[1], sys.argv[2], sys.argv[3:]
site = os.path.join(stage, "site")
# what taso-opt never loads (see the header of bundle.sh); paths relative to site/
DROP = [
    "torch_mlir/_mlir_libs/torch-mlir-opt",                 # the command-line tool (49 MB): taso-opt uses the bindings
    "torch_mlir/_mlir_libs/_stablehlo*.so",                 # StableHLO's bindings
    "torch_mlir/_mlir_libs/_mlirExecutionEngine*",          # the JIT
    "torch_mlir/_mlir_libs/_mlirDialects[!IP]*.so",         # dialect extensions other than IRDL and PDL
    "torch_mlir/_mlir_libs/_mlir*Passes*.so",               # pass extensions (async, GPU, linalg, sparse tensor)
    "torch_mlir/_mlir_libs/_mlirTransformInterpreter*.so",
    "*/__pycache__/*", "*.pyi", "*.pyc",
]
manifest = {"format": "taso-mlir gpu bundle 1", "python": "cp312", "platform": "manylinux x86_64",
            "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "packages": {}, "dropped": [], "stripped": []}
for pin in pins:
    name = pin.split("==")[0]
    prefix = name.replace("-", "_").lower() + "-"
    found = [w for w in sorted(os.listdir(wheels)) if w.lower().startswith(prefix) and w.endswith(".whl")
             and "cp312" in w]
    if not found:
        sys.exit(f"bundle: no cp312 wheel of {pin} in {wheels}")
    whl = os.path.join(wheels, found[-1])
    with open(whl, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
        for info in z.infolist():  # (zipfile drops the permission bits)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(os.path.join(site, info.filename), mode & 0o777)
    manifest["packages"][name] = {"pin": pin, "wheel": found[-1], "sha256": digest,
                                  "wheel_bytes": os.path.getsize(whl)}

raw = 0
for dirpath, dirnames, files in os.walk(site):
    for fn in files:
        p = os.path.join(dirpath, fn)
        rel = os.path.relpath(p, site)
        if any(fnmatch.fnmatch(rel, pat) for pat in DROP):
            manifest["dropped"].append({"file": rel, "bytes": os.path.getsize(p)})
            os.remove(p)
            continue
        if ".so" in fn:
            before = os.path.getsize(p)
            subprocess.run(["strip", "--strip-unneeded", p], check=True)
            manifest["stripped"].append({"file": rel, "bytes": before, "stripped_bytes": os.path.getsize(p)})
        raw += os.path.getsize(p)
for dirpath, dirnames, files in os.walk(site, topdown=False):
    if not os.listdir(dirpath):
        os.rmdir(dirpath)
manifest["unpacked_bytes"] = raw
manifest["dropped_bytes"] = sum(d["bytes"] for d in manifest["dropped"])
with open(os.path.join(stage, "BUNDLE.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print(f"== bundle: {raw / 2**20:.1f} MiB unpacked after dropping {manifest['dropped_bytes'] / 2**20:.1f} MiB "
      f"({len(manifest['dropped'])} files) and stripping {len(manifest['stripped'])} shared libraries "
      f"({sum(s['bytes'] - s['stripped_bytes'] for s in manifest['stripped']) / 2**20:.1f} MiB less)")
EOF

echo "== bundle: packing with xz -9 (a few minutes)"
tar -C "$STAGE" -cf - BUNDLE.json site | xz -9 -T0 > "$TMP/$NAME"
mv "$TMP/$NAME" "$DEST/$NAME"
bytes=$(stat -c %s "$DEST/$NAME")
echo "== bundle: $DEST/$NAME: $(( bytes / 1048576 )).$(( bytes % 1048576 * 10 / 1048576 )) MiB, $(( $(date +%s) - start )) s"
if [ "$bytes" -ge $(( LIMIT_MIB * 1048576 )) ]; then
  echo "bundle: error: $DEST/$NAME is over LIMIT_MIB=$LIMIT_MIB MiB" >&2
  exit 1
fi
