"""Every model of the ONNX backend test data shipped inside the ``onnx`` package round-trips through
taso-mlir (import, convert-onnx-to-taso, export) or is rejected with a one-line TasoError.

The sweep itself lives in ``onnx_backend_sweep.py`` (also runnable by hand, e.g. with generated node
tests: ``python test/unit/onnx_backend_sweep.py --root DIR -v``). It runs the models in two worker
processes so that a crash of the MLIR library is reported as a FAIL naming the model, not a dead pytest.
The counts are printed in pytest's terminal summary.
"""

from __future__ import annotations

import os
import time

import pytest

import onnx_backend_sweep as sweep


@pytest.mark.slow
def test_backend_models_round_trip_or_are_rejected(taso_summary):
    cases, notes = sweep.discover()
    assert cases, f"no ONNX backend test models found under {sweep.data_root()}"
    t0 = time.time()
    results = sweep.sweep(cases, jobs=2)
    taso_summary(sweep.summarize(results, notes, time.time() - t0))

    assert len(results) == len(cases)
    fails = [f"{r['id']}: {r['reason']}" for r in results if r["status"] == "fail"]
    assert not fails, f"{len(fails)} model(s) FAIL:\n" + "\n".join(fails)
    multi = [r["id"] for r in results if r["status"] == "rejected" and (not r["one_line"] or "\n" in r["reason"])]
    assert not multi, f"TasoError messages spanning several lines: {multi}"
    for r in results:
        if r["status"] == "rejected":
            assert r["reason"].strip(), f"{r['id']}: empty TasoError message"


def test_a_crash_is_a_fail_naming_the_model(monkeypatch):
    """The orchestration: a worker killed by an abort (what an MLIR crash does) blames the model it was
    running, and the other models still get their results."""
    cases, _ = sweep.discover()
    small = sorted((c for c in cases if c["suite"] != "light"), key=lambda c: os.path.getsize(c["model"]))[:3]
    assert len(small) == 3
    monkeypatch.setenv(sweep.CRASH_ENV, small[1]["id"])
    results = sweep.sweep(small, jobs=1)
    assert [r["id"] for r in results] == [c["id"] for c in small]
    assert results[1]["status"] == "fail" and "process crashed (signal SIGABRT) during import/export" in results[1]["reason"]
    assert results[0]["status"] != "fail" and results[2]["status"] != "fail", results


def test_a_crash_of_onnxruntime_on_the_original_is_not_blamed_on_us(monkeypatch):
    cases, _ = sweep.discover()
    case = next(c for c in cases if c["id"] == "pytorch-operator/test_operator_exp")
    monkeypatch.setenv(sweep.CRASH_ENV, f"{case['id']}@{sweep.ORT_ORIGINAL}")
    (r,) = sweep.sweep([case], jobs=1)
    assert r["status"] == "ok" and "onnxruntime crashes on the original" in r["note"], r
    monkeypatch.setenv(sweep.CRASH_ENV, f"{case['id']}@onnxruntime on the export")
    (r,) = sweep.sweep([case], jobs=1)
    assert r["status"] == "fail" and "during onnxruntime on the export" in r["reason"], r


def test_categories_and_summary():
    assert sweep.category("m.onnx: node 'n' (Loop) has a subgraph attribute 'body'; control flow ...") == "control flow"
    assert sweep.category("value 's' ... its type is sequence, only tensors are supported") \
        == "sequence/optional/map types"
    assert sweep.category("graph input 'x' is not supported: it is a string tensor; ...") == "string tensors"
    results = [dict(id="simple/a", suite="simple", status="ok", ort="compared"),
               dict(id="simple/b", suite="simple", status="rejected", reason="... string tensors ...", one_line=True),
               dict(id="light/c", suite="light", status="fail", reason="numeric mismatch")]
    lines = sweep.summarize(results, {"node": "not shipped in this onnx package"})
    assert lines[0].startswith("ONNX backend test models: 3 total, 1 round-trip ok")
    assert "1 FAIL" in lines[0]
    assert "  node: not shipped in this onnx package" in lines
    assert "  FAIL light/c: numeric mismatch" in lines


