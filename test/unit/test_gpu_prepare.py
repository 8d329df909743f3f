"""benchmarks/gpu/prepare.py (issue 25, deliverable 3: original vs optimized for each cost model): the committed
sets hold a graph optimized for every shipped measured table (``cuda:h200``) beside the analytic ones, searches
that export the same graph share one file (the same bytes, or the same structure under other names) and say
so, a ``cuda:h100`` table appears as a target by itself once it is shipped, and the analytic targets stay the
hand-set profiles whatever tables are shipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from unit_helpers import GPU_BENCH as GPU
from unit_helpers import ROOT
from unit_helpers import gpu_manifest as manifest

MODELS = GPU / "models"
sys.path.insert(0, str(GPU))

import prepare as P  # noqa: E402


# ---------------------------------------------------------------------------------------------------------
# the committed sets


def test_targets_are_the_analytic_ones_then_every_shipped_table():
    assert "cuda:h200" in P.measured_targets()  # passes/cost/tables/h200.json
    t = P.default_targets()
    assert t[:2] == ["analytic:t4", "analytic:h100"] and "cuda:h200" in t[2:]
    assert P.spec("analytic:h100") == "analytic:h100:datasheet" and P.spec("cuda:h200") == "cuda:h200"
    assert P.variant_name("cuda:h200") == "opt-cuda-h200"


@pytest.mark.parametrize("s", ["full", "quick", "torch"])
def test_every_model_has_a_graph_optimized_for_each_cost_model(s):
    """original, analytic:t4, analytic:h100 (the hand-set profile), cuda:h100 and cuda:h200 per model, each file
    priced under all four cost models; a variant whose file another variant wrote says which and how; no two
    files of a model are the same graph."""
    man = manifest(s)
    assert man["targets"] == ["analytic:t4", "analytic:h100", "cuda:h100", "cuda:h200"]
    assert set(man["cost_models"]) == {"analytic:t4", "analytic:h100", "cuda:h100", "cuda:h200"}
    assert man["specs"]["analytic:h100"] == "analytic:h100:datasheet"
    for m in man["models"]:
        assert list(m["variants"]) == ["original", "opt-analytic-t4", "opt-analytic-h100", "opt-cuda-h100",
                                       "opt-cuda-h200"]
        seen: dict = {}  # file -> the variants before
        for v, e in m["variants"].items():
            f = e["file"]
            if f in seen:
                assert e["same_graph_as"]["variants"] == seen[f], (m["name"], v)
                assert e["same_graph_as"]["how"] in ("the same file", "the same graph, other value and node names")
            else:
                assert "same_graph_as" not in e and f == f"{m['name']}.{v}.onnx", (m["name"], v)
            seen.setdefault(f, []).append(v)
            if v != "original":
                assert e["search"]["target"] == v[4:].replace("-", ":", 1)
                assert e["search"]["spec"] == P.spec(e["search"]["target"])
        for f, fe in m["files"].items():
            assert set(fe["predicted"]["total_ms"]) == set(man["cost_models"]) and fe["structure"]
        assert len({fe["structure"] for fe in m["files"].values()}) == len(m["files"])


def test_the_measured_tables_graphs_differ_where_the_search_chose_otherwise():
    """The full set: the cuda:h200 search exports a graph of its own for most models (what the next GPU run
    times in its later pass); its predicted cost under cuda:h200 is what the search's table says of it."""
    man = manifest("full")
    own = [m["name"] for m in man["models"] if "same_graph_as" not in m["variants"]["opt-cuda-h200"]]
    assert len(own) >= 5, own
    for m in man["models"]:
        e = m["variants"]["opt-cuda-h200"]
        assert e["search"]["rel_err_vs_original"] <= 1e-4
        assert e["search"]["cost_after_ms"] <= e["search"]["cost_before_ms"]


# ---------------------------------------------------------------------------------------------------------
# the structure digest


def _model(names=("a", "b", "c"), order=(0, 1, 2), alpha=0.1, weight="w"):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), weight)
    nodes = [helper.make_node("MatMul", ["x", weight], [names[0]], name=f"n{names[0]}"),
             helper.make_node("Relu", ["x"], [names[1]], name=f"n{names[1]}"),
             helper.make_node("LeakyRelu", [names[0]], [names[2]], alpha=alpha)]
    out = helper.make_node("Add", [names[2], names[1]], ["y"])
    g = helper.make_graph([nodes[i] for i in order] + [out], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [w])
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_structure_digest_ignores_names_and_order_not_structure():
    base = P.structure_digest(_model())
    assert P.structure_digest(_model(names=("p", "q", "r"), weight="v")) == base  # other names
    assert P.structure_digest(_model(order=(1, 0, 2))) == base  # another topological order
    assert P.structure_digest(_model(alpha=0.2)) != base  # an attribute
    m = _model()
    m.graph.node[-1].op_type = "Mul"
    assert P.structure_digest(m) != base  # an op
    m = _model()
    m.graph.node[-1].input[:] = [m.graph.node[-1].input[1], m.graph.node[-1].input[0]]
    assert P.structure_digest(m) != base  # operand order
    m = _model()
    m.graph.output[0].name = "z"
    m.graph.node[-1].output[0] = "z"
    assert P.structure_digest(m) != base  # the graph's interface
    # the bytes differ where only the names do: the file digest tells them apart, the structure does not
    assert P.graph_digest(_model(names=("p", "q", "r"))) != P.graph_digest(_model())


