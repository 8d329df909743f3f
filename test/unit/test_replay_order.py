"""The replay's local reordering (pdl._order_locally): a site's ops move up, in rule order, to just after
the last op defining one of their other operands, weights included, so that PDL can insert the target
before the root; where that would move a site op down it refuses and leaves the block as it was. The
block stays valid either way."""

from __future__ import annotations

import pytest

from taso_mlir.dialect.mlir import ir

from taso_mlir.dialect.context import make_context
from taso_mlir.passes.search import pdl as P

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


# ---------------------------------------------------------------------------------------------
# the replay and ops the searched graph keeps although nothing uses them (issue 19)

X4 = "tensor<1x8x7x7xf32>"
W4 = "tensor<8x8x3x3xf32>"
CONV = ('"taso.conv2d"(%x, %{w}) {{activation = "{act}", dilations = array<i64: 1, 1>, group = 1 : i64, '
        'pads = array<i64: 1, 1, 1, 1>, strides = array<i64: 1, 1>, operandSegmentSizes = array<i32: 1, 1, 0>}} : '
        f'({X4}, {W4}) -> {X4}')


def _relu_node(mops: list, weight: str) -> int:
    """The node id of the relu of the convolution by the weight named ``weight``."""
    for nid, op in enumerate(mops):
        if op is not None and op.name == "taso.relu":
            conv = op.operands[0].owner
            w = conv.operands[1].owner
            if str(ir.StringAttr(w.attributes["name"]).value) == weight:
                return nid
    raise AssertionError(weight)


def _fusions(text: str, sites: list) -> None:
    """Parse ``text`` (a function of ``%x``), apply the fusion of relu into a convolution (R0009b) to the
    searched graph at the sites whose convolution's weight has the given names, in that order, replay
    that graph on the function and check the function then has the graph's structure and the input's
    values."""
    import numpy as np

    from taso_mlir.passes.search import taso_search
    from taso_mlir.passes.search import backtracking_search
    from taso_mlir.passes.search import tgraph as T
    from taso_mlir.passes.cost.oracle import get_cost_model
    from unit_helpers import run_function

    rws = taso_search.rewrites()
    by_id = {rw.id: rw for rw in rws}
    ri = next(i for i, rw in enumerate(rws) if rw.id == "R0009b")
    builder = T.Builder(get_cost_model("analytic"))
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        feeds = [np.random.default_rng(0).standard_normal((1, 8, 7, 7))]
        want = run_function(f, feeds)
        g, mops = T.from_function(f, builder)
        for weight in sites:
            nid = _relu_node(mops, weight)
            found = [s for s in T.all_sites(rws, g, T.Index(g, lambda n: True))
                     if s[0] == ri and nid in s[1] and T.check_global(rws[ri], g, s[1], s[3]) is None]
            g = T.apply(rws[ri], g, found[0][1], found[0][3], builder)
        backtracking_search.replay(f, g, mops, P.Replayer(rws), by_id)
        assert m.operation.verify()
        assert T.structure(T.from_function(f, builder)[0]) == T.structure(g)
        for a, b in zip(run_function(f, feeds), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert [o.operation.name for o in f.regions[0].blocks[0].operations].count("taso.relu") == 0


def _weights(*names):
    return "\n  ".join(f'%{n} = "taso.weight"() {{name = "{n}", value = dense<{0.1 * (i + 1)}> : {W4}}} : () -> {W4}'
                       for i, n in enumerate(names))


# a live conv + relu and a dead one (nothing uses %r2): the graph keeps the dead one, and the search may
# rewrite it after an earlier step
DEAD_SITE = f"""func.func @f(%x: {X4}) -> {X4} {{
  {_weights("w", "w2")}
  %c = {CONV.format(w="w", act="none")}
  %r = "taso.relu"(%c) : ({X4}) -> {X4}
  %c2 = {CONV.format(w="w2", act="none")}
  %r2 = "taso.relu"(%c2) : ({X4}) -> {X4}
  return %r : {X4}
}}"""

# a dead relu-fused conv %d equal to what fusing %r makes: the search shares it as that rewrite's target
DEAD_TWIN = f"""func.func @f(%x: {X4}) -> ({X4}, {X4}) {{
  {_weights("w", "w2")}
  %d = {CONV.format(w="w", act="relu")}
  %c2 = {CONV.format(w="w2", act="none")}
  %r2 = "taso.relu"(%c2) : ({X4}) -> {X4}
  %c = {CONV.format(w="w", act="none")}
  %r = "taso.relu"(%c) : ({X4}) -> {X4}
  return %r, %r2 : {X4}, {X4}
}}"""

CASES = {"dead site second": (DEAD_SITE, ["w", "w2"]), "dead site first": (DEAD_SITE, ["w2", "w"]),
         "dead twin": (DEAD_TWIN, ["w2", "w"])}


def test_the_shared_twin_is_the_dead_op():
    """The case DEAD_TWIN builds is what it says: the graph's second rewrite shares the dead conv."""
    from taso_mlir.passes.search import taso_search
    from taso_mlir.passes.search import backtracking_search
    from taso_mlir.passes.search import tgraph as T
    from taso_mlir.passes.cost.oracle import get_cost_model

    rws = taso_search.rewrites()
    ri = next(i for i, rw in enumerate(rws) if rw.id == "R0009b")
    builder = T.Builder(get_cost_model("analytic"))
    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(DEAD_TWIN)
        f = m.body.operations[0].operation
        g, mops = T.from_function(f, builder)
        dead = next(nid for nid, op in enumerate(mops) if op is not None and op.name == "taso.conv2d"
                    and "relu" in str(op.attributes["activation"]))
        for weight in ("w2", "w"):
            nid = _relu_node(mops, weight)
            s = next(s for s in T.all_sites(rws, g, T.Index(g, lambda n: True)) if s[0] == ri and nid in s[1])
            g = T.apply(rws[ri], g, s[1], s[3], builder)
        _rid, _matched, made, shared, _variant = g.history[-1]
        assert shared == (0,) and made == (dead,)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("debug", ["0", "1"])
def test_the_replay_keeps_the_dead_ops_the_graph_keeps(case, debug):
    """Regression (issue 19): the replay removed every dead op after its first step (and what each later
    step left dead), but the searched graph keeps them; a later step that rewrote one, or shared one as
    its target, read a freed op (a segfault, or a wrong model). Run in a child process with glibc filling
    freed memory, with the IR debug mode off and on, so that a crash fails the test instead of the run."""
    import os
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r)\n"
            "from test_replay_order import _fusions, CASES\n"
            "_fusions(*CASES[%r])\n" % (os.path.dirname(__file__), case))
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.tcache_count=0", MALLOC_PERTURB_="165", TASO_DEBUG_IR=debug)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def test_dead_ops_in_the_input_are_removed_before_the_search(tmp_path):
    """End to end: taso-opt on a function with a dead conv + relu beside a live one (it segfaulted)."""
    import os
    import subprocess
    import sys

    src = tmp_path / "dead.mlir"
    src.write_text(DEAD_SITE)
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.tcache_count=0", MALLOC_PERTURB_="165")
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(src), "--pass-pipeline",
                        "builtin.module(taso-search{report=-})"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 relus fused" in r.stderr and "ops 6 -> 2" in r.stderr and "0 rewrites applied" in r.stderr
    assert r.stdout.count("taso.conv2d") == 1 and 'activation = "relu"' in r.stdout and "taso.relu" not in r.stdout
