"""Chains of reshapes and transposes made one transpose (``passes.layout_chains``): the plan is checked on
every small chain (and the check fails on a wrong plan), plans of the chains that matter, the pass on IR
against the reference semantics, what it leaves alone."""

from __future__ import annotations

import numpy as np

from taso_mlir.passes.cleanup import layout_chains as LC
from taso_mlir.passes.cost.oracle import get_cost_model
from unit_helpers import run_pass


def test_proof():
    ok, cases = LC.prove()
    assert ok, cases
    assert cases["chains"] > 50000 and cases["rows"] > 500, cases


def test_the_proof_fails_on_a_wrong_row_move(monkeypatch):
    """Row steps moved across the matmul without resizing the last axis are refuted."""
    monkeypatch.setattr(LC, "_with_last", lambda steps, n: steps)
    ok, case = LC.prove(max_rank=2, max_dim=3)
    assert not ok and case


def test_the_proof_fails_on_a_wrong_plan(monkeypatch):
    right = LC.chain_plan

    def wrong(shape, steps):
        plan = right(shape, steps)
        if plan is None or len(plan[1]) < 2:
            return plan
        fine, perm, final = plan
        return fine, perm[::-1], final
    monkeypatch.setattr(LC, "chain_plan", wrong)
    ok, case = LC.prove(max_rank=2, max_dim=3)
    assert not ok and case


def test_plans():
    # nn.MultiheadAttention after the layout lifting: Q/K/V first, then heads first
    assert LC.chain_plan([1, 128, 2, 3, 512], [("transpose", [3, 1, 2, 0, 4]), ("reshape", [384, 16, 64]),
                                               ("transpose", [1, 0, 2])]) == \
        ([128, 2, 3, 8, 64], [1, 3, 2, 0, 4], [16, 384, 64])
    # transposes that cancel through a reshape that keeps the moved axes whole: one reshape
    assert LC.chain_plan([4, 6], [("transpose", [1, 0]), ("reshape", [2, 3, 4]), ("transpose", [2, 0, 1])]) == \
        ([24], [0], [4, 2, 3])
    # a reshape after the last transpose needs no fine axes
    assert LC.chain_plan([2, 3], [("transpose", [1, 0]), ("reshape", [2, 3])]) == ([2, 3], [1, 0], [2, 3])
    # a reshape between two transposes that cuts an axis of 3 into 2 x ...: no plan
    assert LC.chain_plan([2, 3], [("transpose", [1, 0]), ("reshape", [2, 3]), ("transpose", [1, 0])]) is None


CHAIN = """func.func @f(%x: tensor<8x24xf32>) -> (tensor<2x24x4xf32>, tensor<24x8xf32>) {
  %r = "taso.reshape"(%x) {shape = array<i64: 8, 3, 8>} : (tensor<8x24xf32>) -> tensor<8x3x8xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 1, 0, 2>} : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
  %r2 = "taso.reshape"(%t) {shape = array<i64: 24, 2, 4>} : (tensor<3x8x8xf32>) -> tensor<24x2x4xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 1, 0, 2>} : (tensor<24x2x4xf32>) -> tensor<2x24x4xf32>
  %u = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<8x24xf32>) -> tensor<24x8xf32>
  %v = "taso.relu"(%u) : (tensor<24x8xf32>) -> tensor<24x8xf32>
  return %t2, %v : tensor<2x24x4xf32>, tensor<24x8xf32>
}"""


def test_the_pass_on_ir():
    names, n, before, after = run_pass(CHAIN, lambda f: LC.compose_layout_chains(f, get_cost_model("analytic")))
    assert n == 1  # the chain of four; the lone transpose before the relu is left
    assert names == ["taso.reshape", "taso.transpose", "taso.reshape", "taso.transpose", "taso.relu", "func.return"]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_a_shared_intermediate_ends_the_chain():
    """The first transpose's result is also returned: the chain is only what follows it (one transpose),
    so nothing is composed."""
    text = CHAIN.replace("-> (tensor<2x24x4xf32>, tensor<24x8xf32>)", "-> (tensor<2x24x4xf32>, tensor<3x8x8xf32>)")
    text = text.replace("return %t2, %v : tensor<2x24x4xf32>, tensor<24x8xf32>",
                        "return %t2, %t : tensor<2x24x4xf32>, tensor<3x8x8xf32>")
    names, n, before, after = run_pass(text, lambda f: LC.compose_layout_chains(f, get_cost_model("analytic")))
    assert n == 0 and names.count("taso.transpose") == 2


