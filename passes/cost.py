"""Cost oracles: ``cost(op signature) -> milliseconds``.

Backends (``get_cost_model(spec)``):

- ``analytic[:<device>]`` (default ``analytic`` = ``analytic:t4``, the GPU of TENSAT's evaluation):
  a roofline over a device profile. Time of one kernel = launch overhead + max(flops / (peak x
  compute efficiency), bytes / bandwidth) + a latency term ``sat_bytes / bandwidth`` that models
  the bandwidth a small kernel cannot reach (Little's law: a kernel needs about ``sat_bytes`` in
  flight to saturate memory). Compute efficiency grows with the work (``flops / (flops +
  sat_flops)``), lower for grouped convolutions. Data movement (concat, split, transpose of
  activations) costs its bytes moved; reshape is a view (no kernel). Ops that compute only from
  weights and constants cost 0: they are folded into weights before export.
- ``cpu``: each signature timed in onnxruntime (one-node model, ORT_ENABLE_ALL, one thread by
  default, warm-up then the median of timed repeats), cached on disk per device. Signatures it
  cannot build (generic ops) fall back to the ``analytic:cpu`` estimate and are counted in
  ``estimated``.
- ``cuda``: its own issue; asking for it is an error until it lands.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

from taso_mlir.dialect.errors import TasoError


@dataclass(frozen=True)
class OpSig:
    kind: str  # taso op name without prefix, or "onnx.<OpType>" / another op name for generic ops
    attrs: tuple  # sorted (name, value) pairs, list values as tuples
    in_shapes: tuple  # operand shapes
    out_shapes: tuple  # result shapes
    dtype: str = "f32"
    weight_only: bool = False  # every input is a weight or constant: folded before export

    def key(self) -> str:
        return json.dumps([self.kind, [list(a) for a in self.attrs], self.in_shapes, self.out_shapes, self.dtype],
                          default=list)


@dataclass(frozen=True)
class Profile:
    name: str
    peak_flops: float  # fp32 FLOP/s
    bandwidth: float  # bytes/s
    launch_s: float  # per-kernel overhead
    sat_bytes: float  # bytes in flight to saturate memory bandwidth
    sat_flops: float  # work at which a GEMM/conv reaches half its peak efficiency
    gemm_eff: float  # best fraction of peak a large GEMM/conv reaches


# Public datasheet figures (fp32, no tensor cores) and plausible kernel overheads.
PROFILES = {
    # NVIDIA T4: 8.1 TFLOP/s fp32, 320 GB/s GDDR6 (T4 datasheet)
    "t4": Profile("t4", 8.1e12, 320e9, 5e-6, 256e3, 2e8, 0.75),
    # NVIDIA V100 SXM2: 15.7 TFLOP/s fp32, 900 GB/s HBM2 (V100 datasheet)
    "v100": Profile("v100", 15.7e12, 900e9, 5e-6, 512e3, 4e8, 0.8),
    # NVIDIA A100 40GB SXM: 19.5 TFLOP/s fp32, 1,555 GB/s HBM2 (A100 datasheet)
    "a100": Profile("a100", 19.5e12, 1555e9, 4e-6, 1e6, 5e8, 0.8),
    # NVIDIA H100 SXM5: 67 TFLOP/s fp32, 3.35 TB/s HBM3 (H100 datasheet)
    "h100": Profile("h100", 67e12, 3350e9, 4e-6, 2e6, 1.5e9, 0.7),
    # a 2-core AVX2/FMA server slice: 2 cores x 2 FMA units x 8 lanes x 2 flops x 2.5 GHz = 160 GFLOP/s;
    # ~20 GB/s of memory bandwidth for two cores; ~2 us of framework overhead per op (onnxruntime)
    "cpu": Profile("cpu", 160e9, 20e9, 2e-6, 32e3, 2e6, 0.6),
}

_ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "ui8": 1, "si8": 1, "i16": 2, "si16": 2,
               "ui16": 2, "i32": 4, "si32": 4, "ui32": 4, "i64": 8, "si64": 8, "ui64": 8}
FREE = frozenset({"weight", "const_pool", "const_iconv", "const_imatmul", "const_iewmul", "reshape"})


def _numel(s) -> int:
    return int(math.prod(s)) if s else 1


class CostModel:
    name = "?"

    def __init__(self):
        self._memo: dict = {}
        self.estimated = 0

    def cost(self, sig: OpSig) -> float:
        c = self._memo.get(sig)
        if c is None:
            c = 0.0 if sig.weight_only or sig.kind in FREE else self._cost(sig)
            self._memo[sig] = c
        return c

    def _cost(self, sig: OpSig) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


def flops(sig: OpSig) -> float:
    a = dict(sig.attrs)
    out = sum(_numel(s) for s in sig.out_shapes)
    k = sig.kind
    if k == "conv2d" and len(sig.in_shapes) >= 2 and sig.out_shapes:
        n, co, oh, ow = sig.out_shapes[0]
        _, ci_g, kh, kw = sig.in_shapes[1]
        return 2.0 * n * co * oh * ow * ci_g * kh * kw + 2.0 * out
    if k == "matmul" and len(sig.in_shapes) == 2:
        kdim = sig.in_shapes[0][-1] if sig.in_shapes[0] else 1
        return 2.0 * out * kdim + out
    if k in ("maxpool2d", "avgpool2d"):
        ks = a.get("kernel_shape", (1, 1))
        return float(out * _numel(ks))
    if k == "batchnorm":
        return 2.0 * out
    if k in ("sigmoid", "tanh"):
        return 4.0 * out
    return float(out)


class Analytic(CostModel):
    def __init__(self, profile: Profile):
        super().__init__()
        self.p = profile
        self.name = f"analytic:{profile.name}"

    def _cost(self, sig: OpSig) -> float:
        p = self.p
        eb = _ELEM_BYTES.get(sig.dtype, 4)
        nbytes = eb * (sum(_numel(s) for s in sig.in_shapes) + sum(_numel(s) for s in sig.out_shapes))
        f = flops(sig)
        eff = 1.0
        if sig.kind in ("conv2d", "matmul"):
            eff = p.gemm_eff * f / (f + p.sat_flops)
            if sig.kind == "conv2d" and dict(sig.attrs).get("group", 1) != 1:
                eff *= 0.25  # grouped/depthwise convs reach a small fraction of GEMM efficiency
        t = p.launch_s + max(f / (p.peak_flops * eff), nbytes / p.bandwidth) + p.sat_bytes / p.bandwidth
        return 1e3 * t


# ---------------------------------------------------------------------------------------------
# CPU measured (onnxruntime)


def _cache_dir() -> str:
    d = os.environ.get("TASO_CACHE_DIR")
    return d or os.path.join(os.path.expanduser("~"), ".cache", "taso-mlir")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuMeasured(CostModel):
    """Per-signature onnxruntime timings, cached on disk per device."""

    def __init__(self, threads: int = 1, repeats: int = 10, warmup: int = 3):
        super().__init__()
        import onnxruntime

        self.name = "cpu"
        self.threads, self.repeats, self.warmup = threads, repeats, warmup
        self.device = f"{_cpu_name()} | onnxruntime {onnxruntime.__version__} | {threads} thread(s)"
        self.fallback = Analytic(PROFILES["cpu"])
        self.measured = 0
        self.path = os.path.join(_cache_dir(), "cpu-costs.json")
        self._disk: dict = {}
        self._dirty = False
        try:
            with open(self.path) as f:
                data = json.load(f)
            self._disk = dict(data.get(self.device, {}))
            self._all = data
        except FileNotFoundError:
            self._all = {}
        except (OSError, ValueError) as e:
            sys.stderr.write(f"taso-mlir: warning: ignoring the unreadable cost cache {self.path} ({e})\n")
            self._all = {}

    def _cost(self, sig: OpSig) -> float:
        k = sig.key()
        if k in self._disk:
            return float(self._disk[k])
        model = _one_op_model(sig)
        if model is None:
            self.estimated += 1
            return self.fallback.cost(sig)
        ms = self._time(model, sig)
        self.measured += 1
        self._disk[k] = ms
        self._dirty = True
        return ms

    def _time(self, model, sig: OpSig) -> float:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        for _ in range(self.warmup):
            sess.run(None, feeds)
        # loops long enough to be well above the timer's resolution
        t = time.perf_counter()
        sess.run(None, feeds)
        one = max(time.perf_counter() - t, 1e-6)
        loop = max(1, min(1000, int(2e-3 / one)))
        times = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            for _ in range(loop):
                sess.run(None, feeds)
            times.append((time.perf_counter() - t) / loop)
        return 1e3 * float(np.median(times))

    def close(self) -> None:
        if not self._dirty:
            return
        self._all[self.device] = self._disk
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._all, f, sort_keys=True)
        os.replace(tmp, self.path)
        self._dirty = False


def _one_op_model(sig: OpSig):
    """A one-node (two with a fused Relu) ONNX model computing the signature, or None."""
    from onnx import TensorProto, helper, numpy_helper

    if sig.dtype != "f32" or any(s is None for s in sig.in_shapes + sig.out_shapes):
        return None
    a = dict(sig.attrs)
    k = sig.kind
    ins = [f"i{j}" for j in range(len(sig.in_shapes))]
    inits = []
    nodes = []
    act = a.get("activation") == "relu"
    out = "y0" if not act else "pre"
    if k == "conv2d":
        nodes.append(helper.make_node("Conv", ins, [out], strides=list(a["strides"]), pads=list(a["pads"]),
                                      dilations=list(a["dilations"]), group=int(a["group"])))
    elif k == "matmul":
        nodes.append(helper.make_node("MatMul", ins, [out]))
    elif k in ("ewadd", "ewmul", "smul"):
        nodes.append(helper.make_node({"ewadd": "Add"}.get(k, "Mul"), ins, [out]))
    elif k in ("relu", "sigmoid", "tanh"):
        nodes.append(helper.make_node(k.capitalize(), ins, [out]))
    elif k == "transpose":
        nodes.append(helper.make_node("Transpose", ins, [out], perm=list(a["perm"])))
    elif k == "concat":
        nodes.append(helper.make_node("Concat", ins, [out], axis=int(a["axis"])))
    elif k == "split":
        inits.append(numpy_helper.from_array(np.array(a["sizes"], dtype=np.int64), "sizes"))
        outs = [f"y{j}" for j in range(len(sig.out_shapes))]
        nodes.append(helper.make_node("Split", ins + ["sizes"], outs, axis=int(a["axis"])))
    elif k in ("maxpool2d", "avgpool2d"):
        kw = dict(kernel_shape=list(a["kernel_shape"]), strides=list(a["strides"]), pads=list(a["pads"]))
        if k == "avgpool2d":
            kw["count_include_pad"] = int(a.get("count_include_pad", 0))
        nodes.append(helper.make_node("MaxPool" if k == "maxpool2d" else "AveragePool", ins, [out], **kw))
    elif k == "batchnorm":
        nodes.append(helper.make_node("BatchNormalization", ins, [out], epsilon=float(a.get("epsilon", 1e-5))))
    else:
        return None
    if act:
        nodes.append(helper.make_node("Relu", ["pre"], ["y0"]))
    n_out = len(sig.out_shapes)
    graph = helper.make_graph(
        nodes, "op", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(ins, sig.in_shapes)],
        [helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, list(sig.out_shapes[j])) for j in range(n_out)],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def get_cost_model(spec: str = "analytic") -> CostModel:
    spec = (spec or "analytic").strip().lower()
    if spec == "analytic":
        spec = "analytic:t4"
    if spec.startswith("analytic:"):
        dev = spec.split(":", 1)[1]
        if dev not in PROFILES:
            raise TasoError(f"cost-model '{spec}': no device profile '{dev}' (profiles: {', '.join(PROFILES)})")
        return Analytic(PROFILES[dev])
    if spec == "cpu":
        return CpuMeasured()
    if spec == "cuda" or spec.startswith("cuda:"):
        raise TasoError(f"cost-model '{spec}': the CUDA-measured cost model is not available in this build "
                        "(it is its own issue); use analytic:<gpu> (t4, v100, a100, h100) or cpu")
    raise TasoError(f"unknown cost-model '{spec}' (valid: analytic, analytic:<cpu|t4|v100|a100|h100>, cpu, cuda)")


__all__ = ["OpSig", "CostModel", "Profile", "PROFILES", "get_cost_model", "flops"]
