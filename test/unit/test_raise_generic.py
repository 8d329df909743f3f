"""Generic ONNX ops before the search: constants folded (``fold_generic``), Squeeze/Unsqueeze/Flatten
raised to reshapes and gathers of every index to a split (``raise_generic``), repeated ops merged
(``cse``): the gather proof (and that it can fail), what is folded or raised and what is left alone, and end to end through
``taso-opt --taso-search`` in onnxruntime (outputs equal, the report counts them)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect.mlir import ir

from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.ops import dense_array, function_dce
from taso_mlir.passes.prepare import raise_generic as R
from taso_mlir.passes.prepare.fold_constants import MAX_ELEMENTS, fold_generic
from unit_helpers import assert_same_in_onnxruntime, run_function


def test_gather_proof():
    import z3

    result, cases = R.prove()
    assert result == z3.unsat, cases
    assert cases > 500


def test_the_gather_proof_fails_on_a_wrong_piece(monkeypatch):
    import z3

    monkeypatch.setattr(R, "piece_of", lambda sizes, index: len(sizes) - 1 - index)
    result, case = R.prove(max_rank=2, max_dim=3)
    assert result == z3.sat and case[0] == "gather", case


def _fold(text: str):
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        n = fold_generic(f, "folded_", set())
        function_dce(f)
        assert f.verify()
        ops = [o.operation for o in f.regions[0].blocks[0].operations]
        values = {str(ir.StringAttr(o.attributes["name"]).value): dense_array(o.attributes["value"])
                  for o in ops if o.name == "taso.weight"}
        return n, [o.name for o in ops], values


def _applied(text: str, apply, *inputs) -> tuple:
    """Parse the one function of ``text``, call ``apply(f)``, remove dead ops and verify: (``apply``'s
    result, the op names left, the function's outputs on ``inputs`` with the reference semantics)."""
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        n = apply(f)
        function_dce(f)
        assert f.verify()
        names = [o.operation.name for o in f.regions[0].blocks[0].operations]
        outs = run_function(f, list(inputs)) if inputs else None
    return n, names, outs


SCALE = """func.func @f(%x: tensor<2x64xf32>) -> tensor<2x64xf32> {
  %s = "onnx.Shape"(%x) {start = -1 : si64} : (tensor<2x64xf32>) -> tensor<1xsi64>
  %c = "onnx.Cast"(%s) {to = 1 : si64} : (tensor<1xsi64>) -> tensor<1xf32>
  %q = "onnx.Sqrt"(%c) : (tensor<1xf32>) -> tensor<1xf32>
  %r = "onnx.Reciprocal"(%q) : (tensor<1xf32>) -> tensor<1xf32>
  %y = "taso.ewmul"(%x, %r) : (tensor<2x64xf32>, tensor<1xf32>) -> tensor<2x64xf32>
  return %y : tensor<2x64xf32>
}"""


def test_shape_arithmetic_folds_to_one_weight():
    """nn.MultiheadAttention's scale: Shape of a static tensor, then arithmetic on it."""
    n, names, values = _fold(SCALE)
    assert n == 4
    assert names == ["taso.weight", "taso.ewmul", "func.return"]
    (v,) = values.values()
    assert v.dtype == np.float32 and v.tolist() == [np.float32(1 / 8)]


def test_what_is_not_folded():
    """Randomness, results over MAX_ELEMENTS, ops on an activation, other domains."""
    big = int(np.ceil(np.sqrt(MAX_ELEMENTS))) + 1
    text = f"""func.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<{big}x{big}xf32>, tensor<4xf32>, tensor<4xf32>) {{
  %w = "taso.weight"() {{name = "w", value = dense<1.0> : tensor<4xf32>}} : () -> tensor<4xf32>
  %r = "onnx.RandomNormalLike"(%w) : (tensor<4xf32>) -> tensor<4xf32>
  %shape = "taso.weight"() {{name = "s", value = dense<{big}> : tensor<2xsi64>}} : () -> tensor<2xsi64>
  %b = "onnx.ConstantOfShape"(%shape) : (tensor<2xsi64>) -> tensor<{big}x{big}xf32>
  %e = "onnx.Exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %d = "onnx.Gelu"(%w) {{taso.domain = "com.microsoft"}} : (tensor<4xf32>) -> tensor<4xf32>
  return %r, %b, %e, %d : tensor<4xf32>, tensor<{big}x{big}xf32>, tensor<4xf32>, tensor<4xf32>
}}"""
    n, names, _ = _fold(text)
    assert n == 0
    assert {"onnx.RandomNormalLike", "onnx.ConstantOfShape", "onnx.Exp", "onnx.Gelu"} <= set(names)


def test_an_omitted_optional_operand_is_no_obstacle():
    """Pad(weight, pads, <no value>): folded, the missing constant value taking its default."""
    text = """func.func @f() -> tensor<4xf32> {
  %w = "taso.weight"() {name = "w", value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
  %p = "taso.weight"() {name = "p", value = dense<1> : tensor<2xsi64>} : () -> tensor<2xsi64>
  %none = "onnx.NoValue"() {value} : () -> none
  %y = "onnx.Pad"(%w, %p, %none) : (tensor<2xf32>, tensor<2xsi64>, none) -> tensor<4xf32>
  return %y : tensor<4xf32>
}"""
    n, _names, values = _fold(text)
    assert n == 1
    assert [v.tolist() for k, v in values.items() if k.startswith("folded_")] == [[0.0, 1.0, 2.0, 0.0]]


HEADS = """func.func @f(%x: tensor<4x3x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>) {
  %t = "taso.transpose"(%x) {perm = array<i64: 1, 0, 2>} : (tensor<4x3x8xf32>) -> tensor<3x4x8xf32>
  %i0 = "taso.weight"() {name = "i0", value = dense<0> : tensor<si64>} : () -> tensor<si64>
  %i1 = "taso.weight"() {name = "i1", value = dense<-2> : tensor<si64>} : () -> tensor<si64>
  %i2 = "taso.weight"() {name = "i2", value = dense<2> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %a = "onnx.Gather"(%t, %i0) {axis = 0 : si64} : (tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>
  %b = "onnx.Gather"(%t, %i1) {axis = 0 : si64} : (tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>
  %c = "onnx.Gather"(%x, %i2) {axis = -2 : si64} : (tensor<4x3x8xf32>, tensor<1xsi64>) -> tensor<4x1x8xf32>
  return %a, %b, %c : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>
}"""


def test_gathers_of_every_index_become_a_split():
    """Indices 0 and -2 (= 1) of an axis of 3 are not all of it: nothing changes; add index 2 and the
    three are one split."""
    def names_after(text):
        return _applied(text, R.gathers_to_split)[:2]

    n, names = names_after(HEADS)
    assert n == 0 and names.count("onnx.Gather") == 3
    full = HEADS.replace("  %a = ", '  %i3 = "taso.weight"() {name = "i3", value = dense<2> : tensor<si64>} : () -> '
                                    'tensor<si64>\n  %g = "onnx.Gather"(%t, %i3) {axis = 0 : si64} : '
                                    '(tensor<3x4x8xf32>, tensor<si64>) -> tensor<4x8xf32>\n  %a = ')
    full = full.replace("-> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>)",
                        "-> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>, tensor<4x8xf32>)")
    full = full.replace("return %a, %b, %c : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>",
                        "return %a, %b, %c, %g : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x1x8xf32>, tensor<4x8xf32>")
    n, names = names_after(full)
    # the three on axis 0 of %t; the one on axis 1 of %x is alone on its axis
    assert n == 3 and names.count("onnx.Gather") == 1 and names.count("taso.split") == 1
    assert names.count("taso.reshape") == 3


def test_views_become_reshapes():
    text = """func.func @f(%x: tensor<2x3xf32>) -> tensor<6x1xf32> {
  %ax = "taso.weight"() {name = "ax", value = dense<0> : tensor<1xsi64>} : () -> tensor<1xsi64>
  %u = "onnx.Unsqueeze"(%x, %ax) : (tensor<2x3xf32>, tensor<1xsi64>) -> tensor<1x2x3xf32>
  %r = "taso.relu"(%u) : (tensor<1x2x3xf32>) -> tensor<1x2x3xf32>
  %s = "onnx.Squeeze"(%r, %ax) : (tensor<1x2x3xf32>, tensor<1xsi64>) -> tensor<2x3xf32>
  %t = "taso.transpose"(%s) {perm = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %f = "onnx.Flatten"(%t) {axis = 2 : si64} : (tensor<3x2xf32>) -> tensor<6x1xf32>
  return %f : tensor<6x1xf32>
}"""
    x = np.random.default_rng(1).standard_normal((2, 3))
    n, names, (y,) = _applied(text, R.views_to_reshapes, x)
    assert n == 3
    assert names == ["taso.reshape", "taso.relu", "taso.reshape", "taso.transpose", "taso.reshape", "func.return"]
    np.testing.assert_array_equal(y, np.maximum(x, 0).T.reshape(6, 1))


def test_a_squeeze_of_axes_given_at_run_time_stays():
    """onnxruntime checks axes that come from an input (a wrong one is an error); a reshape would not."""
    text = """func.func @f(%x: tensor<2x1x3xf32>, %ax: tensor<1xsi64>) -> tensor<2x3xf32> {
  %s = "onnx.Squeeze"(%x, %ax) : (tensor<2x1x3xf32>, tensor<1xsi64>) -> tensor<2x3xf32>
  return %s : tensor<2x3xf32>
}"""
    assert _applied(text, R.views_to_reshapes)[0] == 0


# ------------------------------------------------------------------------------------------------
# end to end


def _mha_like() -> onnx.ModelProto:
    """A packed projection unflattened, transposed and taken apart by three Gathers (nn.MultiheadAttention's
    export), the scale computed from a Shape, an Unsqueeze/Squeeze pair around the transpose."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32), "w")
    inits = [w, numpy_helper.from_array(np.array([2, 4, 3, 16], np.int64), "shape3"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([3], np.int64), "ax3"),
             numpy_helper.from_array(np.array([-1], np.int64), "start"),
             numpy_helper.from_array(np.array([2**62], np.int64), "end")]
    inits += [numpy_helper.from_array(np.array(i, np.int64), f"i{i}") for i in range(3)]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Reshape", ["p", "shape3"], ["p4"]),
        helper.make_node("Unsqueeze", ["p4", "ax0"], ["p5"]),
        helper.make_node("Transpose", ["p5"], ["t5"], perm=[3, 1, 2, 0, 4]),
        helper.make_node("Squeeze", ["t5", "ax3"], ["t4"]),
        helper.make_node("Gather", ["t4", "i0"], ["q"], axis=0),
        helper.make_node("Gather", ["t4", "i1"], ["k"], axis=0),
        helper.make_node("Gather", ["t4", "i2"], ["v"], axis=0),
        helper.make_node("Shape", ["q"], ["qs"]),
        helper.make_node("Slice", ["qs", "start", "end"], ["d"]),
        helper.make_node("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["df"], ["sd"]),
        helper.make_node("Reciprocal", ["sd"], ["scale"]),
        helper.make_node("Mul", ["q", "scale"], ["qs2"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["qs2", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v"], ["y"]),
    ]
    g = helper.make_graph(nodes, "mha", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_end_to_end_in_onnxruntime(tmp_path):
    src, out = tmp_path / "mha.onnx", tmp_path / "out.onnx"
    model = _mha_like()
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, src)
    p = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "--taso-report",
                        "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "5 generic ONNX ops with constant results" in p.stderr, p.stderr
    assert "taso-raise-views: 2 Squeeze/Unsqueeze/Flatten raised to reshapes" in p.stderr, p.stderr
    assert "taso-raise-gathers: 3 Gathers of every index of an axis raised to splits" in p.stderr, p.stderr
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert not {"Gather", "Shape", "Sqrt", "Squeeze", "Unsqueeze"} & set(ops), ops
    assert ops.count("Split") == 1, ops
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4, 16)).astype(np.float32)}
    assert_same_in_onnxruntime(src, out, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Pad", "Resize"])
def test_an_op_with_an_omitted_optional_input_goes_through_the_search(tmp_path, op):
    """torch writes "" for unused optional inputs (F.pad's value, Upsample's roi, LSTM's lengths)."""
    if op == "Pad":
        node = helper.make_node("Pad", ["r", "pads", ""], ["y"])
        init = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
        out_shape = [1, 2, 6, 6]
    else:
        node = helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="nearest")
        init = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
        out_shape = [1, 2, 8, 8]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [init])
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    p = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "onnxruntime: ok" in p.stderr
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["Relu", op]


