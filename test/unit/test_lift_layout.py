"""Lifting reshapes and transposes over splits (``passes.lift_layout``): its proof (and that the proof
can fail), the reshape plan, what it lifts and what it leaves alone, the cost guard, reshape chains, and
end to end on a BERT layer in onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from taso_mlir.benchmarks.suite import build_bert
from taso_mlir.passes.cleanup import lift_layout as LL
from taso_mlir.passes.cost.oracle import CostModel, get_cost_model, nbytes
from unit_helpers import run_pass


def test_proof():
    import z3

    result, cases = LL.prove()
    assert result == z3.unsat, cases
    # each family is checked on many cases (the residual ones alone would pass a total)
    assert cases["transpose"] > 500 and cases["reshape"] > 300 and cases["residual"] > 500, cases


def test_the_proof_fails_on_a_wrong_plan(monkeypatch):
    """A plan that keeps the split axis where the transpose moved it is refuted."""
    import z3

    monkeypatch.setattr(LL, "transpose_plan", lambda shape, axis, sizes, perm: ([shape[p] for p in perm], axis, sizes))
    result, case = LL.prove(max_rank=2, max_dim=3)
    assert result == z3.sat and case[0].startswith("transpose")  # by shape or by Z3


def test_the_proof_fails_on_a_wrong_reshape_plan(monkeypatch):
    """A plan that splits the axis after the right one is refuted."""
    import z3

    right = LL.reshape_plan

    def wrong(shape, axis, sizes, targets):
        plan = right(shape, axis, sizes, targets)
        if plan is None or plan[1] + 1 >= len(plan[0]) or plan[0][plan[1] + 1] < 2:
            return plan
        whole, j, new = plan
        return whole, j + 1, new
    monkeypatch.setattr(LL, "reshape_plan", wrong)
    result, case = LL.prove(max_rank=2, max_dim=3)
    assert result != z3.unsat and case[0].startswith("reshape")


def test_the_proof_fails_on_a_wrong_residual(monkeypatch):
    import z3

    monkeypatch.setattr(LL, "residual_perm", lambda lifted, perm: list(perm))
    result, case = LL.prove(max_rank=2, max_dim=2)
    assert result == z3.sat and case[0].startswith("residual")


def test_z3_itself_refutes_a_wrong_residual_where_the_shapes_agree(monkeypatch):
    """On a cube every perm gives the same shape, so only the element check can refute."""
    import z3

    monkeypatch.setattr(LL, "_layouts", lambda max_rank, max_dim: iter([(2, 2, 2)]))
    monkeypatch.setattr(LL, "residual_perm", lambda lifted, perm: list(perm))
    result, case = LL.prove()
    assert result == z3.sat and case[0] == "residual", case


@pytest.mark.parametrize("shape, axis, sizes, targets, plan", [
    # BERT's heads: [S, 3H] split in three, each piece to [1, S, heads, D]
    ([64, 3072], 1, [1024] * 3, [[1, 64, 16, 64]] * 3, ([1, 64, 48, 64], 2, [16, 16, 16])),
    # a restored flattened matmul: [B*S, N] pieces back to [B, S, N]
    ([8, 96], 1, [32, 64], [[2, 4, 32], [2, 4, 64]], ([2, 4, 96], 2, [32, 64])),
    # splitting the leading axis: pieces of rows flattened
    ([6, 4], 0, [2, 4], [[8], [16]], ([24], 0, [8, 16])),
    # the reshape moves elements across the split axis's boundary (the piece's rows become columns)
    ([64, 3072], 1, [1024] * 3, [[1024, 64]] * 3, None),
    # the pieces go to different layouts
    ([4, 8], 1, [4, 4], [[4, 2, 2], [2, 4, 2]], None),
    # leading axes regrouped: each piece's rows are no longer whole runs of X
    ([4, 6], 1, [3, 3], [[2, 6], [2, 6]], None),
])
def test_reshape_plan(shape, axis, sizes, targets, plan):
    assert LL.reshape_plan(shape, axis, sizes, targets) == plan


SEG = "resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>"


def _heads(perms=((0, 2, 1, 3),) * 3, skip_reshape=None, extra_use=False):
    """x [8, 48] split in three on axis 1; each piece reshaped to [1, 8, 4, 4] and transposed by perms[i]
    (``skip_reshape``: that piece is returned as it is; ``extra_use``: piece 0 is also returned)."""
    body, outs, otypes = [], [], []
    body.append(f'%s:3 = "taso.split"(%x) {{axis = 1 : i64, sizes = array<i64: 16, 16, 16>, {SEG}}} : '
                f'(tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>)')
    for i, perm in enumerate(perms):
        if i == skip_reshape:
            outs.append(f"%s#{i}")
            otypes.append("tensor<8x16xf32>")
            continue
        body.append(f'%r{i} = "taso.reshape"(%s#{i}) {{shape = array<i64: 1, 8, 4, 4>}} : (tensor<8x16xf32>) -> tensor<1x8x4x4xf32>')
        ts = [[1, 8, 4, 4][p] for p in perm]
        t = "tensor<" + "x".join(map(str, ts)) + "xf32>"
        body.append(f'%t{i} = "taso.transpose"(%r{i}) {{perm = array<i64: {", ".join(map(str, perm))}>}} : '
                    f'(tensor<1x8x4x4xf32>) -> {t}')
        outs.append(f"%t{i}")
        otypes.append(t)
    if extra_use:
        outs.append("%s#0")
        otypes.append("tensor<8x16xf32>")
    return ("func.func @f(%x: tensor<8x48xf32>) -> (" + ", ".join(otypes) + ") {\n  " + "\n  ".join(body)
            + f"\n  return {', '.join(outs)} : {', '.join(otypes)}\n}}\n")


def _run(text, cost_model=None):
    """(ops by name after the pass, (reshapes composed, ops lifted), reference outputs before, after)."""
    return run_pass(text, lambda f: LL.lift_layout(f, cost_model or get_cost_model("analytic")))


def _same(before, after):
    assert len(before) == len(after)
    for x, y in zip(before, after):
        assert x.shape == y.shape
        np.testing.assert_array_equal(y, x)  # data movement: bit for bit


def test_heads_lift_to_one_reshape_one_transpose_one_split():
    names, got, before, after = _run(_heads())
    assert got == (0, 6)
    assert names.count("taso.reshape") == 1 and names.count("taso.transpose") == 1 and names.count("taso.split") == 1
    _same(before, after)


def test_a_piece_transposed_otherwise_keeps_a_residual_transpose():
    """The keys of a torch export: [0, 2, 3, 1] where the queries and values have [0, 2, 1, 3]. The common
    perm is lifted, the keys' piece keeps [0, 1, 3, 2] after the split."""
    names, got, before, after = _run(_heads(perms=((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3))))
    assert got == (0, 5) and names.count("taso.transpose") == 2 and names.count("taso.reshape") == 1
    _same(before, after)


