"""Operator axioms, written once against an abstract algebra and read two ways.

``Z3Algebra`` turns an axiom into a universally quantified equation over one uninterpreted sort of
tensors (operators are uninterpreted functions, attributes are integer arguments), which is how the
verifier proves rules, as TASO does. ``NumpyAlgebra`` evaluates the same two sides with the operator
specs' reference semantics (``dialect.specs``) on concrete shapes, which is how every axiom is
validated: a wrong axiom cannot prove a wrong rule without failing validation first.

Each axiom lists its tensor variables with a shape template (symbols: dims 1..4; symbols starting
with ``k``: odd kernel sizes 1 or 3). Templates are as general as the Z3 reading, which knows no
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

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..dialect import specs

ACT = {"none": 0, "relu": 1}


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
    params: dict = field(default_factory=dict)  # param -> values to validate (quantified in Z3)


AXIOMS: list[Axiom] = []


def axiom(name, doc, tensors, params=None):
    def deco(f):
        AXIOMS.append(Axiom(name, doc, tensors, f, params or {}))
        return f
    return deco


# ---- elementwise ----
@axiom("A1", "x+(y+z) = (x+y)+z", {"x": "m n", "y": "m n", "z": "m n"})
def _a1(A, x, y, z): return A.add(x, A.add(y, z)), A.add(A.add(x, y), z)
@axiom("A2", "x+y = y+x", {"x": "m n", "y": "m n"})
def _a2(A, x, y): return A.add(x, y), A.add(y, x)
@axiom("A3", "x*(y*z) = (x*y)*z", {"x": "m n", "y": "m n", "z": "m n"})
def _a3(A, x, y, z): return A.mul(x, A.mul(y, z)), A.mul(A.mul(x, y), z)
@axiom("A4", "x*y = y*x", {"x": "m n", "y": "m n"})
def _a4(A, x, y): return A.mul(x, y), A.mul(y, x)
@axiom("A5", "(x+y)*z = x*z + y*z", {"x": "m n", "y": "m n", "z": "m n"})
def _a5(A, x, y, z): return A.mul(A.add(x, y), z), A.add(A.mul(x, z), A.mul(y, z))
# ---- scalar multiplication ----
@axiom("A6", "(x.y).w = x.(y.w)", {"x": "m n", "y": "", "w": ""})
def _a6(A, x, y, w): return A.smul(A.smul(x, y), w), A.smul(x, A.smul(y, w))
@axiom("A7", "(x+y).w = x.w + y.w", {"x": "m n", "y": "m n", "w": ""})
def _a7(A, x, y, w): return A.smul(A.add(x, y), w), A.add(A.smul(x, w), A.smul(y, w))
@axiom("A8", "(x*y).w = x*(y.w)", {"x": "m n", "y": "m n", "w": ""})
def _a8(A, x, y, w): return A.smul(A.mul(x, y), w), A.mul(x, A.smul(y, w))
@axiom("A9", "T(x).w = T(x.w)", {"x": "m n", "w": ""})
def _a9(A, x, w): return A.smul(A.t(x), w), A.t(A.smul(x, w))
@axiom("A10", "mm(x,y).w = mm(x, y.w)", {"x": "m k2", "y": "k2 n", "w": ""})
def _a10(A, x, y, w): return A.smul(A.mm(0, x, y), w), A.mm(0, x, A.smul(y, w))
@axiom("X10", "mm(x.w, y) = mm(x,y).w", {"x": "m k2", "y": "k2 n", "w": ""})
def _x10(A, x, y, w): return A.mm(0, A.smul(x, w), y), A.smul(A.mm(0, x, y), w)
@axiom("A11", "cat_a(x,y).w = cat_a(x.w, y.w)", {"x": "m n", "y": "m n", "w": ""}, {"a": (0, 1)})
def _a11(A, x, y, w, a): return A.smul(A.cat(a, x, y), w), A.cat(a, A.smul(x, w), A.smul(y, w))
# ---- convolution ----
_CONV = {"x": "n c h w", "y": "o c k k"}
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
@axiom("A15", "relu(cat_a(x,y)) = cat_a(relu x, relu y)", {"x": "n c h w", "y": "n c h w"}, {"a": (0, 1, 2, 3)})
def _a15(A, x, y, a): return A.relu(A.cat(a, x, y)), A.cat(a, A.relu(x), A.relu(y))
@axiom("A16", "relu(T x) = T(relu x)", {"x": "m n"})
def _a16(A, x): return A.relu(A.t(x)), A.t(A.relu(x))
@axiom("A17", "conv(s,p,N,x, y+z) = conv(s,p,N,x,y) + conv(s,p,N,x,z)", {**_CONV, "z": "o c k k"}, _S)
def _a17(A, x, y, z, s): return A.conv(s, 1, 0, x, A.add(y, z)), A.add(A.conv(s, 1, 0, x, y), A.conv(s, 1, 0, x, z))
@axiom("A17g", "conv(s,p,N,x, y+z) = conv(x,y) + conv(x,z), grouped", {"x": "n c h w", "y": "o d k kk", "z": "o d k kk"}, _S)
def _a17g(A, x, y, z, s): return A.conv(s, 0, 0, x, A.add(y, z)), A.add(A.conv(s, 0, 0, x, y), A.conv(s, 0, 0, x, z))
@axiom("A18", "conv(s,p,N, x+y, z) = conv(s,p,N,x,z) + conv(s,p,N,y,z)", {"x": "n c h w", "y": "n c h w", "z": "o c k k"}, _S)
def _a18(A, x, y, z, s): return A.conv(s, 1, 0, A.add(x, y), z), A.add(A.conv(s, 1, 0, x, z), A.conv(s, 1, 0, y, z))
@axiom("A19", "conv(x,y) + conv(z,w) = conv(cat_1(x,z), cat_1(y,w)) (group 1)",
       {"x": "n c h w", "y": "o c k k", "z": "n d h w", "w": "o d k k"}, _S)
def _a19(A, x, y, z, w, s):
    return A.add(A.conv(s, 1, 0, x, y), A.conv(s, 1, 0, z, w)), A.conv(s, 1, 0, A.cat(1, x, z), A.cat(1, y, w))
# ---- convolution with a bias operand (b: one value per output channel) ----
_CONVB = {"x": "n c h w", "y": "o c k k", "b": "o"}
@axiom("B14", "relu(conv(s,p,N,x,y,b)) = conv(s,p,R,x,y,b)", _CONVB, _S)
def _b14(A, x, y, b, s): return A.relu(A.conv_b(s, 1, 0, x, y, b)), A.conv_b(s, 1, 1, x, y, b)
@axiom("B14g", "relu(conv(s,p,N,x,y,b)) = conv(s,p,R,x,y,b), grouped", {"x": "n c h w", "y": "o d k kk", "b": "o"}, _S)
def _b14g(A, x, y, b, s): return A.relu(A.conv_b(s, 0, 0, x, y, b)), A.conv_b(s, 0, 1, x, y, b)
@axiom("B23", "cat_0(conv(x,z,b), conv(y,z,b)) = conv(cat_0(x,y), z, b)", {"x": "n c h w", "y": "m c h w", "z": "o c k k", "b": "o"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _b23(A, x, y, z, b, s, c): return A.cat(0, A.conv_b(s, 1, c, x, z, b), A.conv_b(s, 1, c, y, z, b)), A.conv_b(s, 1, c, A.cat(0, x, y), z, b)
@axiom("B24", "cat_1(conv(x,y,b), conv(x,z,d)) = conv(x, cat_0(y,z), cat_0(b,d)) (group 1)",
       {"x": "n c h w", "y": "o c k k", "z": "p c k k", "b": "o", "d": "p"}, {"s": ((1, 1), (2, 2)), "c": (0, 1)})
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
@axiom("A21", "cat_a(x+y, z+w) = cat_a(x,z) + cat_a(y,w)", {"x": "m n", "y": "m n", "z": "m n", "w": "m n"}, {"a": (0, 1)})
def _a21(A, x, y, z, w, a): return A.cat(a, A.add(x, y), A.add(z, w)), A.add(A.cat(a, x, z), A.cat(a, y, w))
@axiom("A22", "cat_a(x*y, z*w) = cat_a(x,z) * cat_a(y,w)", {"x": "m n", "y": "m n", "z": "m n", "w": "m n"}, {"a": (0, 1)})
def _a22(A, x, y, z, w, a): return A.cat(a, A.mul(x, y), A.mul(z, w)), A.mul(A.cat(a, x, z), A.cat(a, y, w))
@axiom("A23", "cat_0(conv(x,z), conv(y,z)) = conv(cat_0(x,y), z)", {"x": "n c h w", "y": "b c h w", "z": "o c k k"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a23(A, x, y, z, s, c): return A.cat(0, A.conv(s, 1, c, x, z), A.conv(s, 1, c, y, z)), A.conv(s, 1, c, A.cat(0, x, y), z)
@axiom("A23g", "cat_0(conv(x,z), conv(y,z)) = conv(cat_0(x,y), z), grouped", {"x": "n c h w", "y": "b c h w", "z": "o d k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a23g(A, x, y, z, s, c): return A.cat(0, A.conv(s, 0, c, x, z), A.conv(s, 0, c, y, z)), A.conv(s, 0, c, A.cat(0, x, y), z)
@axiom("A24", "cat_1(conv(x,y), conv(x,z)) = conv(x, cat_0(y,z)) (group 1)", {"x": "n c h w", "y": "o c k k", "z": "p c k k"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1)})
def _a24(A, x, y, z, s, c): return A.cat(1, A.conv(s, 1, c, x, y), A.conv(s, 1, c, x, z)), A.conv(s, 1, c, x, A.cat(0, y, z))
@axiom("A25", "mm(x, mm(y,z)) = mm(mm(x,y), z)", {"x": "m a", "y": "a b", "z": "b n"})
def _a25(A, x, y, z): return A.mm(0, x, A.mm(0, y, z)), A.mm(0, A.mm(0, x, y), z)
@axiom("A26", "split_0(a, cat_a(x,y)) = x", {"x": "m n", "y": "m n"}, {"a": (0, 1)})
def _a26(A, x, y, a): return A.split(0, a, A.cat(a, x, y), x, y), x
@axiom("A27", "split_1(a, cat_a(x,y)) = y", {"x": "m n", "y": "m n"}, {"a": (0, 1)})
def _a27(A, x, y, a): return A.split(1, a, A.cat(a, x, y), x, y), y
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
@axiom("L41t", "T(I_matmul) = I_matmul", {})
def _l41t(A): return A.t(A.imatmul((3, 3))), A.imatmul((3, 3))
@axiom("A42", "x * I_ewmul = x", {"x": "m n"})
def _a42(A, x): return A.mul(x, A.iewmul(("m", "n"))), x
@axiom("A43", "avgpool(k,1,SAME, I_conv(k)) = C_pool(k)", {}, {"k": ((3, 3),)})
def _a43(A, k): return A.avgpool(k, (1, 1), A.iconv(k, (4, 1, "K0", "K1"))), A.cpool(k, (4, 1, "K0", "K1"))
@axiom("A44", "conv(s,SAME,c, x, y) = conv(s,SAME,c, x, enlarge(k, y))", {"x": "n c h w", "y": "o c k kk"},
       {"s": ((1, 1), (2, 2)), "c": (0, 1), "k": ((3, 3), (1, 3))})
def _a44(A, x, y, s, c, k): return A.conv(s, 1, c, x, y), A.conv(s, 1, c, x, A.enlarge(k, y))
@axiom("X44", "enlarge(y+z) = enlarge y + enlarge z", {"y": "o c k kk", "z": "o c k kk"})
def _x44(A, y, z): return A.enlarge((3, 3), A.add(y, z)), A.add(A.enlarge((3, 3), y), A.enlarge((3, 3), z))
@axiom("X45", "enlarge(y.w) = enlarge(y).w", {"y": "o c k kk", "w": ""})
def _x45(A, y, w): return A.enlarge((3, 3), A.smul(y, w)), A.smul(A.enlarge((3, 3), y), w)
@axiom("X46", "enlarge(cat_a(y,z)) = cat_a(enlarge y, enlarge z)", {"y": "o c k kk", "z": "o c k kk"}, {"a": (0, 1)})
def _x46(A, y, z, a): return A.enlarge((3, 3), A.cat(a, y, z)), A.cat(a, A.enlarge((3, 3), y), A.enlarge((3, 3), z))


# --------------------------------------------------------------------------------------------
# the two readings


class NumpyAlgebra:
    """Evaluates an axiom's sides with the reference semantics on concrete arrays.

    ``group`` argument of conv: 1 = a plain convolution, 0 = inferred (depthwise / grouped)."""

    def __init__(self, dims: dict):
        self.dims = dims

    def _shape(self, tmpl):
        return tuple(self.dims[d] if isinstance(d, str) else d for d in tmpl)  # "K0"/"K1": the kernel param

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
    def split(self, i, a, t, x, y):
        return specs.evaluate("split", [t], {"axis": a, "sizes": (x.shape[a], y.shape[a])})[i]
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
    def avgpool(self, k, s, x): return specs.evaluate("avgpool2d", [x], {**self._pool_attrs(k, s), "count_include_pad": 1})[0]
    def maxpool(self, k, s, x): return specs.evaluate("maxpool2d", [x], self._pool_attrs(k, s))[0]
    def enlarge(self, k, y): return specs.evaluate("enlarge", [y], {"kernel_shape": k})[0]
    def cpool(self, k, tmpl): return specs.constant("const_pool", self._shape(tmpl), np.float64)
    def iconv(self, k, tmpl): return specs.constant("const_iconv", self._shape(tmpl), np.float64)
    def imatmul(self, tmpl): return specs.constant("const_imatmul", self._shape(tmpl), np.float64)
    def iewmul(self, tmpl): return specs.constant("const_iewmul", self._shape(tmpl), np.float64)


def _bad(why):
    raise specs.SpecError(why)


class Z3Algebra:
    """Uninterpreted functions over one tensor sort; attributes are integer arguments."""

    def __init__(self, ctx=None):
        import z3
        self.z3 = z3
        self.ctx = ctx or z3.Context()
        self.T = z3.DeclareSort("Tensor", self.ctx)
        I = z3.IntSort(self.ctx)
        T = self.T
        F = z3.Function  # the context comes from the sorts
        self.f = {
            "ewadd": F("ewadd", T, T, T), "ewmul": F("ewmul", T, T, T), "smul": F("smul", T, T, T),
            "relu": F("relu", T, T), "transpose": F("transpose", T, T),
            "matmul": F("matmul", I, T, T, T), "conv2d": F("conv2d", I, I, I, T, T, T),
            "conv2d_b": F("conv2d_b", I, I, I, T, T, T, T), "matmul_b": F("matmul_b", I, T, T, T, T),
            "concat": F("concat", I, T, T, T), "split0": F("split0", I, T, T), "split1": F("split1", I, T, T),
            "maxpool2d": F("maxpool2d", I, I, T, T), "avgpool2d": F("avgpool2d", I, I, T, T),
            "enlarge": F("enlarge", I, T, T), "const_pool": F("const_pool", I, T), "const_iconv": F("const_iconv", I, T),
            "const_imatmul": z3.Const("const_imatmul", T), "const_iewmul": z3.Const("const_iewmul", T),
        }

    def I(self, v):
        return v if not isinstance(v, int) else self.z3.IntVal(v, self.ctx)

    @staticmethod
    def _code(v, enc):
        return v if not isinstance(v, tuple) else enc(v)

    def add(self, x, y): return self.f["ewadd"](x, y)
    def mul(self, x, y): return self.f["ewmul"](x, y)
    def smul(self, x, w): return self.f["smul"](x, w)
    def relu(self, x): return self.f["relu"](x)
    def t(self, x): return self.f["transpose"](x)
    def mm(self, c, x, y): return self.f["matmul"](self.I(c), x, y)
    # a matmul with a bias operand: a function of its own (no axiom relates it to matmul)
    def mm_b(self, c, x, y, b): return self.f["matmul_b"](self.I(c), x, y, b)
    def cat(self, a, x, y): return self.f["concat"](self.I(a), x, y)
    def split(self, i, a, t, x=None, y=None): return self.f[f"split{i}"](self.I(a), t)
    def conv(self, s, g, c, x, w):
        # g: 1 = group 1, 0 = any other group; the rule translation passes the same encoding
        return self.f["conv2d"](self.I(self._code(s, scode)), self.I(g), self.I(c), x, w)
    def conv_b(self, s, g, c, x, w, b):
        # a convolution with a bias operand: a function of its own (no axiom relates it to conv2d)
        return self.f["conv2d_b"](self.I(self._code(s, scode)), self.I(g), self.I(c), x, w, b)
    def avgpool(self, k, s, x): return self.f["avgpool2d"](self.I(self._code(k, kcode)), self.I(self._code(s, scode)), x)
    def maxpool(self, k, s, x): return self.f["maxpool2d"](self.I(self._code(k, kcode)), self.I(self._code(s, scode)), x)
    def enlarge(self, k, y): return self.f["enlarge"](self.I(self._code(k, kcode)), y)
    def cpool(self, k, tmpl=None): return self.f["const_pool"](self.I(self._code(k, kcode)))
    def iconv(self, k, tmpl=None): return self.f["const_iconv"](self.I(self._code(k, kcode)))
    def imatmul(self, tmpl=None): return self.f["const_imatmul"]
    def iewmul(self, tmpl=None): return self.f["const_iewmul"]

    def formula(self, ax: Axiom):
        """The axiom as a closed formula: tensors and parameters universally quantified."""
        z3 = self.z3
        tv = {v: z3.Const(f"{ax.name}_{v}", self.T) for v in ax.tensors}
        pv = {p: z3.Int(f"{ax.name}_{p}", self.ctx) for p in ax.params}
        lhs, rhs = ax.build(self, **tv, **pv)
        bound = list(tv.values()) + list(pv.values())
        eq = lhs == rhs
        return z3.ForAll(bound, eq) if bound else eq
