"""The numeric check's reference (issue 19): both models run with onnxruntime's graph optimizations off,
and an output the two float32 runs disagree on is judged against a float64 evaluation of the input model
(``dialect.numerics``: ``compare_models``, ``accept_against_reference``), so that a result more accurate
than the input is not refused while one less accurate than the input's own float32 error allows is."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.dialect import numerics
from taso_mlir.dialect.numerics import compare_models, float64_copy, float64_reference


def _model(nodes, inits, shape=(256,), opset=17, out_shape=None) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, out_shape)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def _clip(c: float, mul: float = 1.0, conv: bool = False) -> onnx.ModelProto:
    """``y = Clip(((x + c) - c) * mul, 0, 6)``: in float32 ``(x + c) - c`` rounds x to a multiple of half an
    ulp of c (an error up to 6e-5 for c = 1024, none for c = 0); in float64 it is x. With ``conv`` the
    product is a 1x1 convolution (no float64 kernel in onnxruntime)."""
    x = "x"
    nodes = [h.make_node("Add", [x, "c"], ["xc"]), h.make_node("Sub", ["xc", "c"], ["s"])]
    inits = [nh.from_array(np.array(c, np.float32), "c"), nh.from_array(np.array(0, np.float32), "lo"),
             nh.from_array(np.array(6, np.float32), "hi")]
    if conv:
        nodes.append(h.make_node("Conv", ["s", "m"], ["t"]))
        inits.append(nh.from_array(np.full((1, 1, 1, 1), mul, np.float32), "m"))
    else:
        nodes.append(h.make_node("Mul", ["s", "m"], ["t"]))
        inits.append(nh.from_array(np.array(mul, np.float32), "m"))
    nodes.append(h.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    shape = [1, 1, 16, 16] if conv else [256]
    return _model(nodes, inits, shape=shape, out_shape=shape)


def test_an_output_through_clip_closer_to_float64_is_accepted():
    """The reported case: the float32 runs differ by more than 1e-5 x scale, but the optimized model is
    closer to the float64 reference than the input is (here ``(x + 256) - 256`` against ``(x + 1024) - 1024``)."""
    rep = compare_models(_clip(1024), _clip(256), reference="never")
    assert not rep.ok and rep.max_abs > rep.tolerance * rep.scale  # what used to be refused
    rep = compare_models(_clip(1024), _clip(256))
    assert rep.ok and rep.reference == "onnxruntime" and not rep.no_reference
    assert 0 < rep.ref_error < rep.input_ref_error  # closer to float64 than the input's own run
    exact = compare_models(_clip(1024), _clip(0))
    assert exact.ok and exact.ref_error == 0


def test_a_wrong_output_is_still_refused():
    rep = compare_models(_clip(1024), _clip(1024, mul=1.001))
    assert not rep.ok and rep.reference == "onnxruntime" and rep.worst_output == "y"
    assert rep.ref_error > 1e-3
    # rounding, but farther from float64 than the input's own error plus the tolerance: refused too
    rep = compare_models(_clip(1024), _clip(8192))
    assert not rep.ok and rep.reference == "onnxruntime"
    assert rep.ref_error > numerics.REFERENCE_SLACK * rep.input_ref_error + rep.tolerance * rep.scale


def test_the_criterion():
    tol, scale = 1e-5, 1.0
    assert numerics.accept_against_reference(1.3e-5, 2.0e-5, tol, scale)  # the numbers
    assert numerics.accept_against_reference(2.9e-5, 2.0e-5, tol, scale)  # within the input's error + tol
    assert not numerics.accept_against_reference(3.1e-5, 2.0e-5, tol, scale)
    assert numerics.accept_against_reference(1e-5, 0.0, tol, scale)  # an exact input: the old tolerance
    assert not numerics.accept_against_reference(1.1e-5, 0.0, tol, scale)


def test_the_float64_reference_is_built_only_where_float32_disagrees():
    assert compare_models(_clip(1024), _clip(1024)).reference == ""
    rep = compare_models(_clip(1024), _clip(1024), reference="always")
    assert rep.ok and rep.reference == "onnxruntime" and rep.ref_error == rep.input_ref_error > 0


def test_onnx_reference_where_onnxruntime_has_no_float64_kernel():
    rep = compare_models(_clip(1024, conv=True), _clip(256, conv=True))  # onnxruntime has no float64 Conv
    assert rep.ok and rep.reference == "onnx.reference"
    assert not compare_models(_clip(1024, conv=True), _clip(1024, mul=1.001, conv=True)).ok


def test_without_a_float64_reference_the_float32_comparison_decides_and_says_why(monkeypatch):
    monkeypatch.setattr(numerics, "MAX_REFERENCE_BYTES", 4)
    rep = compare_models(_clip(1024), _clip(256))
    assert not rep.ok and rep.reference == "" and "float64 copy would hold" in rep.no_reference


def test_a_reference_far_from_the_input_is_not_used():
    """``(x + 2**24) - 2**24`` in float32 rounds x to an integer: the input is off by up to 0.5, over
    ``REFERENCE_AGREEMENT`` tolerances from float64, so float64 does not judge (the float32 comparison does)."""
    rep = compare_models(_clip(2.0 ** 24), _clip(0))
    assert not rep.ok and rep.reference == "onnxruntime" and "not used" in rep.no_reference


def _two_splits(slices: bool) -> onnx.ModelProto:
    """``y = concat(second half of x, first third of x)``: as two Splits of x into 2 and 3 parts (which
    onnxruntime 1.31.1's optimizer merges into one, computing a [1, 8] result), or as two Slices."""
    if slices:
        nodes = [h.make_node("Slice", ["x", "s6", "e12", "ax"], ["b"]), h.make_node("Slice", ["x", "s0", "e4", "ax"], ["c"])]
        inits = [nh.from_array(np.array([v], np.int64), n) for n, v in
                 [("s6", 6), ("e12", 12), ("s0", 0), ("e4", 4), ("ax", 1)]]
    else:
        nodes = [h.make_node("Split", ["x"], ["a", "b"], axis=1), h.make_node("Split", ["x"], ["c", "d", "e"], axis=1)]
        inits = []
    return _model(nodes + [h.make_node("Concat", ["b", "c"], ["y"], axis=1)], inits, shape=(1, 12), opset=13)


def test_the_models_run_without_onnxruntime_graph_optimizations():
    import onnxruntime as ort

    x = np.arange(12, dtype=np.float32).reshape(1, 12)
    want = np.concatenate([x[:, 6:], x[:, :4]], axis=1)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    optimized = ort.InferenceSession(_two_splits(False).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    if optimized.run(None, {"x": x})[0].shape == want.shape:
        pytest.skip("this onnxruntime's optimizer computes the two Splits right")
    assert np.array_equal(numerics._session(_two_splits(False), "input").run(None, {"x": x})[0], want)
    rep = compare_models(_two_splits(False), _two_splits(True))  # (with the optimizer on: shapes differ)
    assert rep.ok and rep.max_abs == 0


def test_the_float64_copy():
    """Weights, a Constant's value_float, ConstantOfShape's value and a Cast's target become float64;
    Resize's scales (float32 by the spec) get a Cast back; the copy is a valid model and computes the
    float32 model's numbers in float64."""
    nodes = [h.make_node("Constant", [], ["k"], value_float=0.5), h.make_node("Mul", ["x", "k"], ["a"]),
             h.make_node("Resize", ["a", "", "scales"], ["r"], mode="linear"),
             h.make_node("Cast", ["r"], ["c"], to=T.FLOAT),
             h.make_node("ConstantOfShape", ["shp"], ["z"], value=nh.from_array(np.array([0.25], np.float32))),
             h.make_node("Add", ["c", "z"], ["y"])]
    m = _model(nodes, [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
                       nh.from_array(np.array([1, 1, 4, 4], np.int64), "shp")], shape=(1, 1, 2, 2),
               out_shape=[1, 1, 4, 4])
    m64 = float64_copy(m)
    onnx.checker.check_model(m64, full_check=True)
    assert m.graph.input[0].type.tensor_type.elem_type == T.FLOAT  # (the original is not changed)
    assert m64.graph.input[0].type.tensor_type.elem_type == T.DOUBLE
    x = np.random.default_rng(0).standard_normal((1, 1, 2, 2)).astype(np.float32)
    (want,) = numerics._session(m, "input").run(None, {"x": x})
    (got,), = float64_reference(m, [{"x": x}], ["y"])[0]
    assert got.dtype == np.float64 and np.allclose(got, want, atol=1e-6)


def test_taso_opt_writes_the_more_accurate_output_and_refuses_the_wrong_one(tmp_path, monkeypatch, capsys):
    """End to end: an "optimizer" whose output is the more accurate model is written, with the float64
    judgement in the summary line; a wrong one is refused, as is any output where no reference can be built."""
    from taso_mlir.dialect import onnx_export
    from taso_mlir.tools import taso_opt

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_clip(1024), src)

    def exporting(model):
        monkeypatch.setattr(onnx_export, "export_onnx", lambda module: model)

    exporting(_clip(256))
    assert taso_opt.main([str(src), "-o", str(out), "--verify-numerics"]) == 0
    err = capsys.readouterr().err
    assert "no farther than the input (+ that) from a float64 reference (onnxruntime)" in err and err.endswith(": ok\n"), err
    written = {t.name: nh.to_array(t) for t in onnx.load(out).graph.initializer}
    assert written["c"] == 256
    out.unlink()

    exporting(_clip(1024, mul=1.001))
    assert taso_opt.main([str(src), "-o", str(out), "--verify-numerics"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output 'y' exceeds 1e-05 x scale, and is farther than the input" in err[0], err
    assert not out.exists()

    monkeypatch.setattr(numerics, "MAX_REFERENCE_BYTES", 4)
    exporting(_clip(256))
    assert taso_opt.main([str(src), "-o", str(out), "--verify-numerics"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "float32 only (no float64 reference: the model file holds" in err[0], err
    assert not out.exists()


def test_a_model_that_rounds_to_float16_is_compared_at_float16_precision():
    """A Cast to float16 on the way to an output makes the output only as precise as float16: a rewrite
    before it that changes float32 rounding (a folded batchnorm) moves the result by one float16 unit
    (fuzz campaign seed 9038). The tolerance is then 4 float16 units; a float32-only model keeps 1e-5."""
    from onnx import TensorProto, helper

    from taso_mlir.dialect.numerics import compare_models, rounding_floor

    def model(scale: float, cast: bool):
        nodes = [helper.make_node("Mul", ["x", "k"], ["m"])]
        if cast:
            nodes += [helper.make_node("Cast", ["m"], ["h"], to=TensorProto.FLOAT16),
                      helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)]
        else:
            nodes += [helper.make_node("Identity", ["m"], ["y"])]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
                              [helper.make_tensor("k", TensorProto.FLOAT, [], [scale])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    assert rounding_floor(model(1.0, True)) == 4 * 2.0 ** -10 and rounding_floor(model(1.0, False)) == 0.0
    off = 1.0 + 2.0 ** -10  # one float16 unit of relative change before the cast
    rep = compare_models(model(1.0, True), model(off, True), reference="never")
    assert rep.tolerance == 4 * 2.0 ** -10 and rep.worst <= 1.0, rep
    rep = compare_models(model(1.0, False), model(off, False), reference="never")
    assert rep.tolerance == 1e-5 and rep.worst > 1.0, rep
