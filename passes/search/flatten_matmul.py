"""Flattening the leading dimensions of matmuls with a 2-D right operand, so that 2-D rules apply.

The rule library states matmul rules for 2-D operands (the generator's), so a transformer's
projections ``matmul(x, W)`` with ``x`` of shape ``[B, S, K]`` and ``W`` of shape ``[K, N]`` match no
rule. Where two or more such matmuls read the same ``x`` (BERT's Q, K and V), ``taso-search`` first
rewrites them as::

    r = taso.reshape(x) {shape = [B*S, K]}          (one, shared)
    y = taso.reshape(taso.matmul(r, W)) {shape = [B, S, N]}

and after the search ``unflatten_matmuls`` turns every ``reshape(matmul(reshape(x), W))`` of that
form the search left alone back into ``matmul(x, W)``, so an unmerged group costs nothing.

Identity: numpy's matmul broadcasts a 2-D right operand over the leading dimensions, so
``matmul(x, W)[..., i, n] = sum_k x[..., i, k] W[k, n]``, and the row-major reshape maps the leading
index ``(b, s)`` to row ``b*S + s`` and back. ``prove()`` proves the element identity with Z3 for
symbolic indices and values (per row length S and inner length K up to a bound), and on symbolic
tensors at every shape the site checks admit within small bounds (``prove_shapes``).

Conditions (each enforced where the pass fires: ``_projection``, ``_flattened_matmul``, the restore's
result check, ``unflatten_split_matmuls``):
- ``x`` static of rank >= 3, ``lead + [K]``; ``W`` static and exactly 2-D (a batched ``[B, K, N]``
  weight pairs batch ``b`` with rows ``b*S .. b*S+S-1`` of ``x``, which the flat matmul does not);
  a bias operand is ``[N]``, one value per output column, which the reshapes do not move; the
  activation is elementwise, so any;
- the inner reshape is exactly ``[prod(lead), K]`` (row-major, each row of K elements stays a row)
  and the result is reshaped back to exactly ``lead + [N]``: a reshape to another leading shape of
  the same product (``[S, B]`` for ``[B, S]``) is another tensor and is not restored;
- the flat matmul's result has no other use (it goes);
- split: the flat result split on axis 1 (its columns, the last axis) is ``split(matmul(x, W),
  axis=len(lead))`` with the same sizes (any, unequal included), each piece the row-major reshape
  of the other's; a piece's reshape to any shape reads the 3-D piece instead (a row-major reshape of
  a reshape is one reshape), and its other users read a reshape of the 3-D piece to ``[rows, n]``.
"""

from __future__ import annotations

import functools
import math

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import check_live, each_live, erase_op, ir_step, ops_of, replace_uses, set_operand
from taso_mlir.dialect.ops import create_taso_op, taso_attrs
from taso_mlir.passes.ir_util import static_shape, defining_op, use_owner, tensor_like, op_sig
from taso_mlir.passes.pipeline import FuncState, FunctionPass


def _projection(op: ir.Operation, x: ir.Value) -> bool:
    """A taso.matmul reading ``x`` (static, rank >= 3) as its left operand and a static 2-D right one."""
    if op.name != "taso.matmul" or len(op.operands) not in (2, 3) or op.operands[0] != x:
        return False  # (a third operand is a bias, one value per output column: it reshapes with W)
    xs, ws = static_shape(op.operands[0]), static_shape(op.operands[1])
    return xs is not None and ws is not None and len(xs) >= 3 and len(ws) == 2


