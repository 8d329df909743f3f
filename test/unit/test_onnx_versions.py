"""Versions that agree (issue 22): onnx 1.23.2 writes IR version 14, onnxruntime 1.31.1 reads 13.

The limits recorded in ``onnx_common`` are checked against the installed onnxruntime; a model stamped
with IR version 14 at opset 17 goes through ``taso-opt --taso-search`` and comes out at an IR version
onnxruntime loads; an opset onnxruntime does not load is refused up front, before the search, in one
line; and error messages keep their reason (the end), losing the middle where they are too long.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.dialect import onnx_common
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.errors import MESSAGE_LIMIT, TasoError, one_line
from taso_mlir.dialect.onnx_common import (ORT_MAX_IR_VERSION, ORT_MAX_OPSETS, for_onnxruntime, loadable_ir_version,
                                           min_ir_version)
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.onnx_import import import_onnx

MAX_OPSET = ORT_MAX_OPSETS[""]


def _relu(ir_version: int, opsets) -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir_version
    return m


def _ort_error(model) -> str:
    """'' where onnxruntime loads ``model``, else its message."""
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return ""
    except Exception as e:
        return str(e)


def _two_branches(ir_version: int, opset: int) -> onnx.ModelProto:
    """Two convolutions of one input, each with a Relu, added: something for taso-search to rewrite."""
    rng = np.random.default_rng(0)
    w1, w2 = (nh.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), n) for n in ("w1", "w2"))
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["a"], ["b"]),
             h.make_node("Conv", ["x", "w2"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["d"]),
             h.make_node("Add", ["b", "d"], ["y"])]
    vi = [h.make_tensor_value_info(n, T.FLOAT, [1, 4, 8, 8]) for n in ("x", "y")]
    m = h.make_model(h.make_graph(nodes, "g", vi[:1], vi[1:], [w1, w2]), opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def _taso_opt(*args, cwd=None):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=600)
    return p, time.monotonic() - t0


# ---- the limits, measured on the installed onnxruntime


def test_recorded_ir_limit_is_the_installed_onnxruntimes():
    assert _ort_error(_relu(ORT_MAX_IR_VERSION, [("", 17)])) == ""
    err = _ort_error(_relu(ORT_MAX_IR_VERSION + 1, [("", 17)]))
    assert f"Unsupported model IR version: {ORT_MAX_IR_VERSION + 1}" in err, err
    # the premise of the issue: the pinned onnx stamps a newer IR version than onnxruntime reads
    assert h.make_model(_relu(8, [("", 17)]).graph).ir_version > ORT_MAX_IR_VERSION


@pytest.mark.parametrize("domain", sorted(ORT_MAX_OPSETS))
def test_recorded_opset_limits_are_the_installed_onnxruntimes(domain):
    top = ORT_MAX_OPSETS[domain]
    opsets = [("", 17)] if domain else []
    assert _ort_error(_relu(ORT_MAX_IR_VERSION, opsets + [(domain, top)])) == ""
    err = _ort_error(_relu(ORT_MAX_IR_VERSION, opsets + [(domain, top + 1)]))
    assert f"Opset {top + 1} is under development" in err or f"till opset {top}" in err, err


# ---- IR version 14 at opset 17: just works


def test_ir14_opset17_model_round_trips_through_taso_search(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_two_branches(14, 17), src)
    before = src.read_bytes()
    p, _ = _taso_opt(src, "--taso-search", "--no-verify-numerics", "-o", out)
    assert p.returncode == 0, p.stderr
    assert src.read_bytes() == before  # the input is not touched
    o = onnx.load(out)
    assert o.ir_version <= ORT_MAX_IR_VERSION
    assert o.ir_version == h.find_min_ir_version_for([h.make_opsetid("", 17)]) == 8  # the smallest opset 17 needs
    assert [(i.domain, i.version) for i in o.opset_import] == [("", 17)]
    # the output loads in onnxruntime and computes what the input does (the input at a loadable IR version)
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    src_bytes, folder = for_onnxruntime(str(src))
    assert folder == str(tmp_path) and isinstance(src_bytes, bytes)
    want = ort.InferenceSession(src_bytes, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ir14_opset17_model_passes_the_default_numeric_check(tmp_path):
    """``taso-opt --taso-search`` with its default onnxruntime check, which runs the input from its
    file: ``numerics._session`` hands onnxruntime ``onnx_common.for_onnxruntime(model)``."""
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_two_branches(14, 17), src)
    p, _ = _taso_opt(src, "--taso-search", "-o", out)
    assert p.returncode == 0, p.stderr
    assert "numerics:" in p.stderr and onnx.load(out).ir_version <= ORT_MAX_IR_VERSION


def test_import_accepts_and_export_lowers_an_ir14_model():
    m = _two_branches(14, 17)
    out = export_onnx(import_onnx(m, make_context()))
    assert out.ir_version == 8
    assert m.ir_version == 14  # (the caller's model is not changed)


def test_a_loadable_ir_version_is_kept():
    out = export_onnx(import_onnx(_two_branches(10, 17), make_context()))
    assert out.ir_version == 10


def test_mlir_input_recording_ir14_is_exported_loadable(tmp_path):
    src, mid, out = tmp_path / "m.onnx", tmp_path / "m.mlir", tmp_path / "o.onnx"
    onnx.save(_two_branches(14, 17), src)
    p, _ = _taso_opt(src, "-o", mid)
    assert p.returncode == 0, p.stderr
    assert "taso.ir_version = 14" in mid.read_text()
    p, _ = _taso_opt(mid, "-o", out)
    assert p.returncode == 0, p.stderr
    assert onnx.load(out).ir_version == 8
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


# ---- what the model's content needs


def test_min_ir_version_follows_opsets_and_content():
    assert min_ir_version(_relu(14, [("", 17)])) == (8, "opset 17 of the default domain (ai.onnx)")
    assert min_ir_version(_relu(14, [("", 26)]))[0] == 13
    assert min_ir_version(_relu(14, [("", 28)]))[0] == 14
    m = _two_branches(14, 11)  # opset 11: IR 6; initializers that are not graph inputs: 4
    assert min_ir_version(m)[0] == 6
    f = h.make_function("loc", "F", ["a"], ["b"], [h.make_node("Relu", ["a"], ["b"])], [h.make_opsetid("", 11)])
    m.functions.append(f)
    assert min_ir_version(m) == (8, "model-local functions")
    m.graph.value_info.append(h.make_tensor_value_info("z", T.INT4, [2]))
    assert min_ir_version(m) == (10, "element type INT4")


def test_export_needing_a_newer_ir_version_than_onnxruntime_reads_is_one_line():
    m = _relu(14, [("", 28)])
    with pytest.raises(TasoError) as e:
        loadable_ir_version(m)
    msg = str(e.value)
    assert "\n" not in msg and "IR version 14" in msg and f"at most IR version {ORT_MAX_IR_VERSION}" in msg, msg


# ---- refused up front


def test_opset_onnxruntime_does_not_load_is_refused_before_the_search(tmp_path):
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "report.json"
    onnx.save(_two_branches(14, MAX_OPSET + 1), src)
    p, took = _taso_opt(src, "--taso-search", "--taso-report", rep, "-o", out)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("taso-opt: error: "), p.stderr
    assert "Traceback" not in p.stderr
    assert f"opset {MAX_OPSET + 1}" in p.stderr and f"at most opset {MAX_OPSET}" in p.stderr, p.stderr
    assert not out.exists()
    assert not rep.exists(), "the search ran (it wrote its report)"
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    assert took < 30


def test_import_refuses_an_opset_onnxruntime_does_not_load():
    with pytest.raises(TasoError) as e:
        import_onnx(_relu(13, [("", 17), ("ai.onnx.ml", ORT_MAX_OPSETS["ai.onnx.ml"] + 1)]), make_context(),
                    where="m.onnx")
    assert str(e.value).startswith("m.onnx: the model imports opset 6 of domain 'ai.onnx.ml'"), e.value


def test_content_newer_than_onnxruntime_reads_is_refused():
    g = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT6E2M3, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT6E2M3, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(TasoError) as e:
        import_onnx(m, make_context(), where="m.onnx")
    assert str(e.value) == (f"m.onnx: the model needs ONNX IR version 14 for its element type FLOAT6E2M3, but "
                            f"onnxruntime {onnx_common.ORT_MEASURED} reads at most IR version {ORT_MAX_IR_VERSION}")


def test_ir_version_newer_than_onnx_knows_is_refused():
    with pytest.raises(TasoError) as e:
        import_onnx(_relu(onnx.IR_VERSION + 1, [("", 17)]), make_context(), where="m.onnx")
    assert f"IR version {onnx.IR_VERSION + 1} is newer than onnx" in str(e.value), e.value


# ---- errors keep their reason


def test_onnxruntime_error_keeps_its_reason():
    with pytest.raises(Exception) as e:
        ort.InferenceSession(_relu(ORT_MAX_IR_VERSION + 1, [("", 17)]).SerializeToString(),
                             providers=["CPUExecutionProvider"])
    assert len(str(e.value)) > 300  # (what used to be cut before its reason)
    line = one_line(e.value)
    assert line.endswith(f"Unsupported model IR version: {ORT_MAX_IR_VERSION + 1}, "
                         f"max supported IR version: {ORT_MAX_IR_VERSION}"), line
    assert "onnxruntime::Model::Model(" not in line and len(line) <= 300


def test_long_messages_lose_their_middle_not_their_end():
    names = ", ".join(f"input_{i}" for i in range(500))
    line = one_line(ValueError(f"bad inputs [{names}]: they have no static shape"))
    assert len(line) <= 300 and line.startswith("bad inputs [input_0, input_1")
    assert line.endswith("input_499]: they have no static shape") and " ... " in line
    e = TasoError(f"m.onnx: bad inputs [{names * 3}]\n  because they have no static shape")
    assert len(str(e)) <= MESSAGE_LIMIT and str(e).endswith("because they have no static shape")
    assert TasoError("what failed:\n  why").args[0] == "what failed: why"


def test_internal_error_line_keeps_its_reason(capsys):
    from taso_mlir.tools import cli

    def body(argv):
        raise RuntimeError("/src/lib/x.cc:12 void ns::f(int) " + "context " * 100 + "the reason at the end")

    assert cli.run("taso-opt", body, []) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the reason at the end (set TASO_DEBUG=1" in err and "ns::f" not in err, err
