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
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

import numpy as np

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, elem_type, taso_attrs

from .flatten_matmul import _owner, _shape, _tensor, _user
from .lift_elementwise import _sig

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
        p = _owner(ops[0].operands[0])
        if p is None or p.name not in _LAYOUT or sum(1 for _ in p.results[0].uses) != 1:
            return ops
        ops.insert(0, p)


def _steps(ops: list) -> list:
    return [("transpose", list(taso_attrs(o)["perm"])) if o.name == "taso.transpose" else ("reshape", _shape(o.results[0]))
            for o in ops]


def compose_layout_chains(f: ir.Operation, cost_model) -> int:
    """Replace each chain of reshapes and transposes with two or more ops, at least one a transpose, by
    its plan where ``cost_model`` says it costs less. Returns the number of chains replaced."""
    block = f.regions[0].blocks[0]
    done = 0
    for o in list(block.operations):
        end = o.operation
        if end.name not in _LAYOUT or not _ends_chain(end):
            continue
        ops = _chain(end)
        x = ops[0].operands[0]
        shape = _shape(x)
        if len(ops) < 2 or shape is None or not any(op.name == "taso.transpose" for op in ops) \
                or any(_shape(op.results[0]) is None for op in ops):
            continue
        plan = chain_plan(shape, _steps(ops))
        if plan is None:
            continue
        new = _plan_ops(shape, plan)
        dtype = str(elem_type(x))
        old_cost = sum(cost_model.cost(_sig("transpose" if op.name == "taso.transpose" else "reshape",
                                            _own(op), [_shape(op.operands[0])], [_shape(op.results[0])], dtype,
                                            (False,))) for op in ops)
        new_cost = sum(cost_model.cost(_sig(k, a, [s_in], [s_out], dtype, (False,))) for k, a, s_in, s_out in new)
        if new_cost >= old_cost:
            continue
        v = x
        with ir.InsertionPoint(end):
            for k, a, _s_in, s_out in new:
                v = create_taso_op(k, [v], [_tensor(s_out, x)], a, loc=end.location).results[0]
        end.results[0].replace_all_uses_with(v)
        for op in reversed(ops):
            op.erase()
        done += 1
    return done


def _ends_chain(op: ir.Operation) -> bool:
    uses = list(op.results[0].uses)
    return not (len(uses) == 1 and _user(uses[0]).name in _LAYOUT)


def _own(op: ir.Operation) -> dict:
    return {"perm": list(taso_attrs(op)["perm"])} if op.name == "taso.transpose" else {"shape": _shape(op.results[0])}


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
    elements this checks every element's source: for these shapes it is a proof. Returns (True, cases
    checked) or (False, the first case that differs)."""
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
                            plan = chain_plan(shape, steps)
                            if plan is None:
                                continue
                            want = _apply(x, steps)
                            got = _apply(x, [(k, a.get("perm", a.get("shape"))) for k, a, _i, _o in
                                             _plan_ops(shape, plan)])
                            cases += 1
                            if got.shape != want.shape or not np.array_equal(got, want):
                                return False, (shape, steps, plan)
    return True, cases