@ir_step
def flatten_shared_matmuls(f: ir.Operation) -> int:
    """Rewrite each group of two or more matmuls that read the same [..., K] value with 2-D right
    operands as matmuls of one shared 2-D reshape of it (module docstring). Returns the number of
    matmuls rewritten."""
    block = f.regions[0].blocks[0]
    # Groups are found first (nothing is erased while the block is walked) and kept as lists of ops
    # only. A group's shared input is read from its first matmul when the group is rewritten, never
    # kept: it may be the result of a matmul of an earlier group, which that group's rewrite erases
    # (``x@Wa`` feeding ``a@Wc`` and ``a@Wd``); its value handle would then dangle. Each matmul is in
    # exactly one group (the one keyed by its left operand) and only its own group erases it, so the
    # ops kept here are live when their group is rewritten.
    groups, seen = [], set()
    for o in block.operations:
        op = o.operation
        if op.name != "taso.matmul" or not len(op.operands):
            continue
        x = op.operands[0]
        if x in seen:
            continue
        seen.add(x)
        group = []
        for use in x.uses:
            u = use_owner(use)
            if use.operand_number == 0 and _projection(u, x) and not any(u == g for g in group):
                group.append(u)
        if len(group) >= 2:
            group.sort(key=functools.cmp_to_key(lambda a, b: -1 if a.is_before_in_block(b) else 1))
            groups.append(group)
    done = 0
    for group in groups:
        for m in group:
            check_live(m, "a matmul of a group found before the rewrites")
        x = group[0].operands[0]  # live: an earlier group may have replaced the value the group was found by
        xs = static_shape(x)
        rows = math.prod(xs[:-1])
        with ir.InsertionPoint(group[0]):  # before the first reader, after x
            r = create_taso_op("reshape", [x], [tensor_like([rows, xs[-1]], x)], {"shape": [rows, xs[-1]]},
                               loc=group[0].location)
        for m in group:
            out = static_shape(m.results[0])
            with ir.InsertionPoint(m):
                m2 = create_taso_op("matmul", [r.results[0]] + list(m.operands)[1:], [tensor_like([rows, out[-1]], x)],
                                    taso_attrs(m), loc=m.location)
                back = create_taso_op("reshape", [m2.results[0]], [m.results[0].type], {"shape": out},
                                      loc=m.location)
            replace_uses(m.results[0], back.results[0])
            erase_op(m)
            done += 1
    return done


def _flattened_matmul(v: ir.Value):
    """``v`` = ``matmul(reshape(x, [rows, K]), W)`` as the flattening writes it: ``x`` static of rank 3 or
    more (``lead + [K]``, ``prod(lead) = rows``), ``W`` 2-D, and ``v`` the matmul's only use. Returns
    (the matmul, the reshape, x's shape, W's shape), else None."""
    m = defining_op(v)
    if m is None or m.name != "taso.matmul" or sum(1 for _ in m.results[0].uses) != 1:
        return None
    flat = defining_op(m.operands[0])
    if flat is None or flat.name != "taso.reshape":
        return None
    xs, ws, ys = static_shape(flat.operands[0]), static_shape(m.operands[1]), static_shape(m.operands[0])
    if None in (xs, ws, ys) or len(xs) < 3 or len(ws) != 2 or ys != [math.prod(xs[:-1]), xs[-1]]:
        return None
    return m, flat, xs, ws


@ir_step
def unflatten_matmuls(f: ir.Operation) -> int:
    """Turn ``reshape(matmul(reshape(x, [rows, K]), W), lead + [N])`` back into ``matmul(x, W)`` where
    ``x`` has shape ``lead + [K]`` with ``prod(lead) = rows`` and the inner matmul has no other use.
    Returns the number of matmuls restored."""
    block = f.regions[0].blocks[0]
    done = 0
    # (a list taken first: a restore erases the reshape it is at and the matmul and reshape before it,
    # which the walk has passed, as their results are its operands)
    for back in each_live(ops_of(block)):
        if back.name != "taso.reshape":
            continue
        found = _flattened_matmul(back.operands[0])
        if found is None:
            continue
        m, flat, xs, ws = found
        if static_shape(back.results[0]) != xs[:-1] + [ws[-1]]:
            continue
        x = flat.operands[0]
        with ir.InsertionPoint(back):
            m3 = create_taso_op("matmul", [x] + list(m.operands)[1:], [back.results[0].type], taso_attrs(m),
                                loc=m.location)
        replace_uses(back.results[0], m3.results[0])
        erase_op(back)
        erase_op(m)
        if not any(True for _ in flat.results[0].uses):
            erase_op(flat)
        done += 1
    return done


