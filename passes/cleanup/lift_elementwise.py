"""Lifting elementwise ops over splits: one op on the whole tensor instead of one per piece.

Where ``f(split(X)#i, split(Y)#i)`` (``f``: ``ewadd`` or ``ewmul``; the two splits on one axis with the
same sizes) or ``g(split(X)#i)`` (``g``: ``relu``, ``sigmoid`` or ``tanh``) appears for some pieces
``i``, those ops become the pieces of ``split(f(X, Y))`` (``split(g(X))``): an elementwise op
computes each element from the elements at the same position, so piece ``i`` of the op on the whole is
the op on the pieces ``i``, bit for bit. A merge of k sibling matmuls leaves such pieces (an RNN cell's
gates: the input and recurrent projections of every gate, each merged into one matmul and split, then
added gate by gate), and TASO's split axioms speak only of splits of a concat, so the rules cannot do
this. Where the pieces pair up in different orders (``f(split(X)#i, split(Y)#j)``, the two merges
having concatenated their weights in different orders) and ``Y`` is a matmul on a weight whose columns
the split cuts, that weight's (and bias's) column blocks are permuted first, as weight-only ops that
the weight folding after this pass computes: ``x @ [W_a | W_b] = [x @ W_a | x @ W_b]`` (axiom A28), so
the pieces of ``Y`` come out in ``X``'s order.

Each lift happens only where the cost model says the op on the whole and its split cost less than the
ops on the pieces and the splits that nothing else uses (they go with the ops: then even one op on one
piece pair can lift, its two splits and it becoming one op and one split). ``taso-search`` runs this
after the search, on the function as written (split trees fused), until nothing more lifts: a lifted
``ewadd``'s pieces can lift the activations on them.
``prove()`` checks both identities (lifting, alignment) with Z3; ``test/unit/test_lift_elementwise.py`` tests the pass
against the reference semantics and in onnxruntime.

Identity: lifting, ``split(f(X, Y), a, sizes)#i = f(split(X, a, sizes)#i, split(Y, a, sizes)#i)`` (and
``g``); alignment, ``split(x @ W' + b', -1, sizes')#p = split(x @ W + b, -1, psizes)#order[p]`` where
``W' = concat(split(W, 1, psizes)[order], 1)``, ``b'`` alike and ``sizes' = psizes[order]``.

Conditions (enforced by ``_unary``, ``_binary`` and ``_permute_to``):
- lifting: the op is elementwise (``ewadd``, ``ewmul``; ``relu``, ``sigmoid``, ``tanh``) with the
  piece's type as its result; a binary op reads piece ``i`` of two different splits on the same
  axis with the same sizes, whose operands have the same type (so pieces ``i`` have the same shape
  and nothing broadcasts; the two operands of the op are distinct values). Any rank, any axis, any
  sizes (unequal and 1-sized pieces included); ``f(X, Y)`` is written with X first, exact where the
  op's operands were the other way round, as IEEE addition and multiplication commute;
- alignment: the permuted split's operand is the result of ``matmul(x, W[, b])`` with no other use,
  activation none or relu (elementwise), ``W`` a 2-D weight (its columns are axis 1: a batched
  weight is not permuted), ``b`` a weight; the split is on the last axis; the permuted sizes equal
  the other split's sizes; ``x`` of any rank >= 2.
``prove_shapes()`` proves both on symbolic tensors at every such shape within small bounds.
"""

from __future__ import annotations

from typing import Optional

from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import create_taso_op, elem_type, taso_attrs
from taso_mlir.passes.ir_util import static_shape, defining_op, use_owner, op_sig
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.passes.weights import fold_weights, merge_duplicate_weights
from taso_mlir.dialect.ops import function_dce


BINARY = ("ewadd", "ewmul")
UNARY = ("relu", "sigmoid", "tanh")