def test_repeated_ops_are_merged():
    """The padding mask reshaped and expanded once per layer: one of each is left. A random op and a
    custom-domain op are never merged."""
    from taso_mlir.passes.prepare.merge_repeats import eliminate_common_subexpressions

    text = """func.func @f(%m: tensor<2x8xf32>, %x: tensor<2x4x8x8xf32>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>) {
  %s = "taso.weight"() {name = "s", value = dense<[2, 4, 1, 8]> : tensor<4xsi64>} : () -> tensor<4xsi64>
  %r1 = "taso.reshape"(%m) {shape = array<i64: 2, 1, 1, 8>} : (tensor<2x8xf32>) -> tensor<2x1x1x8xf32>
  %e1 = "onnx.Expand"(%r1, %s) : (tensor<2x1x1x8xf32>, tensor<4xsi64>) -> tensor<2x4x1x8xf32>
  %a1 = "taso.ewadd"(%x, %e1) : (tensor<2x4x8x8xf32>, tensor<2x4x1x8xf32>) -> tensor<2x4x8x8xf32>
  %r2 = "taso.reshape"(%m) {shape = array<i64: 2, 1, 1, 8>} : (tensor<2x8xf32>) -> tensor<2x1x1x8xf32>
  %e2 = "onnx.Expand"(%r2, %s) : (tensor<2x1x1x8xf32>, tensor<4xsi64>) -> tensor<2x4x1x8xf32>
  %a2 = "taso.ewadd"(%a1, %e2) : (tensor<2x4x8x8xf32>, tensor<2x4x1x8xf32>) -> tensor<2x4x8x8xf32>
  %n1 = "onnx.RandomNormalLike"(%m) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %n2 = "onnx.RandomNormalLike"(%m) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %c1 = "onnx.Gelu"(%m) {taso.domain = "com.microsoft"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %c2 = "onnx.Gelu"(%m) {taso.domain = "com.microsoft"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %a1, %a2, %n1, %n2, %c1, %c2 : tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>
}"""
    n, names, _ = _applied(text, eliminate_common_subexpressions)
    assert n == 2
    assert names.count("taso.reshape") == 1 and names.count("onnx.Expand") == 1
    assert names.count("onnx.RandomNormalLike") == 2 and names.count("onnx.Gelu") == 2


