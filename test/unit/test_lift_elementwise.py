"""Lifting elementwise ops over splits (``passes.lift_elementwise``): its proof, what it lifts and what it
leaves alone, the alignment of a matmul's pieces by permuting its weight's column blocks, the cost guard,
and end to end on an RNN cell in onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from taso_mlir.benchmarks.suite import build_nasrnn
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.passes.cost.oracle import CostModel, get_cost_model
from taso_mlir.passes.cleanup.lift_elementwise import lift_elementwise, prove
from taso_mlir.passes.weights import fold_weights
from taso_mlir.dialect.ops import function_dce
from unit_helpers import run_function, run_pass


def test_proof():
    import z3

    assert prove() == z3.unsat


def _split(name, src, n, piece, whole):
    sizes = ", ".join([str(piece)] * n)
    seg = ", ".join(["1"] * n + ["0"] * (16 - n))
    types = ", ".join([f"tensor<1x{piece}xf32>"] * n)
    return (f'%{name}:{n} = "taso.split"(%{src}) {{axis = 1 : i64, sizes = array<i64: {sizes}>, '
            f'resultSegmentSizes = array<i32: {seg}>}} : (tensor<1x{whole}xf32>) -> ({types})')


def _ew(name, kind, a, b, piece):
    return f'%{name} = "taso.{kind}"(%{a}, %{b}) : (tensor<1x{piece}xf32>, tensor<1x{piece}xf32>) -> tensor<1x{piece}xf32>'


def _weights(rng, k, n):
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return (f'%w = "taso.weight"() {{name = "w", value = dense<{w.tolist()}> : tensor<{k}x{n}xf32>}} : () -> tensor<{k}x{n}xf32>\n'
            f'  %b = "taso.weight"() {{name = "b", value = dense<{b.tolist()}> : tensor<{n}xf32>}} : () -> tensor<{n}xf32>')


def _gates(pairs, extra_use=False, piece=8, n=4, k=6, matmul_first=False, keep_piece=None):
    """x [1, n*piece] split n ways; y = matmul(h, w, b) split n ways; one ewadd per (i, j) in ``pairs``
    (``matmul_first``: y's split comes first in the block, so the pass meets it first; ``keep_piece``:
    that piece of both splits is also returned, so the splits stay)."""
    whole = piece * n
    rng = np.random.default_rng(0)
    kept = [f"xs#{keep_piece}", f"ys#{keep_piece}"] if keep_piece is not None else []
    outs = [f"a{t}" for t in range(len(pairs))] + (["y"] if extra_use else []) + kept
    otypes = ([f"tensor<1x{piece}xf32>"] * len(pairs) + ([f"tensor<1x{whole}xf32>"] if extra_use else [])
              + [f"tensor<1x{piece}xf32>"] * len(kept))
    body = [_weights(rng, k, whole),
            f'%y = "taso.matmul"(%h, %w, %b) {{activation = "none", operandSegmentSizes = array<i32: 1, 1, 1>}} : '
            f'(tensor<1x{k}xf32>, tensor<{k}x{whole}xf32>, tensor<{whole}xf32>) -> tensor<1x{whole}xf32>',
            *([_split("ys", "y", n, piece, whole), _split("xs", "x", n, piece, whole)] if matmul_first else
              [_split("xs", "x", n, piece, whole), _split("ys", "y", n, piece, whole)])]
    body += [_ew(f"a{t}", "ewadd", f"xs#{i}", f"ys#{j}", piece) for t, (i, j) in enumerate(pairs)]
    return (f"func.func @f(%x: tensor<1x{whole}xf32>, %h: tensor<1x{k}xf32>) -> ({', '.join(otypes)}) {{\n  "
            + "\n  ".join(body) + f"\n  return {', '.join('%' + o for o in outs)} : {', '.join(otypes)}\n}}\n")


def _run(text, cost_model=None):
    """(ops by name after the pass, (lifted, permuted), reference outputs before, after)."""
    def apply(f):
        got = lift_elementwise(f, cost_model or get_cost_model("analytic"))
        fold_weights(f)  # the permuted weights
        return got
    return run_pass(text, apply)


def _same(before, after):
    assert len(before) == len(after)
    for x, y in zip(before, after):
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6)


def test_aligned_pieces_lift():
    names, got, before, after = _run(_gates([(0, 0), (1, 1), (3, 3)]))
    assert got == (3, 0)
    assert names.count("taso.ewadd") == 1
    _same(before, after)


def test_pieces_in_another_order_are_aligned_by_permuting_the_weight_then_lift():
    names, got, before, after = _run(_gates([(0, 1), (1, 0), (2, 3), (3, 2)]))
    assert got == (4, 1)
    assert names.count("taso.ewadd") == 1 and names.count("taso.concat") == 0, names  # the permutation folded
    _same(before, after)


def test_alignment_from_either_side():
    """Met from the matmul's split first, whose partner (a function argument) cannot be permuted: the
    matmul's own weight is."""
    names, got, before, after = _run(_gates([(0, 1), (1, 0), (2, 3), (3, 2)], matmul_first=True))
    assert got == (4, 1) and names.count("taso.ewadd") == 1, names
    _same(before, after)


def test_no_alignment_where_the_matmul_has_another_use():
    names, got, before, after = _run(_gates([(0, 1), (1, 0), (2, 3), (3, 2)], extra_use=True))
    assert got == (0, 0) and names.count("taso.ewadd") == 4
    _same(before, after)


class _NoLaunch(CostModel):
    """Bytes only: one op on the whole tensor and its split move more than the ops on the pieces."""

    name = "bytes"

    def _cost(self, sig):
        from taso_mlir.passes.cost.oracle import nbytes

        return nbytes(sig) * 1e-9


