"""The shape rules of the operators the axioms speak of, written once over two arithmetics.

Every op of the verifier's algebra has a *shape rule*: from its operands' dimensions (and its
integer attributes) the dimensions of its results and the conditions under which it type-checks.
The rules are written once, against a small arithmetic interface, and run two ways:

- ``Z3Arith``: dimensions are Z3 integer terms, conditions Z3 booleans. This is how the prover gives
  every tensor term its shape (``axioms.Z3Algebra``), states each axiom's shape conditions, and states
  a rule's hypothesis that both of its sides type-check.
- ``PyArith``: dimensions are Python ints, conditions Python bools. ``validate.py`` evaluates the same
  rules at every concrete shape it validates an axiom at and checks them against the operator specs
  (``dialect.specs``: the ground truth): the conditions must hold exactly where both sides of the
  axiom type-check there, and the result shapes must be the specs' shapes. A shape rule that disagrees
  with the specs fails axiom validation, so the Z3 and numpy forms of an axiom state the same
  conditions by construction.

The domain is tensors whose dimensions are all at least 1 (``positive`` below); a zero-sized split
piece or tensor is outside it, and the search never applies a rule at such a site.

Window ops use SAME padding ((k-1)/2 on each side, odd k), so a window's output size depends only on
the input size and the stride: ``ceil(h / s)``. In Z3 that is the uninterpreted function ``wout(h,
stride code, axis)`` (only equalities between output sizes matter; an uninterpreted function is sound
for any interpretation, the real one included).
"""

from __future__ import annotations

import math


class ShapeError(Exception):
    """A structural mismatch (wrong rank) that no dimension values can repair."""


