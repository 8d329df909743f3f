"""The second opinion on the GPU speedups (issue 25): a small ONNX interpreter on PyTorch ops.

Independent of execute.py in everything but the ONNX file and the inputs: its own reading of each node
(``OPS``: ONNX op type -> the method that runs it with torch), no fusion, torch's own kernels for the elementwise
ops and the data movement (``torch.add``, ``permute().contiguous()``, ``torch.cat``, ``torch.split``...: not the
NVRTC kernels of calibrate.py), cuDNN convolutions and cuBLAS GEMMs as PyTorch calls them, values held in a
dictionary per run (torch's caching allocator), the stream torch makes, the whole model captured with
``torch.cuda.CUDAGraph`` where it can be, and its own timing loop: batches of runs between two
``torch.cuda.Event``s (the mean per run of each batch), not calibrate.py's per-run events behind a spin kernel.

Nodes whose inputs are all constants are computed once when the model is loaded (as onnxruntime does).
``device="cpu"`` runs it on the CPU with torch's CPU kernels (no graph, wall clock): a check of the
interpreter itself where torch is installed without a GPU.
"""

from __future__ import annotations

import math
import time

import numpy as np

#: ONNX op type -> the _Ops method that runs it
OPS = {
    "Conv": "conv", "MatMul": "matmul", "Gemm": "gemm", "BatchNormalization": "batchnorm",
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt", "Exp": "exp", "Neg": "neg",
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Transpose": "transpose", "Concat": "concat", "Split": "split", "Gather": "gather", "Cast": "cast",
    "Reshape": "reshape", "Flatten": "flatten", "Squeeze": "squeeze", "Unsqueeze": "unsqueeze",
    "Identity": "identity", "Dropout": "identity",
    "MaxPool": "maxpool", "AveragePool": "avgpool", "GlobalAveragePool": "gavgpool",
    "Softmax": "softmax", "LayerNormalization": "layernorm", "Constant": "constant",
    "Clip": "clip", "Equal": "equal", "Where": "where", "Expand": "expand", "ReduceMean": "reducemean",
}


#: ONNX op type -> the input read on the host (a shape, split sizes, axes; Gather's index where it is a scalar):
#: where it is a constant the runner keeps it as a CPU tensor, so that a run never reads the device (``.tolist()``
#: of a CUDA tensor is a device-to-host copy and a sync: slow eagerly, and an error inside a CUDA graph capture)
HOST_INPUTS = {"Reshape": 1, "Split": 1, "Squeeze": 1, "Unsqueeze": 1, "Gather": 1, "Expand": 1, "ReduceMean": 1}


def host_input(op_type: str, ins: list, const_shapes: dict):
    """The position of the node's input to pass as a host (CPU) tensor, or None: ``const_shapes`` maps the
    constant values' names to their shapes."""
    pos = HOST_INPUTS.get(op_type)
    if pos is None or pos >= len(ins) or not ins[pos] or ins[pos] not in const_shapes:
        return None
    shape = tuple(const_shapes[ins[pos]])
    if op_type == "Gather" and shape != ():
        return None  # (an index tensor: index_select wants it on the device)
    return pos if math.prod(shape) <= 1024 else None


def check_available() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")


def describe(tf32: bool = False) -> dict:
    import torch

    return {"torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()),
            "math": "TF32 allowed" if tf32 else "strict FP32 (TF32 off)",
            "kernels": "PyTorch's own (cuDNN convs in benchmark mode, cuBLAS GEMMs, torch elementwise/copy/cat)"}