@ir_step
def unflatten_split_matmuls(f: ir.Operation, cost_model) -> int:
    """Where the search merged flattened matmuls, ``split(matmul(reshape(x, [rows, K]), W), axis=1)``
    with ``x`` of shape ``lead + [K]``: read ``x`` itself, ``split(matmul(x, W), axis=len(lead))``, so
    that the reshapes around it go. A piece's reshape takes the 3-D piece instead (a row-major
    reshape of a reshape is one reshape; one to ``lead + [n]`` is the piece itself); a piece's other
    users get a reshape of it to ``[rows, n]``. Done where ``cost_model`` charges less for that (with
    ``cost-model=cpu`` a 3-D MatMul + Add can time slower than the 2-D Gemm). The element identity
    is ``unflatten_matmuls``'s (``prove``) with split's on the column index (``check_split_identity``).
    Returns the number of splits rewritten."""

    block = f.regions[0].blocks[0]
    done = 0
    # (the splits first: the loop erases other ops, whose handles in a list of every op would dangle)
    for split in each_live([o.operation for o in block.operations if o.operation.name == "taso.split"]):
        if taso_attrs(split)["axis"] != 1:
            continue
        found = _flattened_matmul(split.operands[0])
        if found is None:
            continue
        m, flat, xs, ws = found
        x, ys = flat.operands[0], static_shape(m.operands[0])
        lead = xs[:-1]
        users = [[use_owner(u) for u in r.uses] for r in split.results]
        sizes = list(taso_attrs(split)["sizes"])
        gone = [u for us in users for u in us if u.name == "taso.reshape" and static_shape(u.results[0]) == lead + [static_shape(u.operands[0])[-1]]]
        added = [i for i, us in enumerate(users) if any(u.name != "taso.reshape" for u in us)]
        flat_goes = sum(1 for _ in flat.results[0].uses) == 1
        if flat_goes:
            gone.append(flat)
        dtype = str(ir.RankedTensorType(x.type).element_type)
        weights = (False,) + tuple(defining_op(v) is not None and defining_op(v).name == "taso.weight" for v in list(m.operands)[1:])
        operand_shapes = [static_shape(v) for v in list(m.operands)[1:]]
        n = ws[-1]
        rows = ys[0]

        def cost(kind, attrs, ins, outs, w=None):
            return cost_model.cost(op_sig(kind, attrs, ins, outs, dtype, w or (False,) * len(ins)))

        old_cost = (cost("matmul", taso_attrs(m), [ys] + operand_shapes, [[rows, n]], weights)
                    + cost("split", {"axis": 1, "sizes": sizes}, [[rows, n]], [[rows, k] for k in sizes])
                    + sum(cost("reshape", {"shape": static_shape(u.results[0])}, [static_shape(u.operands[0])], [static_shape(u.results[0])])
                          for u in gone))
        new_cost = (cost("matmul", taso_attrs(m), [xs] + operand_shapes, [lead + [n]], weights)
                    + cost("split", {"axis": len(lead), "sizes": sizes}, [lead + [n]], [lead + [k] for k in sizes])
                    + sum(cost("reshape", {"shape": [rows, sizes[i]]}, [lead + [sizes[i]]], [[rows, sizes[i]]])
                          for i in added))
        if new_cost >= old_cost:
            continue
        with ir.InsertionPoint(split):
            m3 = create_taso_op("matmul", [x] + list(m.operands)[1:], [tensor_like(lead + [ws[-1]], x)], taso_attrs(m),
                                loc=m.location)
            s3 = create_taso_op("split", [m3.results[0]], [tensor_like(lead + [n], x) for n in sizes],
                                {"axis": len(lead), "sizes": sizes}, loc=split.location)
        for i, piece in enumerate(split.results):
            new = s3.results[i]
            flat_piece = None
            for u in users[i]:
                if u.name == "taso.reshape":
                    if static_shape(u.results[0]) == lead + [sizes[i]]:
                        replace_uses(u.results[0], new)
                        erase_op(u)
                    else:
                        set_operand(u, 0, new)
                    continue
                if flat_piece is None:
                    with ir.InsertionPoint(split):  # (after the new split, before every user of the old)
                        flat_piece = create_taso_op("reshape", [new], [piece.type], {"shape": static_shape(piece)},
                                                    loc=split.location)
                for k, operand in enumerate(u.operands):
                    if operand == piece:
                        set_operand(u, k, flat_piece.results[0])
        erase_op(split)
        erase_op(m)
        if flat_goes:
            erase_op(flat)
        done += 1
    return done


