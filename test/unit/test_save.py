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
from taso_mlir.dialect.context import make_context
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
    mask = os.umask(0)
    os.umask(mask)
    for f in ("big.onnx", "big.onnx.data"):  # what open() gives a new file (onnx writes the data 0600)
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o666 & ~mask, f
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


def test_large_model_is_written_one_initializer_at_a_time(tmp_path, monkeypatch):
    # Pretend 64 KiB is large: the file is the model less its initializers, then one record per
    # initializer; it parses to the same model, passes the checker and runs.
    monkeypatch.setattr(onnx_export, "_CHUNKED_BYTES", 64 * 1024)
    model, w = _model()
    b = nh.from_array(np.arange(512, dtype=np.float32), "b")
    model.graph.initializer.append(b)
    model.graph.node.append(h.make_node("Add", ["y", "b"], ["z"]))
    model.graph.output[0].CopyFrom(h.make_tensor_value_info("z", T.FLOAT, [2, 512]))
    model.producer_name = "p"
    model.metadata_props.add(key="k", value="v")
    path = tmp_path / "chunked.onnx"
    onnx_export.save_onnx(model, str(path))
    raw = path.read_bytes()
    assert raw != model.SerializeToString()  # the chunked layout was used
    assert onnx.load(str(path)).SerializeToString() == model.SerializeToString()
    onnx.checker.check_model(str(path), full_check=True)
    x = np.ones((2, 512), np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ w + np.arange(512, dtype=np.float32), rtol=1e-5, atol=1e-4)


def test_initializer_records_parse_to_the_same_model(tmp_path, monkeypatch):
    # Every kind of initializer: raw_data of several types and sizes (0-d, empty, one over 127 bytes so
    # that its length takes a multi-byte varint, one over 16 KiB for a 3-byte varint), typed data
    # fields (written by protobuf), a non-ASCII name, a doc string.
    monkeypatch.setattr(onnx_export, "_CHUNKED_BYTES", 1)
    rng = np.random.default_rng(1)
    inits = [nh.from_array(rng.standard_normal((64, 80)).astype(np.float32), "big"),
             nh.from_array(rng.standard_normal(40).astype(np.float16), "h"),
             nh.from_array(np.array(3.5, np.float64), "scalar"),
             nh.from_array(np.zeros((0, 4), np.float32), "empty"),
             nh.from_array(np.array([True, False, True]), "b"),
             nh.from_array(np.arange(7, dtype=np.int64), "poids_é"),
             h.make_tensor("typed", T.FLOAT, [2], [1.0, 2.0]),
             h.make_tensor("ints", T.INT32, [3], [1, -2, 3])]
    inits[1].doc_string = "half"
    g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    path = tmp_path / "records.onnx"
    onnx_export.save_onnx(model, str(path))
    assert path.read_bytes() != model.SerializeToString()  # the chunked layout was used
    back = onnx.load(str(path))
    assert back == model
    for a, b in zip(back.graph.initializer, model.graph.initializer):
        np.testing.assert_array_equal(nh.to_array(a), nh.to_array(b))


def test_varint_matches_protobuf():
    from google.protobuf.internal import encoder

    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**31, 2**40):
        out: list = []
        encoder._VarintEncoder()(out.append, n, True)
        assert onnx_export._varint(n) == b"".join(out), n


def test_checker_stub_keeps_what_the_checker_must_see():
    model, _ = _model(16)
    bad = nh.from_array(np.ones(4, np.float32), "short")
    bad.raw_data = bad.raw_data[:12]  # 3 floats for a shape of 4: copied as it is, for the checker
    model.graph.initializer.append(bad)
    model.graph.initializer.append(h.make_tensor("typed", T.FLOAT, [2], [1.0, 2.0]))
    stub = onnx_export.checker_stub(model)
    assert [t.name for t in stub.graph.initializer] == ["w", "short", "typed"]
    w, short, typed = stub.graph.initializer
    assert len(w.raw_data) == 4 and list(w.dims) == []  # a scalar of its type: no weight copied
    assert short == bad and typed == model.graph.initializer[2]
    assert stub.graph.node == model.graph.node
    with pytest.raises(onnx.checker.ValidationError, match="raw_data size"):
        onnx.checker.check_model(stub)
    both = nh.from_array(np.ones(2, np.float32), "both")
    both.float_data.extend([1.0, 1.0])  # raw_data and a typed field: copied, and the checker refuses it
    m2, _ = _model(16)
    m2.graph.initializer.append(both)
    assert onnx_export.checker_stub(m2).graph.initializer[1] == both
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx_export.checker_stub(m2))
    del model.graph.initializer[1]
    onnx.checker.check_model(onnx_export.checker_stub(model))


