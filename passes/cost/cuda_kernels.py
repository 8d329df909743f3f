"""The GPU kernel layer: op signatures planned, run and timed on an NVIDIA GPU, or rehearsed with numpy (issue 24).

One module serves three users: ``cost-model=cuda`` (``cuda_measured.py``: each signature the search prices,
measured in the searching process), the calibration that writes the shipped ``cuda:<gpu>`` tables
(``benchmarks/gpu/calibrate.py``) and the whole-graph executor of the GPU speedups (``benchmarks/gpu/execute.py``).
It imports only the standard library and numpy at the top, and torch, cuda-python and CuPy inside the CUDA
backend, never taso_mlir: on the GPU machine, where taso_mlir is not installed, the scripts load it by its path.

A signature is a record (``roofline.sig_record``: ``kind``, ``attrs`` as [name, value] pairs, ``in_shapes``,
``out_shapes``, ``dtype``). ``plan(rec)`` maps it to a backend-neutral ``Plan`` (``Unsupported`` where there is no
kernel); a backend's ``prepare(rec, plan)`` allocates inputs and outputs and builds the kernels (``Prepared``),
its ``time(prepared, warmup, repeats, cap_s)`` times the runs; ``measure`` does the three for one signature.

Method (TASO's): per signature, inputs drawn uniformly from [0.5, 1.5) (never zeros), 8 warm-up runs, then 32
timed runs, each between two device events, behind a spin kernel that keeps the GPU busy while the host
enqueues them all (so the times are the device's, back to back, without Python's launch overhead); the median
and the quartiles are kept. The inputs stay the same over the repeats (cache-warm, as in TASO). A signature
whose runs would exceed ``cap_s`` gets fewer repeats (at least 5). float32 is strict FP32 (TF32 off in
cuBLAS and cuDNN) unless ``tf32``.

Kernels, per taso op kind (``plan``, ``CudaDevice.build_kernel``): conv2d through cuDNN
(``torch.nn.functional.conv2d`` with ``torch.backends.cudnn.benchmark = True``, which times cuDNN's algorithms
once per shape and keeps the fastest; a fused ReLU through cuDNN's conv+bias+ReLU,
``torch.cudnn_convolution_relu``, where it runs), matmul through cuBLAS/cuBLASLt (``torch.addmm``/``torch.mm``
on the flattened rows where the right operand is 2-D, with a bias and ReLU epilogue through
``torch._addmm_activation`` where it runs; ``torch.matmul`` for batched right operands), pooling through
torch's CUDA pooling kernels, elementwise ops (add, mul, sub, div, scalar mul, relu, sigmoid, tanh, erf,
batchnorm) and data movement (transpose, one-launch concat and split, enlarge's zero padding) as
NVRTC-compiled kernels of this file (``KERNELS``), compiled through ``cuda.core`` (else CuPy's NVRTC, else
torch's own kernels: ``CudaDevice.paths()`` says which ran). Views (reshape, flatten, squeeze, unsqueeze)
launch nothing and cost 0. Generic ops carry no attributes in their signatures, so softmax and layer norm
are taken over the last axis, a generic MaxPool's window is inferred from its shapes, and Cast and Gather
are timed as copies of their result: such plans are ``approx``. Any other kind is ``Unsupported``.

Backends: ``CudaBackend`` (the GPU, through ``CudaDevice``, which the executor shares) and ``DryBackend``
(numpy references on the CPU, a wall clock: the rehearsal of everything but the kernel calls; its numbers are
not GPU timings).
"""

from __future__ import annotations

import math
import platform
import subprocess
import time

import numpy as np


class Unsupported(Exception):
    """No kernel for this signature (counted as unsupported, not as a failure)."""


# ---------------------------------------------------------------------------------------------------------
# plans


def _numel(s) -> int:
    return int(math.prod(s)) if s else 1


class Plan:
    """What to run for a signature, backend-neutral: ``op`` and its parameters ``p``."""

    def __init__(self, op: str, approx: bool = False, **p):
        self.op, self.approx, self.p = op, approx, p

    def __repr__(self):
        return f"Plan({self.op}, {self.p})"


_UNARY = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "onnx.Relu": "relu", "onnx.Sigmoid": "sigmoid",
          "onnx.Tanh": "tanh", "onnx.Erf": "erf", "onnx.Sqrt": "sqrt", "onnx.Exp": "exp", "onnx.Neg": "neg"}
_BINARY = {"ewadd": "add", "ewmul": "mul", "onnx.Add": "add", "onnx.Mul": "mul", "onnx.Sub": "sub",
           "onnx.Div": "div"}
_VIEWS = {"reshape", "onnx.Reshape", "onnx.Flatten", "onnx.Squeeze", "onnx.Unsqueeze", "onnx.Identity"}
_FLOAT = {"f32", "f16", "bf16"}


def plan(rec: dict) -> Plan:
    """The kernel plan of a signature record; ``Unsupported`` where there is none."""
    k = rec["kind"]
    a = {n: v for n, v in rec["attrs"]}
    ins, outs = rec["in_shapes"], rec["out_shapes"]
    if k in _VIEWS:
        return Plan("view")
    if rec["dtype"] not in _FLOAT:
        raise Unsupported(f"{k} in {rec['dtype']}: only float kernels are measured")
    if k == "conv2d":
        return Plan("conv2d", strides=tuple(a.get("strides", (1, 1))), pads=tuple(a.get("pads", (0, 0, 0, 0))),
                    dilations=tuple(a.get("dilations", (1, 1))), group=int(a.get("group", 1)),
                    act=a.get("activation", "none"), bias=len(ins) > 2)
    if k == "matmul":
        return Plan("matmul", act=a.get("activation", "none"), bias=len(ins) > 2)
    if k in _BINARY:
        return Plan("binary", fn=_BINARY[k])
    if k == "smul":
        return Plan("binary", fn="mul")
    if k in _UNARY:
        return Plan("unary", fn=_UNARY[k])
    if k == "batchnorm":
        return Plan("batchnorm", eps=float(a.get("epsilon", 1e-5)))
    if k == "transpose":
        return Plan("transpose", perm=tuple(a["perm"]))
    if k == "concat":
        return Plan("concat", axis=int(a["axis"]))
    if k == "split":
        return Plan("split", axis=int(a["axis"]), sizes=tuple(a["sizes"]))
    if k in ("maxpool2d", "avgpool2d"):
        return Plan("pool", mode=k[:3], kernel=tuple(a["kernel_shape"]), strides=tuple(a.get("strides", (1, 1))),
                    pads=tuple(a.get("pads", (0, 0, 0, 0))), count_include_pad=int(a.get("count_include_pad", 0)))
    if k == "enlarge":
        _, _, kh, kw = ins[0]
        dh, dw = (a["kernel_shape"][0] - kh) // 2, (a["kernel_shape"][1] - kw) // 2
        return Plan("pad2d", top=dh, left=dw)
    # generic ops: their signatures carry no attributes
    if k == "onnx.Softmax":
        return Plan("softmax", approx=True)
    if k == "onnx.LayerNormalization":
        return Plan("layernorm", approx=True, eps=1e-5, affine=len(ins) >= 2, bias=len(ins) >= 3)
    if k == "onnx.GlobalAveragePool":
        return Plan("gavgpool")
    if k in ("onnx.MaxPool", "onnx.AveragePool"):
        if len(ins[0]) != 4:
            raise Unsupported(f"{k} of rank {len(ins[0])}")
        (_, _, h, w), (_, _, oh, ow) = ins[0], outs[0]
        sh, sw = max(1, h // max(oh, 1)), max(1, w // max(ow, 1))
        kh, kw = h - (oh - 1) * sh, w - (ow - 1) * sw
        if kh < 1 or kw < 1:
            raise Unsupported(f"{k}: no window maps {ins[0]} to {outs[0]}")
        return Plan("pool", approx=True, mode="max" if k == "onnx.MaxPool" else "avg", kernel=(kh, kw),
                    strides=(sh, sw), pads=(0, 0, 0, 0), count_include_pad=0)
    if k in ("onnx.Cast", "onnx.Gather"):
        if _numel(outs[0]) > _numel(ins[0]):  # (a gather that repeats rows: a copy would read past its input)
            raise Unsupported(f"{k} writing more than its first input holds ({outs[0]} from {ins[0]})")
        return Plan("copy", approx=True)
    if k == "onnx.Clip" and all(not s for s in ins[1:]):  # (scalar bounds: one elementwise pass, like relu)
        return Plan("unary", approx=True, fn=_UNARY["relu"])
    raise Unsupported(f"no kernel for {k}")


# ---------------------------------------------------------------------------------------------------------
# numpy references (the dry backend's kernels, and the checks of the GPU's results)


def _windows(x, kernel, strides, pads, dilations, value):
    """(N, C, OH, OW, kh, kw) windows of an NCHW array padded [top, left, bottom, right] with ``value``."""
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=value)
    eh, ew = dilations[0] * (kernel[0] - 1) + 1, dilations[1] * (kernel[1] - 1) + 1
    v = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))
    return v[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]


