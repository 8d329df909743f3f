"""Differential tests of the operator specs (``dialect/specs.py``).

For every `taso` operator in ``SPECS`` we build a one-op MLIR module, export it with ``export_onnx``,
run the ONNX model in onnxruntime on random inputs and compare with the numpy reference
(``specs.evaluate``) and with the shape function (``specs.infer_shapes``). The exact integer mode of the
reference is checked against naive Python-integer computations, and the two verifiers (the spec
verifier ``verify_taso_op`` and the IRDL verifier) are checked to reject malformed ops.

All random data comes from generators seeded per operator, so every case is reproducible and adding a
case for one operator does not change the others.
"""

from __future__ import annotations

import itertools
import math
import warnings
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from taso_mlir.dialect import specs
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.mlir import func, ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.ops import create_taso_op, verify_taso_op
from taso_mlir.dialect.specs import SPECS, ExactModeUnsupported, SpecError
from taso_mlir.dialect.types import tensor_type

CONST_OPS = ("const_pool", "const_iconv", "const_imatmul", "const_iewmul", "weight")


# --------------------------------------------------------------------------------------------
# helpers


def _rng(tag: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(tag.encode()) + 20240611)


@pytest.fixture(scope="module")
def ctx():
    return make_context()


class Case:
    """One operator application: op name, input arrays, attributes, (constant ops) result shape."""

    def __init__(self, op, inputs, attrs=None, out_shapes=None, opset=17, tag=""):
        self.op, self.inputs, self.attrs = op, list(inputs), dict(attrs or {})
        self.out_shapes, self.opset, self.tag = out_shapes, opset, tag

    @property
    def id(self) -> str:
        shapes = "_".join("x".join(map(str, x.shape)) or "s" for x in self.inputs)
        if self.out_shapes:
            shapes = "x".join(map(str, self.out_shapes[0]))
        bits = [self.op, shapes]
        for k, v in self.attrs.items():
            if k == "value":
                continue
            v = "x".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
            bits.append(f"{k}={v}")
        if self.opset != 17:
            bits.append(f"opset{self.opset}")
        if self.tag:
            bits.append(self.tag)
        return "-".join(bits)


def _elem(dtype) -> str:
    return {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.int64): "si64",
            np.dtype(np.uint32): "ui32"}[np.dtype(dtype)]


def build_module(ctx, in_types, body, opset=17, ir_version=8, verify=True):
    """A module with one ``func.func @main`` over ``in_types`` (MLIR type strings, or (shape, elem)
    pairs); ``body(args) -> results`` builds the body."""
    with ctx, ir.Location.unknown():
        in_types = [ir.Type.parse(t) if isinstance(t, str) else tensor_type(*t) for t in in_types]
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            # result types are patched below once the body is built
            f = func.FuncOp("main", ir.FunctionType.get(list(in_types), []))
            block = f.add_entry_block()
            with ir.InsertionPoint(block):
                results = list(body(list(block.arguments)))
                func.ReturnOp(results)
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(in_types), [r.type for r in results]))
        i64 = ir.IntegerType.get_signless(64)
        f.attributes["taso.input_names"] = ir.ArrayAttr.get(
            [ir.StringAttr.get(f"x{i}") for i in range(len(in_types))])
        f.attributes["taso.output_names"] = ir.ArrayAttr.get(
            [ir.StringAttr.get(f"y{i}") for i in range(len(results))])
        f.attributes["taso.opset_imports"] = ir.DictAttr.get({"ai.onnx": ir.IntegerAttr.get(i64, opset)})
        f.attributes["taso.ir_version"] = ir.IntegerAttr.get(i64, ir_version)
    if verify:
        assert module.operation.verify()
    return module


def _weight_extra(arr: np.ndarray, name: str = "w"):
    ttype = tensor_type(arr.shape, _elem(arr.dtype))
    return ttype, {"name": ir.StringAttr.get(name), "value": ir.DenseElementsAttr.get(arr, type=ttype)}


def case_module(ctx, case: Case):
    """The one-op module of ``case``; the op's result types come from the spec's shape function."""
    elem = _elem(case.inputs[0].dtype) if case.inputs else "f32"
    if case.op == "weight":
        out_shapes = [case.attrs["value"].shape]
    elif case.out_shapes is not None:
        out_shapes = case.out_shapes
    else:
        out_shapes = specs.infer_shapes(case.op, [x.shape for x in case.inputs], case.attrs)

    def body(args):
        with ir.Location.name("op"):
            if case.op == "weight":
                ttype, extra = _weight_extra(case.attrs["value"])
                op = create_taso_op("weight", [], [ttype], {}, extra=extra)
            else:
                op = create_taso_op(case.op, args, [tensor_type(s, elem) for s in out_shapes], case.attrs)
        verify_taso_op(op)
        return op.results

    return build_module(ctx, [(x.shape, _elem(x.dtype)) for x in case.inputs], body, opset=case.opset,
                        ir_version=10 if case.opset >= 21 else 8)


_SESSION_OPTIONS = None


def run_ort(model: onnx.ModelProto, inputs) -> list[np.ndarray]:
    global _SESSION_OPTIONS
    if _SESSION_OPTIONS is None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        _SESSION_OPTIONS = so
    sess = ort.InferenceSession(model.SerializeToString(), _SESSION_OPTIONS, providers=["CPUExecutionProvider"])
    return sess.run(None, {f"x{i}": x for i, x in enumerate(inputs)})


def assert_close(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


def _f32(rng, shape, scale=1.0) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)


def _dims(rng, rank, lo=1, hi=4) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.integers(lo, hi + 1, size=rank))


# --------------------------------------------------------------------------------------------
# random cases for every operator


def conv2d_cases():
    rng = _rng("conv2d")
    out = []
    # every combination of group kind x stride x bias, with random kernel/pads/dilations/shapes
    for gk, stride, bias in itertools.product(["g1", "g2", "depthwise"], [1, 2], [False, True]):
        if gk == "g1":
            g, cg, og = 1, int(rng.integers(1, 5)), int(rng.integers(1, 5))
        elif gk == "g2":
            g, cg, og = 2, int(rng.integers(1, 4)), int(rng.integers(1, 3))
        else:  # depthwise: one input channel per group, channel multiplier og
            g, cg, og = int(rng.integers(2, 6)), 1, int(rng.integers(1, 3))
        kh, kw = _dims(rng, 2, 1, 3)
        dil = _dims(rng, 2, 1, 2)
        pads = _dims(rng, 4, 0, 2)
        strides = (stride, int(rng.integers(1, 3)))
        hw = []
        for i, k in enumerate((kh, kw)):
            span = dil[i] * (k - 1) + 1
            hw.append(max(1, span - pads[i] - pads[i + 2]) + int(rng.integers(0, 5)))
        n = int(rng.integers(1, 3))
        x = _f32(rng, (n, g * cg) + tuple(hw))
        w = _f32(rng, (g * og, cg, kh, kw))
        ins = [x, w] + ([_f32(rng, (g * og,))] if bias else [])
        act = ["none", "relu"][int(rng.integers(0, 2))]
        out.append(Case("conv2d", ins, dict(strides=strides, pads=pads, dilations=dil, group=g, activation=act)))
    rng2 = _rng("conv2d-fixed")
    # defaults only; a 1x1 conv; a kernel larger than the input made valid by padding; relu
    out.append(Case("conv2d", [_f32(rng2, (1, 3, 5, 5)), _f32(rng2, (4, 3, 3, 3))], {}))
    out.append(Case("conv2d", [_f32(rng2, (2, 5, 4, 3)), _f32(rng2, (6, 5, 1, 1)), _f32(rng2, (6,))],
                    dict(activation="relu")))
    out.append(Case("conv2d", [_f32(rng2, (1, 2, 2, 2)), _f32(rng2, (2, 2, 3, 3))],
                    dict(pads=(1, 1, 1, 1), activation="relu")))
    return out