def test_exported_initializers_match_from_array():
    # the exporter builds each initializer in place; it must be what numpy_helper.from_array makes
    text = """func.func @f(%x: tensor<2x3xf16>) -> tensor<2x3xf16> {
  %w = "taso.weight"() {name = "w", value = dense<[[1.5, -2.0, 0.25], [3.0, 4.0, -0.5]]> : tensor<2x3xf16>} : () -> tensor<2x3xf16>
  %y = "taso.ewadd"(%x, %w) : (tensor<2x3xf16>, tensor<2x3xf16>) -> tensor<2x3xf16>
  return %y : tensor<2x3xf16>
}"""
    from taso_mlir.dialect.mlir import ir

    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        out = onnx_export.export_onnx(m)
    (w,) = [t for t in out.graph.initializer if t.name == "w"]
    want = np.array([[1.5, -2.0, 0.25], [3.0, 4.0, -0.5]], np.float16)
    assert w == nh.from_array(want, "w")


def test_model_size_bound_is_an_upper_bound():
    model, _ = _model(64)
    model.graph.initializer.append(nh.from_array(np.arange(3, dtype=np.int64), "i"))  # raw_data
    model.graph.initializer.append(h.make_tensor("f", T.FLOAT, [2], [1.0, 2.0]))  # typed data: measured
    bound, size = onnx_export.model_size_bound(model), model.ByteSize()
    assert size <= bound <= size + 1024


def _write_input(tmp_path, model):
    src = tmp_path / "in.onnx"
    onnx.save(model, src)
    return src, src.read_bytes()


@pytest.mark.parametrize("over_the_limit", [False, True])
def test_numeric_check_reads_the_written_file_before_it_is_kept(tmp_path, monkeypatch, capsys, over_the_limit):
    # taso-opt checks the very file it is about to rename into place; an output that disagrees with the
    # input is refused with one line and leaves nothing behind (no output, no temporary, no .data), an
    # earlier output at that path is left as it was, and the input is untouched.
    from taso_mlir.tools import taso_opt

    if over_the_limit:  # the external-data path: a temporary folder, checked before the renames
        monkeypatch.setattr(onnx_export, "_TWO_GB", 64 * 1024)
    model, w = _model()
    src, before = _write_input(tmp_path, model)
    out = tmp_path / "out.onnx"
    assert taso_opt.main([str(src), "-o", str(out), "--verify-numerics"]) == 0
    assert "numerics: max |difference| 0 " in capsys.readouterr().err
    kept = sorted(os.listdir(tmp_path))
    assert kept == sorted(["in.onnx", "out.onnx"] + (["out.onnx.data"] if over_the_limit else []))
    previous = out.read_bytes()

    real_export = onnx_export.export_onnx

    def wrong(module):  # an "optimizer" that changes one weight
        m = real_export(module)
        init = m.graph.initializer[0]
        init.CopyFrom(nh.from_array(nh.to_array(init) * 1.01, init.name))
        return m

    monkeypatch.setattr(onnx_export, "export_onnx", wrong)
    assert taso_opt.main([str(src), "-o", str(out), "--verify-numerics"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output 'y' exceeds" in err[0] and "nothing written" in err[0], err
    assert sorted(os.listdir(tmp_path)) == kept  # no temporary left
    assert out.read_bytes() == previous and src.read_bytes() == before


def test_compare_models_takes_paths_and_protos(tmp_path):
    from taso_mlir.dialect.numerics import compare_models

    model, _ = _model(16)
    src, _ = _write_input(tmp_path, model)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    wrong.graph.initializer[0].CopyFrom(nh.from_array(nh.to_array(model.graph.initializer[0]) * 2, "w"))
    assert compare_models(str(src), model).max_abs == 0
    assert compare_models(model, str(src)).max_abs == 0
    assert not compare_models(str(src), wrong).ok


def test_an_interrupted_check_leaves_nothing(tmp_path):
    # Ctrl-C while the numeric check runs on the temporary file: the file goes
    model, _ = _model(8)

    def check(path):
        assert os.path.exists(path)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        onnx_export.save_onnx(model, str(tmp_path / "out.onnx"), check=check)
    assert os.listdir(tmp_path) == []


def test_an_output_whose_data_file_holds_the_input_weights_is_refused(tmp_path, capsys):
    # in.onnx keeps its weights in out.onnx.data: writing out.onnx over 2 GB would replace them
    from taso_mlir.tools import taso_opt

    model, _ = _model(64)
    onnx.save_model(model, str(tmp_path / "in.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="out.onnx.data", size_threshold=0)
    before = (tmp_path / "out.onnx.data").read_bytes()
    assert taso_opt.main([str(tmp_path / "in.onnx"), "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the input's external data" in err[0], err
    assert (tmp_path / "out.onnx.data").read_bytes() == before and not (tmp_path / "out.onnx").exists()
    assert taso_opt.main([str(tmp_path / "in.onnx"), "-o", str(tmp_path / "other.onnx")]) == 0
