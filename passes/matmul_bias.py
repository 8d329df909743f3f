"""Folding a bias add into the matmul it follows: ``ewadd(matmul(x, W), b) -> matmul(x, W, b)``.

Where a ``taso.matmul`` without activation or bias has one use, an ``ewadd`` with a weight ``b`` of
shape ``[N]`` (one value per output column: a Gemm's C, a linear layer's bias), the add is the
matmul's bias operand by the operator's definition (``dialect.specs``: ``x @ W + b``, then the
activation). ``taso-search`` does this before the search, so that the ``matmul-bias`` rules (merging
biased matmuls, fusing relu into them) see the bias, and a Gemm's or a linear layer's bias add is no
longer an op of its own between the matmul and what follows. The export writes a biased matmul as
``Gemm`` (2-D) or ``MatMul`` + ``Add``, which is what it came from.

Numerics: the same sums in the same order except for where the bias is added (onnxruntime's Gemm may
start its accumulation from C); tested against the reference semantics and in onnxruntime
(``test/unit/test_matmul_bias.py``).
"""

from __future__ import annotations

from taso_mlir.dialect.convert_onnx_to_taso import _weight_of
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import create_taso_op, taso_attrs

from .flatten_matmul import _owner, _shape


def _gains(cost_model, m: ir.Operation, b: ir.Value, add: ir.Operation) -> bool:
    """The biased matmul costs no more than the matmul and the add apart (under ``cost_model``)."""
    from .cost import OpSig

    x, w = m.operands[0], m.operands[1]
    xs, ws, ys, bs = _shape(x), _shape(w), _shape(m.results[0]), _shape(b)
    dtype = str(ir.RankedTensorType(m.results[0].type).element_type)
    wx, ww = _weight_of(x) is not None, _weight_of(w) is not None
    act = (("activation", "none"),)
    apart = (cost_model.cost(OpSig("matmul", act, (tuple(xs), tuple(ws)), (tuple(ys),), dtype, False, (wx, ww)))
             + cost_model.cost(OpSig("ewadd", (), (tuple(ys), tuple(bs)), (tuple(ys),), dtype, False, (False, True))))
    fused = cost_model.cost(OpSig("matmul", act, (tuple(xs), tuple(ws), tuple(bs)), (tuple(ys),), dtype, False,
                                  (wx, ww, True)))
    return fused <= apart


@ir_step
def fuse_matmul_bias(f: ir.Operation, cost_model=None) -> int:
    """Fold each bias add into its matmul (module docstring); with a cost model, only where the biased
    matmul costs no more than the two ops apart (measured on the CPU, a 3-D MatMul + Add can time
    slower as one model than its parts). Returns the number folded."""
    block = f.regions[0].blocks[0]
    done = 0
    # (a list taken first: a fold erases the add it is at and the matmul before it, which the walk has
    # passed, as its result is the add's operand)
    for add in each_live(ops_of(block)):
        if add.name != "taso.ewadd" or len(add.operands) != 2:
            continue
        for side in (0, 1):
            m, b = _owner(add.operands[side]), add.operands[1 - side]
            if m is None or m.name != "taso.matmul" or len(m.operands) != 2:
                continue
            if taso_attrs(m).get("activation") != "none" or sum(1 for _ in m.results[0].uses) != 1:
                continue
            out, bs = _shape(m.results[0]), _shape(b)
            if out is None or bs != [out[-1]] or _weight_of(b) is None or add.results[0].type != m.results[0].type:
                continue
            if cost_model is not None and (_shape(m.operands[0]) is None or _shape(m.operands[1]) is None
                                           or not _gains(cost_model, m, b, add)):
                continue
            with ir.InsertionPoint(add):
                fused = create_taso_op("matmul", [m.operands[0], m.operands[1], b], [m.results[0].type],
                                       {"activation": "none"}, loc=m.location)
            replace_uses(add.results[0], fused.results[0])
            erase_op(add)
            erase_op(m)
            done += 1
            break
    return done