def prove(max_pieces: int = 3, max_len: int = 2, max_inner: int = 2):
    """Z3 proof over the reals of the two identities the pass uses, for splits into 2..``max_pieces``
    pieces of lengths 1..``max_len`` (every layout), with uninterpreted elementwise ops ``f`` and ``g``
    and symbolic tensors (uninterpreted functions of the indices):

    - lifting: element ``e`` of piece ``i`` of ``split(f(X, Y))`` (``split(g(X))``) equals ``f`` (``g``)
      of element ``e`` of pieces ``i`` of ``split(X)`` and ``split(Y)``;
    - alignment: for every order of the pieces and inner length 1..``max_inner``, piece ``p`` of
      ``split(x @ W' + b')``, where ``W'`` and ``b'`` concatenate the column blocks of ``W`` and ``b`` in
      that order, equals piece ``order[p]`` of ``split(x @ W + b)``, element by element.

    A piece of a split is the elements at its offset onward (``split`` along the last axis of a row; other
    rows and leading axes index alike). Returns ``z3.unsat`` (proved) or the first other result."""
    import itertools

    import z3

    R, I = z3.RealSort(), z3.IntSort()
    X, Y = z3.Function("X", I, R), z3.Function("Y", I, R)
    f, g = z3.Function("f", R, R, R), z3.Function("g", R, R)
    x, W, b = z3.Function("x", I, R), z3.Function("W", I, I, R), z3.Function("b", I, R)
    e = z3.Int("e")

    def check(*claims):
        s = z3.Solver()
        s.add(e >= 0, z3.Not(z3.And(*claims)))
        return s.check()

    for n in range(2, max_pieces + 1):
        for sizes in itertools.product(range(1, max_len + 1), repeat=n):
            offs = [sum(sizes[:i]) for i in range(n)]
            for i in range(n):
                def piece(t, i=i):  # element e of piece i of a split tensor t (a function of the index)
                    return t(offs[i] + e)
                lifted_f = piece(lambda c: f(X(c), Y(c)))
                lifted_g = piece(lambda c: g(X(c)))
                r = check(z3.Implies(e < sizes[i], z3.And(lifted_f == f(piece(X), piece(Y)), lifted_g == g(piece(X)))))
                if r != z3.unsat:
                    return r
            for order in itertools.permutations(range(n)):
                psizes = [sizes[j] for j in order]
                poffs = [sum(psizes[:p]) for p in range(n)]
                for kk in range(1, max_inner + 1):
                    def col(c_new, p):  # the column of W that column c_new of W' is (in piece p)
                        return offs[order[p]] + (c_new - poffs[p])
                    for p in range(n):
                        c_new = poffs[p] + e
                        permuted = z3.Sum([x(k) * W(k, col(c_new, p)) for k in range(kk)]) + b(col(c_new, p))
                        original = z3.Sum([x(k) * W(k, offs[order[p]] + e) for k in range(kk)]) + b(offs[order[p]] + e)
                        r = check(z3.Implies(e < psizes[p], permuted == original))
                        if r != z3.unsat:
                            return r
    return z3.sat if prove_shapes() else z3.unsat


