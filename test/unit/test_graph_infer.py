"""``generator.graph.infer``'s memo of op result shapes (``_INFERRED``): it answers as shape inference
without it, on every rule's source and target at random shapes, ill-typed ones included; it tells
attribute values of two types apart; it keeps the dimensions' types; it does not remember failures."""

from __future__ import annotations

import numpy as np
import pytest

from taso_mlir.dialect import specs
from taso_mlir.generator import graph as G
from taso_mlir.passes.search import rulebook as RB


def _infer(g: G.Graph, shapes: dict):
    try:
        return G.infer(g, shapes)
    except specs.SpecError as e:
        return ("error", type(e), str(e))


def _cold(g: G.Graph, shapes: dict):
    G._INFERRED.clear()
    return _infer(g, shapes)


def _random_shapes(rng, rw: RB.Rewrite, stride) -> dict:
    """Shapes of the rule's ranks; dims from a few values so that sites repeat (memo hits), and often
    mismatched (errors)."""
    shapes = {v: tuple(int(rng.choice([1, 2, 4])) for _ in range(r)) for v, r in rw.gen_ranks.items()}
    if rw.stride_op is not None:
        shapes[G.STRIDE_VAR] = stride
    return shapes


def test_memoized_inference_answers_as_without_the_memo():
    rng = np.random.default_rng(7)
    rws = RB.load()
    picked = [rws[i] for i in rng.choice(len(rws), size=400, replace=False)]
    typed = errors = hits = 0
    for _round in range(3):  # (the memo warm from the rounds before: later rounds hit it)
        for rw in picked:
            shapes = _random_shapes(rng, rw, ((1, 1), (2, 2))[int(rng.integers(2))])
            for g in (rw.src, rw.dst):
                before = len(G._INFERRED)
                warm = _infer(g, shapes)
                hits += len(G._INFERRED) == before
                cold = _cold(g, shapes)
                assert warm == cold, (rw.id, g.text(), shapes)
                if isinstance(warm, tuple):
                    errors += 1
                else:
                    typed += 1
                    assert all(type(d) is int for s in warm.values() for d in s)
    assert typed > 200 and errors > 200 and hits > 100  # (both outcomes exercised, and memo hits)


def test_memo_tells_true_from_one():
    """An int attribute given as a bool is refused by the spec; the memo of the same op with 1 at the
    same shapes must not answer for it."""
    shapes = {"x": (1, 4, 5, 5), "w": (8, 4, 3, 3)}
    ok = G.Op("conv2d", (("activation", "none"), ("group", 1), ("pads", "same"), ("strides", (1, 1))), ("x", "w"))
    bad = G.Op("conv2d", (("activation", "none"), ("group", True), ("pads", "same"), ("strides", (1, 1))), ("x", "w"))
    assert ok.attrs == bad.attrs and hash(ok.attrs) == hash(bad.attrs)  # (what a plain key would confuse)
    G._INFERRED.clear()
    assert G.infer(G.Graph((ok,), ("%0",)), shapes)["%0"] == (1, 8, 5, 5)
    with pytest.raises(specs.SpecError):
        G.infer(G.Graph((bad,), ("%0",)), shapes)


def test_memo_keeps_dimension_types_and_forgets_failures():
    op = G.Op("matmul", (("activation", "none"),), ("a", "b"))
    g = G.Graph((op,), ("%0",))
    G._INFERRED.clear()
    out = G.infer(g, {"a": (np.int64(2), np.int64(3)), "b": (np.int64(3), np.int64(5))})
    assert out["%0"] == (2, 5) and not G._INFERRED  # (numpy dims: not memoized)
    with pytest.raises(specs.SpecError):
        G.infer(g, {"a": (2, 3), "b": (4, 5)})
    assert not G._INFERRED  # (a failure is not remembered)
    assert G.infer(g, {"a": (2, 3), "b": (3, 5)})["%0"] == (2, 5) and len(G._INFERRED) == 1
    assert G.infer(g, {"a": (2, 3), "b": (3, 5)})["%0"] == (2, 5) and len(G._INFERRED) == 1


def test_memo_keys_the_symbolic_stride():
    op = G.Op("conv2d", (("activation", "none"), ("group", 1), ("pads", "same"), ("strides", "s")), ("x", "w"))
    g = G.Graph((op,), ("%0",))
    G._INFERRED.clear()
    x = {"x": (1, 4, 8, 8), "w": (8, 4, 3, 3)}
    assert G.infer(g, {**x, G.STRIDE_VAR: (1, 1)})["%0"] == (1, 8, 8, 8)
    assert G.infer(g, {**x, G.STRIDE_VAR: (2, 2)})["%0"] == (1, 8, 4, 4)
    assert G.infer(g, {**x, G.STRIDE_VAR: (1, 1)})["%0"] == (1, 8, 8, 8)
