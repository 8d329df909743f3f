"""Folding a multiply by a constant scalar into the weights it reaches (``passes/fold_scale.py``): each
step is proved with Z3; the pass keeps the values (reference semantics), folds only whole plans, leaves
what it cannot fold, and end to end a BERT-style ``/ sqrt(d)`` goes into the query projection with the
same numbers bit for bit in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.passes.prepare import fold_scale as FS
from unit_helpers import assert_same_in_onnxruntime, run_pass


def test_the_steps_are_proved():
    import z3

    assert FS.prove() == z3.unsat


def _w(name, shape, value, dims=None):
    t = f"tensor<{shape}xf32>" if shape else "tensor<f32>"
    return f'%{name} = "taso.weight"() {{name = "{name}", value = dense<{value}> : {t}}} : () -> {t}'


def _fold(f):
    return FS.fold_scalar_scales(f)


ATTENTION = f"""
func.func @f(%x: tensor<1x4x8xf32>, %k: tensor<1x2x2x4xf32>) -> tensor<1x2x4x4xf32> {{
  {_w("wq", "8x4", "[" + ",".join("[" + ",".join(str((i * 4 + j) % 7 - 3.0) for j in range(4)) + "]" for i in range(8)) + "]")}
  {_w("bq", "4", "[0.5, -1.0, 2.0, 0.25]")}
  {_w("s", "", "0.125")}
  %q = "taso.matmul"(%x, %wq, %bq) {{activation = "none"}} : (tensor<1x4x8xf32>, tensor<8x4xf32>, tensor<4xf32>) -> tensor<1x4x4xf32>
  %r = "taso.reshape"(%q) {{shape = array<i64: 1, 4, 2, 2>}} : (tensor<1x4x4xf32>) -> tensor<1x4x2x2xf32>
  %t = "taso.transpose"(%r) {{perm = array<i64: 0, 2, 1, 3>}} : (tensor<1x4x2x2xf32>) -> tensor<1x2x4x2xf32>
  %kt = "taso.transpose"(%k) {{perm = array<i64: 0, 1, 3, 2>}} : (tensor<1x2x2x4xf32>) -> tensor<1x2x4x2xf32>
  %scores = "taso.matmul"(%t, %k) {{activation = "none"}} : (tensor<1x2x4x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x4x4xf32>
  %y = "taso.smul"(%scores, %s) : (tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32>
  return %y : tensor<1x2x4x4xf32>
}}
"""


def test_attention_scale_goes_into_the_query_projection():
    names, done, before, after = run_pass(ATTENTION, _fold)
    assert done == 1 and "taso.smul" not in names
    assert names.count("taso.weight") == 2  # wq and bq, each replaced by its scaled copy
    np.testing.assert_array_equal(after[0], before[0])  # (a power of two: exact)


ROPE = f"""
func.func @f(%q: tensor<1x4x6xf32>, %p: tensor<1x4x6xf32>) -> (tensor<1x4x6xf32>, tensor<1x4x6xf32>) {{
  {_w("cos", "1x4x6", 0.75)}
  {_w("sin", "1x4x6", -0.5)}
  {_w("s", "", "0.42")}
  %a = "taso.ewmul"(%q, %cos) : (tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x6xf32>
  %b = "taso.ewmul"(%p, %sin) : (tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x6xf32>
  %c = "taso.ewadd"(%a, %b) : (tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x6xf32>
  %y = "taso.smul"(%c, %s) : (tensor<1x4x6xf32>, tensor<f32>) -> tensor<1x4x6xf32>
  %other = "taso.ewmul"(%p, %cos) : (tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x6xf32>
  return %y, %other : tensor<1x4x6xf32>, tensor<1x4x6xf32>
}}
"""


def test_a_rotary_embedding_takes_the_scale_in_its_tables():
    # both branches of the add take the factor; cos is shared with another op, so it is copied
    names, done, before, after = run_pass(ROPE, _fold)
    assert done == 1 and "taso.smul" not in names
    assert names.count("taso.weight") == 3  # cos (still used by %other), cos scaled, sin scaled
    for a, b in zip(after, before):  # (0.42 is not a power of two: the scaled tables are rounded once)
        np.testing.assert_allclose(a, b, rtol=1e-6)


PACKED = f"""
func.func @f(%x: tensor<4x8xf32>) -> (tensor<1x2x4x2xf32>, tensor<1x4x4xf32>, tensor<1x4x4xf32>) {{
  {_w("w", "8x12", "[" + ",".join("[" + ",".join(str((i * 12 + j) % 5 - 2.0) for j in range(12)) + "]" for i in range(8)) + "]")}
  {_w("b", "12", "[" + ",".join(str(j - 6.0) for j in range(12)) + "]")}
  {_w("s", "", "0.5")}
  %m = "taso.matmul"(%x, %w, %b) {{activation = "none"}} : (tensor<4x8xf32>, tensor<8x12xf32>, tensor<12xf32>) -> tensor<4x12xf32>
  %r = "taso.reshape"(%m) {{shape = array<i64: 1, 4, 12>}} : (tensor<4x12xf32>) -> tensor<1x4x12xf32>
  %p:3 = "taso.split"(%r) {{axis = 2 : i64, sizes = array<i64: 4, 4, 4>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>}} : (tensor<1x4x12xf32>) -> (tensor<1x4x4xf32>, tensor<1x4x4xf32>, tensor<1x4x4xf32>)
  %h = "taso.reshape"(%p#0) {{shape = array<i64: 1, 4, 2, 2>}} : (tensor<1x4x4xf32>) -> tensor<1x4x2x2xf32>
  %t = "taso.transpose"(%h) {{perm = array<i64: 0, 2, 1, 3>}} : (tensor<1x4x2x2xf32>) -> tensor<1x2x4x2xf32>
  %q = "taso.smul"(%t, %s) : (tensor<1x2x4x2xf32>, tensor<f32>) -> tensor<1x2x4x2xf32>
  %k = "taso.smul"(%p#1, %s) : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
  return %q, %k, %p#2 : tensor<1x2x4x2xf32>, tensor<1x4x4xf32>, tensor<1x4x4xf32>
}}
"""


def test_pieces_of_a_packed_projection_scale_their_columns():
    # GPT-2's packed Q, K, V: Q's and K's columns of the weight and bias are scaled, V's are not
    names, done, before, after = run_pass(PACKED, _fold)
    assert done == 2 and "taso.smul" not in names
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)  # (0.5: exact)


@pytest.mark.parametrize("case, body", [
    ("the scaled value has another use",
     '%m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>\n'
     '  %y = "taso.smul"(%m, %s) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>\n'
     '  %z = "taso.relu"(%m) : (tensor<2x4xf32>) -> tensor<2x4xf32>\n'
     '  return %y, %z : tensor<2x4xf32>, tensor<2x4xf32>'),
    ("a negative factor does not cross a relu",
     '%m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>\n'
     '  %r = "taso.relu"(%m) : (tensor<2x4xf32>) -> tensor<2x4xf32>\n'
     '  %y = "taso.smul"(%r, %n) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>\n'
     '  return %y, %r : tensor<2x4xf32>, tensor<2x4xf32>'),
    ("one branch of an add reaches no weight",
     '%m = "taso.matmul"(%x, %w) {activation = "none"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>\n'
     '  %a = "taso.ewadd"(%m, %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>\n'
     '  %y = "taso.smul"(%a, %s) : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>\n'
     '  return %y, %x : tensor<2x4xf32>, tensor<2x4xf32>'),
])
def test_what_cannot_be_folded_stays(case, body):
    text = f"""
func.func @f(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {{
  {_w("w", "4x4", 0.5)}
  {_w("s", "", "0.25")}
  {_w("n", "", "-0.25")}
  {body}
}}
"""
    names, done, before, after = run_pass(text, _fold)
    assert done == 0 and "taso.smul" in names, case
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


def _attention_model(div: float) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "wq"),
             numpy_helper.from_array((rng.standard_normal(16) * 0.3).astype(np.float32), "bq"),
             numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "wk"),
             numpy_helper.from_array(np.array([1, 8, 2, 8], np.int64), "heads"),
             numpy_helper.from_array(np.array(div, np.float32), "d")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["q0", "bq"], ["q1"]),
             helper.make_node("Reshape", ["q1", "heads"], ["q2"]),
             helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["x", "wk"], ["k0"]), helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
             helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Div", ["s0", "d"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("div, folded", [(8.0, True), (3.0, False)])
def test_bert_scale_end_to_end(tmp_path, div, folded):
    import json
    import subprocess
    import sys

    src, out, rep = tmp_path / "a.onnx", tmp_path / "a.opt.onnx", tmp_path / "r.json"
    onnx.save(_attention_model(div), src)
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "-o", str(out),
                        f"--taso-report={rep}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    kinds = [n.op_type for n in onnx.load(out).graph.node]
    # / 8 is * 0.125 bit for bit and goes into wq and bq; / 3 has no exact reciprocal and stays a Div
    assert (fr["divs_raised"], fr["scales_folded"], "Div" in kinds) == ((1, 1, False) if folded else (0, 0, True)), kinds
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 16)).astype(np.float32)}
    assert_same_in_onnxruntime(src, out, feeds, rtol=0, atol=0 if folded else 1e-6)


def test_division_by_a_power_of_two_is_the_multiply_bit_for_bit():
    # (the reason div_to_smul is exact: both are the correctly rounded x * 2**-k, subnormals included)
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000), rng.standard_normal(1000) * 1e-40,
                        [np.inf, -np.inf, 0.0, -0.0, 3e38]]).astype(np.float32)
    with np.errstate(over="ignore"):
        for k in range(-4, 5):
            c = np.float32(2.0 ** k)
            np.testing.assert_array_equal(x / c, x * np.float32(1.0 / c))


def test_a_scale_that_would_overflow_or_underflow_a_float16_weight_is_not_folded():
    # 5000 * 16 is past float16's 65504; 1e-4 / 8 falls below its normal range (precision lost)
    for value, factor in (("5000.0", "16.0"), ("1.0e-4", "0.125")):
        text = f"""
func.func @f(%x: tensor<2x4xf16>) -> tensor<2x4xf16> {{
  %w = "taso.weight"() {{name = "w", value = dense<{value}> : tensor<4x4xf16>}} : () -> tensor<4x4xf16>
  %s = "taso.weight"() {{name = "s", value = dense<{factor}> : tensor<f16>}} : () -> tensor<f16>
  %m = "taso.matmul"(%x, %w) {{activation = "none"}} : (tensor<2x4xf16>, tensor<4x4xf16>) -> tensor<2x4xf16>
  %y = "taso.smul"(%m, %s) : (tensor<2x4xf16>, tensor<f16>) -> tensor<2x4xf16>
  return %y : tensor<2x4xf16>
}}
"""
        from taso_mlir.dialect.mlir import ir
        from taso_mlir.dialect.context import make_context

        with make_context(), ir.Location.unknown():
            m = ir.Module.parse(text)
            assert FS.fold_scalar_scales(m.body.operations[0].operation) == 0, value


def test_a_division_whose_reciprocal_is_not_a_normal_number_stays(tmp_path):
    # x / 2**-16 in float16: 65536 is not a float16 number
    text = """
func.func @f(%x: tensor<4xf16>) -> tensor<4x4xf16> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<4x4xf16>} : () -> tensor<4x4xf16>
  %c = "taso.weight"() {name = "c", value = dense<1.52587890625e-05> : tensor<f16>} : () -> tensor<f16>
  %r = "taso.reshape"(%x) {shape = array<i64: 1, 4>} : (tensor<4xf16>) -> tensor<1x4xf16>
  %m = "taso.matmul"(%r, %w) {activation = "none"} : (tensor<1x4xf16>, tensor<4x4xf16>) -> tensor<1x4xf16>
  %y = "onnx.Div"(%m, %c) : (tensor<1x4xf16>, tensor<f16>) -> tensor<1x4xf16>
  %z = "taso.reshape"(%y) {shape = array<i64: 4, 1>} : (tensor<1x4xf16>) -> tensor<4x1xf16>
  %b = "taso.reshape"(%z) {shape = array<i64: 4, 1>} : (tensor<4x1xf16>) -> tensor<4x1xf16>
  %o = "taso.matmul"(%b, %r) {activation = "none"} : (tensor<4x1xf16>, tensor<1x4xf16>) -> tensor<4x4xf16>
  return %o : tensor<4x4xf16>
}
"""
    from taso_mlir.dialect.mlir import ir
    from taso_mlir.dialect.context import make_context

    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        assert FS.div_to_smul(m.body.operations[0].operation) == 0
