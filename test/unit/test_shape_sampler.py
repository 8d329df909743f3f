"""The constraint-solving shape sampler (``generator/shape_sampler.py``): it refutes the false rules
that independent draws of each dimension miss (R0194 and R0278 as shipped, the split-size trap of
issue 20) at every seed, its samples always type-check, its constraint model admits every shape the
specs accept, a wrong model shows up as rejections, and the samples reach the shapes the traps need
(dims apart, dims coinciding, groups, strides, kernels, batch sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from taso_mlir.generator import graph as G
from taso_mlir.generator import library
from taso_mlir.generator import shape_sampler as S
from taso_mlir.generator.candidates import random_shapes, shape_fuzz

RECORDS = {r["id"]: r for f in library.SHIPPED for r in library.read(library.default_path(f))[1]}
PROVED = [r for r in RECORDS.values() if r["proof"]["status"] == "proved"]
SEEDS = range(20)


def _rule(rec):
    a, b = G.Graph.from_json(rec["src"]), G.Graph.from_json(rec["dst"])
    return a, b, {v: (tuple(s), k) for v, (s, k) in rec["inputs"].items()}


def _shipped(rid: str, src: str, dst: str):
    """A rule as the rules file ships it (its text checked, so a renumbered file fails here loudly)."""
    rec = RECORDS[rid]
    assert rec["text"] == [src, dst], f"{rid} is no longer the rule this test is about: {rec['text']}"
    return _rule(rec)


#: the split-size trap of issue 20: %1 splits cat0(x1, x2) at sizes [x2.0, x1.0] and the pieces are
#: concatenated the other way round, which is concat(x2, x1) only where x1.0 == x2.0
SPLIT_TRAP = (
    G.Graph.from_json({"ops": [["concat", {"axis": 0}, ["x1", "x2"], 1],
                               ["split", {"axis": 0, "sizes": [["x2", 0], ["x1", 0]]}, ["%0"], 2],
                               ["concat", {"axis": 0}, ["%1#1", "%1#0"], 1]], "outputs": ["%2"]}),
    G.Graph.from_json({"ops": [["concat", {"axis": 0}, ["x2", "x1"], 1]], "outputs": ["%0"]}),
    {"x1": ((2, 4), "act"), "x2": ((2, 4), "act")},
)


def _refuted_every_seed(a, b, inputs):
    """shape_fuzz at 20 seeds: every one finds a disagreement, and from the sampler's shapes (not the
    independent draws that follow them). Returns the counterexamples."""
    found = []
    for seed in SEEDS:
        stats: dict = {}
        n, bad = shape_fuzz(a, b, inputs, np.random.default_rng(seed), stats=stats)
        assert bad is not None, f"seed {seed}: no disagreement in {n} comparisons ({stats})"
        assert stats["drawn"] == 0 and stats["sampled"] == n and stats["rejected"] == 0, stats
        stride = bad.pop("strides", None)
        assert S.check_shapes(a, b, bad, stride) is None, "a counterexample must type-check"
        found.append(bad)
    assert len(found) == len(SEEDS)
    return found


def test_refutes_R0194_as_shipped_every_time():
    a, b, inputs = _shipped(
        "R0194",
        '%0 = concat(i1, i2) {axis=1}; %1 = concat(c2, c1) {axis=1}; %2 = conv2d(%0, %1) {activation="none", '
        'group=1, pads="same", strides="s"} -> %2',
        '%0 = concat(i2, i1) {axis=1}; %1 = concat(c1, c2) {axis=1}; %2 = conv2d(%0, %1) {activation="none", '
        'group=1, pads="same", strides="s"} -> %2')
    for bad in _refuted_every_seed(a, b, inputs):
        # both sides type-check where i1.1 + i2.1 == c1.1 + c2.1; the rule is false where i1.1 != c2.1
        assert bad["i1"][1] + bad["i2"][1] == bad["c1"][1] + bad["c2"][1]
        assert bad["i1"][1] != bad["c2"][1], bad


def test_refutes_R0278_as_shipped_every_time():
    a, b, inputs = _shipped(
        "R0278",
        '%0 = const_pool() {shape=[d1.0, 1, 3, 3]}; %1 = conv2d(i1, %0) {activation="none", group="grouped", '
        'pads="same", strides="s"}; %2 = conv2d(%1, d1) {activation="relu", group="grouped", pads="same", '
        'strides="s"} -> %2',
        '%0 = avgpool2d(i1) {count_include_pad=1, kernel_shape=[3, 3], pads="same", strides="s"}; '
        '%1 = conv2d(%0, d1) {activation="none", group="grouped", pads="same", strides="s"}; %2 = relu(%1) -> %2')
    for bad in _refuted_every_seed(a, b, inputs):
        # C_pool makes d1.0 / i1.1 copies of each pooled channel; with d1.1 >= 2 weight groups read
        # different channels than the pool's (equal where d1.0 == i1.1 or d1.1 == 1)
        assert bad["d1"][0] % bad["i1"][1] == 0 and bad["d1"][0] != bad["i1"][1] and bad["d1"][1] >= 2, bad


def test_refutes_the_split_size_trap_every_time():
    for bad in _refuted_every_seed(*SPLIT_TRAP):
        assert bad["x1"][0] != bad["x2"][0] and bad["x1"][1] == bad["x2"][1], bad


def test_independent_draws_alone_miss_what_the_sampler_finds():
    """Why the sampler: R0278 type-checks at many independently drawn shapes, but (with this seed) at
    none of 1,000 draws where it is false; 40 sampled shapes include several such."""
    from taso_mlir.generator.candidates import agree
    a, b, inputs = _rule(RECORDS["R0278"])
    rng = np.random.default_rng(0)
    typed = drawn_bad = 0
    for t in range(1000):
        shapes = random_shapes(inputs, rng, None if t % 2 else rng.choice(np.arange(1, 7), size=3, replace=False))
        if S.check_shapes(a, b, shapes, (1, 1)) is None:
            typed += 1
            drawn_bad += not agree(a, b, inputs, shapes, rng, (1, 1))
    s = S.ShapeSampler(a, b, inputs, (1, 1))
    sampled = list(s.samples(np.random.default_rng(0), 40))
    sampled_bad = sum(not agree(a, b, inputs, sh, rng, (1, 1)) for sh in sampled)
    assert len(sampled) == 40 and s.rejected == 0 and typed >= 40
    assert sampled_bad >= 3 and sampled_bad > drawn_bad, (sampled_bad, drawn_bad, typed)


def _samples(rec_or_rule, stride, seeds=range(3), n=24):
    """Per seed: the sampler and its n samples (all checked to type-check)."""
    a, b, inputs = _rule(rec_or_rule) if isinstance(rec_or_rule, dict) else rec_or_rule
    out = []
    for seed in seeds:
        s = S.ShapeSampler(a, b, inputs, stride)
        got = list(s.samples(np.random.default_rng(seed), n))
        assert s.rejected == 0 and s.accepted == len(got) == n
        assert all(S.check_shapes(a, b, sh, stride) is None for sh in got)
        out.append((s, got))
    return out


def test_samples_are_diverse():
    """Batch 1-4, odd and even spatial sizes, kernels 1/3/5 and non-square ones, channels of the 1/2/4/8
    family, dims that may differ both apart and coinciding, single dims perturbed, and both strides."""
    runs = _samples(RECORDS["R0194"], (1, 1)) + _samples(RECORDS["R0194"], (2, 2))
    flat = [sh for _s, run in runs for sh in run]
    assert {sh["i1"][0] for sh in flat} >= {1, 2, 3, 4}
    assert {sh["i1"][2] % 2 for sh in flat} == {0, 1}
    assert {sh["c1"][2] for sh in flat} >= {1, 3, 5}
    assert any(sh["c1"][2] != sh["c1"][3] for sh in flat)
    assert {d for sh in flat for d in (sh["i1"][1], sh["i2"][1], sh["c1"][0])} >= {1, 2, 4, 8}
    assert any(sh["i1"][1] == sh["c2"][1] for sh in flat) and any(sh["i1"][1] != sh["c2"][1] for sh in flat)

    # a perturbation: two samples of a run that differ in one dim only, of those the constraints do
    # not tie to others (a dim forced equal to another moves with it: i1.2 with i2.2)
    assert all(len(s.free) < len(s.keys) for s, _run in runs)
    assert any(sum(p[v][ax] != q[v][ax] for v, ax in s.free) == 1 for s, run in runs for p in run for q in run)
    # grouped convolutions: depthwise (d1.1 == 1) and wider groups, several group counts
    flat = [sh for _s, run in _samples(RECORDS["R0278"], (1, 1)) for sh in run]
    assert {sh["d1"][1] == 1 for sh in flat} == {True, False}
    assert len({sh["i1"][1] // sh["d1"][1] for sh in flat}) >= 3


def test_model_admits_every_shape_the_specs_accept():
    """The constraint model is no stricter than the specs: every independently drawn shape at which both
    sides type-check (within the sampler's bounds) has a solution in the model, for an eighth of the
    proved rules (and the traps)."""
    typed = 0
    rules = [_rule(r) for r in PROVED[::8]] + [_rule(RECORDS["R0194"]), _rule(RECORDS["R0278"]), SPLIT_TRAP]
    for i, (a, b, inputs) in enumerate(rules):
        rng = np.random.default_rng(i)
        for stride in S.strides_of(a, b):
            s = S.ShapeSampler(a, b, inputs, stride)
            for t in range(60):
                shapes = random_shapes(inputs, rng, None if t % 2 else rng.choice(np.arange(1, 7), size=3,
                                                                                  replace=False))
                if S.check_shapes(a, b, shapes, stride) is None:
                    typed += 1
                    assert s.admits(shapes), (a.text(), b.text(), shapes, stride)
    assert typed >= 1000


def _ewadd_rule():
    a = G.Graph.from_json({"ops": [["ewadd", {}, ["x1", "x2"], 1], ["relu", {}, ["%0"], 1]], "outputs": ["%1"]})
    b = G.Graph.from_json({"ops": [["relu", {}, ["x1"], 1], ["relu", {}, ["x2"], 1],
                                   ["ewadd", {}, ["%0", "%1"], 1]], "outputs": ["%2"]})
    return a, b, {"x1": ((2, 4), "act"), "x2": ((2, 4), "act")}


def test_a_wrong_constraint_model_shows_up_as_rejections(monkeypatch):
    a, b, inputs = _ewadd_rule()
    s = S.ShapeSampler(a, b, inputs)
    assert len(list(s.samples(np.random.default_rng(0), 16))) == 16 and s.rejected == 0
    real = S._Model._op

    def sloppy(self, op, ins, sh, tag):  # forgets that ewadd's operands must have equal shapes
        return [ins[0]] if op.name == "ewadd" else real(self, op, ins, sh, tag)
    monkeypatch.setattr(S._Model, "_op", sloppy)
    s = S.ShapeSampler(a, b, inputs)
    got = list(s.samples(np.random.default_rng(0), 16))
    assert s.rejected > 0 and "differ" in s.rejections[0][1]
    assert s.candidates == s.accepted + s.rejected and s.accepted == len(got)
    assert all(S.check_shapes(a, b, sh) is None and sh["x1"] == sh["x2"] for sh in got)


def test_infeasible_rules_get_no_samples():
    """Where the sides never type-check with equal output shapes, the sampler says so and yields nothing
    (concat(x1, x1) on axis 1 has twice x1's columns, relu(x1) has x1's)."""
    a = G.Graph.from_json({"ops": [["concat", {"axis": 1}, ["x1", "x1"], 1]], "outputs": ["%0"]})
    b = G.Graph.from_json({"ops": [["relu", {}, ["x1"], 1]], "outputs": ["%0"]})
    s = S.ShapeSampler(a, b, {"x1": ((2, 4), "act")})
    assert not s.feasible and list(s.samples(np.random.default_rng(0), 8)) == []


def test_unsupported_ops_fall_back_to_independent_draws():
    a = G.Graph.from_json({"ops": [["reshape", {"shape": [8]}, ["x1"], 1], ["relu", {}, ["%0"], 1]],
                           "outputs": ["%1"]})
    b = G.Graph.from_json({"ops": [["relu", {}, ["x1"], 1], ["reshape", {"shape": [8]}, ["%0"], 1]],
                           "outputs": ["%1"]})
    inputs = {"x1": ((2, 4), "act")}
    with pytest.raises(S.Unsupported):
        S.ShapeSampler(a, b, inputs)
    stats: dict = {}
    n, bad = shape_fuzz(a, b, inputs, np.random.default_rng(0), stats=stats)
    assert bad is None and n == stats["drawn"] > 0 and stats["unsupported"] == 1 and stats["sampled"] == 0