def device_info() -> dict:
    import platform

    import torch

    p = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "driver": "unknown", "cuda_runtime": torch.version.cuda,
            "cudnn": str(torch.backends.cudnn.version()), "memory_gib": round(p.total_memory / 2**30, 1),
            "python": platform.python_version(), "packages": {"torch": torch.__version__}}


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Ops:
    """Each method: (attributes, *input tensors; None for an omitted optional input) -> tuple of outputs."""

    def __init__(self, torch):
        self.t, self.F = torch, torch.nn.functional

    def constant(self, a):
        from onnx import numpy_helper

        if "value" in a:
            v = numpy_helper.to_array(a["value"])
        elif "value_float" in a or "value_floats" in a:
            v = np.array(a.get("value_float", a.get("value_floats")), dtype=np.float32)
        else:
            v = np.array(a.get("value_int", a.get("value_ints")), dtype=np.int64)
        return (self.t.from_numpy(np.require(v, requirements=("C", "W"))),)  # (ascontiguousarray makes 0-d 1-d)

    def conv(self, a, x, w, b=None):
        pads = list(a.get("pads", (0, 0, 0, 0)))
        if pads[:2] != pads[2:]:
            x = self.F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
            pads = [0, 0, 0, 0]
        return (self.F.conv2d(x, w, b, list(a.get("strides", (1, 1))), pads[:2], list(a.get("dilations", (1, 1))),
                              int(a.get("group", 1))),)

    def matmul(self, a, x, y):
        return (self.t.matmul(x, y),)

    def gemm(self, a, x, w, c=None):
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        if a.get("transA", 0):
            x = x.t()
        if a.get("transB", 0) and alpha == 1.0 and beta == 1.0:
            return (self.F.linear(x, w, c),)
        w = w.t() if a.get("transB", 0) else w
        if c is None:
            return (self.t.mm(x, w) * alpha if alpha != 1.0 else self.t.mm(x, w),)
        return (self.t.addmm(c, x, w, beta=beta, alpha=alpha),)

    def batchnorm(self, a, x, sc, bi, mu, var):
        return (self.F.batch_norm(x, mu, var, sc, bi, False, 0.0, float(a.get("epsilon", 1e-5))),)

    def relu(self, a, x):
        return (self.t.relu(x),)

    def sigmoid(self, a, x):
        return (self.t.sigmoid(x),)

    def tanh(self, a, x):
        return (self.t.tanh(x),)

    def erf(self, a, x):
        return (self.t.erf(x),)

    def sqrt(self, a, x):
        return (self.t.sqrt(x),)

    def exp(self, a, x):
        return (self.t.exp(x),)

    def neg(self, a, x):
        return (self.t.neg(x),)

    def add(self, a, x, y):
        return (self.t.add(x, y),)

    def sub(self, a, x, y):
        return (self.t.sub(x, y),)

    def mul(self, a, x, y):
        return (self.t.mul(x, y),)

    def div(self, a, x, y):
        return (self.t.div(x, y),)

    def transpose(self, a, x):
        perm = list(a["perm"]) if "perm" in a else list(range(x.dim()))[::-1]
        return (x.permute(*perm).contiguous(),)

    def concat(self, a, *xs):
        return (self.t.cat(list(xs), int(a["axis"])),)

    def split(self, a, x, sizes=None, *, n_out=1):
        ax = int(a.get("axis", 0)) % x.dim()
        if sizes is not None:
            sz = [int(v) for v in sizes.tolist()]
        elif "split" in a:
            sz = [int(v) for v in a["split"]]
        else:
            k = int(a.get("num_outputs", n_out))
            each = -(-x.shape[ax] // k)
            sz = [min(each, x.shape[ax] - i * each) for i in range(k)]
        return tuple(p.contiguous() for p in self.t.split(x, sz, ax))

    def gather(self, a, x, idx):
        ax = int(a.get("axis", 0)) % x.dim()
        if idx.dim() == 0:
            return (x.select(ax, int(idx.item())).contiguous(),)
        idx = self.t.where(idx < 0, idx + x.shape[ax], idx)
        out = self.t.index_select(x, ax, idx.reshape(-1))
        return (out.reshape(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:])),)

    def cast(self, a, x):
        from onnx import helper

        npdt = np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"])))
        dt = {"float32": self.t.float32, "float16": self.t.float16, "float64": self.t.float64,
              "int64": self.t.int64, "int32": self.t.int32, "bool": self.t.bool}[npdt.name]
        return (x.to(dt),)

    def reshape(self, a, x, shape):
        s = [int(v) for v in shape.tolist()]
        if not int(a.get("allowzero", 0)):
            s = [x.shape[i] if v == 0 else v for i, v in enumerate(s)]
        return (x.reshape(s),)

    def flatten(self, a, x):
        ax = int(a.get("axis", 1)) % max(1, x.dim()) if x.dim() else 0
        return (x.reshape(int(math.prod(x.shape[:ax])), -1),)

    def squeeze(self, a, x, axes=None):
        ax = [int(v) for v in axes.tolist()] if axes is not None else list(a.get("axes", []))
        if not ax:
            return (x.squeeze(),)
        shape = [d for i, d in enumerate(x.shape) if i not in {v % x.dim() for v in ax}]
        return (x.reshape(shape),)

    def unsqueeze(self, a, x, axes=None):
        ax = [int(v) for v in axes.tolist()] if axes is not None else list(a.get("axes", []))
        n = x.dim() + len(ax)
        ax = sorted(v % n for v in ax)
        shape = list(x.shape)
        for v in ax:
            shape.insert(v, 1)
        return (x.reshape(shape),)

    def identity(self, a, x, *rest):
        return (x,)

    def _pool_input(self, a, x, value):
        pads = list(a.get("pads", (0, 0, 0, 0)))
        k = list(a["kernel_shape"])
        if pads[:2] != pads[2:] or pads[0] > k[0] // 2 or pads[1] > k[1] // 2:
            return self.F.pad(x, (pads[1], pads[3], pads[0], pads[2]), value=value), [0, 0], True
        return x, pads[:2], False

    def maxpool(self, a, x):
        x, pads, _ = self._pool_input(a, x, -math.inf)
        return (self.F.max_pool2d(x, list(a["kernel_shape"]), list(a.get("strides", (1, 1))), pads,
                                  ceil_mode=bool(a.get("ceil_mode", 0))),)

    def avgpool(self, a, x):
        cip = bool(a.get("count_include_pad", 0))
        x, pads, padded = self._pool_input(a, x, 0.0)
        if padded and not cip:
            raise NotImplementedError("AveragePool with asymmetric pads not counted")
        return (self.F.avg_pool2d(x, list(a["kernel_shape"]), list(a.get("strides", (1, 1))), pads,
                                  ceil_mode=bool(a.get("ceil_mode", 0)), count_include_pad=cip),)

    def gavgpool(self, a, x):
        return (self.F.adaptive_avg_pool2d(x, 1),)

    def softmax(self, a, x):
        return (self.t.softmax(x, int(a.get("axis", -1))),)

    def layernorm(self, a, x, sc=None, bi=None):
        ax = int(a.get("axis", -1)) % x.dim()
        return (self.F.layer_norm(x, tuple(x.shape[ax:]), sc, bi, float(a.get("epsilon", 1e-5))),)

    def clip(self, a, x, lo=None, hi=None):
        lo = a.get("min") if lo is None else lo
        hi = a.get("max") if hi is None else hi
        return (self.t.clamp(x, lo, hi),)

    def equal(self, a, x, y):
        return (self.t.eq(x, y),)

    def where(self, a, c, x, y):
        return (self.t.where(c, x, y),)

    def expand(self, a, x, shape):
        s = [int(v) for v in shape.tolist()]
        # ONNX Expand broadcasts both ways (a 1 in the shape keeps the input's size)
        nd = max(len(s), x.dim())
        s = [1] * (nd - len(s)) + s
        xs = [1] * (nd - x.dim()) + list(x.shape)
        return (x.reshape(xs).expand([max(i, j) for i, j in zip(s, xs)]).contiguous(),)

    def reducemean(self, a, x, axes=None):
        ax = [int(v) for v in (axes.tolist() if axes is not None else a.get("axes", range(x.dim())))]
        if not ax and a.get("noop_with_empty_axes", 0):
            return (x,)
        return (self.t.mean(x, [v % x.dim() for v in ax], keepdim=bool(a.get("keepdims", 1))),)