_NP_UNARY = {"relu": lambda v: np.maximum(v, 0), "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh,
             "sqrt": np.sqrt, "exp": np.exp, "neg": np.negative,
             "erf": lambda v: _erf(v)}
_NP_BINARY = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "div": np.divide}


def _erf(v):
    """erf elementwise, in v's precision: math.erf for small arrays, else Abramowitz and Stegun's 7.1.26
    (absolute error under 1.5e-7, below float32's resolution of erf's values)."""
    v = np.asarray(v)
    if v.size <= 4096:
        return np.vectorize(math.erf, otypes=[np.float64])(v).astype(np.result_type(v, np.float32))
    a = np.abs(v)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) \
        * np.exp(-a * a)
    return np.sign(v) * y


def reference(pl: Plan, xs: list, out_shapes: list) -> list:
    """The plan's results computed by numpy, in the inputs' precision (float64 for the checks, float32 in
    the dry runs)."""
    p = pl.p
    if pl.op == "view":
        return [xs[0].reshape(out_shapes[0])]
    if pl.op == "select":
        return [np.take(xs[0], p["index"], axis=p["axis"])]
    if pl.op == "cast":
        return [xs[0].astype(np.dtype(p["to"]))]
    if pl.op == "gather":
        return [np.take(xs[0], xs[1].astype(np.int64), axis=p["axis"])]
    if pl.op == "conv2d":
        x, w = xs[0], xs[1]
        g = p["group"]
        win = _windows(x, w.shape[2:], p["strides"], p["pads"], p["dilations"], 0)
        n, c, oh, ow = win.shape[:4]
        cg, og = c // g, w.shape[0] // g
        y = np.empty((n, w.shape[0], oh, ow), dtype=np.result_type(x, w))
        for gi in range(g):
            y[:, gi * og:(gi + 1) * og] = np.einsum("ncxykl,ockl->noxy", win[:, gi * cg:(gi + 1) * cg],
                                                     w[gi * og:(gi + 1) * og], optimize=True)
        if p["bias"]:
            y = y + xs[2].reshape(1, -1, 1, 1)
        return [_act(y, p["act"])]
    if pl.op == "matmul":
        y = np.matmul(xs[0], xs[1])
        if p["bias"]:
            y = y + xs[2]
        return [_act(y, p["act"])]
    if pl.op == "binary":
        return [_NP_BINARY[p["fn"]](xs[0], xs[1])]
    if pl.op == "unary":
        return [_NP_UNARY[p["fn"]](xs[0])]
    if pl.op == "batchnorm":
        x, sc, bi, mu, var = xs
        shp = (1, -1) + (1,) * (x.ndim - 2)
        return [(x - mu.reshape(shp)) / np.sqrt(var.reshape(shp) + p["eps"]) * sc.reshape(shp) + bi.reshape(shp)]
    if pl.op == "transpose":
        return [np.ascontiguousarray(np.transpose(xs[0], p["perm"]))]
    if pl.op == "concat":
        return [np.concatenate(xs, axis=p["axis"])]
    if pl.op == "split":
        return [np.ascontiguousarray(t) for t in np.split(xs[0], np.cumsum(p["sizes"])[:-1], axis=p["axis"])]
    if pl.op == "pool":
        x = xs[0]
        if p.get("ceil"):  # ceil mode: the last windows may run past the (padded) input, counting nothing there
            if p["mode"] == "avg" and p["count_include_pad"]:
                raise Unsupported("average pooling in ceil mode counting the padding")
            oh, ow = out_shapes[0][2:]
            (kh, kw), (sh, sw), pads = p["kernel"], p["strides"], p["pads"]
            extra_h = max(0, (oh - 1) * sh + kh - (x.shape[2] + pads[0] + pads[2]))
            extra_w = max(0, (ow - 1) * sw + kw - (x.shape[3] + pads[1] + pads[3]))
            if extra_h or extra_w:
                fill = -np.inf if p["mode"] == "max" else np.nan
                x = np.pad(x, ((0, 0), (0, 0), (0, extra_h), (0, extra_w)), constant_values=fill)
                if p["mode"] == "avg":
                    w = _windows(x, p["kernel"], p["strides"], pads, (1, 1), np.nan)
                    return [np.nanmean(w, axis=(4, 5)).astype(x.dtype)]
        if p["mode"] == "max":
            return [_windows(x, p["kernel"], p["strides"], p["pads"], (1, 1), -np.inf).max(axis=(4, 5))]
        s = _windows(x, p["kernel"], p["strides"], p["pads"], (1, 1), 0).sum(axis=(4, 5))
        if p["count_include_pad"]:
            return [s / (p["kernel"][0] * p["kernel"][1])]
        ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
        return [s / _windows(ones, p["kernel"], p["strides"], p["pads"], (1, 1), 0).sum(axis=(4, 5))]
    if pl.op == "pad2d":
        x = xs[0]
        (_, _, oh, ow), t, l = out_shapes[0], p["top"], p["left"]
        return [np.pad(x, ((0, 0), (0, 0), (t, oh - x.shape[2] - t), (l, ow - x.shape[3] - l)))]
    if pl.op == "softmax":
        ax = p.get("axis", -1)
        e = np.exp(xs[0] - xs[0].max(axis=ax, keepdims=True))
        return [e / e.sum(axis=ax, keepdims=True)]
    if pl.op == "layernorm":
        x = xs[0]
        axes = tuple(range(p.get("axis", -1) % x.ndim, x.ndim))
        y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + p["eps"])
        if p["affine"]:
            y = y * xs[1]
        if p["bias"]:
            y = y + xs[2]
        return [y]
    if pl.op == "gavgpool":
        return [xs[0].mean(axis=(2, 3), keepdims=True)]
    if pl.op == "copy":
        return [xs[0].reshape(-1)[:_numel(out_shapes[0])].reshape(out_shapes[0])]
    if pl.op == "clip":
        return [np.clip(xs[0], -np.inf if p["lo"] is None else p["lo"], np.inf if p["hi"] is None else p["hi"])]
    if pl.op == "equal":
        return [np.equal(xs[0], xs[1])]
    if pl.op == "where":
        return [np.where(xs[0], xs[1], xs[2])]
    if pl.op == "expand":
        return [np.broadcast_to(xs[0], out_shapes[0]).copy()]
    if pl.op == "reduce_mean":
        return [xs[0].mean(axis=p["axes"], keepdims=p["keepdims"]).reshape(out_shapes[0])]
    raise Unsupported(f"no reference for {pl.op}")


def _act(y, act):
    if act == "relu":
        return np.maximum(y, 0)
    if act == "relu6":
        return np.clip(y, 0, 6)
    if act != "none":
        raise Unsupported(f"activation {act}")
    return y


def _inputs(rec: dict, rng, dtype=np.float32) -> list:
    """Inputs for a signature: uniform in [0.5, 1.5) (no zeros, no denormals); 0-d shapes stay 0-d."""
    out = []
    for s in rec["in_shapes"]:
        out.append(np.asarray(rng.uniform(0.5, 1.5, size=tuple(s)), dtype=dtype))
    return out