class PyArith:
    """Concrete dimensions: Python ints and bools."""

    concrete = True

    def And(self, *cs): return all(cs)
    def Or(self, *cs): return any(cs)
    def Not(self, c): return not c
    def If(self, c, a, b): return a if c else b
    def mod(self, a, m): return a % m if m else -1
    def div(self, a, m): return a // m if m else 0
    def wout(self, h, s, axis):
        st = (s // 100, s % 100)[axis]
        return -(-h // st) if st > 0 else -1
    def kdim(self, k, axis): return (k // 100, k % 100)[axis]


class Z3Arith:
    """Symbolic dimensions: Z3 integer terms (Python ints mix in)."""

    concrete = False

    def __init__(self, z3, ctx):
        self.z3, self.ctx = z3, ctx
        I = z3.IntSort(ctx)
        self._wout = z3.Function("wout", I, I, I, I)

    def _b(self, c):
        return self.z3.BoolVal(c, self.ctx) if isinstance(c, bool) else c

    def And(self, *cs):
        if any(c is False for c in cs):
            return False
        rest = [c for c in cs if c is not True]
        return True if not rest else rest[0] if len(rest) == 1 else self.z3.And(*rest)

    def Or(self, *cs):
        if any(c is True for c in cs):
            return True
        rest = [c for c in cs if c is not False]
        return False if not rest else rest[0] if len(rest) == 1 else self.z3.Or(*rest)

    def Not(self, c): return (not c) if isinstance(c, bool) else self.z3.Not(c)

    def If(self, c, a, b):
        if isinstance(c, bool):
            return a if c else b
        return self.z3.If(c, self._i(a), self._i(b))

    def _i(self, v): return self.z3.IntVal(v, self.ctx) if isinstance(v, int) else v

    def mod(self, a, m):
        if isinstance(a, int) and isinstance(m, int):
            return PyArith.mod(None, a, m)
        return self._i(a) % self._i(m)

    def div(self, a, m):
        if isinstance(a, int) and isinstance(m, int):
            return PyArith.div(None, a, m)
        return self._i(a) / self._i(m)

    def wout(self, h, s, axis): return self._wout(self._i(h), self._i(s), self.z3.IntVal(axis, self.ctx))

    def kdim(self, k, axis):
        if isinstance(k, int):
            return PyArith.kdim(None, k, axis)
        return k / 100 if axis == 0 else k % 100


def _eq(a, b):
    """a == b for ints or Z3 terms (a Python bool when both are ints)."""
    return a == b


def _ne(a, b):
    return a != b


class ShapeRules:
    """Per op: ``(result dims list(s), conditions list)`` from operand dims (lists) and attributes.

    A rank mismatch raises ``ShapeError`` (ranks are structural in the verifier: every tensor has a
    fixed rank); every other condition is returned, to be asserted or checked."""

    def __init__(self, arith):
        self.A = arith

    def positive(self, dims) -> list:
        return [d >= 1 for d in dims]

    def _rank(self, op, x, r):
        if len(x) != r:
            raise ShapeError(f"{op}: rank {len(x)}, needs {r}")

    def select(self, x, a):
        """Dimension ``a`` of ``x`` (``a`` an int or a term)."""
        if isinstance(a, int):
            if not 0 <= a < len(x):
                raise ShapeError(f"axis {a} of a rank-{len(x)} tensor")
            return x[a]
        out = x[-1]
        for i in range(len(x) - 2, -1, -1):
            out = self.A.If(_eq(a, i), x[i], out)
        return out

    def _axis_ok(self, a, r):
        return (0 <= a < r) if isinstance(a, int) else self.A.And(a >= 0, a < r)

    def ew(self, op, x, y):
        if len(x) != len(y):
            raise ShapeError(f"{op}: ranks {len(x)} and {len(y)}")
        return list(x), [_eq(p, q) for p, q in zip(x, y)]

    def smul(self, x, w):
        self._rank("smul scalar", w, 0)
        return list(x), []

    def same(self, x):
        return list(x), []

    def transpose(self, x):
        self._rank("transpose", x, 2)
        return [x[1], x[0]], []

    def matmul(self, x, y, b=None):
        self._rank("matmul", x, 2)
        self._rank("matmul", y, 2)
        conds = [_eq(x[1], y[0])]
        if b is not None:
            self._rank("matmul bias", b, 1)
            conds.append(_eq(b[0], y[1]))
        return [x[0], y[1]], conds

    def concat(self, a, x, y):
        if len(x) != len(y):
            raise ShapeError(f"concat: ranks {len(x)} and {len(y)}")
        r = len(x)
        conds = [self._axis_ok(a, r)] + [self.A.Or(_eq(a, i), _eq(x[i], y[i])) for i in range(r)]
        return [self.A.If(_eq(a, i), x[i] + y[i], x[i]) for i in range(r)], conds

    def split(self, a, t, sizes):
        """Two pieces of ``t`` along ``a`` with sizes ``(n0, n1)``."""
        n0, n1 = sizes
        r = len(t)
        if isinstance(a, int) and not 0 <= a < r:
            raise ShapeError(f"split: axis {a} of a rank-{r} tensor")
        conds = [self._axis_ok(a, r), n0 >= 1, n1 >= 1, _eq(n0 + n1, self.select(t, a))]
        p0 = [self.A.If(_eq(a, i), n0, t[i]) for i in range(r)]
        p1 = [self.A.If(_eq(a, i), n1, t[i]) for i in range(r)]
        return (p0, p1), conds

    def _odd(self, k):
        return _eq(self.A.mod(k, 2), 1)

    def window(self, x, s):
        return [self.A.wout(x[2], s, 0), self.A.wout(x[3], s, 1)]

    def conv(self, s, g, x, w, b=None):
        """``g``: 1 = group 1; 0 = "grouped" (group = C_in(x) / C_in(w), not 1, dividing C_out)."""
        self._rank("conv2d input", x, 4)
        self._rank("conv2d weight", w, 4)
        A = self.A
        conds = [self._odd(w[2]), self._odd(w[3])]
        if not isinstance(g, int):
            raise TypeError("the group kind is structural: 1 or 0, never a term")
        if g == 1:
            conds.append(_eq(x[1], w[1]))
        else:
            conds += [_ne(x[1], w[1]), _eq(A.mod(x[1], w[1]), 0), _eq(A.mod(w[0], A.div(x[1], w[1])), 0)]
        if b is not None:
            self._rank("conv2d bias", b, 1)
            conds.append(_eq(b[0], w[0]))
        return [x[0], w[0]] + self.window(x, s), conds

    def pool(self, k, s, x):
        self._rank("pool input", x, 4)
        return [x[0], x[1]] + self.window(x, s), [self._odd(self.A.kdim(k, 0)), self._odd(self.A.kdim(k, 1))]

    def enlarge(self, k, y):
        self._rank("enlarge", y, 4)
        A = self.A
        K0, K1 = A.kdim(k, 0), A.kdim(k, 1)
        conds = [K0 >= y[2], K1 >= y[3], _eq(A.mod(K0 - y[2], 2), 0), _eq(A.mod(K1 - y[3], 2), 0)]
        return [y[0], y[1], K0, K1], conds

    def constant(self, name, dims):
        conds = self.positive(dims)
        if name == "const_pool":
            self._rank(name, dims, 4)
            conds.append(_eq(dims[1], 1))
        elif name == "const_iconv":
            self._rank(name, dims, 4)
            conds += [self._odd(dims[2]), self._odd(dims[3]), _eq(self.A.mod(dims[0], dims[1]), 0)]
        elif name == "const_imatmul":
            if len(dims) < 2:
                raise ShapeError(f"{name}: rank {len(dims)}")
            conds.append(_eq(dims[-1], dims[-2]))
        return list(dims), conds


def window_size(h: int, stride: int) -> int:
    """SAME-padded window output size (the meaning of ``wout``)."""
    return math.ceil(h / stride)
