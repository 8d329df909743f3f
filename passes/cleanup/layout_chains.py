"""Chains of reshapes and transposes composed into at most one transpose between two reshapes.

A chain ``x -> reshape/transpose -> ... -> y`` (each intermediate result used only by the next op) only
moves elements: ``y`` is a fixed permutation of ``x``. Exporters and the layout lifting leave chains
with several transposes: ``nn.MultiheadAttention``'s packed projection is unflattened, transposed to
put Q/K/V first, reshaped to heads and transposed again to put the heads first; after ``lift_layout``
both transposes run on the whole tensor. Each transpose moves every byte once, so one transpose that
goes straight to the final layout halves that.

The plan (``chain_plan``) follows the chain on "fine" axes: the input's axes, split further wherever
a reshape splits one (row-major: an axis of n = a x b elements is an outer axis a and an inner one b,
in the input as well); a transpose permutes the groups of fine axes that form the current axes, a
reshape regroups the fine axes in their current order (it fails where a new axis would cut a fine
axis other than into a product). At the end the fine axes in the input's order are the shape of a
reshape of ``x``, their current order a transpose, and the result's shape the last reshape; fine axes
adjacent in both orders are merged, so the transpose has the smallest rank. Where the perm is the
identity the chain is one reshape.

Applied where the cost model says the new ops cost less than the chain (a chain with two or more
transposes, or one whose transposes cancel). ``prove()`` checks every plan on small shapes
exhaustively (the chain and its plan applied to ``arange``: each output element names its source).

Identity: the chain equals ``reshape(transpose(reshape(x, fine), perm), final)``; and for a matmul
by a 2-D operand, ``matmul(R(x), W[, b]) = R'(matmul(x, W[, b]))`` for row steps ``R``, ``R'`` being
``R`` with the last axis resized from K to N.

Conditions:
- a chain: reshapes and transposes whose every intermediate result has exactly one use (the next
  op); static shapes; any ranks, any number of size-1 axes; ``chain_plan`` returns a plan only where
  every reshape regroups whole fine axes or cuts one into an outer and an inner factor (row-major),
  and refuses the chain otherwise (a reshape that interleaves two fine axes);
- a row move (``_sink``, ``_hoist``): the matmul's right operand is exactly 2-D (``_row_matmul``: a
  batched one pairs batch indices with the rows, which a row step moves); the moved steps keep the
  last axis (a transpose with ``perm[-1]`` last, a reshape between ranks >= 2 with the same last
  dimension: whole rows move, each row's elements stay in order); a bias [N] is per column, so it
  moves with nothing; the activation is elementwise; the moved ops' intermediate results have one
  use (the matmul's operand, each step's result).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

import numpy as np

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import create_taso_op, elem_type, taso_attrs
from taso_mlir.passes.ir_util import static_shape, defining_op, use_owner, tensor_like, op_sig
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.dialect.ops import function_dce


_LAYOUT = ("taso.reshape", "taso.transpose")


def chain_plan(shape: list, steps: list) -> Optional[tuple[list, list, list]]:
    """``steps``: ("reshape", shape) or ("transpose", perm), applied in order to a tensor of ``shape``.
    Returns (fine shape, perm, final shape) with ``reshape(transpose(reshape(x, fine), perm), final)``
    equal to the chain, or None where a reshape cuts a fine axis."""
    out_shape = list(shape)
    for kind, arg in steps:
        if kind == "transpose" and sorted(arg) != list(range(len(out_shape))):
            return None
        out_shape = [out_shape[p] for p in arg] if kind == "transpose" else list(arg)
    moves = [j for j, (kind, _a) in enumerate(steps) if kind == "transpose"]
    if not moves:
        return list(out_shape), list(range(len(out_shape))), out_shape
    # reshapes before the first transpose and after the last one need not follow the fine axes: the
    # plan starts from the first transpose's operand and ends with a reshape to the chain's result
    if moves[0] > 0:
        shape = list(steps[moves[0] - 1][1])
    steps = steps[moves[0]:moves[-1] + 1]
    sizes: dict = {}
    order: list = []  # fine axes in the input's order

    def new(n: int) -> int:
        sizes[len(sizes)] = n
        return len(sizes) - 1

    cur = []  # the current axes: lists of fine axes (size-1 axes: empty)
    for d in shape:
        if d == 1:
            cur.append([])
        else:
            k = new(d)
            order.append(k)
            cur.append([k])
    for kind, arg in steps:
        if kind == "transpose":
            cur = [cur[p] for p in arg]
            continue
        seq = [k for g in cur for k in g]
        groups, i = [], 0
        for d in arg:
            g, need = [], d
            while need > 1:
                if i >= len(seq):
                    return None
                k = seq[i]
                f = sizes[k]
                if f <= need:
                    if need % f:
                        return None
                    g.append(k)
                    need //= f
                    i += 1
                else:
                    if f % need:
                        return None
                    a, b = new(need), new(f // need)  # k = (a outer, b inner), in the input too
                    j = order.index(k)
                    order[j:j + 1] = [a, b]
                    g.append(a)
                    seq[i] = b
                    need = 1
            groups.append(g)
        if i != len(seq):
            return None
        cur = groups
    seq = [k for g in cur for k in g]
    # merge fine axes adjacent in both orders
    pos = {k: j for j, k in enumerate(order)}
    blocks: list = []
    for k in seq:
        if blocks and pos[k] == pos[blocks[-1][-1]] + 1:
            blocks[-1].append(k)
        else:
            blocks.append([k])
    by_input = sorted(range(len(blocks)), key=lambda b: pos[blocks[b][0]])
    fine = [math.prod(sizes[k] for k in blocks[b]) for b in by_input]
    perm = [by_input.index(b) for b in range(len(blocks))]
    return fine, perm, out_shape


def _chain(end: ir.Operation) -> list:
    """The ops of the chain ending at ``end``, first to last: back through reshapes and transposes whose
    result only the next op uses."""
    ops = [end]
    while True:
        p = defining_op(ops[0].operands[0])
        if p is None or p.name not in _LAYOUT or sum(1 for _ in p.results[0].uses) != 1:
            return ops
        ops.insert(0, p)


def _steps(ops: list) -> list:
    return [("transpose", list(taso_attrs(o)["perm"])) if o.name == "taso.transpose" else ("reshape", static_shape(o.results[0]))
            for o in ops]


@ir_step
def compose_layout_chains(f: ir.Operation, cost_model) -> int:
    """Replace each chain of reshapes and transposes with two or more ops, at least one a transpose, by
    its plan where ``cost_model`` says it costs less. Returns the number of chains replaced."""
    block = f.regions[0].blocks[0]
    done = 0
    # (a list taken first: a replacement erases the chain that ends at the op it is at, which the walk
    # has passed, as each op of it defines the next one's operand)
    for end in each_live(ops_of(block)):
        if end.name not in _LAYOUT or not _ends_chain(end):
            continue
        ops = _chain(end)
        x = ops[0].operands[0]
        shape = static_shape(x)
        if len(ops) < 2 or shape is None or not any(op.name == "taso.transpose" for op in ops) \
                or any(static_shape(op.results[0]) is None for op in ops):
            continue
        plan = chain_plan(shape, _steps(ops))
        if plan is None:
            continue
        new = _plan_ops(shape, plan)
        dtype = str(elem_type(x))
        if _ops_cost(cost_model, new, dtype) >= _layout_cost(cost_model, _steps(ops), shape, dtype):
            continue
        with ir.InsertionPoint(end):
            v = _emit(x, new, end.location)
        replace_uses(end.results[0], v)
        for op in reversed(ops):
            erase_op(op)
        done += 1
    return done


def _ends_chain(op: ir.Operation) -> bool:
    uses = list(op.results[0].uses)
    return not (len(uses) == 1 and use_owner(uses[0]).name in _LAYOUT)


def _ops_cost(cm, ops: list, dtype: str) -> float:
    """What ``cm`` charges for ops (kind, attrs, in shape, out shape), as ``_plan_ops`` gives them."""
    return sum(cm.cost(op_sig(k, a, [si], [so], dtype, (False,))) for k, a, si, so in ops)


def _emit(v: ir.Value, ops: list, loc) -> ir.Value:
    """The ops (as ``_plan_ops`` gives them) applied to ``v``, created at the current insertion point."""
    for k, a, _si, so in ops:
        v = create_taso_op(k, [v], [tensor_like(so, v)], a, loc=loc).results[0]
    return v


def _plan_ops(shape: list, plan) -> list:
    """The ops of a plan: (kind, attrs, in shape, out shape), the reshapes only where they change the
    shape and the transpose only where its perm is not the identity."""
    fine, perm, final = plan
    out, cur = [], list(shape)
    if perm != sorted(perm):
        if fine != cur:
            out.append(("reshape", {"shape": fine}, cur, fine))
            cur = fine
        moved = [cur[p] for p in perm]
        out.append(("transpose", {"perm": perm}, cur, moved))
        cur = moved
    if final != cur:
        out.append(("reshape", {"shape": final}, cur, final))
    return out


# ---------------------------------------------------------------------------------------------
# row chains through matmuls


def _is_row_step(op: ir.Operation) -> bool:
    """A reshape or transpose that keeps the last axis as it is (it moves whole rows), between tensors of
    rank 2 or more."""
    if op.name == "taso.transpose":
        perm = list(taso_attrs(op)["perm"])
        return perm[-1] == len(perm) - 1
    a, b = static_shape(op.operands[0]), static_shape(op.results[0])
    # (rank 2 at least on both sides: a matmul moved to either side needs rows)
    return a is not None and b is not None and len(a) >= 2 and len(b) >= 2 and a[-1] == b[-1]


def _with_last(steps: list, n: int) -> list:
    """Row steps with the last axis resized to ``n``."""
    return [(k, a if k == "transpose" else list(a[:-1]) + [n]) for k, a in steps]


def _forward_chain(v: ir.Value) -> list:
    """The layout ops that follow ``v`` one after another, each the only user of the previous result."""
    ops = []
    while True:
        uses = list(v.uses)
        if len(uses) != 1 or use_owner(uses[0]).name not in _LAYOUT:
            return ops
        op = use_owner(uses[0])
        ops.append(op)
        v = op.results[0]


def _row_matmul(op: ir.Operation) -> bool:
    """A matmul whose right operand is 2-D: it maps every row of its left operand alike."""
    if op.name != "taso.matmul" or len(op.operands) not in (2, 3):
        return False
    x, w = static_shape(op.operands[0]), static_shape(op.operands[1])
    return x is not None and w is not None and len(w) == 2 and len(x) >= 2 and static_shape(op.results[0]) is not None


def _layout_cost(cm, steps: list, shape: list, dtype: str) -> float:
    """What ``cm`` charges for the steps (``_steps``) applied to a tensor of ``shape``."""
    ops, cur = [], list(shape)
    for k, a in steps:
        nxt = [cur[p] for p in a] if k == "transpose" else list(a)
        ops.append((k, {"perm": list(a)} if k == "transpose" else {"shape": nxt}, cur, nxt))
        cur = nxt
    return _ops_cost(cm, ops, dtype)


@ir_step
def move_row_chains(f: ir.Operation, cost_model) -> int:
    """Move reshapes and transposes that move whole rows across the matmuls by a 2-D operand
    (``matmul(R(x), W) = R(matmul(x, W))``, the last axis resized), to join the layout chain on the
    other side, where the joined chain planned as one (``chain_plan``) costs less than the two parts
    (``nn.MultiheadAttention``'s transposes between the batch-first and sequence-first layouts,
    around its projections). Returns the number of moves."""
    moved = 0
    changed = True
    while changed:
        changed = False
        # (``_sink`` and ``_hoist`` erase ops only where they return True: the walk then starts over)
        for op in each_live(ops_of(f.regions[0].blocks[0])):
            if _row_matmul(op) and (_sink(op, cost_model) or _hoist(op, cost_model)):
                moved += 1
                changed = True
                break
    return moved


def _chain_before(v: ir.Value) -> list:
    p = defining_op(v)
    if p is None or p.name not in _LAYOUT or sum(1 for _ in v.uses) != 1:
        return []
    return _chain(p)


def _sink(mm: ir.Operation, cm) -> bool:
    """The row steps at the end of the chain into the matmul, moved below it."""
    before = _chain_before(mm.operands[0])
    k = len(before)
    while k > 0 and _is_row_step(before[k - 1]):
        k -= 1
    rows = before[k:]
    if not rows:
        return False
    after = _forward_chain(mm.results[0])
    x0 = rows[0].operands[0]
    if not _keeps_gemm(mm, len(static_shape(x0))):
        return False
    n = static_shape(mm.results[0])[-1]
    start = static_shape(x0)[:-1] + [n]
    dtype = str(elem_type(x0))
    joined = _with_last(_steps(rows), n) + _steps(after)
    plan = chain_plan(start, joined)
    if plan is None:
        return False
    old = _layout_cost(cm, _steps(rows), static_shape(x0), dtype) + _layout_cost(cm, _steps(after), static_shape(mm.results[0]),
                                                                           dtype)
    new_ops = _plan_ops(start, plan)
    if _ops_cost(cm, new_ops, dtype) >= old:
        return False
    end = after[-1] if after else mm
    with ir.InsertionPoint(end):
        v = _emit(_clone_matmul(mm, x0, start).results[0], new_ops, mm.location)
    replace_uses(end.results[0], v)
    for op in reversed(after):
        erase_op(op)
    erase_op(mm)
    for op in reversed(rows):
        erase_op(op)
    return True


def _hoist(mm: ir.Operation, cm) -> bool:
    """The row steps at the start of the chain out of the matmul, moved above it."""
    after = _forward_chain(mm.results[0])
    k = 0
    while k < len(after) and _is_row_step(after[k]):
        k += 1
    rows = after[:k]
    if not rows:
        return False
    x = mm.operands[0]
    before = _chain_before(x)
    x0 = before[0].operands[0] if before else x
    kdim = static_shape(x)[-1]
    dtype = str(elem_type(x))
    joined = _steps(before) + _with_last(_steps(rows), kdim)
    plan = chain_plan(static_shape(x0), joined)
    if plan is None:
        return False
    old = _layout_cost(cm, _steps(before), static_shape(x0), dtype) + _layout_cost(cm, _steps(rows), static_shape(mm.results[0]),
                                                                             dtype)
    new_ops = _plan_ops(static_shape(x0), plan)
    if not _keeps_gemm(mm, len(new_ops[-1][3]) if new_ops else len(static_shape(x0))):
        return False
    if _ops_cost(cm, new_ops, dtype) >= old:
        return False
    last = rows[-1]
    with ir.InsertionPoint(last):
        m2 = _clone_matmul(mm, _emit(x0, new_ops, mm.location), static_shape(last.results[0]))
    replace_uses(last.results[0], m2.results[0])
    for op in reversed(rows):
        erase_op(op)
    erase_op(mm)
    for op in reversed(before):
        erase_op(op)
    return True


def _keeps_gemm(mm: ir.Operation, new_rank: int) -> bool:
    """A biased matmul on a 2-D input is exported as one Gemm; on more axes as MatMul and Add (two
    kernels, which its cost does not count): a move must not take it there."""
    return len(mm.operands) < 3 or len(static_shape(mm.operands[0])) != 2 or new_rank == 2


def _clone_matmul(mm: ir.Operation, x: ir.Value, out_shape: list) -> ir.Operation:
    a = taso_attrs(mm)
    attrs = {k: v for k, v in a.items() if k in ("activation",)}
    return create_taso_op("matmul", [x] + list(mm.operands)[1:], [tensor_like(out_shape, x)], attrs, loc=mm.location)


# ---------------------------------------------------------------------------------------------
# proof


def _apply(x: np.ndarray, steps: list) -> np.ndarray:
    for kind, arg in steps:
        x = np.transpose(x, arg) if kind == "transpose" else x.reshape(arg)
    return x


def _shapes_of(n: int, max_rank: int):
    for rank in range(1, max_rank + 1):
        for dims in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=rank):
            if math.prod(dims) == n and sum(1 for d in dims if d == 1) <= 1:
                yield list(dims)


def prove(max_rank: int = 3, max_dim: int = 4) -> tuple:
    """Every transpose -> reshape -> transpose chain (every perm, every reshape to up to ``max_rank`` axes)
    of every shape of up to ``max_rank`` axes of size 1..``max_dim``, and its two-op prefixes: the plan,
    where ``chain_plan`` makes one, applied to ``arange`` equals the chain applied to it. With distinct
    elements this checks every element's source: for these shapes it is a proof. Also ``_prove_rows`` and
    ``check_long_chains``.
    Returns (True, {"chains": cases, "rows": cases}) or (False, the first case that differs)."""
    cases = 0
    for rank in range(1, max_rank + 1):
        for shape in itertools.product(range(1, max_dim + 1), repeat=rank):
            shape = list(shape)
            x = np.arange(math.prod(shape)).reshape(shape)
            for p1 in itertools.permutations(range(rank)):
                for target in _shapes_of(math.prod(shape), max_rank):
                    for p2 in itertools.permutations(range(len(target))):
                        for steps in ([("transpose", list(p1)), ("reshape", target)],
                                      [("reshape", target), ("transpose", list(p2))],
                                      [("transpose", list(p1)), ("reshape", target), ("transpose", list(p2))]):
                            plan, ok = _plan_check(x, steps)
                            if plan is None:
                                continue
                            cases += 1
                            if not ok:
                                return False, (shape, steps, plan)
    rows = _prove_rows(max_rank, max_dim)
    if not rows[0]:
        return rows
    long = check_long_chains()
    if not long[0]:
        return long
    return True, {"chains": cases, "rows": rows[1], "long chains": long[1]}


def _plan_check(x, steps) -> tuple:
    """(the plan ``chain_plan`` makes for ``steps`` on ``x``'s shape, or None; whether its ops compute
    what the steps compute on ``x``)."""
    shape = list(x.shape)
    plan = chain_plan(shape, steps)
    if plan is None:
        return None, True
    want = _apply(x, steps)
    got = _apply(x, [(k, a.get("perm", a.get("shape"))) for k, a, _i, _o in _plan_ops(shape, plan)])
    return plan, got.shape == want.shape and np.array_equal(got, want)


def _all_shapes_of(n: int, max_rank: int):
    """Every shape of 1..``max_rank`` axes whose product is ``n``, any number of them 1."""
    for rank in range(1, max_rank + 1):
        for dims in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=rank):
            if math.prod(dims) == n:
                yield list(dims)


def check_long_chains(max_elems: int = 8, max_rank: int = 3) -> tuple:
    """Chains of four steps (transpose, reshape, transpose, reshape and reshape, transpose, reshape,
    transpose) of every shape of up to ``max_rank`` axes of size 1..3 with at most ``max_elems``
    elements, every perm and every reshape to up to ``max_rank`` axes, any number of them 1 (the
    adversarial case of ``chain_plan``, which keeps size-1 axes as empty groups): where a plan is
    made, it equals the chain on ``arange``. Returns (True, cases) or (False, the case)."""
    cases = 0
    for rank in range(1, max_rank + 1):
        for shape in itertools.product((1, 2, 3), repeat=rank):
            shape = list(shape)
            n = math.prod(shape)
            if n > max_elems:
                continue
            x = np.arange(n).reshape(shape)
            targets = list(_all_shapes_of(n, max_rank))
            for p1 in itertools.permutations(range(rank)):
                for t1 in targets:
                    for p2 in itertools.permutations(range(len(t1))):
                        for t2 in targets:
                            r2 = list(range(len(t2)))[::-1]
                            for steps in ([("transpose", list(p1)), ("reshape", t1), ("transpose", list(p2)), ("reshape", t2)],
                                          [("reshape", t2), ("transpose", r2), ("reshape", t1), ("transpose", list(p2))]):
                                plan, ok = _plan_check(x, steps)
                                if plan is None:
                                    continue
                                cases += 1
                                if not ok:
                                    return False, (shape, steps, plan)
    return True, cases


def _row_steps(lead: list, k: int, max_rank: int):
    """Every single row step of a tensor of leading shape ``lead`` and last axis ``k``."""
    r = len(lead)
    for p in itertools.permutations(range(r)):
        yield ("transpose", list(p) + [r]), [lead[q] for q in p]
    for t in _shapes_of(math.prod(lead), max_rank - 1):
        yield ("reshape", t + [k]), t


def _prove_rows(max_rank: int, max_dim: int) -> tuple:
    """Every chain of one or two row steps (``_is_row_step``: transposes that keep the last axis last,
    reshapes that keep it) of every tensor of up to ``max_rank`` axes whose leading axes have size
    1..``max_dim`` commutes with a matmul by a 2-D operand and a bias per column, the last axis resized
    (``matmul(R(x), W, b) = R'(matmul(x, W, b))``), in exact integer arithmetic on ``arange``: every
    row's source. Returns (True, cases) or (False, the case)."""
    k, n = 2, 3
    w = np.arange(1, k * n + 1, dtype=np.int64).reshape(k, n)
    b = np.arange(100, 100 + n, dtype=np.int64)  # (a bias per column: it moves with nothing)
    cases = 0
    for rank in range(1, max_rank):
        for lead in itertools.product(range(1, max_dim + 1), repeat=rank):
            lead = list(lead)
            x = np.arange(math.prod(lead) * k, dtype=np.int64).reshape(lead + [k])
            for s1, lead1 in _row_steps(lead, k, max_rank):
                chains = [[s1]] + [[s1, s2] for s2, _l in _row_steps(lead1, k, max_rank)]
                for steps in chains:
                    want = _apply(x, steps) @ w + b
                    try:
                        got = _apply(x @ w + b, _with_last(steps, n))
                    except ValueError:  # the moved steps do not fit the matmul's result
                        return False, (lead, steps)
                    cases += 1
                    if got.shape != want.shape or not np.array_equal(got, want):
                        return False, (lead, steps)
    return True, cases


def _run_rows(st: FuncState) -> None:
    st.count("row_chains_moved", move_row_chains(st.f, st.cost_model))


def _run_compose(st: FuncState) -> None:
    st.count("layout_chains", compose_layout_chains(st.f, st.cost_model))
    function_dce(st.f)  # (what the layout passes, and the cleanup before them, left unused)


ROWS = FunctionPass("taso-move-row-chains", "Row reshapes and transposes moved across matmuls", _run_rows,
                    {"row_chains_moved": "row reshapes/transposes moved across matmuls"}, needs_cost_model=True, group="cleanup")
COMPOSE = FunctionPass("taso-compose-layout-chains", "A chain of reshapes and transposes made one transpose, "
                       "then DCE", _run_compose, {"layout_chains": "reshape/transpose chains made one transpose"}, needs_cost_model=True, group="cleanup")