def test_all_perms_different_lift_no_transpose():
    """No perm is shared: lifting one leaves two residual transposes and a split, no gain (the reshapes
    before them lift)."""
    names, got, before, after = _run(_heads(perms=((0, 2, 1, 3), (0, 2, 3, 1), (0, 1, 3, 2))))
    assert got == (0, 3) and names.count("taso.transpose") == 3
    _same(before, after)


def test_a_piece_without_the_op_blocks_the_lift():
    names, got, before, after = _run(_heads(skip_reshape=1))
    assert got == (0, 0) and names.count("taso.reshape") == 2 and names.count("taso.transpose") == 2
    _same(before, after)


def test_another_use_of_a_piece_keeps_the_old_split_and_the_cost_decides():
    """Piece 0 is also returned: the old split would stay for it, so lifting the reshapes would add a
    second split kernel, which costs more than the three reshape dispatches: nothing lifts (and the
    transposes, on reshapes, not on pieces, stay too)."""
    names, got, before, after = _run(_heads(extra_use=True))
    assert got == (0, 0) and names.count("taso.split") == 1
    _same(before, after)


def test_the_old_split_stays_for_another_use_and_the_transposes_still_lift():
    """Pieces of a 4-D split transposed alike, piece 0 also returned: the old split stays for it, and one
    transpose of the whole and a new split (two launches) still beat three transposes."""
    seg = "resultSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>"
    piece, tp = "tensor<1x8x4x4xf32>", "tensor<1x4x8x4xf32>"
    body = [f'%s:3 = "taso.split"(%x) {{axis = 2 : i64, sizes = array<i64: 4, 4, 4>, {seg}}} : '
            f'(tensor<1x8x12x4xf32>) -> ({piece}, {piece}, {piece})']
    body += [f'%t{i} = "taso.transpose"(%s#{i}) {{perm = array<i64: 0, 2, 1, 3>}} : ({piece}) -> {tp}' for i in range(3)]
    text = (f"func.func @f(%x: tensor<1x8x12x4xf32>) -> ({tp}, {tp}, {tp}, {piece}) {{\n  " + "\n  ".join(body)
            + f"\n  return %t0, %t1, %t2, %s#0 : {tp}, {tp}, {tp}, {piece}\n}}\n")
    names, got, before, after = _run(text)
    assert got == (0, 3) and names.count("taso.transpose") == 1 and names.count("taso.split") == 2, names
    _same(before, after)