def rel_error(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    d = np.linalg.norm((got - want).ravel())
    n = np.linalg.norm(want.ravel())
    return float(d / n) if n else float(d)


# ---------------------------------------------------------------------------------------------------------
# backends


class Prepared:
    """A signature ready to run: ``run()`` enqueues it once; ``outputs()`` its results as numpy arrays.
    ``activations``: the operand buffers that are not weights (what a model computed just before the op)."""

    def __init__(self, run, outputs, backend: str, inputs=None, release=None, activations=()):
        self.run, self.outputs, self.backend, self.inputs = run, outputs, backend, inputs
        self.release = release or (lambda: None)
        self.activations = list(activations)


def activation_operands(rec: dict) -> list:
    """The operand positions of a signature that are not weights (``rec["weights"]``: 1 for a weight)."""
    w = rec.get("weights") or [0] * len(rec["in_shapes"])
    return [i for i in range(len(rec["in_shapes"])) if not w[i]]


class DryBackend:
    """The loop's rehearsal on the CPU: numpy kernels, a wall clock. Numbers from it are not GPU timings."""

    name = "dry"

    def __init__(self, args):
        self.rng = np.random.default_rng(0)

    def device_info(self) -> dict:
        return {"gpu": f"DRY RUN: numpy on the CPU ({platform.processor() or platform.machine()}), not a GPU "
                       "measurement", "driver": "none", "machine": platform.platform(),
                "numpy": np.__version__, "python": platform.python_version()}

    def paths(self) -> dict:
        return {"all": "numpy (dry run)"}

    def prepare(self, rec: dict, pl: Plan) -> Prepared:
        xs = _inputs(rec, self.rng)
        res = {}
        if pl.op == "view":
            return Prepared(lambda: None, lambda: [xs[0].reshape(rec["out_shapes"][0])], "view (no kernel)", xs)

        def run():
            res["y"] = reference(pl, xs, rec["out_shapes"])
        run()
        got = [tuple(y.shape) for y in res["y"]]
        want = [tuple(s) for s in rec["out_shapes"]]
        if got != want:
            raise ValueError(f"the plan {pl.op} gives shapes {got}, the signature says {want}")
        return Prepared(run, lambda: res["y"], f"numpy {pl.op}", xs, activations=[xs[i] for i in activation_operands(rec)])

    def time(self, prep: Prepared, warmup: int, repeats: int, cap_s: float) -> tuple[list, int, int]:
        t = time.perf_counter()
        prep.run()
        one = time.perf_counter() - t
        warmup, repeats = _fit_cap(one, warmup, repeats, cap_s)
        for _ in range(warmup):
            prep.run()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            prep.run()
            times.append(1e3 * (time.perf_counter() - t))
        return times, warmup, repeats

    def time_cold(self, prep: Prepared, repeats: int, warm_activations: bool = False) -> list:
        """The rehearsal of ``CudaDevice.time_cold`` (numpy has no L2 to flush: the loop, not the number; with
        ``warm_activations`` the activations are read before each run, as there)."""
        times = []
        for _ in range(repeats):
            for a in prep.activations if warm_activations else ():
                float(np.sum(a))
            t = time.perf_counter()
            prep.run()
            times.append(1e3 * (time.perf_counter() - t))
        return times

    def time_in_graph(self, prep: Prepared, copies: int, replays: int) -> list:
        """The rehearsal of ``CudaDevice.time_in_graph``: ``copies`` runs back to back per replay, wall clock,
        per run (numpy has no graphs: what it rehearses is the loop and the entry, not the number)."""
        times = []
        for _ in range(replays):
            t = time.perf_counter()
            for _ in range(copies):
                prep.run()
            times.append(1e3 * (time.perf_counter() - t) / copies)
        return times

    def close(self):
        pass


def _fit_cap(one_s: float, warmup: int, repeats: int, cap_s: float) -> tuple[int, int]:
    """Fewer runs for a signature whose warm-up and repeats would exceed ``cap_s`` (at least 1 + 5)."""
    if one_s * (warmup + repeats) <= cap_s:
        return warmup, repeats
    n = max(6, int(cap_s / max(one_s, 1e-9)))
    w = min(warmup, max(1, n // 5))
    return w, max(5, min(repeats, n - w))


# --- CUDA


KERNELS = r"""
typedef long long ll;
#define GRID_LOOP(n) for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (ll)gridDim.x * blockDim.x)
#define OP_add(x, y) ((x) + (y))
#define OP_mul(x, y) ((x) * (y))
#define OP_sub(x, y) ((x) - (y))
#define OP_div(x, y) ((x) / (y))
#define F_relu(v) fmaxf(v, 0.f)
#define F_sigmoid(v) (1.f / (1.f + expf(-(v))))
#define F_tanh(v) tanhf(v)
#define F_erf(v) erff(v)
#define F_sqrt(v) sqrtf(v)
#define F_exp(v) expf(v)
#define F_neg(v) (-(v))
#define F_copy(v) (v)
#define UNARY(f) \
  __global__ void u_##f(float* __restrict__ y, const float* __restrict__ x, ll n) { GRID_LOOP(n) y[i] = F_##f(x[i]); } \
  __global__ void u4_##f(float4* __restrict__ y, const float4* __restrict__ x, ll n4) { \
    GRID_LOOP(n4) { float4 v = x[i]; v.x = F_##f(v.x); v.y = F_##f(v.y); v.z = F_##f(v.z); v.w = F_##f(v.w); y[i] = v; } }
#define BINARY(f) \
  __global__ void b_##f(float* __restrict__ y, const float* __restrict__ a, const float* __restrict__ b, ll n) { \
    GRID_LOOP(n) y[i] = OP_##f(a[i], b[i]); } \
  __global__ void b4_##f(float4* __restrict__ y, const float4* __restrict__ a, const float4* __restrict__ b, ll n4) { \
    GRID_LOOP(n4) { float4 u = a[i], v = b[i]; \
      u.x = OP_##f(u.x, v.x); u.y = OP_##f(u.y, v.y); u.z = OP_##f(u.z, v.z); u.w = OP_##f(u.w, v.w); y[i] = u; } } \
  __global__ void bsb_##f(float* __restrict__ y, const float* __restrict__ a, const float* __restrict__ b, ll n) { \
    float s = b[0]; GRID_LOOP(n) y[i] = OP_##f(a[i], s); } \
  __global__ void bsa_##f(float* __restrict__ y, const float* __restrict__ a, const float* __restrict__ b, ll n) { \
    float s = a[0]; GRID_LOOP(n) y[i] = OP_##f(s, b[i]); } \
  __global__ void bbc_##f(float* __restrict__ y, const float* __restrict__ a, const float* __restrict__ b, ll n, \
                          int nd, const ll* __restrict__ m) { \
    GRID_LOOP(n) { ll r = i, oa = 0, ob = 0; \
      for (int d = nd - 1; d >= 0; --d) { ll q = r % m[d]; r /= m[d]; oa += q * m[nd + d]; ob += q * m[2 * nd + d]; } \
      y[i] = OP_##f(a[oa], b[ob]); } }
extern "C" {
__global__ void spin(ll cycles) { ll t0 = clock64(); while (clock64() - t0 < cycles) { } }
UNARY(relu) UNARY(sigmoid) UNARY(tanh) UNARY(erf) UNARY(sqrt) UNARY(exp) UNARY(neg) UNARY(copy)
BINARY(add) BINARY(mul) BINARY(sub) BINARY(div)
__global__ void batchnorm(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ sc,
                          const float* __restrict__ bi, const float* __restrict__ mu, const float* __restrict__ var,
                          float eps, ll n, ll C, ll inner) {
  GRID_LOOP(n) { ll c = (i / inner) % C; y[i] = (x[i] - mu[c]) * rsqrtf(var[c] + eps) * sc[c] + bi[c]; }
}
__global__ void transpose(float* __restrict__ y, const float* __restrict__ x, ll n, int nd, const ll* __restrict__ m) {
  GRID_LOOP(n) { ll r = i, off = 0;
    for (int d = nd - 1; d >= 0; --d) { ll q = r % m[d]; r /= m[d]; off += q * m[nd + d]; }
    y[i] = x[off]; }
}
__global__ void concat(float* __restrict__ y, const unsigned long long* __restrict__ ptrs, const ll* __restrict__ offs,
                       int k, ll outer, ll total) {
  GRID_LOOP(outer * total) { ll o = i / total, r = i - o * total; int j = 0;
    while (j + 1 < k && r >= offs[j + 1]) ++j;
    ll sz = offs[j + 1] - offs[j];
    y[i] = ((const float*)ptrs[j])[o * sz + r - offs[j]]; }
}
__global__ void split(const float* __restrict__ x, const unsigned long long* __restrict__ ptrs, const ll* __restrict__ offs,
                      int k, ll outer, ll total) {
  GRID_LOOP(outer * total) { ll o = i / total, r = i - o * total; int j = 0;
    while (j + 1 < k && r >= offs[j + 1]) ++j;
    ll sz = offs[j + 1] - offs[j];
    ((float*)ptrs[j])[o * sz + r - offs[j]] = x[i]; }
}
__global__ void pad2d(float* __restrict__ y, const float* __restrict__ x, ll nc, ll H, ll W, ll OH, ll OW, ll top, ll left) {
  GRID_LOOP(nc * OH * OW) { ll ow = i % OW, t = i / OW, oh = t % OH, c = t / OH, h = oh - top, w = ow - left;
    y[i] = (h >= 0 && h < H && w >= 0 && w < W) ? x[(c * H + h) * W + w] : 0.f; }
}
}
"""


def package_versions(names) -> dict:
    """The installed versions of the packages ``names`` (those not installed left out)."""
    from importlib import metadata

    out = {}
    for pkg in names:
        try:
            out[pkg] = metadata.version(pkg)
        except Exception:
            pass
    return out


def _versions() -> dict:
    return package_versions(("torch", "cupy-cuda13x", "cupy-cuda12x", "cuda-core", "cuda-bindings", "cuda-python",
                             "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12",
                             "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "numpy"))


def _nvidia_smi(fields: str) -> dict:
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
        return dict(zip(fields.split(","), vals))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}


class _Nvrtc:
    """NVRTC-compiled kernels of ``KERNELS``: through cuda.core, else CuPy. ``launch(name, n, *args)``.
    ``selftest(nv)``, where given, runs each path's first launches: a path whose launches fail falls through
    to the next (its reason in ``errors``), not only one that fails to compile."""

    def __init__(self, stream_ptr: int, sm_count: int, prefer: str = "cuda.core", cc_stream=None, selftest=None):
        self.sm = sm_count
        self._cc_stream = cc_stream
        self.errors = {}
        self.via = None
        for via in ([prefer] + [v for v in ("cuda.core", "cupy") if v != prefer]):
            try:
                getattr(self, "_init_" + via.replace(".", "_"))(stream_ptr)
                if selftest is not None:
                    selftest(self)
                self.via = via
                break
            except Exception as e:
                self.errors[via] = f"{type(e).__name__}: {e}"[:300]
        if self.via is None:
            raise RuntimeError(f"no NVRTC path: {self.errors}")

    def _init_cuda_core(self, stream_ptr):
        try:
            from cuda.core import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, Stream, launch
        dev = Device()
        dev.set_current()
        arch = getattr(dev, "arch", None) or "".join(str(v) for v in dev.compute_capability)
        prog = Program(KERNELS, "c++", ProgramOptions(arch=f"sm_{arch}", std="c++17"))
        mod = prog.compile("cubin")
        stream = self._cc_stream if self._cc_stream is not None else Stream.from_handle(stream_ptr)
        kernels = {}
        # cuda.core 0.3 and later: launch(stream, config, kernel, *args); before: launch(kernel, config, *args)
        # with the stream in the config. The old launch raises ValueError on a non-Kernel first argument, a
        # LaunchConfig without a stream field TypeError: either means the other form.
        api = []

        def call(name, grid, block, args):
            ker = kernels.get(name)
            if ker is None:
                ker = kernels[name] = mod.get_kernel(name)
            if api == ["old"]:
                launch(ker, LaunchConfig(grid=grid, block=block, stream=stream), *args)
                return
            if api == ["new"]:
                launch(stream, LaunchConfig(grid=grid, block=block), ker, *args)
                return
            try:
                launch(stream, LaunchConfig(grid=grid, block=block), ker, *args)
                api.append("new")
            except (TypeError, ValueError) as e_new:
                try:
                    launch(ker, LaunchConfig(grid=grid, block=block, stream=stream), *args)
                except Exception as e_old:
                    raise RuntimeError(f"cuda.core launch failed in both forms: launch(stream, config, kernel, "
                                       f"...): {type(e_new).__name__}: {e_new}; launch(kernel, config, ...): "
                                       f"{type(e_old).__name__}: {e_old}") from None
                api.append("old")
        self._call = call

    def _init_cupy(self, stream_ptr):
        import cupy

        mod = cupy.RawModule(code=KERNELS, options=("-std=c++17",))
        stream = cupy.cuda.ExternalStream(stream_ptr)
        fns = {}

        def call(name, grid, block, args):
            f = fns.get(name)
            if f is None:
                f = fns[name] = mod.get_function(name)
            f((grid,), (block,), args, stream=stream)
        self._call = call

    def launch(self, name: str, n: int, *args):
        block = 256
        grid = int(max(1, min((n + block - 1) // block, self.sm * 16)))
        self._call(name, grid, block, args)

    def spin(self, cycles: int):
        self._call("spin", 1, 1, (np.int64(cycles),))


def timing_event_options(EventOptions):
    """cuda.core's options for a timing event: the field is ``timing_enabled`` from cuda.core 1.0 (_event.pyi),
    ``enable_timing`` in 0.x (_event.pyx)."""
    try:
        return EventOptions(timing_enabled=True)
    except TypeError:
        return EventOptions(enable_timing=True)


def _p(t) -> np.uint64:
    return np.uint64(t.data_ptr())


class CudaDevice:
    """The GPU as both runners use it: cuDNN and cuBLAS through torch, NVRTC kernels through cuda.core (else
    CuPy, else torch's own), device events through cuda.core (else torch), all on one stream that cuda.core
    creates (shared with torch). ``build_kernel`` is the kernel layer: a ``Plan`` over a list of tensors.
    ``args``: ``tf32``, ``nvrtc`` and ``events`` as calibrate.py's options."""

    name = "cuda"

    def __init__(self, args):
        import torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        torch.cuda.init()
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.allow_tf32 = bool(args.tf32)
        self.dev = torch.device("cuda")
        self.props = torch.cuda.get_device_properties(0)
        self._paths = {"cudnn": f"torch {torch.__version__} (cudnn {torch.backends.cudnn.version()}, benchmark mode)",
                       "cublas": f"torch {torch.__version__}", "pooling": "torch's CUDA pooling kernels",
                       "math": "TF32 allowed" if args.tf32 else "strict FP32 (TF32 off)"}
        self.errors = {}
        self._bad = set()  # (optional kernel path, shapes) that failed
        # the stream: cuda.core's, else torch's own
        self._cc_stream = self._ev_opts = None
        try:
            try:
                from cuda.core import Device, EventOptions
            except ImportError:
                from cuda.core.experimental import Device, EventOptions
            d = Device()
            d.set_current()
            self._cc_stream = d.create_stream()
            ptr = int(self._cc_stream.handle)
            self.stream = torch.cuda.ExternalStream(ptr)
            try:
                self._ev_opts = timing_event_options(EventOptions)
            except Exception as e:
                self.errors["cuda.core event options"] = f"{type(e).__name__}: {e}"[:300]
            self._paths["stream"] = "cuda.core Device().create_stream(), shared with torch (ExternalStream)"
        except Exception as e:
            self.errors["cuda.core stream"] = f"{type(e).__name__}: {e}"[:300]
            self.stream = torch.cuda.Stream()
            ptr = self.stream.cuda_stream
            self._paths["stream"] = "torch.cuda.Stream (cuda.core failed)"
        self.stream_ptr = ptr
        # events: cuda.core's, else torch's
        self._events = None
        if self._cc_stream is not None and self._ev_opts is not None and args.events != "torch":
            try:
                evs = [self._cc_stream.record(options=self._ev_opts) for _ in range(2)]
                self._cc_stream.sync()
                float(evs[1] - evs[0])
                self._events = "cuda.core"
            except Exception as e:
                self.errors["cuda.core events"] = f"{type(e).__name__}: {e}"[:300]
        if self._events is None:
            self._events = "torch"
        self._paths["events"] = {"cuda.core": "cuda.core Stream.record (timing events)",
                                 "torch": "torch.cuda.Event"}[self._events]
        # NVRTC
        self.nv = None
        if args.nvrtc != "torch":
            try:
                self.nv = _Nvrtc(ptr, self.props.multi_processor_count, prefer=args.nvrtc, cc_stream=self._cc_stream,
                                 selftest=self._nvrtc_selftest)
                self.errors.update({f"nvrtc via {k}": v for k, v in self.nv.errors.items()})
            except Exception as e:
                self.errors["nvrtc"] = f"{type(e).__name__}: {e}"[:300]
                self.nv = None
        self._paths["elementwise/movement"] = (f"NVRTC kernels via {self.nv.via}" if self.nv else
                                               "torch's own kernels (NVRTC unavailable)")
        self.cycles_per_ms = self._calibrate_spin()
        self.rng = np.random.default_rng(0)

    # -- setup

    def _nvrtc_selftest(self, nv):
        torch = self.torch
        with torch.cuda.stream(self.stream):
            a = torch.arange(1, 1001, dtype=torch.float32, device=self.dev)
            b = torch.full_like(a, 2.0)
            y = torch.empty_like(a)
            nv.launch("b_add", a.numel(), _p(y), _p(a), _p(b), np.int64(a.numel()))
            nv.launch("u4_relu", a.numel() // 4, _p(b), _p(y), np.int64(a.numel() // 4))
            nv.spin(1000)
        self.stream.synchronize()
        if not torch.equal(b, a + 2):
            raise RuntimeError("the NVRTC self-test computed a wrong result")

    def _spin(self, ms: float):
        if self.nv is not None and self.cycles_per_ms:
            self.nv.spin(int(ms * self.cycles_per_ms))
        elif self.cycles_per_ms:
            with self.torch.cuda.stream(self.stream):
                self.torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def _calibrate_spin(self):
        """Clock cycles per millisecond of the spin kernel (None: no spin available)."""
        cycles = 2_000_000
        for attempt in ("nvrtc", "torch"):
            try:
                if attempt == "nvrtc" and self.nv is None:
                    continue
                ev = self._record_pair_timer()
                ev.start()
                if attempt == "nvrtc":
                    self.nv.spin(cycles)
                else:
                    with self.torch.cuda.stream(self.stream):
                        self.torch.cuda._sleep(cycles)
                ms = ev.stop()
                if ms > 0:
                    # an idle GPU clocks low: a rate measured then would make the spins too short once it
                    # clocks up, so never under 2.1 GHz (longer spins only cost idle milliseconds)
                    self._paths["spin"] = (f"{attempt} spin kernel, measured at {cycles / ms / 1e3:.0f} MHz, "
                                           "timed as at least 2100 MHz")
                    return max(cycles / ms, 2.1e6)
            except Exception as e:
                self.errors[f"spin via {attempt}"] = f"{type(e).__name__}: {e}"[:300]
        self._paths["spin"] = "none (host launch gaps may be timed)"
        return None

    def _record_pair_timer(self):
        backend = self

        class Pair:
            def start(self):
                self.evs = backend._record_events(1)

            def stop(self):
                self.evs += backend._record_events(1)
                return backend._elapsed(self.evs)[0]
        return Pair()

    def _record_events(self, k: int) -> list:
        out = []
        for _ in range(k):
            if self._events == "cuda.core":
                out.append(self._cc_stream.record(options=self._ev_opts))
            else:
                e = self.torch.cuda.Event(enable_timing=True)
                e.record(self.stream)
                out.append(e)
        return out

    def _elapsed(self, evs: list) -> list:
        if self._events == "cuda.core":
            evs[-1].sync()
            return [float(b - a) for a, b in zip(evs, evs[1:])]
        evs[-1].synchronize()
        return [float(a.elapsed_time(b)) for a, b in zip(evs, evs[1:])]

    def device_info(self) -> dict:
        torch = self.torch
        smi = _nvidia_smi("name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,"
                          "power.limit,pstate")
        info = {"gpu": torch.cuda.get_device_name(0), "driver": smi.get("driver_version", "unknown"),
                "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "sm_count": self.props.multi_processor_count,
                "memory_gib": round(self.props.total_memory / 2**30, 1),
                "cuda_runtime": torch.version.cuda, "cudnn": str(torch.backends.cudnn.version()),
                "cublas": _cublas_version(), "nvrtc": _nvrtc_version(),
                "packages": _versions(), "python": platform.python_version(), "machine": platform.platform(),
                "nvidia_smi_at_start": smi}
        return info

    def paths(self) -> dict:
        return dict(self._paths, errors=self.errors)

    # -- the kernel layer

    def build_kernel(self, pl: Plan, S: list, ins: list, outs: list, fixed=(), f32: bool = True):
        """The kernels of a plan over the slot list ``S``: ``(run, what runs, in_place)``. ``run()`` reads the
        tensors ``S[i]`` (``i`` in ``ins``) when it is called, and either writes its results into the tensors
        ``S[o]`` (``o`` in ``outs``, allocated by the caller with the result shapes: ``in_place``) or sets
        ``S[o]`` to the tensors a library call returned (the caching allocator's memory, the same blocks run
        after run; a CUDA graph's own pool when captured). ``fixed``: the slots whose tensors are never
        replaced, so that a kernel may keep their device addresses (one-launch concat's pointer table).
        Call it, and the first ``run()``, on the stream the runs go to."""
        torch = self.torch
        F = torch.nn.functional
        p = pl.p
        nv = self.nv if f32 else None
        i0, o0 = ins[0] if ins else None, outs[0]
        y = S[o0]
        yshape = tuple(y.shape)
        # the NVRTC kernels index their operands as dense arrays, and the float4 ones need 16-byte addresses: a
        # strided operand (a select's view along an inner axis) takes torch's kernel, a view at an odd offset the
        # scalar kernel (a misaligned float4 load is a sticky CUDA error that would end the whole process)
        if nv is not None and not all(S[j].is_contiguous() for j in ins):
            nv = None
        a16 = all(S[j].data_ptr() % 16 == 0 for j in list(ins) + list(outs))

        def put(r):
            S[o0] = r
        if pl.op == "view":
            shp = tuple(pl.p.get("shape") or yshape)
            if S[i0].is_contiguous():
                return (lambda: put(S[i0].view(shp))), "view (no kernel)", False
            return (lambda: put(S[i0].reshape(shp))), "copy (reshape of a strided view)", False
        if pl.op == "select":  # a view too: one index along an axis
            ax, ix = p["axis"], p["index"]
            return (lambda: put(S[i0].select(ax, ix))), "view (select, no kernel)", False
        if pl.op == "conv2d":
            pt, pl_, pb, pr = p["pads"]
            wi, bi = ins[1], (ins[2] if p["bias"] else None)
            asym = (pt, pl_) != (pb, pr)
            extra = " + a pad kernel (asymmetric pads)" if asym else ""
            args = (list(p["strides"]), [0, 0] if asym else [pt, pl_], list(p["dilations"]), p["group"])

            def xin():
                return F.pad(S[i0], (pl_, pr, pt, pb)) if asym else S[i0]

            def bias():
                return None if bi is None else S[bi]
            ckey = (tuple(S[i0].shape), tuple(S[wi].shape), bi is not None, repr(args))
            if p["act"] == "relu" and self._ok("cudnn_convolution_relu", ckey):
                try:
                    fused = torch.cudnn_convolution_relu
                    r = fused(xin(), S[wi], bias(), *args)
                    self.stream.synchronize()
                    if tuple(r.shape) == yshape:
                        return (lambda: put(fused(xin(), S[wi], bias(), *args))), \
                            "cudnn conv+bias+relu, fused (torch.cudnn_convolution_relu)" + extra, False
                except Exception as e:
                    self._failed("cudnn_convolution_relu", e, ckey)

            def run():
                r = F.conv2d(xin(), S[wi], bias(), *args)
                _act_(r, p["act"])
                put(r)
            return run, "cudnn conv" + (" + bias" if bi is not None else "") + _act_desc(p["act"]) + extra, False
        if pl.op == "matmul":
            ai, bi_, ci = ins[0], ins[1], (ins[2] if p["bias"] else None)
            if S[bi_].dim() == 2:  # one GEMM over all rows
                k = S[bi_].shape[0]
                y2 = y.view(-1, yshape[-1])
                mkey = (tuple(S[ai].shape), tuple(S[bi_].shape), tuple(S[ci].shape) if ci is not None else None)
                if ci is not None and p["act"] == "relu" and self._ok("_addmm_activation", mkey):
                    try:
                        act = torch._addmm_activation
                        r = act(S[ci], S[ai].reshape(-1, k), S[bi_], use_gelu=False)
                        self.stream.synchronize()
                        if tuple(r.shape) == tuple(y2.shape):
                            return (lambda: put(act(S[ci], S[ai].reshape(-1, k), S[bi_], use_gelu=False).view(yshape))), \
                                "cublasLt gemm + bias + relu epilogue (torch._addmm_activation)", False
                    except Exception as e:
                        self._failed("_addmm_activation", e, mkey)
                if ci is not None:
                    def run():
                        torch.addmm(S[ci], S[ai].reshape(-1, k), S[bi_], out=y2)
                        _act_(y2, p["act"])
                    return run, "cublas gemm + bias (torch.addmm)" + _act_desc(p["act"]), True

                def run():
                    torch.mm(S[ai].reshape(-1, k), S[bi_], out=y2)
                    _act_(y2, p["act"])
                return run, "cublas gemm (torch.mm)" + _act_desc(p["act"]), True

            def run():
                torch.matmul(S[ai], S[bi_], out=y)
                if ci is not None:
                    y.add_(S[ci])
                _act_(y, p["act"])
            return run, "cublas batched gemm (torch.matmul)" + (" + a bias kernel" if ci is not None else "") + \
                _act_desc(p["act"]), True
        if pl.op == "binary":
            ai, bi_ = ins
            ash, bsh = tuple(S[ai].shape), tuple(S[bi_].shape)
            fn, n = p["fn"], y.numel()
            yp = _p(y)
            if nv is not None:
                if ash == bsh == yshape:
                    if n % 4 == 0 and a16:
                        return (lambda: nv.launch(f"b4_{fn}", n // 4, yp, _p(S[ai]), _p(S[bi_]), np.int64(n // 4))), \
                            f"nvrtc b4_{fn}", True
                    return (lambda: nv.launch(f"b_{fn}", n, yp, _p(S[ai]), _p(S[bi_]), np.int64(n))), f"nvrtc b_{fn}", True
                if _numel(bsh) == 1 and ash == yshape:
                    return (lambda: nv.launch(f"bsb_{fn}", n, yp, _p(S[ai]), _p(S[bi_]), np.int64(n))), \
                        f"nvrtc bsb_{fn} (scalar right operand)", True
                if _numel(ash) == 1 and bsh == yshape:
                    return (lambda: nv.launch(f"bsa_{fn}", n, yp, _p(S[ai]), _p(S[bi_]), np.int64(n))), \
                        f"nvrtc bsa_{fn} (scalar left operand)", True
                nd = len(yshape)
                meta = torch.tensor(list(yshape) + _bstrides(ash, yshape) + _bstrides(bsh, yshape),
                                    dtype=torch.int64, device=self.dev)
                return (lambda: nv.launch(f"bbc_{fn}", n, yp, _p(S[ai]), _p(S[bi_]), np.int64(n), np.int32(nd),
                                          _p(meta))), f"nvrtc bbc_{fn} (broadcast)", True
            tf = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "div": torch.div}[fn]
            return (lambda: tf(S[ai], S[bi_], out=y)), f"torch {fn}", True
        if pl.op == "unary":
            fn, n = p["fn"], y.numel()
            yp = _p(y)
            if nv is not None:
                if n % 4 == 0 and a16:
                    return (lambda: nv.launch(f"u4_{fn}", n // 4, yp, _p(S[i0]), np.int64(n // 4))), f"nvrtc u4_{fn}", True
                return (lambda: nv.launch(f"u_{fn}", n, yp, _p(S[i0]), np.int64(n))), f"nvrtc u_{fn}", True
            tf = {"relu": torch.clamp_min, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "erf": torch.erf,
                  "sqrt": torch.sqrt, "exp": torch.exp, "neg": torch.neg}[fn]
            if fn == "relu":
                return (lambda: torch.clamp_min(S[i0], 0, out=y)), "torch relu", True
            return (lambda: tf(S[i0], out=y)), f"torch {fn}", True
        if pl.op == "batchnorm":
            xi, si, bi, mi, vi = ins
            x = S[xi]
            n, c = y.numel(), x.shape[1]
            inner = n // max(1, x.shape[0] * c)
            if nv is not None:
                yp = _p(y)
                return (lambda: nv.launch("batchnorm", n, yp, _p(S[xi]), _p(S[si]), _p(S[bi]), _p(S[mi]), _p(S[vi]),
                                          np.float32(p["eps"]), np.int64(n), np.int64(c), np.int64(inner))), \
                    "nvrtc batchnorm", True
            return (lambda: put(F.batch_norm(S[xi], S[mi], S[vi], S[si], S[bi], False, 0.0, p["eps"]))), \
                "torch batch_norm (inference)", False
        if pl.op == "transpose":
            perm = p["perm"]
            if nv is not None:
                st = _strides(S[i0].shape)
                meta = torch.tensor(list(yshape) + [st[q] for q in perm], dtype=torch.int64, device=self.dev)
                n, yp = y.numel(), _p(y)
                return (lambda: nv.launch("transpose", n, yp, _p(S[i0]), np.int64(n), np.int32(len(yshape)),
                                          _p(meta))), "nvrtc transpose", True
            return (lambda: y.copy_(S[i0].permute(*perm))), "torch permute copy", True
        if pl.op in ("concat", "split"):
            ax = p["axis"] % len(yshape if pl.op == "concat" else S[i0].shape)
            parts = ins if pl.op == "concat" else outs
            whole = y if pl.op == "concat" else S[i0]
            outer, inner = _numel(whole.shape[:ax]), _numel(whole.shape[ax + 1:])
            offs = [0]
            for j in parts:
                offs.append(offs[-1] + S[j].shape[ax] * inner)
            fixed_parts = pl.op == "split" or all(j in fixed for j in ins)
            if nv is not None and fixed_parts:
                ptrs = torch.tensor([S[j].data_ptr() for j in parts], dtype=torch.int64, device=self.dev)
                offt = torch.tensor(offs, dtype=torch.int64, device=self.dev)
                n, k, total = whole.numel(), len(parts), offs[-1]
                if pl.op == "concat":
                    yp = _p(y)
                    return (lambda: nv.launch("concat", n, yp, _p(ptrs), _p(offt), np.int32(k), np.int64(outer),
                                              np.int64(total))), "nvrtc concat (one launch)", True
                return (lambda: nv.launch("split", n, _p(S[i0]), _p(ptrs), _p(offt), np.int32(k), np.int64(outer),
                                          np.int64(total))), "nvrtc split (one launch)", True
            if pl.op == "concat":
                why = "" if nv is None else " (an input's memory moves between runs)"
                return (lambda: torch.cat([S[j] for j in ins], ax, out=y)), "torch cat" + why, True
            sizes = [S[j].shape[ax] for j in outs]

            def run():
                for j, piece in zip(outs, torch.split(S[i0], sizes, ax)):
                    S[j].copy_(piece)
            return run, f"torch split ({len(outs)} copies)", True
        if pl.op == "pool":
            pt, pl_, pb, pr = p["pads"]
            kh, kw = p["kernel"]
            ceil = bool(p.get("ceil", 0))
            padded = (pt, pl_) != (pb, pr) or pt > kh // 2 or pl_ > kw // 2
            if padded and p["mode"] == "avg" and not p["count_include_pad"] and max(p["pads"]):
                raise Unsupported("average pooling with asymmetric pads not counted")
            val = -math.inf if p["mode"] == "max" else 0.0
            extra = " + a pad kernel" if padded else ""

            def xin():
                return F.pad(S[i0], (pl_, pr, pt, pb), value=val) if padded else S[i0]
            pads = [0, 0] if padded else [pt, pl_]
            k, st = list(p["kernel"]), list(p["strides"])
            if p["mode"] == "max":
                return (lambda: put(F.max_pool2d(xin(), k, st, pads, ceil_mode=ceil))), "torch max_pool2d" + extra, False
            cip = bool(p["count_include_pad"])
            return (lambda: put(F.avg_pool2d(xin(), k, st, pads, ceil_mode=ceil, count_include_pad=cip))), \
                "torch avg_pool2d" + extra, False
        if pl.op == "pad2d":
            x = S[i0]
            nc, h, w = x.shape[0] * x.shape[1], x.shape[2], x.shape[3]
            oh, ow = yshape[2], yshape[3]
            t, l_ = p["top"], p["left"]
            if nv is not None:
                n, yp = y.numel(), _p(y)
                return (lambda: nv.launch("pad2d", n, yp, _p(S[i0]), np.int64(nc), np.int64(h), np.int64(w),
                                          np.int64(oh), np.int64(ow), np.int64(t), np.int64(l_))), "nvrtc pad2d", True
            return (lambda: put(F.pad(S[i0], (l_, ow - w - l_, t, oh - h - t)))), "torch pad", False
        if pl.op == "softmax":
            ax = p.get("axis", -1)
            what = "last axis; approximate" if pl.approx else f"axis {ax}"
            return (lambda: put(torch.softmax(S[i0], ax))), f"torch softmax ({what})", False
        if pl.op == "layernorm":
            ax = p.get("axis", -1) % len(yshape)
            norm = yshape[ax:]
            wi = ins[1] if p["affine"] else None
            bi = ins[2] if p["bias"] else None
            what = "last axis; approximate" if pl.approx else f"from axis {ax}"
            return (lambda: put(F.layer_norm(S[i0], norm, None if wi is None else S[wi], None if bi is None else S[bi],
                                             p["eps"]))), f"torch layer_norm ({what})", False
        if pl.op == "gavgpool":
            return (lambda: torch.mean(S[i0], (2, 3), keepdim=True, out=y)), "torch mean over H, W", True
        if pl.op == "copy":
            n = y.numel()
            if nv is not None:
                yp = _p(y)
                return (lambda: nv.launch("u_copy", n, yp, _p(S[i0]), np.int64(n))), "nvrtc copy (approximate)", True
            return (lambda: y.copy_(S[i0].reshape(-1)[:n].view(yshape))), "torch copy (approximate)", True
        if pl.op == "cast":
            if nv is not None and S[i0].dtype == y.dtype == torch.float32:
                n, yp = y.numel(), _p(y)
                return (lambda: nv.launch("u_copy", n, yp, _p(S[i0]), np.int64(n))), "nvrtc copy (cast to itself)", True
            return (lambda: y.copy_(S[i0])), "torch copy_ (cast)", True
        if pl.op == "gather":
            ax, ii = p["axis"], ins[1]
            keep = list(S[i0].shape)
            keep[ax % len(keep)] = S[ii].numel()
            yv = y.view(keep)
            return (lambda: torch.index_select(S[i0], ax, S[ii].reshape(-1), out=yv)), "torch index_select", True
        # the generic ops of the torch-exported models, through torch's own kernels
        if pl.op == "clip":
            lo, hi = p["lo"], p["hi"]
            return (lambda: torch.clamp(S[i0], lo, hi, out=y)), "torch clamp", True
        if pl.op == "equal":
            i1 = ins[1]
            return (lambda: torch.eq(S[i0], S[i1], out=y)), "torch eq", True
        if pl.op == "where":
            i1, i2 = ins[1], ins[2]
            return (lambda: torch.where(S[i0], S[i1], S[i2], out=y)), "torch where", True
        if pl.op == "expand":
            return (lambda: y.copy_(S[i0].expand(yshape))), "torch expand + copy", True
        if pl.op == "reduce_mean":
            axes, keep = list(p["axes"]), p["keepdims"]
            yv = y.view(tuple(1 if i in p["axes"] else d for i, d in enumerate(S[i0].shape))) if not keep else y
            return (lambda: torch.mean(S[i0], axes, keepdim=True, out=yv)), "torch mean", True
        raise Unsupported(f"no CUDA kernel for {pl.op}")

    def _ok(self, what: str, key=()) -> bool:
        """Whether an optional kernel path has not failed before on these shapes (a failing one is not retried
        there; other shapes still try it, so that one shape's failure does not unfuse the rest of a run: the
        original and the optimized graph would then be built differently)."""
        return (what, key) not in self._bad

    def _failed(self, what: str, e: Exception, key=()) -> None:
        self._bad.add((what, key))
        self.errors.setdefault(what, f"{type(e).__name__}: {e}"[:300])
        n = f"{what}: shapes failed"
        self.errors[n] = self.errors.get(n, 0) + 1

    def time(self, prep, warmup: int, repeats: int, cap_s: float) -> tuple[list, int, int]:
        """Per-run device times (ms) of ``prep.run()``: one run alone, the warm-ups, then the repeats each
        between two events behind a spin kernel (so the host's launch gaps are not timed)."""
        # one run timed alone: the cap, and the spin's length
        t = self._record_pair_timer()
        t.start()
        prep.run()
        one_ms = t.stop()
        warmup, repeats = _fit_cap(one_ms / 1e3, warmup, repeats, cap_s)
        h0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            prep.run()
        per_run_ms = 1e3 * (time.perf_counter() - h0) / max(1, warmup)  # the host's enqueueing time per run
        self.stream.synchronize()
        spin_ms = min(50.0, max(1.0, 1.5 * (repeats + 1) * (per_run_ms + 0.02) + 0.3))
        for _attempt in range(3):
            h0 = time.perf_counter()
            self._spin(spin_ms)
            evs = self._record_events(1)
            for _ in range(repeats):
                prep.run()
                evs += self._record_events(1)
            host_ms = 1e3 * (time.perf_counter() - h0)
            times = self._elapsed(evs)
            # no launch gaps in the times where the host enqueued everything while the GPU was still spinning,
            # or enqueues a run faster than the GPU runs one
            if (self.cycles_per_ms is None or host_ms < 0.8 * spin_ms or host_ms / max(1, repeats) < min(times)
                    or host_ms > 200):
                break
            spin_ms = min(50.0, 2.0 * host_ms + 0.5)
        return times, warmup, repeats

    def time_cold(self, prep, repeats: int, warm_activations: bool = False, flush_mb: int = 256) -> list:
        """Per-run device times (ms) of ``prep.run()`` with the L2 cache flushed before each run (a ``flush_mb``
        buffer written between the runs, outside the events around each): the op with its weights and inputs in
        DRAM, where ``time`` reruns it on the same buffers, resident in L2. ``warm_activations``: after the
        flush, the operands that are not weights (``prep.activations``) are read (a sum of each, outside the
        events), so they are in L2 and the weights are not: an op in a model whose weights outgrow the L2 reads
        what the op before it wrote, still in L2, and its weights from DRAM."""
        torch = self.torch
        if getattr(self, "_flush_buf", None) is None:
            self._flush_buf = torch.empty(flush_mb * 262144, dtype=torch.float32, device=self.dev)
        self.stream.synchronize()
        pairs = []
        with torch.cuda.stream(self.stream):
            self._spin(min(50.0, 1.0 + 0.3 * repeats))
            for _ in range(repeats):
                self._flush_buf.fill_(0.0)
                if warm_activations:
                    for t in prep.activations:
                        t.sum()
                a = self._record_events(1)
                prep.run()
                pairs.append((a[0], self._record_events(1)[0]))
        return [self._elapsed([a, b])[0] for a, b in pairs]

    def time_in_graph(self, prep, copies: int, replays: int) -> list:
        """Per-run device times (ms) of ``prep.run()`` inside a CUDA graph: ``copies`` runs captured back to back
        as one graph, each of ``replays`` replays timed between two events behind a spin kernel, divided by
        ``copies``. What one op costs where a whole model runs as one CUDA graph, as the GPU executor runs
        models: consecutive kernels overlap their launches there, where ``time`` pays each launch. Raises what
        the capture raises (a kernel that cannot be captured)."""
        torch = self.torch
        self.stream.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=self.stream, capture_error_mode="thread_local"):
                for _ in range(copies):
                    prep.run()
            with torch.cuda.stream(self.stream):
                g.replay()  # (the first replay uploads the graph)
                self.stream.synchronize()
                self._spin(min(50.0, 0.05 * replays + 0.5))
                evs = self._record_events(1)
                for _ in range(replays):
                    g.replay()
                    evs += self._record_events(1)
            return [t / copies for t in self._elapsed(evs)]
        finally:
            del g
            try:
                torch.cuda.synchronize()
            except Exception:
                pass

    def close(self):
        try:
            self.torch.cuda.synchronize()
        except Exception:
            pass


class CudaBackend(CudaDevice):
    """The calibration's GPU backend: each signature's plan over fresh inputs (``CudaDevice.build_kernel``)."""

    def prepare(self, rec: dict, pl: Plan) -> Prepared:
        torch = self.torch
        xs_np = _inputs(rec, self.rng)
        if pl.op == "view":  # (of any dtype: a reshape of int64 shapes is one)
            return Prepared(lambda: None, lambda: [xs_np[0].reshape(rec["out_shapes"][0])], "view (no kernel)", xs_np)
        dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[rec["dtype"]]
        with torch.cuda.stream(self.stream):
            S = [torch.from_numpy(x).to(self.dev, dt) for x in xs_np]
            S += [torch.empty(tuple(s), dtype=dt, device=self.dev) for s in rec["out_shapes"]]
        self.stream.synchronize()
        ins, outs = list(range(len(xs_np))), list(range(len(xs_np), len(S)))
        with torch.cuda.stream(self.stream):  # (its index tensors are copied on the stream the kernels run on)
            run, backend, _ = self.build_kernel(pl, S, ins, outs, fixed=set(ins), f32=dt == torch.float32)
        torch.cuda.synchronize()

        def stream_run():
            with torch.cuda.stream(self.stream):
                run()

        def outputs():
            self.stream.synchronize()
            return [S[o].float().cpu().numpy() for o in outs]
        stream_run()  # a trial run: what cannot run fails here
        self.stream.synchronize()
        shapes = [tuple(S[o].shape) for o in outs]
        if shapes != [tuple(s) for s in rec["out_shapes"]]:
            raise ValueError(f"{backend} gives shapes {shapes}, the signature says {rec['out_shapes']}")
        return Prepared(stream_run, outputs, backend, xs_np, release=S.clear,
                        activations=[S[i] for i in activation_operands(rec)])


def _act_(t, act):
    """``t`` with its activation applied in place (a kernel of its own)."""
    if act == "relu":
        t.relu_()
    elif act == "relu6":
        t.clamp_(0, 6)


def _act_desc(act: str) -> str:
    return "" if act == "none" else f" + {act} kernel"


def _strides(shape) -> list:
    st, acc = [], 1
    for d in reversed(list(shape)):
        st.append(acc)
        acc *= d
    return st[::-1]


def _bstrides(shape, out_shape) -> list:
    """Strides of a tensor of ``shape`` broadcast to ``out_shape`` (0 along broadcast dimensions)."""
    shape = [1] * (len(out_shape) - len(shape)) + list(shape)
    st = _strides(shape)
    return [0 if s == 1 else t for s, t in zip(shape, st)]


def _cublas_version() -> str:
    """cuBLAS's version: from the library itself through CuPy, else the wheel's."""
    try:
        import cupy.cuda.cublas as cublas

        h = cublas.create()
        try:
            return str(cublas.getVersion(h))
        finally:
            cublas.destroy(h)
    except Exception:
        return _pkg("nvidia-cublas") or _pkg("nvidia-cublas-cu12") or "unknown"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:
        return _pkg("nvidia-cuda-nvrtc") or "unknown"


def _pkg(name: str):
    return package_versions((name,)).get(name)


def short_name(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100' (the table's file name and ``cuda:<name>``)."""
    g = gpu.lower()
    for k in ("h200", "h100", "b200", "gh200", "a100", "l40s", "l4", "v100", "t4", "a10g"):
        if k in g.split() or k in g.replace("-", " ").split() or f" {k} " in f" {g} ":
            return k
    return "".join(c if c.isalnum() else "-" for c in g).strip("-") or "gpu"


# ---------------------------------------------------------------------------------------------------------
# one signature


def error_line(e: BaseException, limit: int = 300) -> str:
    """An exception in one line: its type and the first line of its message (at most ``limit`` characters)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:limit] if str(e) else ''}"


def graph_copies(ms: float, most: int) -> int:
    """How many runs of an op one in-graph timing captures: about 0.5 ms of work, 2 at least, ``most`` at most."""
    return max(2, min(most, int(0.5 / max(ms, 1e-4))))


def measure(backend, rec: dict, pl: Plan, warmup: int = 8, repeats: int = 32, cap_s: float = 2.0,
            inspect=None, in_graph: int = 0, graph_replays: int = 8, cold: int = 0, cold_weights: int = 0) -> dict:
    """Prepare and time one signature's plan on ``backend``: its entry ``{"ms" (the median), "q1_ms", "q3_ms",
    "min_ms", "repeats", "warmup", "backend" (what ran), ["approx"]}``; a view costs 0 and runs nothing.
    ``inspect(pl, prepared, entry)``, where given, runs before the buffers are released (the calibration's
    check against numpy). ``in_graph`` (copies at most; 0: not): the op also timed inside a CUDA graph of copies
    of it (``time_in_graph``), its median per run as ``graph_ms`` (``graph_error`` where capture failed).
    ``cold`` (runs; 0: not): the op also timed with the L2 flushed before each run (``time_cold``), ``cold_ms``.
    ``cold_weights`` (runs; 0: not): the same with the activations read back into L2 after each flush, the
    weights left in DRAM, ``coldw_ms``. Raises ``Unsupported`` where the backend has no kernel for the plan, and whatever
    the kernels raise."""
    prep = backend.prepare(rec, pl)
    try:
        if pl.op == "view":
            entry = {"ms": 0.0, "q1_ms": 0.0, "q3_ms": 0.0, "repeats": 0, "backend": prep.backend}
        else:
            times, w, r = backend.time(prep, warmup, repeats, cap_s)
            q1, med, q3 = (float(v) for v in np.percentile(times, [25, 50, 75]))
            entry = {"ms": med, "q1_ms": q1, "q3_ms": q3, "min_ms": float(min(times)), "repeats": r, "warmup": w,
                     "backend": prep.backend}
            if in_graph:
                n = graph_copies(med, in_graph)
                try:
                    gt = backend.time_in_graph(prep, n, graph_replays)
                    entry.update(graph_ms=float(np.median(gt)), graph_copies=n, graph_replays=len(gt))
                except Exception as e:  # (the op's own timing stands; the reason is kept)
                    entry["graph_error"] = error_line(e, 200)
            if cold:
                try:
                    ct = backend.time_cold(prep, cold)
                    entry.update(cold_ms=float(np.median(ct)), cold_repeats=len(ct))
                except Exception as e:
                    entry["cold_error"] = error_line(e, 200)
            if cold_weights:
                try:
                    ct = backend.time_cold(prep, cold_weights, warm_activations=True)
                    entry.update(coldw_ms=float(np.median(ct)), coldw_repeats=len(ct))
                except Exception as e:
                    entry["coldw_error"] = error_line(e, 200)
        if pl.approx:
            entry["approx"] = True
        if inspect is not None:
            inspect(pl, prep, entry)
        return entry
    finally:
        try:
            prep.release()
        except Exception:
            pass
