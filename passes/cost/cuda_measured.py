"""``cost-model=cuda``: each op signature the search prices, measured on the GPU this process runs on (issue 24).

Where ``cuda:<gpu>`` reads a table measured elsewhere (``cuda_table.py``), ``cuda`` measures in the searching
process: a signature it has not priced before is planned, prepared and timed by the kernel layer
(``cuda_kernels.py``: cuDNN convolutions and cuBLAS GEMMs through torch, NVRTC kernels through cuda.core for
elementwise ops and data movement; TASO's 8 warm-up runs and 32 timed runs between device events, the median),
and the result is cached on disk per device, so that a second search of the same model times nothing.

- **The cache**: ``$TASO_CACHE_DIR/cuda-costs.json`` (default ``$XDG_CACHE_HOME/taso-mlir/``, else
  ``~/.cache/taso-mlir/``: ``disk_cache.cache_dir``), the same
  ``{"devices": {device: {signature: ms}}}`` file format as ``cpu``'s (``disk_cache.DiskCache``), keyed by the device
  (``device_key``): the GPU's name, the driver's version, the versions of the libraries the kernels run
  through (torch, cuDNN, cuBLAS, NVRTC, cuda-core, cuda-bindings, CuPy), a digest of the NVRTC kernels' source
  and the method (warm-ups, repeats, strict FP32). The key is read from the driver and the installed packages'
  metadata without importing torch, and the kernel layer (torch, NVRTC compilation, the spin kernel's clock
  rate) is started only at the first signature the cache lacks: a search whose signatures are all cached
  starts nothing on the GPU. New timings are written at the end of the search and every ``FLUSH_S`` seconds
  while measuring (a search cut short keeps what it measured).
- **Misses**: a signature without a kernel (``cuda_kernels.Unsupported``: integer ops, generic ops the layer
  does not plan) or whose kernels failed is estimated by the analytic roofline of this GPU (fitted to its
  shipped ``cuda:<gpu>`` table where one exists, else its hand-set profile, else the H100's) and counted in
  ``estimated``, as ``cuda:<gpu>``'s misses are (taso-search's report: "N op signatures had no measurement
  and were estimated analytically"). After ``MAX_FAILURES`` failed signatures (a sticky CUDA error fails every
  later call) nothing more is measured in this process: the rest is estimated, with a warning.
- **Without a GPU or without cuda-python** (``unavailable``): ``get_cost_model("cuda")`` is a one-line
  ``TasoError`` (``taso-opt`` prints it and exits 1), before any search starts.
- **The rehearsal**: with ``$TASO_CUDA_DRY_RUN=1`` the kernel layer's dry backend (numpy on the CPU, a wall
  clock) stands in for the GPU: every step but the kernel calls runs, and every report says "DRY RUN ... not
  a GPU measurement" (``benchmarks/gpu/run_inprocess.sh --dry-run``). Its numbers are numpy's.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from typing import Optional

from taso_mlir.dialect.errors import TasoError, one_line
from taso_mlir.passes.cost import cuda_kernels as K
from taso_mlir.passes.cost.disk_cache import DiskCache, cache_dir, warn
from taso_mlir.passes.cost.roofline import GPU_PROFILES, Analytic, CostModel, OpSig, sig_record

#: the rehearsal: the dry backend (numpy on the CPU) stands in for the GPU
DRY_ENV = "TASO_CUDA_DRY_RUN"
CACHE_FILE = "cuda-costs.json"
#: seconds between writes of the cache while measuring
FLUSH_S = 5.0
#: failed signatures after which nothing more is measured in the process
MAX_FAILURES = 5
#: TASO's method: warm-up runs, timed runs (the median kept), the seconds one signature's runs may take
WARMUP, REPEATS, CAP_S = 8, 32, 2.0
#: the packages whose versions name the device in the cache (the libraries the kernels run through)
_LIBRARIES = ("torch", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cublas", "nvidia-cublas-cu12",
              "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12", "cuda-core", "cuda-bindings", "cupy-cuda13x",
              "cupy-cuda12x")


def dry_run() -> bool:
    return os.environ.get(DRY_ENV, "").strip() not in ("", "0")


def _driver():
    """cuda-python's driver API module (``cuda.bindings.driver``; ``cuda.cuda`` before cuda-python 12.6)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver
    return driver


