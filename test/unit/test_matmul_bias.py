"""Biased matmuls: the operator (``matmul(x, W, b)``: one bias value per output column), its export
(Gemm for 2-D, MatMul + Add otherwise) in onnxruntime, the pre-search folding of a bias add into the
matmul it follows (``passes.matmul_bias``), what is left alone, and the ``matmul-bias`` rules merging
two linear layers on one input end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect import specs
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.passes.prepare.fold_matmul_bias import fuse_matmul_bias
from unit_helpers import assert_same_in_onnxruntime, run_function


def test_reference_semantics_and_shape_check():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    (y,) = specs.evaluate("matmul", [x, w, b], {"activation": "relu"})
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0))
    x3 = rng.standard_normal((2, 3, 4))
    np.testing.assert_allclose(specs.evaluate("matmul", [x3, w, b], {"activation": "none"})[0], x3 @ w + b)
    with pytest.raises(specs.SpecError, match="bias shape"):
        specs.infer_shapes("matmul", [(3, 4), (4, 5), (4,)], {"activation": "none"})


def _w(name, shape, rng):
    return (f'%{name} = "taso.weight"() {{name = "{name}", value = dense<{rng.standard_normal(1)[0]:.4f}> : '
            f'tensor<{shape}xf32>}} : () -> tensor<{shape}xf32>')


def _mm(name, x, w, xs, ws, ys, act="none"):
    return (f'%{name} = "taso.matmul"(%{x}, %{w}) {{activation = "{act}"}} : (tensor<{xs}xf32>, tensor<{ws}xf32>) '
            f'-> tensor<{ys}xf32>')


def _add(name, a, b, at, bt, yt):
    return f'%{name} = "taso.ewadd"(%{a}, %{b}) : (tensor<{at}xf32>, tensor<{bt}xf32>) -> tensor<{yt}xf32>'


def test_bias_adds_fold_and_the_rest_is_left_alone():
    rng = np.random.default_rng(1)
    text = f"""
