"""Fold a multiply by a constant scalar into the weights it can reach: ``smul(v, s)`` (``x * s`` by a
scalar) is dropped where ``v`` is a linear function of weights that can take the factor instead.

Attention scales its scores: BERT divides ``Q K^T`` by ``sqrt(d)``, torch's scaled-dot-product export
multiplies Q (after the rotary embedding) and K by ``d**-0.25``. Each is a kernel of its own over an
activation; the factor can go into the query projection's weight and bias, or into the rotary
embedding's cos/sin tables, once, when the model is optimized.

``absorb(v, s)`` plans where the factor goes, walking up from ``v`` through values with no other use:
- a weight: it is scaled (a weight with other uses is copied first if it is small, else no plan);
- ``matmul(x, W[, b])`` and ``conv2d(x, W[, b])``: into W (and b), or for a matmul whose right
  operand is not a weight, into either operand (and b); a fused relu only for ``s > 0``;
- ``ewmul(a, b)``: into either operand; ``ewadd(a, b)``: into both;
- ``smul(a, t)``: into ``t``; ``reshape``, ``transpose`` and (for ``s > 0``) ``relu``: into the operand;
- a piece of a split on the last axis of a matmul by weights (GPT-2's packed Q, K, V): into the
  piece's columns of the weight and bias.
Nothing is changed unless the whole plan exists. Each step is an identity of real arithmetic, proved
with Z3 (``prove()``); scaling by a power of two is exact in floating point, so BERT's ``/ 8`` folds
bit-exactly; other factors round once per weight, within the numeric check's tolerance.

Identity: ``smul(v, s) = v'``, where ``v'`` is ``v`` recomputed with every weight use of the plan
scaled by ``s``: each step is homogeneous of degree 1 in what it scales (``(a * b) s = (a s) b``,
``(a + b) s = a s + b s``, ``(x @ W + b) s = x @ (W s) + b s``, ``conv(x, W s, b s) = conv(x, W, b) s``,
``R(v) s = R(v s)`` for a reshape or transpose ``R``, ``relu(v) s = relu(v s)`` for ``s > 0``), and a
split piece's columns are ``x @ W[:, c0:c1] + b[c0:c1]``.

Conditions (what each step's site check enforces):
- ``s``: a constant float scalar weight (one element), finite and nonzero; the ``smul``'s result has
  its operand's type. Every value on the path from ``v`` up has exactly one use (the plan changes
  nothing else); a weight with other uses is copied (where small), so only that use is scaled.
- ``ewadd``/``ewmul``: any operand shapes numpy broadcasts (a scalar factor commutes with
  broadcasting: ``[N]`` beside ``[M, N]``, ``[1]``, ``[M, 1]`` beside ``[1, N]`` alike); ``ewadd``'s
  two operands distinct values, and both take the factor.
- ``matmul``: any ranks (batch axes broadcast), either operand where the right one is not a weight;
  ``conv2d``: any group, stride, padding, dilation, into the weight; a bias operand ([N] / [O], a
  float weight) takes the factor too; a fused ``relu`` only for ``s > 0``, a ``relu6`` never.
- ``reshape``, ``transpose``: any shapes (they only move elements); ``relu``: ``s > 0``.
- a split piece ``k``: the split is on the last axis (``axis = rank - 1``) of ``matmul(x, W[, b])``'s
  result, directly or through reshapes that each keep the last dimension's size (row-major, the
  last index of every element is unchanged, so the split's last axis is W's last axis: its output
  columns, for any rank of ``x`` and ``W``); W and b float weights; the piece is columns
  ``piece_columns(sizes, k)`` = ``[sum(sizes[:k]), sum(sizes[:k+1]))`` of W's last axis and of b,
  whatever the sizes (unequal ones included).
- every weight use (op, operand) appears in a plan at most once: two pieces of one split in one
  plan (``ewadd(split(x @ W)#0, split(x @ W)#1) * s``) would each scale their columns of the same
  use of W, and the second would replace the first; such a plan is refused (``_scaled_plan``).

``div_to_smul`` first makes a generic ``Div`` by a constant scalar ``2**k`` a ``taso.smul`` by
``2**-k`` (the same value bit for bit: both are the correctly rounded ``x * 2**-k``).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses, set_operand
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, dense_array, new_weight, taso_attrs

from taso_mlir.dialect.convert_onnx_to_taso import weight_of

from taso_mlir.passes.prepare.fold_constants import MAX_ELEMENTS, fresh_name, weight_names
from taso_mlir.passes.search.rulebook import FLOAT_TYPES
from taso_mlir.passes.ir_util import static_shape, defining_op
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.dialect.ops import function_dce

#: how far up from the scaled value a plan looks
_DEPTH = 12


def _is_float(t: ir.Type) -> bool:
    return str(t) in FLOAT_TYPES


def _uses(v: ir.Value) -> int:
    return sum(1 for _ in v.uses)


def _scalar_weight(v: ir.Value) -> Optional[float]:
    """The value of a rank-0 (or one-element) float weight, else None."""
    o = weight_of(v)
    if o is None:
        return None
    t = ir.RankedTensorType(v.type)
    if not _is_float(t.element_type) or not t.has_static_shape or math.prod(t.shape) != 1:
        return None
    try:
        return float(dense_array(o.attributes["value"]).reshape(()))
    except Exception:
        return None


def _float_weight(v: ir.Value) -> bool:
    if weight_of(v) is None:
        return False
    t = ir.RankedTensorType(v.type)
    if not _is_float(t.element_type) or not t.has_static_shape:
        return False
    return _uses(v) == 1 or math.prod(t.shape) <= MAX_ELEMENTS  # (a shared weight is copied if small)


def absorb(v: ir.Value, s: float, depth: int = 0) -> Optional[list]:
    """Where to put the factor ``s`` so that ``v`` (not itself a weight) is scaled by it and nothing
    else that uses those weights changes: a list of (op, operand number) whose operand is a weight to
    scale at that use, or None (module docstring)."""
    o = defining_op(v)
    if depth > _DEPTH or o is None or _uses(v) != 1 or not o.name.startswith("taso."):
        return None
    if o.name == "taso.split":
        return _absorb_piece(o, ir.OpResult(v).result_number, s)
    if len(o.results) != 1:
        return None
    kind = o.name[5:]
    ops = list(o.operands)

    def up(i):
        return [(o, i)] if _float_weight(ops[i]) else absorb(ops[i], s, depth + 1)

    if kind in ("matmul", "conv2d"):
        act = taso_attrs(o).get("activation", "none")
        if act not in ("none", "relu") or (act == "relu" and s <= 0):
            return None
        if len(ops) > 2 and not _float_weight(ops[2]):
            return None
        bias = [(o, 2)] if len(ops) > 2 else []
        for i in ((1,) if kind == "conv2d" or _float_weight(ops[1]) else (1, 0)):
            p = up(i)
            if p is not None:
                return p + bias
        return None
    if kind == "ewmul":
        for i in sorted((0, 1), key=lambda i: not _float_weight(ops[i])):  # (a weight operand first)
            p = up(i)
            if p is not None:
                return p
        return None
    if kind == "ewadd":
        if ops[0] == ops[1]:
            return None
        p, q = up(0), up(1)
        return None if p is None or q is None else p + q
    if kind == "smul":
        return [(o, 1)] if _float_weight(ops[1]) else None
    if kind in ("reshape", "transpose") or (kind == "relu" and s > 0):
        return up(0)
    return None


def _absorb_piece(split: ir.Operation, k: int, s: float) -> Optional[list]:
    """Piece ``k`` of a split on the last axis of ``matmul(x, W[, b])``, or of reshapes of it that keep
    the last axis (GPT-2's packed Q, K, V projection), is scaled by scaling its columns of ``W`` and ``b``: the other pieces' columns are
    left as they are. Plan entries (op, operand number, (first column, end))."""
    a = taso_attrs(split)
    rank = len(static_shape(split.operands[0]))
    if a["axis"] not in (rank - 1, -1):
        return None
    src = split.operands[0]
    m = defining_op(src)
    # (through reshapes that keep the last axis: a flattened projection's rows reshaped back)
    while m is not None and m.name == "taso.reshape" and _uses(src) == 1 \
            and static_shape(m.operands[0])[-1:] == static_shape(src)[-1:]:
        src = m.operands[0]
        m = defining_op(src)
    if m is None or m.name != "taso.matmul" or _uses(src) != 1:
        return None
    act = taso_attrs(m).get("activation", "none")
    ops = list(m.operands)
    if act not in ("none", "relu") or (act == "relu" and s <= 0) or not all(_float_weight(w) for w in ops[1:]):
        return None
    cols = piece_columns(list(a["sizes"]), k)
    return [(m, i, cols) for i in range(1, len(ops))]


def piece_columns(sizes: list, k: int) -> tuple[int, int]:
    """The columns (first, end) of piece ``k`` of a split on the last axis into ``sizes``."""
    start = int(sum(sizes[:k]))
    return start, start + int(sizes[k])


def _np_dtype(t: ir.Type):
    from taso_mlir.dialect.types import numpy_dtype, onnx_dtype_of_mlir

    return numpy_dtype(onnx_dtype_of_mlir(str(ir.RankedTensorType(t).element_type)))


def _scaled(op: ir.Operation, i: int, cols, s: float) -> Optional[np.ndarray]:
    """Operand ``i`` of ``op`` (a weight) times ``s`` (in columns ``cols`` of its last axis, where given),
    rounded once to its element type; None where that leaves the normal range (an overflow to inf, or a
    nonzero value that would lose precision as a subnormal or zero)."""
    v = op.operands[i]
    arr = dense_array(defining_op(v).attributes["value"]).astype(np.float64)
    if cols:
        arr[..., cols[0]:cols[1]] *= s
    else:
        arr = arr * s
    dt = _np_dtype(v.type)
    with np.errstate(over="ignore", under="ignore"):
        out = arr.astype(dt)
    fin = np.finfo(dt)
    nonzero = arr != 0
    if not np.all(np.isfinite(out)) or np.any(np.abs(out[nonzero]) < fin.tiny):
        return None
    return out


def _scaled_plan(v: ir.Value, s: float) -> Optional[list]:
    """``absorb``'s plan for ``v`` and ``s`` with each weight's scaled value: (op, operand number, array),
    or None where there is no plan or a scaled weight would leave its type's normal range."""
    plan = absorb(v, s)
    if plan is None:
        return None
    uses = [(op, i) for op, i, *_cols in plan]
    if any(op == o2 and i == i2 for k, (op, i) in enumerate(uses) for o2, i2 in uses[:k]):
        return None  # (one weight use reached twice, e.g. two pieces of one split: each would scale it)
    out = [(op, i, _scaled(op, i, cols[0] if cols else None, s)) for op, i, *cols in plan]
    return None if any(arr is None for _, _, arr in out) else out


def _scale_weights(plan: list, names: set) -> None:
    """Give each (op, operand number, scaled value) of ``_scaled_plan`` a new weight holding that value
    at that operand; the old weight is left to dead-code elimination."""
    for op, i, arr in plan:
        v = op.operands[i]
        w = defining_op(v)
        base = ir.StringAttr(w.attributes["name"]).value
        with ir.InsertionPoint(w):
            nw = new_weight(fresh_name(f"{base}.scaled", names), arr, v.type, loc=w.location)
        set_operand(op, i, nw.results[0])


@ir_step
def div_to_smul(f: ir.Operation) -> int:
    """Make each generic ``onnx.Div(x, c)`` with ``c`` a constant float scalar ``+-2**k`` (and a float
    result of ``x``'s type) whose reciprocal ``fold_scalar_scales`` can fold a ``taso.smul(x, 1/c)``.
    Returns the number of ops raised."""
    block = f.regions[0].blocks[0]
    names = weight_names(f)
    done = 0
    for op in each_live(ops_of(block)):  # (an op is erased only when the walk is at it)
        if op.name != "onnx.Div" or len(op.operands) != 2 or len(op.results) != 1:
            continue
        x, c = op.operands
        value = _scalar_weight(c)
        if value is None or value == 0 or not math.isfinite(value):
            continue
        mant, _ = math.frexp(abs(value))
        if mant != 0.5 or op.results[0].type != x.type or not ir.RankedTensorType(x.type).has_static_shape:
            continue  # (1/c exact only for a power of two; no broadcasting of x)
        et = ir.RankedTensorType(x.type).element_type
        if not _is_float(et):
            continue
        with np.errstate(over="ignore", under="ignore"):
            inv = np.array(1.0 / value).astype(_np_dtype(x.type))
        if not np.isfinite(inv) or abs(float(inv)) < np.finfo(inv.dtype).tiny or float(inv) != 1.0 / value:
            continue  # (the reciprocal must be a normal number of the element type)
        if _scaled_plan(x, float(inv)) is None:
            continue  # (only to be folded: as a multiply the search could move it onto a weight that overflows)
        with ir.InsertionPoint(op):
            w = new_weight(fresh_name("taso_scale_", names), inv, ir.RankedTensorType.get([], et), loc=op.location)
            sm = create_taso_op("smul", [x, w.results[0]], [x.type], {}, loc=op.location)
        replace_uses(op.results[0], sm.results[0])
        erase_op(op)
        done += 1
    return done


@ir_step
def fold_scalar_scales(f: ir.Operation) -> int:
    """Drop every ``taso.smul(v, s)`` (``s`` a constant float scalar, finite and nonzero) whose factor
    ``absorb`` can put into weights, scaling those weights instead. Returns the number of ops dropped."""
    block = f.regions[0].blocks[0]
    names = weight_names(f)
    done = 0
    for op in each_live(ops_of(block)):  # (an op is erased only when the walk is at it)
        if op.name != "taso.smul" or op.results[0].type != op.operands[0].type:
            continue
        s = _scalar_weight(op.operands[1])
        if s is None or s == 0 or not math.isfinite(s):
            continue
        plan = _scaled_plan(op.operands[0], s)
        if plan is None:
            continue
        _scale_weights(plan, names)
        replace_uses(op.results[0], op.operands[0])
        erase_op(op)
        done += 1
    return done


def prove():
    """Z3 proofs over the reals of each step ``absorb`` takes, per element with symbolic values and
    factor ``s`` (matmul and conv as sums of products, up to 3 terms, which is also each column of a
    matmul whose split piece takes the factor in its columns): scaling the result equals scaling what
    the plan scales. Returns ``z3.unsat`` (all proved) or the first other result."""
    import z3

    s = z3.Real("s")
    a, b, t = z3.Reals("a b t")
    relu = lambda x: z3.If(x > 0, x, 0)  # noqa: E731
    claims = [
        (z3.BoolVal(True), (a * b) * s == a * (b * s)),                    # ewmul: into b
        (z3.BoolVal(True), (a * b) * s == (a * s) * b),                    # ewmul: into a
        (z3.BoolVal(True), (a + b) * s == a * s + b * s),                  # ewadd: into both
        (z3.BoolVal(True), (a * t) * s == a * (t * s)),                    # smul: into its factor
        (s > 0, relu(a) * s == relu(a * s)),                               # relu, s > 0
    ]
    for k in range(1, 4):  # matmul / conv: sum_i x_i w_i (+ bias), relu-fused with s > 0
        xs, ws = z3.Reals(" ".join(f"x{i}" for i in range(k))), z3.Reals(" ".join(f"w{i}" for i in range(k)))
        dot = z3.Sum([x * w for x, w in zip(xs, ws)])
        dot_w = z3.Sum([x * (w * s) for x, w in zip(xs, ws)])
        dot_x = z3.Sum([(x * s) * w for x, w in zip(xs, ws)])
        claims += [(z3.BoolVal(True), (dot + b) * s == dot_w + b * s),
                   (z3.BoolVal(True), (dot + b) * s == dot_x + b * s),
                   (s > 0, relu(dot + b) * s == relu(dot_w + b * s))]
    for pre, claim in claims:
        solver = z3.Solver()
        solver.add(pre, z3.Not(claim))
        r = solver.check()
        if r != z3.unsat:
            return r
    return z3.sat if prove_shapes() else z3.unsat


def _compositions(n: int, parts: int):
    """Every way of cutting ``n`` into ``parts`` sizes of at least 1, in order."""
    import itertools

    for cuts in itertools.combinations(range(1, n), parts - 1):
        yield [b - a for a, b in zip((0,) + cuts, cuts + (n,))]


def prove_shapes() -> list:
    """The steps at the shapes their site checks admit, on symbolic tensors (``verifier.symbolic``:
    every element a Z3 real, proved element by element). Returns the cases that fail (none: proved):

    - a split piece (``_absorb_piece``): for ``x`` of shape [M, K], [B, M, K] or [1, M, K] (beside a
      batched W), W [K, N] or [B, K, N], with and without a bias [N] and a fused relu (``s > 0``),
      the result read directly or through a reshape that keeps the last dimension (flattened to
      [B*M, N], or [1] + shape), every split of N = 2..4 columns into 2 or 3 pieces (unequal sizes
      and 1-column pieces included) and every piece ``k``: piece ``k`` of the scaled result is piece
      ``k`` of the result with ``piece_columns(sizes, k)`` of W and b scaled, and every other piece
      is unchanged; M, K and B take 1 and 2, so M = N, K = N and 1-sized axes occur (a fused relu:
      this pre-activation identity and ``prove()``'s scalar ``relu(y) s = relu(y s)``, ``s > 0``);
    - ``ewadd``/``ewmul`` on operands that broadcast ([N] / [M, N], [1] / [M, N], [M, 1] / [1, N]);
    - ``matmul`` of two activations scaled on either side, with batch broadcasting;
    - ``conv2d`` with groups 1, 2 and depthwise, strides 1 and 2, padding and dilation, and a bias:
      scaling the weight and bias scales the output;
    - ``reshape``/``transpose``: scaling commutes.
    """
    import itertools

    import numpy as np

    from taso_mlir.verifier import symbolic as S

    s = S.scalar("s")
    bad = []
    memo: set = set()

    def check(case, lhs, rhs, assume=()):
        d = S.differs(lhs, rhs, assume, memo if not assume else None)
        if d is not None:
            bad.append((case, d))

    # split pieces of a matmul's result
    # (a fused relu is elementwise: with the scalar claim relu(y) s = relu(y s) for s > 0, the
    # pre-activation identity proved here is the relu-fused one)
    for (xs, ws), bias in itertools.product(
            [(("M", "K"), ("K", "N")), (("B", "M", "K"), ("K", "N")), (("B", "M", "K"), ("B", "K", "N")),
             (("1", "M", "K"), ("B", "K", "N"))], (False, True)):
        batched = "B" in xs + ws
        for B, M, K, N in itertools.product((1, 2) if batched else (1,), (1, 2), (1, 2), (2, 3, 4)):
            env = {"B": B, "M": M, "K": K, "N": N, "1": 1}
            x, W = S.tensor("x", [env[d] for d in xs]), S.tensor("W", [env[d] for d in ws])
            b = S.tensor("b", [N]) if bias else None

            scaled: dict = {}

            def result(cols, x=x, W=W, b=b, scaled=scaled):
                """x @ W + b with ``cols`` of W and b scaled (None: none)."""
                if cols not in scaled:
                    W2, b2 = W, b
                    if cols is not None:
                        c0, c1 = cols
                        W2 = W.copy()
                        W2[..., c0:c1] = W2[..., c0:c1] * s
                        if b is not None:
                            b2 = b.copy()
                            b2[c0:c1] = b2[c0:c1] * s
                    scaled[cols] = np.matmul(x, W2) + (b2 if b2 is not None else 0)
                return scaled[cols]
            out = result(None)
            for reshape in (None, "flat", "lead1") if out.ndim > 2 else (None, "lead1"):
                shape = list(out.shape)
                if reshape == "flat":
                    shape = [int(np.prod(shape[:-1])), N]
                elif reshape == "lead1":
                    shape = [1] + shape
                for parts in (2, 3):
                    for sizes in _compositions(N, parts):
                        cuts = np.cumsum(sizes)[:-1]
                        before = np.split(out.reshape(shape), cuts, axis=len(shape) - 1)
                        for k in range(parts):
                            after = np.split(result(piece_columns(sizes, k)).reshape(shape), cuts, axis=len(shape) - 1)
                            case = ("split piece", xs, ws, env, bias, reshape, sizes, k)
                            for j in range(parts):
                                check(case + (j,), before[j] * s if j == k else before[j], after[j])
    # elementwise ops on broadcast operands
    for sa, sb in (((3,), (2, 3)), ((1,), (2, 3)), ((2, 1), (1, 3)), ((2, 3), (2, 3))):
        a, b = S.tensor("a", sa), S.tensor("b", sb)
        check(("ewadd", sa, sb), (a + b) * s, a * s + b * s)
        check(("ewmul", sa, sb, 0), (a * b) * s, (a * s) * b)
        check(("ewmul", sa, sb, 1), (a * b) * s, a * (b * s))
    # a matmul of two activations, either side, batch broadcasting
    for sx, sy in (((2, 3), (3, 2)), ((2, 1, 3), (3, 2)), ((1, 2, 3), (2, 3, 2)), ((2, 2, 3), (1, 3, 1))):
        x, y, b = S.tensor("x", sx), S.tensor("y", sy), S.tensor("b", sy[-1:])
        check(("matmul", sx, sy, 0), (np.matmul(x, y) + b) * s, np.matmul(x * s, y) + b * s)
        check(("matmul", sx, sy, 1), (np.matmul(x, y) + b) * s, np.matmul(x, y * s) + b * s)
    # convolutions
    for (c, o, g), (kh, kw), stride, pads, dil in (
            ((2, 2, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)), ((2, 4, 2), (3, 1), (2, 1), (1, 0, 1, 0), (1, 1)),
            ((2, 2, 2), (3, 3), (1, 2), (1, 1, 1, 1), (1, 1)), ((1, 3, 1), (1, 3), (1, 1), (0, 1, 0, 1), (1, 2))):
        x, W, b = S.tensor("x", (1, c, 3, 3)), S.tensor("W", (o, c // g, kh, kw)), S.tensor("b", (o,))
        conv = S.conv2d(x, W, b, stride, pads, dil, g)
        scaled = S.conv2d(x, W * s, b * s, stride, pads, dil, g)
        check(("conv2d", c, o, g, kh, kw, stride), conv * s, scaled)
    # data movement, and a relu on a tensor (s > 0)
    v = S.tensor("v", (2, 3, 2))
    check(("reshape",), v.reshape(3, 4) * s, (v * s).reshape(3, 4))
    check(("transpose",), np.transpose(v, (2, 0, 1)) * s, np.transpose(v * s, (2, 0, 1)))
    check(("relu",), S.relu(v) * s, S.relu(v * s), [s > 0])
    return bad


def _run_divs(st: FuncState) -> None:
    st.count("divs_raised", div_to_smul(st.f))


def _run_scales(st: FuncState) -> None:
    scales = fold_scalar_scales(st.f)
    st.count("scales_folded", scales)
    if scales:
        function_dce(st.f)


DIVS = FunctionPass("taso-raise-divs", "A division by a power of two as a scalar multiply, bit-exact",
                    _run_divs, {"divs_raised": "divisions by a power of two made scalar multiplies"})
SCALES = FunctionPass("taso-fold-scales", "Scalar multiplies folded into the weights they reach",
                      _run_scales, {"scales_folded": "scalar multiplies folded into the weights they scale"})
