"""Numeric differential check of two ONNX models in onnxruntime on the same random inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from .errors import TasoError, one_line


@dataclass
class NumericReport:
    max_abs: float  # largest |a - b| over all outputs
    scale: float  # max(1, largest |a|) over all outputs
    outputs: int
    trials: int
    #: the largest over the outputs of |a - b| / max(1, |a|) / that output's tolerance (``TOLERANCE``)
    worst: float = 0.0
    #: the tolerance of the output ``worst`` comes from
    tolerance: float = 1e-5
    #: the name of that output
    worst_output: str = ""

    @property
    def rel(self) -> float:
        return self.max_abs / self.scale

    @property
    def ok(self) -> bool:
        return self.worst <= 1.0


#: the largest |difference| accepted per element type, relative to max(1, largest |output|): a rewrite
#: rounds differently (folded weights are computed once in float64 and rounded; a merged op sums in
#: another order), which float32 keeps within 1e-5; float16 and bfloat16 are given 4 units of their
#: last place (2**-10 and 2**-7 relative steps)
TOLERANCE = {np.dtype(np.float64): 1e-5, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4 * 2.0 ** -10}


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


#: ops an index passes through unchanged on its way to a Gather (``index_bounds``)
_INDEX_VIEWS = frozenset({"Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def index_bounds(model: onnx.ModelProto) -> dict:
    """Integer graph inputs that only index Gathers (token ids into an embedding, position ids), directly
    or through reshapes: name -> the smallest size of a gathered axis. Random inputs for them cover the
    whole table, not just rows 0 and 1."""
    g = model.graph
    dims: dict = {t.name: list(t.dims) for t in g.initializer}
    for vi in list(g.value_info) + list(g.input):
        d = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else ()
        if d and all(x.HasField("dim_value") for x in d):
            dims.setdefault(vi.name, [x.dim_value for x in d])
    users: dict = {}
    for n in g.node:
        for k, v in enumerate(n.input):
            users.setdefault(v, []).append((n, k))

    def bound(name: str, depth: int = 0):
        if depth > 8 or name not in users:
            return None
        out = None
        for n, k in users[name]:
            if n.domain not in ("", "ai.onnx"):
                return None
            if n.op_type in _INDEX_VIEWS and k == 0:
                b = bound(n.output[0], depth + 1)
            elif n.op_type == "Gather" and k == 1 and n.input[0] in dims:
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                shape = dims[n.input[0]]
                b = shape[axis] if -len(shape) <= axis < len(shape) else None
            else:
                return None
            if b is None or b < 1:
                return None
            out = b if out is None else min(out, b)
        return out

    ints = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
    out = {}
    for i in g.input:
        if i.name in dims and i.name in {t.name for t in g.initializer}:
            continue
        if i.type.HasField("tensor_type") and i.type.tensor_type.elem_type in ints:
            b = bound(i.name)
            if b is not None:
                out[i.name] = b
    return out


def input_shapes(model: onnx.ModelProto) -> dict:
    """The graph inputs of ``model`` (initializers excluded): name -> dims, an int where the dimension is
    fixed, else None. (For ``random_feeds``'s ``like``, without building a session.)"""
    consts = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in consts or not i.type.HasField("tensor_type"):
            continue
        out[i.name] = [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
    return out


def random_feeds(session, rng: np.random.Generator, like=None, bounds: Optional[dict] = None) -> dict:
    """Random inputs for ``session``'s model. A dimension it leaves open takes the size the same input
    has in ``like`` (a session of the model made static with ``--input-shape``, or ``input_shapes`` of
    it), else 1. An integer input is drawn from 0 up to its bound in ``bounds`` (``index_bounds``), else
    0 or 1."""
    from .ops import _max_materialize_bytes

    if like is None:
        fixed = {}
    elif isinstance(like, dict):
        fixed = like
    else:
        fixed = {i.name: i.shape for i in like.get_inputs()}
    feeds = {}
    total = 0
    for i in session.get_inputs():
        dt = _ORT_TYPES.get(i.type)
        if dt is None:
            raise TasoError(f"cannot make a random input for '{i.name}' of type {i.type}")
        other = fixed.get(i.name)
        if other is None or len(other) != len(i.shape):
            other = i.shape
        shape = [d if isinstance(d, int) else (o if isinstance(o, int) else 1) for d, o in zip(i.shape, other)]
        total += int(np.prod(shape, dtype=object)) * 8  # (drawn in float64 / int64, then cast)
        if total > _max_materialize_bytes() // 4:
            raise TasoError(f"random inputs for the model (input '{i.name}' of shape {shape}) would take "
                            f"{total / 2**30:.3g} GiB, too much to run it on this machine")
        if np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[i.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:  # small non-negative integers (valid indices for most gathers), or up to the input's bound
            feeds[i.name] = rng.integers(0, (bounds or {}).get(i.name, 2), shape).astype(dt)
    return feeds


def _session(model, what: str):
    """An onnxruntime CPU session of ``model``: a ModelProto, or the path of an ONNX file (read by
    onnxruntime itself, which maps external data instead of copying it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # (failures are reported in one line of our own)
    try:
        src = model if isinstance(model, str) else model.SerializeToString()
        return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise TasoError(f"onnxruntime cannot load the {what} model: {one_line(e)}") from None


def compare_models(a, b, trials: int = 2, seed: int = 0, bounds: Optional[dict] = None,
                   like: Optional[dict] = None) -> NumericReport:
    """Run both models on ``trials`` random inputs; report the largest output difference. ``a`` and
    ``b`` are ModelProtos or paths of ONNX files. The models run one after the other, so that only one
    session's weights are in memory at a time. ``bounds`` (``index_bounds`` of ``a``) and ``like``
    (``input_shapes`` of ``b``) are worked out from the models where not given."""
    if bounds is None:
        bounds = index_bounds(a if isinstance(a, onnx.ModelProto) else onnx.load(a, load_external_data=False))
    if like is None:
        like = input_shapes(b if isinstance(b, onnx.ModelProto) else onnx.load(b, load_external_data=False))
    rng = np.random.default_rng(seed)
    sa = _session(a, "input")
    names_a = [o.name for o in sa.get_outputs()]
    feeds = [random_feeds(sa, rng, like=like, bounds=bounds) for _ in range(trials)]
    try:
        results_a = [sa.run(None, f) for f in feeds]
    except Exception as e:
        raise TasoError(f"onnxruntime cannot run the input model on random inputs: {one_line(e)}") from None
    del sa
    sb = _session(b, "output")
    names_b = [o.name for o in sb.get_outputs()]
    if names_a != names_b:
        raise TasoError(f"output names differ: {names_a} vs {names_b}")
    max_abs, scale, worst, tolerance, worst_output, inf_output = 0.0, 1.0, 0.0, 1e-5, "", ""
    for f, ra in zip(feeds, results_a):
        try:
            rb = sb.run(None, f)
        except Exception as e:
            raise TasoError(f"onnxruntime cannot run the output model: {one_line(e)}") from None
        for name, x, y in zip(names_a, ra, rb):
            x, y = np.asarray(x), np.asarray(y)
            if x.shape != y.shape or x.dtype != y.dtype:
                raise TasoError(f"output shape/dtype differ: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
            if x.size == 0:
                continue
            if x.dtype.kind in "fc":
                fin = np.isfinite(x)
                if not np.array_equal(fin, np.isfinite(y)):
                    max_abs, inf_output = float("inf"), inf_output or name
                    continue
                d = np.abs(x[fin].astype(np.float64) - y[fin].astype(np.float64))
                dmax = float(d.max()) if d.size else 0.0
                smax = float(np.abs(x[fin]).max()) if fin.any() else 0.0
                max_abs, scale = max(max_abs, dmax), max(scale, smax)
                tol = TOLERANCE.get(x.dtype, 4 * 2.0 ** -7)  # (bfloat16 and other narrow floats)
                if dmax / max(1.0, smax) / tol > worst:
                    worst, tolerance, worst_output = dmax / max(1.0, smax) / tol, tol, name
            else:
                if not np.array_equal(x, y):
                    max_abs, inf_output = float("inf"), inf_output or name
    if max_abs == float("inf"):  # (an output with other non-finite, integer or boolean values comes first)
        worst, worst_output = float("inf"), inf_output
    return NumericReport(max_abs, scale, len(names_a), trials, worst, tolerance, worst_output)
