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
from taso_mlir.generator.candidates import SHAPE_VARIANTS, random_inputs, variant_shapes

#: every shipped library (one per generator family) and the fewest proved rules it must have
LIBRARIES = {family: library.read(library.default_path(family)) for family in library.SHIPPED}
MIN_PROVED = {"base": 300, "conv-bias": 30}
PROVED = [r for _h, records in LIBRARIES.values() for r in records if r["proof"]["status"] == "proved"]


@pytest.mark.parametrize("family", sorted(library.SHIPPED))
def test_library_header_and_counts(family, taso_summary):
    HEADER, RECORDS = LIBRARIES[family]
    proved = [r for r in RECORDS if r["proof"]["status"] == "proved"]
    prefix = HEADER["config"].get("id_prefix", "R")
    assert HEADER["format"] == library.FORMAT
    counts = HEADER["counts"]
    stages = ["graphs", "candidates", "after_common_subgraph", "after_transitivity", "after_renaming",
              "after_float_test", "usable"]
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


def _check(rec, seed):
    a, b = G.Graph.from_json(rec["src"]), G.Graph.from_json(rec["dst"])
    inputs = {v: (tuple(s), k) for v, (s, k) in rec["inputs"].items()}
    rng = np.random.default_rng(seed)
    agreed = 0
    for n, variant in enumerate(({},) + SHAPE_VARIANTS):
        shapes = variant_shapes(inputs, variant)
        typed = []
        for g in (a, b):
            try:
                G.infer(g, shapes)
                typed.append(True)
            except Exception:
                typed.append(False)
        if n == 0:
            assert all(typed), f"{rec['id']} does not type-check at its generator shapes"
        if not all(typed):
            continue  # a rule applies only where both sides type-check (a stated precondition)
        for trial in range(2):
            vals = random_inputs(inputs, shapes, rng)
            for x, y in zip(G.evaluate(a, vals), G.evaluate(b, vals)):
                assert x.shape == y.shape, (rec["id"], variant)
                np.testing.assert_allclose(x, y, rtol=1e-7, atol=1e-9,
                                           err_msg=f"{rec['id']} at {shapes}: {rec['text'][0]}  <=>  {rec['text'][1]}")
        agreed += 1
    assert agreed >= 3, f"{rec['id']} type-checks at only {agreed - 1} shape variants"


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
