"""taso-fold-batchnorm: the Z3 proof of its identity, differential tests of the folded convolution
against the reference semantics of conv2d followed by batchnorm, the cases it leaves alone, its place
at the start of taso-search (the report's cost before is the input's), and an ONNX model end to end
in onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.dialect import specs
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.ops import dense_array, taso_attrs
from taso_mlir.passes.prepare import fold_batchnorm as FB
from taso_mlir.passes.search import taso_search
from taso_mlir.passes.search import tgraph as T
from taso_mlir.passes.cost.oracle import get_cost_model
from taso_mlir.passes.registry import build_pass_manager, run_pass_manager

NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
TOL = {"f16": 4e-3, "f32": 2e-6, "f64": 1e-13}  # x the output's scale


def test_identity_is_proved():
    import z3

    assert FB.prove() == z3.unsat
    for k in range(1, 5):
        assert FB.prove(k) == z3.unsat


def _attr(arr: np.ndarray, et: str) -> str:
    """``dense<...> : tensor<...>`` for ``arr`` (printed by MLIR, so the values are exact)."""
    return str(ir.DenseElementsAttr.get(np.ascontiguousarray(arr.astype(NP[et]))))


def _tt(shape, et):
    return f"tensor<{'x'.join(map(str, shape))}x{et}>"


def _module(x_shape, params: dict, conv_attrs: dict, eps: float, et: str, act: str = "none",
            extra_use: bool = False, bn_from_arg: bool = False) -> str:
    """One function: conv2d(x, w[, b]) -> batchnorm(scale, bias, mean, var); ``params`` holds arrays."""
    w = params["w"]
    out = specs.infer_shapes("conv2d", [x_shape, w.shape] + ([params["b"].shape] if "b" in params else []),
                             conv_attrs)[0]
    lines = []
    for k in ("w", "b", "scale", "bias", "mean", "var"):
        if k in params and not (bn_from_arg and k == "mean"):
            lines.append(f'%{k} = "taso.weight"() {{name = "{k}", value = {_attr(params[k], et)}}} : () -> '
                         f'{_tt(params[k].shape, et)}')
    has_b = "b" in params
    ops = "%x, %w" + (", %b" if has_b else "")
    tys = f"{_tt(x_shape, et)}, {_tt(w.shape, et)}" + (f", {_tt(params['b'].shape, et)}" if has_b else "")
    a = conv_attrs
    lines.append(
        f'%c = "taso.conv2d"({ops}) {{activation = "{act}", dilations = array<i64: {a["dilations"][0]}, '
        f'{a["dilations"][1]}>, group = {a["group"]} : i64, pads = array<i64: {", ".join(map(str, a["pads"]))}>, '
        f'strides = array<i64: {a["strides"][0]}, {a["strides"][1]}>, '
        f'operandSegmentSizes = array<i32: 1, 1, {int(has_b)}>}} : ({tys}) -> {_tt(out, et)}')
    pt = _tt(params["scale"].shape, et)
    mean = "%m" if bn_from_arg else "%mean"
    lines.append(f'%y = "taso.batchnorm"(%c, %scale, %bias, {mean}, %var) {{epsilon = {eps:.9e} : f32}} : '
                 f'({_tt(out, et)}, {pt}, {pt}, {pt}, {pt}) -> {_tt(out, et)}')
    rets, rtys = ["%y"], [_tt(out, et)]
    if extra_use:
        rets.append("%c")
        rtys.append(_tt(out, et))
    args = f"%x: {_tt(x_shape, et)}" + (f", %m: {pt}" if bn_from_arg else "")
    body = "\n  ".join(lines)
    return (f"func.func @f({args}) -> ({', '.join(rtys)}) {{\n  {body}\n  "
            f"return {', '.join(rets)} : {', '.join(rtys)}\n}}\n")


def _params(rng, cin, cout, group, k, bias: bool):
    p = {"w": rng.standard_normal((cout, cin // group) + k),
         "scale": rng.standard_normal(cout), "bias": rng.standard_normal(cout),
         "mean": rng.standard_normal(cout), "var": rng.uniform(0.05, 3.0, cout)}
    if bias:
        p["b"] = rng.standard_normal(cout)
    return p


def _run(text: str, pipeline: str = "builtin.module(taso-fold-batchnorm)") -> str:
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        run_pass_manager(build_pass_manager(pipeline, ctx), m.operation)
        assert m.operation.verify()
        return str(m)


def _folded_conv(text: str):
    """(conv attrs, [w', b'] arrays) of the one conv2d in ``text``, which has no batchnorm left."""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        ops = [o.operation for o in m.body.operations[0].operation.regions[0].blocks[0].operations]
        assert not [o for o in ops if o.name == "taso.batchnorm"], text
        (conv,) = [o for o in ops if o.name == "taso.conv2d"]
        arrays = [dense_array(v.owner.attributes["value"]) for v in list(conv.operands)[1:]]
        attrs = {k: v for k, v in taso_attrs(conv).items()}
        return attrs, arrays, [str(ir.StringAttr(v.owner.attributes["name"]).value) for v in list(conv.operands)[1:]]


CASES = [  # (x shape, cout, group, kernel, strides, pads, dilations, bias)
    ((1, 3, 7, 5), 4, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), False),
    ((2, 3, 9, 7), 5, 1, (3, 2), (2, 2), (1, 0, 0, 1), (1, 1), True),
    ((1, 6, 11, 6), 9, 3, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 6, 8, 9), 6, 6, (3, 3), (2, 1), (1, 1, 1, 1), (2, 1), True),  # depthwise
    ((1, 4, 5, 5), 8, 2, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True),
]


@pytest.mark.parametrize("et", ["f16", "f32", "f64"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_folded_conv_matches_conv_then_batchnorm(case, et):
    x_shape, cout, group, k, strides, pads, dil, bias = CASES[case]
    rng = np.random.default_rng(case)
    p = _params(rng, x_shape[1], cout, group, k, bias)
    eps = 1e-3
    cattrs = dict(strides=strides, pads=pads, dilations=dil, group=group)
    with make_context():
        text = _module(x_shape, p, cattrs, eps, et)
    out = _run(text)
    attrs, (w2, b2), names = _folded_conv(out)
    assert attrs["group"] == group and tuple(attrs["strides"]) == strides and tuple(attrs["pads"]) == pads
    assert attrs["activation"] == "none" and w2.dtype == NP[et] and b2.dtype == NP[et]
    assert names == ["w.bn", "bias.bn"]
    dt = NP[et]
    eps_attr = float(np.float32(eps))  # the attribute is f32
    P = {k: v.astype(dt) for k, v in p.items()}
    for trial in range(3):
        x = rng.standard_normal(x_shape).astype(dt)
        y = specs.evaluate("conv2d", [x, P["w"]] + ([P["b"]] if bias else []), cattrs)[0]
        ref = specs.evaluate("batchnorm", [y, P["scale"], P["bias"], P["mean"], P["var"]], {"epsilon": eps_attr})[0]
        got = specs.evaluate("conv2d", [x, w2, b2], attrs)[0]
        assert got.shape == ref.shape and got.dtype == ref.dtype
        scale = float(np.max(np.abs(ref)))
        tol = TOL[et] * scale
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
        assert err <= tol, (err, tol)


def test_params_are_computed_in_float64_and_rounded_once():
    rng = np.random.default_rng(7)
    p = _params(rng, 3, 4, 1, (3, 3), True)
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    eps = float(np.float32(1e-5))
    w2, b2 = FB.folded_params(p32["w"], p32["b"], p32["scale"], p32["bias"], p32["mean"], p32["var"], eps)
    assert w2.dtype == np.float64 and b2.dtype == np.float64
    k = p32["scale"].astype(np.float64) / np.sqrt(p32["var"].astype(np.float64) + eps)
    np.testing.assert_array_equal(w2, p32["w"].astype(np.float64) * k[:, None, None, None])
    np.testing.assert_array_equal(b2, (p32["b"].astype(np.float64) - p32["mean"]) * k + p32["bias"])
    with make_context():
        text = _module((1, 3, 6, 6), p, dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1), 1e-5, "f32")
    _, (wf, bf), _ = _folded_conv(_run(text))
    np.testing.assert_array_equal(wf, w2.astype(np.float32))
    np.testing.assert_array_equal(bf, b2.astype(np.float32))


@pytest.mark.parametrize("variant,why", [
    ("relu", "a conv with a fused relu: batchnorm(relu(conv)) is not a conv"),
    ("extra_use", "the conv result is also returned: it would be computed anyway"),
    ("param_arg", "the mean is a function argument, not a constant"),
    ("zero_var", "var + eps = 0 in a channel: the batchnorm divides by zero there"),
    ("f16_overflow", "the folded kernel overflows f16 (100 x 1000 / sqrt(1e-4) = 1e7): it would be inf"),
])
def test_not_folded(variant, why):
    rng = np.random.default_rng(3)
    p = _params(rng, 4, 4, 1, (3, 3), False)
    et = "f32"
    if variant == "zero_var":
        p["var"][1] = -1.0
    if variant == "f16_overflow":
        et = "f16"
        p = {k: v.astype(np.float16) for k, v in p.items()}
        p["w"][0, 0, 0, 0], p["scale"][0], p["var"][0] = 100.0, 1000.0, 1e-4
    with make_context():
        text = _module((1, 4, 6, 6), p, dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1),
                       1.0 if variant == "zero_var" else 1e-5, et, act="relu" if variant == "relu" else "none",
                       extra_use=variant == "extra_use", bn_from_arg=variant == "param_arg")
    out = _run(text)
    assert out.count("taso.batchnorm") == 1 and out.count("taso.conv2d") == 1, why
    assert ".bn" not in out, why


def test_batchnorm_after_another_op_is_left_alone():
    text = """
