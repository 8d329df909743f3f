"""taso-fuse-relu6: the Z3 proof, the rounding argument, the relu6 activation's reference semantics,
export (Clip's bounds as inputs from opset 11, as attributes before) and the CPU cost model's one-op
model, MobileNet-style ONNX models end to end in onnxruntime (bit-identical outputs), and what is left
alone."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect import specs
from taso_mlir.passes.prepare import fuse_relu6 as FC
from taso_mlir.passes.cost.oracle import OpSig, _one_op_model


def test_fusion_is_proved():
    import z3

    assert FC.prove() == z3.unsat


def test_clip_commutes_with_rounding():
    assert FC.check_rounding()


def test_relu6_reference_semantics():
    x = np.array([[-3.0, -0.0, 0.5, 5.5, 6.0, 6.5, 100.0]], np.float32).reshape(1, 7, 1, 1)
    w = np.eye(7, dtype=np.float32).reshape(7, 7, 1, 1)
    got = specs.evaluate("conv2d", [x, w], {"activation": "relu6"})[0]
    np.testing.assert_array_equal(got.reshape(-1), [0, 0, 0.5, 5.5, 6, 6, 6])
    assert got.dtype == np.float32
    # relu6 is a conv activation only: cuBLAS has no clipped-ReLU epilogue for a matmul
    with pytest.raises(specs.SpecError, match="must be one of"):
        specs.spec("matmul").complete_attrs({"activation": "relu6"})


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_cpu_cost_model_times_conv_then_clip(dtype):
    import onnxruntime as ort

    sig = OpSig("conv2d", (("activation", "relu6"), ("dilations", (1, 1)), ("group", 1), ("pads", (1, 1, 1, 1)),
                           ("strides", (1, 1))), ((1, 4, 6, 6), (8, 4, 3, 3)), ((1, 8, 6, 6),), dtype, False, (False, True))
    m = _one_op_model(sig)
    assert [n.op_type for n in m.graph.node] == ["Conv", "Clip"]
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    npdt = np.float32 if dtype == "f32" else np.float16
    y = s.run(None, {"x0": np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(npdt) * 4})[0]
    assert y.min() == 0 and y.max() == 6  # the weights are all positive: both bounds are reached


def _conv(rng, name, cout, cin, k, group=1, dtype=np.float32):
    return numpy_helper.from_array((rng.standard_normal((cout, cin // group, k, k)) * 0.8).astype(dtype), name)


def _mobilenet_block(opset: int = 17, dtype=np.float32, bn: bool = True) -> onnx.ModelProto:
    """An inverted residual block as torchvision exports it (batchnorm left in, if ``bn``): 1x1 expand +
    BN + ReLU6, depthwise 3x3 + BN + ReLU6, 1x1 project + BN, residual add; then one Clip(0, 5) (not
    ReLU6), one Clip(0, 6) after the Add (not after a conv) and a conv whose result is also an output."""
    rng = np.random.default_rng(0)
    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}[dtype]
    inits = [_conv(rng, "w1", 16, 4, 1, dtype=dtype), _conv(rng, "w2", 16, 16, 3, 16, dtype), _conv(rng, "w3", 4, 16, 1, dtype=dtype),
             _conv(rng, "w4", 4, 4, 3, dtype=dtype), _conv(rng, "w5", 4, 4, 1, dtype=dtype)]
    for i, c in ((1, 16), (2, 16), (3, 4)):
        inits += [numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(dtype), f"s{i}"),
                  numpy_helper.from_array(rng.standard_normal(c).astype(dtype), f"b{i}"),
                  numpy_helper.from_array((rng.standard_normal(c) * 0.1).astype(dtype), f"m{i}"),
                  numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(dtype), f"v{i}")]
    nodes = []

    def clip(x, y, hi=6.0):
        if opset >= 11:
            nodes.append(helper.make_node("Constant", [], [f"{y}_lo"], value=numpy_helper.from_array(np.asarray(0, dtype))))
            nodes.append(helper.make_node("Constant", [], [f"{y}_hi"], value=numpy_helper.from_array(np.asarray(hi, dtype))))
            nodes.append(helper.make_node("Clip", [x, f"{y}_lo", f"{y}_hi"], [y]))
        else:
            nodes.append(helper.make_node("Clip", [x], [y], min=0.0, max=hi))

    def batchnorm(x, i, y):
        if not bn:
            nodes.append(helper.make_node("Identity", [x], [y]))
            return
        nodes.append(helper.make_node("BatchNormalization", [x, f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [y], epsilon=1e-5))

    nodes.append(helper.make_node("Conv", ["x", "w1"], ["c1"]))
    batchnorm("c1", 1, "n1")
    clip("n1", "r1")
    nodes.append(helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=16))
    batchnorm("c2", 2, "n2")
    clip("n2", "r2")
    nodes.append(helper.make_node("Conv", ["r2", "w3"], ["c3"]))
    batchnorm("c3", 3, "n3")
    nodes.append(helper.make_node("Add", ["x", "n3"], ["a"]))
    clip("a", "ra")  # after an Add: stays
    nodes.append(helper.make_node("Conv", ["ra", "w4"], ["c4"], pads=[1, 1, 1, 1]))
    clip("c4", "r4", hi=5.0)  # Clip(0, 5): stays
    nodes.append(helper.make_node("Conv", ["r4", "w5"], ["c5"]))
    clip("c5", "y")  # c5 is an output too: stays
    shape = [1, 4, 7, 6]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", elem, shape)],
                          [helper.make_tensor_value_info("y", elem, shape), helper.make_tensor_value_info("c5", elem, shape)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset >= 11 else 6)


def _taso_opt(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *args], capture_output=True, text=True)


# (float16 without batchnorm: folding a float16 batchnorm rounds the weights, which the numeric check
# refuses at float16's tolerance; that is the batchnorm folding's, tested in test_fold_batchnorm.py)
@pytest.mark.parametrize("opset,dtype,bn", [(17, np.float32, True), (13, np.float16, False), (10, np.float32, True)])
def test_mobilenet_block_end_to_end(tmp_path, opset, dtype, bn):
    import onnxruntime as ort

    src = tmp_path / "block.onnx"
    model = _mobilenet_block(opset, dtype, bn)
    onnx.checker.check_model(model)
    onnx.save(model, src)
    before = src.read_bytes()
    out, rep = tmp_path / "block.opt.onnx", tmp_path / "report.json"
    r = _taso_opt(str(src), "--taso-search", "-o", str(out), f"--taso-report={rep}")
    assert r.returncode == 0, r.stderr
    assert "onnxruntime: ok" in r.stderr, r.stderr
    assert src.read_bytes() == before
    fr = json.loads(rep.read_text())["functions"][0]
    assert fr["batchnorms_folded"] == (3 if bn else 0) and fr["relu6_fused"] == 2
    assert fr["cost_after_ms"] < fr["cost_before_ms"]
    opt = onnx.load(out)
    kinds = [n.op_type for n in opt.graph.node]
    # the two fused ReLU6 are written back as Clip after their Conv: 5 Clips in, 5 out
    assert kinds.count("Clip") == 5 and kinds.count("Conv") == 5 and "BatchNormalization" not in kinds, kinds
    clips = [n for n in opt.graph.node if n.op_type == "Clip"]
    if opset < 11:
        assert all(len(n.input) == 1 and {a.name for a in n.attribute} == {"min", "max"} for n in clips)
    else:
        assert all(len(n.input) == 3 for n in clips)
    rng = np.random.default_rng(1)
    sa = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    tol = 2e-3 if dtype == np.float16 else 1e-5
    for _ in range(3):
        feeds = {"x": (rng.standard_normal((1, 4, 7, 6)) * 3).astype(dtype)}
        ya, yb = sa.run(None, feeds), sb.run(None, feeds)
        for a, b in zip(ya, yb):
            assert float(np.max(np.abs(a))) > 0
            # the clipped values are exactly 0 and 6 on both sides
            np.testing.assert_array_equal(a == 0, b == 0)
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=tol,
                                       atol=tol * float(np.max(np.abs(a.astype(np.float64)))))


def test_bf16_conv_is_left_alone(tmp_path):
    """Only f16, f32 and f64 convs fuse (numpy cannot read bf16 weights, nor the bounds)."""
    text = """
