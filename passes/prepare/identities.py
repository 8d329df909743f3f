"""Removing elementwise ops that are identities by their constant operand.

``x + 0``, ``x * 1`` (``ewadd``/``ewmul`` with a ``taso.weight`` operand whose every element is 0,
resp. 1) and ``smul(x, 1)`` are ``x`` where the result has ``x``'s type (the constant broadcasts onto
``x`` and changes neither shape nor element type). They appear once weights are folded: an RNN's
first step multiplies its zero initial state by the recurrent weights, and the folded product is a
zero weight added to the input projection. ``taso-search`` folds weight-only ops and drops these
identities before the search (so its costs see the graph as it will be) and again after it.

Numerics: exact, except that ``-0.0 + 0.0`` is ``+0.0`` (equal as a number). ``prove()`` proves the
identities over the reals with Z3.
"""

from __future__ import annotations

import numpy as np

from taso_mlir.dialect.convert_onnx_to_taso import weight_of
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import dense_array

_NEUTRAL = {"taso.ewadd": 0.0, "taso.ewmul": 1.0, "taso.smul": 1.0}


def _constant_value(v: ir.Value):
    op = weight_of(v)
    if op is None:
        return None
    value = op.attributes["value"]
    if not isinstance(value, ir.DenseElementsAttr):
        return None
    try:
        if value.is_splat:
            return np.asarray(value.get_splat_value().value, dtype=np.float64)
        return dense_array(value)
    except Exception:  # an element type numpy cannot hold: not an identity we can see
        return None


@ir_step
def drop_identities(f: ir.Operation) -> int:
    """Replace each identity op (module docstring) by its other operand. Returns the number replaced."""
    block = f.regions[0].blocks[0]
    done = 0
    for op in each_live(ops_of(block)):  # (an op is erased only when the walk is at it)
        neutral = _NEUTRAL.get(op.name)
        if neutral is None or len(op.operands) != 2 or len(op.results) != 1:
            continue
        if str(ir.RankedTensorType(op.results[0].type).element_type) not in ("f16", "bf16", "f32", "f64"):
            continue
        sides = [1] if op.name == "taso.smul" else [0, 1]
        for c in sides:
            keep = op.operands[1 - c]
            if keep.type != op.results[0].type:
                continue  # the constant broadcasts: the result is not the other operand
            val = _constant_value(op.operands[c])
            if val is None or val.size == 0 or not np.all(val == neutral):
                continue
            replace_uses(op.results[0], keep)
            erase_op(op)
            done += 1
            break
    return done


def prove():
    """Z3 proof over the reals: x + 0 = x and x * 1 = x. Returns ``z3.unsat`` (proved) or the result."""
    import z3

    x = z3.Real("x")
    s = z3.Solver()
    s.add(z3.Or(x + 0 != x, x * 1 != x))
    return s.check()
