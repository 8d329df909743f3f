"""``cost-model=cuda`` (passes/cost/cuda_measured.py, issue 24): each signature measured on this process's GPU, cached
per device, misses estimated and counted. On the CPU the oracle's logic runs over the kernel layer's dry backend
and over fake backends (what is measured, with which method, what is cached under which device, what falls back
and how it is counted, when measuring stops), cuda-python's driver calls over a fake driver module, and the
one-line errors without cuda-python or a GPU; the CUDA path itself runs only where a GPU is (skipped here with the
reason)."""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from taso_mlir.dialect.errors import TasoError
from taso_mlir.passes.cost import cuda_kernels as K
from taso_mlir.passes.cost import cuda_measured as CM
from taso_mlir.passes.cost.oracle import PROFILES, Analytic, DiskCache, OpSig, describe, get_cost_model, is_measured

ROOT = Path(__file__).resolve().parents[2]

X = (1, 16, 8, 8)
CONV = OpSig("conv2d", (("activation", "relu"), ("dilations", (1, 1)), ("group", 1), ("pads", (1, 1, 1, 1)),
                        ("strides", (1, 1))), (X, (16, 16, 3, 3), (16,)), (X,), weights=(False, True, True))
MATMUL = OpSig("matmul", (("activation", "none"),), ((4, 32), (32, 8)), ((4, 8),))
ADD = OpSig("ewadd", (), (X, X), (X,))
VIEW = OpSig("reshape", (("shape", (16, 64)),), (X,), ((16, 64),))
NO_KERNEL = OpSig("onnx.TopK", (), ((8,),), ((2,), (2,)))
INTEGER = OpSig("ewadd", (), ((4,), (4,)), ((4,),), dtype="si64")
H100 = Analytic(PROFILES["h100"])


class FakeBackend:
    """A backend whose runs take the times given (ms), or whose preparation fails."""

    name = "fake"

    def __init__(self, times=(3.0, 1.0, 2.0), fail: bool = False):
        self.times, self.fail = list(times), fail
        self.prepared, self.timed, self.released = [], [], 0

    def prepare(self, rec, pl):
        if self.fail:
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
        self.prepared.append(rec["kind"])

        def release():
            self.released += 1
        return K.Prepared(lambda: None, lambda: [], f"fake {pl.op}", release=release)

    def time(self, prep, warmup, repeats, cap_s):
        self.timed.append((warmup, repeats, cap_s))
        return list(self.times), warmup, repeats


def model(tmp_path, backend, device="GPU X | driver 1", starts=None, **kw):
    """A ``CudaMeasured`` over ``backend`` (``starts`` counts its starts), its cache in tmp_path."""
    def start():
        if starts is not None:
            starts.append(1)
        if backend is None:
            raise AssertionError("the backend must not be started")
        return backend
    return CM.CudaMeasured("GPU X", device, start, H100, path=str(tmp_path / "cuda-costs.json"), **kw)


# ---------------------------------------------------------------------------------------------------------
# measuring, caching, falling back


def test_each_signature_is_measured_once_with_tasos_method_and_the_median(tmp_path):
    be = FakeBackend(times=[5.0, 1.0, 2.0, 4.0, 3.0])
    cm = model(tmp_path, be)
    assert cm.cost(CONV) == 3.0 and cm.cost(MATMUL) == 3.0  # the median of the runs
    assert cm.cost(CONV) == 3.0  # memoized: not measured again
    assert be.prepared == ["conv2d", "matmul"] and be.released == 2
    assert be.timed == [(8, 32, 2.0)] * 2  # 8 warm-ups, 32 timed runs, as TASO
    assert cm.counts() == {"measured": 2, "timed": 2, "cached": 0, "estimated": 0, "unsupported": 0, "failed": 0}
    assert is_measured(cm) and cm.estimated == 0


def test_the_dry_backend_measures_every_kind_the_kernel_layer_plans(tmp_path):
    """The kernel layer's own numpy backend behind the oracle: real plans, real preparation, wall-clock times."""
    cm = model(tmp_path, K.DryBackend(None), warmup=1, repeats=5)
    for sig in (CONV, MATMUL, ADD):
        assert cm.cost(sig) > 0
    assert cm.cost(VIEW) == 0.0  # a view launches nothing
    assert cm.hits == cm.timed == 4 and cm.estimated == 0


