"""Writes a small ONNX model for the lit tests: python make_model.py OUT.onnx [dynamic]"""
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(0)


def w(name, *shape):
    return nh.from_array(rng.standard_normal(shape).astype(np.float32), name)


variant = sys.argv[2] if len(sys.argv) > 2 else ""
batch = "N" if variant == "dynamic" else 1
nodes = [
    h.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
    h.make_node("Relu", ["c1"], ["r1"], name="relu1"),
    h.make_node("Identity", ["r1"], ["i1"], name="id1"),
    h.make_node("Constant", [], ["shape"], name="shape_const",
                value=nh.from_array(np.array([1, -1], dtype=np.int64))),
    h.make_node("Reshape", ["i1", "shape"], ["flat"], name="flatten"),
    h.make_node("Gemm", ["flat", "fcw", "fcb"], ["g"], name="fc", transB=1),
    h.make_node("Softmax", ["g"], ["y"], name="softmax", axis=-1),
]
if variant == "cyclic":  # relu1 consumes fc's output: a cycle
    nodes[1] = h.make_node("Add", ["c1", "g2"], ["r1"], name="relu1")
    nodes.append(h.make_node("Identity", ["g"], ["g2"], name="loop"))
if variant == "unknown-op":
    nodes[1] = h.make_node("NoSuchOp", ["c1"], ["r1"], name="relu1")
graph = h.make_graph(
    nodes, "lit_model",
    [h.make_tensor_value_info("x", T.FLOAT, [batch, 3, 8, 8])],
    [h.make_tensor_value_info("y", T.FLOAT, [1, 10])],
    [w("w1", 4, 3, 3, 3), w("b1", 4), w("fcw", 10, 64), w("fcb", 10)],
)
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="lit")
model.ir_version = 8
onnx.save(model, sys.argv[1])