class _BytesOnly(CostModel):
    """Bytes only: a transpose of the whole and its split move as much as the split and the pieces'
    transposes, so nothing gains."""

    name = "bytes"

    def _cost(self, sig):
        return nbytes(sig) * 1e-9 if sig.kind != "reshape" else 0.0


def test_the_cost_model_decides():
    names, got, before, after = _run(_heads(), cost_model=_BytesOnly())
    assert got == (0, 0) and names.count("taso.transpose") == 3
    _same(before, after)


def test_reshape_chains_compose():
    text = """
func.func @f(%x: tensor<8x16xf32>) -> (tensor<2x4x16xf32>, tensor<8x16xf32>) {
  %a = "taso.reshape"(%x) {shape = array<i64: 128>} : (tensor<8x16xf32>) -> tensor<128xf32>
  %b = "taso.reshape"(%a) {shape = array<i64: 2, 4, 16>} : (tensor<128xf32>) -> tensor<2x4x16xf32>
  %c = "taso.reshape"(%b) {shape = array<i64: 8, 16>} : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %d = "taso.relu"(%c) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %b, %d : tensor<2x4x16xf32>, tensor<8x16xf32>
}
"""
    names, got, before, after = _run(text)
    # %b reads %x directly (%a goes); %c reads %x and is a reshape to %x's own type (it goes)
    assert got[0] == 2 and names.count("taso.reshape") == 1, names
    _same(before, after)


def test_bert_layer_end_to_end_in_onnxruntime(tmp_path):
    src = tmp_path / "bert.onnx"
    onnx.save(build_bert(seq_len=8, hidden=64, heads=4, layers=2), src)
    out, rep = tmp_path / "out.onnx", tmp_path / "rep.json"
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--taso-search", "-o", str(out),
                        f"--taso-report={rep}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    assert fr["applied"] and fr["layout_lifted"] >= 6, fr  # the Q/K/V merges, then their layouts lifted
    sess_a = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    sess_b = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    feeds = {}
    for i in sess_a.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = (rng.standard_normal(shape).astype(np.float32) if "float" in i.type
                         else np.ones(shape, dtype=np.int64))
    for ya, yb in zip(sess_a.run(None, feeds), sess_b.run(None, feeds)):
        np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)


def test_a_chain_back_to_its_source_goes_entirely():
    """reshape(reshape(x)) back to x's type, the inner one used only there: both go (the inner one is
    erased before the outer one is found to be the identity; a torch-exported nn.TransformerEncoder has
    this)."""
    text = """
func.func @f(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %a = "taso.reshape"(%x) {shape = array<i64: 128>} : (tensor<8x16xf32>) -> tensor<128xf32>
  %b = "taso.reshape"(%a) {shape = array<i64: 8, 16>} : (tensor<128xf32>) -> tensor<8x16xf32>
  %d = "taso.relu"(%b) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %d : tensor<8x16xf32>
}
"""
    names, got, before, after = _run(text)
    assert got[0] == 1 and "taso.reshape" not in names, names
    _same(before, after)
