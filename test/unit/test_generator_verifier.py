"""The generator and the verifier on small configurations: stage counts, known rules found, pruning,
parallel = serial, axiom validation that can fail, proofs that can fail, and the CLIs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from taso_mlir.generator import graph as G
from taso_mlir.generator import library, pipeline
from taso_mlir.generator.candidates import float_test, pair_key, variant_shapes
from taso_mlir.generator.enumerate import FAMILIES, Config, Enumerator
from taso_mlir.verifier import axioms as AX
from taso_mlir.verifier.prove import Prover, prove_many
from taso_mlir.verifier.validate import validate_axiom

QUIET = dict(log=lambda *a: None)


@pytest.fixture(scope="module")
def gen2():
    return pipeline.generate(Config(max_ops=2), jobs=1, **QUIET)


def _texts(records):
    return {tuple(r["text"]) for r in records}


def test_enumeration_produces_each_graph_once():
    en = Enumerator(Config(max_ops=2))
    fps, ops = en.run()
    rows = np.frombuffer(ops, dtype=np.int32).reshape(-1, 2)
    sets = [frozenset(int(o) for o in r if o >= 0) for r in rows]
    nonempty = [s for s in sets if s]
    assert len(nonempty) == len(set(nonempty)), "an op set was enumerated twice"
    assert len(fps) == len(rows)


def test_parallel_enumeration_equals_serial():
    cfg = Config(max_ops=2)
    serial, n1 = pipeline.enumerate_parallel(cfg, 1)
    parallel, n2 = pipeline.enumerate_parallel(cfg, 2)
    assert n1 == n2
    assert sorted((fp, m.graph.text()) for fp, m in serial) == sorted((fp, m.graph.text()) for fp, m in parallel)


def test_stage_counts_shrink_and_known_rules_are_found(gen2):
    header, records = gen2
    c = header["counts"]
    order = ["graphs", "candidates", "after_common_subgraph", "after_transitivity", "after_renaming",
             "after_float_test", "usable"]
    assert [c[k] for k in order] == sorted((c[k] for k in order), reverse=True)
    texts = [" <=> ".join(r["text"]) for r in records]
    # conv + relu fusion, enlarge of a 1x1 kernel, C_pool as average pooling, T(T(x)) = x
    assert any("relu(%0)" in t and 'activation="relu"' in t and "conv2d" in t for t in texts)
    assert any("enlarge(c3)" in t for t in texts)
    assert any("const_pool" in t and "avgpool2d" in t for t in texts)
    assert any(r["ops"] == [0, 2] and r["text"][1].count("transpose") == 2 for r in records)
    assert all("forward" not in r["directions"] for r in records if r["ops"][0] == 0)  # no 0-op sources


def test_merge_rule_at_three_ops():
    """Two matmuls sharing an input merge into one on concatenated weights plus a split."""
    header, records = pipeline.generate(Config(max_ops=3), jobs=2, **QUIET)
    found = [r for r in records if r["ops"] == [2, 3] and "split" in r["text"][1] and "matmul" in r["text"][0]]
    assert found, "the matmul merge rule was not generated"
    split = next(op for op in found[0]["dst"]["ops"] if op[0] == "split")
    assert all(isinstance(d, list) for d in split[1]["sizes"]), "split sizes must be symbolic"


def test_renaming_and_swapping_give_the_same_key():
    cfg = Config(max_ops=2)
    classes = {s.name: (s.shape, s.kind) for s in cfg.inputs}
    a = G.Graph((G.Op("ewadd", (), ("x1", "x2")),), ("%0",))
    b = G.Graph((G.Op("ewadd", (), ("x2", "x1")),), ("%0",))
    c = G.Graph((G.Op("ewadd", (), ("x3", "x1")),), ("%0",))
    d = G.Graph((G.Op("ewadd", (), ("x1", "x3")),), ("%0",))
    assert pair_key(a, b, classes) == pair_key(c, d, classes) == pair_key(d, c, classes)


def test_float_test_rejects_what_fingerprints_might_accept():
    inputs = {"x1": ((2, 4), "act")}
    shapes = variant_shapes(inputs, {})
    relu2 = G.Graph((G.Op("relu", (), ("x1",)), G.Op("relu", (), ("%0",))), ("%1",))
    relu1 = G.Graph((G.Op("relu", (), ("x1",)),), ("%0",))
    ident = G.Graph((), ("x1",))
    rng = np.random.default_rng(0)
    assert float_test(relu2, relu1, inputs, shapes, rng)[0] is True
    ok, why = float_test(relu1, ident, inputs, shapes, rng)
    assert ok is False and "differ" in why


def test_every_axiom_validates():
    for ax in AX.AXIOMS:
        r = validate_axiom(ax)
        assert r.obligations > 0 and not r.failures, (ax.name, r.failures[:1])


@pytest.mark.parametrize("name,tensors,params,build", [
    # TASO's traps: the output-channel concat of convolutions is wrong for grouped convolutions
    ("bad-A24-grouped", {"x": "n c h w", "y": "o d k kk", "z": "p d k kk"}, {"s": ((1, 1),), "c": (0,)},
     lambda A, x, y, z, s, c: (A.cat(1, A.conv(s, 0, c, x, y), A.conv(s, 0, c, x, z)), A.conv(s, 0, c, x, A.cat(0, y, z)))),
    # scaling does not commute with a fused relu (negative scalars)
    ("bad-A13-relu", {"x": "n c h w", "y": "o c k k", "w": ""}, {"s": ((1, 1),)},
     lambda A, x, y, w, s: (A.smul(A.conv(s, 1, 1, x, y), w), A.conv(s, 1, 1, A.smul(x, w), y))),
    # a 1x1 conv commutes with average pooling, but not a 3x3 one: the template must not hide it
    ("bad-conv-avgpool", {"x": "n c h w", "y": "o c k k"}, {"s": ((1, 1),), "k": ((3, 3),)},
     lambda A, x, y, s, k: (A.avgpool(k, s, A.conv((1, 1), 1, 0, x, y)), A.conv((1, 1), 1, 0, A.avgpool(k, s, x), y))),
    # the biases of a merged convolution concatenated in the wrong order
    ("bad-B24-bias-order", {"x": "n c h w", "y": "o c k k", "z": "p c k k", "b": "o", "d": "p"}, {"s": ((1, 1),), "c": (0,)},
     lambda A, x, y, z, b, d, s, c: (A.cat(1, A.conv_b(s, 1, c, x, y, b), A.conv_b(s, 1, c, x, z, d)),
                                     A.conv_b(s, 1, c, x, A.cat(0, y, z), A.cat(0, d, b)))),
    # a bias is added before the activation: relu after a biased conv is not relu before the bias
    ("bad-B14-order", {"x": "n c h w", "y": "o c k k", "b": "o"}, {"s": ((1, 1),)},
     lambda A, x, y, b, s: (A.conv_b(s, 1, 1, x, y, b), A.conv_b(s, 1, 0, A.relu(x), y, b))),
])
def test_wrong_axioms_fail_validation(name, tensors, params, build):
    r = validate_axiom(AX.Axiom(name, name, tensors, build, params), max_shapes=1500)
    assert r.obligations > 0 and r.failures


def test_prover_proves_true_and_rejects_false_rules():
    p = Prover()
    conv = lambda act, w: G.Op("conv2d", (("activation", act), ("group", 1), ("pads", "same"), ("strides", (1, 1))), ("i1", w))  # noqa: E731
    fused = G.Graph((conv("relu", "c1"),), ("%0",))
    split = G.Graph((conv("none", "c1"), G.Op("relu", (), ("%0",))), ("%1",))
    res = p.prove(split, fused, timeout_s=5)
    assert res["status"] == "proved" and "A14" in res["axioms"]
    wrong = G.Graph((conv("none", "c1"),), ("%0",))
    res = p.prove(split, wrong, timeout_s=1)
    assert res["status"] in ("unknown", "refuted") and res["reason"]
    t0 = G.Graph((G.Op("transpose", (("perm", (0, 1)),), ("x1",)),), ("%0",))
    assert p.prove(t0, G.Graph((), ("x1",)), 1)["status"] == "untranslatable"


def test_prove_many_parallel_keeps_order_and_statuses():
    conv = lambda act: G.Op("conv2d", (("activation", act), ("group", 1), ("pads", "same"), ("strides", (1, 1))), ("i1", "c1"))  # noqa: E731
    fused = G.Graph((conv("relu"),), ("%0",))
    split = G.Graph((conv("none"), G.Op("relu", (), ("%0",))), ("%1",))
    plain = G.Graph((conv("none"),), ("%0",))
    res = prove_many([(split, fused), (split, plain), (fused, split)], timeout_s=1, jobs=2)
    assert [r["status"] == "proved" for r in res] == [True, False, True]


def test_cli_generate_and_verify(tmp_path):
    out = tmp_path / "rules.jsonl"
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_gen", "--max-ops", "2", "--jobs", "2",
                        "-o", str(out), "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "candidate pairs" in r.stdout and "wrote" in r.stdout
    header, records = library.read(out)
    assert all(rec["proof"]["status"] == "unverified" for rec in records)
    proved = tmp_path / "proved.jsonl"
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_verify", str(out), "-o", str(proved),
                        "--timeout", "1", "--jobs", "2", "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "axioms:" in r.stdout and "proved" in r.stdout
    header2, records2 = library.read(proved)
    assert header2["verification"]["status"]["proved"] == sum(x["proof"]["status"] == "proved" for x in records2) > 0
    assert out.read_text().count('"unverified"') == len(records)  # the input file is left alone


@pytest.mark.parametrize("args,msg", [
    (["--max-ops", "0", "-o", "x.jsonl"], "--max-ops"),
    (["--max-ops", "2", "-o", "/nonexistent-dir/x.jsonl"], "does not exist"),
    (["--max-ops", "2", "-o", "x.jsonl", "--derive-from", "/nonexistent.jsonl"], "cannot read the rules file"),
])
def test_cli_gen_errors(args, msg):
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_gen", "--no-progress", *args],
                       capture_output=True, text=True)
    assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_verify_rejects_a_non_library(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"format": "something else"}) + "\n")
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_verify", str(bad), "-o", str(tmp_path / "o"),
                        "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 1 and "not a taso-mlir rules file" in r.stderr and "Traceback" not in r.stderr


def _bconv(act, x, w, b):
    return G.Op("conv2d", (("activation", act), ("group", 1), ("pads", "same"), ("strides", (1, 1))), (x, w, b))


def test_biased_convolutions_prove_only_from_bias_axioms():
    """A convolution with a bias operand is its own function in Z3: relu fusion proves from B14 (A14 knows
    nothing of it), the merge from B24, and the merge with the biases swapped does not prove."""
    p = Prover()
    fused = G.Graph((_bconv("relu", "i1", "c1", "b1"),), ("%0",))
    split = G.Graph((_bconv("none", "i1", "c1", "b1"), G.Op("relu", (), ("%0",))), ("%1",))
    res = p.prove(split, fused, timeout_s=5)
    assert res["status"] == "proved" and res["axioms"] == ["B14"]
    two = G.Graph((_bconv("none", "i1", "c1", "b1"), _bconv("none", "i1", "c2", "b2"),
                   G.Op("concat", (("axis", 1),), ("%0", "%1"))), ("%2",))
    merged = lambda b, d: G.Graph((G.Op("concat", (("axis", 0),), ("c1", "c2")),  # noqa: E731
                                   G.Op("concat", (("axis", 0),), (b, d)), _bconv("none", "i1", "%0", "%1")), ("%2",))
    res = p.prove(two, merged("b1", "b2"), timeout_s=5)
    assert res["status"] == "proved" and "B24" in res["axioms"]
    assert p.prove(two, merged("b2", "b1"), timeout_s=1)["status"] in ("unknown", "refuted")


def test_weight_only_ops_do_not_count_towards_max_ops():
    """The conv-bias family at 2 ops plus 2 weight-only ops finds the biased merge of two convolutions
    sharing an input (2 convolutions -> 2 kernel/bias concats + 1 convolution + 1 split), which is 4 ops;
    with no weight-only ops it does not."""
    def merges(cfg):
        _h, records = pipeline.generate(cfg, jobs=1, **QUIET)
        return [r for r in records if any(op[0] == "split" for side in ("src", "dst") for op in r[side]["ops"])
                and sum(op[0] == "concat" for side in ("src", "dst") for op in r[side]["ops"]) == 2]
    cfg = dataclasses.replace(FAMILIES["conv-bias"], max_ops=2, max_weight_ops=2)
    found = merges(cfg)
    assert found, "no biased merge with a split"
    assert all(r["id"].startswith("B") for r in found)
    assert not merges(dataclasses.replace(cfg, max_weight_ops=0))


def test_derivability_keeps_only_what_the_smaller_library_does_not_give(gen2, tmp_path):
    """N = 3 generated with a proved N = 2 library to derive from (as base-n4 is from base): the pairs
    with no side above 2 ops are that library's and are dropped, and of the rest only those that its
    proved rules (and concat associativity) do not derive are kept, far fewer than without it."""
    header2, records2 = gen2
    results = prove_many([(G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"])) for r in records2],
                         timeout_s=1, jobs=2)
    for r, res in zip(records2, results):
        r["proof"] = {"status": res["status"], "time_s": res["time_s"], "axioms": res["axioms"],
                      "reason": res["reason"]}
    assert sum(r["proof"]["status"] == "proved" for r in records2) > 10
    base = tmp_path / "n2.jsonl"
    library.write(base, header2, records2)
    cfg = Config(max_ops=3, id_prefix="T")
    header, kept = pipeline.generate(cfg, jobs=2, derive_from=str(base), **QUIET)
    c = header["counts"]
    assert header["derived_from"]["base_max_ops"] == 2
    assert c["beyond_base"] < c["after_float_test"]
    assert c["usable"] == len(kept) <= c["after_derivability"] < c["beyond_base"] // 2
    assert all(max(r["ops"]) == 3 for r in kept) and all(r["id"].startswith("T") for r in kept)
    # nothing kept is derivable, and what was dropped was: check a sample directly
    from taso_mlir.generator import egraph as E
    d = E.Deriver(E.load_rewrites([base]) + E.concat_associativity())
    for r in kept[:40]:
        shapes = {v: tuple(s) for v, (s, _k) in r["inputs"].items()}
        assert not d.derivable(G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"]), shapes), r["text"]


# ---- shape-aware proofs (issue 20): false rules that a shape-blind encoding "proved" -------------

def _rule(rid: str):
    for path in library.shipped_paths():
        for r in library.read(path)[1]:
            if r["id"] == rid:
                return (G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"]),
                        {v: len(s) for v, (s, _k) in r["inputs"].items()})
    raise KeyError(rid)


@pytest.mark.parametrize("rid", ["R0194", "R0278"])
def test_the_false_rules_of_the_audit_do_not_prove(rid):
    """R0194 holds only when i1.1 == c2.1; R0278's C_pool has d1.0 channels where the pool needs i1.1.
    The shape-blind encoding proved both (from A19 without x.1 == y.1, and from a C_pool without its
    channel count)."""
    a, b, ranks = _rule(rid)
    res = Prover().prove(a, b, 5.0, ranks)
    assert res["status"] != "proved", res


def _split_swap(sizes):
    cat = G.Op("concat", (("axis", 0),), ("x1", "x2"))
    split = G.Op("split", (("axis", 0), ("sizes", sizes)), ("%0",), 2)
    back = G.Op("concat", (("axis", 0),), ("%1#1", "%1#0"))
    return G.Graph((cat, split, back), ("%2",)), G.Graph((G.Op("concat", (("axis", 0),), ("x2", "x1")),), ("%0",))


def test_split_sizes_are_part_of_the_proof():
    """concat(split(cat0(x1, x2), sizes=[x2.0, x1.0])#1, #0) = concat(x2, x1) is false whenever
    x1.0 != x2.0 (split sizes were not in the encoding, so it proved); with the right sizes it is true."""
    p = Prover()
    wrong, rhs = _split_swap((("x2", 0), ("x1", 0)))
    assert p.prove(wrong, rhs, 5.0)["status"] != "proved"
    right, rhs = _split_swap((("x1", 0), ("x2", 0)))
    res = p.prove(right, rhs, 5.0)
    assert res["status"] == "proved" and {"A26.r2a0", "A27.r2a0"} <= set(res["axioms"]), res


def test_a_rule_whose_sides_never_type_check_together_is_not_proved():
    """matmul(x1, x2) = matmul(x2, x1) type-checks on both sides only for square matrices... and is
    still false there; a rule with a side that never type-checks (a concat of a 2-D and a 4-D tensor)
    is not proved vacuously."""
    p = Prover()
    bad = G.Graph((G.Op("concat", (("axis", 0),), ("x1", "i1")),), ("%0",))
    res = p.prove(bad, bad, 1.0)
    assert res["status"] == "untranslatable" and "type-check" in res["reason"]


def test_validation_checks_the_z3_shape_rules_against_the_specs(monkeypatch):
    """Validation evaluates each axiom's Z3 shape conditions and result shapes at every shape it draws
    and compares them with the specs: a shape rule stricter than the specs (a matmul that also wants
    square operands) or one that gives a wrong size (a concat that does not add its axis) fails it."""
    from taso_mlir.verifier import shapes as SH
    a25 = next(ax for ax in AX.AXIOMS if ax.name == "A25")
    a32 = next(ax for ax in AX.AXIOMS if ax.name == "A32")
    assert not validate_axiom(a25).failures and not validate_axiom(a32).failures
    real_mm, real_cat = SH.ShapeRules.matmul, SH.ShapeRules.concat

    def strict_mm(self, x, y, b=None):
        out, conds = real_mm(self, x, y, b)
        return out, conds + [x[0] == x[1]]
    monkeypatch.setattr(SH.ShapeRules, "matmul", strict_mm)
    r = validate_axiom(a25)
    assert r.failures and "Z3 shape conditions do not hold" in r.failures[0][2]
    monkeypatch.setattr(SH.ShapeRules, "matmul", real_mm)

    def wrong_cat(self, a, x, y):
        out, conds = real_cat(self, a, x, y)
        return list(x), conds
    monkeypatch.setattr(SH.ShapeRules, "concat", wrong_cat)
    r = validate_axiom(a32)
    assert r.failures and "Z3 shape rules give" in r.failures[0][2]