def prove_shapes() -> list:
    """Both identities at the shapes the site checks admit, on symbolic tensors (``verifier.symbolic``;
    ``f``, ``g`` uninterpreted): lifting for every shape of 1 to 3 axes of sizes 1..3 (rank 3: 1..2),
    every axis of size >= 2 and every split of it into 2 or 3 pieces; alignment for ``x`` of shape
    [M, K] and [B, M, K] (M, K, B in 1, 2), ``W`` [K, N] (N = 2..4), with and without a bias, every
    split of N into 2 or 3 pieces (unequal sizes included) and every order of the pieces, the new
    weight built as ``_permuted`` builds it (a split then a concat on axis 1; a fused relu is
    elementwise and commutes with the permutation of columns). Returns the cases that fail (none:
    proved)."""
    import itertools

    import numpy as np
    import z3

    from taso_mlir.verifier import symbolic as S

    R = z3.RealSort()
    f, g = z3.Function("f", R, R, R), z3.Function("g", R, R)
    bad = []
    shapes = [list(t) for r in (1, 2) for t in itertools.product((1, 2, 3), repeat=r)]
    shapes += [list(t) for t in itertools.product((1, 2), repeat=3)]
    for shape in shapes:
        X, Y = S.tensor("X", shape), S.tensor("Y", shape)
        whole_f, whole_g = S.apply(f, X, Y), S.apply(g, X)
        for axis in range(len(shape)):
            for parts in (2, 3):
                for cuts in itertools.combinations(range(1, shape[axis]), parts - 1):
                    cuts = list(cuts)
                    xs, ys = np.split(X, cuts, axis), np.split(Y, cuts, axis)
                    for i, (pf, pg) in enumerate(zip(np.split(whole_f, cuts, axis), np.split(whole_g, cuts, axis))):
                        for got, want in ((pf, S.apply(f, xs[i], ys[i])), (pg, S.apply(g, xs[i]))):
                            d = S.differs(got, want)
                            if d is not None:
                                bad.append(("lift", shape, axis, cuts, i, d))
    for xs, N, bias in itertools.product(([1, 1], [2, 1], [1, 2], [2, 2], [2, 1, 2], [2, 2, 1]), (2, 3, 4), (False, True)):
        K = xs[-1]
        x, W = S.tensor("x", xs), S.tensor("W", [K, N])
        b = S.tensor("b", [N]) if bias else None
        y = np.matmul(x, W) + (b if b is not None else 0)
        for parts in (2, 3):
            for cuts in itertools.combinations(range(1, N), parts - 1):
                psizes = [q - p for p, q in zip((0,) + cuts, cuts + (N,))]
                old = np.split(y, list(cuts), axis=-1)
                for order in itertools.permutations(range(parts)):
                    W2 = np.concatenate([np.split(W, list(cuts), axis=1)[j] for j in order], axis=1)
                    b2 = np.concatenate([np.split(b, list(cuts), axis=0)[j] for j in order]) if b is not None else 0
                    new_cuts = list(np.cumsum([psizes[j] for j in order])[:-1])
                    new = np.split(np.matmul(x, W2) + b2, new_cuts, axis=-1)
                    for p in range(parts):
                        d = S.differs(new[p], old[order[p]])
                        if d is not None:
                            bad.append(("align", xs, N, bias, psizes, order, p, d))
    return bad


def _split_of(v: ir.Value) -> Optional[tuple[ir.Operation, int]]:
    o = defining_op(v)
    if o is None or o.name != "taso.split":
        return None
    return o, ir.OpResult(v).result_number


def split_cost(cost_model, split: ir.Operation) -> float:
    """What ``cost_model`` charges for the ``taso.split`` op ``split``."""
    a = taso_attrs(split)
    return cost_model.cost(op_sig("split", {"axis": a["axis"], "sizes": list(a["sizes"])}, [static_shape(split.operands[0])],
                                [static_shape(r) for r in split.results], str(elem_type(split.operands[0])), (False,)))


def goes_with(split: ir.Operation, ops: list) -> bool:
    """Nothing but ``ops`` uses ``split``'s results: lifting them removes it too."""
    return all(any(use_owner(u) == op for op in ops) for r in split.results for u in r.uses)


def lift_until_done(block: ir.Block, lift_at) -> None:
    """Call ``lift_at(split)`` on the static ``taso.split`` ops of ``block``, in order, from the start
    again after each one that lifted (returned True), until none does. ``lift_at`` erases ops only when
    it returns True (then the list of ops, taken before, is not walked further)."""
    while True:
        for op in each_live(ops_of(block)):
            if op.name == "taso.split" and static_shape(op.operands[0]) is not None and lift_at(op):
                break
        else:
            return


