"""The analytic cost model: op signatures (``OpSig``; as JSON records, ``sig_record``), device profiles
(``PROFILES``) and the roofline over them (``Analytic``), with the ``CostModel`` base every backend shares.
``oracle.py`` has the measured backends and ``get_cost_model``; ``cuda_table.py`` the measured GPU tables,
``cuda_measured.py`` the GPU measured in process (see ``oracle``'s docstring for the model)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OpSig:
    """What an op's cost depends on: kind, attributes, operand/result shapes, dtype."""

    kind: str  # taso op name without prefix ("conv2d"), or a generic op as "onnx.<OpType>"
    attrs: tuple  # sorted (name, value) pairs, list values as tuples
    in_shapes: tuple  # operand shapes (tuples of ints)
    out_shapes: tuple  # result shapes
    dtype: str = "f32"  # MLIR element type spelling
    weight_only: bool = False  # every input is a weight or constant: folded before export, costs 0
    # per operand: a weight or constant (an initializer of the exported model, which onnxruntime can
    # pre-pack); () where not known (all treated as activations)
    weights: tuple = ()

    def key(self) -> str:
        """The canonical string of the signature (the disk cache's key); ``weight_only`` is not part
        of it (such ops are never timed), the weight operands are where there are any."""
        parts = [self.kind, [[k, v] for k, v in self.attrs], self.in_shapes, self.out_shapes, self.dtype]
        if any(self.weights):
            parts.append([int(bool(w)) for w in self.weights])
        return json.dumps(parts, separators=(",", ":"), default=str)

    def is_weight(self, j: int) -> bool:
        return j < len(self.weights) and bool(self.weights[j])


def sig_record(sig: OpSig) -> dict:
    """A signature as a JSON object (``sig_from_record`` reads it back)."""
    return {"key": sig.key(), "kind": sig.kind, "attrs": [[k, _jsonable(v)] for k, v in sig.attrs],
            "in_shapes": [list(s) for s in sig.in_shapes], "out_shapes": [list(s) for s in sig.out_shapes],
            "dtype": sig.dtype, "weights": [int(bool(w)) for w in sig.weights]}


def sig_from_record(r: dict) -> OpSig:
    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    return OpSig(r["kind"], tuple((k, tup(v)) for k, v in r["attrs"]), tuple(tuple(s) for s in r["in_shapes"]),
                 tuple(tuple(s) for s in r["out_shapes"]), r.get("dtype", "f32"), False,
                 tuple(bool(w) for w in r.get("weights", ())))


def _jsonable(v):
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)  # (as OpSig.key writes it)


@dataclass(frozen=True)
class Profile:
    """A device for the analytic roofline."""

    name: str
    peak_flops: float  # FLOP/s, fp32 (an FMA counts 2), no tensor cores / TF32
    peak_flops_16: float  # FLOP/s for f16/bf16 convs and matmuls (tensor cores where the device has them)
    bandwidth: float  # bytes/s, datasheet DRAM bandwidth
    mem_eff: float  # fraction of ``bandwidth`` a streaming kernel reaches
    cache_bytes: float  # the first this many bytes an op touches stream from cache (0: DRAM only)
    cache_bw: float  # bytes/s from that cache
    launch_s: float  # per-kernel overhead (launch + the runtime's per-node dispatch)
    dispatch_s: float  # per-node overhead of an op that launches no kernel (a reshape view)
    slots: int  # GEMM output tiles the device runs at once (SMs on a GPU, cores on a CPU)
    tile: int  # largest GEMM output tile edge (tile x tile outputs per slot; /2 and /4 are tried too)
    gemm_eff: float  # fraction of peak a large dense GEMM/conv reaches (with the largest tile)
    slot_bw_share: float  # DRAM bandwidth one busy slot (SM) draws, in fair shares (0: not modelled)
    grouped_eff: float  # extra factor for grouped/depthwise convs (narrow per-group GEMMs)


