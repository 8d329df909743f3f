"""Operator specifications: the one definition of every `taso` operator's meaning.

Each entry gives the operator's operands and results, its attributes with ONNX-compatible defaults,
a shape function, a numpy reference implementation, and its ONNX mapping in both directions. The
IRDL dialect, the importer, the exporter, the shape verifier and the tests all read this table; the
generator and the axiom validation (later issues) read it too. There is no second definition of an
operator's meaning anywhere in taso-mlir.

Reference semantics come in two modes, chosen by the dtype of the inputs:
- float inputs are computed in float64 and rounded once to the input dtype (an accurate reference);
- integer inputs are computed exactly in the input's integer dtype (wrapping arithmetic, e.g. mod
  2**32 for uint32), which is what fingerprinting needs. Division by an odd k is exact in that ring
  (multiplication by k's modular inverse), so average pooling with count_include_pad=1 and odd
  windows, and C_pool (``constant(..., dtype=np.uint32)``), have an exact meaning too. Operators with
  no exact integer meaning (sigmoid, tanh, batchnorm, other average pooling) raise
  ``ExactModeUnsupported``.

Conventions: 2-D windows use ONNX's layouts (NCHW activations, OIHW weights) and ONNX's pad order
``[top, left, bottom, right]``. Elementwise ops use ONNX (numpy) multidirectional broadcasting; TASO's
same-shape operators are the special case the generator uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

Shape = tuple[int, ...]

#: Most operands of a `taso.concat` / results of a `taso.split` (IRDL cannot express a variadic
#: group over tensors of different types, so these ops have optional operands/results with segment
#: sizes). Larger concats and splits stay generic ``onnx.Concat`` / ``onnx.Split`` operations.
MAX_ARITY = 16

REQUIRED = object()


class SpecError(ValueError):
    """An operator's operands or attributes violate its specification."""


class ExactModeUnsupported(SpecError):
    """The operator has no exact integer semantics."""


class NotMappable(Exception):
    """An ONNX node is valid but outside what a `taso` op expresses; it stays a generic op."""


@dataclass(frozen=True)
class AttrSpec:
    name: str
    kind: str  # "int" | "ints" | "float" | "str"
    default: Any = REQUIRED
    choices: tuple = ()
    doc: str = ""


@dataclass(frozen=True)
class OpSpec:
    name: str  # without the "taso." prefix
    summary: str
    operands: tuple[str, ...]  # required operands, in order
    optional_operands: tuple[str, ...] = ()  # trailing optional operands
    variadic_operands: bool = False  # operands are 2..MAX_ARITY tensors (concat)
    num_results: int = 1
    variadic_results: bool = False  # results are 2..MAX_ARITY tensors (split)
    attrs: tuple[AttrSpec, ...] = ()
    value_attr: bool = False  # carries a dense `value` attribute (weights)
    shape: Callable[..., list[Shape]] = None  # (in_shapes, attrs, out_shapes_hint) -> out shapes
    ref: Callable[..., list[np.ndarray]] = None  # (inputs, attrs, out_shapes) -> outputs
    onnx_ops: tuple[str, ...] = ()  # ONNX op types imported as this op
    to_onnx: Callable[..., None] = None  # (ExportSite) -> None
    doc: str = ""

    @property
    def full_name(self) -> str:
        return f"taso.{self.name}"

    def attr(self, name: str) -> AttrSpec:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    def complete_attrs(self, attrs: dict) -> dict:
        """Fill defaults, check kinds and choices; raise SpecError on violations. (A new dict each call;
        the answers for hashable attributes are memoized, keyed with every value's type, since the
        checks tell ``True`` from ``1``; violations are checked again each time.)"""
        key = hit = None
        if SPECS.get(self.name) is self:  # (the registered specs: a name is one spec)
            try:
                key = (self.name,) + tuple((k, _typed(v)) for k, v in attrs.items())
                hit = _COMPLETE.get(key)
            except TypeError:  # (an unhashable value: a list, an array; or a NaN, not memoized)
                key = None
        if hit is None:
            hit = self._complete_attrs(attrs)
            if key is not None:
                if len(_COMPLETE) >= 100_000:
                    _COMPLETE.clear()
                _COMPLETE[key] = hit
        return dict(hit)

    def _complete_attrs(self, attrs: dict) -> dict:
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                v = attrs[a.name]
            elif a.default is REQUIRED:
                raise SpecError(f"taso.{self.name}: missing attribute '{a.name}'")
            else:
                v = a.default
            out[a.name] = _check_attr_kind(self.name, a, v)
        extra = set(attrs) - {a.name for a in self.attrs} - ({"value", "name"} if self.value_attr else set())
        if extra:
            raise SpecError(f"taso.{self.name}: unknown attribute(s) {sorted(extra)}")
        return out


