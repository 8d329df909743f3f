"""``taso-fuse-split-trees`` and ``taso-fuse-concat-trees``: nested splits and concats on one axis as one op.

TASO's split and concat take two pieces, so rules that merge k convolutions or matmuls leave a tree of
k - 1 splits, and batching k tensors a chain of k - 1 concats. One split (concat) of all the pieces reads
and writes the same bytes in one launch. ``taso-fuse-split-trees`` then cuts a nest of splits on two
axes (every piece of a split on axis a split on axis b into the same sizes) in the order that needs
fewer splits (``swap_split_nests``). All are exact (data movement only).
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


@ir_step
def swap_split_nests(f: ir.Operation) -> int:
    """Where every piece of a split on axis a is split, and only split, on another axis b into the same
    sizes (a matmul batched over n steps and merged over m gates: cut into gates, each gate into
    steps), cut on b first and each piece on a: ``split_b(split_a(X)#g)#s = split_a(split_b(X)#s)#g``,
    both the block (s, g) of X. That is 1 + n splits instead of 1 + m, done where n < m; the pieces of
    step s then come from one split, as the step's other operands' pieces do, which
    ``taso-lift-elementwise`` needs. Returns the number of nests swapped."""
    return _fuse_until_done(f, "taso.split", _swap_nest)


def _swap_nest(op: ir.Operation) -> bool:
    a = taso_attrs(op)
    inner = []
    for r in op.results:
        users = [u.owner for u in r.uses]
        if len(users) != 1 or users[0].name != "taso.split":
            return False
        inner.append(users[0])
    b = taso_attrs(inner[0])
    if b["axis"] == a["axis"] or any(taso_attrs(i) != b for i in inner) or len(b["sizes"]) >= len(a["sizes"]):
        return False
    x = op.operands[0]
    shape = list(ir.RankedTensorType(x.type).shape)
    et = ir.RankedTensorType(x.type).element_type

    def cut(shape, axis, k):
        return ir.RankedTensorType.get([k if d == axis else n for d, n in enumerate(shape)], et)

    with ir.InsertionPoint(op):
        outer = create_taso_op("split", [x], [cut(shape, b["axis"], k) for k in b["sizes"]], b, loc=op.location)
        rows = []
        for t in outer.results:
            ts = list(ir.RankedTensorType(t.type).shape)
            rows.append(create_taso_op("split", [t], [cut(ts, a["axis"], k) for k in a["sizes"]], a,
                                       loc=op.location))
    for g, i in enumerate(inner):
        for s_, r in enumerate(i.results):
            replace_uses(r, rows[s_].results[g])
    for i in inner:
        erase_op(i)
    erase_op(op)
    return True


def _run_splits(st: FuncState) -> None:
    st.count("splits_fused", fuse_split_trees(st.f))
    st.count("nests_swapped", swap_split_nests(st.f))


def _run_concats(st: FuncState) -> None:
    st.count("concats_fused", fuse_concat_trees(st.f))


SPLITS = FunctionPass("taso-fuse-split-trees", "A split of a split's piece on the same axis becomes part of "
                      "its parent; a nest of splits on two axes is cut in the order of fewer splits", _run_splits,
                      {"splits_fused": "nested splits fused", "nests_swapped": "split nests on two axes cut in the "
                       "other order"}, group="cleanup")
CONCATS = FunctionPass("taso-fuse-concat-trees", "A concat of a concat on the same axis becomes one concat",
                       _run_concats, {"concats_fused": "nested concats fused"}, group="cleanup")