def test_the_cost_model_decides():
    """Bytes only, the splits staying (a piece of each is used as it is): the op on the whole and its
    split move more than the ops on the pieces."""
    names, got, before, after = _run(_gates([(0, 0), (1, 1), (3, 3)], keep_piece=2), cost_model=_NoLaunch())
    assert got == (0, 0) and names.count("taso.ewadd") == 3
    _same(before, after)


def test_splits_that_go_with_the_lift_count():
    """Bytes only, nothing else using the splits: the lift removes two split copies and adds one."""
    names, got, before, after = _run(_gates([(0, 0), (1, 1), (3, 3)]), cost_model=_NoLaunch())
    assert got == (3, 0) and names.count("taso.ewadd") == 1 and names.count("taso.split") == 1
    _same(before, after)


def test_one_pair_lifts_where_both_splits_go():
    """One ewadd of piece 2 of two splits that feed nothing else: three launches (two splits and the
    add) become two (the add on the whole and its split)."""
    names, got, before, after = _run(_gates([(2, 2)]))
    assert got == (1, 0) and names.count("taso.split") == 1
    _same(before, after)


def test_rnn_cell_end_to_end_in_onnxruntime(tmp_path):
    src = tmp_path / "nasrnn.onnx"
    onnx.save(build_nasrnn(steps=3, hidden=16), src)
    out, rep = tmp_path / "out.onnx", tmp_path / "rep.json"
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "-o", str(out),
                        f"--taso-report={rep}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    assert fr["elementwise_lifted"] >= 6, fr
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 1, 16)).astype(np.float32)}
    ya = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    yb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-6)


def test_duplicate_folded_weights_merge():
    """Two weight-only concats of the same kernels fold into equal weights, which become one; the input's
    own weights are left as they are even where equal."""
    from taso_mlir.passes.weights import merge_duplicate_weights

    text = """
func.func @f(%x: tensor<2x4xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %a = "taso.weight"() {name = "a", value = dense<1.5> : tensor<4x4xf32>} : () -> tensor<4x4xf32>
  %b = "taso.weight"() {name = "b", value = dense<-0.5> : tensor<4x4xf32>} : () -> tensor<4x4xf32>
  %a2 = "taso.weight"() {name = "a2", value = dense<1.5> : tensor<4x4xf32>} : () -> tensor<4x4xf32>
  %c1 = "taso.concat"(%a, %b) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
  %c2 = "taso.concat"(%a, %b) {axis = 1 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x8xf32>
  %m1 = "taso.matmul"(%x, %c1) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
  %m2 = "taso.matmul"(%x, %c2) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
  %m3 = "taso.matmul"(%x, %a) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %m4 = "taso.matmul"(%x, %a2) {activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  return %m1, %m2, %m3, %m4 : tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}
"""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        x = [np.random.default_rng(0).standard_normal((2, 4))]
        before = run_function(f, x)
        assert fold_weights(f) == 2
        assert merge_duplicate_weights(f) == 1
        function_dce(f)
        names = [ir.StringAttr(o.operation.attributes["name"]).value for o in f.regions[0].blocks[0].operations
                 if o.operation.name == "taso.weight"]
        assert len(names) == 3 and sorted(names)[:2] == ["a", "a2"] and names[2].startswith("taso_folded_"), names
        _same(before, run_function(f, x))


def test_a_batched_weight_is_not_permuted():
    """A matmul with a 3-D weight: its columns are not axis 1, so it is not permuted (pieces paired
    crosswise stay as they are)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((2, 32, 32)).astype(np.float32)
    t3 = "tensor<2x1x32xf32>"
    seg = ", ".join(["1"] * 4 + ["0"] * 12)
    piece = "tensor<2x1x8xf32>"

    def split(name, src):
        return (f'%{name}:4 = "taso.split"(%{src}) {{axis = 2 : i64, sizes = array<i64: 8, 8, 8, 8>, '
                f'resultSegmentSizes = array<i32: {seg}>}} : ({t3}) -> ({", ".join([piece] * 4)})')
    pairs = [(0, 1), (1, 0), (2, 3), (3, 2)]
    body = [f'%w = "taso.weight"() {{name = "w", value = dense<{w.tolist()}> : tensor<2x32x32xf32>}} : () -> tensor<2x32x32xf32>',
            f'%y = "taso.matmul"(%h, %w) {{activation = "none", operandSegmentSizes = array<i32: 1, 1, 0>}} : ({t3}, tensor<2x32x32xf32>) -> {t3}',
            split("xs", "x"), split("ys", "y")]
    body += [f'%a{t} = "taso.ewadd"(%xs#{i}, %ys#{j}) : ({piece}, {piece}) -> {piece}' for t, (i, j) in enumerate(pairs)]
    text = (f"func.func @f(%x: {t3}, %h: {t3}) -> ({', '.join([piece] * 4)}) {{\n  " + "\n  ".join(body)
            + f"\n  return {', '.join(f'%a{t}' for t in range(4))} : {', '.join([piece] * 4)}\n}}\n")
    names, got, before, after = _run(text)
    assert got == (0, 0) and names.count("taso.ewadd") == 4
    _same(before, after)


def test_no_permutation_without_a_lift_that_gains():
    """Two pieces paired crosswise: the lift they would allow does not gain (two ops become an op and a
    split), so the weight is not permuted either."""
    names, got, before, after = _run(_gates([(0, 1), (1, 0)]))
    assert got == (0, 0) and names.count("taso.ewadd") == 2 and "taso.concat" not in names
    _same(before, after)
