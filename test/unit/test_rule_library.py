"""Differential testing of the shipped rule library: every proved rule is re-evaluated on random
float inputs with the reference semantics, at the generator's shapes and at shape variants beyond
them (odd sizes, batch 1 and 5, wider channels, even spatial sizes), independently of the generator's
own float test (other seeds). Both sides must agree wherever both type-check, and every rule must
type-check at its generator shapes and at two or more variants."""

from __future__ import annotations

import numpy as np
import pytest

from taso_mlir.generator import graph as G
from taso_mlir.generator import library
from taso_mlir.generator.candidates import SHAPE_VARIANTS, random_inputs, shape_fuzz, variant_shapes

#: every shipped library (one per generator family) and the fewest proved rules it must have
LIBRARIES = {family: library.read(library.default_path(family)) for family in library.SHIPPED}
MIN_PROVED = {"base": 300, "base-n4": 300, "conv-bias": 30, "matmul-bias": 20}
PROVED = [r for _h, records in LIBRARIES.values() for r in records if r["proof"]["status"] == "proved"]


@pytest.mark.parametrize("family", sorted(library.SHIPPED))
def test_library_header_and_counts(family, taso_summary):
    HEADER, RECORDS = LIBRARIES[family]
    proved = [r for r in RECORDS if r["proof"]["status"] == "proved"]
    prefix = HEADER["config"].get("id_prefix", "R")
    assert HEADER["format"] == library.FORMAT
    counts = HEADER["counts"]
    stages = ["graphs", "candidates", "after_common_subgraph", "after_transitivity", "after_renaming",
              "after_float_test", "beyond_base", "after_derivability", "usable"]
    stages = [s for s in stages if s in counts]
    values = [counts[s] for s in stages]
    assert values == sorted(values, reverse=True), "every pruning stage can only shrink the set"
    assert counts["usable"] == len(RECORDS)
    assert counts["proved"] == len(proved) >= MIN_PROVED[family]
    assert {r["id"] for r in RECORDS} == {f"{prefix}{i + 1:04d}" for i in range(len(RECORDS))}
    for r in RECORDS:
        assert r["proof"]["status"] in ("proved", "unknown", "refuted", "untranslatable")
        assert r["proof"]["status"] == "proved" or r["proof"]["reason"], f"{r['id']}: excluded without a reason"
        assert r["directions"], r["id"]
    for r in proved:
        assert r["proof"]["axioms"], f"{r['id']}: a proof that used no axiom"
    extra = HEADER["config"].get("max_weight_ops", 0)
    taso_summary(f"rule library {family}: {len(RECORDS)} rules (N={HEADER['config']['max_ops']}"
                 f"{f' + {extra} weight-only ops' if extra else ''}), {len(proved)} proved, "
                 f"{len(RECORDS) - len(proved)} excluded with reasons; stages " +
                 " -> ".join(str(v) for v in values))


#: the rules compared at stride 2 somewhere (both sides type-check)
checked_at_stride_2: set = set()


def _strides(rec) -> list:
    """The strides to test a rule at: (1, 1), and (2, 2) where the rule is stated with a symbolic stride."""
    symbolic = any(op[1].get("strides") == "s" for side in ("src", "dst") for op in rec[side]["ops"])
    return [(1, 1), (2, 2)] if symbolic else [None]


def _check(rec, seed):
    a, b = G.Graph.from_json(rec["src"]), G.Graph.from_json(rec["dst"])
    inputs = {v: (tuple(s), k) for v, (s, k) in rec["inputs"].items()}
    rng = np.random.default_rng(seed)
    for stride in _strides(rec):
        agreed = 0
        env = {} if stride is None else {G.STRIDE_VAR: stride}
        for n, variant in enumerate(({},) + SHAPE_VARIANTS):
            shapes = variant_shapes(inputs, variant)
            typed = []
            for g in (a, b):
                try:
                    G.infer(g, {**shapes, **env})
                    typed.append(True)
                except Exception:
                    typed.append(False)
            if n == 0 and stride in (None, (1, 1)):
                assert all(typed), f"{rec['id']} does not type-check at its generator shapes"
            if not all(typed):
                continue  # a rule applies only where both sides type-check (a stated precondition)
            for trial in range(2):
                vals = random_inputs(inputs, shapes, rng)
                for x, y in zip(G.evaluate(a, vals, strides=stride), G.evaluate(b, vals, strides=stride)):
                    assert x.shape == y.shape, (rec["id"], variant)
                    np.testing.assert_allclose(x, y, rtol=1e-7, atol=1e-9,
                                               err_msg=f"{rec['id']} at {shapes}, stride {stride}: "
                                                       f"{rec['text'][0]}  <=>  {rec['text'][1]}")
            agreed += 1
        if stride in (None, (1, 1)):
            assert agreed >= 3, f"{rec['id']} type-checks at only {agreed - 1} shape variants"
        else:  # (a rule that type-checks nowhere at stride 2, e.g. a concat of x and conv(x), never applies there)
            if agreed:
                checked_at_stride_2.add(rec["id"])