def matmul_cases():
    rng = _rng("matmul")
    pairs = [
        ((3, 4), (4, 5)),
        ((1, 7), (7, 1)),
        ((6, 2), (2, 6)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (3, 4, 2)),   # batch broadcast 2x1 with 3
        ((3, 4), (2, 3, 4, 5)),      # 2-D lhs broadcast over the rhs batch
        ((1, 3, 4), (5, 4, 2)),
        ((2, 1, 3, 2, 4), (4, 1, 4, 3)),
    ]
    out = []
    for i, (a, b) in enumerate(pairs):
        act = "relu" if i % 2 else "none"
        out.append(Case("matmul", [_f32(rng, a), _f32(rng, b)], dict(activation=act)))
    return out


def _broadcast_pair(rng):
    r = int(rng.integers(0, 5))
    full = _dims(rng, r, 1, 4)
    shapes = []
    for _ in range(2):
        rx = int(rng.integers(0, r + 1))
        s = tuple(1 if rng.random() < 0.3 else d for d in full[r - rx:])
        shapes.append(s)
    if rng.random() < 0.5:  # make sure at least one operand has the full rank
        shapes[0] = full
    else:
        shapes[1] = full
    return shapes


def binary_cases(op):
    rng = _rng(op)
    out = [Case(op, [_f32(rng, (2, 3)), _f32(rng, (2, 3))]),  # TASO's same-shape case
           Case(op, [_f32(rng, ()), _f32(rng, (3, 2))]),
           Case(op, [_f32(rng, (4, 1, 3)), _f32(rng, (2, 1))])]
    for _ in range(7):
        a, b = _broadcast_pair(rng)
        out.append(Case(op, [_f32(rng, a), _f32(rng, b)]))
    return out


def smul_cases():
    rng = _rng("smul")
    return [Case("smul", [_f32(rng, _dims(rng, r)), _f32(rng, ())]) for r in (0, 1, 2, 3, 4)]


def unary_cases(op):
    rng = _rng(op)
    out = [Case(op, [_f32(rng, _dims(rng, r), scale=3.0)]) for r in (0, 1, 2, 3, 4)]
    out.append(Case(op, [_f32(rng, (4, 5), scale=30.0)], tag="large"))
    out.append(Case(op, [np.array([-1e4, -800.0, -100.0, -1e-3, 0.0, 1e-3, 100.0, 800.0, 1e4], np.float32)],
                    tag="extreme"))
    return out


def transpose_cases():
    rng = _rng("transpose")
    out = []
    for r in (0, 1, 2, 2, 3, 3, 4, 4, 5):
        perm = tuple(int(p) for p in rng.permutation(r))
        out.append(Case("transpose", [_f32(rng, _dims(rng, r, 1, 4))], dict(perm=perm)))
    return out


def reshape_cases():
    rng = _rng("reshape")
    out = []
    for _ in range(6):
        shape = _dims(rng, int(rng.integers(1, 5)), 1, 4)
        # a random factorization of the element count
        n = int(np.prod(shape))
        target = []
        while n > 1:
            divs = [d for d in range(2, n + 1) if n % d == 0]
            d = divs[int(rng.integers(0, len(divs)))]
            target.append(d)
            n //= d
        if rng.random() < 0.5:
            target.insert(int(rng.integers(0, len(target) + 1)), 1)
        out.append(Case("reshape", [_f32(rng, shape)], dict(shape=tuple(target))))
    out.append(Case("reshape", [_f32(rng, (1, 1))], dict(shape=())))
    out.append(Case("reshape", [_f32(rng, ())], dict(shape=(1, 1, 1))))
    # empty tensors: ONNX reads a 0 in Reshape's shape as "copy" unless allowzero=1
    out.append(Case("reshape", [_f32(rng, (0, 3))], dict(shape=(3, 0)), tag="empty"))
    out.append(Case("reshape", [_f32(rng, (2, 0, 3))], dict(shape=(0, 4)), tag="empty"))
    out.append(Case("reshape", [_f32(rng, (0, 3))], dict(shape=(0, 1, 3)), opset=13, tag="empty"))
    return out


def concat_cases():
    rng = _rng("concat")
    out = []
    i = 0
    for r in (1, 2, 3, 4):
        for ax in range(r):
            k = 2 + i % 4  # 2..5 operands
            i += 1
            base = list(_dims(rng, r, 1, 3))
            ins = []
            for _ in range(k):
                s = list(base)
                s[ax] = int(rng.integers(1, 4))
                ins.append(_f32(rng, s))
            out.append(Case("concat", ins, dict(axis=ax)))
    out.append(Case("concat", [_f32(rng, (2, 0)), _f32(rng, (2, 3)), _f32(rng, (2, 0))], dict(axis=1), tag="empty"))
    return out


def split_cases():
    rng = _rng("split")
    out = []
    i = 0
    for r in (1, 2, 3):
        for ax in range(r):
            parts = 2 + i % 3  # 2..4 parts
            i += 1
            sizes = tuple(int(s) for s in rng.integers(1, 4, size=parts))
            shape = list(_dims(rng, r, 1, 3))
            shape[ax] = sum(sizes)
            for opset in ((11, 17) if r == 2 else (17,)):  # opset < 13: `split` is an attribute
                out.append(Case("split", [_f32(rng, shape)], dict(axis=ax, sizes=sizes), opset=opset))
    out.append(Case("split", [_f32(rng, (2, 3))], dict(axis=1, sizes=(0, 3, 0)), tag="empty"))
    return out