def test_a_second_run_reads_the_cache_and_starts_nothing(tmp_path):
    starts = []
    first = model(tmp_path, FakeBackend(times=[0.25]), starts=starts)
    c, m = first.cost(CONV), first.cost(MATMUL)
    first.close()
    assert starts == [1]
    data = json.loads((tmp_path / "cuda-costs.json").read_text())
    assert data["devices"] == {"GPU X | driver 1": {CONV.key(): c, MATMUL.key(): m}}
    mtime = (tmp_path / "cuda-costs.json").stat().st_mtime_ns
    starts.clear()
    again = model(tmp_path, None, starts=starts)  # (starting its backend would fail the test)
    assert again.cost(CONV) == c and again.cost(MATMUL) == m
    assert again.counts()["cached"] == 2 and again.timed == 0 and not starts
    again.close()
    assert (tmp_path / "cuda-costs.json").stat().st_mtime_ns == mtime  # nothing new: not rewritten


def test_the_cache_is_per_device(tmp_path):
    """Another GPU, driver or library version is another device: its signatures are measured again, and both
    devices' entries stay in the file."""
    a = model(tmp_path, FakeBackend(times=[1.0]), device="GPU X | driver 1")
    a.cost(ADD)
    a.close()
    be = FakeBackend(times=[2.0])
    b = model(tmp_path, be, device="GPU X | driver 2")
    assert b.cost(ADD) == 2.0 and be.prepared == ["ewadd"]
    b.close()
    devices = json.loads((tmp_path / "cuda-costs.json").read_text())["devices"]
    assert devices == {"GPU X | driver 1": {ADD.key(): 1.0}, "GPU X | driver 2": {ADD.key(): 2.0}}


def test_without_a_kernel_the_analytic_model_prices_it_and_it_is_counted(tmp_path):
    be = FakeBackend()
    cm = model(tmp_path, be)
    assert cm.cost(NO_KERNEL) == pytest.approx(H100.cost(NO_KERNEL))
    assert cm.cost(INTEGER) == pytest.approx(H100.cost(INTEGER))
    assert cm.estimated == 2 and be.prepared == []
    assert "no kernel for onnx.TopK" in cm.unsupported[NO_KERNEL.key()]
    assert "only float kernels" in cm.unsupported[INTEGER.key()]
    cm.close()
    assert not (tmp_path / "cuda-costs.json").exists()  # estimates are not measurements: never cached


def test_failures_are_estimated_warned_and_stop_measuring(tmp_path, capsys):
    """A signature whose kernels fail is estimated and counted; after MAX_FAILURES (a sticky CUDA error fails every
    later call) nothing more is measured in the process."""
    be = FakeBackend(fail=True)
    cm = model(tmp_path, be)
    sigs = [OpSig("relu", (), ((1, n),), ((1, n),)) for n in range(1, CM.MAX_FAILURES + 3)]
    for s in sigs:
        assert cm.cost(s) == pytest.approx(H100.cost(s))
    err = capsys.readouterr().err
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "nothing more is measured in this process" in err
    assert len(cm.failed) == CM.MAX_FAILURES and cm.estimated == len(sigs)
    be.fail = False
    assert cm.cost(ADD) == pytest.approx(H100.cost(ADD)) and be.prepared == []


def test_measurements_are_written_while_measuring(tmp_path, monkeypatch):
    """Every FLUSH_S seconds of a search, not only at its end: a search cut short keeps what it measured."""
    monkeypatch.setattr(CM, "FLUSH_S", 0.0)
    cm = model(tmp_path, FakeBackend(times=[1.5]))
    cm.cost(MATMUL)
    assert json.loads((tmp_path / "cuda-costs.json").read_text())["devices"]["GPU X | driver 1"] == {MATMUL.key(): 1.5}


def test_a_backend_that_cannot_start_is_a_one_line_error(tmp_path):
    def start():
        raise RuntimeError("torch sees no CUDA device")
    cm = CM.CudaMeasured("GPU X", "GPU X | d", start, H100, path=str(tmp_path / "c.json"))
    assert cm.cost(NO_KERNEL) > 0  # what needs no kernel needs no backend
    with pytest.raises(TasoError) as e:
        cm.cost(ADD)
    msg = str(e.value)
    assert "\n" not in msg and "cannot start the CUDA kernel layer on GPU X" in msg and "no CUDA device" in msg


