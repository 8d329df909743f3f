"""Cost oracles: ``cost(op signature) -> milliseconds``; a graph costs the sum over its ops.

Backends (``get_cost_model(spec)``):

- ``analytic[:<device>]`` (default ``analytic`` = ``analytic:t4``, the GPU of TENSAT's evaluation):
  a roofline over a device profile (``PROFILES``). One op = one kernel::

      time = launch + max(compute, bytes / (bandwidth x mem_eff))

  Convolutions and matmuls are GEMMs (conv: implicit GEMM per group). Their compute time counts
  the output tiles the device runs in waves over its ``slots`` (SMs, cores): a GEMM too small to
  fill the device still takes a whole wave, on average half a wave is idle at the tail, and a
  GEMM that keeps few SMs busy cannot saturate memory either. That under-utilisation plus the
  launch overhead is what makes one merged conv/matmul cheaper than two (TASO's main win). Data
  movement (concat, split, transpose, enlarge of activations) costs its bytes plus a launch: the
  exported model runs them as kernels. Reshape is a view (no bytes: one node dispatch). Ops that
  compute only from weights and constants (``weight_only``), the constants and ``weight`` cost 0:
  they are folded before export. Generic ops (``onnx.<Op>``): memory-bound estimate from their
  bytes, plus a launch (views such as ``onnx.Reshape``: a dispatch; without operands: 0).
  For a GPU with a measured ``cuda:<gpu>`` table (below), ``analytic:<gpu>`` is that roofline *fitted to the
  table* (``cuda_table.FittedAnalytic``: per op class, a fixed cost per kernel and a scale on the roofline,
  instead of the hand-set launch overhead and efficiencies), still an estimate for every op;
  ``analytic:<gpu>:datasheet`` is the hand-set profile in any case (and ``analytic:<gpu>`` without a table).
- ``cpu`` (or ``cpu:<threads>``): each signature timed in onnxruntime (a one-node model,
  ORT_ENABLE_ALL, 1 intra-op thread by default, warm-up then the median of timed repeats, loops
  long enough to be well above the timer's resolution, the session's empty-run overhead
  subtracted), cached on disk per device in ``$TASO_CACHE_DIR/cpu-costs.json`` (default
  ``$XDG_CACHE_HOME/taso-mlir/``, else ``~/.cache/taso-mlir/``; the thread count also from ``$TASO_COST_CPU_THREADS``). Signatures it
  cannot build (generic ops, dtypes it cannot feed) fall back to the ``analytic:cpu`` estimate for
  that many cores and are counted in ``estimated``.
- ``cuda:<gpu>``: per-op latencies measured on that GPU, read from the table ``passes/cost/tables/<gpu>.json``
  (``cuda_table.py``); signatures not in it are estimated by the analytic profile fitted to the table and
  counted in ``estimated``. Where no table has been measured for ``<gpu>`` it is a one-line error.
- ``cuda``: per-op latencies measured on the GPU this process runs on, as the search asks for them
  (``cuda_measured.py``, over the kernel layer ``cuda_kernels.py``), cached on disk per device in
  ``$TASO_CACHE_DIR/cuda-costs.json``; signatures without a kernel are estimated by the GPU's analytic profile
  and counted in ``estimated``. Without a GPU or without cuda-python it is a one-line error.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time

import numpy as np

from taso_mlir.dialect.errors import TasoError, one_line
from taso_mlir.dialect.specs import RELU6_MAX
from taso_mlir.passes.cost.disk_cache import DiskCache, cache_dir, warn  # noqa: F401 (re-exported)
from taso_mlir.passes.cost.roofline import (  # noqa: F401 (the analytic model, re-exported)
    GPU_PROFILES, PROFILES, Analytic, CostModel, OpSig, Profile, cpu_profile, flops, nbytes)


# ---------------------------------------------------------------------------------------------
# CPU measured (onnxruntime)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


_NP_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64}


class CpuMeasured(CostModel):
    """Per-signature onnxruntime timings on this machine's CPU, cached on disk per device.

    ``measured`` counts the signatures timed by this instance (cache hits are not), ``estimated``
    those that fell back to the analytic CPU profile."""

    CACHE_FILE = "cpu-costs.json"

    def __init__(self, threads: int = 1, repeats: int = 10, warmup: int = 3, target_s: float = 2e-3,
                 budget_s: float = 1.0):
        super().__init__()
        import onnxruntime

        self.threads = max(1, int(threads))
        self.repeats, self.warmup, self.target_s, self.budget_s = repeats, warmup, target_s, budget_s
        self.name = "cpu" if self.threads == 1 else f"cpu:{self.threads}"
        self.device = f"{cpu_name()} | onnxruntime {onnxruntime.__version__} | {self.threads} thread(s)"
        self.fallback = Analytic(cpu_profile(self.threads))
        self.measured = 0
        self.layouts_measured = 0  # the blocked-layout reorder costs measured (``_reorder``)
        self.cache = DiskCache(os.path.join(cache_dir(), self.CACHE_FILE), self.device)
        self.path = self.cache.path
        self._base_s = None  # the empty-run overhead of a session

    def _cost(self, sig: OpSig) -> float:
        ms = self._op_cost(sig)
        if sig.kind == "split" and len(sig.in_shapes) == 1 and len(sig.in_shapes[0]) == 4:
            # onnxruntime runs convolutions, pooling, relu and adds in a blocked channel layout (NCHWc)
            # and chains of them stay in it; Split has no such kernel, so a split between them costs a
            # reorder of each piece out of and back into the layout, on top of its own copy. The
            # one-op timings cannot see this (each includes its own reorders), so it is measured
            # apart: what a chain of two 1x1 convolutions on the piece's shape saves over the two
            # timed alone. (Measured: 1x64x35x35, 0.0106 ms a split, 0.011 ms a piece's reorders.)
            ms += sum(self._reorder(s) for s in sig.out_shapes)
        return ms

    def _reorder(self, shape: tuple) -> float:
        """The blocked-layout reorders a tensor of this NCHW shape costs between two NCHWc ops, ms."""
        k = json.dumps(["nchwc-reorder", list(shape)], separators=(",", ":"))
        if self.cache.get(k) is not None:
            return self.cache.get(k)
        try:
            one, two = _conv_chain_models(shape)
            base = self._base()
            t1 = self._run_time(one, [shape], [shape], np.float32)
            t2 = self._run_time(two, [shape], [shape], np.float32)
            ms = max(0.0, 1e3 * (2 * t1 - t2 - base))  # two sessions' overheads vs one
        except Exception as e:  # onnxruntime refuses the models: no layout effect is assumed
            warn(f"cannot time the layout reorder of {list(shape)} in onnxruntime ({one_line(e, 160)})")
            ms = 0.0
        self.layouts_measured += 1
        self.cache.put(k, ms)
        return ms

    def _op_cost(self, sig: OpSig) -> float:
        k = sig.key()
        if self.cache.get(k) is not None:
            return self.cache.get(k)
        ms = None
        model = _one_op_model(sig)
        if model is not None:
            try:
                ms = self._time(model, sig)
            except Exception as e:  # onnxruntime refuses the model (a dtype or attribute it lacks)
                warn(f"cannot time {sig.kind} in onnxruntime ({one_line(e, 160)}); estimating it")
        if ms is None:
            self.estimated += 1
            return self.fallback.cost(sig)
        self.measured += 1
        self.cache.put(k, ms)
        return ms

    def _session(self, model):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 4  # (failures are reported in one line of our own)
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def _run_time(self, model, in_shapes, out_shapes, npdt) -> float:
        """Seconds per run of the model with IO binding (no output conversion): median of repeats."""
        sess = self._session(model)
        rng = np.random.default_rng(0)
        binding = sess.io_binding()
        keep = []
        for i, s in zip(sess.get_inputs(), in_shapes):
            v = np.asarray(rng.uniform(0.5, 1.5, size=tuple(s)).astype(npdt), order="C")  # (0-d stays 0-d); no NaNs, no denormals
            keep.append(v)
            binding.bind_cpu_input(i.name, v)
        for o, s in zip(sess.get_outputs(), out_shapes):
            v = np.empty(tuple(s), dtype=npdt)
            keep.append(v)
            binding.bind_output(o.name, "cpu", 0, npdt, list(s), v.ctypes.data)
        run = sess.run_with_iobinding
        for _ in range(self.warmup):
            run(binding)
        t = time.perf_counter()
        run(binding)
        one = max(time.perf_counter() - t, 1e-7)
        loop = max(1, min(10000, int(self.target_s / one)))  # each timing well above the timer's resolution
        times = []
        start = time.perf_counter()
        for r in range(self.repeats):
            t = time.perf_counter()
            for _ in range(loop):
                run(binding)
            times.append((time.perf_counter() - t) / loop)
            if r >= 2 and time.perf_counter() - start > self.budget_s:  # big ops: fewer repeats
                break
        return float(np.median(times))

    def _time(self, model, sig: OpSig) -> float:
        npdt = _NP_DTYPES[sig.dtype]
        fed = [s for j, s in enumerate(sig.in_shapes) if not sig.is_weight(j)]  # weights are initializers
        raw = self._run_time(model, fed, sig.out_shapes, npdt)
        # the session's own per-run overhead is not the op's; keep at least a tenth of the raw time
        return 1e3 * max(raw - self._base(), 0.1 * raw)

    def _base(self) -> float:
        """Seconds of a session's own per-run overhead (an empty model), measured once."""
        if self._base_s is None:
            self._base_s = self._run_time(_empty_model(), [(1,)], [(1,)], np.float32)
        return self._base_s

    def close(self) -> None:
        """Merge this instance's new timings into the cache file."""
        self.cache.flush()