_W = '"taso.weight"() {name = "w", value = dense<[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.5, 0.25, 1.5, 2.5, 3.5, 4.5], ' \
     '[1.0, -1.0, 2.0, -2.0, 3.0, -3.0], [0.0, 1.0, 0.0, 1.0, 0.0, 1.0], [2.0, 2.0, 2.0, 1.0, 1.0, 1.0], ' \
     '[-1.0, 0.5, 0.25, 0.125, 1.0, 2.0], [3.0, 1.0, 4.0, 1.0, 5.0, 9.0], [2.0, 7.0, 1.0, 8.0, 2.0, 8.0]]> : ' \
     'tensor<8x6xf32>} : () -> tensor<8x6xf32>'


def test_a_row_transpose_sinks_below_a_matmul_into_the_chain_after_it():
    """nn.MultiheadAttention's input side: batch-first to sequence-first, the packed projection, then
    heads: the first transpose joins the second, one transpose is left."""
    text = f"""func.func @f(%x: tensor<2x4x8xf32>) -> tensor<2x3x4x2xf32> {{
  %w = {_W}
  %t = "taso.transpose"(%x) {{perm = array<i64: 1, 0, 2>}} : (tensor<2x4x8xf32>) -> tensor<4x2x8xf32>
  %m = "taso.matmul"(%t, %w) {{activation = "none"}} : (tensor<4x2x8xf32>, tensor<8x6xf32>) -> tensor<4x2x6xf32>
  %r = "taso.reshape"(%m) {{shape = array<i64: 4, 2, 3, 2>}} : (tensor<4x2x6xf32>) -> tensor<4x2x3x2xf32>
  %u = "taso.transpose"(%r) {{perm = array<i64: 1, 2, 0, 3>}} : (tensor<4x2x3x2xf32>) -> tensor<2x3x4x2xf32>
  return %u : tensor<2x3x4x2xf32>
}}"""
    names, n, before, after = run_pass(text, lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 1
    assert names.count("taso.transpose") == 1 and names.index("taso.matmul") < names.index("taso.transpose")
    np.testing.assert_array_equal(after[0], before[0])


def test_a_row_transpose_hoists_above_a_matmul_into_the_chain_before_it():
    """The output side: the transpose back to batch-first after the projection joins the transpose
    before it."""
    text = f"""func.func @f(%y: tensor<2x8x4xf32>) -> tensor<2x4x6xf32> {{
  %w = {_W}
  %t = "taso.transpose"(%y) {{perm = array<i64: 2, 0, 1>}} : (tensor<2x8x4xf32>) -> tensor<4x2x8xf32>
  %m = "taso.matmul"(%t, %w) {{activation = "relu"}} : (tensor<4x2x8xf32>, tensor<8x6xf32>) -> tensor<4x2x6xf32>
  %u = "taso.transpose"(%m) {{perm = array<i64: 1, 0, 2>}} : (tensor<4x2x6xf32>) -> tensor<2x4x6xf32>
  return %u : tensor<2x4x6xf32>
}}"""
    names, n, before, after = run_pass(text, lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 1
    assert names == ["taso.weight", "taso.transpose", "taso.matmul", "func.return"]
    np.testing.assert_array_equal(after[0], before[0])


def test_a_transpose_of_the_last_axis_does_not_move():
    """A transpose that moves the matmul's reduction axis is not a row step."""
    text = f"""func.func @f(%x: tensor<8x4xf32>) -> tensor<6x4xf32> {{
  %w = {_W}
  %t = "taso.transpose"(%x) {{perm = array<i64: 1, 0>}} : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %m = "taso.matmul"(%t, %w) {{activation = "none"}} : (tensor<4x8xf32>, tensor<8x6xf32>) -> tensor<4x6xf32>
  %u = "taso.transpose"(%m) {{perm = array<i64: 1, 0>}} : (tensor<4x6xf32>) -> tensor<6x4xf32>
  return %u : tensor<6x4xf32>
}}"""
    names, n, _before, _after = run_pass(text, lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 0 and names.count("taso.transpose") == 2


def test_end_to_end_in_onnxruntime(tmp_path):
    """Sequence-first attention projections in a batch-first model (nn.MultiheadAttention's export):
    through taso-opt, fewer transposes and the same outputs."""
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from unit_helpers import assert_same_in_onnxruntime

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32), "w_in"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w_out"),
             numpy_helper.from_array(np.array([6, 2, 3, 2, 8], np.int64), "heads"),
             numpy_helper.from_array(np.array([6, 2, 48], np.int64), "back"),
             numpy_helper.from_array(np.array([12, 16], np.int64), "rows")]
    nodes = [helper.make_node("Transpose", ["x"], ["xs"], perm=[1, 0, 2]),  # (2, 6, 16) -> (6, 2, 16)
             helper.make_node("MatMul", ["xs", "w_in"], ["p"]),  # (6, 2, 48)
             helper.make_node("Reshape", ["p", "heads"], ["ph"]),
             helper.make_node("Transpose", ["ph"], ["pt"], perm=[2, 1, 3, 0, 4]),  # (3, 2, 2, 6, 8)
             helper.make_node("Reshape", ["pt", "back"], ["y"]),
             helper.make_node("Transpose", ["x2"], ["xs2"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["xs2", "rows"], ["xr"]),
             helper.make_node("MatMul", ["xr", "w_out"], ["o"]),
             helper.make_node("Reshape", ["o", "back16"], ["o3"]),
             helper.make_node("Transpose", ["o3"], ["z"], perm=[1, 0, 2])]  # back to batch-first
    inits.append(numpy_helper.from_array(np.array([6, 2, 16], np.int64), "back16"))
    g = helper.make_graph(nodes, "mha", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 6, 16])
                                         for n in ("x", "x2")],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 2, 48]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 6, 16])], inits)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    p = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "--taso-report",
                        "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "row reshapes/transposes moved across matmuls" in p.stderr, p.stderr
    before = [n.op_type for n in onnx.load(str(src)).graph.node].count("Transpose")
    after = [n.op_type for n in onnx.load(str(out)).graph.node].count("Transpose")
    assert after < before, (before, after)
    feeds = {n: rng.standard_normal((2, 6, 16)).astype(np.float32) for n in ("x", "x2")}
    assert_same_in_onnxruntime(src, out, feeds, rtol=1e-5, atol=1e-5)


