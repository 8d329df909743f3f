"""dce_from: dead-code elimination from given ops (what a pass knows it may have left dead), against
function_dce, and safe when one op is reached as several Python objects (the bindings make a new object
per access: the second object of an erased op must not be touched)."""

from __future__ import annotations

import os
import subprocess
import sys

from taso_mlir.dialect.mlir import ir

from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.ops import dce_from, function_dce

TEXT = """func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %w = "taso.weight"() {name = "w", value = dense<2.0> : tensor<2xf32>} : () -> tensor<2xf32>
  %a = "taso.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  %b = "taso.ewmul"(%a, %w) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  %c = "taso.ewadd"(%b, %a) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  %d = "taso.tanh"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  %keep = "taso.sigmoid"(%x) : (tensor<2xf32>) -> tensor<2xf32>
  return %keep : tensor<2xf32>
}"""


def _ops(m):
    return [o.operation for o in m.body.operations[0].regions[0].blocks[0].operations]


def test_erases_what_the_given_ops_leave_dead():
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(TEXT)
        w, a, b, c, d, keep, ret = _ops(m)
        # c is dead; so then are b, a and w (a has two users, both dead). d is dead too but not reached
        # from c: dce_from leaves it (function_dce would not)
        c_again = _ops(m)[3]  # the same op as another object
        b_via_use = c.operands[0].owner  # and b as an object reached through an operand
        assert dce_from([c, c_again, getattr(b_via_use, "operation", b_via_use), keep]) == 4
        assert [o.name for o in _ops(m)] == ["taso.tanh", "taso.sigmoid", "func.return"]
        assert m.operation.verify()
        assert function_dce(m.body.operations[0].operation) == 1  # d


def test_one_op_reached_twice_is_not_touched_after_it_is_erased():
    # The same under glibc's freed-memory poisoning, where touching an erased op's second object crashes
    # or reads garbage: a child process, so that a crash fails the test instead of the run.
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from test_dce import test_erases_what_the_given_ops_leave_dead as t\n"
        "for _ in range(20):\n"
        "    t()\n" % os.path.dirname(__file__))
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.tcache_count=0", MALLOC_PERTURB_="165")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
