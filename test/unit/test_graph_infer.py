"""``generator.graph.infer``'s memo of op result shapes (``_INFERRED``): it answers as shape inference
without it, on every rule's source and target at random shapes, ill-typed ones included; it tells
attribute values of two types apart; it keeps the dimensions' types; it does not remember failures.
And ``rule_attrs``'s memo of a rule op's complete attributes answers as completing them each time."""

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


def _reference_attrs(op: G.Op, shapes: dict):
    """``rule_attrs`` without its memo: ``spec_attrs`` completed by the spec, list values as tuples."""
    try:
        a, _hint = G.spec_attrs(op, shapes)
        full = specs.spec(op.name).complete_attrs(a)
        return {n: tuple(x) if isinstance(x, (list, tuple)) else x for n, x in full.items()}
    except specs.SpecError as e:
        return ("error", str(e))


def _rule_attrs(op: G.Op, shapes: dict):
    try:
        return G.rule_attrs(op, shapes)
    except specs.SpecError as e:
        return ("error", str(e))


def test_rule_attrs_answer_as_without_the_memo():
    """Every op of 400 rules (both sides) where the side type-checks at random shapes of its ranks and
    either stride, three times over (later rounds hit the memo): ``rule_attrs`` gives what completing
    ``spec_attrs`` gives."""
    rng = np.random.default_rng(11)
    rws = RB.load()
    picked = [rws[i] for i in rng.choice(len(rws), size=400, replace=False)]
    G._RULE_ATTRS.clear()
    n = hits = 0
    for _round in range(3):
        for rw in picked:
            shapes = _random_shapes(rng, rw, ((1, 1), (2, 2))[int(rng.integers(2))])
            for g in (rw.src, rw.dst):
                try:
                    all_shapes = G.infer(g, shapes)
                except specs.SpecError:
                    continue
                for op in g.ops:
                    before = len(G._RULE_ATTRS)
                    got = _rule_attrs(op, all_shapes)
                    hits += len(G._RULE_ATTRS) == before
                    assert got == _reference_attrs(op, all_shapes), (rw.id, op, all_shapes)
                    n += 1
    assert n > 800 and hits > 200, (n, hits)  # (memo hits and misses both exercised)


def test_rule_attrs_resolve_per_site_and_tell_true_from_one():
    """One op at two kernels and two strides: two answers each (the memo keys the values resolved from
    the shapes); an even 'same' kernel is refused; an op whose group is True is refused every time, the
    same op with 1 is not."""
    op = G.Op("conv2d", (("activation", "none"), ("group", 1), ("pads", "same"), ("strides", "s")), ("x", "w"))
    x = {"x": (1, 4, 8, 8), G.STRIDE_VAR: (1, 1)}
    assert G.rule_attrs(op, {**x, "w": (8, 4, 3, 3)})["pads"] == (1, 1, 1, 1)
    assert G.rule_attrs(op, {**x, "w": (8, 4, 5, 5)})["pads"] == (2, 2, 2, 2)
    assert G.rule_attrs(op, {**x, "w": (8, 4, 3, 3), G.STRIDE_VAR: (2, 2)})["strides"] == (2, 2)
    assert G.rule_attrs(op, {**x, "w": (8, 4, 3, 3)})["strides"] == (1, 1)
    with pytest.raises(specs.SpecError, match="odd kernel"):
        G.rule_attrs(op, {**x, "w": (8, 4, 2, 2)})
    bad = G.Op("conv2d", (("activation", "none"), ("group", True), ("pads", "same"), ("strides", (1, 1))), ("x", "w"))
    ok = G.Op("conv2d", (("activation", "none"), ("group", 1), ("pads", "same"), ("strides", (1, 1))), ("x", "w"))
    shapes = {"x": (1, 4, 5, 5), "w": (8, 4, 3, 3)}
    assert G.rule_attrs(ok, shapes)["group"] == 1
    for _ in range(2):
        with pytest.raises(specs.SpecError):
            G.rule_attrs(bad, shapes)