def test_a_biased_2d_matmul_stays_2d():
    """A biased matmul on 2-D rows is one Gemm in ONNX; on 3-D rows MatMul and Add: rows do not move
    across it where that would make its input 3-D."""
    text = f"""func.func @f(%x: tensor<4x2x8xf32>) -> tensor<2x4x6xf32> {{
  %w = {_W}
  %b = "taso.weight"() {{name = "b", value = dense<0.5> : tensor<6xf32>}} : () -> tensor<6xf32>
  %r = "taso.reshape"(%x) {{shape = array<i64: 8, 8>}} : (tensor<4x2x8xf32>) -> tensor<8x8xf32>
  %m = "taso.matmul"(%r, %w, %b) {{activation = "none"}} : (tensor<8x8xf32>, tensor<8x6xf32>, tensor<6xf32>) -> tensor<8x6xf32>
  %r2 = "taso.reshape"(%m) {{shape = array<i64: 4, 2, 6>}} : (tensor<8x6xf32>) -> tensor<4x2x6xf32>
  %u = "taso.transpose"(%r2) {{perm = array<i64: 1, 0, 2>}} : (tensor<4x2x6xf32>) -> tensor<2x4x6xf32>
  return %u : tensor<2x4x6xf32>
}}"""
    names, n, _before, _after = run_pass(text, lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 0 and names.count("taso.transpose") == 1
    # without the bias the same rows move: the matmul reads the 3-D input and one transpose is left
    names, n, before, after = run_pass(text.replace('"taso.matmul"(%r, %w, %b)', '"taso.matmul"(%r, %w)')
                                       .replace("(tensor<8x8xf32>, tensor<8x6xf32>, tensor<6xf32>)",
                                                "(tensor<8x8xf32>, tensor<8x6xf32>)"),
                                       lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 1 and names.count("taso.transpose") == 1
    np.testing.assert_array_equal(after[0], before[0])


def test_rows_of_a_vector_do_not_move():
    """reshape([3] -> [1, 3]) keeps the last axis but moved below the matmul it would leave it a vector
    operand, which a matmul does not take."""
    text = """func.func @f(%x: tensor<3xf32>) -> tensor<4xf32> {
  %w = "taso.weight"() {name = "w", value = dense<0.5> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
  %a = "taso.reshape"(%x) {shape = array<i64: 1, 3>} : (tensor<3xf32>) -> tensor<1x3xf32>
  %m = "taso.matmul"(%a, %w) {activation = "none"} : (tensor<1x3xf32>, tensor<3x4xf32>) -> tensor<1x4xf32>
  %r = "taso.reshape"(%m) {shape = array<i64: 4>} : (tensor<1x4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}"""
    names, n, _before, _after = run_pass(text, lambda f: LC.move_row_chains(f, get_cost_model("analytic")))
    assert n == 0 and names.count("taso.reshape") == 2
