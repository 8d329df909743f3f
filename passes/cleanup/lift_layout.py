"""Lifting layout ops over splits: one reshape or transpose of the whole tensor instead of one per piece.

Where every piece of ``split(X)`` goes through a like ``reshape`` or ``transpose``, the pass computes
that op once on ``X`` and splits its result instead:

- ``transpose(split(X, axis=k)#i, perm)`` is piece ``i`` of ``split(transpose(X, perm), axis=a)`` with
  ``perm[a] = k`` and the same sizes: a transpose moves the split axis, it does not cut it. Where the
  pieces' perms differ, the one most use is lifted and a piece transposed by ``q`` keeps a transpose by
  ``residual_perm(perm, q)`` after the split (a torch export's keys: ``[0, 2, 3, 1]`` beside the
  queries' and values' ``[0, 2, 1, 3]``);
- ``reshape(split(X, axis=k)#i, T_i)`` is piece ``i`` of ``split(reshape(X, T), axis=j)`` where the
  targets ``T_i`` agree outside one axis ``j``, their axes before ``j`` hold exactly ``X``'s axes before
  ``k`` (same product), and ``T_i[j] * prod(T_i[j+1:]) = sizes[i] * prod(X.shape[k+1:])``; ``T`` is
  ``T_i`` with ``T[j] = sum_i T_i[j]``. Row-major: for each index of the leading axes, piece ``i`` is one
  contiguous run of ``X`` (at offset ``off_i * inner``), and the reshape keeps every run in place.

A merge of sibling matmuls leaves exactly this: BERT's query, key and value projections, merged into
one matmul and split, each reshaped to heads and transposed. One transpose of ``[S, 3H, D]`` and its
split replace the split and three transposes (two kernels fewer per layer). The rules' split axioms
speak only of a split of a concat, so the search cannot do this.

Before lifting, ``compose_reshapes`` turns ``reshape(reshape(x, s1), s2)`` into ``reshape(x, s2)`` (and
drops a reshape to its operand's own shape): row-major reshapes only relabel the flat order.

Each lift happens only where the cost model says the op on the whole and the new split cost less than
the ops on the pieces (and the old split, where nothing else uses it). ``taso-search`` runs this after
the search, on the function as written (split trees fused, flattened matmuls restored), until nothing
more lifts. Pure data movement: exact. ``prove()`` checks both identities with Z3 for the plans this
module makes on every small shape, and ``check_plans()`` every plan for splits into 2 and 3 pieces
on ``arange`` (each output element names its source, so a match is a proof for that shape);
``test/unit/test_lift_layout.py`` tests the pass in the reference semantics and in onnxruntime.

Identity: ``op(split(X, k, sizes)#i) = split(op'(X), a, sizes')#i`` (then the residual transpose).

Conditions (``_group``, ``_plan``, ``reshape_plan``):
- every piece of the split has a user of the kind (the first is taken; a piece's other users keep
  the old split), static result types, at least two pieces; any number of pieces, any sizes
  (unequal, 1-sized), any rank and axis;
- transpose: the lifted perm is one piece's; the new split is on ``perm.index(k)`` with the same
  sizes; a piece whose perm ``q`` differs keeps ``transpose(.., residual_perm(perm, q))``;
- reshape: the targets ``T_i`` have one rank and agree outside one axis ``j``; their axes before ``j``
  have the product of ``X``'s axes before ``k`` (row-major: for each index of those axes piece ``i`` is
  one contiguous run of ``sizes[i] * inner`` elements, ``inner`` the product of ``X``'s axes after
  ``k``), and ``T_i[j] * prod(T_i[j+1:]) = sizes[i] * inner`` for every piece: then each run stays
  a run at the same offset. Equal products are what is required, not equal axes: ``[2, 3]`` may
  stand for ``[6]``, size-1 axes anywhere; a target that regroups the leading axes across the runs
  (``[4, 6]`` split ``[3, 3]`` to ``[2, 6]``) has no plan.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses, set_operand
from taso_mlir.dialect.ops import create_taso_op, elem_type, taso_attrs

from taso_mlir.passes.cleanup.lift_elementwise import goes_with, lift_until_done, split_cost
from taso_mlir.passes.ir_util import static_shape, defining_op, use_owner, tensor_like, op_sig
from taso_mlir.passes.pipeline import FuncState, FunctionPass


def reshape_plan(shape: list, axis: int, sizes: list, targets: list) -> Optional[tuple[list, int, list]]:
    """Where reshaping the pieces of ``split(X, axis, sizes)`` (``X`` of ``shape``) to ``targets`` is
    splitting one reshape of ``X``: (that reshape's shape, its split axis, its split sizes), else None."""
    if len(targets) != len(sizes) or len({len(t) for t in targets}) != 1:
        return None
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    t0 = list(targets[0])
    for j in range(len(t0)):
        if math.prod(t0[:j]) != outer:
            continue
        if any(list(t[:j]) != t0[:j] or list(t[j + 1:]) != t0[j + 1:] for t in targets):
            continue
        inner_t = math.prod(t0[j + 1:])
        if all(t[j] * inner_t == n * inner for t, n in zip(targets, sizes)):
            new_sizes = [t[j] for t in targets]
            return t0[:j] + [sum(new_sizes)] + t0[j + 1:], j, new_sizes
    return None


def transpose_plan(shape: list, axis: int, sizes: list, perm: list) -> tuple[list, int, list]:
    """Transposing the pieces of ``split(X, axis, sizes)`` by ``perm`` is splitting ``transpose(X, perm)``:
    (its shape, its split axis, its split sizes)."""
    return [shape[p] for p in perm], list(perm).index(axis), list(sizes)


def residual_perm(lifted: list, perm: list) -> list:
    """The perm ``r`` with ``transpose(transpose(x, lifted), r) = transpose(x, perm)``: axis ``d`` of the
    result is axis ``perm[d]`` of ``x``, which is axis ``lifted.index(perm[d])`` of the lifted transpose."""
    return [list(lifted).index(q) for q in perm]


def _piece(whole: list, axis: int, n: int) -> list:
    return list(whole[:axis]) + [n] + list(whole[axis + 1:])


@ir_step
def compose_reshapes(f: ir.Operation) -> int:
    """``reshape(reshape(x))`` -> ``reshape(x)``; a reshape to its operand's type -> the operand. Returns
    the number of reshapes re-pointed or removed (each once)."""
    done = 0
    # (a list taken first: a step erases the reshape it is at and the one before it, which the walk has
    # passed, as its result is the operand)
    for op in each_live(ops_of(f.regions[0].blocks[0])):
        if op.name != "taso.reshape":
            continue
        src = op.operands[0]
        inner = defining_op(src)
        repointed = inner is not None and inner.name == "taso.reshape"
        if repointed:
            set_operand(op, 0, inner.operands[0])
            if not any(True for _ in inner.results[0].uses):
                erase_op(inner)
            src = op.operands[0]
            done += 1
        if src.type == op.results[0].type:
            replace_uses(op.results[0], src)
            erase_op(op)
            done += not repointed
    return done


class _Lifter:
    def __init__(self, f: ir.Operation, cost_model):
        self.block = f.regions[0].blocks[0]
        self.cm = cost_model
        self.lifted = 0

    def _group(self, split: ir.Operation, kind: str) -> Optional[dict]:
        """One ``taso.<kind>`` user per piece (the first): piece -> op, else None."""
        group = {}
        for i, r in enumerate(split.results):
            op = next((use_owner(u) for u in r.uses if use_owner(u).name == f"taso.{kind}"
                       and static_shape(use_owner(u).results[0]) is not None), None)
            if op is None:
                return None
            group[i] = op
        return group

    def _plan(self, split: ir.Operation, kind: str, group: dict):
        """(the op's attributes on the whole, (its shape, the new split's axis and sizes), piece ->
        residual perm), else None. Transposes: the perm most pieces use (the first piece's on a tie) is
        lifted; a piece transposed otherwise keeps a transpose by the residual perm after the split."""
        a = taso_attrs(split)
        shape, axis, sizes = static_shape(split.operands[0]), a["axis"], list(a["sizes"])
        if kind == "reshape":
            plan = reshape_plan(shape, axis, sizes, [static_shape(group[i].results[0]) for i in range(len(sizes))])
            return None if plan is None else ({"shape": plan[0]}, plan, {})
        perms = [tuple(taso_attrs(group[i])["perm"]) for i in range(len(sizes))]
        common = max(perms, key=lambda p: (perms.count(p), -perms.index(p)))
        residual = {i: residual_perm(list(common), list(q)) for i, q in enumerate(perms) if q != common}
        return {"perm": list(common)}, transpose_plan(shape, axis, sizes, list(common)), residual

    def _gains(self, split: ir.Operation, kind: str, group: dict, plan) -> bool:
        attrs, (whole, axis, sizes), residual = plan
        x = split.operands[0]
        dtype = str(elem_type(x))
        xs = static_shape(x)
        pieces = [static_shape(r) for r in split.results]
        outs = [static_shape(group[i].results[0]) for i in range(len(pieces))]
        own = (lambda op: {"perm": list(taso_attrs(op)["perm"])}) if kind == "transpose" else \
            (lambda op: {"shape": static_shape(op.results[0])})
        old = sum(self.cm.cost(op_sig(kind, own(op), [pieces[i]], [outs[i]], dtype, (False,)))
                  for i, op in group.items())
        if goes_with(split, list(group.values())):
            old += split_cost(self.cm, split)
        new_pieces = [_piece(whole, axis, n) for n in sizes]
        new = (self.cm.cost(op_sig(kind, attrs, [xs], [whole], dtype, (False,)))
               + self.cm.cost(op_sig("split", {"axis": axis, "sizes": sizes}, [whole], new_pieces, dtype, (False,)))
               + sum(self.cm.cost(op_sig("transpose", {"perm": r}, [new_pieces[i]], [outs[i]], dtype, (False,)))
                     for i, r in residual.items()))
        return new < old

    def _lift(self, split: ir.Operation, kind: str, group: dict, plan) -> None:
        attrs, (whole, axis, sizes), residual = plan
        x = split.operands[0]
        with ir.InsertionPoint(split):
            w = create_taso_op(kind, [x], [tensor_like(whole, x)], attrs, loc=split.location)
            s = create_taso_op("split", [w.results[0]], [tensor_like(_piece(whole, axis, n), x) for n in sizes],
                               {"axis": axis, "sizes": sizes}, loc=split.location)
        for i, op in group.items():
            new = s.results[i]
            if i in residual:
                with ir.InsertionPoint(op):
                    new = create_taso_op("transpose", [new], [op.results[0].type], {"perm": residual[i]},
                                         loc=op.location).results[0]
            replace_uses(op.results[0], new)
            erase_op(op)
        if not any(True for r in split.results for _ in r.uses):
            erase_op(split)
        self.lifted += len(group) - len(residual)

    def _try(self, split: ir.Operation) -> bool:
        for kind in ("reshape", "transpose"):
            group = self._group(split, kind)
            if group is None or len(group) < 2:
                continue
            plan = self._plan(split, kind, group)
            if plan is not None and self._gains(split, kind, group, plan):
                self._lift(split, kind, group, plan)
                return True
        return False

    def run(self) -> None:
        # Ends: a lift replaces ops by ops the cost model says cost less in all (what it adds, residual
        # transposes included, against what it removes), so each lowers the function's cost.
        lift_until_done(self.block, self._try)


@ir_step
def lift_layout(f: ir.Operation, cost_model) -> tuple[int, int]:
    """Compose reshape chains, then lift reshapes and transposes over the splits of ``f`` (module
    docstring) where ``cost_model`` says it gains. Returns (reshapes composed, layout ops lifted)."""
    composed = compose_reshapes(f)
    lf = _Lifter(f, cost_model)
    lf.run()
    if lf.lifted:
        composed += compose_reshapes(f)  # a lifted reshape of a reshape's result
    return composed, lf.lifted


# ---------------------------------------------------------------------------------------------
# proof


def flat_index(idx: list, shape: list):
    out = 0
    for i, n in zip(idx, shape):
        out = out * n + i
    return out


def unflat_index(flat, shape: list) -> list:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat = flat // n if isinstance(flat, int) else flat / n  # z3: integer division
    return list(reversed(idx))


def _layouts(max_rank: int, max_dim: int):
    for rank in range(1, max_rank + 1):
        yield from itertools.product(range(1, max_dim + 1), repeat=rank)


def _factorings(n: int, max_rank: int):
    """Every shape of up to ``max_rank`` axes (at most one of them 1) whose product is ``n``."""
    for rank in range(1, max_rank + 1):
        for dims in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=rank):
            if math.prod(dims) == n and sum(1 for d in dims if d == 1) <= 1:
                yield list(dims)


