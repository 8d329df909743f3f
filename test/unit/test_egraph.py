"""The e-graph derivability check (``generator.egraph``): rules are matched as the library states them
(symbolic sizes, grouped convolutions, symbolic strides, multi-output merges, commutativity), targets
are added only where they type-check, derivations of several steps are found, and what does not
follow is not claimed; concat associativity, which it uses beside the proved rules, is checked
against the reference semantics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from taso_mlir.dialect import specs
from taso_mlir.generator import egraph as E
from taso_mlir.generator import graph as G
from taso_mlir.generator import library

BASE = library.default_path("base")


def _g(text_ops, outputs):
    return G.Graph(tuple(G.Op(*o) for o in text_ops), tuple(outputs))


T = (("perm", (1, 0)),)


def test_concat_associativity_holds_in_the_reference_semantics():
    rng = np.random.default_rng(0)
    rws = E.concat_associativity()
    assert len(rws) == 4
    for rw in rws:
        axis = rw.src.ops[0].attr("axis")
        for rank, sizes in itertools.product((2, 4), ((1, 2, 3), (3, 1, 1), (2, 2, 4))):
            shapes = {}
            for v, n in zip("xyz", sizes):
                s = [2, 3, 5, 5][:rank]
                s[axis] = n
                shapes[v] = tuple(s)
            vals = {v: rng.standard_normal(s) for v, s in shapes.items()}
            (a,), (b,) = G.evaluate(rw.src, vals), G.evaluate(rw.dst, vals)
            assert a.shape == b.shape and np.array_equal(a, b)


def test_several_steps_are_derived_and_non_consequences_are_not():
    twice = E.Rewrite("tt", _g([("transpose", T, ("x",)), ("transpose", T, ("%0",))], ["%1"]), _g([], ["x"]))
    d = E.Deriver([twice], rounds=3)
    four = _g([("transpose", T, ("x1",)), ("transpose", T, ("%0",)), ("transpose", T, ("%1",)),
               ("transpose", T, ("%2",))], ["%3"])
    assert d.derivable(four, _g([], ["x1"]), {"x1": (2, 4)})
    relu = _g([("relu", (), ("x1",))], ["%0"])
    assert not d.derivable(four, relu, {"x1": (2, 4)})
    assert not E.Deriver([], rounds=3).derivable(four, _g([], ["x1"]), {"x1": (2, 4)})
    assert d.failed == 0


def test_a_target_that_does_not_type_check_is_not_added():
    # matmul(x, y) -> matmul(y, x) (false, but this is about typing): the target type-checks only
    # where both operands are square
    mm = (("activation", "none"),)
    rw = E.Rewrite("swap", _g([("matmul", mm, ("x", "y"))], ["%0"]), _g([("matmul", mm, ("y", "x"))], ["%0"]))
    for shapes, applies in (({"x1": (2, 4), "w1": (4, 4)}, False), ({"x1": (4, 4), "w1": (4, 4)}, True)):
        eg = E.EGraph()
        eg.add_graph(_g([("matmul", mm, ("x1", "w1"))], ["%0"]), shapes)
        n = len(eg.parent)
        (m,) = rw.matches(eg, *eg.index())
        assert rw.apply(eg, m) is applies
        assert len(eg.parent) == n + applies


@pytest.fixture(scope="module")
def base_rewrites():
    return E.load_rewrites([BASE])


def test_every_proved_rule_derives_itself(base_rewrites):
    """Each proved base rule, at its generator shapes, follows from the library: the matcher handles
    every form a rule takes (symbolic split sizes and constant shapes, grouped convolutions, symbolic
    strides, merges with two outputs, commutative operands)."""
    d = E.Deriver(base_rewrites, rounds=1)
    missed = []
    for rec, src, dst in library.rules(BASE):
        shapes = {v: tuple(s) for v, (s, _k) in rec["inputs"].items()}
        if not d.derivable(src, dst, shapes):
            missed.append(rec["id"])
    assert not missed and d.failed == 0, missed


def test_a_merge_is_matched_across_two_outputs(base_rewrites):
    mm = (("activation", "none"),)
    two = _g([("matmul", mm, ("x1", "w1")), ("matmul", mm, ("x1", "w2"))], ["%0", "%1"])
    merged = _g([("concat", (("axis", 1),), ("w1", "w2")), ("matmul", mm, ("x1", "%0")),
                 ("split", (("axis", 1), ("sizes", (("w1", 1), ("w2", 1)))), ("%1",), 2)], ["%2#0", "%2#1"])
    shapes = {"x1": (2, 4), "w1": (4, 4), "w2": (4, 4)}
    assert E.Deriver(base_rewrites, rounds=1).derivable(two, merged, shapes)
    swapped = G.Graph(merged.ops, ("%2#1", "%2#0"))  # the outputs crossed: a different (false) pair
    assert not E.Deriver(base_rewrites, rounds=2).derivable(two, swapped, shapes)


def test_a_graph_that_does_not_type_check_counts_as_failed():
    d = E.Deriver([])
    bad = _g([("matmul", (("activation", "none"),), ("x1", "x1"))], ["%0"])
    with pytest.raises(specs.SpecError):
        G.infer(bad, {"x1": (2, 4)})
    assert not d.derivable(bad, bad, {"x1": (2, 4)}) and d.failed == 1


def test_a_pattern_matches_only_ops_with_its_number_of_operands():
    """A rule's biased matmul (three operands) does not match a matmul without a bias (two): before, the
    match zipped the pattern's operands with the e-node's, left the bias unbound, and failed with a
    KeyError (deriving the base library's candidates from the conv-bias or matmul-bias rules)."""
    mm = (("activation", "none"),)
    fuse = E.Rewrite("biased-relu", _g([("matmul", mm, ("x", "w", "b")), ("relu", (), ("%0",))], ["%1"]),
                     _g([("matmul", (("activation", "relu"),), ("x", "w", "b"))], ["%0"]))
    unbiased = _g([("matmul", mm, ("x1", "w1")), ("relu", (), ("%0",))], ["%1"])
    fused = _g([("matmul", (("activation", "relu"),), ("x1", "w1"))], ["%0"])
    eg = E.EGraph()
    eg.add_graph(unbiased, {"x1": (2, 4), "w1": (4, 4)})
    assert list(fuse.matches(eg, *eg.index())) == []
    d = E.Deriver([fuse])
    assert not d.derivable(unbiased, fused, {"x1": (2, 4), "w1": (4, 4)}) and d.failed == 0
    biased = _g([("matmul", mm, ("x1", "w1", "b1")), ("relu", (), ("%0",))], ["%1"])
    shapes = {"x1": (2, 4), "w1": (4, 4), "b1": (4,)}
    assert d.derivable(biased, _g([("matmul", (("activation", "relu"),), ("x1", "w1", "b1"))], ["%0"]), shapes)
