"""Numeric differential check of two ONNX models in onnxruntime on the same random inputs.

Both models run with onnxruntime's graph optimizations off (``ORT_DISABLE_ALL``): the check is about
what the models compute, and onnxruntime's own optimizer computes some valid models wrongly (1.31.1
merges two Splits of one tensor with different output counts, and fuses a MatMul + Add into a Gemm
that mis-shapes a following Reshape), which would fool the check in either direction.

Where the two float32 runs differ by more than the tolerance, the outputs are judged against a float64
evaluation of the input model instead (``float64_reference``), so that a result more accurate than the
input's own float32 run is not refused (``accept_against_reference`` states the criterion)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx

from .errors import TasoError, one_line
from .onnx_common import for_onnxruntime


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
    #: how the float64 reference was computed ("onnxruntime" or "onnx.reference"), "" if none was
    #: (none is needed where the float32 runs agree within the tolerance)
    reference: str = ""
    #: why there is no float64 reference where one was wanted ("" otherwise)
    no_reference: str = ""
    #: for the output ``worst`` comes from, judged against the float64 reference: the largest
    #: |output model - reference| and |input model - reference| (NaN where it was not)
    ref_error: float = float("nan")
    input_ref_error: float = float("nan")

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
#: 4 units in the last place of the narrow float types a model can round to on the way to an output
_NARROW = {onnx.TensorProto.FLOAT16: 4 * 2.0 ** -10, onnx.TensorProto.BFLOAT16: 4 * 2.0 ** -7}


def rounding_floor(model: onnx.ModelProto) -> float:
    """The tolerance of the narrowest float type the model rounds to anywhere (a Cast to it, or a value,
    input or weight of it), 0 where it has none. A rewrite that changes float32 rounding before such a
    cast (a folded batchnorm before a Cast to float16) moves its result by one unit of that type: an
    output is only as precise as the narrowest rounding on the way to it."""
    floor = 0.0
    g = model.graph

    def see(elem_type):
        nonlocal floor
        floor = max(floor, _NARROW.get(elem_type, 0.0))
    for n in g.node:
        if n.op_type == "Cast" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "to":
                    see(a.i)
    for v in list(g.input) + list(g.output) + list(g.value_info):
        see(v.type.tensor_type.elem_type)
    for t in g.initializer:
        see(t.data_type)
    return floor


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
    from .ops import max_materialize_bytes

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
        if total > max_materialize_bytes() // 4:
            raise TasoError(f"random inputs for the model (input '{i.name}' of shape {shape}) would take "
                            f"{total / 2**30:.3g} GiB, too much to run it on this machine")
        if np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[i.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:  # small non-negative integers (valid indices for most gathers), or up to the input's bound
            feeds[i.name] = rng.integers(0, (bounds or {}).get(i.name, 2), shape).astype(dt)
    return feeds


#: c in the float64 criterion (``accept_against_reference``): an output may be as far from the float64
#: reference as the input's own float32 run is (c = 1), plus the float32 tolerance
REFERENCE_SLACK = 1.0
#: the float64 reference is used for an output only where the input's own float32 run is within this
#: many tolerances of it: farther, the reference computes something else than onnxruntime does (an
#: operator whose semantics onnx.reference reads differently) or the model is too ill-conditioned for
#: float32 to mean much, and the output is judged by the float32 comparison alone
REFERENCE_AGREEMENT = 100.0
#: no float64 reference is built for a model whose float64 copy would hold more bytes of weights than
#: this (it is held in memory, and onnxruntime reads it as one protobuf, limited to 2 GB)
MAX_REFERENCE_BYTES = 1 << 30


def _session(model, what: str):
    """An onnxruntime CPU session of ``model``: a ModelProto, serialized bytes, or the path of an ONNX file
    (read by onnxruntime itself, which maps external data instead of copying it). Graph optimizations
    off: the models' own semantics, not what onnxruntime's optimizer makes of them."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # (failures are reported in one line of our own)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        src, folder = for_onnxruntime(model, f"the {what} model")  # (an IR version onnxruntime reads)
        if folder:
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        src = src if isinstance(src, (str, bytes)) else src.SerializeToString()
        return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    except TasoError:
        raise
    except Exception as e:
        raise TasoError(f"onnxruntime cannot load the {what} model: {one_line(e)}") from None