def test_a_kernel_path_that_fell_back_is_said_once(tmp_path, capsys):
    """Where NVRTC through cuda.core failed and another library's kernels run, the numbers are theirs: one
    warning when the kernel layer starts, naming what failed and what runs instead."""
    be = FakeBackend()
    be.paths = lambda: {"elementwise/movement": "NVRTC kernels via cupy", "events": "torch.cuda.Event",
                        "errors": {"nvrtc via cuda.core": "RuntimeError: CUDA_ERROR_INVALID_VALUE"}}
    cm = model(tmp_path, be)
    cm.cost(ADD), cm.cost(MATMUL)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "nvrtc via cuda.core failed (RuntimeError: CUDA_ERROR_INVALID_VALUE)" in err
    assert "the kernels used: NVRTC kernels via cupy, events: torch.cuda.Event" in err
    assert cm.paths == {"elementwise/movement": "NVRTC kernels via cupy", "events": "torch.cuda.Event"}


def test_the_report_says_what_was_measured_and_what_estimated(tmp_path):
    cm = model(tmp_path, FakeBackend())
    cm.cost(ADD), cm.cost(NO_KERNEL)
    d = describe(cm)
    assert d.startswith("measured on GPU X by this process (8 warm-ups, 32 timed runs, medians; cached per device)")
    assert "estimated by the analytic roofline of an NVIDIA H100" in d
    assert cm.summary().startswith("1 of 2 op signatures measured on GPU X (1 timed now")
    assert "1 estimated (1 without a kernel, 0 failed)" in cm.summary()


def test_the_device_key_names_the_gpu_driver_libraries_kernels_and_method():
    k = CM.device_key({"gpu": "NVIDIA H200", "driver": "580.159.04"}, {"torch": "2.11.0", "cuda-core": "1.2.0"})
    assert k.startswith("NVIDIA H200 | driver 580.159.04 | cuda-core 1.2.0, torch 2.11.0 | kernels ")
    assert k.endswith("| 8+32 runs, median, strict FP32")
    assert k != CM.device_key({"gpu": "NVIDIA H200", "driver": "580.159.04"}, {"torch": "2.12.0", "cuda-core": "1.2.0"})


def test_the_cache_is_in_the_users_cache_folder(monkeypatch, tmp_path):
    """``$TASO_CACHE_DIR``, else taso-mlir in ``$XDG_CACHE_HOME``, else in ``~/.cache`` (cpu's cache too)."""
    from taso_mlir.passes.cost.oracle import cache_dir

    monkeypatch.delenv("TASO_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "taso-mlir")
    cm = CM.CudaMeasured("GPU X", "GPU X | d", lambda: FakeBackend(times=[1.0]), H100)
    cm.cost(ADD)
    cm.close()
    assert (tmp_path / "xdg" / "taso-mlir" / CM.CACHE_FILE).exists()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == str(tmp_path / "home" / ".cache" / "taso-mlir")
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == str(tmp_path / "mine")


# ---------------------------------------------------------------------------------------------------------
# the driver (cuda-python) and the errors


def _fake_driver(monkeypatch, devices=1, init="CUDA_SUCCESS", name=b"NVIDIA H200\0\0\0"):
    """``cuda.bindings.driver`` with the calls ``probe`` makes, as cuda-python returns them (a status, then values)."""
    class CUresult(enum.Enum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_NO_DEVICE = 100

    ok = CUresult.CUDA_SUCCESS
    drv = types.ModuleType("cuda.bindings.driver")
    drv.CUresult = CUresult
    drv.cuInit = lambda flags: (CUresult[init],)
    drv.cuDeviceGetCount = lambda: (ok, devices)
    drv.cuDeviceGet = lambda ordinal: (ok, 0)
    drv.cuDeviceGetName = lambda length, dev: (ok, name)
    drv.cuDriverGetVersion = lambda: (ok, 13000)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = drv
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    for k, v in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.driver", drv)):
        monkeypatch.setitem(sys.modules, k, v)


@pytest.fixture
def no_dry(monkeypatch, tmp_path):
    monkeypatch.delenv(CM.DRY_ENV, raising=False)
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path))


