"""Seeded generator of valid ONNX models (opset 17, IR 8, float32, static shapes) built from motifs.

``generate(seed)`` returns a ``Generated`` (the model and the motifs it was built from) or raises
``GeneratorFault``: every model is checked here (``onnx.checker`` with strict shape inference, then a run
in onnxruntime with its graph optimizations off that must give finite outputs of the declared shapes),
so that a model the generator got wrong is never charged to the optimizer.

A model is one of a few families (CNN on ``[N, C, H, W]``, sequence on ``[B, S, D]``, MLP on
``[N, D]``, recurrent cells, or a mix) and a short random sequence of motifs, each reading a value of
the right rank from the values built so far (mostly a recent one, sometimes an older one, which makes
branches and siblings). Weights are initializers, sometimes graph inputs (then they are activations to
the optimizer) and sometimes initializers also listed as graph inputs. Sizes are small: a model is
optimized in well under a second.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT
#: bumped when a change of the generator changes which model a seed gives (recorded with the results;
#: a seed names a model only together with this version)
GENERATOR_VERSION = 5
#: the random stream the seeds index (fixed: the version above tells generators apart)
_STREAM = 1


class GeneratorFault(Exception):
    """The generator built a model that is not valid (checker, shape inference or onnxruntime refuse
    it, or it computes non-finite values): a fault of the generator, not of the optimizer."""

    def __init__(self, msg: str, model: Optional[onnx.ModelProto] = None):
        super().__init__(msg)
        self.model = model


@dataclass
class Generated:
    seed: int
    model: onnx.ModelProto
    family: str
    motifs: list = field(default_factory=list)


class Builder:
    """An ONNX graph under construction with the shape of every float value it made."""

    def __init__(self, rng: np.random.Generator, weight_input_p: float = 0.0, shadow_p: float = 0.0):
        self.rng = rng
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.shadowed: list = []  # initializers also listed as graph inputs
        self.shape: dict = {}  # float value -> shape
        self.pool: list = []  # float activations, in creation order
        self.uses: Counter = Counter()
        self.bounds: dict = {}  # int64 graph input -> bound of its values
        self.products = 0  # products of two activations so far (m_soup squashes its own after the first)
        self.weight_input_p = weight_input_p
        self.shadow_p = shadow_p
        self.name_nodes = rng.random() < 0.8
        #: value and node names: plain (``matm_12``), as torch exports them (``/layer1/MatMul_output_0``)
        #: or with characters that need quoting somewhere (spaces, quotes, backslashes, ``:``, non-ASCII)
        self.style = str(rng.choice(["plain", "export", "odd"], p=[0.6, 0.25, 0.15]))
        self.forced_outputs: list = []  # values that must be graph outputs (inputs among them)
        self.int_outputs: list = []  # (name, shape) of int64 graph outputs
        self._n = 0

    # -- names and leaves ------------------------------------------------------------------------
    _ODD = ("{p} {n}", "{p}:{n}", "{n}{p}", "{p}.{n}", "{p}/\u00fc{n}", "{p}\"{n}", "{p}\\{n}", "{p}%{n}", "{p}#{n}",
            "{p}@{n}", "{p}{{{n}}}", "{p}\u2603{n}")

    def fresh(self, prefix: str) -> str:
        self._n += 1
        if self.style == "export":
            return f"/layer{self._n // 9}/{prefix.rstrip('_').capitalize()}_output_{self._n}"
        if self.style == "odd" and self.rng.random() < 0.5:
            t = self._ODD[int(self.rng.integers(len(self._ODD)))]
            return t.format(p=prefix, n=self._n)
        return f"{prefix}{self._n}"

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, options, p=None):
        i = self.rng.choice(len(options), p=None if p is None else np.asarray(p, float) / np.sum(p))
        return options[int(i)]

    def input(self, shape, prefix: str = "x") -> str:
        name = self.fresh(prefix)
        self.inputs.append(helper.make_tensor_value_info(name, FLOAT, list(shape)))
        self.shape[name] = tuple(int(d) for d in shape)
        self.pool.append(name)
        return name

    def index_input(self, shape, bound: int, prefix: str = "ids") -> str:
        """An int64 graph input of values in ``[0, bound)`` (token ids)."""
        name = self.fresh(prefix)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, list(shape)))
        self.bounds[name] = int(bound)
        return name

    def weight(self, shape, scale: Optional[float] = None, *, const: bool = False, prefix: str = "w",
               values: Optional[np.ndarray] = None) -> str:
        """A float weight: an initializer, or (unless ``const``) sometimes a graph input. Normal values
        scaled by ``1/sqrt(fan_in)`` (all axes but the first) unless ``scale`` or ``values`` is given."""
        shape = tuple(int(d) for d in shape)
        name = self.fresh(prefix)
        if values is None:
            if scale is None:
                fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                scale = 1.0 / math.sqrt(max(1, fan_in))
            values = self.rng.standard_normal(shape) * scale
        values = np.asarray(values, np.float32).reshape(shape)
        self.shape[name] = shape
        if not const and self.weight_input_p and self.chance(self.weight_input_p):
            self.inputs.append(helper.make_tensor_value_info(name, FLOAT, list(shape)))
            return name
        self.inits.append(numpy_helper.from_array(values, name))
        if self.shadow_p and self.chance(self.shadow_p):
            self.shadowed.append(helper.make_tensor_value_info(name, FLOAT, list(shape)))
        return name

    def scalar(self, value: float, shape=()) -> str:
        """A float constant (initializer or Constant node), never a graph input."""
        arr = np.full(shape, value, np.float32)
        if self.chance(0.3):
            name = self.fresh("k")
            self.nodes.append(helper.make_node("Constant", [], [name], name=self._node_name("Constant"),
                                               value=numpy_helper.from_array(arr)))
            self.shape[name] = tuple(shape)
            return name
        return self.weight(shape, values=arr, const=True, prefix="k")

    def i64(self, values, prefix: str = "s", scalar: bool = False) -> str:
        arr = np.array(values, np.int64).reshape(() if scalar else (-1,))
        name = self.fresh(prefix)
        if self.chance(0.4):
            self.nodes.append(helper.make_node("Constant", [], [name], name=self._node_name("Constant"),
                                               value=numpy_helper.from_array(arr)))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def _node_name(self, op: str) -> str:
        return self.fresh(f"{op.lower()}_") if self.name_nodes else ""

    def node(self, op: str, inputs: list, shapes, pool: bool = True, **attrs) -> list:
        """Add a node with float outputs of ``shapes`` (a list of shapes, or None for non-float outputs:
        then ``shapes`` is the number of outputs). Returns the output names."""
        n_out = shapes if isinstance(shapes, int) else len(shapes)
        outs = [self.fresh(op.lower()[:4] + "_") for _ in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op, inputs, outs, name=self._node_name(op), **attrs))
        for i in inputs:
            if i:
                self.uses[i] += 1
        if not isinstance(shapes, int):
            for o, s in zip(outs, shapes):
                self.shape[o] = tuple(int(d) for d in s)
                if pool:
                    self.pool.append(o)
        return outs

    def op(self, op: str, inputs: list, shape, **attrs) -> str:
        return self.node(op, inputs, [shape], **attrs)[0]

    # -- picking values ----------------------------------------------------------------------------
    def candidates(self, pred: Callable) -> list:
        return [v for v in self.pool if pred(self.shape[v])]

    def pick(self, pred: Callable = lambda s: True) -> Optional[str]:
        """A value whose shape satisfies ``pred``: mostly one of the latest, sometimes any."""
        c = self.candidates(pred)
        if not c:
            return None
        if self.chance(0.25):
            return c[int(self.rng.integers(len(c)))]
        w = np.array([0.55 ** (len(c) - 1 - i) for i in range(len(c))])
        return c[int(self.rng.choice(len(c), p=w / w.sum()))]

    def pick_rank(self, rank: int, max_elems: int = 1 << 14) -> Optional[str]:
        return self.pick(lambda s: len(s) == rank and int(np.prod(s)) <= max_elems)

    # -- the model -----------------------------------------------------------------------------------
    def model(self, extra_outputs_p: float = 0.15, dead_p: float = 0.08) -> onnx.ModelProto:
        leaves = [v for v in self.pool if self.uses[v] == 0 and v not in {i.name for i in self.inputs}]
        if not leaves and not self.forced_outputs:
            leaves = [self.pool[-1]]
        outs = list(leaves)
        if len(outs) > 1 and self.chance(dead_p):  # a dead branch for the optimizer's DCE
            outs.pop(int(self.rng.integers(len(outs))))
        inner = [v for v in self.pool if self.uses[v] > 0 and v not in outs
                 and v not in {i.name for i in self.inputs}]
        if inner and self.chance(extra_outputs_p):  # an output that also feeds other ops
            outs.append(inner[int(self.rng.integers(len(inner)))])
        outs += [v for v in self.forced_outputs if v not in outs]
        outputs = [helper.make_tensor_value_info(v, FLOAT, list(self.shape[v])) for v in outs]
        outputs += [helper.make_tensor_value_info(v, TensorProto.INT64, list(sh)) for v, sh in self.int_outputs]
        g = helper.make_graph(self.nodes, "fuzz", self.inputs + self.shadowed, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="taso-fuzz")
        if self.bounds:
            import json

            helper.set_model_props(m, {BOUNDS_KEY: json.dumps(self.bounds)})
        return m


# ------------------------------------------------------------------------------------------------------
# building blocks
# ------------------------------------------------------------------------------------------------------

def activation(b: Builder, x: str, kind: Optional[str] = None) -> str:
    s = b.shape[x]
    kind = kind or b.choice(["Relu", "Sigmoid", "Tanh", "Clip06", "LeakyRelu", "Erf", "HardSigmoid"],
                            [5, 2, 2, 2, 1, 1, 1])
    if kind == "Clip06":
        if b.chance(0.1):  # a Clip with only its lower bound
            return b.op("Clip", [x, b.scalar(0.0)], s)
        if b.chance(0.05):  # a Clip with only its upper bound
            return b.op("Clip", [x, "", b.scalar(6.0)], s)
        return b.op("Clip", [x, b.scalar(0.0), b.scalar(6.0)], s)
    if kind == "LeakyRelu":
        return b.op("LeakyRelu", [x], s, alpha=0.1)
    return b.op(kind, [x], s)


def linear(b: Builder, x: str, dk: int, form: Optional[str] = None) -> str:
    """``x @ W`` with a bias in one of the forms exporters write (``Gemm`` only on 2-D inputs)."""
    s = b.shape[x]
    d = s[-1]
    out = s[:-1] + (dk,)
    if form is None:
        if len(s) == 2:
            form = b.choice(["matmul", "matmul_add", "add_matmul", "gemm", "gemm_tb", "gemm_noc", "gemm_row",
                             "gemm_full", "gemm_scalar", "gemm_alpha"], [3, 3, 1, 4, 3, 1, 1, 1, 1, 1])
        else:
            form = b.choice(["matmul", "matmul_add", "add_matmul", "matmul_add_row"], [4, 4, 2, 1])
    if form.startswith("gemm"):
        tb = form == "gemm_tb" or (form != "gemm" and b.chance(0.3))
        w = b.weight((dk, d) if tb else (d, dk), scale=1 / math.sqrt(d))
        ins = [x, w]
        if form == "gemm_row":
            ins.append(b.weight((1, dk), scale=0.5))
        elif form == "gemm_full":
            ins.append(b.weight((s[0], dk), scale=0.5))
        elif form == "gemm_scalar":
            ins.append(b.weight((), scale=0.5) if b.chance(0.5) else b.weight((1,), scale=0.5))
        elif form != "gemm_noc":
            ins.append(b.weight((dk,), scale=0.5))
        alpha = beta = None
        if form == "gemm_alpha":
            alpha, beta = float(b.choice([0.5, 2.0, 0.25])), float(b.choice([1.0, 0.5, 2.0]))
        return b.op("Gemm", ins, out, transB=1 if tb else (0 if b.chance(0.2) else None), alpha=alpha, beta=beta)
    mm = b.op("MatMul", [x, b.weight((d, dk), scale=1 / math.sqrt(d))], out)
    if form == "matmul":
        return mm
    bias = b.weight((1, dk) if form == "matmul_add_row" else (dk,), scale=0.5)
    return b.op("Add", [bias, mm] if form == "add_matmul" else [mm, bias], out)


def conv(b: Builder, x: str, cout: int, k: int, stride: int = 1, pad: str = "same", group: int = 1,
         bias: bool = True, dilation: int = 1) -> str:
    n, c, h, w = b.shape[x]
    ext = dilation * (k - 1)
    if pad == "same":
        pads = [ext // 2, ext // 2, ext - ext // 2, ext - ext // 2]
    elif pad == "asym":
        pads = [0, 0, 1, 1] if ext else [0, 0, 0, 0]
    elif pad == "big":
        pads = [ext, ext, ext, ext]
    else:
        pads = [0, 0, 0, 0]
    ho = (h + pads[0] + pads[2] - ext - 1) // stride + 1
    wo = (w + pads[1] + pads[3] - ext - 1) // stride + 1
    if ho < 1 or wo < 1:
        return conv(b, x, cout, 1, stride, "valid", group, bias)
    wt = b.weight((cout, c // group, k, k))
    ins = [x, wt] + ([b.weight((cout,), scale=0.5)] if bias else [""] if b.chance(0.05) else [])
    attrs = dict(
        kernel_shape=[k, k] if b.chance(0.7) else None,
        pads=pads if any(pads) or b.chance(0.3) else None,
        strides=[stride, stride] if stride != 1 or b.chance(0.3) else None,
        group=group if group != 1 or b.chance(0.2) else None,
        dilations=[dilation, dilation] if dilation != 1 or b.chance(0.1) else None)
    return b.op("Conv", ins, (n, cout, ho, wo), **attrs)


def batchnorm(b: Builder, x: str) -> str:
    c = b.shape[x][1]
    sign = b.rng.choice([-1.0, 1.0], c) if b.chance(0.3) else np.ones(c)
    scale = b.weight((c,), values=sign * b.rng.uniform(0.5, 1.5, c), const=True, prefix="bn_s")
    bias = b.weight((c,), scale=0.3, prefix="bn_b")
    mean = b.weight((c,), scale=0.3, prefix="bn_m")
    var = b.weight((c,), values=b.rng.uniform(0.5, 2.0, c) if b.chance(0.85) else b.rng.uniform(0.01, 0.1, c),
                   const=True, prefix="bn_v")
    eps = None if b.chance(0.6) else float(b.choice([1e-3, 1e-5, 0.1]))
    return b.op("BatchNormalization", [x, scale, bias, mean, var], b.shape[x], epsilon=eps)


def split(b: Builder, x: str, axis: int, pieces: int, equal: Optional[bool] = None) -> list:
    s = b.shape[x]
    dim = s[axis]
    if equal is None:
        equal = dim % pieces == 0 and b.chance(0.5)
    if equal:
        sizes = [dim // pieces] * pieces
        ins = [x]
    else:
        cuts = sorted(b.rng.choice(np.arange(1, dim), pieces - 1, replace=False).tolist())
        sizes = [e - a for a, e in zip([0] + cuts, cuts + [dim])]
        ins = [x, b.i64(sizes)]
    shapes = [s[:axis] + (z,) + s[axis + 1:] for z in sizes]
    ax = axis if b.chance(0.7) else axis - len(s)
    return b.node("Split", ins, shapes, axis=ax)


def concat(b: Builder, xs: list, axis: int) -> str:
    s = list(b.shape[xs[0]])
    s[axis] = sum(b.shape[x][axis] for x in xs)
    ax = axis if b.chance(0.7) else axis - len(s)
    return b.op("Concat", xs, tuple(s), axis=ax)


def reshape(b: Builder, x: str, shape, exporter: Optional[bool] = None) -> str:
    """Reshape to ``shape``: a constant target (sometimes with -1 or 0 entries) or, exporter-style, a
    target computed from ``Shape`` of ``x`` (``Shape -> Gather -> Unsqueeze -> Concat``)."""
    s = b.shape[x]
    shape = tuple(int(d) for d in shape)
    if exporter is None:
        exporter = b.chance(0.3)
    if exporter and len(s) >= 1 and len(shape) >= 2 and shape[0] == s[0]:
        shp = b.node("Shape", [x], 1, pool=False)[0]
        lead = b.node("Gather", [shp, b.i64(0, scalar=True)], 1, pool=False, axis=0)[0]
        lead = b.node("Unsqueeze", [lead, b.i64([0])], 1, pool=False)[0]
        rest = list(shape[1:])
        if b.chance(0.5):
            rest[int(b.rng.integers(len(rest)))] = -1
        target = b.node("Concat", [lead, b.i64(rest)], 1, pool=False, axis=0)[0]
    elif exporter and len(s) >= 2 and len(shape) > 2 and shape[:2] == s[:2]:
        shp = b.node("Shape", [x], 1, pool=False, start=0, end=2)[0]
        target = b.node("Concat", [shp, b.i64(list(shape[2:]))], 1, pool=False, axis=0)[0]
    else:
        t = list(shape)
        if b.chance(0.3):
            t[int(b.rng.integers(len(t)))] = -1
        elif b.chance(0.2):  # 0 copies the input's dimension
            for i in range(min(len(t), len(s))):
                if t[i] == s[i]:
                    t[i] = 0
                    break
        target = b.i64(t)
    return b.op("Reshape", [x, target], shape)


def transpose(b: Builder, x: str, perm) -> str:
    s = b.shape[x]
    return b.op("Transpose", [x], tuple(s[p] for p in perm), perm=list(perm))


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------------------------------
# motifs: each takes the builder and returns False when it cannot apply (nothing added)
# ------------------------------------------------------------------------------------------------------

def m_conv_block(b: Builder) -> bool:
    x = b.pick_rank(4)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    kind = b.choice(["plain", "depthwise", "grouped"], [6, 2, 1.5])
    group = 1
    if kind == "depthwise":
        group, cout = c, c * int(b.choice([1, 1, 2]))
    elif kind == "grouped" and len(divisors(c)) > 2:
        group = int(b.choice([d for d in divisors(c) if 1 < d < c]))
        cout = group * int(b.choice([1, 2, 3]))
    else:
        cout = int(b.choice([4, 6, 8, 12, 16]))
    k = int(b.choice([1, 3, 5], [3.5, 4.5, 2]))
    stride = 2 if b.chance(0.25) and min(h, w) >= 4 else 1
    pad = b.choice(["same", "valid", "asym", "big"], [7, 2, 1, 0.3])
    dil = 2 if k == 3 and b.chance(0.05) else 1
    y = conv(b, x, cout, k, stride, pad, group, bias=b.chance(0.6), dilation=dil)
    if b.chance(0.35):
        y = batchnorm(b, y)
    act = b.choice(["Relu", "Clip06", None, "Sigmoid", "Tanh", "LeakyRelu"], [45, 15, 25, 5, 5, 5])
    if act == "Clip06" and b.chance(0.3):  # Clip(Relu(conv)) as some exports write ReLU6
        y = activation(b, y, "Relu")
    if act:
        y = activation(b, y, act)
    if b.chance(0.07):  # a batchnorm that follows no convolution
        batchnorm(b, y)
    return True


def m_sibling_convs(b: Builder) -> bool:
    x = b.pick_rank(4)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    same_cout = b.chance(0.6)
    cout0 = int(b.choice([4, 8, 12, 16]))
    ys = []
    for _ in range(int(b.choice([2, 3], [3, 1]))):
        k = int(b.choice([1, 3, 5], [4, 4, 1]))
        cout = cout0 if same_cout else int(b.choice([4, 8, 12, 16]))
        y = conv(b, x, cout, k, 1, "same", 1, bias=b.chance(0.5))
        if b.chance(0.6):
            y = activation(b, y, "Relu")
        ys.append(y)
    how = b.choice(["concat", "add", "apart"], [4, 3 if same_cout else 0, 3])
    if how == "concat":
        concat(b, ys, 1)
    elif how == "add":
        acc = ys[0]
        for y in ys[1:]:
            acc = b.op("Add", [acc, y], b.shape[y])
        if b.chance(0.5):
            activation(b, acc, "Relu")
    return True


def m_shared_conv_weight(b: Builder) -> bool:
    """One convolution weight used by two convolutions (of different inputs, or with different strides or
    activations), and a convolution of a batch concatenation."""
    x = b.pick_rank(4)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    cout, k = int(b.choice([4, 8])), int(b.choice([1, 3]))
    wt = b.weight((cout, c, k, k))
    p = k // 2
    y = b.pick(lambda t: len(t) == 4 and t[1] == c and t != b.shape[x]) if b.chance(0.5) else None
    if y is None and b.chance(0.5):
        y = b.op("Concat", [x, activation(b, x, "Relu")], (2 * n, c, h, w), axis=0)
    for v, stride in ((x, 1), (y if y is not None else x, 2 if y is None and min(h, w) >= 2 else 1)):
        t = b.shape[v]
        ho, wo = (t[2] + 2 * p - k) // stride + 1, (t[3] + 2 * p - k) // stride + 1
        o = b.op("Conv", [v, wt], (t[0], cout, ho, wo), pads=[p] * 4, strides=[stride, stride], kernel_shape=[k, k])
        if b.chance(0.5):
            activation(b, o, "Relu")
    return True


def m_residual(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) == 4 and s[1] <= 16)
    if x is None:
        return False
    c = b.shape[x][1]
    y = conv(b, x, c, int(b.choice([1, 3])), 1, "same", bias=b.chance(0.5))
    if b.chance(0.5):
        y = batchnorm(b, y)
    y = activation(b, y, "Relu")
    y = conv(b, y, c, 3, 1, "same", bias=b.chance(0.5))
    if b.chance(0.5):
        y = batchnorm(b, y)
    z = b.op("Add", [x, y] if b.chance(0.5) else [y, x], b.shape[x])
    activation(b, z, "Relu")
    return True


def m_pool(b: Builder) -> bool:
    x = b.pick_rank(4)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    kind = b.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"], [4, 3, 2, 0.5])
    if kind.startswith("Global"):
        b.op(kind, [x], (n, c, 1, 1))
        return True
    k = int(b.choice([2, 3]))
    if min(h, w) < k:
        k = 1
    stride = int(b.choice([1, 2])) if k > 1 else 1
    p = 1 if k == 3 and b.chance(0.5) else 0
    ho, wo = (h + 2 * p - k) // stride + 1, (w + 2 * p - k) // stride + 1
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride] if stride != 1 or b.chance(0.3) else None,
                 pads=[p] * 4 if p or b.chance(0.2) else None)
    if kind == "AveragePool" and p and b.chance(0.5):
        attrs["count_include_pad"] = 1
    b.op(kind, [x], (n, c, ho, wo), **attrs)
    return True


def m_split_concat(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 2 and max(s) >= 2)
    if x is None:
        return False
    s = b.shape[x]
    axes = [a for a in range(len(s)) if s[a] >= 2]
    if len(s) == 4 and 1 in axes and b.chance(0.5):
        axis = 1
    else:
        axis = int(b.choice(axes))
    pieces = int(b.rng.integers(2, min(4, s[axis]) + 1))
    parts = split(b, x, axis, pieces)
    if len(s) == 4 and axis == 1 and b.chance(0.2):  # the same tensor split twice, differently
        if s[axis] >= 3:
            split(b, x, axis, 3 if pieces == 2 else 2)
    out = []
    for p in parts:
        if b.chance(0.35):
            r = b.rng.random()
            if r < 0.5:
                p = activation(b, p)
            elif r < 0.75 or len(s) != 4 or axis != 1:
                p = b.op("Mul", [p, b.scalar(float(b.choice([0.5, 2.0, -1.5])))], b.shape[p])
            else:
                p = conv(b, p, b.shape[p][1], 1, 1, "same", bias=b.chance(0.5))
        out.append(p)
    how = b.choice(["back", "permuted", "apart", "other_axis"], [5, 2, 2, 2])
    if how in ("back", "permuted"):
        if how == "permuted":
            out = [out[i] for i in b.rng.permutation(len(out))]
        concat(b, out, axis)
    elif how == "other_axis" and len({b.shape[p] for p in out}) == 1:
        concat(b, out, int(b.choice([a for a in range(len(s)) if a != axis])))
    return True


def m_elementwise(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 1 and int(np.prod(s)) <= 1 << 14)
    if x is None:
        return False
    s = b.shape[x]
    op = b.choice(["Add", "Mul", "Sub", "Div"], [4, 4, 2, 2])
    forms = ["scalar", "scalar1", "last", "full", "other"]
    weights = [4, 1, 2, 1, 2 if op != "Div" else 0]
    if len(s) == 4:
        forms.append("channel")
        weights.append(2)
    form = b.choice(forms, weights)
    if form == "other":
        y = b.pick(lambda t: t == s)
        if y is None or y == x:
            form = "scalar"
    if op == "Div":
        if form in ("scalar", "scalar1"):
            v = float(b.choice([2.0, 8.0, 0.5, 3.0, -1.5, math.sqrt(b.shape[x][-1])]))
            y = b.scalar(v, () if form == "scalar" else (1,))
        else:
            shape = {"last": (s[-1],), "full": s, "channel": (s[1] if len(s) == 4 else 1, 1, 1)}[form]
            vals = b.rng.uniform(0.5, 2.0, shape) * b.rng.choice([-1.0, 1.0], shape)
            y = b.weight(shape, values=vals, const=True, prefix="d")
        b.op("Div", [x, y], s)
        return True
    if form in ("scalar", "scalar1"):
        y = b.scalar(float(b.choice([0.5, 2.0, -1.0, 0.125, 1.7])), () if form == "scalar" else (1,))
    elif form == "last":
        y = b.weight((s[-1],), scale=0.5)
    elif form == "full":
        y = b.weight(s[1:] if len(s) > 1 and b.chance(0.5) else s, scale=0.5)
    elif form == "channel":
        y = b.weight((s[1], 1, 1) if b.chance(0.7) else (1, s[1], 1, 1), scale=0.5)
    ins = [x, y] if b.chance(0.6) else [y, x]
    out = b.op(op, ins, s)
    if b.chance(0.3):
        activation(b, out)
    return True


def m_unary(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) >= 1)
    if x is None:
        return False
    y = activation(b, x)
    if b.chance(0.3):
        activation(b, y)
    return True


def m_flatten(b: Builder) -> bool:
    """4-D to 2-D (and on to a classifier): Flatten, a Reshape, or global pooling first."""
    x = b.pick(lambda s: len(s) == 4 and int(np.prod(s[1:])) <= 4096)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    how = b.choice(["flatten", "reshape", "gap"], [3, 3, 3])
    if how == "gap":
        x = b.op("GlobalAveragePool", [x], (n, c, 1, 1))
        h = w = 1
    if how == "reshape":
        y = reshape(b, x, (n, c * h * w))
    else:
        y = b.op("Flatten", [x], (n, c * h * w), axis=1 if b.chance(0.6) else None)
    if b.chance(0.7):
        linear(b, y, int(b.choice([4, 10, 16])))
    return True


def m_to_sequence(b: Builder) -> bool:
    """``[N, C, H, W]`` to tokens ``[N, H*W, C]`` (patch embedding), for the sequence motifs."""
    x = b.pick(lambda s: len(s) == 4 and s[2] * s[3] <= 64)
    if x is None:
        return False
    n, c, h, w = b.shape[x]
    y = reshape(b, x, (n, c, h * w))
    transpose(b, y, (0, 2, 1))
    return True


def m_layout(b: Builder) -> bool:
    """Transpose/reshape chains: NCHW -> NHWC and back with an op between, a [B, S, D] -> [B*S, D]
    round trip, a swap of the last two axes."""
    x = b.pick(lambda s: len(s) >= 2 and int(np.prod(s)) <= 1 << 14)
    if x is None:
        return False
    s = b.shape[x]
    r = len(s)
    if r == 4 and b.chance(0.6):
        y = transpose(b, x, (0, 2, 3, 1))
        if b.chance(0.6):
            y = activation(b, y) if b.chance(0.5) else b.op("Mul", [y, b.weight((s[1],), scale=0.5)], b.shape[y])
        transpose(b, y, (0, 3, 1, 2))
        return True
    if r == 3 and b.chance(0.6):
        y = reshape(b, x, (s[0] * s[1], s[2]))
        if b.chance(0.7):
            y = linear(b, y, int(b.choice([s[2], 8, 16])))
        else:
            y = activation(b, y)
        reshape(b, y, (s[0], s[1], b.shape[y][1]))
        return True
    if b.chance(0.3):  # Unsqueeze / Squeeze / Flatten, which are reshapes between static shapes
        axis = int(b.rng.integers(r + 1))
        y = b.op("Unsqueeze", [x, b.i64([axis])], s[:axis] + (1,) + s[axis:])
        if b.chance(0.5):
            y = activation(b, y)
        if b.chance(0.5):
            b.op("Squeeze", [y] if 1 not in s and b.chance(0.3) else [y, b.i64([axis])], s)
        else:
            f = int(b.rng.integers(1, r + 1))
            t = b.shape[y]
            b.op("Flatten", [y], (int(np.prod(t[:f])), int(np.prod(t[f:]))), axis=f)
        return True
    perm = list(range(r))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    if r > 2 and b.chance(0.3):
        perm = [int(p) for p in b.rng.permutation(r)]
    y = transpose(b, x, perm)
    if b.chance(0.5):
        y = activation(b, y)
    if b.chance(0.5):
        inv = [perm.index(i) for i in range(r)]
        transpose(b, y, inv)
    elif b.chance(0.5) and r >= 3:
        t = b.shape[y]
        reshape(b, y, (t[0], int(np.prod(t[1:]))))
    return True


def m_projections(b: Builder) -> bool:
    """Q/K/V-style sibling projections of one 2-D or 3-D input (mergeable when their widths agree)."""
    x = b.pick(lambda s: len(s) in (2, 3) and s[-1] <= 64)
    if x is None:
        return False
    d = b.shape[x][-1]
    same = b.chance(0.7)
    dk0 = int(b.choice([d, 8, 16, 24]))
    form = b.choice([None, "matmul", "matmul_add"], [3, 2, 2]) if b.chance(0.5) else None
    for _ in range(int(b.choice([2, 3, 4], [3, 4, 1]))):
        y = linear(b, x, dk0 if same else int(b.choice([8, 16, d])), form)
        if b.chance(0.25):
            activation(b, y)
    return True


def m_nested_projections(b: Builder) -> bool:
    """A projection whose output feeds further projections: ``a = x@Wa; b = x@Wb; c = a@Wc; d = a@Wd``
    (deeper: ``e = c@We; f = c@Wf``), mostly on ``[B, S, D]``; sometimes both branches nest, sometimes
    with biases."""
    x = b.pick(lambda s: len(s) == 3 and s[-1] <= 64) if b.chance(0.85) else None
    if x is None:
        x = b.pick(lambda s: len(s) in (2, 3) and s[-1] <= 64)
    if x is None:
        return False
    depth = int(b.choice([2, 3, 4], [6, 3, 1]))
    bias_p = b.choice([0.0, 0.3, 0.7], [5, 3, 2])
    width = b.chance(0.7)
    level = [x]
    for _ in range(depth):
        nxt = []
        feeders = level[:1] if not b.chance(0.3) else level
        for v in feeders:
            d = b.shape[v][-1]
            dk = d if width else int(b.choice([8, 16, 32]))
            for _ in range(int(b.choice([2, 3], [4, 1]))):
                y = linear(b, v, dk, ("matmul_add" if b.chance(0.5) else "add_matmul") if b.chance(bias_p)
                           else "matmul")
                if b.chance(0.1):
                    y = activation(b, y, "Relu")
                nxt.append(y)
        level = nxt
    return True


def m_attention(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) == 3 and s[-1] % 2 == 0 and s[-1] <= 64 and s[1] <= 32)
    if x is None:
        return False
    bs, sq, d = b.shape[x]
    heads = int(b.choice([h for h in (1, 2, 4) if d % h == 0]))
    dh = d // heads
    packed = b.chance(0.25)
    if packed and b.chance(0.5):  # torch's unbind: [B, S, 3, D] and a Gather at each index of axis 2
        qkv = linear(b, x, 3 * d, b.choice(["matmul", "matmul_add"]))
        qkv = reshape(b, qkv, (bs, sq, 3, d))
        q, k, v = (b.op("Gather", [qkv, b.i64(i, scalar=True)], (bs, sq, d), pool=False, axis=2) for i in range(3))
    elif packed:
        qkv = linear(b, x, 3 * d, b.choice(["matmul", "matmul_add"]))
        q, k, v = split(b, qkv, 2, 3, equal=True)
    else:
        form = b.choice([None, "matmul", "matmul_add"])
        q, k, v = (linear(b, x, d, form) for _ in range(3))
    scale_mode = b.choice(["mul_scores", "div_scores", "qk", "none"], [3, 3, 1, 1])
    if scale_mode == "qk":
        f = dh ** -0.25
        q = b.op("Mul", [q, b.scalar(f)], b.shape[q])
        k = b.op("Mul", [k, b.scalar(f)], b.shape[k])
    if heads == 1 and b.chance(0.5):
        kt = transpose(b, k, (0, 2, 1))
        scores = b.op("MatMul", [q, kt], (bs, sq, sq))
    else:
        def heads_of(t, perm):
            r = reshape(b, t, (bs, sq, heads, dh))
            return transpose(b, r, perm)
        q = heads_of(q, (0, 2, 1, 3))
        kt = heads_of(k, (0, 2, 3, 1))
        v = heads_of(v, (0, 2, 1, 3))
        scores = b.op("MatMul", [q, kt], (bs, heads, sq, sq))
    if scale_mode == "mul_scores":
        scores = b.op("Mul", [scores, b.scalar(1 / math.sqrt(dh))], b.shape[scores])
    elif scale_mode == "div_scores":
        scores = b.op("Div", [scores, b.scalar(math.sqrt(dh))], b.shape[scores])
    if b.chance(0.2):  # an additive mask
        scores = b.op("Add", [scores, b.weight((sq, sq), scale=1.0, const=True)], b.shape[scores])
    p = b.op("Softmax", [scores], b.shape[scores], axis=-1 if b.chance(0.7) else len(b.shape[scores]) - 1)
    ctx = b.op("MatMul", [p, v], b.shape[scores][:-1] + (b.shape[v][-1],))
    if len(b.shape[ctx]) == 4:
        ctx = transpose(b, ctx, (0, 2, 1, 3))
        ctx = reshape(b, ctx, (bs, sq, d))
    if b.chance(0.7):
        o = linear(b, ctx, d)
        if b.chance(0.6):
            b.op("Add", [x, o], (bs, sq, d))
    return True


def m_ffn(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) in (2, 3) and s[-1] <= 64)
    if x is None:
        return False
    d = b.shape[x][-1]
    h = linear(b, x, int(b.choice([d, 2 * d, 16])))
    kind = b.choice(["Relu", "gelu", "Sigmoid", "Tanh"], [3, 3, 1, 1])
    if kind == "gelu":  # as exporters write GELU: 0.5 * x * (1 + erf(x / sqrt(2)))
        e = b.op("Erf", [b.op("Div", [h, b.scalar(math.sqrt(2.0))], b.shape[h])], b.shape[h])
        e = b.op("Add", [e, b.scalar(1.0)], b.shape[h])
        h = b.op("Mul", [b.op("Mul", [h, e], b.shape[h]), b.scalar(0.5)], b.shape[h])
    else:
        h = activation(b, h, kind)
    y = linear(b, h, d)
    if b.chance(0.6):
        b.op("Add", [y, x] if b.chance(0.5) else [x, y], b.shape[x])
    return True


def m_norm(b: Builder) -> bool:
    """LayerNormalization (an op the optimizer does not know) or its decomposition with ReduceMean."""
    x = b.pick(lambda s: len(s) >= 2 and s[-1] >= 2)
    if x is None:
        return False
    s = b.shape[x]
    d = s[-1]
    if b.chance(0.5):
        ins = [x, b.weight((d,), values=b.rng.uniform(0.5, 1.5, d)), b.weight((d,), scale=0.3)]
        if b.chance(0.2):
            ins = ins[:2]
        b.op("LayerNormalization", ins, s, axis=-1, epsilon=1e-5 if b.chance(0.5) else None)
        return True
    red = s[:-1] + (1,)
    mean = b.op("ReduceMean", [x], red, axes=[-1])
    diff = b.op("Sub", [x, mean], s)
    var = b.op("ReduceMean", [b.op("Mul", [diff, diff], s)], red, axes=[-1])
    std = b.op("Sqrt", [b.op("Add", [var, b.scalar(1e-5)], red)], red)
    y = b.op("Div", [diff, std], s)
    y = b.op("Mul", [y, b.weight((d,), values=b.rng.uniform(0.5, 1.5, d))], s)
    b.op("Add", [y, b.weight((d,), scale=0.3)], s)
    return True


def m_unknown(b: Builder) -> bool:
    """Ops the optimizer does not know, in the middle of the graph (they must pass through)."""
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return False
    s = b.shape[x]
    kinds = ["Erf", "Softplus", "HardSigmoid", "Neg", "Abs", "ReduceMean", "Softmax", "LeakyRelu", "Slice", "Pad",
             "Expand", "Tile", "Dropout", "Where", "ShapeOutput"]
    if len(s) == 4:
        kinds += ["InstanceNormalization", "LRN", "Resize"]
    if len(s) == 3 and s[-1] <= 32:
        kinds += ["LSTM", "LayerNormStats"]
    kind = b.choice(kinds)
    if kind == "ShapeOutput":  # an integer graph output (a constant once shapes are static)
        name = b.node("Shape" if b.chance(0.7) else "Size", [x], 1, pool=False)[0]
        b.int_outputs.append((name, (len(s),) if b.nodes[-1].op_type == "Shape" else ()))
        return True
    if kind == "Resize":  # nearest upsampling by 2, roi and sizes left out ("")
        n, c, h, w = s
        scales = b.weight((4,), values=np.array([1, 1, 2, 2]), const=True, prefix="scales")
        y = b.op("Resize", [x, "", scales], (n, c, 2 * h, 2 * w), mode="nearest")
        activation(b, y, "Relu")
        return True
    if kind == "LSTM":  # ONNX's LSTM op on [seq, batch, input], optional inputs and outputs left out
        sq, bt, d = s
        hd = int(b.choice([4, 8]))
        ins = [x, b.weight((1, 4 * hd, d)), b.weight((1, 4 * hd, hd))]
        if b.chance(0.5):
            ins += [b.weight((1, 8 * hd), scale=0.3)]
            if b.chance(0.5):
                ins += ["", b.weight((1, bt, hd), scale=0.5)]  # no sequence_lens, an initial h
        outs = b.node("LSTM", ins, [(sq, 1, bt, hd), (1, bt, hd)], pool=False, hidden_size=hd)
        if b.chance(0.5):  # only Y_h is read: Y is left out
            b.nodes[-1].output[0] = ""
            b.pool.append(outs[1])
        else:
            y = b.op("Squeeze", [outs[0], b.i64([1])], (sq, bt, hd))
            if b.chance(0.5):
                linear(b, y, hd, "matmul")
        return True
    if kind == "LayerNormStats":  # LayerNormalization with its optional Mean output read
        y, mean = b.node("LayerNormalization", [x, b.weight((s[-1],), values=b.rng.uniform(0.5, 1.5, s[-1]))],
                         [s, s[:-1] + (1,)], pool=False, axis=-1)
        b.pool.append(y)
        b.op("Add", [y, mean], s)
        return True
    if kind in ("Slice", "Pad", "Expand", "Tile", "Dropout", "Where"):
        axis = int(b.rng.integers(len(s)))
        if kind == "Slice" and s[axis] >= 2:
            start = int(b.rng.integers(0, s[axis] - 1))
            end = int(b.rng.integers(start + 1, s[axis] + 1))
            out = tuple(end - start if i == axis else d for i, d in enumerate(s))
            y = b.op("Slice", [x, b.i64([start]), b.i64([end]), b.i64([axis])], out)
        elif kind == "Pad":
            pads = [0] * (2 * len(s))
            pads[axis], pads[len(s) + axis] = 1, int(b.rng.integers(0, 2))
            out = tuple(d + pads[i] + pads[len(s) + i] for i, d in enumerate(s))
            mode = None if b.chance(0.7) else "reflect" if min(s) >= 2 else None
            cval = [] if b.chance(0.5) or mode else [b.scalar(0.5)] if b.chance(0.5) else [""]
            y = b.op("Pad", [x, b.i64(pads)] + cval, out, mode=mode)
        elif kind == "Expand":
            out = (2,) + s
            y = b.op("Expand", [x, b.i64(list(out))], out)
        elif kind == "Tile":
            reps = [1] * len(s)
            reps[axis] = 2
            y = b.op("Tile", [x, b.i64(reps)], tuple(d * r for d, r in zip(s, reps)))
        elif kind == "Dropout":  # inference: the identity, sometimes with its mask output (unread)
            if b.chance(0.5):
                y = b.node("Dropout", [x], [s, s], pool=False)[0]
                b.pool.append(y)
            else:
                y = b.op("Dropout", [x], s)
        elif kind == "Where":  # a fixed boolean mask, as attention masks are built
            mask = numpy_helper.from_array(b.rng.random(s[-2:] if len(s) >= 2 else s) < 0.7, b.fresh("mask"))
            b.inits.append(mask)
            y = b.op("Where", [mask.name, x, b.scalar(-3.0)], s)
        else:
            y = b.op("Neg", [x], s)
        if b.chance(0.5):
            activation(b, y, "Relu")
        return True
    if kind == "ReduceMean":
        axis = int(b.rng.integers(len(s)))
        keep = b.chance(0.7)
        red = tuple(1 if i == axis else d for i, d in enumerate(s)) if keep else s[:axis] + s[axis + 1:]
        y = b.op("ReduceMean", [x], red, axes=[axis], keepdims=None if keep else 0)
        if keep and b.chance(0.6):
            b.op("Sub", [x, y], s)
        return True
    if kind == "InstanceNormalization":
        c = s[1]
        y = b.op(kind, [x, b.weight((c,), values=b.rng.uniform(0.5, 1.5, c)), b.weight((c,), scale=0.3)], s)
    elif kind == "LRN":
        y = b.op(kind, [x], s, size=3)
    elif kind == "Softmax":
        y = b.op(kind, [x], s, axis=int(b.rng.integers(len(s))))
    else:
        y = activation(b, x, kind) if kind in ("Erf", "LeakyRelu", "HardSigmoid") else b.op(kind, [x], s)
    if b.chance(0.5):
        activation(b, y, "Relu")
    return True


def m_shape_arith(b: Builder) -> bool:
    """Exporter-style shape arithmetic feeding a Reshape: heads split off ``[B, S, D]`` with the sizes
    taken from ``Shape`` (``Gather``, ``Div``, ``Unsqueeze``, ``Concat``), then merged back."""
    x = b.pick(lambda s: len(s) == 3 and s[-1] % 2 == 0)
    if x is None:
        return False
    bs, sq, d = b.shape[x]
    heads = int(b.choice([h for h in (2, 4) if d % h == 0]))
    shp = b.node("Shape", [x], 1, pool=False)[0]
    parts = []
    for i in (0, 1):
        g = b.node("Gather", [shp, b.i64(i, scalar=True)], 1, pool=False, axis=0)[0]
        parts.append(b.node("Unsqueeze", [g, b.i64([0])], 1, pool=False)[0])
    if b.chance(0.5):  # head size as D / heads, computed
        dd = b.node("Gather", [shp, b.i64(2, scalar=True)], 1, pool=False, axis=0)[0]
        dd = b.node("Div", [dd, b.i64(heads, scalar=True)], 1, pool=False)[0]
        dh = b.node("Unsqueeze", [dd, b.i64([0])], 1, pool=False)[0]
        target = b.node("Concat", parts + [b.i64([heads]), dh], 1, pool=False, axis=0)[0]
    else:
        target = b.node("Concat", parts + [b.i64([heads, d // heads])], 1, pool=False, axis=0)[0]
    y = b.op("Reshape", [x, target], (bs, sq, heads, d // heads))
    y = transpose(b, y, (0, 2, 1, 3))
    if b.chance(0.5):
        y = activation(b, y)
    y = transpose(b, y, (0, 2, 1, 3))
    back = b.node("Concat", parts + [b.i64([-1])], 1, pool=False, axis=0)[0]
    b.op("Reshape", [y, back], (bs, sq, d))
    return True


def m_token_mixing(b: Builder) -> bool:
    """MLP-Mixer style: a projection along the sequence axis (transpose, matmul, transpose back)."""
    x = b.pick(lambda s: len(s) == 3 and s[1] <= 32)
    if x is None:
        return False
    bs, sq, d = b.shape[x]
    t = transpose(b, x, (0, 2, 1))
    y = linear(b, t, sq, b.choice(["matmul", "matmul_add"]))
    if b.chance(0.5):
        y = activation(b, y)
    transpose(b, y, (0, 2, 1))
    return True


def m_two_activations(b: Builder) -> bool:
    """A matmul of two activations (``x @ y^T``), as attention scores are."""
    x = b.pick(lambda s: len(s) in (2, 3) and s[-2] <= 32)
    if x is None:
        return False
    s = b.shape[x]
    y = b.pick(lambda t: t == s) if b.chance(0.5) else None
    if y is None:
        y = linear(b, x, s[-1], "matmul")
    perm = (1, 0) if len(s) == 2 else (0, 2, 1)
    _product(b, b.op("MatMul", [x, transpose(b, y, perm)], s[:-1] + (s[-2],)))
    return True


def _product(b: Builder, y: str) -> None:
    """Count a product of activations; after two, squash it (Tanh) so that chains of them stay finite."""
    b.products += 1
    if b.products > 2:
        b.pool.remove(y)
        b.op("Tanh", [y], b.shape[y])


def m_lstm(b: Builder) -> bool:
    """An LSTM cell from matmuls: four gates, either four pairs of matmuls or one shared matmul split
    in four; unrolled one or two steps with the same weights."""
    x = b.pick(lambda s: len(s) == 2 and s[-1] <= 64)
    if x is None:
        return False
    n, d = b.shape[x]
    hd = int(b.choice([4, 8, 16]))
    h = b.input((n, hd), "h")
    c = b.input((n, hd), "c")
    shared = b.chance(0.5)
    if shared:
        wx, wh = b.weight((d, 4 * hd)), b.weight((hd, 4 * hd))
        bias = b.weight((4 * hd,), scale=0.3) if b.chance(0.6) else None
    else:
        wx = [b.weight((d, hd)) for _ in range(4)]
        wh = [b.weight((hd, hd)) for _ in range(4)]
        bias = [b.weight((hd,), scale=0.3) for _ in range(4)] if b.chance(0.6) else None
    xs = [x]
    if b.chance(0.4):
        xs.append(b.input((n, d), "x"))
    for xt in xs:
        if shared:
            z = b.op("Add", [b.op("MatMul", [xt, wx], (n, 4 * hd)), b.op("MatMul", [h, wh], (n, 4 * hd))],
                     (n, 4 * hd))
            if bias:
                z = b.op("Add", [z, bias], (n, 4 * hd))
            gates = b.node("Split", [z], [(n, hd)] * 4, pool=False, axis=1)
        else:
            gates = []
            for i in range(4):
                z = b.op("Add", [b.op("MatMul", [xt, wx[i]], (n, hd), pool=False),
                                 b.op("MatMul", [h, wh[i]], (n, hd), pool=False)], (n, hd), pool=False)
                if bias:
                    z = b.op("Add", [z, bias[i]], (n, hd), pool=False)
                gates.append(z)
        i_g, f_g, o_g = (b.op("Sigmoid", [g], (n, hd), pool=False) for g in gates[:3])
        g_g = b.op("Tanh", [gates[3]], (n, hd), pool=False)
        c = b.op("Add", [b.op("Mul", [f_g, c], (n, hd), pool=False), b.op("Mul", [i_g, g_g], (n, hd), pool=False)],
                 (n, hd))
        h = b.op("Mul", [o_g, b.op("Tanh", [c], (n, hd), pool=False)], (n, hd))
    return True


def m_nasrnn(b: Builder) -> bool:
    """A NasRNN-style cell (TASO's benchmark): eight ``x@W_i + h@U_i`` with sigmoid/relu/tanh, combined
    by products and sums."""
    x = b.pick(lambda s: len(s) == 2 and s[-1] <= 64)
    if x is None:
        return False
    n, d = b.shape[x]
    hd = int(b.choice([8, 16]))
    h = b.input((n, hd), "h")
    mids = []
    for i in range(8):
        m = b.op("Add", [b.op("MatMul", [x, b.weight((d, hd))], (n, hd), pool=False),
                         b.op("MatMul", [h, b.weight((hd, hd))], (n, hd), pool=False)], (n, hd), pool=False)
        act = ["Sigmoid", "Relu", "Sigmoid", "Sigmoid", "Tanh", "Sigmoid", "Tanh", "Sigmoid"][i]
        mids.append(b.op(act, [m], (n, hd), pool=False))
    s = (n, hd)
    t0 = b.op("Mul", [mids[0], mids[1]], s, pool=False)
    t1 = b.op("Add", [mids[2], mids[3]], s, pool=False)
    t2 = b.op("Mul", [mids[4], mids[5]], s, pool=False)
    t3 = b.op("Add", [mids[6], mids[7]], s, pool=False)
    u0 = b.op("Tanh", [t0], s, pool=False)
    u1 = b.op("Sigmoid", [t1], s, pool=False)
    u2 = b.op("Tanh", [t2], s, pool=False)
    u3 = b.op("Sigmoid", [t3], s, pool=False)
    v0 = b.op("Mul", [u0, u1], s, pool=False)
    v1 = b.op("Add", [u2, u3], s, pool=False)
    b.op("Tanh", [b.op("Mul", [v0, v1], s, pool=False)], s)
    return True


def m_mlp(b: Builder) -> bool:
    x = b.pick(lambda s: len(s) == 2 and s[-1] <= 64)
    if x is None:
        return False
    y = x
    for _ in range(int(b.choice([1, 2, 3]))):
        y = linear(b, y, int(b.choice([8, 16, 32])))
        if b.chance(0.7):
            y = activation(b, y)
    if b.chance(0.3):
        b.op("Softmax", [y], b.shape[y], axis=-1 if b.chance(0.5) else 1)
    return True


def m_to_3d(b: Builder) -> bool:
    """``[N, D]`` to ``[1, N, D]`` or ``[N, a, b]`` (``D = a*b``), into the sequence motifs."""
    x = b.pick(lambda s: len(s) == 2)
    if x is None:
        return False
    n, d = b.shape[x]
    fs = [a for a in divisors(d) if 1 < a < d]
    if fs and b.chance(0.5):
        a = int(b.choice(fs))
        reshape(b, x, (n, a, d // a))
    elif b.chance(0.5):
        b.op("Unsqueeze", [x, b.i64([0])], (1, n, d))
    else:
        reshape(b, x, (1, n, d))
    return True


def m_embedding(b: Builder) -> bool:
    """Token ids (an int64 graph input) into an embedding table (``Gather``), plus positions: the start
    of a transformer, with an integer input the optimizer passes through."""
    x = b.pick(lambda s: len(s) == 3 and s[1] <= 32)
    bs, sq, d = b.shape[x] if x is not None else (int(b.choice([1, 2])), int(b.choice([4, 8])), 16)
    vocab = int(b.choice([5, 11, 32]))
    ids = b.index_input((bs, sq), vocab)
    table = b.weight((vocab, d), scale=1.0)
    y = b.op("Gather", [table, ids], (bs, sq, d), axis=0 if b.chance(0.3) else None)
    y = b.op("Add", [y, b.weight((sq, d), scale=0.5, const=True)], (bs, sq, d))
    if x is not None and b.chance(0.5):
        b.op("Add", [x, y], (bs, sq, d))
    return True


def m_identity(b: Builder) -> bool:
    """Identity nodes (the import removes them): on a graph input, so that an output may be an input; or
    a second name for a value that is also an output."""
    if b.chance(0.3):
        ins = [i.name for i in b.inputs if i.type.tensor_type.elem_type == FLOAT]
        if ins:
            x = ins[int(b.rng.integers(len(ins)))]
            if b.chance(0.3):  # the graph input is itself a graph output
                b.forced_outputs.append(x)
            else:
                b.op("Identity", [x], b.shape[x])
            return True
    x = b.pick(lambda s: True)
    if x is None:
        return False
    y = b.op("Identity", [x], b.shape[x])
    if b.chance(0.3):  # one value under two output names
        b.forced_outputs.append(x)
    elif b.chance(0.5):
        activation(b, y)
    return True


def m_const_branch(b: Builder) -> bool:
    """Arithmetic on weights only (folded to a constant), added to an activation or an output itself."""
    x = b.pick(lambda s: len(s) >= 1)
    if x is None:
        return False
    s = b.shape[x]
    shape = s[-1:] if b.chance(0.5) else s
    w1 = b.weight(shape, scale=0.5, const=True)
    c = b.op("Mul", [w1, b.scalar(float(b.choice([2.0, -0.5, 3.0])))], shape, pool=False)
    c = b.op(b.choice(["Add", "Sub"]), [c, b.weight(shape, scale=0.5, const=True)], shape, pool=False)
    if b.chance(0.3):
        c = b.op("Relu", [c], shape, pool=False)
    if b.chance(0.3) and shape == s:  # the constant is an output of the graph
        b.pool.append(c)
        return True
    b.op(b.choice(["Add", "Mul"]), [x, c], s)
    return True


def m_same_operand(b: Builder) -> bool:
    """One value on both sides: ``x + x``, ``x * x``, ``concat(x, x)``, ``x @ x^T``, two equal ops."""
    x = b.pick(lambda s: len(s) >= 2 and int(np.prod(s)) <= 1 << 13)
    if x is None:
        return False
    s = b.shape[x]
    kind = b.choice(["add", "mul", "concat", "mmt", "twice"])
    if kind in ("add", "mul"):
        y = b.op("Add" if kind == "add" else "Mul", [x, x], s)
        if kind == "mul":
            _product(b, y)
    elif kind == "concat":
        axis = int(b.rng.integers(len(s)))
        concat(b, [x, x], axis)
    elif kind == "mmt":
        perm = list(range(len(s)))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        _product(b, b.op("MatMul", [x, transpose(b, x, perm)], s[:-1] + (s[-2],)))
    else:  # the same op twice on the same value (merged by CSE)
        y1 = activation(b, x, "Relu")
        y2 = activation(b, x, "Relu")
        b.op("Add", [y1, y2], s)
    return True


def m_noop(b: Builder) -> bool:
    """Ops that change nothing: an identity transpose, a reshape to the same shape, relu of relu,
    multiplication by one, addition of zero."""
    x = b.pick(lambda s: len(s) >= 1)
    if x is None:
        return False
    s = b.shape[x]
    kind = b.choice(["transpose", "reshape", "relu2", "mul1", "add0"])
    if kind == "transpose":
        y = transpose(b, x, tuple(range(len(s))))
    elif kind == "reshape":
        y = reshape(b, x, s)
    elif kind == "relu2":
        y = activation(b, activation(b, x, "Relu"), "Relu")
    elif kind == "mul1":
        y = b.op("Mul", [x, b.scalar(1.0)], s)
    else:
        y = b.op("Add", [x, b.weight(s[-1:], values=np.zeros(s[-1:]))], s)
    if b.chance(0.5):
        activation(b, y)
    return True


def m_cast(b: Builder) -> bool:
    """A round trip through another float type (float16 rounds, double does not)."""
    x = b.pick(lambda s: len(s) >= 1)
    if x is None:
        return False
    s = b.shape[x]
    to = TensorProto.FLOAT16 if b.chance(0.5) else TensorProto.DOUBLE
    y = b.node("Cast", [x], 1, pool=False, to=to)[0]
    if b.chance(0.5):
        y = b.node("Relu", [y], 1, pool=False)[0]
    b.op("Cast", [y], s, to=FLOAT)
    return True


def m_matmul_variants(b: Builder) -> bool:
    """MatMuls the projections do not cover: a 4-D input by a 2-D weight, the weight on the left, a 3-D
    (batched) weight, a 1-D weight, one weight shared by two inputs, Gemm with transA."""
    x = b.pick(lambda s: len(s) >= 2 and s[-1] <= 64 and int(np.prod(s)) <= 1 << 13)
    if x is None:
        return False
    s = b.shape[x]
    d = s[-1]
    kind = b.choice(["left", "batched", "vector", "shared", "transA", "plain"], [2, 2, 1, 2, 1 if len(s) == 2 else 0, 1])
    if kind == "left":  # W @ x: mixes along the second-to-last axis
        m = int(b.choice([s[-2], 4, 8]))
        b.op("MatMul", [b.weight((m, s[-2])), x], s[:-2] + (m, d))
    elif kind == "batched" and len(s) >= 3:
        k = int(b.choice([d, 8]))
        b.op("MatMul", [x, b.weight(s[:-2] + (d, k) if b.chance(0.5) else (s[-3], d, k), scale=1 / math.sqrt(d))],
             s[:-1] + (k,))
    elif kind == "vector":
        b.op("MatMul", [x, b.weight((d,), scale=1 / math.sqrt(d))], s[:-1])
    elif kind == "shared":
        w = b.weight((d, int(b.choice([d, 8]))))
        k = b.shape[w][1]
        y = b.pick(lambda t: len(t) >= 2 and t[-1] == d)
        b.op("MatMul", [x, w], s[:-1] + (k,))
        if y is not None and y != x:
            b.op("MatMul", [y, w], b.shape[y][:-1] + (k,))
        else:
            b.op("MatMul", [activation(b, x, "Relu"), w], s[:-1] + (k,))
    elif kind == "transA":
        k = int(b.choice([4, 8]))
        t = transpose(b, x, (1, 0))  # [d, n]; Gemm(t^T, W) = x @ W
        b.op("Gemm", [t, b.weight((d, k)), b.weight((k,), scale=0.5)], (s[0], k), transA=1)
    else:
        linear(b, x, int(b.choice([d, 8])), "matmul")
    return True


def m_scalar(b: Builder) -> bool:
    """A 0-d value: the mean of a whole tensor, scaling another (broadcast of a scalar activation)."""
    x = b.pick(lambda s: len(s) >= 1)
    if x is None:
        return False
    s = b.shape[x]
    m = b.op("ReduceMean", [x], (), keepdims=0, pool=False)
    m = b.op("Sigmoid", [m], (), pool=False)
    y = b.pick(lambda t: len(t) >= 1) or x
    b.op("Mul", [y, m] if b.chance(0.5) else [m, y], b.shape[y])
    return True


def m_long_chain(b: Builder) -> bool:
    """A long chain of small ops (projections, activations, arithmetic): more ops than one search
    window holds in some models."""
    x = b.pick(lambda s: len(s) in (2, 3) and s[-1] <= 32)
    if x is None:
        return False
    y = x
    for _ in range(int(b.rng.integers(10, 40))):
        r = b.rng.random()
        d = b.shape[y][-1]
        if r < 0.3:
            y = linear(b, y, d, b.choice(["matmul", "matmul_add"]))
        elif r < 0.6:
            y = b.op("Relu", [y], b.shape[y], pool=False) if b.chance(0.6) else \
                b.op(b.choice(["Sigmoid", "Tanh"]), [y], b.shape[y], pool=False)
        elif r < 0.8:
            y = b.op(b.choice(["Add", "Mul"]), [y, b.scalar(float(b.choice([0.5, 2.0, -1.0])))], b.shape[y],
                     pool=False)
        else:
            z = linear(b, y, d, "matmul")
            y = b.op("Add", [y, z], b.shape[y], pool=False)
    b.pool.append(y)
    return True


def m_split_unused(b: Builder) -> bool:
    """A split with a piece nobody reads, and two splits of one tensor with different piece counts."""
    x = b.pick(lambda s: len(s) >= 2 and s[-1] >= 4)
    if x is None:
        return False
    s = b.shape[x]
    axis = len(s) - 1
    parts = split(b, x, axis, int(b.choice([2, 3, 4])))
    drop = parts[int(b.rng.integers(len(parts)))]
    b.pool.remove(drop)
    for p in parts:
        if p != drop and b.chance(0.5):
            activation(b, p)
    if b.chance(0.5):
        split(b, x, axis, 2 if len(parts) != 2 else 4 if s[axis] >= 4 else 3)
    return True


def m_equal_weights(b: Builder) -> bool:
    """Two weights with the same values (the optimizer merges equal constants), used by ops that differ,
    or with shapes that differ (a [n] and a [1, n] of equal values)."""
    x = b.pick(lambda s: len(s) >= 2 and s[-1] <= 64)
    if x is None:
        return False
    s = b.shape[x]
    d = s[-1]
    vals = b.rng.standard_normal((d, d)) / math.sqrt(d)
    w1 = b.weight((d, d), values=vals)
    w2 = b.weight((d, d), values=vals)
    y1 = b.op("MatMul", [x, w1], s)
    if b.chance(0.5):
        b.op("MatMul", [activation(b, x, "Relu"), w2], s)
    else:
        b.op("Add", [y1, w2 if len(s) == 2 and s[0] == d else b.weight((d,), values=vals[0])], s)
    if b.chance(0.5):  # equal values, different shapes
        v = b.rng.standard_normal(d) * 0.5
        b.op("Add", [b.op("Mul", [y1, b.weight((d,), values=v)], s, pool=False), b.weight((1, d), values=v)], s)
    return True


def m_transposed_matmul(b: Builder) -> bool:
    """``(x @ W)^T`` and ``W^T`` forms: transposes around and inside matmuls (TASO's transpose rules)."""
    x = b.pick(lambda s: len(s) in (2, 3) and s[-1] <= 64 and s[-2] <= 32)
    if x is None:
        return False
    s = b.shape[x]
    d = s[-1]
    perm = (1, 0) if len(s) == 2 else (0, 2, 1)
    k = int(b.choice([d, 8]))
    if b.chance(0.5):  # x @ transpose(W') with W' [k, d]
        wt = b.weight((k, d), scale=1 / math.sqrt(d))
        y = b.op("MatMul", [x, b.op("Transpose", [wt], (d, k), pool=False, perm=[1, 0])], s[:-1] + (k,))
    else:
        y = b.op("MatMul", [x, b.weight((d, k), scale=1 / math.sqrt(d))], s[:-1] + (k,))
    y = transpose(b, y, perm)
    if b.chance(0.5):
        y = activation(b, y, "Relu")
    if b.chance(0.5):
        transpose(b, y, perm)
    return True


def m_soup(b: Builder) -> bool:
    """A random small DAG of TASO's operators over square values ``[n, n]`` (or ``[B, n, n]``), so that any
    op can read any earlier value: matmuls of activations and weights, transposes, sums and products,
    activations, and concats split back into squares (pieces of different splits combined)."""
    x = b.pick(lambda s: len(s) in (2, 3) and s[-1] == s[-2] and s[-1] <= 16)
    if x is None:
        if b.chance(0.5):
            n = int(b.choice([1, 2, 3, 4, 8]))
            x = b.input((n, n) if b.chance(0.6) else (int(b.choice([1, 2])), n, n))
        else:
            return False
    s = b.shape[x]
    r, n = len(s), s[-1]
    vals = [x]
    last = [r - 2, r - 1]
    perm = list(range(r))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    for _ in range(int(b.rng.integers(4, 14))):
        a = vals[int(b.rng.integers(len(vals)))] if b.chance(0.5) else vals[-1]
        c = vals[int(b.rng.integers(len(vals)))]
        k = b.choice(["MatMul", "MatMulW", "WMatMul", "Transpose", "Add", "Mul", "Relu", "Sigmoid", "Tanh", "Concat",
                      "AddW", "MulS"], [4, 3, 1, 2, 3, 2, 2, 1, 1, 2, 1, 1])
        if k in ("MatMul", "Mul"):  # (products of activations: squashed after the second, so values stay finite)
            y = b.op(k, [a, c], s, pool=False)
            b.products += 1
            if b.products > 1:
                y = b.op("Tanh", [y], s, pool=False)
        elif k == "MatMulW":
            y = b.op("MatMul", [a, b.weight((n, n))], s, pool=False)
        elif k == "WMatMul":
            y = b.op("MatMul", [b.weight((n, n)), a], s, pool=False)
        elif k == "Transpose":
            y = b.op("Transpose", [a], s, pool=False, perm=perm)
        elif k == "Add":
            y = b.op(k, [a, c], s, pool=False)
        elif k == "AddW":
            y = b.op("Add", [a, b.weight((n,) if b.chance(0.5) else (n, n), scale=0.5)], s, pool=False)
        elif k == "MulS":
            y = b.op("Mul", [a, b.scalar(float(b.choice([0.5, 2.0, -1.0])))], s, pool=False)
        elif k == "Concat":
            axis = int(b.choice(last))
            cs = list(s)
            cs[axis] *= 2
            cat = b.op("Concat", [a, c], tuple(cs), pool=False, axis=axis)
            if b.chance(0.7):  # back into squares, maybe on the other axis
                ax2 = axis if b.chance(0.6) or cs[sum(last) - axis] < 2 else sum(last) - axis
                ps = list(cs)
                ps[ax2] //= 2
                if ps[-1] == ps[-2]:
                    pieces = b.node("Split", [cat], [tuple(ps)] * 2, pool=False, axis=ax2)
                    vals += pieces
                    continue
            y = b.op("MatMul", [cat, b.weight((cs[-1], n))], s, pool=False) if axis == r - 1 else \
                b.op("MatMul", [b.weight((n, cs[-2])), cat], s, pool=False)
        else:
            y = b.op(k, [a], s, pool=False)
        vals.append(y)
    read = set()
    for nd in b.nodes:
        read.update(nd.input)
    b.pool += [v for v in vals[1:] if v not in read]
    return True


def m_conv_soup(b: Builder) -> bool:
    """A random small DAG of convolutions, pools, sums, relus, channel concats and splits on one
    ``[N, C, H, W]`` shape (TASO's CNN operators, any op on any earlier value)."""
    x = b.pick(lambda s: len(s) == 4 and s[1] <= 16 and s[2] * s[3] <= 256)
    if x is None:
        return False
    s = b.shape[x]
    n, c, h, w = s
    vals = [x]
    for _ in range(int(b.rng.integers(3, 10))):
        a = vals[int(b.rng.integers(len(vals)))] if b.chance(0.5) else vals[-1]
        o = vals[int(b.rng.integers(len(vals)))]
        k = b.choice(["conv", "add", "mul", "relu", "pool", "concat"], [5, 3, 1, 2, 2, 2])
        if k == "conv":
            kk = int(b.choice([1, 3]))
            y = b.op("Conv", [a, b.weight((c, c, kk, kk))] + ([b.weight((c,), scale=0.5)] if b.chance(0.4) else []),
                     s, pool=False, pads=[kk // 2] * 4, kernel_shape=[kk, kk])
        elif k in ("add", "mul"):
            y = b.op("Add" if k == "add" else "Mul", [a, o], s, pool=False)
        elif k == "relu":
            y = b.op("Relu", [a], s, pool=False)
        elif k == "pool":
            y = b.op(b.choice(["MaxPool", "AveragePool"]), [a], s, pool=False, kernel_shape=[3, 3], pads=[1] * 4)
        else:
            cat = b.op("Concat", [a, o], (n, 2 * c, h, w), pool=False, axis=1)
            if b.chance(0.3):
                cat = b.op("Relu", [cat], (n, 2 * c, h, w), pool=False)
            vals += b.node("Split", [cat], [s, s], pool=False, axis=1)
            continue
        vals.append(y)
    read = set()
    for nd in b.nodes:
        read.update(nd.input)
    b.pool += [v for v in vals[1:] if v not in read]
    return True


MOTIFS = {f.__name__[2:]: f for f in [
    m_conv_block, m_sibling_convs, m_residual, m_pool, m_split_concat, m_elementwise, m_unary, m_flatten,
    m_to_sequence, m_layout, m_projections, m_nested_projections, m_attention, m_ffn, m_norm, m_unknown,
    m_shape_arith, m_token_mixing, m_two_activations, m_lstm, m_nasrnn, m_mlp, m_to_3d, m_embedding, m_identity,
    m_const_branch, m_same_operand, m_noop, m_cast, m_matmul_variants, m_scalar, m_long_chain, m_split_unused,
    m_equal_weights, m_transposed_matmul, m_shared_conv_weight, m_soup, m_conv_soup]}

#: motifs of every family, for corner cases
_EDGES = dict(identity=0.4, const_branch=0.4, same_operand=0.5, noop=0.4, cast=0.2, scalar=0.2, split_unused=0.4,
              matmul_variants=0.6, equal_weights=0.3, transposed_matmul=0.4)

#: family -> (input shapes maker, motif weights)
FAMILIES = {
    "cnn": dict(conv_block=8, sibling_convs=3, residual=2, pool=3, split_concat=2, elementwise=2, unary=1,
                flatten=2, layout=1, unknown=0.5, norm=0.3, to_sequence=0.5, shared_conv_weight=0.7, conv_soup=2,
                **_EDGES),
    "seq": dict(projections=4, nested_projections=4, attention=3, ffn=2, norm=2, layout=2, shape_arith=1.5,
                split_concat=1, elementwise=2, unary=1, unknown=1, token_mixing=1, two_activations=1, mlp=0.5,
                embedding=0.7, long_chain=0.4, soup=1.5, **_EDGES),
    "mlp": dict(mlp=3, projections=3, nested_projections=1.5, split_concat=2, elementwise=2, unary=1, layout=1,
                lstm=1.5, nasrnn=0.7, unknown=1, norm=0.5, to_3d=1, two_activations=0.5, ffn=1, long_chain=0.5,
                soup=2.5, **_EDGES),
    "rnn": dict(lstm=4, nasrnn=2, mlp=1, elementwise=1, split_concat=0.5, long_chain=0.5, soup=1),
    "mixed": {k: 1.0 for k in MOTIFS},
}
FAMILY_WEIGHTS = dict(cnn=3, seq=3.5, mlp=2, rnn=1, mixed=1.5)


def _inputs_for(b: Builder, family: str) -> None:
    r = b.rng
    if family == "cnn" or (family == "mixed" and b.chance(0.4)):
        n = int(b.choice([1, 1, 2]))
        c = int(b.choice([1, 3, 4, 8, 16]))
        h = int(b.choice([5, 6, 8, 12, 16]))
        w = h if b.chance(0.8) else int(b.choice([4, 7, 10]))
        x = b.input((n, c, h, w))
        if b.chance(0.15):
            b.input((n, c, h, w))
        if family == "mixed" and b.chance(0.5):
            b.input((int(r.integers(1, 5)), int(b.choice([8, 16]))))
    elif family == "seq" or family == "mixed":
        bs = int(b.choice([1, 1, 2, 3]))
        sq = int(b.choice([1, 4, 5, 8, 16]))
        d = int(b.choice([8, 12, 16, 24, 32]))
        b.input((bs, sq, d))
        if b.chance(0.15):
            b.input((bs, sq, d))
    else:
        n = int(b.choice([1, 2, 4, 8]))
        d = int(b.choice([8, 12, 16, 32]))
        b.input((n, d))


def generate(seed: int, check: bool = True, motifs: Optional[list] = None) -> Generated:
    """The model of ``seed`` (checked unless ``check`` is false). Raises ``GeneratorFault``. ``motifs``
    restricts the motifs (a targeted campaign; the seed then names another model)."""
    rng = np.random.default_rng([_STREAM, seed] if not motifs else [_STREAM, seed, *map(_motif_id, motifs)])
    wi = float(rng.choice([0.0, 0.25], p=[0.85, 0.15]))
    b = Builder(rng, weight_input_p=wi, shadow_p=0.1 if rng.random() < 0.1 else 0.0)
    families = [f for f in FAMILY_WEIGHTS if not motifs or f != "mixed" and set(motifs) & set(FAMILIES[f])] \
        or ["mixed"]
    fw = np.array([FAMILY_WEIGHTS[f] for f in families])
    family = families[int(rng.choice(len(families), p=fw / fw.sum()))]
    applied: list = []
    try:
        _inputs_for(b, family)
        weights = FAMILIES[family] if not motifs else {m: 1.0 for m in motifs}
        names = list(weights)
        p = np.array([weights[k] for k in names])
        want = int(rng.choice([1, 2, 3, 4, 5, 6], p=[0.12, 0.2, 0.22, 0.2, 0.14, 0.12]))
        if rng.random() < 0.04:  # a deep model: more ops than one search window (120) in places
            want = int(rng.integers(10, 25))
        tries = 0
        while len(applied) < want and tries < 4 * want + 4:
            tries += 1
            name = names[int(rng.choice(len(names), p=p / p.sum()))]
            if MOTIFS[name](b):
                applied.append(name)
        if not applied:  # nothing fit the inputs: at least one op
            m_unary(b)
            applied.append("unary")
        model = b.model()
    except GeneratorFault:
        raise
    except Exception as e:  # a bug of the generator
        raise GeneratorFault(f"generator raised {type(e).__name__}: {e} (motifs {applied})") from e
    if check:
        validate(model)
    return Generated(seed, model, family, applied)


def _motif_id(name: str) -> int:
    if name not in MOTIFS:
        raise ValueError(f"unknown motif '{name}' (motifs: {', '.join(sorted(MOTIFS))})")
    return sorted(MOTIFS).index(name)


# ------------------------------------------------------------------------------------------------------
# validity
# ------------------------------------------------------------------------------------------------------

def session(model, threads: int = 1):
    """An onnxruntime session with its graph optimizations off (its optimizer is known to compute some
    valid models wrongly) on one thread."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # (a model that fails to run is reported by the exception, not a log line)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def feedable_inputs(model: onnx.ModelProto) -> list:
    """(name, shape) of the graph inputs without an initializer."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out.append((vi.name, tuple(dims), vi.type.tensor_type.elem_type))
    return out


#: metadata key of the models' integer inputs: JSON {input name: exclusive upper bound of its values}
BOUNDS_KEY = "taso_fuzz.index_bounds"


def index_bounds(model: onnx.ModelProto) -> dict:
    import json

    for p in model.metadata_props:
        if p.key == BOUNDS_KEY:
            return json.loads(p.value)
    return {}


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict:
    """Standard normal float32 values for float inputs; for int64 inputs (token ids), integers below the
    bound the model's metadata gives them."""
    feeds = {}
    bounds = index_bounds(model)
    for name, shape, et in feedable_inputs(model):
        if et == FLOAT:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        elif et == TensorProto.INT64 and name in bounds:
            feeds[name] = rng.integers(0, int(bounds[name]), shape).astype(np.int64)
        else:
            raise GeneratorFault(f"input '{name}' has element type {et} and no known bound")
    return feeds


def validate(model: onnx.ModelProto) -> None:
    """Raise ``GeneratorFault`` unless the model passes ``onnx.checker`` (full: strict shape inference
    against the declared output shapes) and runs in onnxruntime to finite outputs of declared shapes."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:
        raise GeneratorFault(f"onnx.checker: {str(e).strip().splitlines()[0][:300]}", model) from None
    try:
        sess = session(model)
        feeds = random_feeds(model, np.random.default_rng(0))
        outs = sess.run(None, feeds)
    except GeneratorFault:
        raise
    except Exception as e:
        raise GeneratorFault(f"onnxruntime: {str(e).strip().splitlines()[0][:300]}", model) from None
    for vi, y in zip(model.graph.output, outs):
        want = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if tuple(y.shape) != want:
            raise GeneratorFault(f"output '{vi.name}' has shape {y.shape} in onnxruntime, declared {want}", model)
        if not np.all(np.isfinite(y)):
            raise GeneratorFault(f"output '{vi.name}' is not finite", model)


if __name__ == "__main__":  # python test/fuzz/gen.py SEED [OUT.onnx]: print (or write) one model
    import sys

    g = generate(int(sys.argv[1]))
    print(f"seed {g.seed}: family {g.family}, motifs {g.motifs}, {len(g.model.graph.node)} nodes", file=sys.stderr)
    if len(sys.argv) > 2:
        onnx.save(g.model, sys.argv[2])
    else:
        print(helper.printable_graph(g.model.graph))