def accept_against_reference(opt_error: float, input_error: float, tol: float, scale: float) -> bool:
    """The float64 criterion for one output. ``opt_error`` and ``input_error`` are the largest
    |output model - reference| and |input model - reference| over the output's elements (all random
    input sets), ``tol`` its element type's tolerance and ``scale`` max(1, largest |input model|).
    Accepted when ``opt_error <= REFERENCE_SLACK * input_error + tol * scale``.

    Why this form: with c = 1 it accepts everything the float32 comparison |opt - input| <= tol * scale
    accepts (|opt - ref| <= |opt - input| + |input - ref|), so judging by float64 only ever adds
    acceptances, and it refuses any result farther from the reference than the input's own float32
    error plus the tolerance the float32 comparison allows anyway. The maxima are compared per output, not
    element by element: a rewrite that rounds differently (weights folded in float64, sums in another
    order) has errors of the same size as the input's but at other elements, and an element the input
    happens to get exactly right would otherwise refuse it. A c above 1 would accept results less
    accurate than the input; below 1, results the float32 comparison accepts today would be refused."""
    return opt_error <= REFERENCE_SLACK * input_error + tol * scale


_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
#: inputs that the ONNX spec types as float32 whatever the data's type: kept float32 in the float64 copy
_FLOAT32_INPUTS = {"Resize": (2,), "Upsample": (1,)}


def _retype(tp: onnx.TypeProto) -> None:
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        t = getattr(tp, which)
        if t.elem_type in _FLOAT_TYPES:
            t.elem_type = onnx.TensorProto.DOUBLE
    elif which == "sequence_type":
        _retype(tp.sequence_type.elem_type)
    elif which == "optional_type":
        _retype(tp.optional_type.elem_type)
    elif which == "map_type":
        _retype(tp.map_type.value_type)


def _tensor64(t: onnx.TensorProto) -> None:
    if t.data_type in _FLOAT_TYPES:
        t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).astype(np.float64), t.name))


def _nodes64(nodes) -> None:
    """The float64 copy of a node list (in place)."""
    from onnx import AttributeProto as A

    fixed = []
    for n in nodes:
        for a in n.attribute:
            if a.type == A.TENSOR:
                _tensor64(a.t)
            elif a.type == A.TENSORS:
                for t in a.tensors:
                    _tensor64(t)
            elif a.type == A.GRAPH:
                _graph64(a.g)
            elif a.type == A.GRAPHS:
                for g in a.graphs:
                    _graph64(g)
            elif a.type == A.INT and a.name in ("to", "dtype") and a.i in _FLOAT_TYPES:
                a.i = onnx.TensorProto.DOUBLE  # Cast, EyeLike, the random generators, SequenceEmpty
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in list(n.attribute):
                if a.name in ("value_float", "value_floats"):
                    v = np.array(a.f if a.name == "value_float" else list(a.floats), np.float64)
                    n.attribute.remove(a)
                    n.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(v)))
        fixed.append(n)
        for k in _FLOAT32_INPUTS.get(n.op_type, ()) if n.domain in ("", "ai.onnx") else ():
            if k < len(n.input) and n.input[k]:
                cast = onnx.helper.make_node("Cast", [n.input[k]], [f"{n.input[k]}__float32_{len(fixed)}"],
                                             to=onnx.TensorProto.FLOAT)
                n.input[k] = cast.output[0]
                fixed.insert(len(fixed) - 1, cast)
    if len(fixed) != len(nodes):
        del nodes[:]
        nodes.extend(fixed)


def _graph64(g: onnx.GraphProto) -> None:
    for t in g.initializer:
        _tensor64(t)
    for t in g.sparse_initializer:
        _tensor64(t.values)
    for vi in list(g.input) + list(g.output):
        _retype(vi.type)
    del g.value_info[:]  # (onnxruntime and onnx.reference infer the intermediate types)
    _nodes64(g.node)


def _bytes64(model: onnx.ModelProto) -> int:
    """Bytes of weights in the float64 copy of ``model``, from the dims (no data read)."""
    from onnx import AttributeProto as A

    def size(t) -> int:
        n = int(np.prod(list(t.dims), dtype=object)) if len(t.dims) else 1
        if t.data_type in _FLOAT_TYPES:
            return 8 * n
        try:
            return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except Exception:
            return len(t.raw_data)

    total = sum(size(t) for t in model.graph.initializer)
    for n in model.graph.node:
        total += sum(size(a.t) for a in n.attribute if a.type == A.TENSOR)
    return total


