"""ONNX -> taso MLIR -> ONNX round trips on exporter-shaped models (benchmarks/example_models.py).

For every model: the exported model passes ``onnx.checker`` (full check), computes the same numbers as
the original in onnxruntime, keeps graph input/output names, opsets, IR version and initializer names,
raises the ops in TASO's set to `taso` ops, and drops nothing. Also: the taso-opt CLI through MLIR text,
custom-domain ops, ``--input-shape`` for a dynamic batch, the one-line error without it, and a scale test
(~100 MB of weights) in a subprocess with its time and peak RSS.

Numbers are compared with onnxruntime's graph optimizations off, so that both models run as written.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_mlir.benchmarks import example_models as em
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.onnx_import import import_onnx, load_onnx

#: ONNX op type -> the `taso` ops it must become (in these models every such node is expressible).
RAISED = {
    "Conv": ("taso.conv2d",),
    "BatchNormalization": ("taso.batchnorm",),
    "Relu": ("taso.relu",),
    "Tanh": ("taso.tanh",),
    "Sigmoid": ("taso.sigmoid",),
    "MaxPool": ("taso.maxpool2d",),
    "AveragePool": ("taso.avgpool2d",),
    "MatMul": ("taso.matmul",),
    "Add": ("taso.ewadd",),
    "Mul": ("taso.ewmul", "taso.smul"),
    "Transpose": ("taso.transpose",),
    "Reshape": ("taso.reshape",),
    "Concat": ("taso.concat",),
    "Split": ("taso.split",),
}
#: taso ops each model must contain (a sanity floor on top of the counts above)
EXPECTED_TASO = {
    "cnn": {"taso.conv2d", "taso.batchnorm", "taso.relu", "taso.ewadd", "taso.maxpool2d", "taso.weight"},
    "transformer": {"taso.matmul", "taso.ewadd", "taso.ewmul", "taso.smul", "taso.transpose", "taso.reshape",
                    "taso.split", "taso.tanh", "taso.weight"},
    "inception": {"taso.conv2d", "taso.relu", "taso.concat", "taso.avgpool2d", "taso.maxpool2d", "taso.weight"},
}
#: Inputs that a taso op carries as an attribute instead (Reshape's shape, Split's sizes).
ATTR_INPUTS = {("Reshape", 1), ("Split", 1)}
#: Inputs that a raised Gemm reads transposed (transA / transB): a weight read there comes back transposed,
#: as ``<name>.T`` (convert-onnx-to-taso raises Gemm to [transpose] -> matmul -> [ewadd]).
GEMM_TRANSPOSED = {0: "transA", 1: "transB"}


def _reads(model: onnx.ModelProto) -> dict:
    """value name -> {(op_type, input index, read transposed by a Gemm)}"""
    reads = collections.defaultdict(set)
    for n in model.graph.node:
        at = {a.name: a.i for a in n.attribute} if n.op_type == "Gemm" else {}
        for i, x in enumerate(n.input):
            reads[x].add((n.op_type, i, bool(at.get(GEMM_TRANSPOSED.get(i, ""), 0))))
    return reads


def gemm_lowering(model: onnx.ModelProto) -> collections.Counter:
    """The ops the (live) Gemm nodes of these models become: a MatMul each, an Add where there is C, a
    Transpose for each transposed operand that is not a weight."""
    inits = {t.name for t in model.graph.initializer}
    out = collections.Counter()
    for n in live_nodes(model):
        if n.op_type != "Gemm" or n.domain not in ("", "ai.onnx"):
            continue
        at = {a.name: a.i for a in n.attribute}
        out["MatMul"] += 1
        out["Add"] += len(n.input) > 2 and bool(n.input[2])
        out["Transpose"] += sum(bool(at.get(a, 0)) and n.input[i] not in inits for i, a in GEMM_TRANSPOSED.items())
    return out


def _random_variant(kind: str, seed: int) -> dict:
    """Random sizes: batch > 1, odd spatial sizes / sequence lengths, different widths."""
    r = np.random.default_rng(1000 + seed)
    if kind == "cnn":
        g = int(r.choice([1, 2, 4]))
        return dict(batch=int(r.integers(2, 5)), image_size=(int(r.integers(8, 20)) * 2 + 1, int(r.integers(8, 20)) * 2 + 1),
                    widths=tuple(int(w) * 4 for w in r.integers(2, 8, size=int(r.integers(2, 4)))), groups=g,
                    blocks=int(r.integers(1, 3)), num_classes=int(r.integers(3, 12)), seed=seed)
    if kind == "transformer":
        heads = int(r.integers(1, 5))
        return dict(batch=int(r.integers(2, 5)), seq_len=int(r.integers(3, 20)) | 1, d_model=heads * int(r.integers(2, 9)),
                    num_heads=heads, num_layers=int(r.integers(1, 4)), d_ff=int(r.integers(8, 64)),
                    vocab_size=int(r.integers(20, 200)), seed=seed)
    return dict(batch=int(r.integers(2, 5)), image_size=(int(r.integers(5, 16)) * 2 + 1, int(r.integers(5, 16)) * 2 + 1),
                in_channels=int(r.integers(1, 5)), stem_channels=int(r.integers(4, 17)),
                branch_channels=tuple(int(c) for c in r.integers(2, 12, size=4)), blocks=int(r.integers(2, 4)),
                seed=seed)


CASES = [
    ("cnn", {}),
    ("cnn", dict(batch=3, image_size=(31, 27), widths=(8, 16), blocks=(1, 2), groups=2, seed=1)),
    ("transformer", {}),
    ("transformer", dict(batch=2, seq_len=13, d_model=24, num_heads=3, num_layers=3, d_ff=40, vocab_size=77,
                         seed=2)),
    ("inception", {}),
    ("inception", dict(batch=2, image_size=(23, 18), blocks=3, seed=3)),
] + [(kind, _random_variant(kind, s)) for kind in ("cnn", "transformer", "inception") for s in range(2)]


def _case_id(case) -> str:
    kind, kw = case
    return kind + ("" if not kw else "-" + "-".join(f"{k}={v}" for k, v in sorted(kw.items())).replace(" ", ""))


# ------------------------------------------------------------------------------------------------
# helpers


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same_numbers(original: onnx.ModelProto, other: onnx.ModelProto, seeds=(0, 1), shapes=None) -> None:
    for seed in seeds:
        feeds = em.random_inputs(original, seed=seed, shapes=shapes)
        want = run_ort(original, feeds)
        got = run_ort(other, feeds)
        assert len(want) == len(got)
        for i, (w, g) in enumerate(zip(want, got)):
            assert w.shape == g.shape and w.dtype == g.dtype, (i, w.shape, g.shape, w.dtype, g.dtype)
            tol = 1e-5 * max(1.0, float(np.abs(w).max()))
            diff = float(np.abs(w.astype(np.float64) - g.astype(np.float64)).max())
            assert diff <= tol, f"output {i}: max |diff| {diff} > {tol}"


def round_trip(model: onnx.ModelProto, **kw):
    module = import_onnx(model, make_context(), **kw)
    return module, export_onnx(module)


def mlir_op_counts(module) -> collections.Counter:
    counts = collections.Counter()
    fn = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
    for op in fn.regions[0].blocks[0].operations:
        counts[op.operation.name] += 1
    return counts


def live_nodes(model: onnx.ModelProto) -> list:
    """Nodes that feed a graph output once Reshape's shape and Split's sizes are attributes (with static
    shapes, the taso ops no longer read them, so their shape-computation chains become dead and the
    conversion removes them; a node that is dead in the original is removed as well)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    live, stack = set(), [o.name for o in model.graph.output]
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        ins = list(n.input)
        if n.op_type in ("Reshape", "Split") and n.domain in ("", "ai.onnx"):
            ins = ins[:1]
        stack.extend(i for i in ins if i)
    return [n for n in model.graph.node if id(n) in live]


