"""Operator axioms, written once against an abstract algebra and read two ways.

``Z3Algebra`` turns an axiom into a universally quantified equation over one uninterpreted sort of
tensors (operators are uninterpreted functions, attributes are integer arguments), which is how the
verifier proves rules, as TASO does. ``NumpyAlgebra`` evaluates the same two sides with the operator
specs' reference semantics (``dialect.specs``) on concrete shapes, which is how every axiom is
validated: a wrong axiom cannot prove a wrong rule without failing validation first.

Each axiom lists its tensor variables with a shape template (symbols: dims 1..4; ``k`` and ``kk``: odd kernel sizes 1 or 3). Templates are as general as the Z3 reading, which knows no
shapes: an axiom must hold at every shape where both sides type-check and its attribute parameters with the values to validate (in Z3 they are quantified).
Numbering follows TASO's list (A1-A44); ``L*`` are TASO's lemmas; ``X*`` are axioms our operators need
beyond TASO's (fused matmul activation, linearity of average pooling and enlarge, left scaling of
matmul); ``B*`` are TASO's convolution axioms restated for a convolution with a bias operand (one
value per output channel, added before the activation), which the ``conv-bias`` rule family needs;
``M*`` are the matmul axioms restated the same way for a matmul with a bias operand (one value per
output column), for the ``matmul-bias`` family. Known traps are respected: concat associativity is not an axiom, and the output-channel
concat of convolutions (A24) and the input-channel merge (A19) hold for group 1 only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..dialect import specs
from . import shapes as SH

ACT = {"none": 0, "relu": 1}

#: template symbols that are kernel sizes: odd, validated at 1 and 3 (every other symbol at 1..4)
KERNEL_SYMBOLS = ("k", "kk")


def kcode(k) -> int:
    return int(k[0]) * 100 + int(k[1])


def scode(s) -> int:
    return int(s[0]) * 100 + int(s[1])


PAD_SAME = 1


@dataclass
class Axiom:
    name: str
    doc: str
    tensors: dict  # var -> shape template, e.g. "n c h w"
    build: Callable  # (alg, **vars_and_params) -> (lhs, rhs)
    params: dict = field(default_factory=dict)  # param -> values to validate (the only values Z3 may use)
    free: tuple = ()  # dimension symbols of constants that no tensor template has (dims 1..4)


AXIOMS: list[Axiom] = []


def axiom(name, doc, tensors, params=None, ranks=None, free=()):
    """Register an axiom. ``ranks``: the axiom is elementwise and holds at every rank; it is registered
    once per rank (``NAME.rR``): ``*`` in a template stands for R shared dimensions; with a parameter
    whose values are ``"axes"``, once per rank and axis (``NAME.rRaA``), and ``*'`` stands for the same
    dimensions but on axis A, where it has a size of its own (a concat's other operand)."""
    def deco(f):
        if ranks is None:
            AXIOMS.append(Axiom(name, doc, tensors, f, params or {}, tuple(free)))
            return f
        axes = [p for p, vals in (params or {}).items() if vals == "axes"]
        for r in ranks:
            for a in (range(r) if axes else [None]):
                star = " ".join(f"e{i}" for i in range(r))
                other = " ".join(f"q{i}" if i == a else f"e{i}" for i in range(r))
                tens = {v: t.replace("*'", other).replace("*", star).strip() for v, t in tensors.items()}
                prm = {p: (a,) if vals == "axes" else vals for p, vals in (params or {}).items()}
                suffix = f".r{r}" + ("" if a is None else f"a{a}")
                AXIOMS.append(Axiom(name + suffix, f"{doc} (rank {r}" + ("" if a is None else f", axis {a}") + ")",
                                    tens, f, prm, tuple(free)))
        return f
    return deco


#: the ranks at which the elementwise axioms are stated (the generator's tensors are 1-, 2- and 4-D)
EW_RANKS = (1, 2, 4)


# ---- elementwise ----
@axiom("A1", "x+(y+z) = (x+y)+z", {"x": "*", "y": "*", "z": "*"}, ranks=EW_RANKS)
def _a1(A, x, y, z): return A.add(x, A.add(y, z)), A.add(A.add(x, y), z)
@axiom("A2", "x+y = y+x", {"x": "*", "y": "*"}, ranks=EW_RANKS)
def _a2(A, x, y): return A.add(x, y), A.add(y, x)
@axiom("A3", "x*(y*z) = (x*y)*z", {"x": "*", "y": "*", "z": "*"}, ranks=EW_RANKS)
def _a3(A, x, y, z): return A.mul(x, A.mul(y, z)), A.mul(A.mul(x, y), z)
@axiom("A4", "x*y = y*x", {"x": "*", "y": "*"}, ranks=EW_RANKS)
def _a4(A, x, y): return A.mul(x, y), A.mul(y, x)
@axiom("A5", "(x+y)*z = x*z + y*z", {"x": "*", "y": "*", "z": "*"}, ranks=EW_RANKS)
def _a5(A, x, y, z): return A.mul(A.add(x, y), z), A.add(A.mul(x, z), A.mul(y, z))
# ---- scalar multiplication ----
@axiom("A6", "(x.y).w = x.(y.w)", {"x": "*", "y": "", "w": ""}, ranks=EW_RANKS)
def _a6(A, x, y, w): return A.smul(A.smul(x, y), w), A.smul(x, A.smul(y, w))
@axiom("A7", "(x+y).w = x.w + y.w", {"x": "*", "y": "*", "w": ""}, ranks=EW_RANKS)
def _a7(A, x, y, w): return A.smul(A.add(x, y), w), A.add(A.smul(x, w), A.smul(y, w))
@axiom("A8", "(x*y).w = x*(y.w)", {"x": "*", "y": "*", "w": ""}, ranks=EW_RANKS)
def _a8(A, x, y, w): return A.smul(A.mul(x, y), w), A.mul(x, A.smul(y, w))
@axiom("A9", "T(x).w = T(x.w)", {"x": "m n", "w": ""})
def _a9(A, x, w): return A.smul(A.t(x), w), A.t(A.smul(x, w))
@axiom("A10", "mm(x,y).w = mm(x, y.w)", {"x": "m q", "y": "q n", "w": ""})
def _a10(A, x, y, w): return A.smul(A.mm(0, x, y), w), A.mm(0, x, A.smul(y, w))
@axiom("X10", "mm(x.w, y) = mm(x,y).w", {"x": "m q", "y": "q n", "w": ""})
def _x10(A, x, y, w): return A.mm(0, A.smul(x, w), y), A.smul(A.mm(0, x, y), w)
@axiom("A11", "cat_a(x,y).w = cat_a(x.w, y.w)", {"x": "*", "y": "*'", "w": ""}, {"a": "axes"}, ranks=EW_RANKS)
def _a11(A, x, y, w, a): return A.smul(A.cat(a, x, y), w), A.cat(a, A.smul(x, w), A.smul(y, w))
# ---- convolution ----
_CONV = {"x": "n c h w", "y": "o c k kk"}
_S = {"s": ((1, 1), (2, 2), (1, 2))}
@axiom("A12", "conv(s,p,N, x.w, y) = conv(s,p,N, x, y.w)", {**_CONV, "w": ""}, _S)
def _a12(A, x, y, w, s): return A.conv(s, 1, 0, A.smul(x, w), y), A.conv(s, 1, 0, x, A.smul(y, w))
@axiom("A13", "conv(s,p,N,x,y).w = conv(s,p,N, x.w, y)", {**_CONV, "w": ""}, _S)
def _a13(A, x, y, w, s): return A.smul(A.conv(s, 1, 0, x, y), w), A.conv(s, 1, 0, A.smul(x, w), y)
@axiom("A12g", "conv(s,p,N, x.w, y) = conv(s,p,N, x, y.w), grouped", {"x": "n c h w", "y": "o d k kk", "w": ""}, _S)
def _a12g(A, x, y, w, s): return A.conv(s, 0, 0, A.smul(x, w), y), A.conv(s, 0, 0, x, A.smul(y, w))
@axiom("A13g", "conv(s,p,N,x,y).w = conv(s,p,N, x.w, y), grouped", {"x": "n c h w", "y": "o d k kk", "w": ""}, _S)
def _a13g(A, x, y, w, s): return A.smul(A.conv(s, 0, 0, x, y), w), A.conv(s, 0, 0, A.smul(x, w), y)
@axiom("A14", "relu(conv(s,p,N,x,y)) = conv(s,p,R,x,y)", _CONV, _S)
def _a14(A, x, y, s): return A.relu(A.conv(s, 1, 0, x, y)), A.conv(s, 1, 1, x, y)
@axiom("A14g", "relu(conv(s,p,N,x,y)) = conv(s,p,R,x,y), grouped", {"x": "n c h w", "y": "o d k kk"}, _S)
def _a14g(A, x, y, s): return A.relu(A.conv(s, 0, 0, x, y)), A.conv(s, 0, 1, x, y)
@axiom("A15", "relu(cat_a(x,y)) = cat_a(relu x, relu y)", {"x": "*", "y": "*'"}, {"a": "axes"}, ranks=EW_RANKS)
def _a15(A, x, y, a): return A.relu(A.cat(a, x, y)), A.cat(a, A.relu(x), A.relu(y))
@axiom("A16", "relu(T x) = T(relu x)", {"x": "m n"})
def _a16(A, x): return A.relu(A.t(x)), A.t(A.relu(x))
@axiom("A17", "conv(s,p,N,x, y+z) = conv(s,p,N,x,y) + conv(s,p,N,x,z)", {**_CONV, "z": "o c k kk"}, _S)
def _a17(A, x, y, z, s): return A.conv(s, 1, 0, x, A.add(y, z)), A.add(A.conv(s, 1, 0, x, y), A.conv(s, 1, 0, x, z))
@axiom("A17g", "conv(s,p,N,x, y+z) = conv(x,y) + conv(x,z), grouped", {"x": "n c h w", "y": "o d k kk", "z": "o d k kk"}, _S)
def _a17g(A, x, y, z, s): return A.conv(s, 0, 0, x, A.add(y, z)), A.add(A.conv(s, 0, 0, x, y), A.conv(s, 0, 0, x, z))
@axiom("A18", "conv(s,p,N, x+y, z) = conv(s,p,N,x,z) + conv(s,p,N,y,z)", {"x": "n c h w", "y": "n c h w", "z": "o c k kk"}, _S)
def _a18(A, x, y, z, s): return A.conv(s, 1, 0, A.add(x, y), z), A.add(A.conv(s, 1, 0, x, z), A.conv(s, 1, 0, y, z))
@axiom("A19", "conv(x,y) + conv(z,w) = conv(cat_1(x,z), cat_1(y,w)) (group 1)",
       {"x": "n c h w", "y": "o c k kk", "z": "n d h w", "w": "o d k kk"}, _S)
def _a19(A, x, y, z, w, s):
    return A.add(A.conv(s, 1, 0, x, y), A.conv(s, 1, 0, z, w)), A.conv(s, 1, 0, A.cat(1, x, z), A.cat(1, y, w))
# ---- convolution with a bias operand (b: one value per output channel) ----
_CONVB = {"x": "n c h w", "y": "o c k kk", "b": "o"}
@axiom("B14", "relu(conv(s,p,N,x,y,b)) = conv(s,p,R,x,y,b)", _CONVB, _S)
def _b14(A, x, y, b, s): return A.relu(A.conv_b(s, 1, 0, x, y, b)), A.conv_b(s, 1, 1, x, y, b)
@axiom("B14g", "relu(conv(s,p,N,x,y,b)) = conv(s,p,R,x,y,b), grouped", {"x": "n c h w", "y": "o d k kk", "b": "o"}, _S)
def _b14g(A, x, y, b, s): return A.relu(A.conv_b(s, 0, 0, x, y, b)), A.conv_b(s, 0, 1, x, y, b)
@axiom("B23", "cat_0(conv(x,z,b), conv(y,z,b)) = conv(cat_0(x,y), z, b)", {"x": "n c h w", "y": "m c h w", "z": "o c k kk", "b": "o"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _b23(A, x, y, z, b, s, c): return A.cat(0, A.conv_b(s, 1, c, x, z, b), A.conv_b(s, 1, c, y, z, b)), A.conv_b(s, 1, c, A.cat(0, x, y), z, b)
@axiom("B24", "cat_1(conv(x,y,b), conv(x,z,d)) = conv(x, cat_0(y,z), cat_0(b,d)) (group 1)",
       {"x": "n c h w", "y": "o c k kk", "z": "p c k kk", "b": "o", "d": "p"}, {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _b24(A, x, y, z, b, d, s, c):
    return A.cat(1, A.conv_b(s, 1, c, x, y, b), A.conv_b(s, 1, c, x, z, d)), A.conv_b(s, 1, c, x, A.cat(0, y, z), A.cat(0, b, d))
@axiom("B44", "conv(s,SAME,c, x, y, b) = conv(s,SAME,c, x, enlarge(k, y), b)", {"x": "n c h w", "y": "o c k kk", "b": "o"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1), "k": ((3, 3), (1, 3))})
def _b44(A, x, y, b, s, c, k): return A.conv_b(s, 1, c, x, y, b), A.conv_b(s, 1, c, x, A.enlarge(k, y), b)
@axiom("B46", "enlarge(cat_0(y,z)) = cat_0(enlarge y, enlarge z)", {"y": "o c k kk", "z": "p c k kk"})
def _b46(A, y, z): return A.enlarge((3, 3), A.cat(0, y, z)), A.cat(0, A.enlarge((3, 3), y), A.enlarge((3, 3), z))
# ---- matmul ----
@axiom("A20", "mm(x,y) + mm(z,w) = mm(cat_1(x,z), cat_0(y,w))", {"x": "m a", "y": "a n", "z": "m b", "w": "b n"})
def _a20(A, x, y, z, w): return A.add(A.mm(0, x, y), A.mm(0, z, w)), A.mm(0, A.cat(1, x, z), A.cat(0, y, w))
@axiom("A21", "cat_a(x+y, z+w) = cat_a(x,z) + cat_a(y,w)", {"x": "*", "y": "*", "z": "*'", "w": "*'"}, {"a": "axes"}, ranks=EW_RANKS)
def _a21(A, x, y, z, w, a): return A.cat(a, A.add(x, y), A.add(z, w)), A.add(A.cat(a, x, z), A.cat(a, y, w))
@axiom("A22", "cat_a(x*y, z*w) = cat_a(x,z) * cat_a(y,w)", {"x": "*", "y": "*", "z": "*'", "w": "*'"}, {"a": "axes"}, ranks=EW_RANKS)
def _a22(A, x, y, z, w, a): return A.cat(a, A.mul(x, y), A.mul(z, w)), A.mul(A.cat(a, x, z), A.cat(a, y, w))
@axiom("A23", "cat_0(conv(x,z), conv(y,z)) = conv(cat_0(x,y), z)", {"x": "n c h w", "y": "b c h w", "z": "o c k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a23(A, x, y, z, s, c): return A.cat(0, A.conv(s, 1, c, x, z), A.conv(s, 1, c, y, z)), A.conv(s, 1, c, A.cat(0, x, y), z)
@axiom("A23g", "cat_0(conv(x,z), conv(y,z)) = conv(cat_0(x,y), z), grouped", {"x": "n c h w", "y": "b c h w", "z": "o d k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a23g(A, x, y, z, s, c): return A.cat(0, A.conv(s, 0, c, x, z), A.conv(s, 0, c, y, z)), A.conv(s, 0, c, A.cat(0, x, y), z)
@axiom("A24", "cat_1(conv(x,y), conv(x,z)) = conv(x, cat_0(y,z)) (group 1)", {"x": "n c h w", "y": "o c k kk", "z": "p c k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a24(A, x, y, z, s, c): return A.cat(1, A.conv(s, 1, c, x, y), A.conv(s, 1, c, x, z)), A.conv(s, 1, c, x, A.cat(0, y, z))
@axiom("A25", "mm(x, mm(y,z)) = mm(mm(x,y), z)", {"x": "m a", "y": "a b", "z": "b n"})
def _a25(A, x, y, z): return A.mm(0, x, A.mm(0, y, z)), A.mm(0, A.mm(0, x, y), z)
@axiom("A26", "split_0(a, cat_a(x,y)) = x", {"x": "*", "y": "*'"}, {"a": "axes"}, ranks=EW_RANKS)
def _a26(A, x, y, a): return A.split(0, a, A.cat(a, x, y), (A.dim(x, a), A.dim(y, a))), x
@axiom("A27", "split_1(a, cat_a(x,y)) = y", {"x": "*", "y": "*'"}, {"a": "axes"}, ranks=EW_RANKS)
def _a27(A, x, y, a): return A.split(1, a, A.cat(a, x, y), (A.dim(x, a), A.dim(y, a))), y
@axiom("A28", "mm(x, cat_1(y,z)) = cat_1(mm(x,y), mm(x,z))", {"x": "m a", "y": "a n", "z": "a p"}, {"c": (0, 1)})
def _a28(A, x, y, z, c): return A.mm(c, x, A.cat(1, y, z)), A.cat(1, A.mm(c, x, y), A.mm(c, x, z))
@axiom("L28", "mm(cat_0(x,y), z) = cat_0(mm(x,z), mm(y,z))", {"x": "m a", "y": "p a", "z": "a n"}, {"c": (0, 1)})
def _l28(A, x, y, z, c): return A.mm(c, A.cat(0, x, y), z), A.cat(0, A.mm(c, x, z), A.mm(c, y, z))
@axiom("A29", "mm(x, y+z) = mm(x,y) + mm(x,z)", {"x": "m a", "y": "a n", "z": "a n"})
def _a29(A, x, y, z): return A.mm(0, x, A.add(y, z)), A.add(A.mm(0, x, y), A.mm(0, x, z))
@axiom("L29", "mm(x+y, z) = mm(x,z) + mm(y,z)", {"x": "m a", "y": "m a", "z": "a n"})
def _l29(A, x, y, z): return A.mm(0, A.add(x, y), z), A.add(A.mm(0, x, z), A.mm(0, y, z))
@axiom("X14", "relu(mm(x,y)) = mm_R(x,y)", {"x": "m a", "y": "a n"})
def _x14(A, x, y): return A.relu(A.mm(0, x, y)), A.mm(1, x, y)
# ---- matmul with a bias operand (b: one value per output column, added before the activation) ----
@axiom("M14", "relu(mm(x,y,b)) = mm_R(x,y,b)", {"x": "m a", "y": "a n", "b": "n"})
def _m14(A, x, y, b): return A.relu(A.mm_b(0, x, y, b)), A.mm_b(1, x, y, b)
@axiom("M28", "mm(x, cat_1(y,z), cat_0(b,d)) = cat_1(mm(x,y,b), mm(x,z,d))",
       {"x": "m a", "y": "a n", "z": "a p", "b": "n", "d": "p"}, {"c": (0, 1)})
def _m28(A, x, y, z, b, d, c): return A.mm_b(c, x, A.cat(1, y, z), A.cat(0, b, d)), A.cat(1, A.mm_b(c, x, y, b), A.mm_b(c, x, z, d))
@axiom("ML28", "mm(cat_0(x,y), z, b) = cat_0(mm(x,z,b), mm(y,z,b))", {"x": "m a", "y": "p a", "z": "a n", "b": "n"}, {"c": (0, 1)})
def _ml28(A, x, y, z, b, c): return A.mm_b(c, A.cat(0, x, y), z, b), A.cat(0, A.mm_b(c, x, z, b), A.mm_b(c, y, z, b))
# ---- transpose ----
@axiom("A30", "T(T x) = x", {"x": "m n"})
def _a30(A, x): return A.t(A.t(x)), x
@axiom("A31", "T(mm(x,y)) = mm(T y, T x)", {"x": "m a", "y": "a n"}, {"c": (0, 1)})
def _a31(A, x, y, c): return A.t(A.mm(c, x, y)), A.mm(c, A.t(y), A.t(x))
@axiom("A32", "T(cat_0(x,y)) = cat_1(T x, T y)", {"x": "m n", "y": "p n"})
def _a32(A, x, y): return A.t(A.cat(0, x, y)), A.cat(1, A.t(x), A.t(y))
@axiom("L32", "T(cat_1(x,y)) = cat_0(T x, T y)", {"x": "m n", "y": "m p"})
def _l32(A, x, y): return A.t(A.cat(1, x, y)), A.cat(0, A.t(x), A.t(y))
@axiom("A33", "cat_0(cat_1(x,y), cat_1(z,w)) = cat_1(cat_0(x,z), cat_0(y,w))", {"x": "m a", "y": "m b", "z": "p a", "w": "p b"})
@axiom("A33.r4", "cat_0(cat_1(x,y), cat_1(z,w)) = cat_1(cat_0(x,z), cat_0(y,w)) (rank 4)",
       {"x": "m a h v", "y": "m b h v", "z": "p a h v", "w": "p b h v"})
def _a33(A, x, y, z, w): return A.cat(0, A.cat(1, x, y), A.cat(1, z, w)), A.cat(1, A.cat(0, x, z), A.cat(0, y, w))
@axiom("A34", "T(x+y) = T x + T y", {"x": "m n", "y": "m n"})
def _a34(A, x, y): return A.t(A.add(x, y)), A.add(A.t(x), A.t(y))
@axiom("A35", "T(x*y) = T x * T y", {"x": "m n", "y": "m n"})
def _a35(A, x, y): return A.t(A.mul(x, y)), A.mul(A.t(x), A.t(y))
# ---- pooling ----
_P = {"s": ((1, 1), (2, 2)), "k": ((3, 3), (1, 3))}
@axiom("A36", "cat_1(avgpool x, avgpool y) = avgpool(cat_1(x,y))", {"x": "n c h w", "y": "n d h w"}, _P)
def _a36(A, x, y, s, k): return A.cat(1, A.avgpool(k, s, x), A.avgpool(k, s, y)), A.avgpool(k, s, A.cat(1, x, y))
@axiom("L36", "cat_0(avgpool x, avgpool y) = avgpool(cat_0(x,y))", {"x": "n c h w", "y": "b c h w"}, _P)
def _l36(A, x, y, s, k): return A.cat(0, A.avgpool(k, s, x), A.avgpool(k, s, y)), A.avgpool(k, s, A.cat(0, x, y))
@axiom("A37", "cat_0(maxpool x, maxpool y) = maxpool(cat_0(x,y))", {"x": "n c h w", "y": "b c h w"}, _P)
def _a37(A, x, y, s, k): return A.cat(0, A.maxpool(k, s, x), A.maxpool(k, s, y)), A.maxpool(k, s, A.cat(0, x, y))
@axiom("A38", "cat_1(maxpool x, maxpool y) = maxpool(cat_1(x,y))", {"x": "n c h w", "y": "n d h w"}, _P)
def _a38(A, x, y, s, k): return A.cat(1, A.maxpool(k, s, x), A.maxpool(k, s, y)), A.maxpool(k, s, A.cat(1, x, y))
@axiom("A39", "conv(s,p,N,x, C_pool(k)) = avgpool(k,s,p, x)", {"x": "n c h w"}, _P)
def _a39(A, x, s, k): return A.conv(s, 0, 0, x, A.cpool(k, ("c", 1, "K0", "K1"))), A.avgpool(k, s, x)
@axiom("X36", "avgpool(x+y) = avgpool x + avgpool y", {"x": "n c h w", "y": "n c h w"}, _P)
def _x36(A, x, y, s, k): return A.avgpool(k, s, A.add(x, y)), A.add(A.avgpool(k, s, x), A.avgpool(k, s, y))
@axiom("X37", "avgpool(x.w) = avgpool(x).w", {"x": "n c h w", "w": ""}, _P)
def _x37(A, x, w, s, k): return A.avgpool(k, s, A.smul(x, w)), A.smul(A.avgpool(k, s, x), w)
# ---- identities ----
@axiom("A40", "conv(1,SAME,N, x, I_conv(k)) = x", {"x": "n c h w"}, {"k": ((3, 3), (1, 1), (1, 3))})
def _a40(A, x, k): return A.conv((1, 1), 1, 0, x, A.iconv(k, ("c", "c", "K0", "K1"))), x
@axiom("A40g", "conv(1,SAME,N, x, I_conv(k)) = x, depthwise", {"x": "n c h w"}, {"k": ((3, 3), (1, 1))})
def _a40g(A, x, k): return A.conv((1, 1), 0, 0, x, A.iconv(k, ("c", 1, "K0", "K1"))), x
@axiom("A41", "mm(x, I_matmul) = x", {"x": "m n"})
def _a41(A, x): return A.mm(0, x, A.imatmul(("n", "n"))), x
@axiom("L41", "mm(I_matmul, x) = x", {"x": "m n"})
def _l41(A, x): return A.mm(0, A.imatmul(("m", "m")), x), x
@axiom("L41t", "T(I_matmul) = I_matmul", {}, free=("n",))
def _l41t(A): return A.t(A.imatmul(("n", "n"))), A.imatmul(("n", "n"))
@axiom("A42", "x * I_ewmul = x", {"x": "*"}, ranks=EW_RANKS)
def _a42(A, x): return A.mul(x, A.iewmul_like(x)), x
@axiom("A43", "avgpool(k,1,SAME, I_conv(k)) = C_pool(k)", {}, {"k": ((3, 3),)}, free=("c",))
def _a43(A, k): return A.avgpool(k, (1, 1), A.iconv(k, ("c", 1, "K0", "K1"))), A.cpool(k, ("c", 1, "K0", "K1"))
@axiom("A44", "conv(s,SAME,c, x, y) = conv(s,SAME,c, x, enlarge(k, y))", {"x": "n c h w", "y": "o c k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1), "k": ((3, 3), (1, 3))})
def _a44(A, x, y, s, c, k): return A.conv(s, 1, c, x, y), A.conv(s, 1, c, x, A.enlarge(k, y))
@axiom("X44", "enlarge(y+z) = enlarge y + enlarge z", {"y": "o c k kk", "z": "o c k kk"})
def _x44(A, y, z): return A.enlarge((3, 3), A.add(y, z)), A.add(A.enlarge((3, 3), y), A.enlarge((3, 3), z))
@axiom("X45", "enlarge(y.w) = enlarge(y).w", {"y": "o c k kk", "w": ""})
def _x45(A, y, w): return A.enlarge((3, 3), A.smul(y, w)), A.smul(A.enlarge((3, 3), y), w)
@axiom("X46", "enlarge(cat_0(y,z)) = cat_0(enlarge y, enlarge z)", {"y": "o c k kk", "z": "p c k kk"}, {"a": (0,)})
@axiom("X46a1", "enlarge(cat_1(y,z)) = cat_1(enlarge y, enlarge z)", {"y": "o c k kk", "z": "o d k kk"}, {"a": (1,)})
def _x46(A, y, z, a): return A.enlarge((3, 3), A.cat(a, y, z)), A.cat(a, A.enlarge((3, 3), y), A.enlarge((3, 3), z))


# --------------------------------------------------------------------------------------------
# the readings


class NumpyAlgebra:
    """Evaluates an axiom's sides with the reference semantics on concrete arrays.

    ``group`` argument of conv: 1 = a plain convolution, 0 = inferred (depthwise / grouped)."""

    def __init__(self, dims: dict):
        self.dims = dims

    def _shape(self, tmpl):
        return tuple(self.dims[d] if isinstance(d, str) else d for d in tmpl)  # "K0"/"K1": the kernel param

    def dim(self, x, a): return x.shape[a]
    def add(self, x, y): return specs.evaluate("ewadd", [x, y], {})[0] if x.shape == y.shape else _bad("ewadd shapes")
    def mul(self, x, y): return specs.evaluate("ewmul", [x, y], {})[0] if x.shape == y.shape else _bad("ewmul shapes")
    def smul(self, x, w): return specs.evaluate("smul", [x, w], {})[0]
    def relu(self, x): return specs.evaluate("relu", [x], {})[0]
    def t(self, x):
        if x.ndim != 2:
            _bad("transpose rank")
        return specs.evaluate("transpose", [x], {"perm": (1, 0)})[0]
    def mm(self, c, x, y, b=None):
        if x.ndim != 2 or y.ndim != 2:
            _bad("matmul rank")
        return specs.evaluate("matmul", [x, y] + ([] if b is None else [b]), {"activation": "relu" if c else "none"})[0]
    def mm_b(self, c, x, y, b): return self.mm(c, x, y, b)
    def cat(self, a, x, y): return specs.evaluate("concat", [x, y], {"axis": a})[0]
    def split(self, i, a, t, sizes):
        if min(sizes) < 1:
            _bad("split: an empty piece")
        return specs.evaluate("split", [t], {"axis": a, "sizes": tuple(sizes)})[i]
    def conv(self, s, g, c, x, w, b=None):
        if x.ndim != 4 or w.ndim != 4 or w.shape[2] % 2 == 0 or w.shape[3] % 2 == 0:
            _bad("conv shapes")
        if x.shape[1] % w.shape[1]:
            _bad("conv channels")
        group = x.shape[1] // w.shape[1]
        if (group == 1) != bool(g):  # the axiom's group flag: 1 = group 1, 0 = grouped
            _bad("conv group flag")
        pads = (w.shape[2] // 2, w.shape[3] // 2, w.shape[2] // 2, w.shape[3] // 2)
        return specs.evaluate("conv2d", [x, w] + ([] if b is None else [b]),
                              {"strides": s, "pads": pads, "group": group, "activation": "relu" if c else "none"})[0]
    def conv_b(self, s, g, c, x, w, b): return self.conv(s, g, c, x, w, b)
    def _pool_attrs(self, k, s):
        return {"kernel_shape": k, "strides": s, "pads": (k[0] // 2, k[1] // 2, k[0] // 2, k[1] // 2)}
    def _odd_kernel(self, k):
        if k[0] % 2 == 0 or k[1] % 2 == 0:
            _bad("'same' padding needs an odd kernel")
    def avgpool(self, k, s, x):
        self._odd_kernel(k)
        return specs.evaluate("avgpool2d", [x], {**self._pool_attrs(k, s), "count_include_pad": 1})[0]
    def maxpool(self, k, s, x):
        self._odd_kernel(k)
        return specs.evaluate("maxpool2d", [x], self._pool_attrs(k, s))[0]
    def enlarge(self, k, y): return specs.evaluate("enlarge", [y], {"kernel_shape": k})[0]
    def _const(self, name, shape):
        if min(shape, default=1) < 1:
            _bad("an empty constant")
        return specs.constant(name, shape, np.float64)
    def cpool(self, k, tmpl): return self._const("const_pool", self._shape(tmpl))
    def iconv(self, k, tmpl): return self._const("const_iconv", self._shape(tmpl))
    def imatmul(self, tmpl): return self._const("const_imatmul", self._shape(tmpl))
    def iewmul(self, tmpl): return self._const("const_iewmul", self._shape(tmpl))
    def iewmul_like(self, x): return self._const("const_iewmul", x.shape)


def _bad(why):
    raise specs.SpecError(why)


class Shaped:
    """A value of a shape-tracking algebra: a Z3 term (None when only shapes are computed) and its
    dimensions (Z3 integer terms or ints)."""

    __slots__ = ("t", "dims")

    def __init__(self, t, dims):
        self.t, self.dims = t, list(dims)

    @property
    def rank(self) -> int:
        return len(self.dims)


class ShapeAlgebra:
    """Computes every value's dimensions with the shape rules (``verifier.shapes``) and collects the
    conditions under which everything built so far type-checks (``self.conds``). ``Z3Algebra`` adds
    the terms; on its own, with ``PyArith``, it evaluates the same conditions at concrete shapes (which
    is how validation checks them against the specs). ``env``: template symbol -> dimension, for the
    constants' shape templates."""

    def __init__(self, arith=None):
        self.ar = arith or SH.PyArith()
        self.S = SH.ShapeRules(self.ar)
        self.conds: list = []
        self.env: dict = {}

    def _term(self, key, params, operands, out_rank, rule):
        return None

    def _apply(self, key, params, operands, rule):
        out, conds = rule(params, [o.dims for o in operands])
        self.conds += conds
        return Shaped(self._term(key, params, operands, len(out), rule), out)

    def _resolve(self, tmpl):
        return [self.env[d] if isinstance(d, str) else d for d in tmpl]

    def dim(self, x, a): return self.S.select(x.dims, a)
    def _ew(self, name, x, y):
        return self._apply((name, x.rank), (), [x, y], lambda p, d: self.S.ew(name, d[0], d[1]))
    def add(self, x, y): return self._ew("ewadd", x, y)
    def mul(self, x, y): return self._ew("ewmul", x, y)
    def smul(self, x, w): return self._apply(("smul", x.rank), (), [x, w], lambda p, d: self.S.smul(d[0], d[1]))
    def relu(self, x): return self._apply(("relu", x.rank), (), [x], lambda p, d: self.S.same(d[0]))
    def t(self, x): return self._apply(("transpose", x.rank), (), [x], lambda p, d: self.S.transpose(d[0]))
    def mm(self, c, x, y): return self._apply(("matmul",), (c,), [x, y], lambda p, d: self.S.matmul(d[0], d[1]))
    # a matmul with a bias operand: a function of its own (no axiom relates it to matmul)
    def mm_b(self, c, x, y, b): return self._apply(("matmul_b",), (c,), [x, y, b], lambda p, d: self.S.matmul(*d))
    def cat(self, a, x, y): return self._apply(("concat", x.rank), (a,), [x, y], lambda p, d: self.S.concat(p[0], d[0], d[1]))
    def split(self, i, a, t, sizes):
        n0, n1 = sizes
        return self._apply((f"split{i}", t.rank), (a, n0, n1), [t],
                           lambda p, d: (self.S.split(p[0], d[0], (p[1], p[2]))[0][i], self.S.split(p[0], d[0], (p[1], p[2]))[1]))
    # the group kind (1, or 0: grouped) is part of the function, not an argument: a group-1 and a
    # grouped convolution have different shape rules
    def conv(self, s, g, c, x, w):
        s = self._code(s, scode)
        return self._apply(("conv2d", "g1" if g else "grouped"), (s, c), [x, w], lambda p, d: self.S.conv(p[0], g, d[0], d[1]))
    def conv_b(self, s, g, c, x, w, b):
        # a convolution with a bias operand: a function of its own (no axiom relates it to conv2d)
        s = self._code(s, scode)
        return self._apply(("conv2d_b", "g1" if g else "grouped"), (s, c), [x, w, b],
                           lambda p, d: self.S.conv(p[0], g, d[0], d[1], d[2]))
    def _pool(self, name, k, s, x):
        k, s = self._code(k, kcode), self._code(s, scode)
        return self._apply((name,), (k, s), [x], lambda p, d: self.S.pool(p[0], p[1], d[0]))
    def avgpool(self, k, s, x): return self._pool("avgpool2d", k, s, x)
    def maxpool(self, k, s, x): return self._pool("maxpool2d", k, s, x)
    def enlarge(self, k, y):
        k = self._code(k, kcode)
        return self._apply(("enlarge",), (k,), [y], lambda p, d: self.S.enlarge(p[0], d[0]))
    def const(self, name, dims):
        dims = list(dims)
        return self._apply((name, len(dims)), tuple(dims), [], lambda p, d: self.S.constant(name, list(p)))
    def cpool(self, k, tmpl): return self.const("const_pool", self._resolve(tmpl))
    def iconv(self, k, tmpl): return self.const("const_iconv", self._resolve(tmpl))
    def imatmul(self, tmpl): return self.const("const_imatmul", self._resolve(tmpl))
    def iewmul(self, tmpl): return self.const("const_iewmul", self._resolve(tmpl))
    def iewmul_like(self, x): return self.const("const_iewmul", x.dims)

    @staticmethod
    def _code(v, enc):
        return enc(v) if isinstance(v, tuple) else v

    # ---- an axiom's shape conditions ----
    def template_env(self, ax: Axiom, tensors: dict, params: dict, free: dict) -> list:
        """Bind the axiom's template symbols (``self.env``) and return the conditions its templates
        state: dimensions sharing a symbol are equal, a number is that size, a ``k*`` symbol (a kernel
        size) is odd, and a parameter takes one of the values it is validated at."""
        A = self.ar
        env, conds = dict(free), []
        for v, tmpl in ax.tensors.items():
            for i, tok in enumerate(tmpl.split()):
                d = tensors[v].dims[i]
                if tok.isdigit():
                    conds.append(d == int(tok))
                elif tok in env:
                    conds.append(d == env[tok])
                else:
                    env[tok] = d
                    if tok in KERNEL_SYMBOLS:
                        conds.append(A.mod(d, 2) == 1)
        if "k" in params:
            env["K0"], env["K1"] = A.kdim(params["k"], 0), A.kdim(params["k"], 1)
        for p, vals in ax.params.items():
            codes = [kcode(v) if p == "k" else scode(v) if p == "s" else v for v in vals]
            conds.append(A.Or(*[params[p] == c for c in codes]))
        self.env = env
        return conds

    def axiom_guard(self, ax: Axiom, tensors: dict, params: dict, free: dict):
        """(lhs, rhs, guard conditions): the axiom's two sides and every condition under which it is
        stated: its templates' and both sides type-checking (``ShapeError``: never)."""
        conds = self.template_env(ax, tensors, params, free)
        self.conds = []
        lhs, rhs = ax.build(self, **tensors, **params)
        return lhs, rhs, conds + self.conds


def axiom_shape_check(ax: Axiom, dims: dict, params: dict):
    """The axiom's shape conditions at concrete template symbols ``dims`` (and concrete ``params``, as
    validation passes them): (guard holds, lhs dims, rhs dims). ``None`` dims where a rank is wrong."""
    alg = ShapeAlgebra()
    tensors = {v: Shaped(None, [int(t) if t.isdigit() else dims[t] for t in tmpl.split()]) for v, tmpl in ax.tensors.items()}
    codes = {p: kcode(v) if p == "k" else scode(v) if p == "s" else v for p, v in params.items()}
    try:
        lhs, rhs, conds = alg.axiom_guard(ax, tensors, codes, {f: dims[f] for f in ax.free})
    except SH.ShapeError:
        return False, None, None
    return all(conds), lhs.dims, rhs.dims


class Z3Algebra(ShapeAlgebra):
    """Tensors of rank r are one uninterpreted sort ``T<r>`` each, with dimension functions
    ``d<r>_<i>: T<r> -> Int``; operators are uninterpreted functions (integer attributes first).

    Every operator gets a *shape axiom* (``props``): where its operands type-check (the shape rules of
    ``verifier.shapes``), its result's dimensions are those the rules give; and every dimension is at
    least 1. Every operator axiom is guarded by its shape conditions (``formula``). The extended
    semantics that makes all of this true: an application that does not type-check gives some tensor
    of positive dimensions (say zeros of shape 1x...x1); a guarded axiom never speaks of one."""

    def __init__(self, ctx=None):
        import z3
        self.z3 = z3
        self.ctx = ctx or z3.Context()
        super().__init__(SH.Z3Arith(z3, self.ctx))
        self.sorts: dict = {}
        self.dimfs: dict = {}
        self.fns: dict = {}
        self.props: list = []  # (name, formula): shape and positivity axioms, in creation order

    def I(self, v):
        return self.z3.IntVal(v, self.ctx) if isinstance(v, int) else v

    # While an axiom's formula is built, a split's sizes and a constant's dimensions that are terms
    # (another tensor's dimension) become bound variables of their own, equal to those terms in the
    # guard: a trigger then matches the op whatever term its sizes are written with, and the guard
    # checks them arithmetically (matching through dimension terms would need them to be equal in
    # Z3's E-graph, which the arithmetic does not always make them).
    _fresh = None

    def _bind(self, v):
        if self._fresh is None or isinstance(v, int):
            return v
        x = self.z3.Int(f"_n{len(self._fresh)}", self.ctx)
        self._fresh.append((x, v))
        return x

    def split(self, i, a, t, sizes):
        return super().split(i, a, t, tuple(self._bind(n) for n in sizes))

    def const(self, name, dims):
        return super().const(name, [self._bind(d) for d in dims])

    def sort(self, r: int):
        if r not in self.sorts:
            self.sorts[r] = self.z3.DeclareSort(f"T{r}", self.ctx)
            for i in range(r):
                f = self.z3.Function(f"d{r}_{i}", self.sorts[r], self.z3.IntSort(self.ctx))
                self.dimfs[(r, i)] = f
                t = self.z3.Const(f"pos{r}_{i}", self.sorts[r])
                self.props.append((f"dim{r}_{i}>=1", self.z3.ForAll([t], f(t) >= 1, patterns=[f(t)])))
        return self.sorts[r]

    def var(self, name: str, r: int) -> Shaped:
        c = self.z3.Const(name, self.sort(r))
        return Shaped(c, [self.dimfs[(r, i)](c) for i in range(r)])

    def _term(self, key, params, operands, out_rank, rule):
        z3 = self.z3
        if key not in self.fns:
            ins = [z3.IntSort(self.ctx)] * len(params) + [self.sort(o.rank) for o in operands]
            f = z3.Function("_".join(str(k) for k in key), *ins, self.sort(out_rank))
            self.fns[key] = f
            # the shape axiom: where the operands type-check, the result has the rules' dimensions
            pv = [z3.Int(f"{key[0]}_p{j}", self.ctx) for j in range(len(params))]
            tv = [self.var(f"{key[0]}_t{j}", o.rank) for j, o in enumerate(operands)]
            app = f(*pv, *[t.t for t in tv])
            out, conds = rule(pv, [t.dims for t in tv])
            dims = [self.dimfs[(out_rank, i)](app) == out[i] for i in range(out_rank)]
            if dims:
                body = z3.Implies(self._and(conds), z3.And(*dims)) if conds else z3.And(*dims)
                self.props.append((f"shape:{f.name()}", z3.ForAll(pv + [t.t for t in tv], body, patterns=[app])
                                   if pv or tv else body))
        return self.fns[key](*[self.I(p) for p in params], *[o.t for o in operands])

    def _and(self, conds):
        c = self.ar.And(*conds)
        return self.z3.BoolVal(c, self.ctx) if isinstance(c, bool) else c

    #: parameters that are instantiated at each validated value rather than quantified: a kernel size
    #: and an axis enter dimension arithmetic (a constant's shape, a split's sizes), and a quantifier
    #: cannot be triggered through arithmetic; a stride and an activation are only arguments
    EXPANDED = ("k", "a")

    def formulas(self, ax: Axiom) -> list:
        """The axiom as closed formulas, one per value of its expanded parameters (``EXPANDED``)."""
        names = [p for p in ax.params if p in self.EXPANDED]
        out = []
        for vals in itertools.product(*[ax.params[p] for p in names]):
            out.append(self.formula(ax, dict(zip(names, vals))))
        return out

    def formula(self, ax: Axiom, fixed: dict | None = None):
        """The axiom as a closed formula: tensors, parameters (but those ``fixed``) and free symbols
        universally quantified, the equation guarded by the axiom's shape conditions (its templates,
        and both sides type-checking), and triggered by its sides."""
        z3 = self.z3
        fixed = fixed or {}
        tensors = {v: self.var(f"{ax.name}_{v}", len(t.split())) for v, t in ax.tensors.items()}
        params = {p: (kcode(fixed[p]) if p == "k" else fixed[p]) if p in fixed else z3.Int(f"{ax.name}_{p}", self.ctx)
                  for p in ax.params}
        free = {f: z3.Int(f"{ax.name}_{f}", self.ctx) for f in ax.free}
        self._fresh = []
        try:
            lhs, rhs, conds = self.axiom_guard(ax, tensors, params, free)
            fresh, self._fresh = self._fresh, None
        finally:
            self._fresh = None
        params = {p: v for p, v in params.items() if p not in fixed}
        conds += [d >= 1 for d in free.values()] + [x == e for x, e in fresh]
        bound = [t.t for t in tensors.values()] + list(params.values()) + list(free.values()) + [x for x, _ in fresh]
        eq = lhs.t == rhs.t
        body = z3.Implies(self._and(conds), eq)
        if not bound:
            return body
        pats = [t.t for t in (lhs, rhs) if not z3.is_const(t.t) and _pattern_ok(z3, t.t) and _covers(t.t, bound)]
        if not pats:  # (a side with an interpreted subterm, e.g. a split size: its largest clean subterm)
            pats = [t for t in _clean_subterms(z3, lhs.t) + _clean_subterms(z3, rhs.t) if _covers(t, bound)][:1]
        return z3.ForAll(bound, body, patterns=pats) if pats else z3.ForAll(bound, body)


def _covers(term, bound) -> bool:
    """Every bound variable occurs in ``term``."""
    seen, stack = set(), [term]
    while stack:
        t = stack.pop()
        if t.num_args() == 0:
            seen.add(t.get_id())
        stack.extend(t.children())
    return all(b.get_id() in seen for b in bound)


def _pattern_ok(z3, t) -> bool:
    """``t`` can trigger a quantifier: uninterpreted applications, variables and numerals only."""
    if z3.is_int_value(t):
        return True
    if t.decl().kind() != z3.Z3_OP_UNINTERPRETED:
        return False
    return all(_pattern_ok(z3, c) for c in t.children())


def _clean_subterms(z3, t) -> list:
    """The subterms of ``t`` that can trigger a quantifier, largest first."""
    out, stack = [], [t]
    while stack:
        u = stack.pop(0)
        if z3.is_app(u) and u.num_args() and _pattern_ok(z3, u):
            out.append(u)
        else:
            stack.extend(u.children())
    return out
