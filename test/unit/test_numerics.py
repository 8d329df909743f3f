"""The numeric differential check (``dialect.numerics.compare_models``) sees what it must: token ids over
the whole embedding table (a model wrong in every row but 0 and 1 differs), inputs shaped as the output model's."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect.numerics import compare_models, index_bounds


def _embedding(table: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["ids", "shape"], ["ids2"]),
             helper.make_node("Gather", ["table", "ids2"], ["e"]),
             helper.make_node("Equal", ["mask", "one"], ["m"]),
             helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mf", "ax"], ["mf3"]),
             helper.make_node("Mul", ["e", "mf3"], ["y"])]
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([2, 16], np.int64), "shape"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [32]),
                                         helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_token_ids_cover_the_table():
    table = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    a = _embedding(table)
    # the ids only index the table (through a reshape); the mask is compared, so it stays 0 or 1
    assert index_bounds(a) == {"ids": 50}
    wrong = table.copy()
    wrong[2:] += 1.0  # right where ids 0 and 1 read
    assert compare_models(a, _embedding(table)).max_abs == 0
    assert compare_models(a, _embedding(wrong)).max_abs > 0.5


def _scaled(c: float, dtype) -> onnx.ModelProto:
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["y"])], "s",
                          [helper.make_tensor_value_info("x", t, [64])], [helper.make_tensor_value_info("y", t, [64])],
                          [numpy_helper.from_array(np.array([c], dtype), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_tolerance_follows_the_precision():
    one_ulp = 1 + 2.0 ** -10  # the next float16 after 1
    assert compare_models(_scaled(1.0, np.float16), _scaled(one_ulp, np.float16)).ok  # a rounding step
    assert not compare_models(_scaled(1.0, np.float16), _scaled(1.01, np.float16)).ok
    # the same difference in float32 is far beyond its rounding
    rep = compare_models(_scaled(1.0, np.float32), _scaled(one_ulp, np.float32))
    assert not rep.ok and rep.tolerance == 1e-5
    assert compare_models(_scaled(1.0, np.float32), _scaled(1.0, np.float32)).ok


def _two_outputs(c: float) -> onnx.ModelProto:
    """``y = x * 1.0`` and ``flag = x * c > 0``: a boolean output that flips where ``c`` changes sign."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["y"]), helper.make_node("Mul", ["x", "c"], ["xc"]),
                           helper.make_node("Greater", ["xc", "zero"], ["flag"])], "s",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8]),
                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [8])],
                          [numpy_helper.from_array(np.array([c], np.float32), "c"),
                           numpy_helper.from_array(np.array([1.0], np.float32), "one"),
                           numpy_helper.from_array(np.array([0.0], np.float32), "zero")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_report_names_the_output_that_differs():
    rep = compare_models(_two_outputs(1.0), _two_outputs(-1.0))
    assert not rep.ok and rep.worst_output == "flag"
    assert compare_models(_two_outputs(1.0), _two_outputs(2.0)).ok
    rep = compare_models(_scaled(1.0, np.float32), _scaled(1.5, np.float32))
    assert not rep.ok and rep.worst_output == "y"


def test_an_integer_output_that_differs_is_named_before_a_float_one_within_tolerance():
    def model(c: float, k: int) -> onnx.ModelProto:
        g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["A"]), helper.make_node("Add", ["i", "k"], ["B"])], "s",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [8])],
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [8]),
                               helper.make_tensor_value_info("B", TensorProto.INT64, [8])],
                              [numpy_helper.from_array(np.array([c], np.float32), "c"),
                               numpy_helper.from_array(np.array([k], np.int64), "k")])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    rep = compare_models(model(1.0, 1), model(1.0 + 2.0 ** -22, 2))  # A within tolerance, B wrong
    assert not rep.ok and rep.worst_output == "B"