def test_the_exactness_check_sees_changed_generic_nodes():
    """The sweep's structural check: a generic node must come back with its arity ("" inputs and outputs
    included) and its attributes' types; dead code may go."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    def model(clip_inputs, e_type, dead=False):
        nodes = [h.make_node("Clip", clip_inputs, ["c"]), h.make_node("Dropout", ["c"], ["d", ""]),
                 h.make_node("MyOp", ["d"], ["y"], domain="my.dom")]
        nodes[-1].attribute.append(h.make_attribute("e", [], attr_type=e_type))
        if dead:
            nodes.append(h.make_node("Neg", ["X"], ["unused"]))
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("X", T.FLOAT, [2])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2])])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("my.dom", 1)])

    A = onnx.AttributeProto
    ref = model(["X", "", ""], A.FLOATS)
    assert sweep._generic_nodes_differ(ref, model(["X", "", ""], A.FLOATS)) is None
    assert sweep._generic_nodes_differ(model(["X", "", ""], A.FLOATS, dead=True), ref) is None
    assert "Clip<>[x->x]" in sweep._generic_nodes_differ(ref, model(["X"], A.FLOATS))
    assert "e(INTS)" in sweep._generic_nodes_differ(ref, model(["X", "", ""], A.INTS))
    assert "Neg" in sweep._generic_nodes_differ(ref, model(["X", "", ""], A.FLOATS, dead=True))


def test_unseeded_random_ops_are_found_in_graphs_and_subgraphs():
    """A random op without a seed draws new numbers each run, so no numeric comparison of two runs can
    pass reliably (CI once failed on test_bernoulli_double that way): the sweep names such ops and relies
    on the exact-node check for them. A seeded one is compared as usual."""
    from onnx import TensorProto as T
    from onnx import helper as h

    def model(*nodes, sub=None):
        body = list(nodes)
        if sub is not None:
            then = h.make_graph([sub], "then", [], [h.make_tensor_value_info("s", T.FLOAT, [2])])
            body.append(h.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=then))
        g = h.make_graph(body, "g", [h.make_tensor_value_info("X", T.FLOAT, [2])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2])])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    assert sweep._unseeded_random_ops(model(h.make_node("Relu", ["X"], ["y"]))) == []
    assert sweep._unseeded_random_ops(model(h.make_node("Bernoulli", ["X"], ["y"]))) == ["Bernoulli"]
    assert sweep._unseeded_random_ops(model(h.make_node("Bernoulli", ["X"], ["y"], seed=1.0))) == []
    sub = h.make_node("RandomUniformLike", ["X"], ["s"])
    assert sweep._unseeded_random_ops(model(h.make_node("Relu", ["X"], ["y"]), sub=sub)) == ["RandomUniformLike"]


@pytest.mark.slow
def test_generated_node_tests_round_trip_or_are_rejected(tmp_path, taso_summary, monkeypatch):
    """The onnx wheel does not ship backend/test/data/node; onnx generates those models from
    onnx.backend.test.case.node. Write them and sweep them too (about 1,900 single-op models)."""
    n = sweep.generate_node_tests(str(tmp_path))
    assert n > 1000
    monkeypatch.setenv(sweep.ROOT_ENV, str(tmp_path))  # the workers look the cases up there
    cases, _ = sweep.discover(str(tmp_path))
    cases = [c for c in cases if c["suite"] == "node"]
    assert len(cases) == n
    t0 = time.time()
    results = sweep.sweep(cases, jobs=2)
    lines = sweep.summarize(results, {}, time.time() - t0)
    taso_summary(["ONNX node tests generated by onnx.backend.test.case.node:"] + lines[:1] +
                 [line for line in lines[1:] if line.startswith("  rejected")])
    fails = [f"{r['id']}: {r['reason']}" for r in results if r["status"] == "fail"]
    assert not fails, f"{len(fails)} generated node model(s) FAIL:\n" + "\n".join(fails[:50])
    multi = [r["id"] for r in results if r["status"] == "rejected" and (not r["one_line"] or "\n" in r["reason"])]
    assert not multi, f"TasoError messages spanning several lines: {multi}"
