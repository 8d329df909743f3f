"""convert-onnx-to-taso raises ONNX ``Gemm`` (Y = alpha * op(A) @ op(B) + beta * C) on 2-D static operands
with alpha = 1 and (no C or beta = 1) to ``[taso.transpose] -> taso.matmul -> [taso.ewadd]``; op(B) of a
weight is a transposed weight ``<name>.T`` (unique, one per weight). Every attribute combination is round
tripped (import -> convert -> export) and compared with the original in onnxruntime; the ones that stay
generic come back as the same Gemm node.

Numerics: onnxruntime's Gemm with C and MatMul followed by Add agree exactly while the inner dimension fits
one block of its GEMM kernel (K <= 256 measured); beyond it the fused Gemm adds C before the K blocks and
the two differ in the last bits (a few ulps, see ``test_large_inner_dimension_rounds_within_tolerance``).
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.onnx_import import import_onnx
from taso_mlir.dialect.ops import dense_array

M, K, N = 3, 5, 4


def _model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = ir_version
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, shape):
    return h.make_tensor_value_info(name, T.FLOAT, list(shape))


def _ops(module) -> list:
    fn = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    return [o.operation for o in fn.regions[0].blocks[0].operations]


def _counts(module) -> collections.Counter:
    return collections.Counter(o.name for o in _ops(module))


def _weights(module) -> dict:
    return {o.attributes["name"].value: o for o in _ops(module) if o.name == "taso.weight"}


def _run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run both models as written
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _max_diff(original, out, seeds=(0, 1)) -> tuple[float, float]:
    """(largest |difference|, largest |original output|) over random inputs."""
    inits = {t.name for t in original.graph.initializer}
    diff = scale = 0.0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in original.graph.input if i.name not in inits}
        for w, g in zip(_run(original, feeds), _run(out, feeds)):
            assert w.shape == g.shape and w.dtype == g.dtype
            diff = max(diff, float(np.abs(w.astype(np.float64) - g.astype(np.float64)).max()))
            scale = max(scale, float(np.abs(w).max()))
    return diff, scale


def _round_trip(model):
    module = import_onnx(model, make_context(), where="t.onnx")
    out = export_onnx(module)
    onnx.checker.check_model(out, full_check=True)
    return module, out


def _gemm_model(trans_a, trans_b, c_shape, b_weight, alpha=None, beta=None, k=K):
    """One Gemm: A an input, B a weight or an input, C (a weight) of ``c_shape`` or absent."""
    rng = np.random.default_rng(7)
    a_shape = (k, M) if trans_a else (M, k)
    b_shape = (N, k) if trans_b else (k, N)
    inputs, inits, ins = [_vi("A", a_shape)], [], ["A", "B"]
    if b_weight:
        inits.append(nh.from_array(rng.standard_normal(b_shape).astype(np.float32), "B"))
    else:
        inputs.append(_vi("B", b_shape))
    if c_shape is not None:
        inits.append(nh.from_array(rng.standard_normal(c_shape).astype(np.float32), "C"))
        ins.append("C")
    attrs = {k_: v for k_, v in dict(transA=trans_a, transB=trans_b, alpha=alpha, beta=beta).items() if v is not None}
    return _model([h.make_node("Gemm", ins, ["Y"], name="fc", **attrs)], inputs, [_vi("Y", (M, N))], inits)


C_SHAPES = [None, (N,), (1, N), (M, N), (M, 1), ()]
CASES = list(itertools.product((0, 1), (0, 1), C_SHAPES, (True, False)))


@pytest.mark.parametrize("trans_a,trans_b,c_shape,b_weight", CASES,
                         ids=[f"tA{a}-tB{b}-C{'none' if c is None else 'x'.join(map(str, c)) or 'scalar'}-"
                              f"B{'weight' if w else 'input'}" for a, b, c, w in CASES])
def test_gemm_is_raised_and_computes_the_same(trans_a, trans_b, c_shape, b_weight):
    original = _gemm_model(trans_a, trans_b, c_shape, b_weight, alpha=1.0, beta=1.0)
    module, out = _round_trip(original)
    counts = _counts(module)
    assert counts["onnx.Gemm"] == 0
    assert counts["taso.matmul"] == 1
    assert counts["taso.ewadd"] == (c_shape is not None)
    # op(A) is a transpose; op(B) of a weight is a transposed weight, of an input a transpose
    assert counts["taso.transpose"] == trans_a + (trans_b and not b_weight)
    weights = _weights(module)
    if b_weight and trans_b:
        assert "B" not in weights and "B.T" in weights  # the original is no longer read
        want = nh.to_array(next(t for t in original.graph.initializer if t.name == "B")).T
        np.testing.assert_array_equal(dense_array(weights["B.T"].attributes["value"]), want)
    elif b_weight:
        assert "B" in weights
    if c_shape is not None:
        assert "C" in weights and tuple(weights["C"].results[0].type.shape) == c_shape  # C is kept as it is
    assert [n.op_type for n in out.graph.node if n.op_type == "Gemm"] == []
    diff, scale = _max_diff(original, out)
    assert diff <= 1e-6 * max(1.0, scale), (diff, scale)


@pytest.mark.parametrize("alpha,beta,c_shape", [(0.5, None, (N,)), (2.0, 1.0, None), (1.0, 0.5, (N,)),
                                                (None, 0.0, (M, N))])
def test_alpha_or_beta_keeps_gemm_generic(alpha, beta, c_shape):
    original = _gemm_model(1, 1, c_shape, True, alpha=alpha, beta=beta)
    module, out = _round_trip(original)
    counts = _counts(module)
    assert counts["onnx.Gemm"] == 1 and counts["taso.matmul"] == 0
    (g,) = [n for n in out.graph.node if n.op_type == "Gemm"]
    assert sorted(g.attribute, key=lambda a: a.name) == \
        sorted(original.graph.node[0].attribute, key=lambda a: a.name)
    assert _max_diff(original, out)[0] == 0.0


def test_beta_without_c_does_not_matter():
    original = _gemm_model(0, 1, None, True, beta=3.0)
    module, out = _round_trip(original)
    assert _counts(module)["onnx.Gemm"] == 0 and _counts(module)["taso.matmul"] == 1
    assert _max_diff(original, out)[0] == 0.0


def test_shared_weight_is_transposed_once_with_a_unique_name():
    """Two Gemms reading one weight transposed share one ``W.T``; an initializer already named ``W.T``
    keeps its name, and the transposed weight takes another; a weight also read elsewhere stays."""
    rng = np.random.default_rng(3)
    w = nh.from_array(rng.standard_normal((N, K)).astype(np.float32), "W")
    taken = nh.from_array(np.full((N,), 0.5, np.float32), "W.T")
    u = nh.from_array(rng.standard_normal((N, K)).astype(np.float32), "U")
    nodes = [h.make_node("Gemm", ["A", "W", "W.T"], ["y1"], name="g1", transB=1),
             h.make_node("Gemm", ["A", "W"], ["y2"], name="g2", transB=1),
             h.make_node("Add", ["y1", "y2"], ["s"]),
             h.make_node("Gemm", ["A", "U"], ["y3"], name="g3", transB=1),
             h.make_node("Add", ["U", "U"], ["u2"]),  # U is read untransposed too
             h.make_node("Add", ["s", "y3"], ["Y"])]
    original = _model(nodes, [_vi("A", (M, K))], [_vi("Y", (M, N)), _vi("u2", (N, K))], [w, taken, u])
    module, out = _round_trip(original)
    weights = _weights(module)
    assert sorted(weights) == ["U", "U.T", "W.T", "W.T_1"]
    assert tuple(weights["W.T"].results[0].type.shape) == (N,)
    assert tuple(weights["W.T_1"].results[0].type.shape) == (K, N)
    names = [t.name for t in out.graph.initializer]
    assert sorted(names) == ["U", "U.T", "W.T", "W.T_1"] and len(set(names)) == len(names)
    matmuls = [o for o in _ops(module) if o.name == "taso.matmul"]
    assert len(matmuls) == 3 and matmuls[0].operands[1] == matmuls[1].operands[1]
    assert _max_diff(original, out)[0] <= 1e-6


def test_transposed_weight_a():
    """transA of a weight: the weight is transposed too (no taso.transpose left)."""
    rng = np.random.default_rng(4)
    a = nh.from_array(rng.standard_normal((K, M)).astype(np.float32), "Wa")
    original = _model([h.make_node("Gemm", ["Wa", "B"], ["Y"], transA=1)], [_vi("B", (K, N))], [_vi("Y", (M, N))], [a])
    module, out = _round_trip(original)
    counts = _counts(module)
    assert counts["taso.transpose"] == 0 and counts["taso.matmul"] == 1 and "Wa.T" in _weights(module)
    assert _max_diff(original, out)[0] == 0.0


def test_opset_6_needs_c_of_the_result_shape():
    """Gemm-6 broadcasts C only with broadcast=1 (an attribute the raise does not take): such a node stays
    generic; one whose C already has the result's shape is raised (the exported Add-6 does not broadcast)."""
    rng = np.random.default_rng(5)
    inits = [nh.from_array(rng.standard_normal((N, K)).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal((N,)).astype(np.float32), "c"),
             nh.from_array(rng.standard_normal((M, N)).astype(np.float32), "cf")]
    nodes = [h.make_node("Gemm", ["A", "W", "c"], ["y1"], transB=1, broadcast=1),
             h.make_node("Gemm", ["A", "W", "cf"], ["y2"], transB=1),
             h.make_node("Add", ["y1", "y2"], ["Y"])]
    ins = [_vi("A", (M, K))] + [_vi(t.name, list(t.dims)) for t in inits]  # IR version 3: initializers are inputs
    original = _model(nodes, ins, [_vi("Y", (M, N))], inits, opset=6, ir_version=3)
    module, out = _round_trip(original)
    counts = _counts(module)
    assert counts["onnx.Gemm"] == 1 and counts["taso.matmul"] == 1
    # (onnxruntime has no Gemm-6 kernel: onnx's reference evaluator runs both)
    from onnx.reference import ReferenceEvaluator

    feeds = {"A": np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)}
    feeds.update({t.name: nh.to_array(t) for t in inits})
    want = ReferenceEvaluator(original).run(None, feeds)[0]
    got = ReferenceEvaluator(out).run(None, {k: v for k, v in feeds.items() if k in {i.name for i in out.graph.input}})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_large_inner_dimension_rounds_within_tolerance():
    """K = 512 (NasRNN's hidden size): MatMul + Add rounds differently from the fused Gemm, by a few ulps;
    well inside taso-opt --verify-numerics' 1e-5 x output scale."""
    original = _gemm_model(0, 1, (N,), True, k=512)
    module, out = _round_trip(original)
    assert _counts(module)["onnx.Gemm"] == 0
    diff, scale = _max_diff(original, out, seeds=(0, 1, 2))
    assert diff <= 1e-5 * max(1.0, scale), (diff, scale)


def test_nasrnn_has_no_generic_gemm_left():
    """The NasRNN benchmark (quick variant: 3 steps, hidden 16): all 48 Gemms are raised; the 16 weights
    read transposed are transposed once each (shared by every step) and the originals are gone."""
    from taso_mlir.benchmarks import suite

    original = suite.build("nasrnn", quick=True)
    n_gemm = sum(n.op_type == "Gemm" for n in original.graph.node)
    assert n_gemm == 48
    module, out = _round_trip(original)
    counts = _counts(module)
    assert counts["onnx.Gemm"] == 0 and counts["taso.matmul"] == n_gemm
    weights = _weights(module)
    transposed = sorted(n for n in weights if n.endswith(".T"))
    assert len(transposed) == 16 and not any(n[:-2] in weights for n in transposed)
    assert not [n for n in out.graph.node if n.op_type == "Gemm"]
    diff, scale = _max_diff(original, out, seeds=(0,))
    assert diff <= 1e-6 * max(1.0, scale), (diff, scale)