def float64_copy(model) -> onnx.ModelProto:
    """The input model with every float16, bfloat16 and float32 tensor (weights, constants, graph
    inputs and outputs, Cast targets; subgraphs included) made float64: the same computation in
    higher precision. ``model`` is a ModelProto (not changed) or a path (loaded with its external
    data). A spec input that only takes float32 (Resize's scales) gets a Cast back. TasoError where
    the copy would be over ``MAX_REFERENCE_BYTES``."""
    if not isinstance(model, onnx.ModelProto) and os.path.getsize(model) > MAX_REFERENCE_BYTES:
        raise TasoError(f"the model file holds {os.path.getsize(model) / 2**20:.4g} MiB, its float64 copy "
                        f"would be over {MAX_REFERENCE_BYTES / 2**20:.4g} MiB")  # (without reading it to count)
    head = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
    nbytes = _bytes64(head)
    if nbytes > MAX_REFERENCE_BYTES:
        raise TasoError(f"its float64 copy would hold {nbytes / 2**20:.4g} MiB of weights, over "
                        f"{MAX_REFERENCE_BYTES / 2**20:.4g} MiB")
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        del head
        m = onnx.load(model)
    _graph64(m.graph)
    for f in m.functions:
        _nodes64(f.node)
    return m


def _without_float64_kernel(model: onnx.ModelProto) -> Optional[str]:
    """An op of ``model``'s graph for which onnxruntime's CPU provider registers float32 kernels and no
    float64 one (Conv, Erf, AveragePool, ...), or None: onnxruntime cannot run the float64 copy, which
    is then not serialized for it."""
    try:
        from onnxruntime.capi import _pybind_state as C

        kernels = C.get_all_opkernel_def()
    except Exception:
        return None
    types: dict = {}
    for k in kernels:
        if k.provider == "CPUExecutionProvider":
            allowed = types.setdefault((k.domain, k.op_name), set())
            for v in k.type_constraints.values():
                allowed.update(v)
    for n in model.graph.node:
        allowed = types.get((n.domain if n.domain != "ai.onnx" else "", n.op_type))
        if allowed and "tensor(float)" in allowed and "tensor(double)" not in allowed:
            return n.op_type
    return None


def float64_reference(model, feeds: list, names: list) -> tuple[list, str]:
    """Outputs ``names`` of the input ``model`` (ModelProto or path) evaluated in float64 on ``feeds``
    (the float32 random inputs, widened): onnxruntime on ``float64_copy`` (graph optimizations off)
    where it has a float64 kernel for every op, else ``onnx.reference.ReferenceEvaluator`` on the same
    copy. Returns (one list of arrays per input set, "onnxruntime" or "onnx.reference"); TasoError
    saying why where neither can. Holds the float64 copy once (and, for onnxruntime, its serialized
    form until the session has it)."""
    m = float64_copy(model)
    wide = {i.name for i in m.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE}
    feeds64 = [{k: (v.astype(np.float64) if k in wide else v) for k, v in f.items()} for f in feeds]
    missing = _without_float64_kernel(m)
    if missing:
        return _reference_evaluator(m, names, feeds64, f"onnxruntime has no float64 {missing}")
    data = m.SerializeToString()
    del m
    try:
        s = _session(data, "float64")
    except TasoError as e:
        m = onnx.ModelProto.FromString(data)
        del data
        return _reference_evaluator(m, names, feeds64, _why_not_onnxruntime(e))
    del data
    try:
        return [s.run(names, f) for f in feeds64], "onnxruntime"
    except Exception as e:
        why = _why_not_onnxruntime(e)
    del s
    return _reference_evaluator(float64_copy(model), names, feeds64, why)


def _why_not_onnxruntime(e: Exception) -> str:
    import re

    op = re.search(r"Could not find an implementation for (\w+)\(", str(e))
    return f"onnxruntime has no float64 {op.group(1)}" if op else f"onnxruntime: {one_line(e, 200)}"


def _reference_evaluator(m: onnx.ModelProto, names: list, feeds64: list, why_ort: str) -> tuple[list, str]:
    try:
        from onnx.reference import ReferenceEvaluator

        ev = ReferenceEvaluator(m)
        return [ev.run(names, f) for f in feeds64], "onnx.reference"
    except Exception as e:
        raise TasoError(f"{why_ort}; onnx.reference: {one_line(e, 200)}") from None


