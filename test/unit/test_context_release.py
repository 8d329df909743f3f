"""MLIR contexts (and the weights they store) are released once nothing holds them: the `taso` dialect's
IRDL module is kept alive only as long as its context is in use (``irdl_gen.release_unused_contexts``)."""

import gc

import numpy as np

from taso_mlir.dialect import irdl_gen
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context

_TEXT = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %w = "taso.weight"() {name = "w", value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
  %0 = "taso.ewadd"(%a, %w) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def _parse(ctx):
    with ctx, ir.Location.unknown():
        return ir.Module.parse(_TEXT)


def test_unused_contexts_are_released():
    irdl_gen.release_unused_contexts()
    gc.collect()
    base = ir.Context._get_live_count()
    for _ in range(5):
        m = _parse(make_context())
        m.operation.verify()
        del m
    gc.collect()
    # each new context released the ones before it; the last one goes on an explicit sweep
    assert ir.Context._get_live_count() == base + 1
    assert irdl_gen.release_unused_contexts() == 1
    assert ir.Context._get_live_count() == base


def test_a_context_in_use_is_kept_and_still_works():
    ctx = make_context()
    m = _parse(ctx)
    del ctx  # the module still holds the context
    for _ in range(3):
        irdl_gen.release_unused_contexts()
        make_context()  # (sweeps too)
    m.operation.verify()  # the taso dialect is still loaded: its IRDL module was kept
    ops = [op.operation.name for op in m.body.operations[0].regions[0].blocks[0].operations]
    assert ops == ["taso.weight", "taso.ewadd", "func.return"]
    w = m.body.operations[0].regions[0].blocks[0].operations[0]
    assert np.array(w.attributes["value"]).tolist() == [1.0, 2.0, 3.0, 4.0]
    with m.context, ir.Location.unknown():
        again = ir.Module.parse(str(m))  # new ops of the dialect verify in it
    again.operation.verify()