func.func @f(%x: tensor<1x2x5x5xbf16>) -> tensor<1x4x5x5xbf16> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<4x2x3x3xbf16>} : () -> tensor<4x2x3x3xbf16>
  %lo = "taso.weight"() {name = "lo", value = dense<0.0> : tensor<bf16>} : () -> tensor<bf16>
  %hi = "taso.weight"() {name = "hi", value = dense<6.0> : tensor<bf16>} : () -> tensor<bf16>
  %c = "taso.conv2d"(%x, %w) {activation = "none", dilations = array<i64: 1, 1>, group = 1 : i64, pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<1x2x5x5xbf16>, tensor<4x2x3x3xbf16>) -> tensor<1x4x5x5xbf16>
  %y = "onnx.Clip"(%c, %lo, %hi) : (tensor<1x4x5x5xbf16>, tensor<bf16>, tensor<bf16>) -> tensor<1x4x5x5xbf16>
  return %y : tensor<1x4x5x5xbf16>
}
"""
    src = tmp_path / "bf16.mlir"
    src.write_text(text)
    r = _taso_opt(str(src), "--taso-fuse-relu6")
    assert r.returncode == 0, r.stderr
    assert "onnx.Clip" in r.stdout and "relu6" not in r.stdout


def test_relu6_conv_is_opaque_to_the_rules(tmp_path):
    """Two sibling ReLU6 convs on one input are not merged (the rules are proved for none and relu
    only); the same convs with relu are (TASO's conv merge), so the merge is what the activation stops."""
    def block(act):
        rng = np.random.default_rng(3)
        nodes = [helper.make_node("Conv", ["x", "wa"], ["ca"], pads=[1, 1, 1, 1]),
                 helper.make_node("Conv", ["x", "wb"], ["cb"], pads=[1, 1, 1, 1])]
        if act == "relu6":
            nodes += [helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.asarray(0, np.float32))),
                      helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.asarray(6, np.float32))),
                      helper.make_node("Clip", ["ca", "lo", "hi"], ["ra"]), helper.make_node("Clip", ["cb", "lo", "hi"], ["rb"])]
        else:
            nodes += [helper.make_node("Relu", ["ca"], ["ra"]), helper.make_node("Relu", ["cb"], ["rb"])]
        nodes.append(helper.make_node("Add", ["ra", "rb"], ["y"]))
        g = helper.make_graph(nodes, "sib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])],
                              [_conv(rng, "wa", 32, 32, 3), _conv(rng, "wb", 32, 32, 3)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    reports = {}
    for act in ("relu", "relu6"):
        src, out, rep = tmp_path / f"{act}.onnx", tmp_path / f"{act}.opt.onnx", tmp_path / f"{act}.json"
        onnx.save(block(act), src)
        r = _taso_opt(str(src), "--taso-search", "-o", str(out), f"--taso-report={rep}")
        assert r.returncode == 0, r.stderr
        reports[act] = json.loads(rep.read_text())["functions"][0]
    assert reports["relu"]["rewrites_applied"] > 0
    assert reports["relu6"]["relu6_fused"] == 2 and reports["relu6"]["rewrites_applied"] == 0


def _small(nodes, inits, outs=("y",), opset=17) -> onnx.ModelProto:
    shape = [1, 8, 10, 10]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype)))


