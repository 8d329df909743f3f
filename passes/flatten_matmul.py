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
symbolic indices and values (per row length S and inner length K up to a bound).
"""

from __future__ import annotations

import functools
import math

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, taso_attrs


def _shape(v: ir.Value):
    t = ir.RankedTensorType(v.type)
    return list(t.shape) if t.has_static_shape else None


def _owner(v: ir.Value):
    o = v.owner
    return o.operation if isinstance(o, ir.OpView) else (o if isinstance(o, ir.Operation) else None)


def _user(use) -> ir.Operation:
    """The op of a use of a value."""
    o = use.owner
    return o.operation if isinstance(o, ir.OpView) else o


def _tensor(shape, like: ir.Value) -> ir.Type:
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(like.type).element_type)


def _projection(op: ir.Operation, x: ir.Value) -> bool:
    """A taso.matmul reading ``x`` (static, rank >= 3) as its left operand and a static 2-D right one."""
    if op.name != "taso.matmul" or len(op.operands) not in (2, 3) or op.operands[0] != x:
        return False  # (a third operand is a bias, one value per output column: it reshapes with W)
    xs, ws = _shape(op.operands[0]), _shape(op.operands[1])
    return xs is not None and ws is not None and len(xs) >= 3 and len(ws) == 2


def flatten_shared_matmuls(f: ir.Operation) -> int:
    """Rewrite each group of two or more matmuls that read the same [..., K] value with 2-D right
    operands as matmuls of one shared 2-D reshape of it (module docstring). Returns the number of
    matmuls rewritten."""
    block = f.regions[0].blocks[0]
    groups, seen = [], set()
    for o in block.operations:  # groups first (nothing is erased while the block is walked)
        op = o.operation
        if op.name != "taso.matmul" or not len(op.operands):
            continue
        x = op.operands[0]
        if x in seen:
            continue
        seen.add(x)
        group = []
        for use in x.uses:
            u = _user(use)
            if use.operand_number == 0 and _projection(u, x) and not any(u == g for g in group):
                group.append(u)
        if len(group) >= 2:
            group.sort(key=functools.cmp_to_key(lambda a, b: -1 if a.is_before_in_block(b) else 1))
            groups.append((x, group))
    done = 0
    for x, group in groups:
        xs = _shape(x)
        rows = math.prod(xs[:-1])
        with ir.InsertionPoint(group[0]):  # before the first reader, after x
            r = create_taso_op("reshape", [x], [_tensor([rows, xs[-1]], x)], {"shape": [rows, xs[-1]]},
                               loc=group[0].location)
        for m in group:
            out = _shape(m.results[0])
            with ir.InsertionPoint(m):
                m2 = create_taso_op("matmul", [r.results[0]] + list(m.operands)[1:], [_tensor([rows, out[-1]], x)],
                                    taso_attrs(m), loc=m.location)
                back = create_taso_op("reshape", [m2.results[0]], [m.results[0].type], {"shape": out},
                                      loc=m.location)
            m.results[0].replace_all_uses_with(back.results[0])
            m.erase()
            done += 1
    return done


def unflatten_matmuls(f: ir.Operation) -> int:
    """Turn ``reshape(matmul(reshape(x, [rows, K]), W), lead + [N])`` back into ``matmul(x, W)`` where
    ``x`` has shape ``lead + [K]`` with ``prod(lead) = rows`` and the inner matmul has no other use.
    Returns the number of matmuls restored."""
    block = f.regions[0].blocks[0]
    done = 0
    for o in list(block.operations):
        back = o.operation
        if back.name != "taso.reshape":
            continue
        m = _owner(back.operands[0])
        if m is None or m.name != "taso.matmul" or sum(1 for _ in m.results[0].uses) != 1:
            continue
        flat = _owner(m.operands[0])
        if flat is None or flat.name != "taso.reshape":
            continue
        x, w = flat.operands[0], m.operands[1]
        xs, ws, ys, outs = _shape(x), _shape(w), _shape(m.operands[0]), _shape(back.results[0])
        if None in (xs, ws, ys, outs) or len(xs) < 3 or len(ws) != 2 or len(ys) != 2:
            continue
        if ys != [math.prod(xs[:-1]), xs[-1]] or outs != xs[:-1] + [ws[-1]]:
            continue
        with ir.InsertionPoint(back):
            m3 = create_taso_op("matmul", [x] + list(m.operands)[1:], [back.results[0].type], taso_attrs(m),
                                loc=m.location)
        back.results[0].replace_all_uses_with(m3.results[0])
        back.erase()
        m.erase()
        if not any(True for _ in flat.results[0].uses):
            flat.erase()
        done += 1
    return done


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
    return z3.unsat
