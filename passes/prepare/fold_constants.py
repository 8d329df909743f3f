"""Fold the generic ONNX ops (``onnx.<Op>``) whose results are constants: ``Shape`` and ``Size`` of a
tensor whose type is static, and any op all of whose operands are weights or such constants.

Exporters compute shapes at run time: torch's ``nn.MultiheadAttention`` scales queries and keys by
``1 / sqrt(sqrt(Shape(q)[-1]))`` (``Shape -> Slice -> Cast -> Sqrt -> Div -> Cast -> Sqrt``) and
builds its mask's target shape with ``ConstantOfShape -> Mul -> Equal -> Where``. With static
shapes these are constants. Left generic, the search's cost model charges each a kernel launch
(onnxruntime folds them when it loads the model) and sees an activation times an unknown value
where there is an activation times a constant. Each folded result becomes a ``taso.weight``
(computed once with ``onnx.reference``, ONNX's reference implementation), and the op is erased
(what it used is left for dead-code elimination).

Not folded: ops with randomness, ops of other domains, results over ``MAX_ELEMENTS`` elements (a
constant the size of an activation would be written into the model) and ops the reference
implementation cannot run (they stay as they are; onnxruntime runs them).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import dense_array, named, new_weight, type_shape
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.passes.prepare.identities import drop_identities
from taso_mlir.passes.weights import FOLDED_PREFIX, fold_weights, fresh_name, weight_names
from taso_mlir.dialect.ops import function_dce

#: the most elements a folded result may have (masks and scales are small; activations are not)
MAX_ELEMENTS = 1 << 16
#: ONNX ops whose result is not a function of their operands
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"})


@ir_step
def fold_generic(f: ir.Operation, prefix: str, names: set) -> int:
    """Replace the uses of every constant result of a generic op of function ``f`` by a new weight named
    ``<prefix><i>`` (not in ``names``, which the new names are added to), and erase the op. Returns the
    number of ops folded."""
    from taso_mlir.dialect.onnx_export import Exporter

    block = f.regions[0].blocks[0]
    known: dict = {}  # ir.Value -> np.ndarray, or None: a weight, read when needed
    exporter = None
    folded = 0
    for o in each_live(ops_of(block)):  # (an op is erased only when the walk is at it)
        if o.name == "taso.weight":
            known[o.results[0]] = None
            continue
        if not o.name.startswith("onnx.") or o.name == "onnx.NoValue" or "taso.domain" in o.attributes:
            continue
        op_type = o.name[len("onnx."):]
        if op_type in RANDOM_OPS or not len(o.results) or not all(_small(r.type) for r in o.results):
            continue
        if op_type in ("Shape", "Size") and len(o.operands) == 1 and type_shape(o.operands[0].type) is not None:
            outs = [_shape_of(o, op_type)]
        elif len(o.operands) and all(v in known or str(v.type) == "none" for v in o.operands) \
                and any(v in known for v in o.operands):
            if exporter is None:
                exporter = Exporter(f)
            outs = _evaluate(exporter, o, [None if str(v.type) == "none" else _read(v, known) for v in o.operands])
        else:
            continue
        if outs is None or len(outs) != len(o.results) or \
                any(tuple(a.shape) != tuple(type_shape(r.type)) or a.dtype != _dtype(r.type)
                    for a, r in zip(outs, o.results)):
            continue  # (a result the declared type does not describe: left to onnxruntime)
        made = []
        try:
            for r, arr in zip(o.results, outs):
                with ir.InsertionPoint(o):
                    made.append(new_weight(fresh_name(prefix, names), arr, r.type, loc=o.location))
        except Exception:  # noqa: BLE001 - a value no weight can hold (an element type numpy has no match for)
            for w in made:
                erase_op(w)
            continue
        for r, w in zip(o.results, made):
            replace_uses(r, w.results[0])
            known[w.results[0]] = None
        erase_op(o)
        folded += 1
    return folded


def _dtype(t: ir.Type):
    """The numpy dtype of a tensor type's elements (None where numpy has none)."""
    from taso_mlir.dialect.types import numpy_dtype, onnx_dtype_of_mlir

    try:
        return np.dtype(numpy_dtype(onnx_dtype_of_mlir(str(ir.RankedTensorType(t).element_type))))
    except Exception:  # noqa: BLE001
        return None


def _small(t: ir.Type) -> bool:
    shape = type_shape(t)
    return shape is not None and int(np.prod(shape, dtype=np.int64)) <= MAX_ELEMENTS


def _shape_of(o: ir.Operation, op_type: str) -> np.ndarray:
    dims = list(type_shape(o.operands[0].type))
    if op_type == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    a = {na.name: na.attr for na in named(o.attributes)}
    r = len(dims)

    def clamp(k: str, default: int) -> int:
        x = ir.IntegerAttr(a[k]).value if k in a else default
        return min(max(x + r if x < 0 else x, 0), r)

    return np.array(dims[clamp("start", 0):clamp("end", r)], dtype=np.int64)


def _read(v: ir.Value, known: dict) -> np.ndarray:
    arr = known.get(v)
    if arr is None:
        arr = dense_array(v.owner.attributes["value"])
        shape = tuple(type_shape(v.type))
        if arr.shape != shape:  # a splat
            arr = np.broadcast_to(arr, shape)
        known[v] = arr
    return arr


def _evaluate(exporter, o: ir.Operation, ins: list) -> Optional[list]:
    """The op's results from ``onnx.reference`` on operand values ``ins`` (None: an omitted optional
    operand), or None where it cannot run it."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    names = ["" if a is None else f"in{k}" for k, a in enumerate(ins)]
    outs = [f"out{k}" for k in range(len(o.results))]
    before = len(exporter.nodes)
    try:
        exporter._generic(o, names, outs)
        node = exporter.nodes[before]
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in sorted(exporter.opsets.items())]
        fn = onnx.helper.make_function("taso.fold", "f", [n for n in names if n], outs, [node], opsets)
        res = ReferenceEvaluator(fn).run(None, {n: a for n, a in zip(names, ins) if n}, attributes={})
    except Exception:  # noqa: BLE001 - an op the reference cannot run stays for onnxruntime
        return None
    finally:
        del exporter.nodes[before:]
    return [np.asarray(x) for x in res]


def _run(st: FuncState) -> None:
    # constants the generic ops compute (from static shapes, from weights) and the weight-only ops, so
    # that identities they reveal (x + a folded zero) go before the search
    f = st.f
    generic_folded = pre_folded = 0
    while True:  # (a generic op can use a taso op's folded result, and the other way round)
        g_n = fold_generic(f, FOLDED_PREFIX, weight_names(f))
        t_n = fold_weights(f)
        generic_folded, pre_folded = generic_folded + g_n, pre_folded + t_n
        if not (g_n or t_n):
            break
        function_dce(f)  # (the taso ops folded are dead, and would be folded again)
    st.count("generic_folded", generic_folded)
    st.count("weights_folded", pre_folded)
    if pre_folded or generic_folded:
        st.count("identities_dropped", drop_identities(f))
        function_dce(f)


PASS = FunctionPass(
    "taso-fold-constants",
    "Fold the generic ops with constant results and the taso ops computing only from weights into new "
    "weights, then drop the identities (x + 0, x * 1) that reveals",
    _run, {"generic_folded": "generic ONNX ops with constant results folded into weights", "weights_folded": "weight-only ops folded into weights", "identities_dropped": "identity ops (x + 0, x * 1) dropped"})