class _Lifter:
    def __init__(self, f: ir.Operation, cost_model):
        self.block = f.regions[0].blocks[0]
        self.cm = cost_model
        self.lifted = 0
        self.permuted = 0

    # ---- costs ----

    def _gains(self, kind: str, split: ir.Operation, pieces: list, n_operands: int, ops: list = (),
               splits: tuple = ()) -> bool:
        """The op on the whole and its split cost less than the ops on ``pieces`` (and than each of
        ``splits`` that nothing but ``ops``, the ops lifted, uses: it goes with them)."""
        whole = static_shape(split.operands[0])
        if whole is None:
            return False
        dtype = str(elem_type(split.operands[0]))
        pshapes = [static_shape(r) for r in split.results]
        w = (False,) * n_operands
        old = sum(self.cm.cost(op_sig(kind, {}, [pshapes[i]] * n_operands, [pshapes[i]], dtype, w)) for i in pieces)
        old += sum(split_cost(self.cm, s) for s in splits if goes_with(s, ops))
        new = self.cm.cost(op_sig(kind, {}, [whole] * n_operands, [whole], dtype, w)) + split_cost(self.cm, split)
        return new < old

    # ---- the rewrite ----
    def _lift(self, kind: str, split: ir.Operation, operands: list, ops_by_piece: dict) -> None:
        first = None
        for op in ops_by_piece.values():
            if first is None or op.is_before_in_block(first):
                first = op
        a = taso_attrs(split)
        with ir.InsertionPoint(first):
            whole = create_taso_op(kind, operands, [split.operands[0].type], {}, loc=first.location)
            pieces = create_taso_op("split", [whole.results[0]], [r.type for r in split.results],
                                    {"axis": a["axis"], "sizes": list(a["sizes"])}, loc=first.location)
        for i, op in ops_by_piece.items():
            replace_uses(op.results[0], pieces.results[i])
            erase_op(op)
        self.lifted += len(ops_by_piece)

    def _unary(self, split: ir.Operation) -> bool:
        for kind in UNARY:
            group = {}
            for i, r in enumerate(split.results):
                for u in r.uses:
                    op = use_owner(u)
                    if op.name == f"taso.{kind}" and i not in group:
                        group[i] = op
            if group and self._gains(kind, split, list(group), 1, list(group.values()), (split,)):
                self._lift(kind, split, [split.operands[0]], group)
                return True
        return False

    def _binary(self, split: ir.Operation) -> bool:
        a = taso_attrs(split)
        # (kind, partner split) -> [(my piece, partner piece, op)]
        groups: dict = {}
        for i, r in enumerate(split.results):
            for u in r.uses:
                op = use_owner(u)
                if op.name not in ("taso.ewadd", "taso.ewmul") or len(op.operands) != 2:
                    continue
                other = op.operands[1] if op.operands[0] == r else op.operands[0]
                if op.operands[0] == op.operands[1]:
                    continue
                p = _split_of(other)
                if p is None or p[0] == split or op.results[0].type != r.type:
                    continue
                partner, j = p
                pa = taso_attrs(partner)
                if pa["axis"] != a["axis"] or partner.operands[0].type != split.operands[0].type:
                    continue
                groups.setdefault((op.name[5:], partner), []).append((i, j, op))
        by_partner: dict = {}
        for (kind, partner), pairs in groups.items():
            by_partner.setdefault(partner, []).extend(pairs)
        for partner, pairs in by_partner.items():
            # pieces paired in different orders: align the partner first (then they lift at once), with
            # the pairs of every kind, so that like merges get like orders (and their weights merge);
            # only where a lift it enables gains
            if len(pairs) >= 2 and any(i != j for i, j, _ in pairs) and any(
                    len(ps) >= 2 and self._gains(kind, split, sorted({i for i, _, _ in ps}), 2)
                    for (kind, p), ps in groups.items() if p == partner) and self._align(split, partner, pairs):
                return True
        for (kind, partner), pairs in groups.items():
            mine = {}
            for i, j, op in pairs:
                if i == j and i not in mine:
                    mine[i] = op
            if mine and list(taso_attrs(partner)["sizes"]) == list(a["sizes"]) \
                    and self._gains(kind, split, list(mine), 2, list(mine.values()), (split, partner)):
                self._lift(kind, split, [split.operands[0], partner.operands[0]], mine)
                return True
        return False

    # ---- aligning a partner's pieces by permuting its weight's column blocks ----
    def _align(self, split: ir.Operation, partner: ir.Operation, pairs: list) -> bool:
        """Permute the pieces of ``partner`` (else of ``split``) so that paired pieces share positions."""
        return (self._permute_to(split, partner, pairs)
                or self._permute_to(partner, split, [(j, i, op) for i, j, op in pairs]))

    def _permute_to(self, split: ir.Operation, partner: ir.Operation, pairs: list) -> bool:
        a, pa = taso_attrs(split), taso_attrs(partner)
        sizes, psizes = list(a["sizes"]), list(pa["sizes"])
        n = len(psizes)
        if len(sizes) != n:
            return False
        want: dict = {}  # new position -> old piece of the partner
        for i, j, _ in pairs:
            if want.get(i, j) != j or (i not in want and j in want.values()):
                return False  # a piece paired with two others: no one order serves both
            want[i] = j
        rest = iter([j for j in range(n) if j not in want.values()])
        order = [want[i] if i in want else next(rest) for i in range(n)]
        if [psizes[j] for j in order] != sizes or order == list(range(n)):
            return False
        y = partner.operands[0]
        m = defining_op(y)
        if m is None or m.name != "taso.matmul" or sum(1 for _ in y.uses) != 1:
            return False
        if taso_attrs(m).get("activation", "none") not in ("none", "relu"):
            return False
        rank = len(static_shape(y) or [])
        if pa["axis"] != rank - 1 or defining_op(m.operands[1]) is None or defining_op(m.operands[1]).name != "taso.weight":
            return False
        if len(static_shape(m.operands[1]) or []) != 2:
            return False  # a batched weight: its columns are not axis 1
        bias = m.operands[2] if len(m.operands) == 3 else None
        if bias is not None and (defining_op(bias) is None or defining_op(bias).name != "taso.weight"):
            return False
        loc = m.location
        with ir.InsertionPoint(m):
            w = self._permuted(m.operands[1], 1, psizes, order, loc)
            b = self._permuted(bias, 0, psizes, order, loc) if bias is not None else None
            new_m = create_taso_op("matmul", [m.operands[0], w] + ([b] if b is not None else []), [y.type],
                                   {k: v for k, v in taso_attrs(m).items()}, loc=loc)
            new_s = create_taso_op("split", [new_m.results[0]], [partner.results[j].type for j in order],
                                   {"axis": pa["axis"], "sizes": [psizes[j] for j in order]}, loc=partner.location)
        for pos, j in enumerate(order):
            replace_uses(partner.results[j], new_s.results[pos])
        erase_op(partner)
        erase_op(m)
        self.permuted += 1
        return True

    def _permuted(self, w: ir.Value, axis: int, sizes: list, order: list, loc) -> ir.Value:
        """concat(split(w)[order]) along ``axis``: weight-only ops, folded after the pass."""
        shape = static_shape(w)
        et = ir.RankedTensorType(w.type).element_type

        def t(s):
            return ir.RankedTensorType.get(s, et)
        piece_types = [t(shape[:axis] + [s] + shape[axis + 1:]) for s in sizes]
        sp = create_taso_op("split", [w], piece_types, {"axis": axis, "sizes": sizes}, loc=loc)
        cat = create_taso_op("concat", [sp.results[j] for j in order], [w.type], {"axis": axis}, loc=loc)
        return cat.results[0]

    def run(self) -> None:
        # Ends: each lift removes ops on split pieces, and a matmul is permuted at most once per pass (its
        # weight operand becomes a weight-only concat, which is folded only after the pass, and
        # ``_permute_to`` permutes only a ``taso.weight``). Folding inside this loop would break that.
        lift_until_done(self.block, lambda split: self._unary(split) or self._binary(split))