def pool_cases(op):
    rng = _rng(op)
    out = []
    combos = list(itertools.product([1, 2], [0, 1] if op == "avgpool2d" else [None], [False, True]))
    for stride, cip, padded in combos:
        k = _dims(rng, 2, 1, 3)
        pads = tuple(int(rng.integers(0, k[i % 2])) for i in range(4)) if padded else (0, 0, 0, 0)
        strides = (stride, int(rng.integers(1, 3)))
        hw = tuple(max(1, k[i] - pads[i] - pads[i + 2]) + int(rng.integers(0, 5)) for i in range(2))
        x = _f32(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 4))) + hw)
        attrs = dict(kernel_shape=k, strides=strides, pads=pads)
        if cip is not None:
            attrs["count_include_pad"] = cip
        out.append(Case(op, [x], attrs))
    # defaults for strides/pads; a 3x3 window with pads (1,1,1,1) where the borders see padding
    out.append(Case(op, [_f32(rng, (1, 2, 4, 4))], dict(kernel_shape=(2, 2))))
    attrs = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    if op == "avgpool2d":
        attrs["count_include_pad"] = 0
    out.append(Case(op, [_f32(rng, (1, 1, 3, 3))], attrs))
    return out


def enlarge_cases():
    rng = _rng("enlarge")
    out = []
    for i in range(5):
        w = _dims(rng, 4, 1, 3)
        k = (w[2] + 2 * int(rng.integers(0, 3)), w[3] + 2 * int(rng.integers(0, 3)))
        out.append(Case("enlarge", [_f32(rng, w)], dict(kernel_shape=k), opset=10 if i == 4 else 17))
    return out


def batchnorm_cases():
    rng = _rng("batchnorm")
    out = []
    for r, eps in ((2, None), (3, 1e-3), (4, 1e-5), (4, 0.5)):
        shape = _dims(rng, r, 1, 4)
        c = shape[1]
        ins = [_f32(rng, shape, 2.0), _f32(rng, (c,)), _f32(rng, (c,)), _f32(rng, (c,)),
               rng.uniform(0.05, 2.0, size=(c,)).astype(np.float32)]
        out.append(Case("batchnorm", ins, {} if eps is None else dict(epsilon=eps)))
    return out


def const_cases():
    rng = _rng("consts")
    out = [Case("const_pool", [], out_shapes=[(c, 1, kh, kw)]) for c, kh, kw in ((1, 1, 1), (3, 2, 3), (4, 3, 3))]
    out += [Case("const_iconv", [], out_shapes=[s]) for s in ((3, 3, 3, 3), (4, 2, 1, 3), (6, 1, 3, 5), (2, 2, 1, 1))]
    out += [Case("const_imatmul", [], out_shapes=[s]) for s in ((1, 1), (4, 4), (2, 3, 3))]
    out += [Case("const_iewmul", [], out_shapes=[s]) for s in ((), (5,), (2, 3, 4))]
    out += [Case("weight", [], dict(value=_f32(rng, s))) for s in ((3,), (2, 3), (2, 1, 3, 3))]
    out += [Case("weight", [], dict(value=rng.integers(-50, 50, size=(2, 5)).astype(np.int64)))]
    return out


ALL_CASES = (
    conv2d_cases() + matmul_cases() + binary_cases("ewadd") + binary_cases("ewmul") + smul_cases()
    + unary_cases("relu") + unary_cases("sigmoid") + unary_cases("tanh") + transpose_cases()
    + reshape_cases() + concat_cases() + split_cases() + pool_cases("maxpool2d") + pool_cases("avgpool2d")
    + enlarge_cases() + batchnorm_cases() + const_cases()
)


def test_every_op_has_cases():
    assert {c.op for c in ALL_CASES} == set(SPECS)


# --------------------------------------------------------------------------------------------
# reference semantics and shape functions against onnxruntime


def _ref(case: Case) -> list[np.ndarray]:
    if case.op == "weight":
        return specs.evaluate("weight", [], case.attrs, [case.attrs["value"].shape])
    return specs.evaluate(case.op, case.inputs, case.attrs, case.out_shapes)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_reference_matches_onnxruntime(ctx, case):
    module = case_module(ctx, case)
    model = export_onnx(module)
    onnx.checker.check_model(model)
    got = run_ort(model, case.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow/invalid-value warnings from the reference
        want = _ref(case)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert isinstance(w, np.ndarray)
        assert_close(g, w, f"{case.id} result {i}")


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_shape_function_matches_onnx(ctx, case):
    """The spec's shape function agrees with the reference, onnxruntime and ONNX shape inference."""
    in_shapes = [x.shape for x in case.inputs]
    hint = [case.attrs["value"].shape] if case.op == "weight" else case.out_shapes
    shapes = [tuple(s) for s in specs.infer_shapes(case.op, in_shapes, case.attrs, hint)]
    assert [r.shape for r in _ref(case)] == shapes
    model = export_onnx(case_module(ctx, case))
    assert [g.shape for g in run_ort(model, case.inputs)] == shapes
    # ONNX's own shape inference, with the declared output shapes removed so that it must infer them
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for o in bare.graph.output:
        o.type.tensor_type.ClearField("shape")
    del bare.graph.value_info[:]
    if not bare.graph.node:
        return  # a constant: the output is an initializer, there is nothing to infer
    inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=True)
    for o, s in zip(inferred.graph.output, shapes):
        dims = tuple(d.dim_value for d in o.type.tensor_type.shape.dim)
        known = o.type.tensor_type.HasField("shape") or s == ()  # protobuf: an empty shape may read unset
        assert known and all(d.HasField("dim_value") for d in o.type.tensor_type.shape.dim)
        assert dims == s, f"{o.name}: {dims} != {s}"


_NON_CONST = [c for c in ALL_CASES if c.op not in CONST_OPS and c.opset == 17 and c.tag != "empty"]


@pytest.mark.parametrize("opset", [11, 13, 21])
@pytest.mark.parametrize("case", _NON_CONST[::2], ids=lambda c: c.id)
def test_reference_matches_onnxruntime_other_opsets(ctx, case, opset):
    """The ONNX mapping is right at older and newer opsets too (Split/Pad/Reshape changed form)."""
    c = Case(case.op, case.inputs, case.attrs, opset=opset)
    got = run_ort(export_onnx(case_module(ctx, c)), c.inputs)
    for i, (g, w) in enumerate(zip(got, _ref(c), strict=True)):
        assert_close(g, w, f"{c.id} result {i}")


def test_reshape_with_zero_dims_needs_allowzero(ctx):
    ok = case_module(ctx, Case("reshape", [np.zeros((0, 3), np.float32)], dict(shape=(3, 0)), opset=17))
    node = export_onnx(ok).graph.node[0]
    assert node.op_type == "Reshape" and [a.i for a in node.attribute if a.name == "allowzero"] == [1]
    old = case_module(ctx, Case("reshape", [np.zeros((0, 3), np.float32)], dict(shape=(3, 0)), opset=13))
    with pytest.raises(TasoError, match="allowzero"):
        export_onnx(old)
    # without zero dimensions the exported Reshape is the plain form
    plain = export_onnx(case_module(ctx, Case("reshape", [np.zeros((2, 3), np.float32)], dict(shape=(3, 2)))))
    assert not plain.graph.node[0].attribute