def test_an_unbind_of_an_unbind_piece():
    """The second group gathers from a gather of the first: raised after it, from the value that
    replaced that gather (the group's data as collected is gone by then)."""
    text = """func.func @f(%x: tensor<2x2x4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<2x4xf32>) {
  %i0 = "taso.weight"() {name = "i0", value = dense<0> : tensor<si64>} : () -> tensor<si64>
  %i1 = "taso.weight"() {name = "i1", value = dense<1> : tensor<si64>} : () -> tensor<si64>
  %a = "onnx.Gather"(%x, %i0) {axis = 0 : si64} : (tensor<2x2x4xf32>, tensor<si64>) -> tensor<2x4xf32>
  %b = "onnx.Gather"(%x, %i1) {axis = 0 : si64} : (tensor<2x2x4xf32>, tensor<si64>) -> tensor<2x4xf32>
  %a0 = "onnx.Gather"(%a, %i0) {axis = 0 : si64} : (tensor<2x4xf32>, tensor<si64>) -> tensor<4xf32>
  %a1 = "onnx.Gather"(%a, %i1) {axis = 0 : si64} : (tensor<2x4xf32>, tensor<si64>) -> tensor<4xf32>
  return %a0, %a1, %b : tensor<4xf32>, tensor<4xf32>, tensor<2x4xf32>
}"""
    x = np.random.default_rng(1).standard_normal((2, 2, 4))
    n, _names, (a0, a1, b) = _applied(text, R.gathers_to_split, x)
    assert n == 4
    np.testing.assert_array_equal(a0, x[0, 0])
    np.testing.assert_array_equal(a1, x[0, 1])
    np.testing.assert_array_equal(b, x[1])