_COMPLETE: dict = {}  # (op name, (attribute, typed value)...) -> its complete attributes


def _typed(v):
    """``v`` as a memo key: every value with its type (``True`` is not ``1``), a float with its sign
    (``-0.0`` is not ``0.0``); a NaN raises TypeError (it equals nothing, so it would never hit)."""
    if isinstance(v, tuple):
        return (type(v),) + tuple(map(_typed, v))
    if isinstance(v, (float, np.floating)):
        if v != v:
            raise TypeError("NaN")
        return (type(v), v, math.copysign(1.0, v))
    return (type(v), v)


def _check_attr_kind(op: str, a: AttrSpec, v: Any) -> Any:
    if a.kind == "int":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise SpecError(f"taso.{op}: attribute '{a.name}' must be an integer, got {v!r}")
        v = int(v)
    elif a.kind == "ints":
        if not isinstance(v, (list, tuple)) or not all(
                isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in v):
            raise SpecError(f"taso.{op}: attribute '{a.name}' must be a list of integers, got {v!r}")
        v = tuple(int(x) for x in v)
    elif a.kind == "float":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise SpecError(f"taso.{op}: attribute '{a.name}' must be a float, got {v!r}")
        v = float(np.float32(v))  # ONNX float attributes and the MLIR attribute (f32) are float32
    elif a.kind == "str":
        if not isinstance(v, str):
            raise SpecError(f"taso.{op}: attribute '{a.name}' must be a string, got {v!r}")
    if a.choices and v not in a.choices:
        raise SpecError(f"taso.{op}: attribute '{a.name}' must be one of {list(a.choices)}, got {v!r}")
    return v


# --------------------------------------------------------------------------------------------
# numeric helpers


def _is_int(*arrays: np.ndarray) -> bool:
    return any(np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_ for a in arrays)


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64, copy=False)


def _float_only(op: str, *arrays: np.ndarray) -> None:
    if _is_int(*arrays):
        raise ExactModeUnsupported(f"taso.{op} has no exact integer semantics")


def _contiguous(a) -> np.ndarray:
    """A C-contiguous ndarray of the same shape (np.ascontiguousarray turns 0-d into shape [1])."""
    return np.asarray(a, order="C")


def _finish(result: np.ndarray, like: np.ndarray) -> np.ndarray:
    return _contiguous(result.astype(like.dtype, copy=False))


def broadcast_shape(a: Shape, b: Shape) -> Shape:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise SpecError(f"shapes {list(a)} and {list(b)} do not broadcast") from None


#: ReLU6's ceiling: the conv activation ``relu6`` is ONNX ``Clip(x, 0, 6)``
RELU6_MAX = 6.0


def _activation(x: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, np.zeros((), dtype=x.dtype))
    if act == "relu6":
        return np.minimum(np.maximum(x, np.zeros((), dtype=x.dtype)), np.asarray(RELU6_MAX, dtype=x.dtype))
    if act != "none":
        raise SpecError(f"unknown activation {act!r}")
    return x