def prove(max_rank: int = 3, max_dim: int = 3, max_target_rank: int = 3):
    """Z3 proof, for every split into two pieces of every shape of up to ``max_rank`` axes of size
    1..``max_dim`` and every plan this module makes for it (``transpose_plan`` for every permutation,
    ``reshape_plan`` for every reshape of the pieces to up to ``max_target_rank`` axes, at most one of
    them 1), that the new split's piece ``i`` has the shape of the op on piece ``i`` and that its
    element ``m`` is that op's element ``m`` (and, for every two perms, that the ``residual_perm``
    transpose after the lifted one is the other), for a symbolic tensor ``X`` (an uninterpreted
    function of the flat index) and a symbolic in-range index ``m``. The scope is bounded: two pieces,
    small ranks (the pass itself lifts any number of pieces of any rank; the index arithmetic is the
    same per axis). Returns ``(z3.unsat, cases checked per family)`` (proved) or ``(the first other
    result, the case)``."""
    import z3

    X = z3.Function("X", z3.IntSort(), z3.RealSort())
    cases = {"residual": 0, "transpose": 0, "reshape": 0}

    def check(idx, bounds, lhs, rhs):
        s = z3.Solver()
        s.add(*[z3.And(v >= 0, v < n) for v, n in zip(idx, bounds)])
        s.add(X(lhs) != X(rhs))
        return s.check()

    def transposed(idx, perm):  # the index into x of element idx of transpose(x, perm)
        src = [None] * len(perm)
        for d, p in enumerate(perm):
            src[p] = idx[d]
        return src

    for shape in _layouts(max_rank, max_dim):
        shape = list(shape)
        # a residual transpose after the lifted one is the piece's own transpose
        for lifted in itertools.permutations(range(len(shape))):
            mid = [shape[p] for p in lifted]
            for perm in itertools.permutations(range(len(shape))):
                r = residual_perm(list(lifted), list(perm))
                out = [shape[p] for p in perm]
                m = [z3.Int(f"m{d}") for d in range(len(out))]
                if [mid[q] for q in r] != out:
                    return z3.sat, ("residual shape", shape, lifted, perm)
                res = check(m, out, flat_index(transposed(transposed(m, r), lifted), shape),
                            flat_index(transposed(m, perm), shape))
                cases["residual"] += 1
                if res != z3.unsat:
                    return res, ("residual", shape, lifted, perm)
        for axis in range(len(shape)):
            if shape[axis] < 2:
                continue
            for cut in range(1, shape[axis]):
                sizes = [cut, shape[axis] - cut]
                offs = [0, cut]
                pieces = [shape[:axis] + [n] + shape[axis + 1:] for n in sizes]
                # transpose
                for perm in itertools.permutations(range(len(shape))):
                    whole, a, nsizes = transpose_plan(shape, axis, sizes, list(perm))
                    for i, piece in enumerate(pieces):
                        tp = [piece[p] for p in perm]
                        if _piece(whole, a, nsizes[i]) != tp:  # the new split's piece is the transposed piece
                            return z3.sat, ("transpose shape", shape, axis, sizes, perm)
                        m = [z3.Int(f"m{d}") for d in range(len(tp))]
                        # lhs: element m of piece i of split(transpose(X), a)
                        mw = list(m)
                        mw[a] = mw[a] + sum(nsizes[:i])
                        src = [None] * len(shape)
                        for d, p in enumerate(perm):
                            src[p] = mw[d]
                        lhs = flat_index(src, shape)
                        # rhs: element m of transpose(piece i)
                        srcp = [None] * len(shape)
                        for d, p in enumerate(perm):
                            srcp[p] = m[d]
                        srcp[axis] = srcp[axis] + offs[i]
                        r = check(m, tp, lhs, flat_index(srcp, shape))
                        cases["transpose"] += 1
                        if r != z3.unsat:
                            return r, ("transpose", shape, axis, sizes, perm)
                # reshape: every pair of targets for the two pieces
                for t0 in _factorings(math.prod(pieces[0]), max_target_rank):
                    for t1 in _factorings(math.prod(pieces[1]), max_target_rank):
                        plan = reshape_plan(shape, axis, sizes, [t0, t1])
                        if plan is None:
                            continue
                        whole, j, nsizes = plan
                        if math.prod(whole) != math.prod(shape):
                            return z3.sat, ("reshape size", shape, axis, sizes, [t0, t1])
                        for i, t in enumerate((t0, t1)):
                            if _piece(whole, j, nsizes[i]) != list(t):
                                return z3.sat, ("reshape shape", shape, axis, sizes, [t0, t1])
                            m = [z3.Int(f"m{d}") for d in range(len(t))]
                            mw = list(m)
                            mw[j] = mw[j] + sum(nsizes[:i])
                            lhs = flat_index(mw, whole)  # reshape keeps the flat index
                            pidx = unflat_index(flat_index(m, t), pieces[i])
                            pidx[axis] = pidx[axis] + offs[i]
                            r = check(m, t, lhs, flat_index(pidx, shape))
                            cases["reshape"] += 1
                            if r != z3.unsat:
                                return r, ("reshape", shape, axis, sizes, [t0, t1])
    ok, more = check_plans()
    if not ok:
        return z3.sat, more
    cases.update(more)
    return z3.unsat, cases