class TorchRunner:
    """One ONNX model (weights filled) on torch: ``run()``, ``outputs()``, ``time()``, ``release()``;
    ``mode``: "cuda graph" or "eager" (``capture_error`` says why), or "cpu"."""

    name = "torch"

    def __init__(self, model, feeds: dict, graph: bool = True, tf32: bool = False, device: str = "cuda"):
        import torch
        from onnx import numpy_helper

        self.torch = torch
        self.cuda = device == "cuda"
        if self.cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
            torch.backends.cudnn.allow_tf32 = bool(tf32)
            self.stream = torch.cuda.Stream()
        self.dev = torch.device(device)
        ops = _Ops(torch)
        g = model.graph
        const = {t.name: torch.from_numpy(np.require(numpy_helper.to_array(t), requirements=("C", "W"))).to(self.dev)
                 for t in g.initializer}
        self.program = []
        self.kernels: dict = {}
        for nd in g.node:
            m = OPS.get(nd.op_type)
            if m is None:
                raise NotImplementedError(f"node '{nd.name or nd.output[0]}': no torch op for ONNX op {nd.op_type}")
            fn, a = getattr(ops, m), _attrs(nd)
            if nd.op_type == "Split":
                fn = (lambda f, k: (lambda a, *xs: f(a, *xs, n_out=k)))(fn, len(nd.output))
            ins = list(nd.input)
            if all((not x) or x in const for x in ins):  # constants: computed now
                outs = fn(a, *[const[x] if x else None for x in ins])
                for o, v in zip(nd.output, outs):
                    const[o] = v.to(self.dev)
                continue
            hp = HOST_INPUTS.get(nd.op_type, len(ins))
            pos = host_input(nd.op_type, ins, {ins[hp]: tuple(const[ins[hp]].shape)}
                             if hp < len(ins) and ins[hp] in const else {})
            pre = {} if pos is None else {pos: const[ins[pos]].cpu()}
            self.program.append((fn, a, ins, list(nd.output), pre))
            self.kernels[nd.op_type] = self.kernels.get(nd.op_type, 0) + 1
        self.const = const
        self.inputs = {n: torch.from_numpy(np.require(v, requirements=("C", "W"))).to(self.dev) for n, v in feeds.items()}
        self.output_names = [o.name for o in g.output]
        self.env = None
        self.graph, self.capture_error = None, None
        self.mode = "eager" if self.cuda else "cpu"
        self._eager()  # the first run: what cannot run fails here
        if self.cuda:
            torch.cuda.synchronize()
            if graph:
                self._capture()

    def _eager(self):
        env = dict(self.const)
        env.update(self.inputs)
        for fn, a, ins, outs, pre in self.program:
            ys = fn(a, *[pre[i] if i in pre else (env[x] if x else None) for i, x in enumerate(ins)])
            for o, y in zip(outs, ys):
                if o:
                    env[o] = y
        self.env = env

    def _capture(self):
        torch = self.torch
        try:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                for _ in range(2):
                    self._eager()
            torch.cuda.current_stream().wait_stream(self.stream)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.stream):
                self._eager()
            g.replay()
            torch.cuda.synchronize()
            self.graph, self.mode = g, "cuda graph"
        except Exception as e:
            self.capture_error = f"{type(e).__name__}: {str(e).splitlines()[0][:240] if str(e) else ''}"
            self.graph, self.mode = None, "eager"
            torch.cuda.synchronize()

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._eager()

    def outputs(self) -> dict:
        if self.cuda:
            self.torch.cuda.synchronize()
        return {n: self.env[n].detach().cpu().numpy() for n in self.output_names}

    def time(self, warmup: int, repeats: int, cap_s: float) -> list:
        """Per-run latencies (ms): ``repeats`` batches of runs, each batch between two events (the mean per
        run), the batch size chosen so that a batch takes about a millisecond (at most 20 runs)."""
        torch = self.torch
        for _ in range(max(1, warmup)):
            self.run()
        if not self.cuda:
            out = []
            for _ in range(repeats):
                t = time.perf_counter()
                self.run()
                out.append(1e3 * (time.perf_counter() - t))
            return out
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        self.run()
        e1.record()
        e1.synchronize()
        one = max(1e-3, e0.elapsed_time(e1))
        n = int(max(1, min(20, 1.0 / one)))
        out, t_end = [], time.perf_counter() + cap_s
        for i in range(repeats):
            e0.record()
            for _ in range(n):
                self.run()
            e1.record()
            e1.synchronize()
            out.append(e0.elapsed_time(e1) / n)
            if time.perf_counter() > t_end and i >= 2:
                break
        return out

    def release(self):
        self.graph = None
        self.env = None
        self.const = {}
        self.inputs = {}
        self.program = []