# ---------------------------------------------------------------------------------------------------------
# a cuda:h100 table, once shipped


def test_a_shipped_h100_table_adds_its_search_and_keeps_the_analytic_h100_hand_set(tmp_path):
    """With ``h100.json`` beside ``h200.json`` (here: a copy of the H200 table, through $TASO_CUDA_TABLES),
    prepare.py searches with cuda:h100 too, checks its graph, prices every file with it, and the analytic:h100
    graph is the hand-set profile's (the same search as the committed one), not the roofline fitted to the new
    table."""
    tables = tmp_path / "tables"
    tables.mkdir()
    h200 = ROOT / "passes" / "cost" / "tables" / "h200.json"
    shutil.copy(h200, tables / "h200.json")
    shutil.copy(h200, tables / "h100.json")
    env = dict(os.environ, TASO_CUDA_TABLES=str(tables))
    r = subprocess.run([sys.executable, str(GPU / "prepare.py"), "--out", str(tmp_path / "m"), "--sets", "quick",
                        "--models", "squeezenet,nasrnn"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    man = json.loads((tmp_path / "m" / "quick" / "manifest.json").read_text())
    assert man["targets"] == ["analytic:t4", "analytic:h100", "cuda:h100", "cuda:h200"]
    assert "cuda:h100" in man["cost_models"] and man["specs"]["analytic:h100"] == "analytic:h100:datasheet"
    committed = {m["name"]: m for m in manifest("quick")["models"]}
    for m in man["models"]:
        e = m["variants"]["opt-cuda-h100"]
        assert e["search"]["target"] == "cuda:h100" and e["search"]["rel_err_vs_original"] <= 1e-4
        assert all(fe["predicted"]["total_ms"]["cuda:h100"] > 0 for fe in m["files"].values())
        # analytic:h100 stayed the datasheet profile: the committed search's costs
        old = committed[m["name"]]["variants"]["opt-analytic-h100"]["search"]
        new = m["variants"]["opt-analytic-h100"]["search"]
        assert new["cost_before_ms"] == pytest.approx(old["cost_before_ms"])
        assert new["cost_after_ms"] == pytest.approx(old["cost_after_ms"])


# ---------------------------------------------------------------------------------------------------------
# the predicted cost: each file priced as the project's executor runs it


def _onnx(nodes, inputs, outputs, inits):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], inits)
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _w(name, shape):
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(shape).astype(np.float32), name)


def _cost(kind, attrs, ins, outs, weights, cm="analytic:t4"):
    from taso_mlir.passes.cost.oracle import OpSig, get_cost_model

    m = get_cost_model(P.spec(cm))
    try:
        return m.cost(OpSig(kind, tuple(sorted(attrs.items())), ins, outs, "f32", False, weights))
    finally:
        m.close()


CONV = {"activation": "relu", "dilations": (1, 1), "group": 1, "pads": (1, 1, 1, 1), "strides": (1, 1)}


def test_a_conv_and_the_relu_the_executor_fuses_into_it_are_priced_as_one_fused_conv():
    """Conv + Relu (the Relu the conv's only user): the executor runs one cuDNN conv+bias+ReLU kernel, and the
    search prices a conv2d with activation relu: the prediction is that op's cost, not a conv's plus a relu's
    (a launch and a memory pass more), and its op list holds the fused signature alone."""
    from onnx import helper

    pytest.importorskip("taso_mlir.dialect.mlir")
    m = _onnx([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
               helper.make_node("Relu", ["c"], ["y"], name="relu")],
              [("x", [1, 16, 32, 32])], [("y", [1, 32, 32, 32])], [_w("w", (32, 16, 3, 3)), _w("b", (32,))])
    p = P.predicted(m, "t", ["analytic:t4", "analytic:h100"])
    ins, outs = ((1, 16, 32, 32), (32, 16, 3, 3), (32,)), ((1, 32, 32, 32),)
    for cm in ("analytic:t4", "analytic:h100"):
        fused = _cost("conv2d", CONV, ins, outs, (False, True, True), cm)
        apart = (_cost("conv2d", dict(CONV, activation="none"), ins, outs, (False, True, True), cm)
                 + _cost("relu", {}, outs, outs, (False,), cm))
        assert p["total_ms"][cm] == pytest.approx(fused) and fused < apart
    assert [(o[1], o[2]) for o in p["ops"]] == [("conv2d", 1)] and '["activation","relu"]' in p["ops"][0][0]
    assert p["as_run"] == {"kernels": 1, "fused": 1, "folded": 0, "priced_ops": 1}


