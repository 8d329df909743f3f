"""Common subexpressions: an op that repeats an earlier op (same name, operands, attributes and result
types) is replaced by it.

Exporters repeat work per layer: ``nn.TransformerEncoder`` reshapes and expands the padding mask once
for every layer. `taso` ops and ONNX operators are pure functions of their operands (ONNX has no side
effects), so the repeat computes the same values; MLIR's own ``cse`` pass leaves them alone because
IRDL-defined and unregistered ops declare no memory effects. Not merged: ops with randomness, ops of
other domains (``taso.domain``: a custom op need not be pure), weights (each is its own tensor; equal
folded weights are merged after the search).
"""

from __future__ import annotations

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import named

from taso_mlir.passes.prepare.fold_constants import RANDOM_OPS
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.passes.weights import merge_duplicate_weights
from taso_mlir.dialect.ops import function_dce


def _key(op: ir.Operation):
    if op.name in ("taso.weight", "func.return") or len(op.regions) or "taso.domain" in op.attributes:
        return None
    if op.name.startswith("onnx."):
        if op.name[len("onnx."):] in RANDOM_OPS:
            return None
    elif not op.name.startswith("taso."):
        return None
    attrs = tuple(sorted((na.name, str(na.attr)) for na in named(op.attributes)))
    return op.name, tuple(op.operands), attrs, tuple(str(r.type) for r in op.results)


@ir_step
def eliminate_common_subexpressions(f: ir.Operation) -> int:
    """Replace every op of ``f`` that repeats an earlier one by it (its results' uses re-pointed, the op
    erased); returns the number of ops removed."""
    seen: dict = {}
    removed = 0
    # (an op is erased only when the walk is at it; the first of each kind, kept in ``seen``, never is)
    for op in each_live(ops_of(f.regions[0].blocks[0])):
        k = _key(op)
        if k is None:
            continue
        first = seen.get(k)
        if first is None:
            seen[k] = op
            continue
        for a, b in zip(op.results, first.results):
            replace_uses(a, b)
        erase_op(op)
        removed += 1
    return removed


def _run(st: FuncState) -> None:
    # equal folded weights first (``taso_folded_*``: the input's own weights stay as they are): the
    # repeats of an op on them then have the same operands
    f = st.f
    merged = merge_duplicate_weights(f)
    repeats = eliminate_common_subexpressions(f)
    st.count("weights_merged", merged)
    st.count("repeats_merged", repeats)
    if merged or repeats:
        function_dce(f)


PASS = FunctionPass("taso-merge-repeats", "Merge equal folded weights (taso_folded_*) and repeated ops "
                    "(same operands and attributes)", _run, {"weights_merged": "duplicate folded weights merged", "repeats_merged": "ops repeating an earlier op (same operands and attributes) merged into it"})