def _conv_chain_models(shape: tuple):
    """One 1x1 convolution (C -> C) on an NCHW tensor of ``shape``, and a chain of two."""
    from onnx import TensorProto, helper, numpy_helper

    c = int(shape[1])
    rng = np.random.default_rng(0)

    def model(k):
        ws = [numpy_helper.from_array(rng.uniform(-0.1, 0.1, size=(c, c, 1, 1)).astype(np.float32), f"w{i}")
              for i in range(k)]
        names = ["x"] + [f"t{i}" for i in range(k - 1)] + ["y"]
        nodes = [helper.make_node("Conv", [names[i], f"w{i}"], [names[i + 1]]) for i in range(k)]
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
        return helper.make_model(helper.make_graph(nodes, "chain", vi[:1], vi[1:], ws),
                                 opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model(1), model(2)


def _empty_model():
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    return helper.make_model(helper.make_graph([], "empty", [vi], [vi]),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _one_op_model(sig: OpSig):
    """A one-node ONNX model computing the signature (two nodes for a fused Relu or ReLU6, as the export
    writes them: onnxruntime fuses Conv+Relu, and Conv+Clip in float32); the weight operands (``sig.weights``) are initializers, as in the exported model,
    where onnxruntime pre-packs them once (a matmul with its weight fed as an input repacks it every
    run: 3.4x slower measured for (5 x 512) x (512 x 4096)), the other operands graph inputs, and
    what ONNX wants as an attribute-like input an int64 initializer; or None."""
    from onnx import TensorProto, helper, numpy_helper

    elem = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "f64": TensorProto.DOUBLE}.get(sig.dtype)
    if elem is None or sig.kind not in _BUILDERS:
        return None
    a = dict(sig.attrs)
    ins = [f"x{j}" for j in range(len(sig.in_shapes))]
    outs = [f"y{j}" for j in range(len(sig.out_shapes))]
    act = a.get("activation", "none") if sig.kind in ("conv2d", "matmul") else "none"
    inits: list = []
    try:
        node = _BUILDERS[sig.kind](a, ins, ["pre"] if act != "none" else outs, sig, inits)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    rng = np.random.default_rng(0)
    npdt = _NP_DTYPES[sig.dtype]
    weights = [numpy_helper.from_array(rng.uniform(0.5, 1.5, size=tuple(s)).astype(npdt), n)
               for j, (n, s) in enumerate(zip(ins, sig.in_shapes)) if sig.is_weight(j)]
    nodes = node if isinstance(node, list) else [node]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["pre"], outs))
    elif act == "relu6":  # as the export writes it (onnxruntime fuses Conv + Clip too)
        weights += [numpy_helper.from_array(np.asarray(v, dtype=npdt), n) for v, n in ((0.0, "lo"), (RELU6_MAX, "hi"))]
        nodes.append(helper.make_node("Clip", ["pre", "lo", "hi"], outs))
    elif act != "none":
        return None
    graph = helper.make_graph(
        nodes, sig.kind,
        [helper.make_tensor_value_info(n, elem, list(s)) for j, (n, s) in enumerate(zip(ins, sig.in_shapes))
         if not sig.is_weight(j)],
        [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(outs, sig.out_shapes)],
        weights + [numpy_helper.from_array(np.asarray(v, dtype=np.int64), n) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _mk(op, init=None, **attr_fns):
    """A node builder: ``attr_fns`` map ONNX attribute names to functions of the taso attributes;
    ``init`` = (name, fn(attrs, sig)) appends an int64 initializer operand."""
    def build(a, ins, outs, sig, inits):
        from onnx import helper

        if init is not None:
            inits.append((init[0], init[1](a, sig)))
            ins = ins + [init[0]]
        return helper.make_node(op, ins, outs, **{k: f(a) for k, f in attr_fns.items()})
    return build


def _matmul_nodes(ins, outs, sig):
    """As the export writes a matmul: MatMul, or with a bias Gemm (2-D) or MatMul + Add."""
    from onnx import helper

    if len(ins) < 3:
        return helper.make_node("MatMul", ins, outs)
    if len(sig.in_shapes[0]) == 2 and len(sig.in_shapes[1]) == 2:
        return helper.make_node("Gemm", ins, outs)
    return [helper.make_node("MatMul", ins[:2], ["product"]), helper.make_node("Add", ["product", ins[2]], outs)]


def _ints(name, default=None):
    return lambda a: [int(v) for v in (a[name] if default is None else a.get(name, default))]


def _enlarge_pads(a, sig):
    _, _, kh, kw = sig.in_shapes[0]
    dh, dw = (a["kernel_shape"][0] - kh) // 2, (a["kernel_shape"][1] - kw) // 2
    return [0, 0, dh, dw, 0, 0, dh, dw]


_WINDOW = dict(kernel_shape=_ints("kernel_shape"), strides=_ints("strides", (1, 1)), pads=_ints("pads", (0, 0, 0, 0)))

# the spec's ONNX mapping, one builder per taso op kind
_BUILDERS = {
    "conv2d": _mk("Conv", strides=_ints("strides", (1, 1)), pads=_ints("pads", (0, 0, 0, 0)),
                  dilations=_ints("dilations", (1, 1)), group=lambda a: int(a.get("group", 1))),
    "matmul": lambda a, ins, outs, sig, inits: _matmul_nodes(ins, outs, sig),
    "ewadd": _mk("Add"),
    "ewmul": _mk("Mul"),
    "smul": _mk("Mul"),
    "relu": _mk("Relu"),
    "sigmoid": _mk("Sigmoid"),
    "tanh": _mk("Tanh"),
    "transpose": _mk("Transpose", perm=_ints("perm")),
    "reshape": _mk("Reshape", init=("shape", lambda a, sig: list(sig.out_shapes[0]))),
    "concat": _mk("Concat", axis=lambda a: int(a["axis"])),
    "split": _mk("Split", init=("sizes", lambda a, sig: list(a["sizes"])), axis=lambda a: int(a["axis"])),
    "maxpool2d": _mk("MaxPool", **_WINDOW),
    "avgpool2d": _mk("AveragePool", **_WINDOW, count_include_pad=lambda a: int(a.get("count_include_pad", 0))),
    "batchnorm": _mk("BatchNormalization", epsilon=lambda a: float(a.get("epsilon", 1e-5))),
    "enlarge": _mk("Pad", init=("pads", _enlarge_pads)),
}


# ---------------------------------------------------------------------------------------------


#: the environment variable naming the target where a pass is given none (else ``auto``)
TARGET_ENV = "TASO_TARGET"


def target_of(opts: dict) -> str:
    """The target a pass optimizes for, from its options: ``target`` (or its older name ``cost-model``;
    both given must agree), else the ``TASO_TARGET`` environment variable, else ``auto``."""
    t, cm = (opts.get("target") or "").strip(), (opts.get("cost-model") or "").strip()
    if t and cm and t.lower() != cm.lower():
        raise TasoError(f"target={t} and cost-model={cm} disagree (cost-model is the older name of target: "
                        "give one)")
    return t or cm or os.environ.get(TARGET_ENV, "").strip() or "auto"


def machine_target() -> str:
    """What ``auto`` means here: the machine this process runs on, measured. That is the CPU through
    onnxruntime, with the whole-result latency check, where there is a GPU too: measuring on the GPU
    (``cuda``) is asked for by name, as the exported model's runtime is not known from here."""
    return "cpu"


def is_measured(cm: "CostModel") -> bool:
    return not isinstance(unwrap(cm), Analytic)


def describe(cm: "CostModel") -> str:
    """What a cost model's numbers are, for people: measured where, or estimated by which model."""
    cm = unwrap(cm)
    if hasattr(cm, "describe"):  # a roofline (Analytic.describe), a measured table or a GPU measured in process
        return cm.describe()
    return f"measured on this machine's CPU ({cpu_name()}) in onnxruntime, {cm.threads} thread(s)"


#: functions applied, in order, to every cost model ``get_cost_model`` makes (``wrapping_cost_models``)
_WRAPPERS: list = []


@contextlib.contextmanager
def wrapping_cost_models(wrap):
    """Within the block, every cost model ``get_cost_model`` returns is ``wrap(model)`` (a ``CostModel``
    that delegates to ``model``, with the attribute ``inner`` naming it). For tools that observe a search
    from inside its process, such as the signature dump (``passes/cost/calibration.py``); not a target."""
    _WRAPPERS.append(wrap)
    try:
        yield
    finally:
        _WRAPPERS.remove(wrap)


def unwrap(cm: "CostModel") -> "CostModel":
    """The cost model under any wrappers (``wrapping_cost_models``)."""
    while getattr(cm, "inner", None) is not None:
        cm = cm.inner
    return cm


def get_cost_model(spec: str = "analytic") -> CostModel:
    """``auto`` (the machine this runs on, measured: ``machine_target``), ``analytic`` (= ``analytic:t4``),
    ``analytic:<cpu|t4|v100|a100|h100|h200>`` (a GPU's fitted to its measured table where one exists),
    ``analytic:<gpu>:datasheet`` (the hand-set profile), ``cpu`` (measured, 1 thread), ``cpu:<threads>``,
    ``cuda:<gpu>`` (a table measured on that GPU, where one exists), ``cuda`` (measured on this process's GPU)."""
    cm = _make_cost_model(spec)
    for wrap in list(_WRAPPERS):
        cm = wrap(cm)
    return cm


def _make_cost_model(spec: str) -> CostModel:
    s = (spec or "analytic").strip().lower()
    valid = (f"auto, analytic, analytic:<{'|'.join(sorted(PROFILES))}>, analytic:<gpu>:datasheet, cpu, "
             "cpu:<threads>, cuda, cuda:<gpu>")
    if s == "auto":
        s = machine_target()
    if s == "analytic":
        s = "analytic:t4"
    if s.startswith("analytic:"):
        dev, _, variant = s.split(":", 1)[1].partition(":")
        if dev not in PROFILES:
            raise TasoError(f"unknown cost model '{spec}': no device profile '{dev}' (valid: {valid})")
        if variant == "datasheet" and dev in GPU_PROFILES:
            cm = Analytic(PROFILES[dev])
            cm.name = f"analytic:{dev}:datasheet"
            return cm
        if variant:
            raise TasoError(f"unknown cost model '{spec}' (valid: {valid})")
        from taso_mlir.passes.cost import cuda_table

        return cuda_table.analytic(dev)
    if s == "cpu" or s.startswith("cpu:"):
        n = s.split(":", 1)[1] if ":" in s else os.environ.get("TASO_COST_CPU_THREADS", "1")
        if not n.isdigit() or int(n) < 1:
            raise TasoError(f"unknown cost model '{spec}': the thread count must be a positive integer "
                            f"(valid: {valid})")
        return CpuMeasured(threads=int(n))
    if s.startswith("cuda:") and s.split(":", 1)[1]:
        from taso_mlir.passes.cost import cuda_table

        return cuda_table.get(spec, s.split(":", 1)[1])
    if s == "cuda":
        from taso_mlir.passes.cost import cuda_measured

        return cuda_measured.get(spec)
    raise TasoError(f"unknown cost model '{spec}' (valid: {valid})")


__all__ = ["OpSig", "CostModel", "Analytic", "CpuMeasured", "Profile", "PROFILES", "GPU_PROFILES", "cpu_profile",
           "get_cost_model", "wrapping_cost_models", "unwrap", "target_of", "machine_target", "is_measured",
           "describe", "TARGET_ENV", "flops", "nbytes", "cache_dir", "DiskCache"]