def test_a_relu_the_executor_does_not_fuse_is_priced_apart():
    """The conv's result used by the Relu and by an Add too: the executor runs the conv and the relu as two
    kernels (its rule: the Relu is the conv's only user), and so does the prediction."""
    from onnx import helper

    pytest.importorskip("taso_mlir.dialect.mlir")
    m = _onnx([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
               helper.make_node("Relu", ["c"], ["r"], name="relu"),
               helper.make_node("Add", ["r", "c"], ["y"], name="add")],
              [("x", [1, 16, 32, 32])], [("y", [1, 32, 32, 32])], [_w("w", (32, 16, 3, 3)), _w("b", (32,))])
    p = P.predicted(m, "t", ["analytic:t4"])
    assert sorted((o[1], o[2]) for o in p["ops"]) == [("conv2d", 1), ("ewadd", 1), ("relu", 1)]
    assert '["activation","none"]' in next(o[0] for o in p["ops"] if o[1] == "conv2d")
    assert p["as_run"]["fused"] == 0 and p["as_run"]["priced_ops"] == p["as_run"]["kernels"] == 3


def test_a_biased_gemm_and_its_relu_are_one_matmul_and_what_the_executor_folds_costs_nothing():
    """Gemm(x, W^T, C) + Relu: cuBLASLt's bias+ReLU epilogue, one kernel; the import writes it as a matmul, an
    add and a relu, the prediction prices one matmul with the bias and activation relu (the search's biased
    matmul). A Gemm of a Constant (NasRNN's first step on the zero state) is folded on the host: no cost."""
    import numpy as np
    from onnx import helper, numpy_helper

    pytest.importorskip("taso_mlir.dialect.mlir")
    zero = helper.make_node("Constant", [], ["h0"], name="h0",
                            value=numpy_helper.from_array(np.zeros((2, 64), np.float32)))
    m = _onnx([zero,
               helper.make_node("Gemm", ["h0", "u"], ["hu"], transB=1, name="gemm0"),
               helper.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1, name="gemm"),
               helper.make_node("Relu", ["g"], ["r"], name="relu"),
               helper.make_node("Add", ["r", "hu"], ["y"], name="add")],
              [("x", [2, 64])], [("y", [2, 128])], [_w("w", (128, 64)), _w("c", (128,)), _w("u", (128, 64))])
    p = P.predicted(m, "t", ["analytic:t4"])
    mm = _cost("matmul", {"activation": "relu"}, ((2, 64), (64, 128), (128,)), ((2, 128),), (False, True, True))
    add = _cost("ewadd", {}, ((2, 128), (2, 128)), ((2, 128),), (False, False))
    assert p["total_ms"]["analytic:t4"] == pytest.approx(mm + add)
    assert sorted((o[1], o[2]) for o in p["ops"]) == [("ewadd", 1), ("matmul", 1)]
    assert p["as_run"] == {"kernels": 2, "fused": 1, "folded": 2, "priced_ops": 2}


def test_unnamed_nodes_are_matched_too():
    """The executor's plan and the import are matched by node names: a model whose nodes have none (or the
    same one) is priced on a copy with fresh names, the same as with names."""
    from onnx import helper

    pytest.importorskip("taso_mlir.dialect.mlir")
    m = _onnx([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
               helper.make_node("Relu", ["c"], ["y"])],
              [("x", [1, 16, 32, 32])], [("y", [1, 32, 32, 32])], [_w("w", (32, 16, 3, 3)), _w("b", (32,))])
    p = P.predicted(m, "t", ["analytic:t4"])
    assert [(o[1], o[2]) for o in p["ops"]] == [("conv2d", 1)] and p["as_run"]["fused"] == 1
    assert not m.graph.node[0].name  # (the model itself unchanged)


@pytest.mark.parametrize("s", ["full", "quick"])
def test_the_committed_predictions_price_each_file_as_the_executor_runs_it(s):
    """Every committed file is priced kernel by kernel as execute.plan_graph runs it (one priced op per kernel;
    no fused Relu or folded node priced), and where the executor and the search agree on the graph the
    prediction under the search's own cost model is the search's cost after."""
    man = manifest(s)
    assert "execute.plan_graph" in man["priced"]["how"]
    for m in man["models"]:
        for f, fe in m["files"].items():
            ar = fe["predicted"]["as_run"]
            assert "error" not in ar and ar["priced_ops"] == ar["kernels"], (f, ar)
            assert sum(o[2] for o in fe["predicted"]["ops"]) == ar["kernels"]
            relus = fe["op_types"].get("Relu", 0)
            assert sum(o[2] for o in fe["predicted"]["ops"] if o[1] == "relu") == relus - ar["fused"], f
    if s == "full":  # e.g. ResNet-50's analytic:t4 graph: every Relu fused, as the search priced it
        m = next(x for x in man["models"] if x["name"] == "resnet50")
        for v in ("opt-analytic-t4", "opt-analytic-h100", "opt-cuda-h200"):
            e = m["variants"][v]
            got = m["files"][e["file"]]["predicted"]["total_ms"][e["search"]["target"]]
            assert got == pytest.approx(e["search"]["cost_after_ms"], rel=1e-9), v