@pytest.mark.parametrize("chunk", range(8))
def test_every_proved_rule_agrees_numerically(chunk):
    recs = PROVED[chunk::8]
    assert recs
    for rec in recs:
        _check(rec, seed=int(rec["id"][1:]) * 7919 + 17 + ord(rec["id"][0]))


def test_differential_check_catches_a_wrong_rule():
    """The check above can fail: a rule with its target perturbed (relu dropped) is caught."""
    rec = next(r for r in PROVED if any(op[1].get("activation") == "relu" for op in r["dst"]["ops"]))
    bad = dict(rec, dst={"ops": [[n, {**a, "activation": "none"} if "activation" in a else a, o, k]
                                 for n, a, o, k in rec["dst"]["ops"]], "outputs": rec["dst"]["outputs"]})
    with pytest.raises(AssertionError):
        _check(bad, seed=1)


def test_stride_generalized_rules_are_tested_at_stride_2(taso_summary):
    """taso-verify states a rule with a symbolic stride only where it proves for any stride; a rule that
    needs the identity kernel (A40, stride 1 only) keeps stride 1, and a wrong stride-2 rule is caught."""
    general = [r for r in PROVED if _strides(r) != [None]]
    assert len(general) >= 200
    for r in general:
        _check(r, seed=5)
    assert len(checked_at_stride_2) >= 150, "most stride-generalized rules must be exercised at stride 2"
    assert all(r["proof"].get("generalized") == ["strides"] for r in general)
    kept = [r for r in PROVED if _strides(r) == [None] and "A40" in r["proof"]["axioms"]]
    assert kept, "a rule proved with I_conv should keep its stride 1"
    # relu fusion at stride 2 holds; fusing with a stride-1 conv on one side only does not
    fuse = next(r for r in general if len(r["src"]["ops"]) + len(r["dst"]["ops"]) == 3
                and {op[0] for side in ("src", "dst") for op in r[side]["ops"]} == {"conv2d", "relu"})
    _check(fuse, seed=3)
    bad = dict(fuse, dst={"ops": [[n, {**a, "strides": [1, 1]} if "strides" in a else a, o, k]
                                  for n, a, o, k in fuse["dst"]["ops"]], "outputs": fuse["dst"]["outputs"]})
    with pytest.raises(AssertionError):
        _check(bad, seed=3)
    taso_summary(f"stride: {len(general)} proved rules hold for any stride; {len(checked_at_stride_2)} of them "
                 f"type-check at stride 2 and agree there")


def _fuzz(rec, seed, **kw):
    a, b = G.Graph.from_json(rec["src"]), G.Graph.from_json(rec["dst"])
    inputs = {v: (tuple(s), k) for v, (s, k) in rec["inputs"].items()}
    return shape_fuzz(a, b, inputs, np.random.default_rng(seed), **kw)


@pytest.mark.parametrize("chunk", range(4))
def test_every_proved_rule_agrees_at_independently_drawn_shapes(chunk):
    """The proofs know no shapes: every proved rule is also compared where each dimension is drawn on
    its own (other seeds than taso-verify's), so that sizes equal in the generator need not stay equal."""
    compared = untested = 0
    for rec in PROVED[chunk::4]:
        n, bad = _fuzz(rec, seed=int(rec["id"][1:]) + 101 * ord(rec["id"][0]), tries=300, samples=20)
        assert bad is None, f"{rec['id']} differs at {bad}: {rec['text'][0]}  <=>  {rec['text'][1]}"
        compared += n
        untested += n == 0
    # (a rule whose sides rarely type-check together at random shapes may get no sample here; it is
    # still compared at the generator's shapes and their variants above)
    assert compared >= 10 * len(PROVED[chunk::4]) and untested <= len(PROVED[chunk::4]) // 5, (compared, untested)


def test_shape_fuzzing_refuted_what_the_proofs_missed(taso_summary):
    """taso-verify's shape fuzzing refuted proved-looking rules whose proof leaned on an ill-typed term:
    a merged biased convolution whose kernel and bias pieces are concatenated with different sizes.
    The fuzzing finds the disagreement again here."""
    refuted = [r for _h, records in LIBRARIES.values() for r in records
               if r["proof"]["status"] == "refuted" and "differ numerically" in r["proof"]["reason"]]
    assert refuted, "the shipped libraries should record the rules the shape fuzzing refuted"
    for rec in refuted:
        n, bad = _fuzz(rec, seed=7, tries=2000, samples=200)
        assert bad is not None, f"{rec['id']}: no disagreement found in {n} comparisons"
    taso_summary(f"shape fuzzing: {len(refuted)} rules refuted although Z3 proved them "
                 f"({', '.join(r['id'] for r in refuted)})")