def op_counts(model: onnx.ModelProto, skip=("Identity", "Constant"), live_only=False) -> collections.Counter:
    nodes = live_nodes(model) if live_only else model.graph.node
    return collections.Counter((n.domain or "", n.op_type) for n in nodes if n.op_type not in skip)


def check_interface(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    assert [i.name for i in out.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    assert {(o.domain or "", o.version) for o in out.opset_import} == \
        {(o.domain or "", o.version) for o in original.opset_import}
    assert out.ir_version == original.ir_version
    # element types and (static) shapes of the interface
    for a, b in zip(list(original.graph.input) + list(original.graph.output),
                    list(out.graph.input) + list(out.graph.output)):
        assert a.type.tensor_type.elem_type == b.type.tensor_type.elem_type, a.name
        assert [d.dim_value for d in a.type.tensor_type.shape.dim] == \
            [d.dim_value for d in b.type.tensor_type.shape.dim], a.name


def check_initializers(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Every initializer keeps its name and value, except those only read as an attribute of a taso op
    (Reshape's shape, Split's sizes); one read transposed by a Gemm comes back as ``<name>.T``, transposed
    (and under its own name too if something else reads it)."""
    reads = _reads(original)
    got = {t.name: t for t in out.graph.initializer}
    for t in original.graph.initializer:
        plain = {(op, i) for op, i, transposed in reads[t.name] if not transposed}
        if any(transposed for _, _, transposed in reads[t.name]):
            assert f"{t.name}.T" in got, f"initializer '{t.name}' read transposed by a Gemm: no '{t.name}.T'"
            np.testing.assert_array_equal(numpy_helper.to_array(got[f"{t.name}.T"]), numpy_helper.to_array(t).T)
            if not plain:
                continue
        if reads[t.name] and plain <= ATTR_INPUTS:
            continue
        assert t.name in got, f"initializer '{t.name}' lost its name"
        np.testing.assert_array_equal(numpy_helper.to_array(got[t.name]), numpy_helper.to_array(t))


def check_raised(kind: str, original: onnx.ModelProto, module) -> None:
    counts = mlir_op_counts(module)
    present = set(counts)
    missing = EXPECTED_TASO[kind] - present
    assert not missing, f"missing taso ops {sorted(missing)}; module has {sorted(present)}"
    orig = collections.Counter(n.op_type for n in live_nodes(original) if n.domain in ("", "ai.onnx"))
    gemm = gemm_lowering(original)  # Gemm nodes become matmul (+ ewadd, + transpose)
    assert counts["onnx.Gemm"] == 0, f"{counts['onnx.Gemm']} Gemm node(s) stayed generic"
    for op_type, taso_ops in RAISED.items():
        n_taso = sum(counts[t] for t in taso_ops)
        want = orig[op_type] + gemm[op_type]
        assert counts[f"onnx.{op_type}"] == 0, f"{counts[f'onnx.{op_type}']} {op_type} node(s) stayed generic"
        assert n_taso == want, f"{orig[op_type]} {op_type} nodes (+{gemm[op_type]} from Gemm) but {n_taso} " \
            f"{'/'.join(taso_ops)} ops"
    # the rest stays generic, one op per node
    for op_type, n in orig.items():
        if op_type in RAISED or op_type in ("Identity", "Constant", "Gemm"):
            continue
        assert counts[f"onnx.{op_type}"] == n, (op_type, counts[f"onnx.{op_type}"], n)


def check_nothing_dropped(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    want, got = op_counts(original, live_only=True), op_counts(out)
    want.pop(("", "Gemm"), None)  # (raised: what it becomes is counted instead)
    want.update({("", op): k for op, k in gemm_lowering(original).items()})
    for key, n in want.items():
        assert got[key] >= n, f"{key}: {n} in the original, {got[key]} after the round trip"


# ------------------------------------------------------------------------------------------------
# the builders, round tripped in process


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_round_trip(case):
    kind, kw = case
    original = em.BUILDERS[kind](**kw)
    onnx.checker.check_model(original, full_check=True)
    module, out = round_trip(original)
    onnx.checker.check_model(out, full_check=True)
    check_interface(original, out)
    check_initializers(original, out)
    check_raised(kind, original, module)
    check_nothing_dropped(original, out)
    assert_same_numbers(original, out)
    # the exported model carries static, inferred types for the intermediate values too
    assert all(d.HasField("dim_value") for vi in out.graph.value_info for d in vi.type.tensor_type.shape.dim)


def test_mlir_types_are_static():
    """Exporter-style shape arithmetic (Shape -> Gather -> Unsqueeze -> Slice/Concat -> Reshape/Expand)
    is resolved at import: no `?` dimension anywhere in the imported transformer."""
    module = import_onnx(em.build_transformer(batch=2, seq_len=7), make_context())
    text = str(module)
    assert "?" not in re.sub(r'"[^"]*"', "", text)
    assert "dense_resource" not in text


def test_round_trip_is_stable():
    """Importing the exported model again gives the same op mix (a second round trip changes nothing)."""
    original = em.build_transformer(num_layers=1)
    m1, out1 = round_trip(original)
    m2, out2 = round_trip(out1)
    assert mlir_op_counts(m1) == mlir_op_counts(m2)
    assert op_counts(out1) == op_counts(out2)
    assert_same_numbers(original, out2, seeds=(0,))


def test_bundled_example_model():
    path = em.EXAMPLE_CNN
    assert os.path.getsize(path) < 2 * 1024 * 1024
    bundled = load_onnx(path)
    # the file is what the builder makes (regenerate with `python -m taso_mlir.benchmarks.example_models`);
    # weight values are left out of the comparison (numpy's random streams may change between versions)
    built = em.example_cnn()
    assert list(bundled.graph.node) == list(built.graph.node)
    assert [(t.name, t.data_type, list(t.dims)) for t in bundled.graph.initializer] == \
        [(t.name, t.data_type, list(t.dims)) for t in built.graph.initializer]
    assert list(bundled.graph.input) == list(built.graph.input) and list(bundled.graph.output) == list(built.graph.output)
    module, out = round_trip(bundled)
    onnx.checker.check_model(out, full_check=True)
    check_interface(bundled, out)
    check_initializers(bundled, out)
    check_raised("cnn", bundled, module)
    check_nothing_dropped(bundled, out)
    assert_same_numbers(bundled, out)


def test_write_example_models(tmp_path):
    (path,) = em.write_example_models(str(tmp_path))
    assert os.path.basename(path) == os.path.basename(em.EXAMPLE_CNN)
    with open(path, "rb") as f:
        assert f.read() == em.example_cnn().SerializeToString()  # deterministic: a fixed seed


# ------------------------------------------------------------------------------------------------
# the CLI


def _taso_opt() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "taso-opt")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "taso_mlir.tools.taso_opt"]


def taso_opt(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(_taso_opt() + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("kind", ["cnn", "transformer", "inception"])
def test_cli_through_mlir_text(tmp_path, kind):
    """taso-opt in.onnx -o out.mlir; taso-opt out.mlir -o out.onnx: the MLIR text keeps the weights."""
    original = em.BUILDERS[kind](batch=2)
    src, mlir, dst = tmp_path / "in.onnx", tmp_path / "out.mlir", tmp_path / "out.onnx"
    onnx.save(original, src)
    before = src.read_bytes()
    taso_opt(src, "-o", mlir)
    text = mlir.read_text()
    assert "taso.weight" in text and "dense_resource" not in text and "__elided__" not in text
    taso_opt(mlir, "-o", dst)
    assert src.read_bytes() == before  # inputs are never modified
    out = onnx.load(str(dst))
    onnx.checker.check_model(out, full_check=True)
    check_interface(original, out)
    check_initializers(original, out)
    check_nothing_dropped(original, out)
    assert_same_numbers(original, out)
    # straight to ONNX gives the same graph as the detour through MLIR text
    direct = tmp_path / "direct.onnx"
    taso_opt(src, "-o", direct)
    assert op_counts(onnx.load(str(direct))) == op_counts(out)


# ------------------------------------------------------------------------------------------------
# custom domains, dynamic shapes


def _custom_domain_model() -> onnx.ModelProto:
    """com.microsoft FusedMatMul and Gelu (both run in onnxruntime) between standard ops; their output
    types are declared as value_info, as exporters do (ONNX cannot infer contrib ops)."""
    rng = np.random.default_rng(7)
    F = TensorProto.FLOAT
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "proj.weight")
    b = numpy_helper.from_array(rng.standard_normal((8,)).astype(np.float32), "proj.bias")
    nodes = [
        helper.make_node("FusedMatMul", ["x", "proj.weight"], ["/proj/FusedMatMul_output_0"], name="/proj/FusedMatMul",
                         domain="com.microsoft", alpha=0.5, transA=0, transB=0),
        helper.make_node("Add", ["/proj/FusedMatMul_output_0", "proj.bias"], ["/proj/Add_output_0"], name="/proj/Add"),
        helper.make_node("Gelu", ["/proj/Add_output_0"], ["/act/Gelu_output_0"], name="/act/Gelu",
                         domain="com.microsoft"),
        helper.make_node("Relu", ["/act/Gelu_output_0"], ["y"], name="/Relu"),
    ]
    vi = [helper.make_tensor_value_info("/proj/FusedMatMul_output_0", F, [2, 4, 8]),
          helper.make_tensor_value_info("/act/Gelu_output_0", F, [2, 4, 8])]
    g = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("x", F, [2, 4, 16])],
                          [helper.make_tensor_value_info("y", F, [2, 4, 8])], [w, b], value_info=vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_custom_domain_op_keeps_its_domain():
    original = _custom_domain_model()
    module, out = round_trip(original)
    text = str(module)
    assert '"onnx.FusedMatMul"' in text and '"onnx.Gelu"' in text and 'taso.domain = "com.microsoft"' in text
    assert mlir_op_counts(module)["taso.ewadd"] == 1 and mlir_op_counts(module)["taso.relu"] == 1
    onnx.checker.check_model(out, full_check=True)
    domains = {n.op_type: n.domain for n in out.graph.node}
    assert domains["FusedMatMul"] == "com.microsoft" and domains["Gelu"] == "com.microsoft"
    fused = next(n for n in out.graph.node if n.op_type == "FusedMatMul")
    assert helper.get_node_attr_value(fused, "alpha") == pytest.approx(0.5)
    check_interface(original, out)
    check_initializers(original, out)
    check_nothing_dropped(original, out)
    assert_same_numbers(original, out)


def test_custom_domain_through_mlir_text(tmp_path):
    original = _custom_domain_model()
    src, mlir, dst = tmp_path / "in.onnx", tmp_path / "out.mlir", tmp_path / "out.onnx"
    onnx.save(original, src)
    taso_opt(src, "-o", mlir)
    assert 'taso.domain = "com.microsoft"' in mlir.read_text()
    taso_opt(mlir, "-o", dst)
    out = onnx.load(str(dst))
    onnx.checker.check_model(out, full_check=True)
    assert {n.op_type: n.domain for n in out.graph.node if n.domain} == \
        {"FusedMatMul": "com.microsoft", "Gelu": "com.microsoft"}
    check_interface(original, out)
    assert_same_numbers(original, out)


def test_custom_domain_op_without_declared_type_is_one_line_error():
    model = _custom_domain_model()
    del model.graph.value_info[:]
    with pytest.raises(TasoError) as e:
        import_onnx(model, make_context())
    msg = str(e.value)
    assert "\n" not in msg
    assert "'/proj/FusedMatMul_output_0'" in msg and "FusedMatMul node '/proj/FusedMatMul'" in msg
    assert "value_info" in msg


@pytest.mark.parametrize("search", [False, True], ids=["round-trip", "search"])
@pytest.mark.parametrize("kind,shape_arg,shapes", [
    ("cnn", ["--input-shape", "input=2x3x32x32"], {"input": (2, 3, 32, 32)}),
    ("transformer", ["--input-shape", "input_ids=3x16", "--input-shape", "attention_mask=3x16"],
     {"input_ids": (3, 16), "attention_mask": (3, 16)}),
])
def test_input_shape_fixes_dynamic_batch(tmp_path, kind, shape_arg, shapes, search):
    """Also through the search, whose numeric check feeds the input model (dynamic) the shapes given."""
    original = em.BUILDERS[kind](dynamic_batch=True)
    assert original.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch_size"
    src, dst = tmp_path / "dyn.onnx", tmp_path / "static.onnx"
    onnx.save(original, src)
    p = taso_opt(src, *shape_arg, *(["--taso-search"] if search else []), "-o", dst)
    if search:
        assert "numerics: max |difference|" in p.stderr and "onnxruntime: ok" in p.stderr, p.stderr
    out = onnx.load(str(dst))
    onnx.checker.check_model(out, full_check=True)
    assert [i.name for i in out.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    for vi in out.graph.input:
        assert tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) == shapes[vi.name]
    for vi in out.graph.output:
        assert vi.type.tensor_type.shape.dim[0].dim_value == shapes[out.graph.input[0].name][0]
    if not search:  # (the search rewrites ops)
        check_nothing_dropped(original, out)
    assert_same_numbers(original, out, shapes=shapes)
    # the same through the Python API
    module = import_onnx(original, make_context(), input_shapes={k: list(v) for k, v in shapes.items()})
    check_raised(kind, original, module)


def test_dynamic_input_without_input_shape_is_one_line_error(tmp_path):
    src = tmp_path / "dyn.onnx"
    onnx.save(em.build_cnn(dynamic_batch=True), src)
    p = taso_opt(src, "-o", tmp_path / "out.onnx", check=False)
    assert p.returncode == 1
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("taso-opt: error: ")
    assert "'input'" in lines[0] and "--input-shape" in lines[0] and "batch_size" in lines[0]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(TasoError, match=r"graph input 'input_ids' has a dynamic dimension 0"):
        import_onnx(em.build_transformer(dynamic_batch=True), make_context())


# ------------------------------------------------------------------------------------------------
# scale: ~100 MB of weights, time and peak memory measured in a fresh process

SCALE_MODELS = {
    # ~105 MB: 7 layers of d_model 512 + an 8192 x 512 embedding
    "transformer": dict(seq_len=128, vocab_size=8192, d_model=512, num_heads=8, num_layers=7, max_positions=512),
    # ~98 MB: ResNeXt-style stages of width 256/512/1024
    "cnn": dict(image_size=64, widths=(256, 512, 1024), blocks=(2, 3, 7), groups=8),
}
SCALE_SECONDS = 30.0
SCALE_RSS_BYTES = 4 * 1024**3

_SCALE_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    t0 = time.perf_counter()
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx, save_onnx
    from taso_mlir.dialect.onnx_import import import_onnx, load_onnx
    t1 = time.perf_counter()
    model = load_onnx(sys.argv[1])
    t2 = time.perf_counter()
    module = import_onnx(model, make_context())
    t3 = time.perf_counter()
    out = export_onnx(module)
    t4 = time.perf_counter()
    save_onnx(out, sys.argv[2])
    t5 = time.perf_counter()
    print(json.dumps(dict(python_imports=t1 - t0, load=t2 - t1, import_=t3 - t2, export=t4 - t3, save=t5 - t4,
                          round_trip=t5 - t1, peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SCALE_MODELS))
def test_scale_round_trip(tmp_path, kind):
    original = em.BUILDERS[kind](**SCALE_MODELS[kind])
    wb = em.weight_bytes(original)
    assert 90e6 <= wb <= 130e6, wb
    src, dst = tmp_path / "big.onnx", tmp_path / "big.out.onnx"
    onnx.save(original, src)
    p = subprocess.run([sys.executable, "-c", _SCALE_CHILD, str(src), str(dst)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\nscale {kind}: {wb / 1e6:.1f} MB weights, {len(original.graph.node)} nodes: "
          + ", ".join(f"{k} {v:.2f}s" for k, v in stats.items() if k != "peak_rss")
          + f", peak RSS {stats['peak_rss'] / 2**20:.0f} MiB")
    assert stats["round_trip"] < SCALE_SECONDS, stats
    assert stats["peak_rss"] < SCALE_RSS_BYTES, stats
    out = onnx.load(str(dst))
    onnx.checker.check_model(str(dst), full_check=True)
    check_interface(original, out)
    check_initializers(original, out)
    check_nothing_dropped(original, out)
    assert_same_numbers(original, out, seeds=(0,))


def test_initializers_listed_as_inputs_are_reported(tmp_path):
    """A model exported with its weights also listed as graph inputs (keep_initializers_as_inputs): they
    are taken as constants, and taso-opt says so instead of dropping them from the inputs silently."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    p = taso_opt(src, "-o", dst)
    assert "note: 1 graph input(s) with an initializer ('w') are taken as constants" in p.stderr, p.stderr
    assert [i.name for i in onnx.load(str(dst)).graph.input] == ["x"]
