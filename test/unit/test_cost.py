"""The cost oracle (passes/cost.py): the analytic roofline's properties, the CPU-measured backend and its cache."""

from __future__ import annotations

import json

import pytest

from taso_mlir.dialect.errors import TasoError
from taso_mlir.passes.cost.oracle import PROFILES, CostModel, OpSig, get_cost_model


def conv(x, o, k=1, pad=0, group=1, act="none", bias=False, stride=1):
    n, c, h, w = x
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    attrs = (("activation", act), ("dilations", (1, 1)), ("group", group), ("pads", (pad,) * 4),
             ("strides", (stride, stride)))
    ins = (tuple(x), (o, c // group, k, k)) + (((o,),) if bias else ())
    return OpSig("conv2d", attrs, ins, ((n, o, oh, ow),))


def matmul(m, k, n, batch=(), act="none"):
    return OpSig("matmul", (("activation", act),), (batch + (m, k), (k, n)), (batch + (m, n),))


def concat(shapes, axis, weight_only=False):
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return OpSig("concat", (("axis", axis),), tuple(shapes), (tuple(out),), weight_only=weight_only)


def split(shape, axis, sizes):
    outs = tuple(tuple(s if i == axis else d for i, d in enumerate(shape)) for s in sizes)
    return OpSig("split", (("axis", axis), ("sizes", tuple(sizes))), (tuple(shape),), outs)


X = (1, 256, 14, 14)
POOL = (("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)), ("strides", (1, 1)))
EVERY_OP = [
    conv(X, 256), conv(X, 256, k=3, pad=1, act="relu", bias=True), conv(X, 256, k=3, pad=1, group=256),
    matmul(64, 1024, 1024, batch=(16,)), matmul(1, 512, 512, act="relu"),
    OpSig("ewadd", (), (X, X), (X,)), OpSig("ewmul", (), (X, (1, 256, 1, 1)), (X,)), OpSig("smul", (), (X, ()), (X,)),
    OpSig("relu", (), (X,), (X,)), OpSig("sigmoid", (), (X,), (X,)), OpSig("tanh", (), (X,), (X,)),
    OpSig("transpose", (("perm", (0, 2, 3, 1)),), (X,), ((1, 14, 14, 256),)),
    concat([X, X], 1), split(X, 1, (128, 128)),
    OpSig("maxpool2d", POOL, (X,), (X,)), OpSig("avgpool2d", (("count_include_pad", 1),) + POOL, (X,), (X,)),
    OpSig("batchnorm", (("epsilon", 1e-5),), (X,) + ((256,),) * 4, (X,)),
    OpSig("onnx.Softmax", (), ((1, 1000),), ((1, 1000),)),
]


# ---------------------------------------------------------------------------------------------
# analytic


@pytest.mark.parametrize("dev", sorted(PROFILES))
def test_analytic_costs_are_positive_and_deterministic(dev):
    a, b = get_cost_model(f"analytic:{dev}"), get_cost_model(f"analytic:{dev}")
    assert isinstance(a, CostModel) and a.name == f"analytic:{dev}"
    for sig in EVERY_OP:
        c = a.cost(sig)
        assert c > 0, sig
        assert c == b.cost(sig) == a.cost(sig)
    assert a.estimated == 0


def test_default_is_t4():
    assert get_cost_model().name == get_cost_model("analytic").name == "analytic:t4"


def test_bigger_ops_cost_more():
    m = get_cost_model()
    assert m.cost(conv((1, 64, 56, 56), 64, k=3, pad=1)) > m.cost(conv((1, 64, 28, 28), 64, k=3, pad=1))
    assert m.cost(conv((1, 256, 56, 56), 512)) > m.cost(conv((1, 256, 56, 56), 256))
    assert m.cost(matmul(1024, 1024, 1024)) > m.cost(matmul(512, 1024, 1024))
    assert m.cost(OpSig("relu", (), ((1, 1 << 22),), ((1, 1 << 22),))) > m.cost(OpSig("relu", (), (X,), (X,)))


def test_enlarged_kernel_costs_more():
    m = get_cost_model()
    assert m.cost(conv(X, 256, k=3, pad=1)) > m.cost(conv(X, 256, k=1))


@pytest.mark.parametrize("dev", ["t4", "v100", "a100", "h100"])
def test_merging_two_convs_on_one_input_is_cheaper(dev):
    # the property the search exploits: conv(x, w1), conv(x, w2) -> conv(x, concat(w1, w2)), the concat
    # of weights folded (free); launch overhead and better utilisation make the merged conv cheaper
    m = get_cost_model(f"analytic:{dev}")
    assert m.cost(conv(X, 512)) < 2 * m.cost(conv(X, 256))
    w = (256, 256, 1, 1)
    assert m.cost(concat([w, w], 0, weight_only=True)) == 0
    # where the device is under-used, it pays even with the split of the merged result
    small = (1, 64, 14, 14)
    assert m.cost(conv(small, 128, k=3, pad=1)) + m.cost(split((1, 128, 14, 14), 1, (64, 64))) < \
        2 * m.cost(conv(small, 64, k=3, pad=1))
    assert m.cost(matmul(1, 512, 1024)) + m.cost(split((1, 1024), 1, (512, 512))) < 2 * m.cost(matmul(1, 512, 512))


def test_weights_and_constants_cost_nothing():
    m = get_cost_model()
    assert m.cost(OpSig("weight", (("name", "w"),), (), ((256, 256, 3, 3),), weight_only=True)) == 0
    assert m.cost(OpSig("const_iconv", (), (), ((256, 256, 3, 3),))) == 0
    assert m.cost(OpSig("enlarge", (("kernel_shape", (3, 3)),), ((256, 256, 1, 1),), ((256, 256, 3, 3),),
                        weight_only=True)) == 0
    big = conv(X, 256, k=3, pad=1)
    assert m.cost(OpSig(big.kind, big.attrs, big.in_shapes, big.out_shapes, weight_only=True)) == 0
    assert m.cost(OpSig("onnx.NoValue", (), (), ((),))) == 0  # a generic op without operands


def test_data_movement_is_costed():
    m = get_cost_model()
    p = PROFILES["t4"]
    for sig in (concat([X, X], 1), split(X, 1, (128, 128)), OpSig("transpose", (("perm", (0, 2, 3, 1)),), (X,),
                                                                  ((1, 14, 14, 256),))):
        assert m.cost(sig) > 1e3 * p.launch_s  # a launch plus the bytes
    assert m.cost(concat([(1, 512, 56, 56)] * 2, 1)) > m.cost(concat([X, X], 1))
    view = m.cost(OpSig("reshape", (("shape", (256, 196)),), (X,), ((256, 196),)))
    assert 0 < view <= 1e3 * p.launch_s


def test_profiles_differ():
    big = matmul(4096, 4096, 4096)
    t4, h100 = get_cost_model("analytic:t4").cost(big), get_cost_model("analytic:h100").cost(big)
    assert h100 < t4 / 3
    assert get_cost_model("analytic:cpu").cost(big) > t4


def test_bad_specs():
    with pytest.raises(TasoError, match="valid: auto, analytic"):
        get_cost_model("roofline")
    with pytest.raises(TasoError, match="no device profile 'k80'.*t4"):
        get_cost_model("analytic:k80")
    with pytest.raises(TasoError, match="not available"):  # (no table measured; cost-model=cuda: test_cuda_measured)
        get_cost_model("cuda:a100")


# ---------------------------------------------------------------------------------------------
# CPU measured (tiny shapes: a few ms of timing each)


TINY_CONV = conv((1, 8, 6, 6), 8, k=3, pad=1, act="relu", bias=True)
TINY_MM = matmul(4, 16, 8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path))
    return tmp_path / "cpu-costs.json"


def test_cpu_measures_and_caches(cache):
    m = get_cost_model("cpu")
    assert m.name == "cpu"
    c, mm = m.cost(TINY_CONV), m.cost(TINY_MM)
    assert c > 0 and mm > 0
    assert m.measured == 2 and m.estimated == 0
    assert m.cost(TINY_CONV) == c and m.measured == 2  # memoized
    assert m.cost(OpSig("onnx.Softmax", (), ((1, 10),), ((1, 10),))) > 0
    assert m.estimated == 1  # generic ops are estimated, and counted
    m.close()
    data = json.loads(cache.read_text())
    (entries,) = data["devices"].values()
    assert entries[TINY_CONV.key()] == c and len(entries) == 2

    again = get_cost_model("cpu")
    assert again.cost(TINY_CONV) == c and again.cost(TINY_MM) == mm
    assert again.measured == 0


def test_cpu_ops_build_and_run(cache):
    m = get_cost_model("cpu")
    m.repeats, m.target_s = 2, 1e-4
    x = (1, 4, 4, 4)
    sigs = [OpSig("smul", (), (x, ()), (x,)), split(x, 1, (1, 3)), concat([x, x], 3),
            OpSig("avgpool2d", (("count_include_pad", 1),) + POOL, (x,), (x,)),
            OpSig("batchnorm", (("epsilon", 1e-5),), (x,) + ((4,),) * 4, (x,)),
            OpSig("enlarge", (("kernel_shape", (3, 3)),), ((4, 4, 1, 1),), ((4, 4, 3, 3),)),
            OpSig("reshape", (("shape", (4, 16)),), (x,), ((4, 16),)),
            # 0-d operands (a dynamically quantized model's scales) are bound as 0-d, not as [1]
            OpSig("ewmul", (), ((), ()), ((),)), OpSig("smul", (), ((), ()), ((),))]
    for sig in sigs:
        assert m.cost(sig) > 0, sig
    assert m.measured == len(sigs) and m.estimated == 0


def test_corrupt_cache_is_ignored(cache, capsys):
    cache.write_text("{not json")
    m = get_cost_model("cpu")
    assert "ignoring the unreadable cost cache" in capsys.readouterr().err
    assert m.cost(TINY_MM) > 0
    m.close()  # replaces the corrupt file
    assert TINY_MM.key() in next(iter(json.loads(cache.read_text())["devices"].values()))
    cache.write_text('{"devices": [1, 2]}')
    get_cost_model("cpu")
    assert "not a taso-mlir cost cache" in capsys.readouterr().err


def test_cpu_times_weight_operands_as_initializers(cache):
    """A weight operand is an initializer of the one-op model (as in the exported model, where
    onnxruntime pre-packs it), an activation a graph input; the two are cached apart."""
    from taso_mlir.passes.cost.oracle import _one_op_model

    act = TINY_MM
    wgt = OpSig(act.kind, act.attrs, act.in_shapes, act.out_shapes, weights=(False, True))
    model = _one_op_model(wgt)
    assert [i.name for i in model.graph.input] == ["x0"]
    assert [t.name for t in model.graph.initializer] == ["x1"]
    assert list(model.graph.initializer[0].dims) == list(act.in_shapes[1])
    assert [i.name for i in _one_op_model(act).graph.input] == ["x0", "x1"]
    assert wgt.key() != act.key()
    assert OpSig(act.kind, act.attrs, act.in_shapes, act.out_shapes, weights=(False, False)).key() == act.key()
    m = get_cost_model("cpu")
    assert m.cost(wgt) > 0 and m.cost(act) > 0 and m.measured == 2
    for sig in (conv((1, 8, 6, 6), 8, k=3, pad=1, bias=True),):  # conv: weight and bias operands
        s = OpSig(sig.kind, sig.attrs, sig.in_shapes, sig.out_shapes, weights=(False, True, True))
        assert m.cost(s) > 0
    assert m.estimated == 0
    m.close()
    data = json.loads(cache.read_text())
    assert len(next(iter(data["devices"].values()))) == 3


def test_cpu_split_of_a_4d_tensor_costs_its_pieces_reorders(cache):
    """onnxruntime keeps chains of convolutions in its blocked layout, and Split has no blocked kernel:
    a 4-D split costs its own copy plus each piece's reorders, measured as what a chain of two 1x1
    convolutions on the piece's shape saves over the two alone, and cached like a signature."""
    from taso_mlir.passes.cost.oracle import _conv_chain_models

    one, two = _conv_chain_models((1, 16, 9, 9))
    assert [n.op_type for n in one.graph.node] == ["Conv"] and [n.op_type for n in two.graph.node] == ["Conv"] * 2
    assert [list(t.dims) for t in two.graph.initializer] == [[16, 16, 1, 1]] * 2
    m = get_cost_model("cpu")
    m.repeats, m.target_s = 3, 1e-4
    x = (1, 32, 9, 9)
    s4 = split(x, 1, (8, 24))
    total, own = m.cost(s4), m._op_cost(s4)
    pieces = [m._reorder((1, 8, 9, 9)), m._reorder((1, 24, 9, 9))]
    assert all(r >= 0 for r in pieces) and total == pytest.approx(own + sum(pieces))
    assert m.layouts_measured == 2 and m.measured == 1
    s2 = split((4, 32), 1, (8, 24))  # 2-D: no layout effect
    assert m.cost(s2) == m._op_cost(s2)
    m.close()
    entries = next(iter(json.loads(cache.read_text())["devices"].values()))
    assert sum(k.startswith('["nchwc-reorder"') for k in entries) == 2
    again = get_cost_model("cpu")
    assert again.cost(s4) == pytest.approx(total) and again.measured == 0 and again.layouts_measured == 0