def _split_pieces_match(lead, sizes, flat_axis: int = 1) -> bool:
    """On an ``arange`` tensor of shape ``lead + [sum(sizes)]``: the pieces of its flattened form split
    on ``flat_axis``, reshaped to the 3-D pieces' shapes, equal the pieces of the split on the last axis
    (and the other way round). ``flat_axis`` 1 is the identity ``unflatten_split_matmuls`` uses."""
    import numpy as np

    n = sum(sizes)
    m = np.arange(math.prod(lead) * n).reshape(list(lead) + [n])
    cuts = np.cumsum(sizes)[:-1]
    flat = np.split(m.reshape(-1, n), cuts * (m.reshape(-1, n).shape[flat_axis] // n), axis=flat_axis)
    whole = np.split(m, cuts, axis=-1)
    return all(p.size == q.size and np.array_equal(p.reshape(q.shape), q) and np.array_equal(q.reshape(p.shape), p)
               for p, q in zip(flat, whole))


def check_split_identity(max_rank: int = 4, max_dim: int = 3) -> int:
    """Exhaustive check of the split half of ``unflatten_split_matmuls`` (``_split_pieces_match``) for
    every leading shape of 2..``max_rank``-1 dims up to ``max_dim`` and every way of cutting 2..4
    columns in two or three pieces. Returns the number of cases checked; raises AssertionError on the
    first that differs."""
    import itertools

    cases = 0
    for rank in range(2, max_rank):
        for lead in itertools.product(range(1, max_dim + 1), repeat=rank):
            for n in range(2, 5):
                for cuts in itertools.chain(itertools.combinations(range(1, n), 1), itertools.combinations(range(1, n), 2)):
                    sizes = [b - a for a, b in zip((0,) + cuts, cuts + (n,))]
                    assert _split_pieces_match(list(lead), sizes), (lead, sizes)
                    cases += 1
    return cases


def prove(max_rows: int = 4, max_inner: int = 3):
    """Z3 proof of the element identity: for row lengths S = 1..``max_rows`` and inner lengths
    K = 1..``max_inner``, symbolic indices b >= 0, 0 <= s < S, n and symbolic values (uninterpreted
    real functions X(b, s, k) and W(k, n)), ``sum_k X(b, s, k) W(k, n)`` equals the 2-D product's
    element at row ``b*S + s`` of the reshape ``R(r, k) = X(r div S, r mod S, k)``. Returns
    ``z3.unsat`` (proved) or the first other result."""
    import z3

    X = z3.Function("X", z3.IntSort(), z3.IntSort(), z3.IntSort(), z3.RealSort())
    W = z3.Function("W", z3.IntSort(), z3.IntSort(), z3.RealSort())
    b, s, n = z3.Ints("b s n")
    for S in range(1, max_rows + 1):
        for K in range(1, max_inner + 1):
            row = b * S + s
            batched = z3.Sum([X(b, s, k) * W(k, n) for k in range(K)])
            flat = z3.Sum([X(row / S, row % S, k) * W(k, n) for k in range(K)])
            solver = z3.Solver()
            solver.add(b >= 0, s >= 0, s < S, batched != flat)
            r = solver.check()
            if r != z3.unsat:
                return r
    return z3.sat if prove_shapes() else z3.unsat


def prove_shapes(max_dim: int = 3) -> list:
    """The rewrites at the shapes the site checks admit, on symbolic tensors (``verifier.symbolic``):
    for every leading shape ``lead`` of 2 axes of size 1..``max_dim`` and of 3 axes of size 1..2 (size-1
    axes and equal sizes included), K = 1, 2, N = 1..3, with and without a bias [N]:
    ``reshape(matmul(reshape(x, [prod(lead), K]), W, b), lead + [N]) = matmul(x, W, b)``, and for every
    split of the N columns into 2 or 3 pieces, each piece of ``split(matmul(x, W, b), len(lead))`` is
    the flat piece reshaped to ``lead + [n]`` and the other way round, and a reshape of the flat piece
    to ``[n, prod(lead)]`` (another shape) is that reshape of the 3-D piece. Returns the cases that
    fail (none: proved)."""
    import itertools

    import numpy as np

    from taso_mlir.verifier import symbolic as S

    bad = []
    leads = [list(t) for t in itertools.product(range(1, max_dim + 1), repeat=2)]
    leads += [list(t) for t in itertools.product((1, 2), repeat=3)]
    for lead, K, N, bias in itertools.product(leads, (1, 2), (1, 2, 3), (False, True)):
        x, W = S.tensor("x", lead + [K]), S.tensor("W", [K, N])
        b = S.tensor("b", [N]) if bias else 0
        rows = math.prod(lead)
        whole = np.matmul(x, W) + b
        flat = np.matmul(x.reshape(rows, K), W) + b
        d = S.differs(flat.reshape(lead + [N]), whole)
        if d is not None:
            bad.append(("restore", lead, K, N, bias, d))
        for parts in (2, 3):
            for cuts in itertools.combinations(range(1, N), parts - 1):
                pieces3 = np.split(whole, list(cuts), axis=len(lead))
                pieces2 = np.split(flat, list(cuts), axis=1)
                for p3, p2 in zip(pieces3, pieces2):
                    n = p3.shape[-1]
                    for got, want, what in ((p2.reshape(lead + [n]), p3, "piece"), (p3.reshape(rows, n), p2, "flat piece"),
                                            (p3.reshape(n, rows), p2.reshape(n, rows), "other reshape")):
                        d = S.differs(got, want)
                        if d is not None:
                            bad.append((what, lead, K, N, bias, cuts, d))
    return bad


def _run_flatten(st: FuncState) -> None:
    st.count("matmuls_flattened", flatten_shared_matmuls(st.f))


def _run_unflatten(st: FuncState) -> None:
    st.count("matmuls_unflattened", unflatten_matmuls(st.f))
    st.count("merged_matmuls_unflattened", unflatten_split_matmuls(st.f, st.cost_model))


FLATTEN = FunctionPass("taso-flatten-matmuls", "Sibling matmuls of one [..., K] input on 2-D reshapes of it, "
                       "so that 2-D rules apply", _run_flatten, {"matmuls_flattened": "matmuls of a shared input of rank 3 or more flattened to 2-D for the search"}, group="search",
                       neutral=("matmuls_flattened",))
UNFLATTEN = FunctionPass("taso-unflatten-matmuls", "The flattened matmuls the search left alone (and merged "
                         "ones, where it costs less) read their 3-D input again", _run_unflatten,
                         {"matmuls_unflattened": "flattened matmuls the search left alone restored", "merged_matmuls_unflattened": "merged flattened matmuls made to read the 3-D input again"}, needs_cost_model=True,
                         group="cleanup", neutral=("matmuls_unflattened", "merged_matmuls_unflattened"))