def _call(driver, fn: str, *args):
    """A driver call's results after its status; raises RuntimeError naming the status where it failed."""
    r = getattr(driver, fn)(*args)
    r = r if isinstance(r, tuple) else (r,)
    if r[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{fn}: {getattr(r[0], 'name', r[0])}")
    return r[1:]


def probe() -> dict:
    """This process's GPU as the driver reports it, without importing torch or creating a context: ``gpu`` (the
    name of device 0), ``driver`` (the kernel module's version, else the driver API's), ``devices``. Raises
    ``ImportError`` without cuda-python, ``RuntimeError`` without a usable GPU."""
    driver = _driver()
    _call(driver, "cuInit", 0)
    (n,) = _call(driver, "cuDeviceGetCount")
    if n < 1:
        raise RuntimeError("cuDeviceGetCount: no device")
    (dev,) = _call(driver, "cuDeviceGet", 0)
    (name,) = _call(driver, "cuDeviceGetName", 256, dev)
    name = (name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)).strip()
    return {"gpu": name, "driver": _driver_version(driver), "devices": int(n)}


def _driver_version(driver) -> str:
    """The NVIDIA kernel module's version (``/proc/driver/nvidia/version``, as nvidia-smi prints it), else the
    CUDA version the driver API reports."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            for word in f.readline().split():
                if word[:1].isdigit() and word.count(".") >= 1:
                    return word
    except OSError:
        pass
    try:
        (v,) = _call(driver, "cuDriverGetVersion")
        return f"CUDA {int(v) // 1000}.{int(v) % 1000 // 10} driver API"
    except Exception:
        return "unknown"


def unavailable() -> Optional[str]:
    """Why ``cost-model=cuda`` cannot measure in this process (None: it can, or the rehearsal is on)."""
    if dry_run():
        return None
    try:
        probe()
    except ImportError as e:
        return f"cuda-python is not installed ({one_line(e, 120)})"
    except Exception as e:
        return f"no usable CUDA GPU ({one_line(e, 160)})"
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the cuDNN and cuBLAS calls go through it)"
    return None


def device_key(dev: dict, versions: dict) -> str:
    """The cache's name for a device: the GPU, its driver, the libraries' versions, the kernels and the method."""
    libs = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    kernels = f"{zlib.crc32(K.KERNELS.encode()):08x}"
    return (f"{dev['gpu']} | driver {dev.get('driver', 'unknown')} | {libs or 'no libraries'} | kernels {kernels} | "
            f"{WARMUP}+{REPEATS} runs, median, strict FP32")


#: (dry) -> the started backend, shared by the cost models of one process (NVRTC compiles once)
_BACKENDS: dict = {}


def open_backend(dry: bool):
    """The kernel layer's backend for this process, started once: ``CudaBackend`` (strict FP32, NVRTC and events
    through cuda.core) or, for the rehearsal, ``DryBackend``."""
    if dry not in _BACKENDS:
        if dry:
            _BACKENDS[dry] = K.DryBackend(None)
        else:
            _BACKENDS[dry] = K.CudaBackend(argparse.Namespace(tf32=False, nvrtc="cuda.core", events="cuda.core"))
    return _BACKENDS[dry]


def fallback_for(gpu: str) -> Analytic:
    """The analytic model that prices what cannot be measured on this GPU: ``analytic:<gpu>`` (fitted to its
    shipped table where one exists), else the H100's."""
    from taso_mlir.passes.cost import cuda_table

    return cuda_table.analytic(gpu if gpu in GPU_PROFILES else "h100")


