"""Atomic ONNX output and external data for models over the 2 GB protobuf limit."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.dialect import onnx_export
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.mlir import make_context
from taso_mlir.dialect.onnx_import import import_onnx, load_onnx


def _model(n=512):
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "s",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, n])], [h.make_tensor_value_info("y", T.FLOAT, [2, n])],
                     [nh.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w


def test_external_data_when_over_the_limit(tmp_path, monkeypatch):
    # Pretend the protobuf limit is 64 KiB so that a 1 MiB model takes the external-data path.
    monkeypatch.setattr(onnx_export, "_TWO_GB", 64 * 1024)
    model, w = _model()
    out = onnx_export.export_onnx(import_onnx(model, make_context()))
    path = tmp_path / "big.onnx"
    onnx_export.save_onnx(out, str(path))
    assert (tmp_path / "big.onnx.data").stat().st_size >= w.nbytes
    assert path.stat().st_size < 64 * 1024
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]  # no temporaries left
    back = load_onnx(str(path))  # reads the external data
    onnx.checker.check_model(str(path), full_check=True)
    x = np.ones((2, 512), np.float32)
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-3)
    # and it imports again, weights intact
    again = onnx_export.export_onnx(import_onnx(back, make_context()))
    np.testing.assert_array_equal(nh.to_array(again.graph.initializer[0]), w)


def test_failed_write_leaves_nothing(tmp_path):
    model, _ = _model(8)
    target = tmp_path / "out.onnx"
    target.mkdir()  # a directory where the file should go: the final rename fails
    with pytest.raises(TasoError, match="cannot write ONNX output"):
        onnx_export.save_onnx(model, str(target))
    assert sorted(os.listdir(tmp_path)) == ["out.onnx"] and target.is_dir() and not os.listdir(target)