@pytest.mark.parametrize("op,ins,attrs,opset,attr_name", [
    pytest.param("reshape", [(2, 3)], dict(shape=(3, 2)), 4, "shape", id="reshape-opset4"),
    pytest.param("split", [(5, 2)], dict(axis=0, sizes=(2, 3)), 11, "split", id="split-opset11"),
    pytest.param("enlarge", [(2, 2, 1, 3)], dict(kernel_shape=(3, 5)), 10, "pads", id="enlarge-opset10"),
])
def test_old_opsets_use_attribute_forms(ctx, op, ins, attrs, opset, attr_name):
    case = Case(op, [np.zeros(s, np.float32) for s in ins], attrs, opset=opset)
    (node,) = export_onnx(case_module(ctx, case)).graph.node
    assert list(node.input) == ["x0"]
    assert attr_name in [a.name for a in node.attribute]
    new = export_onnx(case_module(ctx, Case(op, case.inputs, attrs, opset=17))).graph.node[0]
    assert len(new.input) == 2 and attr_name not in [a.name for a in new.attribute]


_F64_OPS = ("matmul", "ewadd", "ewmul", "smul", "relu", "sigmoid", "tanh", "transpose", "reshape", "concat",
            "split", "maxpool2d", "batchnorm", "enlarge")  # onnxruntime has no double Conv/AveragePool


@pytest.mark.parametrize("case", [c for c in _NON_CONST if c.op in _F64_OPS][::2], ids=lambda c: c.id)
def test_float64_reference_matches_onnxruntime(ctx, case):
    c = Case(case.op, [x.astype(np.float64) for x in case.inputs], case.attrs)
    got = run_ort(export_onnx(case_module(ctx, c)), c.inputs)
    for g, w in zip(got, _ref(c), strict=True):
        assert w.dtype == np.float64
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * scale)


_INT_ORT_OPS = ("ewadd", "ewmul", "smul", "matmul", "transpose", "reshape", "concat", "split", "enlarge")


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("case", [c for c in _NON_CONST if c.op in _INT_ORT_OPS and c.attrs.get("activation") != "relu"][::3],
                         ids=lambda c: c.id)
def test_exact_mode_matches_onnxruntime_integers(ctx, case, dtype):
    """Full-range integers: onnxruntime's integer kernels wrap like the exact reference (onnxruntime has
    no integer Relu/Conv/MaxPool kernels; those are checked against naive loops below)."""
    rng = _rng(f"int-ort{case.id}{dtype}")
    c = Case(case.op, [_ints(rng, x.shape, dtype) for x in case.inputs], case.attrs)
    got = run_ort(export_onnx(case_module(ctx, c)), c.inputs)
    for g, w in zip(got, _ref(c), strict=True):
        assert w.dtype == dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("splat", [False, True], ids=["dense", "splat"])
def test_weight_from_mlir_attribute(ctx, splat):
    """evaluate("weight") reads the DenseElementsAttr an op carries (a splat reads back whole)."""
    arr = np.full((2, 3), 2.5, np.float32) if splat else np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    with ctx, ir.Location.unknown():
        ttype = tensor_type(arr.shape, "f32")
        value = (ir.DenseElementsAttr.get_splat(ttype, ir.FloatAttr.get(ir.F32Type.get(), 2.5)) if splat
                 else ir.DenseElementsAttr.get(arr, type=ttype))
    assert value.is_splat == splat

    def body(args):
        op = create_taso_op("weight", [], [ttype], {}, extra={"name": ir.StringAttr.get("w"), "value": value})
        verify_taso_op(op)
        return op.results

    got = run_ort(export_onnx(build_module(ctx, [], body)), [])[0]
    (want,) = specs.evaluate("weight", [], {"value": value}, [arr.shape])
    assert isinstance(want, np.ndarray) and want.dtype == np.float32
    np.testing.assert_array_equal(want, arr)
    np.testing.assert_array_equal(got, arr)


# --------------------------------------------------------------------------------------------
# the constants' meaning, checked by composing them with the ops they are identities/pools for


def _compose_cases():
    rng = _rng("compose")
    out = []
    for c, g, k in ((4, 1, 3), (4, 2, 3), (3, 3, 1), (6, 3, 5)):  # I_conv: conv(x, I_conv) == x
        out.append(pytest.param("iconv", _f32(rng, (1, c, 5, 6)), dict(group=g, k=k), id=f"iconv-C{c}-g{g}-k{k}"))
    for c, kh, kw in ((2, 3, 3), (3, 2, 3)):  # conv(x, C_pool, depthwise) == avgpool(count pads)
        out.append(pytest.param("cpool", _f32(rng, (2, c, 5, 5)), dict(k=(kh, kw)), id=f"cpool-C{c}-k{kh}x{kw}"))
    for shape in ((3, 4), (2, 3, 5)):
        sid = "x".join(map(str, shape))
        out.append(pytest.param("imatmul", _f32(rng, shape), {}, id=f"imatmul-{sid}"))
        out.append(pytest.param("iewmul", _f32(rng, shape), {}, id=f"iewmul-{sid}"))
    return out