class CudaMeasured(CostModel):
    """Per-signature latencies measured by ``backend`` (started by ``start_backend`` at the first cache miss),
    cached on disk per ``device``; what cannot be measured estimated by ``fallback`` and counted.

    ``hits``: distinct signatures priced from a measurement (``timed`` of them measured by this instance, the
    rest found in the cache); ``estimated``: by the fallback; ``unsupported`` and ``failed``: key -> why."""

    name = "cuda"

    def __init__(self, gpu: str, device: str, start_backend, fallback: Analytic, path: Optional[str] = None,
                 warmup: int = WARMUP, repeats: int = REPEATS, cap_s: float = CAP_S, rehearsal: bool = False):
        super().__init__()
        self.gpu, self.device, self.rehearsal = gpu, device, rehearsal
        self._start, self._backend = start_backend, None
        self.fallback = fallback
        self.warmup, self.repeats, self.cap_s = warmup, repeats, cap_s
        self.cache = DiskCache(path or os.path.join(cache_dir(), CACHE_FILE), device)
        self.path = self.cache.path
        self.hits = self.timed = 0
        self.measure_s = 0.0  # seconds spent starting the backend and measuring
        self.unsupported: dict = {}
        self.failed: dict = {}
        self.paths: dict = {}  # the backend's kernel paths, once started
        self._flushed = time.monotonic()

    # -- pricing

    def backend(self):
        if self._backend is None:
            t = time.monotonic()
            try:
                self._backend = self._start()
            except Exception as e:
                raise TasoError(f"cost model 'cuda': cannot start the CUDA kernel layer on {self.gpu} "
                                f"({type(e).__name__}: {one_line(e, 200)})") from None
            finally:
                self.measure_s += time.monotonic() - t
            # which kernels run (cuDNN, cuBLAS, NVRTC through cuda.core or CuPy, else torch's own): a path that
            # fell back is said once, as its numbers are another library's
            self.paths = dict(getattr(self._backend, "paths", dict)())
            errors = self.paths.pop("errors", None) or {}
            if errors:
                warn(f"cost-model=cuda on {self.gpu}: " + "; ".join(
                    f"{k} failed ({one_line(str(v), 120)})" for k, v in list(errors.items())[:3])
                    + f"; the kernels used: {self.paths.get('elementwise/movement', '?')}, events: "
                      f"{self.paths.get('events', '?')}")
        return self._backend

    def _cost(self, sig: OpSig) -> float:
        k = sig.key()
        ms = self.cache.get(k)
        if ms is not None:
            self.hits += 1
            return ms
        rec = sig_record(sig)
        try:
            pl = K.plan(rec)
        except K.Unsupported as e:
            self.unsupported[k] = str(e)
            return self._estimate(sig)
        if len(self.failed) >= MAX_FAILURES:
            return self._estimate(sig)
        backend = self.backend()
        t = time.monotonic()
        try:
            entry = K.measure(backend, rec, pl, self.warmup, self.repeats, self.cap_s)
        except K.Unsupported as e:
            self.unsupported[k] = str(e)
            return self._estimate(sig)
        except Exception as e:
            self.failed[k] = f"{type(e).__name__}: {one_line(e, 200)}"
            warn(f"cost-model=cuda: {sig.kind} {list(map(list, sig.in_shapes))} failed on {self.gpu} "
                  f"({self.failed[k]}); estimating it" + (
                      f"; {MAX_FAILURES} signatures failed: nothing more is measured in this process"
                      if len(self.failed) == MAX_FAILURES else ""))
            return self._estimate(sig)
        finally:
            self.measure_s += time.monotonic() - t
        self.hits += 1
        self.timed += 1
        self.cache.put(k, entry["ms"])
        if time.monotonic() - self._flushed >= FLUSH_S:
            self.flush()
        return entry["ms"]

    def _estimate(self, sig: OpSig) -> float:
        self.estimated += 1
        return self.fallback.cost(sig)

    def flush(self) -> None:
        self.cache.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self.flush()

    # -- reporting

    def describe(self) -> str:
        what = ("DRY RUN: timed by numpy on the CPU, not a GPU measurement" if self.rehearsal
                else f"measured on {self.gpu} by this process")
        return (f"{what} ({self.warmup} warm-ups, {self.repeats} timed runs, medians; cached per device); signatures "
                f"without a kernel {self.fallback.describe()}")

    def counts(self) -> dict:
        """The distinct signatures priced so far: ``measured`` (``timed`` now, the rest from the cache),
        ``estimated`` (no kernel, or its kernels failed)."""
        return {"measured": self.hits, "timed": self.timed, "cached": self.hits - self.timed,
                "estimated": self.estimated, "unsupported": len(self.unsupported), "failed": len(self.failed)}

    def summary(self) -> str:
        c = self.counts()
        return (f"{c['measured']} of {c['measured'] + c['estimated']} op signatures measured on {self.gpu} "
                f"({c['timed']} timed now in {self.measure_s:.1f} s, {c['cached']} from the cache), "
                f"{c['estimated']} estimated ({c['unsupported']} without a kernel, {c['failed']} failed)")


def get(spec: str) -> CudaMeasured:
    """``cost-model=cuda``: measured on this process's GPU, or a one-line error saying why it cannot be."""
    dry = dry_run()
    if dry:
        dev = K.DryBackend(None).device_info()  # ("DRY RUN: numpy on the CPU (...), not a GPU measurement")
        versions = K.package_versions(("numpy",))
    else:
        why = unavailable()
        if why is not None:
            from taso_mlir.passes.cost import cuda_table

            have = ", ".join(f"cuda:{g}" for g in cuda_table.shipped_tables()) or "none"
            raise TasoError(f"cost model '{spec}' is not available on this machine: {why}; it measures on the GPU "
                            f"this process runs on, through cuda-python and torch (tables measured elsewhere: "
                            f"{have}; analytic:<gpu> estimates)")
        dev = probe()
        versions = K.package_versions(_LIBRARIES)
    return CudaMeasured(dev["gpu"], device_key(dev, versions), lambda: open_backend(dry),
                        fallback_for(K.short_name(dev["gpu"])), rehearsal=dry)