@ir_step
def lift_elementwise(f: ir.Operation, cost_model) -> tuple[int, int]:
    """Lift elementwise ops over the splits of the function ``f`` (module docstring) where
    ``cost_model`` says it gains, until nothing more lifts. Returns (ops lifted, weights permuted); the
    permuted weights are weight-only ops for ``fold_weights``."""
    lf = _Lifter(f, cost_model)
    lf.run()
    return lf.lifted, lf.permuted


def _run(st: FuncState) -> None:
    f = st.f
    lifted, permuted = lift_elementwise(f, st.cost_model)
    st.count("elementwise_lifted", lifted)
    st.count("weights_permuted", permuted)
    if permuted:
        st.count("weights_folded", fold_weights(f))
    # equal folded weights (the folding after the search makes new ones) are merged
    merged = merge_duplicate_weights(f)
    st.count("weights_merged", merged)
    if lifted or permuted or merged:
        function_dce(f)


PASS = FunctionPass("taso-lift-elementwise", "Elementwise ops over a split's pieces lifted over the split; "
                    "weights permuted to align", _run,
                    {"elementwise_lifted": "elementwise ops on split pieces lifted to one op on the whole tensor", "weights_permuted": "weights' column blocks permuted to align pieces", "weights_folded": "weight-only ops folded into weights", "weights_merged": "duplicate folded weights merged"},
                    needs_cost_model=True, group="cleanup")