def compare_models(a, b, trials: int = 2, seed: int = 0, bounds: Optional[dict] = None,
                   like: Optional[dict] = None, reference: str = "auto") -> NumericReport:
    """Run both models on ``trials`` random inputs (onnxruntime, graph optimizations off); report the
    largest output difference. ``a`` (the input model) and ``b`` (the output model) are ModelProtos or
    paths of ONNX files. The models run one after the other, so that only one session's weights are in
    memory at a time. ``bounds`` (``index_bounds`` of ``a``) and ``like`` (``input_shapes`` of ``b``)
    are worked out from the models where not given.

    A float output passes where the two runs differ by at most its type's tolerance x its scale. One that
    does not is judged against a float64 evaluation of ``a`` (``float64_reference``) by
    ``accept_against_reference``. ``reference``: "auto" builds that reference only where an output
    fails the float32 comparison (by the triangle inequality it would accept every output that passes);
    "always" builds it anyway (to measure it); "never" judges by the float32 comparison alone."""
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
    results_b = []
    for f in feeds:
        try:
            results_b.append(sb.run(None, f))
        except Exception as e:
            raise TasoError(f"onnxruntime cannot run the output model: {one_line(e)}") from None
    del sb
    max_abs, scale, inf_output = 0.0, 1.0, ""
    floor = rounding_floor(a if isinstance(a, onnx.ModelProto) else onnx.load(a, load_external_data=False))
    # per float output: [largest |a - b|, scale, tolerance, ratio to the tolerance]
    judged: dict = {}
    for ra, rb in zip(results_a, results_b):
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
                tol = max(TOLERANCE.get(x.dtype, 4 * 2.0 ** -7), floor)  # (bfloat16 and other narrow floats)
                j = judged.setdefault(name, [0.0, 1.0, tol, 0.0])
                j[0], j[1] = max(j[0], dmax), max(j[1], smax)
                j[3] = j[0] / j[1] / tol
            else:
                if not np.array_equal(x, y):
                    max_abs, inf_output = float("inf"), inf_output or name
    rep = NumericReport(max_abs, scale, len(names_a), trials)
    if max_abs == float("inf"):  # (an output with other non-finite, integer or boolean values comes first)
        rep.worst, rep.worst_output = float("inf"), inf_output
        return rep
    failing = [n for n, j in judged.items() if j[3] > 1.0]
    if (reference == "always" and judged) or (reference == "auto" and failing):
        try:
            refs, rep.reference = float64_reference(a, feeds, list(judged))
        except MemoryError:
            rep.no_reference = "out of memory building it"
        except Exception as e:
            rep.no_reference = str(e) if isinstance(e, TasoError) else one_line(e)
        else:
            _judge_against_reference(judged, names_a, results_a, results_b, refs)
    for name, j in judged.items():
        if j[3] > rep.worst or not rep.worst_output:
            rep.worst, rep.tolerance, rep.worst_output = j[3], j[2], name
            rep.ref_error, rep.input_ref_error = (j[4], j[5]) if len(j) > 4 else (float("nan"), float("nan"))
            if len(j) > 4 and not j[6]:
                rep.no_reference = (f"the float64 reference ({rep.reference}) is {j[5]:.3g} from the input's own "
                                    f"float32 run, over {REFERENCE_AGREEMENT:g} x {j[2]:g} x scale: not used")
    return rep


def _judge_against_reference(judged: dict, names: list, results_a: list, results_b: list, refs: list) -> None:
    """Extend each entry of ``judged`` with the largest |b - ref| and |a - ref| and whether the reference
    is used for it (it agrees with ``a``: ``REFERENCE_AGREEMENT``); where it is and
    ``accept_against_reference`` accepts the output, its ratio becomes at most 1."""
    order = list(judged)
    errs = {n: [0.0, 0.0] for n in order}
    for ra, rb, rr in zip(results_a, results_b, refs):
        got = dict(zip(names, zip(ra, rb)))
        for name, r in zip(order, rr):
            x, y = got[name]
            x, y, r = (np.asarray(v, np.float64) for v in (x, y, r))
            if r.shape != x.shape:
                errs[name] = [float("inf"), float("inf")]  # (the reference computes something else)
                continue
            fin = np.isfinite(x)
            r = np.where(np.isfinite(r), r, x)  # (where only float64 is not finite, judge against the input)
            if fin.any():
                errs[name][0] = max(errs[name][0], float(np.abs(y[fin] - r[fin]).max()))
                errs[name][1] = max(errs[name][1], float(np.abs(x[fin] - r[fin]).max()))
    for name, j in judged.items():
        opt_error, input_error = errs[name]
        dmax, scale, tol, ratio = j
        # (a reference this far from the input's own run is not one to judge by)
        used = input_error <= REFERENCE_AGREEMENT * tol * scale
        j.extend([opt_error, input_error, used])
        if used and accept_against_reference(opt_error, input_error, tol, scale):
            j[3] = min(ratio, opt_error / (REFERENCE_SLACK * input_error + tol * scale))