# GPU figures: NVIDIA datasheets (fp32 CUDA-core peak at boost clock, DRAM bandwidth, SM count).
# The rest are assumptions, the same for every GPU:
# - launch: a CUDA kernel launch plus the runtime's per-node work, about 5 us (host-bound); a view
#   (no kernel) 1 us of dispatch;
# - memory from DRAM only (an activation may still sit in L2, but small kernels are launch-bound
#   anyway), 80% of the datasheet bandwidth reached by a streaming kernel;
# - cuDNN/cuBLAS fp32 kernels reach about 3/4 of peak on large problems with 128x128 output tiles
#   (64 and 32 are tried too); grouped/depthwise convs half that (narrow per-group GEMMs);
# - one busy SM draws about 2x its fair share of DRAM bandwidth (loads in flight per SM are
#   limited), so a GEMM needs about half the SMs busy to saturate memory.
PROFILES = {
    # NVIDIA T4 (datasheet): 8.1 TFLOP/s fp32, 65 TFLOP/s fp16 tensor, 320 GB/s GDDR6, 40 SMs
    "t4": Profile("t4", 8.1e12, 65e12, 320e9, 0.8, 0, 0, 5e-6, 1e-6, 40, 128, 0.75, 2, 0.5),
    # NVIDIA V100 SXM2 (datasheet): 15.7 TFLOP/s fp32, 125 TFLOP/s fp16 tensor, 900 GB/s HBM2, 80 SMs
    "v100": Profile("v100", 15.7e12, 125e12, 900e9, 0.8, 0, 0, 5e-6, 1e-6, 80, 128, 0.75, 2, 0.5),
    # NVIDIA A100 40GB SXM (datasheet): 19.5 TFLOP/s fp32, 312 TFLOP/s fp16 tensor, 1,555 GB/s HBM2, 108 SMs
    "a100": Profile("a100", 19.5e12, 312e12, 1555e9, 0.8, 0, 0, 5e-6, 1e-6, 108, 128, 0.75, 2, 0.5),
    # NVIDIA H100 SXM5 (datasheet): 67 TFLOP/s fp32, 989 TFLOP/s fp16 tensor (dense), 3.35 TB/s HBM3, 132 SMs
    "h100": Profile("h100", 67e12, 989e12, 3350e9, 0.8, 0, 0, 5e-6, 1e-6, 132, 128, 0.75, 2, 0.5),
    # NVIDIA H200 SXM (datasheet): the H100's compute (67 TFLOP/s fp32, 989 TFLOP/s fp16 tensor, dense, 132 SMs)
    # with 4.8 TB/s HBM3e
    "h200": Profile("h200", 67e12, 989e12, 4800e9, 0.8, 0, 0, 5e-6, 1e-6, 132, 128, 0.75, 2, 0.5),
}
#: the GPUs among ``PROFILES`` (their ``analytic:<gpu>`` is fitted to a measured ``cuda:<gpu>`` table where one
#: exists: ``cuda_table.analytic``)
GPU_PROFILES = ("t4", "v100", "a100", "h100", "h200")


def cpu_profile(cores: int = 2) -> Profile:
    """A generic AVX2/FMA server, ``cores`` cores. Per core: 2 FMA units x 8 fp32 lanes x 2 flops
    x 2.5 GHz (all-core AVX2 clock) = 80 GFLOP/s; no faster for f16. Memory: the first 2 MB an op
    touches a core (L2 + its share of L3, where mid-size activations live between ops) at 50 GB/s,
    the rest from DRAM at 12 GB/s a core (what one core streams), 80% reached. Per-op overhead
    ~1 us (onnxruntime's per-node dispatch; a view 0.3 us). MLAS sgemm reaches ~70% of peak on
    large GEMMs. (Measured on a 2-core AMD EPYC VM with onnxruntime 1.31, 1 thread: ~230 GFLOP/s
    on a 512^3 MatMul, ~100 GB/s on a 4 MB Add, ~0.3 us per node: a modern core beats this
    generic one; ``cpu`` measures the real machine.)"""
    cores = max(1, int(cores))
    return Profile("cpu" if cores == 2 else f"cpu{cores}", 80e9 * cores, 80e9 * cores, 12e9 * cores, 0.8,
                   2e6 * cores, 50e9 * cores, 1e-6, 3e-7, cores, 128, 0.7, 0, 0.5)


