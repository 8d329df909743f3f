"""The Python API: our passes inside an upstream PassManager, pipeline parsing, import/export calls."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.mlir import ir, passmanager
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.onnx_import import import_onnx
from taso_mlir.passes import add_taso_pass, build_pass_manager, run_pass_manager

TORCH_FORM = """
func.func @g(%arg0: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32> {
  %0 = torch.operator "onnx.Relu"(%arg0) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  %1 = torch.operator "onnx.Identity"(%0) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  %2 = torch.operator "onnx.Erf"(%1) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  return %2 : !torch.vtensor<[2,3],f32>
}
"""


def _ops(module):
    f = module.body.operations[0].operation
    return [o.operation.name for o in f.regions[0].blocks[0].operations]


def test_add_taso_pass_to_upstream_pass_manager():
    ctx = make_context()
    with ctx:
        m = ir.Module.parse(TORCH_FORM)
        pm = passmanager.PassManager.parse("builtin.module(canonicalize)")
        add_taso_pass(pm, "convert-onnx-to-taso", opset=13)
        add_taso_pass(pm, "taso-verify")
        pm.add("cse")
        pm.run(m.operation)
    assert _ops(m) == ["taso.relu", "onnx.Erf", "func.return"]
    attrs = m.body.operations[0].operation.attributes
    assert "ai.onnx = 13" in str(attrs["taso.opset_imports"])


def test_unknown_pass_and_option_are_errors():
    ctx = make_context()
    with ctx:
        pm = passmanager.PassManager("builtin.module")
        with pytest.raises(TasoError, match="unknown taso pass 'nope'"):
            add_taso_pass(pm, "nope")
        with pytest.raises(TasoError, match="has no option 'bogus'"):
            add_taso_pass(pm, "taso-dce", bogus=1)
        with pytest.raises(TasoError, match="expects int"):
            build_pass_manager("builtin.module(convert-onnx-to-taso{opset=abc})", ctx)


def test_pipeline_error_is_one_line_taso_error():
    ctx = make_context()
    seq = """
func.func @g(%arg0: !torch.vtensor<[2,3],f32>) -> !torch.list<vtensor<[2,3],f32>> {
  %0 = torch.operator "onnx.SequenceConstruct"(%arg0) : (!torch.vtensor<[2,3],f32>) -> !torch.list<vtensor<[2,3],f32>>
  return %0 : !torch.list<vtensor<[2,3],f32>>
}
"""
    with ctx:
        m = ir.Module.parse(seq)
        pm = build_pass_manager("builtin.module(convert-onnx-to-taso,taso-dce)", ctx)
        with pytest.raises(TasoError) as info:
            run_pass_manager(pm, m.operation)
    msg = str(info.value)
    assert "\n" not in msg and "unsupported value type !torch.list" in msg


def test_import_export_python_api_keeps_names_and_numbers():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Tanh", ["m"], ["y"])], "api",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 3])], [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
                     [nh.from_array(w, "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    module = import_onnx(model, make_context())
    assert _ops(module) == ["taso.weight", "taso.matmul", "taso.tanh", "func.return"]
    out = export_onnx(module)
    onnx.checker.check_model(out, full_check=True)
    assert [i.name for i in out.graph.input] == ["x"] and [o.name for o in out.graph.output] == ["y"]
    np.testing.assert_array_equal(nh.to_array(out.graph.initializer[0]), w)
    assert out.opset_import[0].version == 17
