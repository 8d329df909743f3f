"""The replay's local reordering (pdl._order_locally): a site's ops move up, in rule order, to just after
the last op defining one of their other operands, weights included, so that PDL can insert the target
before the root; where that would move a site op down it refuses and leaves the block as it was. The
block stays valid either way."""

from __future__ import annotations

from taso_mlir.dialect.mlir import ir, make_context
from taso_mlir.passes import pdl as P

T = "tensor<2x4xf32>"
W = "tensor<4x4xf32>"


def _block(text):
    m = ir.Module.parse(text)
    block = m.body.operations[0].regions[0].blocks[0]
    return m, block, {str(ir.StringAttr(o.operation.attributes["name"]).value): o.operation
                      for o in block.operations if "name" in o.operation.attributes}


def _names(block):
    out = []
    for o in block.operations:
        op = o.operation
        out.append(str(ir.StringAttr(op.attributes["name"]).value) if "name" in op.attributes else op.name)
    return out


# Q and K projections of one input, each used right after it; K's weight defined after Q's use
QK = f"""func.func @f(%x: {T}) -> ({T}, {T}) {{
  %wq = "taso.weight"() {{name = "wq", value = dense<1.0> : {W}}} : () -> {W}
  %q = "taso.matmul"(%x, %wq) {{activation = "none", name = "q", operandSegmentSizes = array<i32: 1, 1, 0>}} : ({T}, {W}) -> {T}
  %rq = "taso.relu"(%q) {{name = "rq"}} : ({T}) -> {T}
  %wk = "taso.weight"() {{name = "wk", value = dense<2.0> : {W}}} : () -> {W}
  %k = "taso.matmul"(%x, %wk) {{activation = "none", name = "k", operandSegmentSizes = array<i32: 1, 1, 0>}} : ({T}, {W}) -> {T}
  %rk = "taso.relu"(%k) {{name = "rk"}} : ({T}) -> {T}
  return %rq, %rk : {T}, {T}
}}"""


def test_site_moves_up_with_its_weights():
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m, block, ops = _block(QK)
        site = [ops["q"], ops["k"]]  # rule order: the root (k) last
        assert P._dominance_ok(site, {}) is not None  # rq uses q before the root
        assert P._order_locally(block, site)
        assert P._dominance_ok(site, {}) is None
        assert _names(block) == ["wq", "wk", "q", "k", "rq", "rk", "func.return"]
        assert m.operation.verify()


def test_refuses_to_move_a_site_op_down():
    # the site's second op reads a value computed (not a weight) after the first op's use: the first
    # op would have to move down past its user; refused, the block unchanged
    text = QK.replace(f'%wk = "taso.weight"() {{name = "wk", value = dense<2.0> : {W}}} : () -> {W}',
                      f'%wk0 = "taso.weight"() {{name = "wk0", value = dense<2.0> : {W}}} : () -> {W}\n'
                      f'  %wk = "taso.relu"(%wk0) {{name = "wk"}} : ({W}) -> {W}')
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m, block, ops = _block(text)
        before = _names(block)
        assert not P._order_locally(block, [ops["q"], ops["k"]])
        assert _names(block) == before
        assert m.operation.verify()
        P._order_for_site(block, [ops["q"], ops["k"]])  # the whole-block reorder handles it
        assert P._dominance_ok([ops["q"], ops["k"]], {}) is None
        assert m.operation.verify()