func.func @f(%x: tensor<2x4xf32>, %x3: tensor<2x3x4xf32>) -> (tensor<2x5xf32>, tensor<2x3x5xf32>, tensor<2x5xf32>,
    tensor<2x5xf32>, tensor<2x5xf32>, tensor<2x5xf32>, tensor<2x5xf32>) {{
  {_w("w", "4x5", rng)}
  {_w("b", "5", rng)}
  {_w("row", "1x5", rng)}
  {_mm("m1", "x", "w", "2x4", "4x5", "2x5")}
  {_add("a1", "m1", "b", "2x5", "5", "2x5")}
  {_mm("m2", "x3", "w", "2x3x4", "4x5", "2x3x5")}
  {_add("a2", "b", "m2", "5", "2x3x5", "2x3x5")}
  {_mm("m3", "x", "w", "2x4", "4x5", "2x5")}
  {_add("a3", "m3", "b", "2x5", "5", "2x5")}
  {_mm("m4", "x", "w", "2x4", "4x5", "2x5")}
  {_add("a4", "m4", "row", "2x5", "1x5", "2x5")}
  {_mm("m5", "x", "w", "2x4", "4x5", "2x5", act="relu")}
  {_add("a5", "m5", "b", "2x5", "5", "2x5")}
  return %a1, %a2, %a3, %m3, %a4, %a5, %m1 : tensor<2x5xf32>, tensor<2x3x5xf32>, tensor<2x5xf32>, tensor<2x5xf32>,
    tensor<2x5xf32>, tensor<2x5xf32>, tensor<2x5xf32>
}}
"""
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        feeds = [rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32)]
        want = run_function(f, feeds)
        # m1 has two uses (a1 and the return), m3 too, a4's bias is a row (1x5), m5 has a relu: only a2's
        # (3-D, bias on the left) folds
        assert fuse_matmul_bias(f) == 1
        assert m.operation.verify()
        kinds = [o.operation.name for o in f.regions[0].blocks[0].operations]
        assert kinds.count("taso.ewadd") == 4 and kinds.count("taso.matmul") == 5
        for a, b in zip(run_function(f, feeds), want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _linear_model(layers: int, relu: bool, gemm: bool, lead=(2,), k=16, n=8) -> onnx.ModelProto:
    """``layers`` linear layers reading one input (Gemm, or MatMul + Add), each optionally with relu."""
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.3).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}"))
        y = f"y{i}"
        if gemm:
            nodes.append(helper.make_node("Gemm", ["x", f"w{i}", f"b{i}"], [f"p{i}" if relu else y]))
        else:
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"p{i}" if relu else y]))
        if relu:
            nodes.append(helper.make_node("Relu", [f"p{i}"], [y]))
        outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, list(lead) + [n]))
    g = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(lead) + [k])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _optimize(tmp_path, model, *opts):
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, src)
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), *opts, "-o", str(out),
                        f"--taso-report={rep}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return src, out, json.loads(rep.read_text())["functions"][0]


@pytest.mark.parametrize("gemm", [True, False])
def test_two_linear_layers_on_one_input_merge(tmp_path, gemm):
    """Gemm (or MatMul + Add) + Relu twice on one input: the bias adds fold, relu fuses and the two
    biased matmuls merge into one Gemm (weights and biases concatenated) and a split."""
    src, out, fr = _optimize(tmp_path, _linear_model(2, relu=True, gemm=gemm), "--taso-search")
    kinds = [n.op_type for n in onnx.load(out).graph.node]
    assert kinds.count("Gemm") == 1 and "Split" in kinds and "Add" not in kinds and "MatMul" not in kinds, kinds
    assert fr["cost_after_ms"] < fr["cost_before_ms"]
    assert any(r.startswith("M") for r in fr["applied"]), fr["applied"]
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)}
    assert_same_in_onnxruntime(src, out, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead", [(2,), (2, 3)])
def test_a_biased_matmul_the_search_leaves_exports_as_it_came(tmp_path, lead):
    """budget 0: nothing is rewritten, the bias is folded and written back (Gemm for 2-D, MatMul + Add
    for 3-D), and the numbers are the original's."""
    src, out, fr = _optimize(tmp_path, _linear_model(1, relu=False, gemm=False, lead=lead),
                             "--pass-pipeline=builtin.module(taso-search{budget=0})")
    assert fr["matmul_biases_fused"] == 1
    kinds = sorted(n.op_type for n in onnx.load(out).graph.node)
    assert kinds == (["Gemm"] if len(lead) == 1 else ["Add", "MatMul"]), kinds
    feeds = {"x": np.random.default_rng(3).standard_normal(list(lead) + [16]).astype(np.float32)}
    assert_same_in_onnxruntime(src, out, feeds, rtol=1e-5, atol=1e-5)


class _Costs:
    """A cost model stub: a biased matmul costs ``fused``, any other op 1."""

    def __init__(self, fused):
        self.fused = fused

    def cost(self, sig):
        return self.fused if sig.kind == "matmul" and len(sig.in_shapes) == 3 else 1.0


@pytest.mark.parametrize("fused,folded", [(1.5, 1), (2.5, 0)])
def test_with_a_cost_model_only_what_gains_is_folded(fused, folded):
    rng = np.random.default_rng(4)
    text = f"""
func.func @f(%x: tensor<2x4xf32>) -> tensor<2x5xf32> {{
  {_w("w", "4x5", rng)}
  {_w("b", "5", rng)}
  {_mm("m1", "x", "w", "2x4", "4x5", "2x5")}
  {_add("a1", "m1", "b", "2x5", "5", "2x5")}
  return %a1 : tensor<2x5xf32>
}}
"""
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        assert fuse_matmul_bias(m.body.operations[0].operation, _Costs(fused)) == folded
        assert m.operation.verify()