PROFILES["cpu"] = cpu_profile(2)

_ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "ui8": 1, "si8": 1, "i16": 2,
               "si16": 2, "ui16": 2, "i32": 4, "si32": 4, "ui32": 4, "i64": 8, "si64": 8, "ui64": 8}
#: ops with no run-time cost: weights and constants exist only until export folds them
FREE_KINDS = frozenset({"weight", "const_pool", "const_iconv", "const_imatmul", "const_iewmul"})
#: generic ops that are views or no-ops in onnxruntime (no bytes moved): one node dispatch
_GENERIC_VIEWS = frozenset({"onnx.Reshape", "onnx.Flatten", "onnx.Squeeze", "onnx.Unsqueeze", "onnx.Identity"})
_MOVES = frozenset({"concat", "split", "transpose", "enlarge"})


def _numel(s) -> int:
    return int(math.prod(s)) if s else 1


def _elem_bytes(dtype: str) -> int:
    return _ELEM_BYTES.get(dtype, 4)


def nbytes(sig: OpSig) -> int:
    """Bytes read and written: every operand and result once."""
    return _elem_bytes(sig.dtype) * (sum(_numel(s) for s in sig.in_shapes) + sum(_numel(s) for s in sig.out_shapes))


def flops(sig: OpSig) -> float:
    """Arithmetic of one op (an FMA counts 2): conv 2*N*K*OH*OW*(C/g)*KH*KW plus the bias and
    activation per output, matmul 2*batch*M*N*K (+ activation), pools outputs x window,
    elementwise one per output; data movement 0."""
    a = dict(sig.attrs)
    k = sig.kind
    out = sum(_numel(s) for s in sig.out_shapes)
    epi = out * ((len(sig.in_shapes) > 2) + (a.get("activation", "none") != "none"))
    g = _gemm(sig)
    if g is not None:
        b, m, n, kk = g
        return 2.0 * b * m * n * kk + epi
    if k in ("maxpool2d", "avgpool2d"):
        return float(out * _numel(a.get("kernel_shape", (1, 1))))
    if k == "batchnorm":
        return 2.0 * out
    if k in _MOVES or k in FREE_KINDS or k == "reshape" or "." in k:
        return 0.0
    return float(out)


def _gemm(sig: OpSig):
    """(batch, M, N, K) of a conv2d (implicit GEMM, batch = groups) or matmul, or None."""
    try:
        if sig.kind == "conv2d":
            w = sig.in_shapes[1]
            n, o, oh, ow = sig.out_shapes[0]
            g = max(1, int(dict(sig.attrs).get("group", 1)))
            return g, n * oh * ow, o // g, w[1] * w[2] * w[3]
        if sig.kind == "matmul":
            x, y = sig.in_shapes[0], sig.in_shapes[1]
            out = sig.out_shapes[0]
            b, m, n, kk = _numel(out[:-2]), out[-2], out[-1], x[-1]
            if _numel(y[:-2]) == 1:  # a shared right operand: the batch folds into M (one GEMM)
                b, m = 1, b * m
            return b, m, n, kk
    except (IndexError, ValueError, TypeError):
        return None
    return None