@pytest.mark.parametrize("kind,x,p", _compose_cases())
def test_constants_compose_to_identities(ctx, kind, x, p):
    f32 = lambda s: tensor_type(s, "f32")  # noqa: E731
    n, c = x.shape[0], x.shape[-1] if kind in ("imatmul", "iewmul") else x.shape[1]

    if kind == "iconv":
        g, k = p["group"], p["k"]
        wshape, attrs = (c, c // g, k, k), dict(group=g, pads=(k // 2,) * 4)
        op2, want_name = "conv2d", None
    elif kind == "cpool":
        kh, kw = p["k"]
        wshape, attrs = (c, 1, kh, kw), dict(group=c, pads=(kh // 2, kw // 2, kh // 2, kw // 2))
        op2 = "conv2d"
    elif kind == "imatmul":
        wshape, attrs, op2 = (c, c), {}, "matmul"
    else:
        wshape, attrs, op2 = x.shape, {}, "ewmul"
    const = {"iconv": "const_iconv", "cpool": "const_pool", "imatmul": "const_imatmul", "iewmul": "const_iewmul"}[kind]
    out_shape = specs.infer_shapes(op2, [x.shape, wshape], attrs)[0]

    def body(args):
        w = create_taso_op(const, [], [f32(wshape)], {})
        y = create_taso_op(op2, [args[0], w.result], [f32(out_shape)], attrs)
        return [y.result]

    got = run_ort(export_onnx(build_module(ctx, [(x.shape, "f32")], body)), [x])[0]
    wval = specs.evaluate(const, [], {}, [wshape])[0]
    ref = specs.evaluate(op2, [x, wval], attrs)[0]
    assert_close(got, ref, kind)
    if kind == "cpool":
        pool = dict(kernel_shape=p["k"], pads=attrs["pads"], count_include_pad=1)
        expect = specs.evaluate("avgpool2d", [x], pool)[0]
    else:
        expect = x
    assert_close(ref, expect, kind)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("k,s,d,hw", [((3, 2), (1, 2), (1, 1), (5, 6)), ((2, 4), (2, 3), (1, 1), (7, 7))])
def test_resolve_auto_pad_matches_onnxruntime(auto_pad, k, s, d, hw):
    rng = _rng(f"autopad{auto_pad}{k}")
    x, w = _f32(rng, (1, 2) + hw), _f32(rng, (3, 2) + k)
    node = onnx.helper.make_node("Conv", ["x0", "x1"], ["y0"], auto_pad=auto_pad, strides=list(s),
                                 dilations=list(d), kernel_shape=list(k))
    graph = onnx.helper.make_graph(
        [node], "g",
        [onnx.helper.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, x.shape),
         onnx.helper.make_tensor_value_info("x1", onnx.TensorProto.FLOAT, w.shape)],
        [onnx.helper.make_tensor_value_info("y0", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    got = run_ort(model, [x, w])[0]
    pads = specs.resolve_auto_pad(auto_pad, hw, k, s, d)
    assert_close(got, specs.evaluate("conv2d", [x, w], dict(strides=s, dilations=d, pads=pads))[0])


# --------------------------------------------------------------------------------------------
# exact integer mode


M32 = 2**32


def _naive_conv(x, w, b, a):
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    g = a.get("group", 1)
    s, p, d = a.get("strides", (1, 1)), a.get("pads", (0, 0, 0, 0)), a.get("dilations", (1, 1))
    oh = (h_ + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (w_ + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    og = o_ // g
    out = np.zeros((n_, o_, oh, ow), dtype=object)
    for n, o, i, j in itertools.product(range(n_), range(o_), range(oh), range(ow)):
        acc = int(b[o]) if b is not None else 0
        gi = o // og
        for c, u, v in itertools.product(range(cg), range(kh), range(kw)):
            r, q = i * s[0] - p[0] + u * d[0], j * s[1] - p[1] + v * d[1]
            if 0 <= r < h_ and 0 <= q < w_:
                acc += int(x[n, gi * cg + c, r, q]) * int(w[o, c, u, v])
        out[n, o, i, j] = acc
    return out  # before the activation: it applies to the wrapped value


def _naive_matmul(x, y):
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    xb = np.broadcast_to(x, batch + x.shape[-2:])
    yb = np.broadcast_to(y, batch + y.shape[-2:])
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    out = np.zeros(batch + (m, n), dtype=object)
    for bi in np.ndindex(*batch):
        for i, j in itertools.product(range(m), range(n)):
            out[bi + (i, j)] = sum(int(xb[bi + (i, t)]) * int(yb[bi + (t, j)]) for t in range(k))
    return out


def _wrap(vals: np.ndarray, dtype) -> np.ndarray:
    """Python integers reduced to ``dtype``'s wrapping range."""
    bits = np.iinfo(dtype).bits
    signed = np.issubdtype(dtype, np.signedinteger)

    def red(v):
        v %= 2**bits
        return v - 2**bits if signed and v >= 2 ** (bits - 1) else v

    return np.array(np.vectorize(red, otypes=[object])(vals).tolist(), dtype=dtype).reshape(vals.shape)


def _ints(rng, shape, dtype):
    if dtype == np.uint32:
        return rng.integers(0, M32, size=shape, dtype=np.uint64).astype(np.uint32)
    return rng.integers(-2**62, 2**62, size=shape, dtype=np.int64)  # products overflow and wrap


EXACT_CONV = [
    dict(),
    dict(strides=(2, 1), pads=(1, 0, 2, 1), activation="relu"),
    dict(dilations=(2, 1), pads=(1, 1, 1, 1), group=2),
    dict(group=4, strides=(1, 2), pads=(0, 1, 1, 0), activation="relu"),  # depthwise
]


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("attrs", EXACT_CONV, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_exact_conv2d(attrs, dtype, bias):
    rng = _rng(f"exact-conv{attrs}{dtype}{bias}")
    g = attrs.get("group", 1)
    x = _ints(rng, (1, 4, 4, 5), dtype)
    w = _ints(rng, (4, 4 // g, 2, 3), dtype)
    b = _ints(rng, (4,), dtype) if bias else None
    got = specs.evaluate("conv2d", [x, w] + ([b] if bias else []), attrs)[0]
    want = _wrap(_naive_conv(x, w, b, attrs), dtype)
    if attrs.get("activation") == "relu":
        want = np.maximum(want, 0).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("a,b,act", [((3, 4), (4, 2), "none"), ((2, 1, 2, 3), (3, 3, 2), "relu"),
                                     ((2, 3), (2, 2, 3, 4), "none")], ids=str)
def test_exact_matmul(a, b, act, dtype):
    rng = _rng(f"exact-mm{a}{dtype}")
    x, y = _ints(rng, a, dtype), _ints(rng, b, dtype)
    got = specs.evaluate("matmul", [x, y], dict(activation=act))[0]
    want = _wrap(_naive_matmul(x, y), dtype)
    if act == "relu":
        want = np.maximum(want, 0).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("op", ["ewadd", "ewmul", "smul"])
def test_exact_elementwise(op, dtype):
    rng = _rng(f"exact-{op}{dtype}")
    shapes = [((3, 1, 4), ()), ((2, 3, 4), (2, 3, 4))] if op == "smul" else [((2, 1, 4), (3, 1)), ((3,), (2, 3))]
    for sa, sb in shapes:
        if op == "smul":
            sb = ()
        x, y = _ints(rng, sa, dtype), _ints(rng, sb, dtype)
        xo, yo = x.astype(object), y.astype(object)
        want = _wrap(xo + yo if op == "ewadd" else xo * yo, dtype)
        got = specs.evaluate(op, [x, y], {})[0]
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
def test_exact_relu_and_maxpool(dtype):
    rng = _rng(f"exact-relu-pool{dtype}")
    x = _ints(rng, (2, 3, 5, 4), dtype)
    got = specs.evaluate("relu", [x], {})[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.array([max(int(v), 0) for v in x.ravel()], dtype=dtype).reshape(x.shape))
    a = dict(kernel_shape=(3, 2), strides=(2, 1), pads=(1, 0, 2, 1))
    got = specs.evaluate("maxpool2d", [x], a)[0]
    assert got.dtype == dtype
    oh, ow = (5 + 3 - 3) // 2 + 1, (4 + 1 - 2) // 1 + 1
    want = np.zeros((2, 3, oh, ow), dtype=dtype)
    for n, c, i, j in itertools.product(range(2), range(3), range(oh), range(ow)):
        want[n, c, i, j] = max(int(x[n, c, r, q]) for r in range(i * 2 - 1, i * 2 + 2) for q in range(j, j + 2)
                               if 0 <= r < 5 and 0 <= q < 4)
    np.testing.assert_array_equal(got, want)


_MOVE_CASES = [c for c in ALL_CASES if c.op in ("transpose", "reshape", "concat", "split", "enlarge")]


@pytest.mark.parametrize("case", _MOVE_CASES[::2], ids=lambda c: c.id)
@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
def test_exact_data_movement(case, dtype):
    """Data-movement ops keep integer dtypes and values exactly (same result as the float path)."""
    rng = _rng(f"exact-move{case.id}")
    ins = [rng.integers(0 if dtype == np.uint32 else -2**40, 2**40, size=x.shape).astype(dtype) for x in case.inputs]
    got = specs.evaluate(case.op, ins, case.attrs)
    floats = specs.evaluate(case.op, [x.astype(np.float64) for x in ins], case.attrs)
    for g, f in zip(got, floats):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, f.astype(dtype))  # integers < 2**53 survive float64 moves


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("op,shapes,attrs", [
    ("sigmoid", [(2, 3)], {}),
    ("tanh", [(4,)], {}),
    ("avgpool2d", [(1, 2, 4, 4)], dict(kernel_shape=(2, 2))),
    ("batchnorm", [(2, 3, 2), (3,), (3,), (3,), (3,)], {}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_exact_mode_unsupported(op, shapes, attrs, dtype):
    rng = _rng(f"unsupported{op}")
    ins = [rng.integers(0, 5, size=s).astype(dtype) for s in shapes]
    with pytest.raises(ExactModeUnsupported):
        specs.evaluate(op, ins, attrs)
    # the same op on floats works
    assert specs.evaluate(op, [x.astype(np.float32) for x in ins], attrs)[0].shape == tuple(
        specs.infer_shapes(op, shapes, attrs)[0])


# --------------------------------------------------------------------------------------------
# shape functions reject what the op cannot express


@pytest.mark.parametrize("op,shapes,attrs,hint,msg", [
    ("conv2d", [(1, 4, 5, 5), (6, 3, 3, 3)], {}, None, "disagree"),
    ("conv2d", [(1, 4, 5, 5), (6, 2, 3, 3)], dict(group=3), None, "disagree"),
    ("conv2d", [(1, 4, 5, 5), (6, 4, 3, 3), (5,)], {}, None, "bias"),
    ("conv2d", [(1, 4, 2, 2), (6, 4, 3, 3)], {}, None, "larger"),
    ("conv2d", [(1, 4, 5, 5), (6, 4, 3, 3)], dict(strides=(0, 1)), None, "strides"),
    ("conv2d", [(4, 5, 5), (6, 4, 3, 3)], {}, None, "4-D"),
    ("matmul", [(2, 3), (4, 5)], {}, None, "inner"),
    ("matmul", [(3,), (3, 2)], {}, None, "rank"),
    ("matmul", [(2, 2, 3), (3, 3, 4)], {}, None, "broadcast"),
    ("ewadd", [(2, 3), (3, 2)], {}, None, "broadcast"),
    ("ewmul", [(4,), (3,)], {}, None, "broadcast"),
    ("smul", [(2, 3), (1,)], {}, None, "0-d"),
    ("transpose", [(2, 3, 4)], dict(perm=(0, 1)), None, "permutation"),
    ("transpose", [(2, 3)], dict(perm=(0, 0)), None, "permutation"),
    ("reshape", [(2, 3)], dict(shape=(5,)), None, "reshape"),
    ("reshape", [(2, 3)], dict(shape=(-1, 3)), None, "reshape"),
    ("concat", [(2, 3)], dict(axis=0), None, "2.."),
    ("concat", [(2, 3)] * 17, dict(axis=0), None, "2.."),
    ("concat", [(2, 3), (2, 4)], dict(axis=0), None, "disagree"),
    ("concat", [(2, 3), (2, 3)], dict(axis=2), None, "out of range"),
    ("concat", [(2, 3), (2, 3)], dict(axis=-1), None, "out of range"),
    ("split", [(5, 3)], dict(axis=0, sizes=(2, 2)), None, "partition"),
    ("split", [(5, 3)], dict(axis=0, sizes=(5,)), None, "partition"),
    ("split", [(5, 3)], dict(axis=2, sizes=(1, 2)), None, "out of range"),
    ("maxpool2d", [(1, 1, 4, 4)], dict(kernel_shape=(2, 2), pads=(2, 0, 0, 0)), None, "smaller"),
    ("avgpool2d", [(1, 1, 4, 4)], dict(kernel_shape=(3, 3), pads=(0, 0, 0, 3)), None, "smaller"),
    ("maxpool2d", [(1, 4, 4)], dict(kernel_shape=(2, 2)), None, "4-D"),
    ("maxpool2d", [(1, 1, 2, 2)], dict(kernel_shape=(3, 3)), None, "larger"),
    ("enlarge", [(2, 2, 3, 3)], dict(kernel_shape=(4, 3)), None, "center"),
    ("enlarge", [(2, 2, 3, 3)], dict(kernel_shape=(1, 3)), None, "center"),
    ("batchnorm", [(2, 3, 4), (3,), (3,), (4,), (3,)], {}, None, "parameter"),
    ("batchnorm", [(3,), (3,), (3,), (3,), (3,)], {}, None, "rank"),
    ("const_pool", [], {}, None, "result type"),
])
def test_shape_function_rejects(op, shapes, attrs, hint, msg):
    with pytest.raises(SpecError, match=msg):
        specs.infer_shapes(op, shapes, attrs, hint)


@pytest.mark.parametrize("op,shape", [("const_pool", (4, 2, 3, 3)), ("const_pool", (4, 3)),
                                      ("const_iconv", (4, 4, 2, 3)), ("const_iconv", (4, 3, 3, 3)),
                                      ("const_imatmul", (3, 4)), ("const_imatmul", (3,))])
def test_constants_reject_bad_shapes(op, shape):
    with pytest.raises(SpecError):
        specs.evaluate(op, [], {}, [shape])


@pytest.mark.parametrize("op,attrs,msg", [
    ("conv2d", dict(activation="gelu"), "one of"),
    ("conv2d", dict(group="2"), "integer"),
    ("conv2d", dict(group=True), "integer"),
    ("conv2d", dict(strides=3), "list of integers"),
    ("conv2d", dict(bogus=1), "unknown"),
    ("avgpool2d", dict(kernel_shape=(2, 2), count_include_pad=2), "one of"),
    ("transpose", {}, "missing"),
    ("batchnorm", dict(epsilon="small"), "float"),
    ("batchnorm", dict(epsilon=True), "float"),
    ("conv2d", dict(strides=(True, 1)), "list of integers"),
    ("conv2d", dict(pads=(0, 0, 0, 0.5)), "list of integers"),
])
def test_complete_attrs_rejects(op, attrs, msg):
    with pytest.raises(SpecError, match=msg):
        SPECS[op].complete_attrs(attrs)


def test_complete_attrs_memo_tells_equal_values_of_other_types_apart():
    """The answers are memoized by the attributes' values and types: a bool equal to an accepted int
    (``True == 1``, also inside a tuple) is still refused after the int was accepted, and each call
    returns its own dict."""
    conv = SPECS["conv2d"]
    first = conv.complete_attrs(dict(group=1, strides=(1, 1)))
    first["group"] = 99
    assert conv.complete_attrs(dict(group=1, strides=(1, 1)))["group"] == 1
    with pytest.raises(SpecError, match="integer"):
        conv.complete_attrs(dict(group=True, strides=(1, 1)))
    with pytest.raises(SpecError, match="list of integers"):
        conv.complete_attrs(dict(group=1, strides=(True, 1)))
    assert conv.complete_attrs(dict(group=1, strides=[1, 1]))["strides"] == (1, 1)  # (unhashable: not memoized)
    from collections import namedtuple

    pair = namedtuple("pair", "a b")
    assert conv.complete_attrs(dict(strides=pair(1, 1)))["strides"] == (1, 1)
    with pytest.raises(SpecError, match="list of integers"):
        conv.complete_attrs(dict(strides=pair(True, 1)))
    bn = SPECS["batchnorm"]
    for zero in (0.0, -0.0, np.float32(0.0), np.float32(-0.0)):  # (the sign kept, whichever came first)
        assert str(bn.complete_attrs(dict(epsilon=zero))["epsilon"]) == str(float(zero))
    size = len(specs._COMPLETE)
    for _ in range(3):
        assert math.isnan(bn.complete_attrs(dict(epsilon=float("nan")))["epsilon"])
    assert len(specs._COMPLETE) == size  # (a NaN is not memoized: it would never hit)


def test_complete_attrs_fills_onnx_defaults():
    assert SPECS["conv2d"].complete_attrs({}) == dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
                                                      group=1, activation="none")
    assert SPECS["avgpool2d"].complete_attrs(dict(kernel_shape=[2, 2]))["count_include_pad"] == 0
    assert SPECS["batchnorm"].complete_attrs({})["epsilon"] == pytest.approx(1e-5)


# --------------------------------------------------------------------------------------------
# verify_taso_op (the spec verifier) rejects malformed ops


def _one_op_module(ctx, in_types, make):
    """A module whose body is ``make(args)`` (returning one op); verify_taso_op is NOT run here."""
    holder = []

    def body(args):
        op = make(args)
        holder.append(op)
        return op.results

    return build_module(ctx, in_types, body, verify=False), holder[0]


def _attr(kind, v):
    i64 = ir.IntegerType.get_signless(64)
    return {"int": lambda: ir.IntegerAttr.get(i64, v), "str": lambda: ir.StringAttr.get(v),
            "ints": lambda: ir.DenseI64ArrayAttr.get(list(v)), "float": lambda: ir.FloatAttr.get(ir.F32Type.get(), v)}[kind]()


_CONV_IN = ["tensor<1x4x5x5xf32>", "tensor<6x4x3x3xf32>"]


@pytest.mark.parametrize("what,in_types,name,out_type,attrs,patch,msg", [
    ("wrong result shape", _CONV_IN, "conv2d", "tensor<1x6x5x5xf32>", {}, {}, "differ from the spec"),
    ("activation choice", _CONV_IN, "conv2d", "tensor<1x6x3x3xf32>", {}, {"activation": ("str", "gelu")}, "one of"),
    ("int attr given a string", _CONV_IN, "conv2d", "tensor<1x6x3x3xf32>", {}, {"group": ("str", "1")}, "integer"),
    ("ints attr given an int", _CONV_IN, "conv2d", "tensor<1x6x3x3xf32>", {}, {"strides": ("int", 1)}, "list of integers"),
    ("float attr given a string", ["tensor<2x3xf32>"] + ["tensor<3xf32>"] * 4, "batchnorm", "tensor<2x3xf32>", {},
     {"epsilon": ("str", "tiny")}, "float"),
    ("unknown attribute", ["tensor<2x3xf32>"], "relu", "tensor<2x3xf32>", {}, {"alpha": ("float", 0.1)}, "unknown"),
    ("count_include_pad choice", ["tensor<1x1x4x4xf32>"], "avgpool2d", "tensor<1x1x3x3xf32>",
     dict(kernel_shape=(2, 2)), {"count_include_pad": ("int", 3)}, "one of"),
    ("mixed element types", ["tensor<2x3xf32>", "tensor<2x3xf64>"], "ewadd", "tensor<2x3xf32>", {}, {}, "mixed"),
    ("dynamic operand", ["tensor<?x3xf32>"], "relu", "tensor<2x3xf32>", {}, {}, "statically shaped"),
    ("split result shapes", ["tensor<5x3xf32>"], "split", "tensor<2x3xf32>|tensor<2x3xf32>",
     dict(axis=0, sizes=(2, 3)), {}, "differ from the spec"),
    ("bad perm", ["tensor<2x3xf32>"], "transpose", "tensor<3x2xf32>", dict(perm=(1, 0)),
     {"perm": ("ints", (1, 1))}, "permutation"),
])
def test_verify_taso_op_rejects(ctx, what, in_types, name, out_type, attrs, patch, msg):
    def make(args):
        res = [ir.Type.parse(t) for t in out_type.split("|")]
        op = create_taso_op(name, args, res, attrs)
        for k, (kind, v) in patch.items():
            op.attributes[k] = _attr(kind, v)
        return op

    module, op = _one_op_module(ctx, in_types, make)
    with pytest.raises(TasoError, match=msg) as ei:
        verify_taso_op(op)
    assert "\n" not in str(ei.value) and f"taso.{name}" in str(ei.value)


def test_verify_taso_op_accepts_and_checks_weights(ctx):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)

    def make_weight(value_type, with_name=True):
        def make(args):
            ttype, extra = _weight_extra(arr)
            if not with_name:
                del extra["name"]
            return create_taso_op("weight", [], [ir.Type.parse(value_type)], {}, extra=extra)
        return make

    _, ok = _one_op_module(ctx, [], make_weight("tensor<2x3xf32>"))
    verify_taso_op(ok)  # a well-formed weight passes
    _, bad = _one_op_module(ctx, [], make_weight("tensor<3x2xf32>"))
    with pytest.raises(TasoError, match="differs from result type"):
        verify_taso_op(bad)
    with ctx, ir.Location.unknown():
        m = ir.Module.create()
        with ir.InsertionPoint(m.body):
            ttype, extra = _weight_extra(arr)
            del extra["name"]
            op = create_taso_op("weight", [], [ttype], {}, extra=extra)
    with pytest.raises(TasoError, match="name"):
        verify_taso_op(op)


# --------------------------------------------------------------------------------------------
# the IRDL verifier


_GOOD_TEXT = {
    "conv2d": ('%r = "taso.conv2d"(%a, %w) {activation = "relu", dilations = array<i64: 1, 1>, group = 1 : i64, '
               'operandSegmentSizes = array<i32: 1, 1, 0>, pads = array<i64: 0, 0, 0, 0>, strides = array<i64: 1, 1>} '
               ': (tensor<1x2x4x4xf32>, tensor<3x2x3x3xf32>) -> tensor<1x3x2x2xf32>'),
    "relu": '%r = "taso.relu"(%a) : (tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>',
    "transpose": ('%r = "taso.transpose"(%a) {perm = array<i64: 0, 1, 3, 2>} '
                  ': (tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>'),
    "batchnorm": ('%r = "taso.batchnorm"(%a, %b, %b, %b, %b) {epsilon = 1.0e-05 : f32} : (tensor<1x2x4x4xf32>, '
                  'tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x4x4xf32>'),
    "concat": ('%r = "taso.concat"(%a, %a, %a) {axis = 1 : i64, operandSegmentSizes = array<i32: '
               + ", ".join(["1"] * 3 + ["0"] * 13) + '>} : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>, '
               'tensor<1x2x4x4xf32>) -> tensor<1x6x4x4xf32>'),
}


def _func_text(op_text: str) -> str:
    rtype = op_text.rsplit("-> ", 1)[1]
    return (f"func.func @f(%a: tensor<1x2x4x4xf32>, %w: tensor<3x2x3x3xf32>, %b: tensor<2xf32>) -> {rtype} {{\n"
            f"  {op_text}\n  return %r : {rtype}\n}}\n")


@pytest.mark.parametrize("op", sorted(_GOOD_TEXT))
def test_irdl_accepts_well_formed_ops(ctx, op):
    with ctx:
        module = ir.Module.parse(_func_text(_GOOD_TEXT[op]))
    assert module.operation.verify()


_BAD_TEXT = [
    ("conv2d missing attribute", "conv2d", lambda t: t.replace("group = 1 : i64, ", ""), "group"),
    ("conv2d activation choice", "conv2d", lambda t: t.replace('"relu"', '"gelu"'), "activation"),
    ("conv2d group of wrong kind", "conv2d", lambda t: t.replace("group = 1 : i64", 'group = "1"'), "group"),
    ("transpose missing perm", "transpose", lambda t: t.replace("{perm = array<i64: 0, 1, 3, 2>} ", ""), "perm"),
    ("batchnorm missing epsilon", "batchnorm", lambda t: t.replace("{epsilon = 1.0e-05 : f32} ", ""), "epsilon"),
    ("relu two operands", "relu",
     lambda t: t.replace("(%a)", "(%a, %a)").replace("(tensor<1x2x4x4xf32>)", "(tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>)"),
     "operand"),
    ("batchnorm four operands", "batchnorm",
     lambda t: t.replace("(%a, %b, %b, %b, %b)", "(%a, %b, %b, %b)").replace(", tensor<2xf32>)", ")"), "operand"),
    ("conv2d one operand", "conv2d",
     lambda t: t.replace("(%a, %w)", "(%a)").replace(", tensor<3x2x3x3xf32>)", ")")
     .replace("array<i32: 1, 1, 0>", "array<i32: 1, 0, 0>"), "operand"),
    ("concat wrong segment count", "concat", lambda t: t.replace("array<i32: 1, 1, 1, 0", "array<i32: 1, 1, 1"), "segment"),
]


@pytest.mark.parametrize("what,op,mutate,msg", _BAD_TEXT, ids=[b[0] for b in _BAD_TEXT])
def test_irdl_rejects_malformed_ops(ctx, what, op, mutate, msg):
    text = _func_text(mutate(_GOOD_TEXT[op]))
    assert text != _func_text(_GOOD_TEXT[op])
    with ctx:
        with pytest.raises(ir.MLIRError, match=msg):
            ir.Module.parse(text)


def test_irdl_verify_after_create_rejects_wrong_operand_count(ctx):
    """``module.operation.verify()`` (not only the parser) runs the IRDL checks."""
    def body(args):
        return ir.Operation.create("taso.matmul", results=[args[0].type], operands=[args[0]],
                                   attributes={"activation": ir.StringAttr.get("none")}).results

    with ctx, ir.Location.unknown():
        t = ir.Type.parse("tensor<2x2xf32>")
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("main", ir.FunctionType.get([t], [t]))
            block = f.add_entry_block()
            with ir.InsertionPoint(block):
                func.ReturnOp(list(body(list(block.arguments))))
    with pytest.raises(ir.MLIRError, match="operands"):
        module.operation.verify()


@pytest.mark.parametrize("dtype", [np.uint32, np.int64], ids=["uint32", "int64"])
@pytest.mark.parametrize("k,strides", [((3, 3), (1, 1)), ((1, 3), (2, 1)), ((3, 5), (2, 2))])
def test_exact_average_pooling(k, strides, dtype):
    """Odd windows with count_include_pad=1 divide exactly (modular inverse): k * avg == window sum,
    and a depthwise conv with the exact C_pool equals the exact average pool (axiom 39)."""
    rng = _rng(f"exact-avg{k}{strides}")
    x = rng.integers(0, 2**31, size=(2, 3, 6, 7)).astype(dtype)
    pads = (k[0] // 2, k[1] // 2, k[0] // 2, k[1] // 2)
    attrs = dict(kernel_shape=k, strides=strides, pads=pads, count_include_pad=1)
    avg = specs.evaluate("avgpool2d", [x], attrs)[0]
    assert avg.dtype == dtype
    ones = np.ones((3, 1) + k, dtype=dtype)
    sums = specs.evaluate("conv2d", [x, ones], dict(strides=strides, pads=pads, group=3))[0]
    np.testing.assert_array_equal(avg * dtype(k[0] * k[1]), sums)
    cpool = specs.constant("const_pool", (3, 1) + k, dtype)
    np.testing.assert_array_equal(
        specs.evaluate("conv2d", [x, cpool], dict(strides=strides, pads=pads, group=3))[0], avg)
    with pytest.raises(ExactModeUnsupported):
        specs.constant("const_pool", (3, 1, 2, 2), dtype)
