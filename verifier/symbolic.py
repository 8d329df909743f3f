"""Symbolic tensors for the shape-aware proofs of the hand-written passes (issue 20).

A pass rewrites IR by an identity that holds only under shape conditions its site check enforces
(which axis a bias broadcasts on, which columns a split piece is, which reshape keeps rows). A proof
over scalars cannot see those conditions. Here a tensor of a concrete shape is a numpy object array
whose every element is its own Z3 real variable; numpy's own indexing, reshapes, transposes, splits,
broadcasting and ``matmul`` (which work on object arrays) move and combine the symbolic elements, and
both sides of an identity are compared element by element: the difference simplified to a polynomial
in Z3's sum-of-monomials normal form is 0, or else Z3 proves the equation (under ``assume``). At one
shape this is a proof for every value of the elements; the passes' ``prove()`` functions call it at
every shape (within small bounds) their site checks admit, the adversarial ones included (size-1
axes, unequal split sizes, dimensions equal only by coincidence, broadcast operands).

Only what numpy cannot do on objects is written here: ``conv2d`` (the spec's definition: zero
padding, strides, dilations, groups, a bias per output channel) and elementwise application of a
Z3 function (``relu``, an uninterpreted ``f``).
"""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np


def _z3():
    import z3

    return z3


def tensor(name: str, shape) -> np.ndarray:
    """An object array of ``shape`` whose elements are distinct Z3 reals ``name[i,j,...]``."""
    z3 = _z3()
    shape = tuple(int(d) for d in shape)
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = z3.Real(f"{name}[{','.join(map(str, idx))}]")
    return out


def scalar(name: str):
    return _z3().Real(name)


def apply(fn, *arrays) -> np.ndarray:
    """``fn`` elementwise over the (broadcast) arrays, as an object array."""
    arrays = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in arrays])
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(*out.shape):
        out[idx] = fn(*[a[idx] for a in arrays])
    return out


def relu(a) -> np.ndarray:
    z3 = _z3()
    return apply(lambda v: z3.If(v > 0, v, z3.RealVal(0)), a)


def conv2d(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None, strides=(1, 1), pads=(0, 0, 0, 0),
           dilations=(1, 1), group: int = 1) -> np.ndarray:
    """The spec's ``conv2d`` (``dialect.specs``) on object arrays: ``x`` [N, C, H, W], ``w`` [O, C/group,
    KH, KW], output channel ``o`` reads input channels of its group ``o // (O/group)``, zero padding
    ``pads`` = [top, left, bottom, right], then ``b[o]``."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    assert c == cg * group and o % group == 0, (x.shape, w.shape, group)
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), dtype=object)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    og = o // group
    out = np.empty((n, o, oh, ow), dtype=object)
    for bi, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        terms = [w[oc, ci, p, q] * xp[bi, g * cg + ci, i * strides[0] + p * dilations[0], j * strides[1] + q * dilations[1]]
                 for ci in range(cg) for p in range(kh) for q in range(kw)]
        acc = _z3().Sum(terms) if terms else _z3().RealVal(0)
        out[bi, oc, i, j] = acc + b[oc] if b is not None else acc
    return out


def _zero(z3, d) -> bool:
    r = z3.simplify(d, som=True)
    return z3.is_rational_value(r) and r.as_fraction() == 0


def differs(lhs, rhs, assume=(), memo: Optional[set] = None) -> Optional[tuple]:
    """None where ``lhs`` and ``rhs`` (object arrays, or Z3 terms) have the same shape and every element
    of one equals the other's for all values of the variables (under the conditions ``assume``), else
    (what differs: "shape" and the two shapes, or the first index and the two elements). ``memo``: a
    set of element pairs already proved (Z3 terms are hash-consed: equal terms have equal ids), kept
    across calls that share ``assume``."""
    z3 = _z3()
    lhs, rhs = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    if lhs.shape != rhs.shape:
        return ("shape", lhs.shape, rhs.shape)
    for idx in np.ndindex(*lhs.shape):
        a, b = lhs[idx], rhs[idx]
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if a != b:
                return (idx, a, b)
            continue
        a = a if z3.is_expr(a) else z3.RealVal(a)
        b = b if z3.is_expr(b) else z3.RealVal(b)
        if a.eq(b):
            continue
        key = (a.get_id(), b.get_id())
        if memo is not None and key in memo:
            continue
        if not (z3.is_arith(a) and _zero(z3, a - b)):
            s = z3.Solver()
            s.add(*assume)
            s.add(a != b)
            if s.check() != z3.unsat:
                return (idx, a, b)
        if memo is not None:
            memo.add(key)
    return None


def proved(lhs, rhs, assume=()) -> bool:
    return differs(lhs, rhs, assume) is None
