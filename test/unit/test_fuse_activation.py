"""taso-fuse-activation: the Z3 proof, the cost model's say over each site, ONNX models end to end in
onnxruntime (the same ops written back, the same numbers), and the report's prepared baseline (the
search's reduction is measured from the fused function, not from the importer's unfused one). The
numeric checks at adversarial shapes are in test_pass_identities.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.mlir import ir
from taso_mlir.passes.cost.oracle import get_cost_model
from taso_mlir.passes.prepare import fuse_activation as FA

_CONV_RELU = """
func.func @f(%x: tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<8x8x3x3xf32>} : () -> tensor<8x8x3x3xf32>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x8x7x7xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x7x7xf32>
  %r = "taso.relu"(%c) : (tensor<1x8x7x7xf32>) -> tensor<1x8x7x7xf32>
  return %r : tensor<1x8x7x7xf32>
}
"""


def test_fusion_is_proved():
    import z3

    assert FA.prove() == z3.unsat


def test_proof_refutes_a_wrong_activation(monkeypatch):
    """The proof can fail: with the activation taken as leaky (0.5 v below 0), Z3 finds the difference."""
    import z3

    monkeypatch.setattr(FA, "_activation", lambda v: z3.If(v < 0, v / 2, v))
    assert FA.prove() == z3.sat
    assert FA.prove_shapes()


class _Priced:
    """A cost model pricing a fused conv at ``fused`` and the unfused conv and a relu at 1 each."""

    name = "test"

    def __init__(self, fused: float):
        self.fused = fused

    def cost(self, sig) -> float:
        if sig.kind == "conv2d" and dict(sig.attrs)["activation"] == "relu":
            return self.fused
        return 1.0


def _fuse(text: str, cost_model) -> tuple[int, str]:
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        n = FA.fuse_activations(m.operation, cost_model)
        assert m.operation.verify()
        return n, str(m)


def test_the_cost_model_decides():
    """Fused where the fused conv costs no more than the two ops apart (2 here), left where it costs more."""
    assert _fuse(_CONV_RELU, _Priced(2.0))[0] == 1
    n, text = _fuse(_CONV_RELU, _Priced(2.5))
    assert n == 0 and "taso.relu" in text
    # every shipped analytic model prices the fused conv below the two apart
    for spec in ("analytic:t4", "analytic:h100", "analytic:cpu"):
        assert _fuse(_CONV_RELU, get_cost_model(spec))[0] == 1, spec


def _model() -> onnx.ModelProto:
    """Conv + Relu twice (one with a bias, one strided), a Gemm + Relu and a MatMul + Relu, and a Conv
    whose result is an output too (its Relu stays an op of its own)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(f32), n) for n, s in
             (("w1", (8, 4, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 3, 3)), ("w3", (8, 8, 1, 1)), ("g", (72, 16)),
              ("gb", (16,)), ("m", (16, 16)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"]),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Flatten", ["r3"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("MatMul", ["hr", "m"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"])]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16]),
                           helper.make_tensor_value_info("c3", TensorProto.FLOAT, [1, 8, 3, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _search(src, out, rep) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "-o", str(out),
                           f"--pass-pipeline=builtin.module(taso-search{{cost-model=analytic:t4 report={rep}}})"],
                          capture_output=True, text=True)


def test_onnx_model_end_to_end(tmp_path):
    """The Relus after the first two convs, the Gemm and the MatMul fuse; the one after the conv that is
    an output too stays. The optimized model has as many Relus (the export writes the fused activation
    back as Relu) and gives the input model's outputs in onnxruntime. The report's prepared cost is the
    fused function's, and the search's reduction is from it."""
    import onnxruntime as ort

    src, out, rep = tmp_path / "net.onnx", tmp_path / "net.opt.onnx", tmp_path / "report.json"
    onnx.save(_model(), src)
    before = src.read_bytes()
    r = _search(src, out, rep)
    assert r.returncode == 0, r.stderr
    assert src.read_bytes() == before
    full = json.loads(rep.read_text())
    fr = full["functions"][0]
    assert fr["relus_fused"] == 4
    assert fr["cost_prepared_ms"] < fr["cost_before_ms"]
    assert fr["cost_after_ms"] <= fr["cost_prepared_ms"]
    assert full["cost_prepared_ms"] == fr["cost_prepared_ms"]
    kinds = [n.op_type for n in onnx.load(out).graph.node]
    assert kinds.count("Relu") == 5, kinds
    rng = np.random.default_rng(1)
    sa = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = [o.name for o in sa.get_outputs()]
    for _ in range(3):
        feeds = {"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)}
        ya = dict(zip(names, sa.run(None, feeds)))
        yb = dict(zip([o.name for o in sb.get_outputs()], sb.run(None, feeds)))
        for k in names:
            assert np.any(ya[k] == 0) or k == "c3"
            np.testing.assert_allclose(yb[k], ya[k], rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ya[k]))))


def test_prepared_cost_is_the_fused_function(tmp_path):
    """The report's prepared cost is exactly the fused function's cost as written; the cost before is
    the importer's unfused one."""
    from taso_mlir.passes.search import tgraph as T

    src, rep = tmp_path / "f.mlir", tmp_path / "r.json"
    src.write_text(_CONV_RELU)
    r = _search(src, tmp_path / "o.mlir", rep)
    assert r.returncode == 0, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    cm = get_cost_model("analytic:t4")
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(_CONV_RELU)
        f = m.body.operations[0].operation
        unfused = T.from_function(f, T.Builder(cm, split_trees=False))[0].cost
        FA.fuse_function(f, cm)
        fused = T.from_function(f, T.Builder(cm, split_trees=False))[0].cost
    assert fr["cost_before_ms"] == unfused and fr["cost_prepared_ms"] == fused and fused < unfused