def _all_factorings(n: int, max_rank: int):
    """Every shape of 1..``max_rank`` axes whose product is ``n`` (any number of them 1)."""
    for rank in range(1, max_rank + 1):
        for dims in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=rank):
            if math.prod(dims) == n:
                yield list(dims)


def check_plans(max_rank: int = 3, max_dim: int = 3, max_pieces: int = 3, max_target_rank: int = 4) -> tuple:
    """Every plan this module makes, checked on ``arange`` (distinct elements: each output element
    names its source, so equality is a proof for that shape): for every shape of 1..``max_rank`` axes
    of size 1..``max_dim`` (and of 4 axes of size 1..2), every axis, every split of it into
    2..``max_pieces`` pieces (unequal sizes included), every transpose (the lifted perm and, for each
    piece, every other perm through ``residual_perm``) and every tuple of reshape targets of up to
    ``max_target_rank`` axes (any number of size-1 axes) that agree outside one axis, the only ones
    ``reshape_plan`` can accept: where it accepts, piece ``i`` of the new split is the op on piece
    ``i``. Returns (True, cases per family) or (False, the first case that differs)."""
    import numpy as np

    cases = {"arange transpose": 0, "arange residual": 0, "arange reshape": 0}
    rank4 = itertools.product((1, 2), repeat=4) if max_rank < 4 else ()
    for shape in itertools.chain(_layouts(max_rank, max_dim), rank4):
        shape = list(shape)
        X = np.arange(math.prod(shape)).reshape(shape)
        perms = [list(p) for p in itertools.permutations(range(len(shape)))]
        for axis in range(len(shape)):
            for parts in range(2, max_pieces + 1):
                for cuts in itertools.combinations(range(1, shape[axis]), parts - 1):
                    sizes = [b - a for a, b in zip((0,) + cuts, cuts + (shape[axis],))]
                    pieces = np.split(X, list(cuts), axis)
                    for lifted in perms:
                        whole, a, nsizes = transpose_plan(shape, axis, sizes, lifted)
                        t = np.transpose(X, lifted)
                        if list(t.shape) != whole:
                            return False, ("arange transpose shape", shape, axis, sizes, lifted)
                        new = np.split(t, list(np.cumsum(nsizes)[:-1]), a)
                        for i, piece in enumerate(pieces):
                            cases["arange transpose"] += 1
                            if not np.array_equal(new[i], np.transpose(piece, lifted)) \
                                    or new[i].shape != np.transpose(piece, lifted).shape:
                                return False, ("arange transpose", shape, axis, sizes, lifted, i)
                            for q in perms:
                                cases["arange residual"] += 1
                                got = np.transpose(new[i], residual_perm(lifted, q))
                                want = np.transpose(piece, q)
                                if got.shape != want.shape or not np.array_equal(got, want):
                                    return False, ("arange residual", shape, axis, sizes, lifted, q, i)
                    n0 = pieces[0].size
                    for t0 in _all_factorings(n0, max_target_rank):
                        for j in range(len(t0)):
                            rest = math.prod(t0) // t0[j]
                            if any(p.size % rest for p in pieces):
                                continue
                            targets = [t0[:j] + [p.size // rest] + t0[j + 1:] for p in pieces]
                            plan = reshape_plan(shape, axis, sizes, targets)
                            if plan is None:
                                continue
                            whole, jj, nsizes = plan
                            if math.prod(whole) != X.size:
                                return False, ("arange reshape size", shape, axis, sizes, targets)
                            new = np.split(X.reshape(whole), list(np.cumsum(nsizes)[:-1]), jj)
                            for i, piece in enumerate(pieces):
                                cases["arange reshape"] += 1
                                want = piece.reshape(targets[i])
                                if new[i].shape != want.shape or not np.array_equal(new[i], want):
                                    return False, ("arange reshape", shape, axis, sizes, targets, i)
    return True, cases


def _run(st: FuncState) -> None:
    composed, lifted = lift_layout(st.f, st.cost_model)
    st.count("reshapes_composed", composed)
    st.count("layout_lifted", lifted)


PASS = FunctionPass("taso-lift-layout", "Reshapes composed and layout ops lifted over splits", _run,
                    {"reshapes_composed": "reshape chains composed", "layout_lifted": "reshapes and transposes of split pieces lifted to one op on the whole tensor"}, needs_cost_model=True, group="cleanup")