def conv2d_out_hw(hw: Sequence[int], k: Sequence[int], strides, pads, dilations) -> tuple[int, int]:
    out = []
    for i in range(2):
        span = dilations[i] * (k[i] - 1) + 1
        n = hw[i] + pads[i] + pads[i + 2] - span
        if n < 0:
            raise SpecError(f"window {list(k)} (dilations {list(dilations)}) larger than padded input {list(hw)}")
        out.append(n // strides[i] + 1)
    return out[0], out[1]


def _windows(x: np.ndarray, k, strides, dilations, out_hw) -> np.ndarray:
    """(N, C, kh, kw, OH, OW) view-copy of the windows of an already padded NCHW tensor."""
    n, c = x.shape[:2]
    oh, ow = out_hw
    cols = np.empty((n, c, k[0], k[1], oh, ow), dtype=x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * dilations[0], j * dilations[1]
            cols[:, :, i, j] = x[:, :, r0 : r0 + strides[0] * (oh - 1) + 1 : strides[0],
                                 c0 : c0 + strides[1] * (ow - 1) + 1 : strides[1]]
    return cols


def _pad_hw(x: np.ndarray, pads, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=value)


def resolve_auto_pad(auto_pad: str, in_hw, k, strides, dilations) -> list[int]:
    """Explicit ``[top, left, bottom, right]`` pads for ONNX's auto_pad modes."""
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    begin, end = [], []
    for i in range(2):
        out = -(-in_hw[i] // strides[i])
        total = max((out - 1) * strides[i] + (k[i] - 1) * dilations[i] + 1 - in_hw[i], 0)
        small, big = total // 2, total - total // 2
        if auto_pad == "SAME_UPPER":
            begin.append(small), end.append(big)
        else:
            begin.append(big), end.append(small)
    return begin + end


# --------------------------------------------------------------------------------------------
# shape functions and reference implementations


def _shape_conv2d(ins, a, _hint=None):
    x, w = ins[0], ins[1]
    if len(x) != 4 or len(w) != 4:
        raise SpecError(f"conv2d needs a 4-D input and a 4-D weight, got {list(x)} and {list(w)}")
    g = a["group"]
    if g < 1 or x[1] != w[1] * g or w[0] % g:
        raise SpecError(f"conv2d: input channels {x[1]}, weight {list(w)} and group {g} disagree")
    if len(ins) > 2 and tuple(ins[2]) != (w[0],):
        raise SpecError(f"conv2d: bias shape {list(ins[2])} is not [{w[0]}]")
    _check_window_attrs(a)
    oh, ow = conv2d_out_hw(x[2:], w[2:], a["strides"], a["pads"], a["dilations"])
    return [(x[0], w[0], oh, ow)]


def _check_window_attrs(a):
    if len(a["strides"]) != 2 or min(a["strides"]) < 1:
        raise SpecError(f"strides must be 2 positive integers, got {list(a['strides'])}")
    if len(a["pads"]) != 4 or min(a["pads"]) < 0:
        raise SpecError(f"pads must be 4 non-negative integers, got {list(a['pads'])}")
    if "dilations" in a and (len(a["dilations"]) != 2 or min(a["dilations"]) < 1):
        raise SpecError(f"dilations must be 2 positive integers, got {list(a['dilations'])}")
    if "kernel_shape" in a and (len(a["kernel_shape"]) != 2 or min(a["kernel_shape"]) < 1):
        raise SpecError(f"kernel_shape must be 2 positive integers, got {list(a['kernel_shape'])}")


def _ref_conv2d(ins, a, _outs=None):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    exact = _is_int(x, w)
    xx, ww = (x, w) if exact else (_f64(x), _f64(w))
    (n, _, oh, ow), = _shape_conv2d([x.shape, w.shape] + ([b.shape] if b is not None else []), a)
    xp = _pad_hw(xx, a["pads"], 0)
    cols = _windows(xp, w.shape[2:], a["strides"], a["dilations"], (oh, ow))
    g, o, cg = a["group"], w.shape[0], w.shape[1]
    og = o // g
    out = np.empty((n, o, oh * ow), dtype=xx.dtype)
    for gi in range(g):
        c = cols[:, gi * cg : (gi + 1) * cg].reshape(n, cg * w.shape[2] * w.shape[3], oh * ow)
        wg = ww[gi * og : (gi + 1) * og].reshape(og, -1)
        out[:, gi * og : (gi + 1) * og] = np.matmul(wg, c)
    out = out.reshape(n, o, oh, ow)
    if b is not None:
        out = out + (b if exact else _f64(b)).reshape(1, o, 1, 1)
    return [_finish(_activation(out, a["activation"]), x)]


def _shape_matmul(ins, a, _hint=None):
    x, y = ins[0], ins[1]
    if len(x) < 2 or len(y) < 2:
        raise SpecError(f"matmul needs operands of rank >= 2, got {list(x)} and {list(y)}")
    if x[-1] != y[-2]:
        raise SpecError(f"matmul: inner dimensions disagree: {list(x)} x {list(y)}")
    if len(ins) > 2 and tuple(ins[2]) != (y[-1],):
        raise SpecError(f"matmul: bias shape {list(ins[2])} is not [{y[-1]}]")
    batch = broadcast_shape(x[:-2], y[:-2])
    return [tuple(batch) + (x[-2], y[-1])]


def _ref_matmul(ins, a, _outs=None):
    x, y = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    _shape_matmul([t.shape for t in ins], a)
    exact = _is_int(x, y)
    out = np.matmul(x, y) if exact else np.matmul(_f64(x), _f64(y))
    if b is not None:
        out = out + (b if exact else _f64(b))  # one value per output column
    return [_finish(_activation(out, a["activation"]), x)]


def _shape_binary(ins, a, _hint=None):
    return [broadcast_shape(ins[0], ins[1])]


def _ref_ewadd(ins, a, _outs=None):
    x, y = ins
    _shape_binary([x.shape, y.shape], a)
    return [_finish(x + y if _is_int(x, y) else _f64(x) + _f64(y), x)]


def _ref_ewmul(ins, a, _outs=None):
    x, y = ins
    _shape_binary([x.shape, y.shape], a)
    return [_finish(x * y if _is_int(x, y) else _f64(x) * _f64(y), x)]


def _shape_smul(ins, a, _hint=None):
    if len(ins[1]) != 0:
        raise SpecError(f"smul: the scalar operand must be 0-d, got shape {list(ins[1])}")
    return [tuple(ins[0])]


def _ref_smul(ins, a, _outs=None):
    x, s = ins
    _shape_smul([x.shape, s.shape], a)
    return [_finish(x * s if _is_int(x, s) else _f64(x) * _f64(s), x)]


def _shape_same(ins, a, _hint=None):
    return [tuple(ins[0])]


def _ref_relu(ins, a, _outs=None):
    return [_finish(_activation(ins[0], "relu"), ins[0])]


def _ref_sigmoid(ins, a, _outs=None):
    _float_only("sigmoid", ins[0])
    x = _f64(ins[0])
    e = np.exp(-np.abs(x))  # never overflows, unlike exp(-x) for very negative x
    return [_finish(np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)), ins[0])]


def _ref_tanh(ins, a, _outs=None):
    _float_only("tanh", ins[0])
    return [_finish(np.tanh(_f64(ins[0])), ins[0])]


def _shape_transpose(ins, a, _hint=None):
    perm = a["perm"]
    if sorted(perm) != list(range(len(ins[0]))):
        raise SpecError(f"transpose: perm {list(perm)} is not a permutation of rank {len(ins[0])}")
    return [tuple(ins[0][p] for p in perm)]


def _ref_transpose(ins, a, _outs=None):
    _shape_transpose([ins[0].shape], a)
    return [_contiguous(np.transpose(ins[0], a["perm"]))]


def _shape_reshape(ins, a, _hint=None):
    shape = tuple(a["shape"])
    if any(d < 0 for d in shape) or math.prod(shape) != math.prod(ins[0]):
        raise SpecError(f"reshape: cannot reshape {list(ins[0])} to {list(shape)}")
    return [shape]


def _ref_reshape(ins, a, _outs=None):
    _shape_reshape([ins[0].shape], a)
    return [_contiguous(ins[0].reshape(a["shape"]))]


def _shape_concat(ins, a, _hint=None):
    if not 2 <= len(ins) <= MAX_ARITY:
        raise SpecError(f"concat takes 2..{MAX_ARITY} operands, got {len(ins)}")
    r = len(ins[0])
    ax = a["axis"]
    if not 0 <= ax < r:
        raise SpecError(f"concat: axis {ax} out of range for rank {r}")
    for s in ins[1:]:
        if len(s) != r or any(s[i] != ins[0][i] for i in range(r) if i != ax):
            raise SpecError(f"concat: shapes {[list(s) for s in ins]} disagree outside axis {ax}")
    out = list(ins[0])
    out[ax] = sum(s[ax] for s in ins)
    return [tuple(out)]


def _ref_concat(ins, a, _outs=None):
    _shape_concat([x.shape for x in ins], a)
    return [np.concatenate(ins, axis=a["axis"])]


def _shape_split(ins, a, _hint=None):
    x = ins[0]
    ax, sizes = a["axis"], a["sizes"]
    if not 0 <= ax < len(x):
        raise SpecError(f"split: axis {ax} out of range for rank {len(x)}")
    if not 2 <= len(sizes) <= MAX_ARITY or min(sizes) < 0 or sum(sizes) != x[ax]:
        raise SpecError(f"split: sizes {list(sizes)} do not partition dimension {x[ax]} (2..{MAX_ARITY} parts)")
    outs = []
    for s in sizes:
        o = list(x)
        o[ax] = s
        outs.append(tuple(o))
    return outs


def _ref_split(ins, a, _outs=None):
    _shape_split([ins[0].shape], a)
    cuts = np.cumsum(a["sizes"])[:-1]
    return [_contiguous(p) for p in np.split(ins[0], cuts, axis=a["axis"])]


def _shape_pool(ins, a, _hint=None):
    x = ins[0]
    if len(x) != 4:
        raise SpecError(f"pooling needs a 4-D input, got {list(x)}")
    _check_window_attrs(a)
    k = a["kernel_shape"]
    if any(a["pads"][i] >= k[i % 2] for i in range(4)):
        raise SpecError(f"pooling: pads {list(a['pads'])} must be smaller than the kernel {list(k)}")
    oh, ow = conv2d_out_hw(x[2:], k, a["strides"], a["pads"], (1, 1))
    return [(x[0], x[1], oh, ow)]


def _ref_maxpool(ins, a, _outs=None):
    x = ins[0]
    (_, _, oh, ow), = _shape_pool([x.shape], a)
    if _is_int(x):
        low = np.iinfo(x.dtype).min if x.dtype != np.bool_ else False
    else:
        low = -np.inf
    xp = _pad_hw(x, a["pads"], low)
    cols = _windows(xp, a["kernel_shape"], a["strides"], (1, 1), (oh, ow))
    return [_contiguous(cols.max(axis=(2, 3)))]


def exact_reciprocal(k: int, dtype) -> np.ndarray:
    """1/k in the ring of the integer ``dtype`` (wrapping arithmetic): the unique r with k*r == 1.

    Exists for odd k only. It gives average pooling and C_pool an exact integer meaning for
    fingerprinting: sum * (1/k) is the unique solution a of k*a == sum in that ring.
    """
    dt = np.dtype(dtype)
    if k % 2 == 0:
        raise ExactModeUnsupported(f"1/{k} has no exact integer value (even divisor)")
    bits = dt.itemsize * 8
    return np.array(pow(k, -1, 1 << bits), dtype=np.uint64).astype(dt)


def _ref_avgpool(ins, a, _outs=None):
    x = ins[0]
    (_, _, oh, ow), = _shape_pool([x.shape], a)
    k = a["kernel_shape"]
    if _is_int(x):
        if not a["count_include_pad"]:
            raise ExactModeUnsupported("taso.avgpool2d with count_include_pad=0 has no exact integer semantics")
        xp = _pad_hw(x, a["pads"], 0)
        sums = _windows(xp, k, a["strides"], (1, 1), (oh, ow)).sum(axis=(2, 3), dtype=x.dtype)
        return [_contiguous(sums * exact_reciprocal(k[0] * k[1], x.dtype))]
    xp = _pad_hw(_f64(x), a["pads"], 0.0)
    sums = _windows(xp, k, a["strides"], (1, 1), (oh, ow)).sum(axis=(2, 3))
    if a["count_include_pad"]:
        return [_finish(sums / (k[0] * k[1]), x)]
    ones = _pad_hw(np.ones((1, 1) + x.shape[2:]), a["pads"], 0.0)
    counts = _windows(ones, k, a["strides"], (1, 1), (oh, ow)).sum(axis=(2, 3))
    return [_finish(sums / counts, x)]


def _shape_enlarge(ins, a, _hint=None):
    w = ins[0]
    k = a["kernel_shape"]
    if len(w) != 4 or len(k) != 2 or k[0] < w[2] or k[1] < w[3] or (k[0] - w[2]) % 2 or (k[1] - w[3]) % 2:
        raise SpecError(f"enlarge: cannot center kernel {list(w)} in {list(k)}")
    return [(w[0], w[1], k[0], k[1])]


def _ref_enlarge(ins, a, _outs=None):
    w = ins[0]
    _shape_enlarge([w.shape], a)
    dh, dw = (a["kernel_shape"][0] - w.shape[2]) // 2, (a["kernel_shape"][1] - w.shape[3]) // 2
    return [np.pad(w, ((0, 0), (0, 0), (dh, dh), (dw, dw)))]


def _shape_batchnorm(ins, a, _hint=None):
    x = ins[0]
    if len(x) < 2:
        raise SpecError(f"batchnorm needs an input of rank >= 2, got {list(x)}")
    for s in ins[1:]:
        if tuple(s) != (x[1],):
            raise SpecError(f"batchnorm: parameter shape {list(s)} is not [{x[1]}]")
    return [tuple(x)]


def _ref_batchnorm(ins, a, _outs=None):
    x, scale, bias, mean, var = ins
    _float_only("batchnorm", x)
    _shape_batchnorm([t.shape for t in ins], a)
    shp = (1, -1) + (1,) * (x.ndim - 2)
    y = (_f64(x) - _f64(mean).reshape(shp)) / np.sqrt(_f64(var).reshape(shp) + a["epsilon"])
    return [_finish(y * _f64(scale).reshape(shp) + _f64(bias).reshape(shp), x)]


def _shape_from_result(ins, a, hint=None):
    if hint is None:
        raise SpecError("a constant's shape comes from its result type")
    return [tuple(hint[0])]


def _shape_const_pool(ins, a, hint=None):
    (shape,) = _shape_from_result(ins, a, hint)
    if len(shape) != 4 or shape[1] != 1:
        raise SpecError(f"C_pool is a depthwise kernel [C, 1, kh, kw], got {list(shape)}")
    return [shape]


def _shape_const_iconv(ins, a, hint=None):
    (shape,) = _shape_from_result(ins, a, hint)
    if len(shape) != 4 or shape[2] % 2 == 0 or shape[3] % 2 == 0 or shape[1] < 1 or shape[0] % shape[1]:
        raise SpecError(f"I_conv needs an odd kernel [C, C/g, kh, kw], got {list(shape)}")
    return [shape]


def _shape_const_imatmul(ins, a, hint=None):
    (shape,) = _shape_from_result(ins, a, hint)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise SpecError(f"I_matmul needs a square matrix, got {list(shape)}")
    return [shape]


def _ref_const_pool(ins, a, outs, dtype=np.float32):
    (shape,) = outs
    _shape_const_pool([], a, [shape])
    if np.issubdtype(np.dtype(dtype), np.integer):
        return [np.full(shape, exact_reciprocal(shape[2] * shape[3], dtype), dtype=dtype)]
    return [np.full(shape, 1.0 / (shape[2] * shape[3]), dtype=dtype)]


def _ref_const_iconv(ins, a, outs, dtype=np.float32):
    (shape,) = outs
    _shape_const_iconv([], a, [shape])
    w = np.zeros(shape, dtype=dtype)
    for o in range(shape[0]):
        w[o, o % shape[1], shape[2] // 2, shape[3] // 2] = 1.0
    return [w]


def _ref_const_imatmul(ins, a, outs, dtype=np.float32):
    (shape,) = outs
    _shape_const_imatmul([], a, [shape])
    return [_contiguous(np.broadcast_to(np.eye(shape[-1], dtype=dtype), shape))]


def _ref_const_iewmul(ins, a, outs, dtype=np.float32):
    (shape,) = outs
    return [np.ones(shape, dtype=dtype)]


def _ref_weight(ins, a, outs):
    # ``value`` is a numpy array or a DenseElementsAttr (buffer protocol; a splat reads back whole)
    v = np.array(a["value"])
    if outs is not None and v.shape != tuple(outs[0]):
        v = np.broadcast_to(v, tuple(outs[0]))
    return [_contiguous(v)]


# --------------------------------------------------------------------------------------------
# export to ONNX: each function receives an ExportSite (see onnx_export.py) with
#   site.attrs, site.inputs (names), site.outputs (names), site.in_shapes, site.opset,
#   site.node(op_type, inputs, outputs, **attrs), site.const(array, hint) -> name, site.tmp(hint)


def _with_activation(site, op_type, inputs, **attrs):
    act = site.attrs.get("activation", "none")
    if act == "none":
        site.node(op_type, inputs, site.outputs, **attrs)
        return
    t = site.tmp("preact")
    site.node(op_type, inputs, [t], **attrs)
    if act == "relu":
        site.node("Relu", [t], site.outputs)
    elif site.opset >= 11:  # relu6: Clip's bounds are inputs from opset 11, of the tensor's type
        lo, hi = (site.const(np.asarray(v, dtype=site.dtype), n) for v, n in ((0.0, "min"), (RELU6_MAX, "max")))
        site.node("Clip", [t, lo, hi], site.outputs)
    else:
        site.node("Clip", [t], site.outputs, min=0.0, max=RELU6_MAX)


def _export_conv2d(site):
    a = site.attrs
    k = list(site.in_shapes[1][2:])
    _with_activation(site, "Conv", site.inputs, kernel_shape=k, strides=list(a["strides"]),
                     pads=list(a["pads"]), dilations=list(a["dilations"]), group=a["group"])


def _export_matmul(site):
    if len(site.inputs) < 3:
        _with_activation(site, "MatMul", site.inputs)
    elif len(site.in_shapes[0]) == 2 and len(site.in_shapes[1]) == 2 and site.opset >= 7:
        _with_activation(site, "Gemm", site.inputs)  # Gemm-7+: C broadcasts unidirectionally
    else:
        t = site.tmp("product")
        site.node("MatMul", site.inputs[:2], [t])
        _with_activation(site, "Add", [t, site.inputs[2]])


def _simple(op_type):
    def export(site):
        site.node(op_type, site.inputs, site.outputs)
    return export


def _export_transpose(site):
    perm = list(site.attrs["perm"])
    # a 0-d transpose has an empty perm, which ONNX cannot write as an attribute (the default is the same)
    site.node("Transpose", site.inputs, site.outputs, **({"perm": perm} if perm else {}))


def _export_reshape(site):
    shape = np.array(site.attrs["shape"], dtype=np.int64)
    # ONNX reads a 0 in the target shape as "copy the input's dimension" unless allowzero=1 (opset 14)
    zero_copies = [i for i, d in enumerate(site.attrs["shape"]) if d == 0]
    if zero_copies and site.opset >= 14:
        site.node("Reshape", [site.inputs[0], site.const(shape, "shape")], site.outputs, allowzero=1)
        return
    x = site.in_shapes[0]
    if any(i >= len(x) or x[i] != 0 for i in zero_copies):
        raise SpecError(f"taso.reshape to {list(shape)}: a 0 dimension needs ONNX opset >= 14 (allowzero); "
                        f"the model's opset is {site.opset}")
    if site.opset < 5:
        site.node("Reshape", site.inputs, site.outputs, shape=list(site.attrs["shape"]))
    else:
        site.node("Reshape", [site.inputs[0], site.const(shape, "shape")], site.outputs)


def _export_concat(site):
    site.node("Concat", site.inputs, site.outputs, axis=site.attrs["axis"])


def _export_split(site):
    sizes = list(site.attrs["sizes"])
    if site.opset < 13:
        site.node("Split", site.inputs, site.outputs, axis=site.attrs["axis"], split=sizes)
    else:
        site.node("Split", [site.inputs[0], site.const(np.array(sizes, dtype=np.int64), "split")],
                  site.outputs, axis=site.attrs["axis"])


def _export_maxpool(site):
    a = site.attrs
    site.node("MaxPool", site.inputs, site.outputs, kernel_shape=list(a["kernel_shape"]),
              strides=list(a["strides"]), pads=list(a["pads"]))


def _export_avgpool(site):
    a = site.attrs
    # count_include_pad exists from opset 7 on; its default (0) is written by leaving it out
    extra = {"count_include_pad": 1} if a["count_include_pad"] else {}
    site.node("AveragePool", site.inputs, site.outputs, kernel_shape=list(a["kernel_shape"]),
              strides=list(a["strides"]), pads=list(a["pads"]), **extra)


def _export_enlarge(site):
    w = site.in_shapes[0]
    k = site.attrs["kernel_shape"]
    dh, dw = (k[0] - w[2]) // 2, (k[1] - w[3]) // 2
    pads = [0, 0, dh, dw, 0, 0, dh, dw]
    if site.opset < 11:
        site.node("Pad", site.inputs, site.outputs, pads=pads)
    else:
        site.node("Pad", [site.inputs[0], site.const(np.array(pads, dtype=np.int64), "pads")], site.outputs)


def _export_batchnorm(site):
    site.node("BatchNormalization", site.inputs, site.outputs, epsilon=site.attrs["epsilon"])


def _export_constant(site):
    site.fold()


_STRIDES = AttrSpec("strides", "ints", (1, 1), doc="window strides [h, w]")
_PADS = AttrSpec("pads", "ints", (0, 0, 0, 0), doc="[top, left, bottom, right]")
_ACT = AttrSpec("activation", "str", "none", ("none", "relu"), doc="fused activation")
_CONV_ACT = AttrSpec("activation", "str", "none", ("none", "relu", "relu6"),
                     doc="fused activation (relu6: Clip(x, 0, 6))")


SPECS: dict[str, OpSpec] = {}


def _add(spec: OpSpec) -> None:
    SPECS[spec.name] = spec


_add(OpSpec("conv2d", "2-D convolution (NCHW, OIHW) with optional bias and fused activation",
            operands=("input", "weight"), optional_operands=("bias",),
            attrs=(_STRIDES, _PADS, AttrSpec("dilations", "ints", (1, 1)), AttrSpec("group", "int", 1), _CONV_ACT),
            shape=_shape_conv2d, ref=_ref_conv2d, onnx_ops=("Conv",), to_onnx=_export_conv2d))
_add(OpSpec("matmul", "batched matrix product (numpy matmul broadcasting) with optional bias (one value per "
            "output column) and fused activation",
            operands=("lhs", "rhs"), optional_operands=("bias",), attrs=(_ACT,),
            shape=_shape_matmul, ref=_ref_matmul, onnx_ops=("MatMul",), to_onnx=_export_matmul))
_add(OpSpec("ewadd", "elementwise addition (ONNX broadcasting)", operands=("lhs", "rhs"),
            shape=_shape_binary, ref=_ref_ewadd, onnx_ops=("Add",), to_onnx=_simple("Add")))
_add(OpSpec("ewmul", "elementwise multiplication (ONNX broadcasting)", operands=("lhs", "rhs"),
            shape=_shape_binary, ref=_ref_ewmul, onnx_ops=("Mul",), to_onnx=_simple("Mul")))
_add(OpSpec("smul", "tensor times a 0-d scalar", operands=("input", "scalar"),
            shape=_shape_smul, ref=_ref_smul, onnx_ops=("Mul",), to_onnx=_simple("Mul")))
_add(OpSpec("relu", "max(x, 0)", operands=("input",), shape=_shape_same, ref=_ref_relu,
            onnx_ops=("Relu",), to_onnx=_simple("Relu")))
_add(OpSpec("sigmoid", "1 / (1 + exp(-x))", operands=("input",), shape=_shape_same, ref=_ref_sigmoid,
            onnx_ops=("Sigmoid",), to_onnx=_simple("Sigmoid")))
_add(OpSpec("tanh", "hyperbolic tangent", operands=("input",), shape=_shape_same, ref=_ref_tanh,
            onnx_ops=("Tanh",), to_onnx=_simple("Tanh")))
_add(OpSpec("transpose", "permute dimensions", operands=("input",),
            attrs=(AttrSpec("perm", "ints", doc="output dim i is input dim perm[i]"),),
            shape=_shape_transpose, ref=_ref_transpose, onnx_ops=("Transpose",), to_onnx=_export_transpose))
_add(OpSpec("reshape", "reshape to a static shape", operands=("input",),
            attrs=(AttrSpec("shape", "ints", doc="the result shape, fully resolved"),),
            shape=_shape_reshape, ref=_ref_reshape, onnx_ops=("Reshape",), to_onnx=_export_reshape))
_add(OpSpec("concat", f"concatenate 2..{MAX_ARITY} tensors along an axis", operands=(),
            variadic_operands=True, attrs=(AttrSpec("axis", "int"),),
            shape=_shape_concat, ref=_ref_concat, onnx_ops=("Concat",), to_onnx=_export_concat))
_add(OpSpec("split", f"split a tensor into 2..{MAX_ARITY} parts along an axis", operands=("input",),
            variadic_results=True, attrs=(AttrSpec("axis", "int"), AttrSpec("sizes", "ints")),
            shape=_shape_split, ref=_ref_split, onnx_ops=("Split",), to_onnx=_export_split))
_add(OpSpec("maxpool2d", "2-D max pooling (NCHW)", operands=("input",),
            attrs=(AttrSpec("kernel_shape", "ints"), _STRIDES, _PADS),
            shape=_shape_pool, ref=_ref_maxpool, onnx_ops=("MaxPool",), to_onnx=_export_maxpool))
_add(OpSpec("avgpool2d", "2-D average pooling (NCHW)", operands=("input",),
            attrs=(AttrSpec("kernel_shape", "ints"), _STRIDES, _PADS, AttrSpec("count_include_pad", "int", 0, (0, 1))),
            shape=_shape_pool, ref=_ref_avgpool, onnx_ops=("AveragePool",), to_onnx=_export_avgpool))
_add(OpSpec("enlarge", "zero-pad a conv kernel to a larger kernel, centered", operands=("weight",),
            attrs=(AttrSpec("kernel_shape", "ints"),),
            shape=_shape_enlarge, ref=_ref_enlarge, to_onnx=_export_enlarge))
_add(OpSpec("batchnorm", "inference batch normalization over axis 1",
            operands=("input", "scale", "bias", "mean", "var"), attrs=(AttrSpec("epsilon", "float", 1e-5),),
            shape=_shape_batchnorm, ref=_ref_batchnorm, onnx_ops=("BatchNormalization",), to_onnx=_export_batchnorm))
_add(OpSpec("const_pool", "C_pool: a depthwise conv kernel [C,1,kh,kw] equal to 1/(kh*kw)", operands=(),
            shape=_shape_const_pool, ref=_ref_const_pool, to_onnx=_export_constant))
_add(OpSpec("const_iconv", "I_conv: the identity conv kernel [C,C/g,kh,kw] (1 at the centre)", operands=(),
            shape=_shape_const_iconv, ref=_ref_const_iconv, to_onnx=_export_constant))
_add(OpSpec("const_imatmul", "I_matmul: the identity matrix", operands=(),
            shape=_shape_const_imatmul, ref=_ref_const_imatmul, to_onnx=_export_constant))
_add(OpSpec("const_iewmul", "I_ewmul: the all-ones tensor", operands=(),
            shape=_shape_from_result, ref=_ref_const_iewmul, to_onnx=_export_constant))
_add(OpSpec("weight", "a weight or constant tensor; `name` is its ONNX initializer name", operands=(),
            value_attr=True, shape=_shape_from_result, ref=_ref_weight, to_onnx=_export_constant))


def spec(name: str) -> OpSpec:
    """The spec of ``taso.<name>`` (``name`` with or without the prefix)."""
    return SPECS[name.removeprefix("taso.")]


def infer_shapes(name: str, in_shapes: Sequence[Shape], attrs: dict, result_shapes=None) -> list[Shape]:
    s = spec(name)
    return s.shape([tuple(x) for x in in_shapes], s.complete_attrs(attrs), result_shapes)


def evaluate(name: str, inputs: Sequence[np.ndarray], attrs: dict, result_shapes=None) -> list[np.ndarray]:
    """Run the numpy reference semantics of ``taso.<name>``."""
    s = spec(name)
    full = s.complete_attrs({k: v for k, v in attrs.items() if k != "value"})
    if s.value_attr:
        full["value"] = attrs["value"]
    return s.ref(list(inputs), full, result_shapes)


CONSTANTS = ("const_pool", "const_iconv", "const_imatmul", "const_iewmul")


def constant(name: str, shape: Shape, dtype=np.float32) -> np.ndarray:
    """The value of the constant op ``taso.<name>`` of ``shape``, in ``dtype``.

    Integer dtypes give the exact value in that ring (C_pool's 1/(kh*kw) is a modular inverse).
    """
    name = name.removeprefix("taso.")
    if name not in CONSTANTS:
        raise SpecError(f"taso.{name} is not a constant op")
    return spec(name).ref([], {}, [tuple(shape)], dtype=dtype)[0]