class CostModel:
    """Base class: ``cost(sig)`` in milliseconds (>= 0), memoized; ``close()`` flushes caches."""

    name = "?"

    def __init__(self):
        self._memo: dict = {}
        self.estimated = 0  # signatures estimated analytically by a measured backend

    def cost(self, sig: OpSig) -> float:
        try:
            c = self._memo.get(sig)
        except TypeError:  # an unhashable attribute value: not memoized
            return self._free_or(sig)
        if c is None:
            c = self._memo[sig] = self._free_or(sig)
        return c

    def _free_or(self, sig: OpSig) -> float:
        if sig.weight_only or sig.kind in FREE_KINDS or ("." in sig.kind and not sig.in_shapes):
            return 0.0  # folded before export; a generic op without operands is a constant/placeholder
        return max(0.0, float(self._cost(sig)))

    def _cost(self, sig: OpSig) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Analytic(CostModel):
    """The roofline over a ``Profile`` (see the module docstring)."""

    def __init__(self, profile: Profile):
        super().__init__()
        self.p = profile
        self.name = f"analytic:{profile.name}"

    def describe(self) -> str:
        """What its numbers are, for people (``oracle.describe``)."""
        dev = self.p.name
        what = f"an NVIDIA {dev.upper()}" if dev in GPU_PROFILES else f"a {dev} profile"
        return f"estimated by the analytic roofline of {what}" + (" (hand-set datasheet profile)"
                                                                   if self.name.endswith(":datasheet") else "")

    def _cost(self, sig: OpSig) -> float:
        p = self.p
        k = sig.kind
        if k == "reshape" or k in _GENERIC_VIEWS:
            # a view: onnxruntime's Reshape aliases its input and cuDNN-style backends launch nothing;
            # the node is still dispatched
            return 1e3 * p.dispatch_s
        b = nbytes(sig)
        cached = min(b, p.cache_bytes)
        mem = (b - cached) / (p.bandwidth * p.mem_eff) + (cached / p.cache_bw if cached else 0.0)
        g = _gemm(sig)
        if g is not None:
            return 1e3 * (p.launch_s + self._gemm_time(sig, mem, *g))
        if k in _MOVES or "." in k:
            compute = 0.0  # data movement and generic ops: memory-bound
        else:
            # elementwise, pools, batchnorm: max/add/compare are one op a lane-cycle, half the FMA rate
            compute = flops(sig) / (0.5 * p.peak_flops)
        return 1e3 * (p.launch_s + max(compute, mem))

    def _gemm_time(self, sig: OpSig, mem: float, b: int, m: int, n: int, kk: int) -> float:
        """max(compute, memory) of a GEMM, the best over square output tiles of edge ``tile``, /2, /4 (a
        library picks its kernel): smaller tiles fill more slots but reuse less (efficiency T/(T+16),
        relative to the largest)."""
        if min(b, m, n, kk) <= 0:
            return mem
        p = self.p
        peak = p.peak_flops_16 if sig.dtype in ("f16", "bf16") else p.peak_flops
        eff = p.gemm_eff * (p.grouped_eff if sig.kind == "conv2d" and b > 1 else 1.0)
        epi = (flops(sig) - 2.0 * b * m * n * kk) / (0.5 * p.peak_flops)  # bias, activation: fused epilogue
        best = math.inf
        for t in (p.tile, p.tile // 2, p.tile // 4):
            tm, tn = min(t, m), min(t, n)
            tiles = b * math.ceil(m / tm) * math.ceil(n / tn)
            # waves of ``slots`` tiles: at least one whole wave, and half a wave idle at the tail on average
            waves = max(1.0, tiles / p.slots + 0.5)
            tile_eff = (t / (t + 16.0)) / (p.tile / (p.tile + 16.0))
            compute = waves * p.slots * 2.0 * tm * tn * kk / (peak * eff * tile_eff) + epi
            # the busy fraction of the slots also bounds the bandwidth: one busy slot draws
            # ``slot_bw_share`` x its fair share (0: not modelled)
            busy = tiles / (waves * p.slots)
            share = min(1.0, p.slot_bw_share * busy) if p.slot_bw_share else 1.0
            best = min(best, max(compute, mem / share))
        return best