def _cases():
    rng = np.random.default_rng(5)
    w = _conv(rng, "w", 8, 8, 3)
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    return {
        # a bound left out (the empty optional input): -inf, not ReLU6; left as is, no error
        "no_min": (_small([conv, _const("hi", 6.0), helper.make_node("Clip", ["c", "", "hi"], ["y"])], [w]), 0, 1),
        "no_max": (_small([conv, _const("lo", 0.0), helper.make_node("Clip", ["c", "lo", ""], ["y"])], [w]), 0, 1),
        # Conv -> Relu -> Clip(0, 6): relu6, the Relu and the Clip go
        "relu_then_clip": (_small([conv, helper.make_node("Relu", ["c"], ["r"]), _const("lo", 0.0), _const("hi", 6.0),
                                   helper.make_node("Clip", ["r", "lo", "hi"], ["y"])], [w]), 1, 0),
        # bounds computed from double constants by a Cast: folded first, then fused
        "cast_bounds": (_small([conv, _const("lo64", 0.0, np.float64), _const("hi64", 6.0, np.float64),
                                helper.make_node("Cast", ["lo64"], ["lo"], to=TensorProto.FLOAT),
                                helper.make_node("Cast", ["hi64"], ["hi"], to=TensorProto.FLOAT),
                                helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], [w]), 1, 0),
        # two equal convs, one clipped, the other an output: merged first, so nothing is fused (the
        # merged conv has another use) and one Conv is left
        "repeat": (_small([conv, helper.make_node("Conv", ["x", "w"], ["c2"], pads=[1, 1, 1, 1]), _const("lo", 0.0),
                           _const("hi", 6.0), helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], [w],
                          outs=("y", "c2")), 0, 1),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_onnx_cases(tmp_path, case):
    model, fused, clips_left = _cases()[case]
    onnx.checker.check_model(model, full_check=True)
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "rep.json"
    onnx.save(model, src)
    r = _taso_opt(str(src), "--taso-search", "-o", str(out), f"--taso-report={rep}")
    assert r.returncode == 0, r.stderr
    assert "onnxruntime: ok" in r.stderr and "max |difference| 0 " in r.stderr, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    assert fr["relu6_fused"] == fused
    kinds = [n.op_type for n in onnx.load(out).graph.node]
    assert kinds.count("Conv") == 1, kinds
    # a fused ReLU6 is written back as one Clip after the Conv
    assert kinds.count("Clip") == clips_left + fused and "Relu" not in kinds, kinds
    r = _taso_opt(str(src), "--taso-fuse-relu6", "-o", str(tmp_path / "pass.onnx"))
    assert r.returncode == 0, r.stderr
