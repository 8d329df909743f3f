"""``taso-dce``: dead-code elimination for `taso` and generic `onnx` operations.

ONNX operators are side-effect free, so an operation none of whose results is used can go. The
greedy pattern driver never deletes dead IRDL ops (they have no side-effect interface), hence this pass.
"""

from __future__ import annotations

from taso_mlir.dialect.mlir import ir


def _unused(op: ir.Operation) -> bool:
    for r in op.results:
        for _ in r.uses:
            return False
    return True


def dead_code_elimination(module_op: ir.Operation) -> int:
    """Erase dead taso/onnx ops in every function, last to first, until none is left. Returns the count."""
    erased = 0
    for f in module_op.regions[0].blocks[0].operations:
        if f.operation.name != "func.func":
            continue
        block = f.operation.regions[0].blocks[0]
        ops = [o.operation for o in block.operations]
        for o in reversed(ops):
            if (o.name.startswith("taso.") or o.name.startswith("onnx.")) and _unused(o):
                o.erase()
                erased += 1
    return erased
