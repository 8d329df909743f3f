"""Weights the passes make: fresh names, and the folding of ops that compute only from weights.

``fold_weights`` replaces every `taso` op whose operands are all weights or constants by a weight
holding its value (the reference semantics of ``dialect/specs.py``); ``merge_duplicate_weights`` makes
equal folded weights one. ``taso-fold-constants`` (before the search), ``taso-fold-weights`` (after it)
and the passes that permute or merge weights share them.
"""

from __future__ import annotations

import numpy as np

from taso_mlir.dialect import specs
from taso_mlir.dialect.handles import ir_step, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import dense_array, new_weight, taso_attrs


def weight_names(f: ir.Operation) -> set:
    """The names of the weights of function ``f``."""
    return {ir.StringAttr(o.operation.attributes["name"]).value for o in f.regions[0].blocks[0].operations
            if o.operation.name == "taso.weight"}


def fresh_name(prefix: str, names: set) -> str:
    """``<prefix><i>`` for the first ``i`` from ``len(names)`` that is not in ``names``, added to them."""
    i = len(names)
    while f"{prefix}{i}" in names:
        i += 1
    names.add(f"{prefix}{i}")
    return f"{prefix}{i}"


#: the name prefix of the weights the folding makes
FOLDED_PREFIX = "taso_folded_"


@ir_step
def fold_weights(f: ir.Operation) -> int:
    """Replace every taso op whose operands are all weights or constants by a weight holding its
    value (computed with the reference semantics). Returns the number of ops folded."""
    block = f.regions[0].blocks[0]
    names = weight_names(f)
    values: dict = {}  # ir.Value -> np.ndarray, for weight-like values
    ops = [o.operation for o in block.operations]
    folded = 0
    for op in ops:
        if not op.name.startswith("taso."):
            continue
        kind = op.name[5:]
        if kind == "weight":
            values[op.results[0]] = None  # read on demand
            continue
        if kind in specs.CONSTANTS:
            values[op.results[0]] = None
            continue
        if not len(op.operands) or any(v not in values for v in op.operands):
            continue
        ins = [_value(v, values) for v in op.operands]
        attrs = {k: v for k, v in taso_attrs(op).items()}
        outs = specs.evaluate(kind, ins, attrs, [tuple(ir.RankedTensorType(r.type).shape) for r in op.results])
        for r, arr in zip(op.results, outs):
            wname = fresh_name(FOLDED_PREFIX, names)
            with ir.InsertionPoint(op):
                w = new_weight(wname, arr, r.type, loc=op.location)
            replace_uses(r, w.results[0])
            values[w.results[0]] = None  # read back on demand, as the element type rounded it
        folded += 1
    return folded


@ir_step
def merge_duplicate_weights(f: ir.Operation) -> int:
    """Make each weight the folding created (``taso_folded_*``) that holds the same type and values as
    an earlier weight that weight: merges that concatenate the same kernels at several sites, or a
    weight permuted alike for several matmuls, would otherwise write one copy each into the model.
    Returns the number of weights merged (their ops are dead afterwards)."""
    import hashlib

    def folded(w):
        return ir.StringAttr(w.attributes["name"]).value.startswith(FOLDED_PREFIX)

    block = f.regions[0].blocks[0]
    weights = [o.operation for o in block.operations if o.operation.name == "taso.weight"]
    folded_types = {str(w.results[0].type) for w in weights if folded(w)}
    seen: dict = {}
    merged = 0
    for w in weights:
        t = str(w.results[0].type)
        if t not in folded_types:  # (no folded weight can equal it: its values are not read)
            continue
        arr = np.ascontiguousarray(dense_array(w.attributes["value"]))
        key = (t, hashlib.blake2b(arr.tobytes(), digest_size=16).digest())
        first = seen.setdefault(key, (w, arr))
        if first[0] is w or not folded(w) or not np.array_equal(first[1], arr):
            continue  # the first of its values, or one of the input's own weights (they stay as they are)
        replace_uses(w.results[0], first[0].results[0])
        merged += 1
    return merged


def _np_dtype(et) -> np.dtype:
    s = str(et)
    return {"f32": np.float32, "f64": np.float64, "f16": np.float16}.get(s, np.float32)


def _value(v: ir.Value, values: dict) -> np.ndarray:
    arr = values.get(v)
    if arr is None:
        op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
        et = ir.RankedTensorType(v.type).element_type
        if op.name == "taso.weight":
            arr = dense_array(op.attributes["value"])
        else:
            arr = specs.constant(op.name, tuple(ir.RankedTensorType(v.type).shape), _np_dtype(et))
        values[v] = arr
    return arr
