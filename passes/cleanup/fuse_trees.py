"""``taso-fuse-split-trees`` and ``taso-fuse-concat-trees``: nested splits and concats on one axis as one op.

TASO's split and concat take two pieces, so rules that merge k convolutions or matmuls leave a tree of
k - 1 splits, and batching k tensors a chain of k - 1 concats. One split (concat) of all the pieces reads
and writes the same bytes in one launch. Both are exact (data movement only).
"""

from __future__ import annotations

from taso_mlir.dialect import specs
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, taso_attrs
from taso_mlir.passes.pipeline import FuncState, FunctionPass


@ir_step
def fuse_concat_trees(f: ir.Operation) -> int:
    """Make each concat that is an operand of another concat on the same axis, and has no other use,
    part of it: one concat of all the pieces (at most ``specs.MAX_ARITY``), which reads and writes the
    outer concat's bytes in one launch instead of copying the inner pieces twice. TASO's concat takes
    two operands, so batching k tensors through rules leaves a chain of k - 1 concats (NasRNN's five
    steps' inputs). The search does not count on it: the report's cost after (the function as
    written) is where it shows. Returns the number of concats removed."""
    return _fuse_until_done(f, "taso.concat", _fuse_concat)


def _fuse_until_done(f: ir.Operation, name: str, fuse) -> int:
    """Call ``fuse(op)`` on the function's ops named ``name`` until none rewrites: ``fuse`` returns
    True after replacing ``op`` and its partner (both erased; the walk starts over, as the block
    changed). Returns the number of rewrites."""
    block = f.regions[0].blocks[0]
    fused = 0
    while True:
        for op in each_live(ops_of(block)):
            if op.name == name and fuse(op):
                fused += 1
                break
        else:
            return fused


def _fuse_concat(op: ir.Operation) -> bool:
    axis = taso_attrs(op)["axis"]
    pieces, inner = [], None
    for v in op.operands:
        o = v.owner
        p = o.operation if isinstance(o, ir.OpView) else None
        if (inner is None and p is not None and p.name == "taso.concat" and taso_attrs(p)["axis"] == axis
                and len(list(v.uses)) == 1):
            inner = p
            pieces.extend(p.operands)
        else:
            pieces.append(v)
    if inner is None or len(pieces) > specs.MAX_ARITY:
        return False
    with ir.InsertionPoint(op):
        new = create_taso_op("concat", pieces, [op.results[0].type], {"axis": axis}, loc=op.location)
    replace_uses(op.results[0], new.results[0])
    erase_op(op)
    erase_op(inner)
    return True


@ir_step
def fuse_split_trees(f: ir.Operation) -> int:
    """Make each split of a piece of another split on the same axis part of that split, where nothing
    else uses the piece: one split into the finer pieces (at most ``specs.MAX_ARITY``), which reads
    and writes the same bytes in one launch. TASO's rules split in two; a search that merges k
    matmuls or convolutions leaves a tree of k - 1 splits, and the search costs the tree as its root
    split (``tgraph.Builder.node``). Returns the number of splits removed."""
    return _fuse_until_done(f, "taso.split", _fuse_split)


def _fuse_split(op: ir.Operation) -> bool:
    piece = op.operands[0]
    if not isinstance(piece.owner, ir.OpView) or piece.owner.operation.name != "taso.split":
        return False
    parent = piece.owner.operation
    a_in, a_out = taso_attrs(parent), taso_attrs(op)
    if a_in["axis"] != a_out["axis"] or len(list(piece.uses)) != 1:
        return False
    k = ir.OpResult(piece).result_number
    if len(parent.results) - 1 + len(op.results) > specs.MAX_ARITY:
        return False
    sizes = list(a_in["sizes"][:k]) + list(a_out["sizes"]) + list(a_in["sizes"][k + 1:])
    olds = list(parent.results[:k]) + list(op.results) + list(parent.results[k + 1:])
    with ir.InsertionPoint(parent):
        new = create_taso_op("split", [parent.operands[0]], [r.type for r in olds],
                             {"axis": a_in["axis"], "sizes": sizes}, loc=parent.location)
    for old, r in zip(olds, new.results):
        replace_uses(old, r)
    erase_op(op)
    erase_op(parent)
    return True


def _run_splits(st: FuncState) -> None:
    st.count("splits_fused", fuse_split_trees(st.f))


def _run_concats(st: FuncState) -> None:
    st.count("concats_fused", fuse_concat_trees(st.f))


SPLITS = FunctionPass("taso-fuse-split-trees", "A split of a split's piece on the same axis becomes part of "
                      "its parent", _run_splits, {"splits_fused": "nested splits fused"}, group="cleanup")
CONCATS = FunctionPass("taso-fuse-concat-trees", "A concat of a concat on the same axis becomes one concat",
                       _run_concats, {"concats_fused": "nested concats fused"}, group="cleanup")
