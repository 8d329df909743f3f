"""Chains of reshapes and transposes made one transpose (``passes.layout_chains``): the plan is checked on
every small chain (and the check fails on a wrong plan), plans of the chains that matter, the pass on IR
against the reference semantics, what it leaves alone."""

from __future__ import annotations

import numpy as np

from taso_mlir.passes import layout_chains as LC
from taso_mlir.passes.cost import get_cost_model
from unit_helpers import run_pass


def test_proof():
    ok, cases = LC.prove()
    assert ok, cases
    assert cases > 50000


def test_the_proof_fails_on_a_wrong_plan(monkeypatch):
    right = LC.chain_plan

    def wrong(shape, steps):
        plan = right(shape, steps)
        if plan is None or len(plan[1]) < 2:
            return plan
        fine, perm, final = plan
        return fine, perm[::-1], final
    monkeypatch.setattr(LC, "chain_plan", wrong)
    ok, case = LC.prove(max_rank=2, max_dim=3)
    assert not ok and case


def test_plans():
    # nn.MultiheadAttention after the layout lifting: Q/K/V first, then heads first
    assert LC.chain_plan([1, 128, 2, 3, 512], [("transpose", [3, 1, 2, 0, 4]), ("reshape", [384, 16, 64]),
                                               ("transpose", [1, 0, 2])]) == \
        ([128, 2, 3, 8, 64], [1, 3, 2, 0, 4], [16, 384, 64])
    # transposes that cancel through a reshape that keeps the moved axes whole: one reshape
    assert LC.chain_plan([4, 6], [("transpose", [1, 0]), ("reshape", [2, 3, 4]), ("transpose", [2, 0, 1])]) == \
        ([24], [0], [4, 2, 3])
    # a reshape after the last transpose needs no fine axes
    assert LC.chain_plan([2, 3], [("transpose", [1, 0]), ("reshape", [2, 3])]) == ([2, 3], [1, 0], [2, 3])
    # a reshape between two transposes that cuts an axis of 3 into 2 x ...: no plan
    assert LC.chain_plan([2, 3], [("transpose", [1, 0]), ("reshape", [2, 3]), ("transpose", [1, 0])]) is None


CHAIN = """func.func @f(%x: tensor<8x24xf32>) -> (tensor<2x24x4xf32>, tensor<24x8xf32>) {
  %r = "taso.reshape"(%x) {shape = array<i64: 8, 3, 8>} : (tensor<8x24xf32>) -> tensor<8x3x8xf32>
  %t = "taso.transpose"(%r) {perm = array<i64: 1, 0, 2>} : (tensor<8x3x8xf32>) -> tensor<3x8x8xf32>
  %r2 = "taso.reshape"(%t) {shape = array<i64: 24, 2, 4>} : (tensor<3x8x8xf32>) -> tensor<24x2x4xf32>
  %t2 = "taso.transpose"(%r2) {perm = array<i64: 1, 0, 2>} : (tensor<24x2x4xf32>) -> tensor<2x24x4xf32>
  %u = "taso.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<8x24xf32>) -> tensor<24x8xf32>
  %v = "taso.relu"(%u) : (tensor<24x8xf32>) -> tensor<24x8xf32>
  return %t2, %v : tensor<2x24x4xf32>, tensor<24x8xf32>
}"""


def test_the_pass_on_ir():
    names, n, before, after = run_pass(CHAIN, lambda f: LC.compose_layout_chains(f, get_cost_model("analytic")))
    assert n == 1  # the chain of four; the lone transpose before the relu is left
    assert names == ["taso.reshape", "taso.transpose", "taso.reshape", "taso.transpose", "taso.relu", "func.return"]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_a_shared_intermediate_ends_the_chain():
    """The first transpose's result is also returned: the chain is only what follows it (one transpose),
    so nothing is composed."""
    text = CHAIN.replace("-> (tensor<2x24x4xf32>, tensor<24x8xf32>)", "-> (tensor<2x24x4xf32>, tensor<3x8x8xf32>)")
    text = text.replace("return %t2, %v : tensor<2x24x4xf32>, tensor<24x8xf32>",
                        "return %t2, %t : tensor<2x24x4xf32>, tensor<3x8x8xf32>")
    names, n, before, after = run_pass(text, lambda f: LC.compose_layout_chains(f, get_cost_model("analytic")))
    assert n == 0 and names.count("taso.transpose") == 2