def test_without_cuda_python_it_is_a_one_line_error(monkeypatch, no_dry):
    monkeypatch.setitem(sys.modules, "cuda", None)  # (import cuda raises ImportError)
    assert "cuda-python is not installed" in CM.unavailable()
    with pytest.raises(TasoError) as e:
        get_cost_model("cuda")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cost model 'cuda' is not available on this machine: cuda-python is "
                                              "not installed")
    assert "cuda:h200" in msg  # what can be had instead


def test_without_a_gpu_it_is_a_one_line_error(monkeypatch, no_dry):
    _fake_driver(monkeypatch, init="CUDA_ERROR_NO_DEVICE")
    with pytest.raises(TasoError, match=r"not available on this machine: no usable CUDA GPU \(cuInit: "
                                        r"CUDA_ERROR_NO_DEVICE\)"):
        get_cost_model("cuda")
    _fake_driver(monkeypatch, devices=0)
    assert "no usable CUDA GPU (cuDeviceGetCount: no device)" in CM.unavailable()


def test_the_probe_names_the_device_without_starting_anything(monkeypatch, no_dry, tmp_path):
    """On a GPU machine the device key comes from the driver and the packages' metadata; a search whose signatures
    are all cached starts no kernel layer (no torch, no NVRTC)."""
    pytest.importorskip("torch", reason="unavailable() requires PyTorch: not installed here")
    _fake_driver(monkeypatch)
    assert CM.probe() == {"gpu": "NVIDIA H200", "driver": CM._driver_version(sys.modules["cuda.bindings.driver"]),
                          "devices": 1}
    assert CM.unavailable() is None
    cm = get_cost_model("cuda")
    assert cm.name == "cuda" and cm.gpu == "NVIDIA H200" and cm.device.startswith("NVIDIA H200 | driver ")
    assert cm.fallback.name == "analytic:h200"  # the H200's roofline (fitted to its shipped table)
    cache = DiskCache(str(tmp_path / CM.CACHE_FILE), cm.device)
    cache.put(ADD.key(), 0.0125)
    cache.flush()
    again = get_cost_model("cuda")
    assert again.cost(ADD) == 0.0125 and again._backend is None and again.counts()["cached"] == 1


