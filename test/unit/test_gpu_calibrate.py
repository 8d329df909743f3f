"""The GPU calibration runner (benchmarks/gpu/calibrate.py, issue 24) and its kernel layer
(passes/cost/cuda_kernels.py), rehearsed on the CPU: every dumped kind has a kernel plan whose shapes match the
signature, the dry run's loop checkpoints, stops at its budget, resumes and survives failing or hanging
signatures, its table is what ``cost-model=cuda:<gpu>`` reads, the NVRTC kernels' source computes the right thing
(compiled for the CPU), and the script and the kernel layer import nothing the GPU machine lacks. The CUDA
backend itself runs only where a GPU is (skipped here with the reason)."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "calibrate.py"
KERNEL_LAYER = ROOT / "passes" / "cost" / "cuda_kernels.py"
SIGS = ROOT / "benchmarks" / "gpu" / "signatures.jsonl"
RUN = ROOT / "benchmarks" / "gpu" / "run_h100.sh"


def _load():
    spec = importlib.util.spec_from_file_location("taso_gpu_calibrate", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cal = _load()
K = cal.K  # the kernel layer, as the script loads it (by its path)


def records():
    return cal.read_signatures(str(SIGS))[1]


def small_sigs(tmp_path, n_per_kind=2, extra=()) -> Path:
    """A signatures file of the smallest ``n_per_kind`` signatures of every kind in the shipped dump."""
    header, recs = cal.read_signatures(str(SIGS))
    by = {}
    for r in recs:
        by.setdefault(r["kind"], []).append(r)
    pick = [r for k in sorted(by) for r in sorted(by[k], key=cal.work)[:n_per_kind]] + list(extra)
    p = tmp_path / "sigs.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in [header] + pick) + "\n")
    return p


def run(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


# ---------------------------------------------------------------------------------------------------------
# plans and kernels


def test_every_dumped_kind_has_a_kernel_plan():
    recs = records()
    kinds = sorted({r["kind"] for r in recs})
    unsupported = {}
    for r in recs:
        try:
            K.plan(r)
        except K.Unsupported as e:
            unsupported.setdefault(r["kind"], str(e))
    assert not unsupported, unsupported
    assert {"conv2d", "matmul", "concat", "split", "transpose", "ewadd", "relu", "maxpool2d", "batchnorm"} <= set(kinds)


def test_unknown_kinds_and_integer_ops_are_unsupported_not_dropped():
    with pytest.raises(K.Unsupported, match="no kernel for onnx.NonMaxSuppression"):
        K.plan({"kind": "onnx.NonMaxSuppression", "attrs": [], "in_shapes": [[1, 4]], "out_shapes": [[1, 4]],
                  "dtype": "f32"})
    with pytest.raises(K.Unsupported, match="only float kernels"):
        K.plan({"kind": "ewadd", "attrs": [], "in_shapes": [[4], [4]], "out_shapes": [[4]], "dtype": "si64"})
    # a view of integers launches nothing: it is measured (0), not unsupported
    assert K.plan({"kind": "onnx.Unsqueeze", "attrs": [], "in_shapes": [[2, 3], [1]], "out_shapes": [[2, 1, 3]],
                     "dtype": "si64"}).op == "view"


def test_dry_kernels_give_every_signatures_shapes():
    """The plan of the smallest signature of each kind, run by numpy, gives the signature's result shapes (a
    misread attribute would not)."""
    be = K.DryBackend(None)
    by = {}
    for r in records():
        if r["kind"] not in by or cal.work(r) < cal.work(by[r["kind"]]):
            by[r["kind"]] = r
    for r in by.values():
        prep = be.prepare(r, K.plan(r))  # raises on a shape mismatch
        assert [tuple(y.shape) for y in prep.outputs()] == [tuple(s) for s in r["out_shapes"]]


def test_generic_maxpool_window_is_inferred_from_the_shapes():
    p = K.plan({"kind": "onnx.MaxPool", "attrs": [], "in_shapes": [[1, 64, 111, 111]],
                  "out_shapes": [[1, 64, 55, 55]], "dtype": "f32"})
    assert p.approx and p.p["kernel"] == (3, 3) and p.p["strides"] == (2, 2)


def test_broadcast_strides():
    assert K._bstrides((1, 256, 1, 1), (1, 256, 14, 14)) == [0, 1, 0, 0]
    assert K._bstrides((14,), (2, 3, 14)) == [0, 0, 1]
    assert K._bstrides((), (2, 3)) == [0, 0]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler to run the kernels' source on the CPU")
def test_nvrtc_kernel_source_computes_the_reference_on_the_cpu(tmp_path):
    """The CUDA source of the elementwise and data-movement kernels, compiled for the CPU with a one-thread grid,
    against numpy: the index arithmetic of broadcast, transpose, concat, split, batchnorm and pad2d."""
    import ctypes

    stub = ("#include <math.h>\nstruct dim3 { unsigned x, y, z; };\n"
            "static const dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};\n"
            "struct float4 { float x, y, z, w; };\n"
            "static long long clock64() { return 0; }\nstatic float rsqrtf(float v) { return 1.f / sqrtf(v); }\n"
            "#define __global__\n#define __restrict__\n")
    src = tmp_path / "k.cpp"
    src.write_text(stub + K.KERNELS)
    lib = tmp_path / "k.so"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    k = ctypes.CDLL(str(lib))
    rng = np.random.default_rng(1)
    P = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    L = ctypes.c_longlong

    def f32(*shape):
        return np.ascontiguousarray(rng.uniform(0.5, 1.5, shape).astype(np.float32))

    # binary: same shape, vector of 4, scalar, broadcast
    a, b = f32(2, 3, 4), f32(2, 3, 4)
    y = np.zeros_like(a)
    k.b_sub(P(y), P(a), P(b), L(a.size))
    assert np.allclose(y, a - b)
    k.b4_mul(P(y), P(a), P(b), L(a.size // 4))
    assert np.allclose(y, a * b)
    s = f32()
    k.bsb_div(P(y), P(a), P(s), L(a.size))
    assert np.allclose(y, a / s)
    k.bsa_sub(P(y), P(s), P(a), L(a.size))
    assert np.allclose(y, s - a)
    x, c = f32(2, 5, 3, 3), f32(1, 5, 1, 1)
    y = np.zeros_like(x)
    meta = np.array(list(x.shape) + K._bstrides(x.shape, x.shape) + K._bstrides(c.shape, x.shape), np.int64)
    k.bbc_mul(P(y), P(x), P(c), L(x.size), ctypes.c_int(4), P(meta))
    assert np.allclose(y, x * c)
    # unary
    n4 = x.size // 4  # the vector kernel covers the first 4 * n4 elements
    k.u4_sigmoid(P(y), P(x), L(n4))
    assert np.allclose(y.ravel()[:4 * n4], (1 / (1 + np.exp(-x))).ravel()[:4 * n4], atol=1e-6)
    k.u_erf(P(y), P(x), L(x.size))
    assert np.allclose(y, np.vectorize(math.erf)(x), atol=1e-6)
    # batchnorm over axis 1
    sc, bi, mu, var = f32(5), f32(5), f32(5), f32(5)
    k.batchnorm(P(y), P(x), P(sc), P(bi), P(mu), P(var), ctypes.c_float(1e-5), L(x.size), L(5), L(9))
    shp = (1, 5, 1, 1)
    want = (x - mu.reshape(shp)) / np.sqrt(var.reshape(shp) + 1e-5) * sc.reshape(shp) + bi.reshape(shp)
    assert np.allclose(y, want, rtol=1e-5)
    # transpose
    perm = (0, 2, 3, 1)
    yt = np.zeros(tuple(x.shape[p] for p in perm), np.float32)
    st = K._strides(x.shape)
    meta = np.array(list(yt.shape) + [st[p] for p in perm], np.int64)
    k.transpose(P(yt), P(x), L(yt.size), ctypes.c_int(4), P(meta))
    assert np.array_equal(yt, np.transpose(x, perm))
    # concat and split along axis 1 of three pieces
    parts = [f32(2, n, 3) for n in (1, 4, 2)]
    whole = np.zeros((2, 7, 3), np.float32)
    offs = np.array([0, 3, 15, 21], np.int64)
    ptrs = np.array([p.ctypes.data for p in parts], np.uint64)
    k.concat(P(whole), P(ptrs), P(offs), ctypes.c_int(3), L(2), L(21))
    assert np.array_equal(whole, np.concatenate(parts, axis=1))
    outs = [np.zeros_like(p) for p in parts]
    ptrs = np.array([o.ctypes.data for o in outs], np.uint64)
    k.split(P(whole), P(ptrs), P(offs), ctypes.c_int(3), L(2), L(21))
    assert all(np.array_equal(o, p) for o, p in zip(outs, parts))
    # enlarge's zero padding, 1x1 -> 3x3 centred
    w = f32(4, 2, 1, 1)
    big = np.full((4, 2, 3, 3), 7.0, np.float32)
    k.pad2d(P(big), P(w), L(8), L(1), L(1), L(3), L(3), L(1), L(1))
    assert np.array_equal(big, np.pad(w, ((0, 0), (0, 0), (1, 1), (1, 1))))


# ---------------------------------------------------------------------------------------------------------
# the cuda.core calls, against fakes with the real signatures (cuda-python's cuda_core sources:
# _launcher.pyx launch(stream, config, kernel, *kernel_args) since 0.3, launch(kernel, config, *kernel_args)
# with LaunchConfig.stream before, raising ValueError on a non-Kernel first argument; EventOptions fields
# enable_timing, busy_waited_sync, ipc_enabled in 0.x (_event.pyx), timing_enabled, blocking_sync, ipc_enabled
# from 1.0 (_event.pyi; 1.2.0 on the GPU machine refused enable_timing); _launch_config.pyx grid, cluster,
# block, shmem_size, is_cooperative)


def _fake_cuda_core(monkeypatch, old_api: bool, fail_launch: bool = False):
    import dataclasses
    import types

    calls = []

    class Kernel:
        def __init__(self, name):
            self.name = name

    class Stream:
        @staticmethod
        def from_handle(h):
            return Stream()

    if old_api:
        @dataclasses.dataclass
        class LaunchConfig:
            grid: object = None
            block: object = None
            stream: object = None
            shmem_size: int = 0

        def launch(kernel, config, *args):
            if not isinstance(kernel, Kernel):
                raise ValueError
            assert isinstance(config.stream, Stream)
            calls.append((kernel.name, config.grid, config.block, args))
    else:
        @dataclasses.dataclass
        class LaunchConfig:
            grid: object = None
            cluster: object = None
            block: object = None
            shmem_size: int = 0
            is_cooperative: bool = False

        def launch(stream, config, kernel, *args):
            assert isinstance(stream, Stream) and isinstance(kernel, Kernel)
            if fail_launch:
                raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
            calls.append((kernel.name, config.grid, config.block, args))

    @dataclasses.dataclass
    class ProgramOptions:
        arch: str = None
        std: str = None

    class ObjectCode:
        def get_kernel(self, name):
            return Kernel(name)

    class Program:
        def __init__(self, code, code_type, options=None):
            assert code_type == "c++" and options.arch == "sm_90"

        def compile(self, target_type):
            assert target_type == "cubin"
            return ObjectCode()

    class Device:
        arch = "90"

        def set_current(self):
            pass

    core = types.ModuleType("cuda.core")
    core.__dict__.update(Device=Device, LaunchConfig=LaunchConfig, Program=Program, ProgramOptions=ProgramOptions,
                         Stream=Stream, launch=launch)
    cuda = types.ModuleType("cuda")
    cuda.core = core
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.core", core)
    return calls, Stream


@pytest.mark.parametrize("old_api", [False, True])
def test_nvrtc_launches_through_either_cuda_core_launch_form(monkeypatch, old_api):
    calls, Stream = _fake_cuda_core(monkeypatch, old_api)
    nv = K._Nvrtc(0, 132, cc_stream=Stream())
    assert nv.via == "cuda.core" and not nv.errors
    for _ in range(2):  # the form found on the first launch is kept
        nv.launch("b4_add", 10_000_000, np.uint64(1), np.uint64(2), np.uint64(3), np.int64(10_000_000))
    nv.spin(5)
    assert calls[0] == ("b4_add", 132 * 16, 256, (np.uint64(1), np.uint64(2), np.uint64(3), np.int64(10_000_000)))
    assert calls[1] == calls[0] and calls[2] == ("spin", 1, 1, (np.int64(5),))


def test_nvrtc_falls_through_to_cupy_when_cuda_core_launches_fail(monkeypatch):
    """A path that compiles but cannot launch (the self-test) gives way to the next, with its reason kept."""
    import types

    _fake_cuda_core(monkeypatch, old_api=False, fail_launch=True)
    launched = []

    class Fn:
        def __call__(self, grid, block, args, stream=None):
            launched.append((grid, block, args, stream))

    cupy = types.ModuleType("cupy")
    cupy.RawModule = lambda code, options: types.SimpleNamespace(get_function=lambda name: Fn())
    cupy.cuda = types.SimpleNamespace(ExternalStream=lambda ptr: ("stream", ptr))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    nv = K._Nvrtc(7, 132, selftest=lambda nv: nv.launch("b_add", 1000, np.uint64(1), np.int64(1000)))
    assert nv.via == "cupy" and "CUDA_ERROR_INVALID_VALUE" in nv.errors["cuda.core"]
    assert launched[0] == ((4,), (256,), (np.uint64(1), np.int64(1000)), ("stream", 7))


def test_timing_event_options_for_either_cuda_core_generation():
    import dataclasses

    @dataclasses.dataclass
    class New:  # cuda.core 1.x
        timing_enabled: bool = False
        blocking_sync: bool = False
        ipc_enabled: bool = False

    @dataclasses.dataclass
    class Old:  # cuda.core 0.x
        enable_timing: bool = False
        busy_waited_sync: bool = False
        ipc_enabled: bool = False

    assert K.timing_event_options(New).timing_enabled and K.timing_event_options(Old).enable_timing


def test_cuda_core_options_use_only_fields_the_api_has():
    """Every keyword the kernel layer gives EventOptions, LaunchConfig and ProgramOptions is one of the fields of
    cuda.core's dataclasses (a wrong one is a TypeError on the GPU only)."""
    fields = {"EventOptions": {"enable_timing", "busy_waited_sync", "ipc_enabled",  # 0.x
                               "timing_enabled", "blocking_sync"},  # 1.x (the GPU machine: 1.2.0)
              "LaunchConfig": {"grid", "cluster", "block", "shmem_size", "is_cooperative", "stream"},
              "ProgramOptions": {"arch", "std"}}
    seen = set()
    for node in ast.walk(ast.parse(KERNEL_LAYER.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            name = name.lstrip("_")
            if name in fields:
                seen.add(name)
                assert {k.arg for k in node.keywords} <= fields[name], (name, [k.arg for k in node.keywords])
    assert seen == set(fields)


# ---------------------------------------------------------------------------------------------------------
# the loop, dry


@pytest.fixture
def tables(tmp_path, monkeypatch):
    from taso_mlir.passes.cost import cuda_table as CT

    d = tmp_path / "tables"
    d.mkdir()
    monkeypatch.setenv(CT.TABLES_ENV, str(d))
    return d


def test_dry_run_writes_a_complete_table_that_cuda_targets_read(tmp_path, tables):
    from taso_mlir.passes.cost.oracle import get_cost_model

    sigs = small_sigs(tmp_path)
    out = tables / "dry.json"
    r = run("--dry-run", "--sigs", sigs, "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    t = json.loads(out.read_text())
    n = len(sigs.read_text().splitlines()) - 1
    assert t["complete"] and t["stopped"] is None and t["counts"]["signatures"] == n
    assert t["counts"]["measured"] == n and not t["failed"] and not t["unsupported"]
    assert t["method"]["backend"] == "dry" and "not a GPU measurement" in t["device"]["gpu"]
    assert t["signatures_file"]["commit"] and t["checks"] and all(c["ok"] for c in t["checks"].values())
    for e in t["entries"].values():
        assert e["q1_ms"] <= e["ms"] <= e["q3_ms"] and (e["repeats"] >= 5 or e["backend"].startswith("view"))
    cm = get_cost_model("cuda:dry")
    assert cm.describe().startswith("measured on DRY RUN") and len(cm.entries) == n
    from taso_mlir.passes.cost.cuda_table import sig_from_key

    k = next(iter(t["entries"]))
    assert cm.cost(sig_from_key(k)) == pytest.approx(t["entries"][k]["ms"]) and cm.hits == 1


def test_budget_stops_cleanly_and_resume_finishes(tmp_path):
    sigs = small_sigs(tmp_path, n_per_kind=3)
    out = tmp_path / "t.json"
    # a budget spent before the loop starts measures nothing, but leaves a valid, incomplete table
    r = run("--dry-run", "--sigs", sigs, "--out", out, "--budget-s", "0.01", "--reserve-s", "0")
    assert r.returncode == 0, r.stderr
    t = json.loads(out.read_text())
    assert not t["complete"] and "budget" in t["stopped"] and t["counts"]["not_reached"] == t["counts"]["signatures"]
    # a few at a time with --limit, then the rest resumed
    r = run("--dry-run", "--sigs", sigs, "--out", out, "--limit", "5")
    t1 = json.loads(out.read_text())
    assert r.returncode == 0 and len(t1["entries"]) == 5 and not t1["complete"]
    r = run("--dry-run", "--sigs", sigs, "--out", out, "--resume")
    assert r.returncode == 0, r.stderr
    t2 = json.loads(out.read_text())
    assert t2["complete"] and "resuming" in r.stdout and t2["resumed_from"]
    assert all(t2["entries"][k] == v for k, v in t1["entries"].items())  # kept, not measured again


def test_resume_refuses_another_device(tmp_path):
    sigs = small_sigs(tmp_path, n_per_kind=1)
    out = tmp_path / "t.json"
    assert run("--dry-run", "--sigs", sigs, "--out", out, "--limit", "2").returncode == 0
    t = json.loads(out.read_text())
    t["device"]["gpu"] = "NVIDIA H100 80GB HBM3"
    out.write_text(json.dumps(t))
    r = run("--dry-run", "--sigs", sigs, "--out", out, "--resume")
    assert r.returncode != 0 and "cannot resume" in r.stderr


def _run_with_timing(define: str, after: str, args: list, timeout: float):
    """calibrate.py's dry run in a new process, its ``DryBackend.time`` replaced by the function
    ``timing`` that ``define`` defines (``orig``: the original); ``after`` runs once ``main`` has
    returned ``rc``."""
    argv = ["--dry-run"] + [str(a) for a in args]
    code = f"""
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("c", {str(SCRIPT)!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
orig = c.DryBackend.time
{define}
c.DryBackend.time = timing
rc = c.main({argv!r})
{after}
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_checkpoints_are_written_while_measuring(tmp_path):
    """With a checkpoint every 0 s, the table on disk grows as the loop goes (seen from a slow backend)."""
    sigs = small_sigs(tmp_path, n_per_kind=1)
    out = tmp_path / "t.json"
    r = _run_with_timing(f"""
seen = []
def timing(self, prep, w, r, cap):
    try:
        seen.append(len(json.load(open({str(out)!r}))["entries"]))
    except FileNotFoundError:
        seen.append(-1)
    return orig(self, prep, 1, 5, cap)
""", """
print("SEEN", json.dumps(seen)); sys.exit(rc)
""", ["--sigs", sigs, "--out", out, "--checkpoint-s", "0"], timeout=300)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.split("SEEN", 1)[1])
    # before each signature is timed, every one timed before it is on disk
    assert seen[0] == 0 and seen == sorted(seen) and seen[-1] >= len(seen) - 1 > 0


def test_failures_are_recorded_and_the_run_goes_on(tmp_path):
    bad = {"key": "bad-conv", "kind": "conv2d", "attrs": [["group", 1]], "in_shapes": [[1, 3, 8, 8], [4, 5, 3, 3]],
           "out_shapes": [[1, 4, 6, 6]], "dtype": "f32", "weights": [0, 1], "models": 1, "rank": 0}
    odd = {"key": "odd-op", "kind": "onnx.TopK", "attrs": [], "in_shapes": [[8]], "out_shapes": [[2], [2]],
           "dtype": "f32", "weights": [0], "models": 1, "rank": 0}
    sigs = small_sigs(tmp_path, n_per_kind=1, extra=[bad, odd])
    out = tmp_path / "t.json"
    r = run("--dry-run", "--sigs", sigs, "--out", out)
    t = json.loads(out.read_text())
    assert "bad-conv" in t["failed"] and "odd-op" in t["unsupported"] and "no kernel for onnx.TopK" in t["unsupported"]["odd-op"]
    assert t["complete"] and t["counts"]["measured"] == t["counts"]["signatures"] - 2
    assert r.returncode == 0 and "failed: bad-conv" in r.stdout


def test_watchdog_ends_a_hanging_signature_with_the_table_written(tmp_path):
    sigs = small_sigs(tmp_path, n_per_kind=1)
    out = tmp_path / "t.json"
    r = _run_with_timing("""
calls = []
def timing(self, prep, w, r, cap):
    calls.append(1)
    if len(calls) == 4:
        time.sleep(60)
    return orig(self, prep, 1, 5, cap)
""", "", ["--sigs", sigs, "--out", out, "--hang-s", "1.5"], timeout=120)
    assert r.returncode == 3, r.stderr
    t = json.loads(out.read_text())
    assert "watchdog" in t["stopped"] and not t["complete"] and len(t["entries"]) >= 2
    assert any("watchdog" in v for v in t["failed"].values())


def test_smoke_prints_a_checked_table(tmp_path):
    r = run("--dry-run", "--sigs", SIGS, "--out", tmp_path / "s.json", "--smoke", "8", "--check-work", "1e6")
    assert r.returncode == 0, r.stderr
    rows = [x for x in r.stdout.splitlines() if " us  IQR " in x]
    assert len(rows) == 8 and any(x.startswith("conv2d") for x in rows) and any(x.startswith("matmul") for x in rows)
    assert "check conv2d" in r.stdout


def test_short_names():
    assert K.short_name("NVIDIA H100 80GB HBM3") == "h100"
    assert K.short_name("NVIDIA H200") == "h200"
    assert K.short_name("NVIDIA A100-SXM4-40GB") == "a100"
    assert K.short_name("Tesla T4") == "t4"


@pytest.mark.parametrize("path", [SCRIPT, KERNEL_LAYER], ids=["calibrate.py", "cuda_kernels.py"])
def test_the_script_imports_only_what_the_gpu_machine_has(path):
    """The standard library and numpy at the top; torch, cupy and cuda-python inside the CUDA backend; never
    taso_mlir (not installed there): the script and the kernel layer it loads by path."""
    tree = ast.parse(path.read_text())
    top, inner = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            (top if node in tree.body else inner).update(n.split(".")[0] for n in names)
    std = set(sys.stdlib_module_names) | {"__future__"}
    assert top <= std | {"numpy"}, top - std
    assert inner <= std | {"numpy", "torch", "cupy", "cuda"}, inner - std


def test_the_script_runs_without_the_package(tmp_path):
    """Run from a copy outside the repository (the script, its signatures and the kernel layer where the
    script finds it) with taso_mlir unimportable: the dry smoke still works."""
    d = tmp_path / "alone"
    (d / "benchmarks" / "gpu").mkdir(parents=True)
    (d / "passes" / "cost").mkdir(parents=True)
    shutil.copy(SCRIPT, d / "benchmarks" / "gpu" / "calibrate.py")
    shutil.copy(SIGS, d / "benchmarks" / "gpu" / "signatures.jsonl")
    shutil.copy(KERNEL_LAYER, d / "passes" / "cost" / "cuda_kernels.py")
    (d / "taso_mlir.py").write_text("raise ImportError('taso_mlir must not be imported here')\n")
    env = dict(os.environ, PYTHONPATH=str(d))
    r = subprocess.run([sys.executable, str(d / "benchmarks" / "gpu" / "calibrate.py"), "--dry-run", "--smoke", "3",
                        "--check-work", "1e5", "--out", str(d / "s.json")], capture_output=True, text=True, env=env,
                       cwd=d, timeout=300)
    assert r.returncode == 0, r.stderr


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU here (torch with CUDA is needed): the CUDA backend is untested "
                                       "on this machine; benchmarks/gpu/run_h100.sh runs it on the GPU machine")
def test_cuda_smoke_on_a_gpu(tmp_path):
    r = run("--sigs", SIGS, "--out", tmp_path / "s.json", "--smoke", "30", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    t = json.loads((tmp_path / "s.json").read_text())
    assert t["method"]["backend"] == "cuda" and all(c["ok"] for c in t["checks"].values())


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_prepared_command_rehearses_end_to_end(tmp_path):
    """benchmarks/gpu/run_h100.sh --dry-run, with small budgets: the environment log, the smoke table and log,
    the calibration table and log in $OUT, and exit 0 with a table written."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), SMOKE_S="20", BUDGET_S="8",
               SIGS=str(small_sigs(tmp_path, n_per_kind=2)))
    r = subprocess.run(["bash", str(RUN), "--dry-run"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["calibrate.log", "dry.json", "env.log", "smoke-dry.json",
                                                     "smoke.log"]
    t = json.loads((out / "dry.json").read_text())
    assert t["name"] == "dry" and t["counts"]["measured"] > 0 and t["elapsed_s"] < 8 + 5
    assert "smoke exit 0, calibration exit 0" in (out / "calibrate.log").read_text()
    assert "numpy" in (out / "env.log").read_text()


def test_a_gather_that_writes_more_than_its_input_is_unsupported_and_clip_is_an_elementwise_pass():
    """A plan's copy reads as many elements as it writes: a Gather repeating rows (an embedding of two
    token types read at 256 positions) would read past its input on the GPU, so it is unsupported (the
    fitted model prices it); a Clip of scalar bounds is one elementwise pass, timed as a ReLU."""
    rec = {"kind": "onnx.Gather", "attrs": [], "in_shapes": [[2, 256], [2, 128]], "out_shapes": [[2, 128, 256]],
           "dtype": "f32"}
    with pytest.raises(K.Unsupported, match="more than its first input"):
        K.plan(rec)
    rec = dict(rec, in_shapes=[[8192, 256], [2, 128]])
    assert K.plan(rec).op == "copy"
    pl = K.plan({"kind": "onnx.Clip", "attrs": [], "in_shapes": [[1, 1280, 7, 7], [], []],
                   "out_shapes": [[1, 1280, 7, 7]], "dtype": "f32"})
    assert pl.op == "unary" and pl.approx
