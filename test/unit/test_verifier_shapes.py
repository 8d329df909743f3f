"""The verifier's shape rules (``verifier/shapes.py``) against the operator specs, op by op.

The prover states a rule's hypothesis "both sides type-check" with these rules, so they must accept
exactly the shapes the specs accept (as the search checks them: ``generator.graph.infer``, with
SAME padding and the ``grouped`` convention), and give the specs' result shapes. A rule stricter
than the specs would let a proof assume more than the search checks; a looser one would let a shape
axiom state a wrong size. Random shapes, most of them ill-typed on purpose, over small dims."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from taso_mlir.dialect import specs
from taso_mlir.generator import graph as G
from taso_mlir.verifier import shapes as SH
from taso_mlir.verifier.axioms import ShapeAlgebra, Shaped, kcode, scode

CONV = lambda act, group, strides: (("activation", act), ("group", group), ("pads", "same"), ("strides", strides))  # noqa: E731


def _cases(rng):
    """(op, input shapes, the algebra call) for random shapes: ranks right, dims often mismatched."""
    d = lambda: int(rng.integers(1, 7))  # noqa: E731
    k = lambda: int(rng.choice([1, 2, 3, 5]))  # noqa: E731
    r = int(rng.choice([1, 2, 4]))
    shp = lambda rank: tuple(d() for _ in range(rank))  # noqa: E731
    x = shp(r)
    y = x if rng.random() < 0.5 else shp(r)
    yield G.Op("ewadd", (), ("x", "y")), {"x": x, "y": y}, lambda A, v: A.add(v["x"], v["y"])
    yield G.Op("smul", (), ("x", "s")), {"x": x, "s": ()}, lambda A, v: A.smul(v["x"], v["s"])
    yield G.Op("relu", (), ("x",)), {"x": x}, lambda A, v: A.relu(v["x"])
    m, n = (d(), d()), (d(), d())
    if rng.random() < 0.5:
        n = (m[1], n[1])
    yield G.Op("transpose", (("perm", (1, 0)),), ("x",)), {"x": m}, lambda A, v: A.t(v["x"])
    for act in (0, 1):
        yield (G.Op("matmul", (("activation", "relu" if act else "none"),), ("x", "y")), {"x": m, "y": n},
               lambda A, v, act=act: A.mm(act, v["x"], v["y"]))
    b = (n[1],) if rng.random() < 0.5 else (d(),)
    yield G.Op("matmul", (("activation", "none"),), ("x", "y", "b")), {"x": m, "y": n, "b": b}, \
        lambda A, v: A.mm_b(0, v["x"], v["y"], v["b"])
    ax = int(rng.integers(0, r))
    z = tuple(x[i] if i != ax and rng.random() < 0.8 else d() for i in range(r))
    yield G.Op("concat", (("axis", ax),), ("x", "z")), {"x": x, "z": z}, lambda A, v: A.cat(ax, v["x"], v["z"])
    n0 = int(rng.integers(0, x[ax] + 2))
    n1 = x[ax] - n0 if rng.random() < 0.7 else d()
    for i in (0, 1):
        yield (G.Op("split", (("axis", ax), ("sizes", (n0, n1))), ("x",), 2), {"x": x},
               lambda A, v, i=i: A.split(i, ax, v["x"], (n0, n1)))
    xi = shp(4)
    cin = int(rng.choice([1, 2, 3, 4, 6, 8]))
    xi = (xi[0], cin, xi[2], xi[3])
    wc = int(rng.choice([w for w in (1, 2, 3, 4) if rng.random() < 0.6 or cin % w == 0] or [1]))
    w = (int(rng.choice([1, 2, 3, 4, 6, 8])), wc, k(), k())
    s = tuple(rng.choice([(1, 1), (2, 2), (1, 2)]))
    for group, g in ((1, 1), ("grouped", 0)):
        yield (G.Op("conv2d", CONV("none", group, s), ("x", "w")), {"x": xi, "w": w},
               lambda A, v, g=g: A.conv(s, g, 0, v["x"], v["w"]))
        bb = (w[0],) if rng.random() < 0.6 else (d(),)
        yield (G.Op("conv2d", CONV("relu", group, s), ("x", "w", "b")), {"x": xi, "w": w, "b": bb},
               lambda A, v, g=g: A.conv_b(s, g, 1, v["x"], v["w"], v["b"]))
    kk = (k(), k())
    pool = (("count_include_pad", 1), ("kernel_shape", kk), ("pads", "same"), ("strides", s))
    yield G.Op("avgpool2d", pool, ("x",)), {"x": xi}, lambda A, v: A.avgpool(kk, s, v["x"])
    yield G.Op("maxpool2d", pool[1:], ("x",)), {"x": xi}, lambda A, v: A.maxpool(kk, s, v["x"])
    big = (int(rng.choice([1, 3, 4, 5])), int(rng.choice([1, 3, 5])))
    yield G.Op("enlarge", (("kernel_shape", big),), ("w",)), {"w": w}, lambda A, v: A.enlarge(big, v["w"])
    c4 = (d(), int(rng.choice([1, 1, 2])), k(), k())
    for name in ("const_pool", "const_iconv", "const_iewmul"):
        yield G.Op(name, (("shape", c4),), ()), {}, lambda A, v, name=name: A.const(name, c4)
    sq = (d(), d()) if rng.random() < 0.5 else (m[0], m[0])
    yield G.Op("const_imatmul", (("shape", sq),), ()), {}, lambda A, v: A.const("const_imatmul", sq)


def _spec(op, shapes):
    """The result shapes by the specs (as the search infers them), or None where it does not type-check."""
    g = G.Graph((op,), tuple(G.op_ref(0, j, op.num_results) for j in range(op.num_results)))
    try:
        got = G.infer(g, shapes)
    except specs.SpecError:
        return None
    outs = [got[r] for r in g.outputs]
    return None if any(min(s, default=1) < 1 for s in outs) else outs  # (the domain: dims >= 1)


def test_shape_rules_accept_exactly_what_the_specs_accept():
    rng = np.random.default_rng(0)
    checked: dict = {}
    agree_ok = agree_bad = 0
    for _ in range(600):
        for op, shapes, call in _cases(rng):
            want = _spec(op, shapes)
            A = ShapeAlgebra()
            vals = {k: Shaped(None, list(s)) for k, s in shapes.items()}
            try:
                out = call(A, vals)
                ok = all(A.conds)
            except SH.ShapeError:
                ok = False
            key = op.name
            checked[key] = checked.get(key, 0) + 1
            assert ok == (want is not None), (op, shapes, A.conds, want)
            if ok:
                agree_ok += 1
                if op.name != "split":
                    assert [out.dims] == [list(s) for s in want], (op, shapes, out.dims, want)
                else:  # (one piece per call)
                    assert out.dims in [list(s) for s in want], (op, shapes, out.dims, want)
            else:
                agree_bad += 1
    # both outcomes were exercised, for every op
    assert agree_ok > 1000 and agree_bad > 1000, (agree_ok, agree_bad)
    assert set(checked) >= {"ewadd", "smul", "relu", "transpose", "matmul", "concat", "split", "conv2d",
                            "avgpool2d", "maxpool2d", "enlarge", "const_pool", "const_iconv", "const_imatmul"}


def test_window_size_is_ceil():
    for h, s in itertools.product(range(1, 12), (1, 2, 3)):
        assert SH.PyArith().wout(h, scode((s, s)), 0) == SH.window_size(h, s)