def test_taso_opt_without_a_gpu_is_a_one_line_error(tmp_path):
    """The installed command, with every GPU hidden from the process: exit 1, one line, no traceback."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TASO_CACHE_DIR=str(tmp_path))
    env.pop(CM.DRY_ENV, None)
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(ROOT / "docs" / "example.mlir"),
                        "--pass-pipeline=builtin.module(taso-search{target=cuda})", "-o", str(tmp_path / "o.mlir")],
                       capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("taso-opt: error: cost model 'cuda' is not available on this machine: "), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o.mlir").exists()


# ---------------------------------------------------------------------------------------------------------
# end to end


def _taso_opt(tmp_path, *args, dry=True):
    env = dict(os.environ, TASO_CACHE_DIR=str(tmp_path / "cache"))
    if dry:
        env[CM.DRY_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def test_the_rehearsal_searches_end_to_end_and_the_second_run_times_nothing(tmp_path):
    """``TASO_CUDA_DRY_RUN=1``: taso-search with target=cuda over the dry backend, labelled a dry run; the second run
    finds every signature in the cache (the cache file is not rewritten) and gives the same result."""
    src = ROOT / "docs" / "example.mlir"
    pipe = "--pass-pipeline=builtin.module(taso-search{target=cuda report=-})"
    r1 = _taso_opt(tmp_path, src, pipe, "-o", tmp_path / "a.mlir")
    assert r1.returncode == 0, r1.stderr
    assert "costs DRY RUN: timed by numpy on the CPU" in r1.stderr and "not a GPU measurement" in r1.stderr
    cache = tmp_path / "cache" / CM.CACHE_FILE
    (device, entries), = json.loads(cache.read_text())["devices"].items()
    assert device.startswith("DRY RUN: numpy on the CPU") and entries
    mtime = cache.stat().st_mtime_ns
    r2 = _taso_opt(tmp_path, src, pipe, "-o", tmp_path / "b.mlir")
    assert r2.returncode == 0, r2.stderr
    assert cache.stat().st_mtime_ns == mtime
    assert (tmp_path / "a.mlir").read_text() == (tmp_path / "b.mlir").read_text()
    cost = [ln.split(", search")[0] for ln in r1.stderr.splitlines() if "@cell: cost" in ln]
    assert cost and cost == [ln.split(", search")[0] for ln in r2.stderr.splitlines() if "@cell: cost" in ln]


def _gpu_reason():
    why = CM.unavailable() if not CM.dry_run() else "TASO_CUDA_DRY_RUN is set"
    if why is None:
        import torch

        if not torch.cuda.is_available():
            why = f"torch {torch.__version__} sees no CUDA device"
    return why


@pytest.mark.skipif(_gpu_reason() is not None, reason=f"cost-model=cuda cannot measure here ({_gpu_reason()}): the "
                    "CUDA path is untested on this machine; benchmarks/gpu/run_inprocess.sh runs it on the GPU machine")
def test_cuda_measures_on_this_gpu_end_to_end(tmp_path):
    src = ROOT / "docs" / "example.mlir"
    pipe = "--pass-pipeline=builtin.module(taso-search{target=cuda report=-})"
    r = _taso_opt(tmp_path, src, pipe, "-o", tmp_path / "a.mlir", dry=False)
    assert r.returncode == 0, r.stderr
    assert "costs measured on NVIDIA" in r.stderr and "by this process" in r.stderr
    (device, entries), = json.loads((tmp_path / "cache" / CM.CACHE_FILE).read_text())["devices"].items()
    assert device.startswith("NVIDIA") and entries and all(v >= 0 for v in entries.values())


# ---------------------------------------------------------------------------------------------------------
# the prepared GPU command (benchmarks/gpu/run_inprocess.sh)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_the_prepared_command_rehearses_end_to_end(tmp_path):
    """``run_inprocess.sh --dry-run`` with a bundle that holds only its manifest (this venv has the MLIR bindings and
    highspy the real bundle brings): the bundle unpacked, taso_mlir laid out from the working tree and imported from
    there, the quick models written, the analytic run, the cuda runs (the second from the cache, the same model
    written), the summary and the packed logs in $OUT, exit 0. The real bundle's rehearsal on a bare Python 3.12 is
    in docs/gpu-speedups.md."""
    import tarfile

    stage = tmp_path / "stage"
    (stage / "site").mkdir(parents=True)
    (stage / "BUNDLE.json").write_text(json.dumps({"format": "taso-mlir gpu bundle 1", "packages": {}}))
    bundle = tmp_path / "b.tar.xz"
    with tarfile.open(bundle, "w:xz") as t:
        t.add(stage / "BUNDLE.json", "BUNDLE.json")
        t.add(stage / "site", "site")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), BUNDLE=str(bundle), UNPACK=str(tmp_path / "unpack"),
               MODELS="squeezenet", TOTAL_S="240", TMPDIR=str(tmp_path))
    env.pop(CM.DRY_ENV, None)
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run_inprocess.sh"), "--dry-run"], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["inprocess.log", "inprocess.tgz"]
    log = (out / "inprocess.log").read_text()
    assert "imports: imports ok" in log and "done: 0 failure(s)" in log
    assert "squeezenet, analytic (analytic:h200): exit 0" in log and "squeezenet, cuda (cuda): exit 0" in log
    assert "costs DRY RUN: timed by numpy on the CPU" in log
    cached = [ln for ln in log.splitlines() if "squeezenet, cuda-cached (cuda): exit 0" in ln]
    assert cached and cached[0].split("cache: ")[1].split(" -> ")[0] == cached[0].split(" -> ")[1]  # nothing new
    assert "squeezenet: the cached run wrote the same model" in log
    # taso_mlir came from the layout of the working tree, not from an installation
    assert (tmp_path / "unpack" / "pkg" / "taso_mlir" / "passes").resolve() == ROOT / "passes"
    with tarfile.open(out / "inprocess.tgz") as t:
        names = {n.lstrip("./") for n in t.getnames()}
    assert {"env.log", "BUNDLE.json", "cache/cuda-costs.json", "squeezenet.cuda.log", "squeezenet.cuda-cached.log",
            "squeezenet.analytic.log"} <= names