func.func @f(%x: tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32> {
  %s = "taso.weight"() {name = "s", value = dense<2.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %r = "taso.relu"(%x) : (tensor<1x4x5x5xf32>) -> tensor<1x4x5x5xf32>
  %y = "taso.batchnorm"(%r, %s, %s, %s, %s) {epsilon = 1.0e-05 : f32} : (tensor<1x4x5x5xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x5x5xf32>
  return %y : tensor<1x4x5x5xf32>
}
"""
    out = _run(text)
    assert out.count("taso.batchnorm") == 1 and "taso.relu" in out


def test_shared_weights_stay_and_names_are_unique():
    """Two convs share w and the batchnorms share their parameters: each site gets its own folded
    weights, with fresh names, and the source weights go only when nothing reads them."""
    rng = np.random.default_rng(5)
    p = _params(rng, 4, 4, 1, (1, 1), False)
    with make_context():
        one = _module((1, 4, 3, 3), p, dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1), 1e-5, "f32")
    lines = one.splitlines()
    body = [ln for ln in lines[1:-2]]
    second = [ln.replace("%c ", "%c2 ").replace("(%c,", "(%c2,").replace("%y ", "%y2 ")
              for ln in body if "taso.conv2d" in ln or "taso.batchnorm" in ln]
    ret = lines[-2].replace("return %y : tensor<1x4x3x3xf32>",
                            "%s = \"taso.ewadd\"(%y, %y2) : (tensor<1x4x3x3xf32>, tensor<1x4x3x3xf32>) -> "
                            "tensor<1x4x3x3xf32>\n  return %s : tensor<1x4x3x3xf32>")
    text = "\n".join([lines[0]] + body + second + [ret, lines[-1]]) + "\n"
    out = _run(text)
    assert "taso.batchnorm" not in out
    for n in ("w.bn", "w.bn_1", "bias.bn", "bias.bn_1"):
        assert f'name = "{n}"' in out, out
    assert 'name = "w"' not in out and 'name = "mean"' not in out  # nothing reads them any more


def test_search_runs_it_first_and_reports_the_cost_before_folding():
    rng = np.random.default_rng(11)
    p = _params(rng, 8, 8, 1, (3, 3), False)
    with make_context():
        text = _module((1, 8, 7, 7), p, dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1), 1e-5, "f32")
    # the input's cost, measured independently with the same cost model
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        cm = get_cost_model("analytic")
        g, _ = T.from_function(m.body.operations[0].operation, T.Builder(cm))
        cost_in, ops_in = g.cost, g.num_ops
    out = _run(text, "builtin.module(taso-search)")
    assert "taso.batchnorm" not in out
    fr = taso_search.LAST_REPORT["functions"][0]
    assert fr["batchnorms_folded"] == 1
    assert fr["cost_before_ms"] == cost_in and fr["ops_before"] == ops_in
    assert fr["cost_after_fold_ms"] < cost_in and fr["cost_after_ms"] <= fr["cost_after_fold_ms"]
    text_rep = taso_search.format_report(taso_search.LAST_REPORT)
    assert "1 batchnorms folded into convolutions" in text_rep


def test_pipeline_and_flag_spellings(tmp_path):
    rng = np.random.default_rng(2)
    p = _params(rng, 2, 2, 1, (1, 1), True)
    with make_context():
        text = _module((1, 2, 3, 3), p, dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1), 1e-5, "f32")
    src = tmp_path / "in.mlir"
    src.write_text(text)
    for args in (["--taso-fold-batchnorm"], ["--pass-pipeline=builtin.module(taso-fold-batchnorm,cse)"]):
        r = _taso_opt(str(src), *args)
        assert r.returncode == 0, r.stderr
        assert "taso.batchnorm" not in r.stdout and r.stdout.count("taso.conv2d") == 1
    r = _taso_opt(str(src), "--pass-pipeline=builtin.module(taso-fold-batchnorm{x=1})")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "has no option 'x'" in r.stderr


def _taso_opt(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *args], capture_output=True, text=True)


def _resnet_block() -> onnx.ModelProto:
    """Conv (no bias) + BatchNormalization + Relu twice (the second grouped, stride 2, odd sizes)."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(8, 3, 3, 3) * 0.3, "w1"), numpy_helper.from_array(f(12, 4, 3, 3) * 0.3, "w2")]
    for i, c in ((1, 8), (2, 12)):
        inits += [numpy_helper.from_array(f(c), f"s{i}"), numpy_helper.from_array(f(c), f"b{i}"),
                  numpy_helper.from_array(f(c) * 0.1, f"m{i}"),
                  numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), f"v{i}")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"], epsilon=1e-5),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], group=2),
        helper.make_node("BatchNormalization", ["c2", "s2", "b2", "m2", "v2"], ["n2"], epsilon=1e-3),
        helper.make_node("Relu", ["n2"], ["y"]),
    ]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 15, 13])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 8, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_end_to_end_onnx_conv_batchnorm_relu(tmp_path):
    src = tmp_path / "block.onnx"
    onnx.save(_resnet_block(), src)
    out = tmp_path / "block.opt.onnx"
    rep = tmp_path / "report.json"
    r = _taso_opt(str(src), "--taso-search", "-o", str(out), f"--taso-report={rep}")
    assert r.returncode == 0, r.stderr
    assert "onnxruntime: ok" in r.stderr, r.stderr  # taso-opt's own numerics check ran and passed
    kinds = [n.op_type for n in onnx.load(out).graph.node]
    assert "BatchNormalization" not in kinds and kinds.count("Conv") == 2 and kinds.count("Relu") == 2, kinds
    data = json.loads(rep.read_text())
    assert data["functions"][0]["batchnorms_folded"] == 2
    assert data["cost_after_ms"] < data["cost_before_ms"]
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    for _ in range(3):
        feeds = {"x": rng.standard_normal((1, 3, 15, 13)).astype(np.float32)}
        ya = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        yb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        assert float(np.max(np.abs(ya))) > 0
        np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ya))))
