"""taso-search's incremental bookkeeping agrees with computing from scratch: at every popped graph of
real searches (and at every child built to look past a merge), the sites inherited from the parent plus the ones found around the rewrite equal
matching the whole window, the uses patched from the parent's equal uses built from the nodes, the
ranks patched from the parent's are a topological order, and the cost of a child computed before it
is built (from what an ancestor memoized, too) equals the built child's cost exactly, also where a
split tree's nested splits change cost with their producer or with their piece's other uses (a
split using a merged or unmerged op's result is costed without building the child), and every
node's cost is the one it has in a graph built from scratch."""

from __future__ import annotations

import pytest

from taso_mlir.benchmarks import suite
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_import import import_onnx
from taso_mlir.passes.search import backtracking as S
from taso_mlir.passes.search import taso_search
from taso_mlir.passes.search import tgraph as T
from taso_mlir.passes.cost.oracle import get_cost_model


# four matmuls of one input, the first one's result also returned and split: merging them makes that
# split a split of a piece with another use (its own cost), and merging more can make its piece's
# other use go away
_W = '"taso.weight"() {{name = "w{i}", value = dense<0.5> : tensor<64x64xf32>}} : () -> tensor<64x64xf32>'
_MM = '"taso.matmul"(%x, %w{i}) {{activation = "none"}} : (tensor<256x64xf32>, tensor<64x64xf32>) -> tensor<256x64xf32>'
SPLIT_USES = ("func.func @f(%x: tensor<256x64xf32>) -> (tensor<256x64xf32>, tensor<256x32xf32>, tensor<256x32xf32>, "
              "tensor<256x64xf32>, tensor<256x64xf32>, tensor<256x64xf32>) {\n"
              + "".join(f"  %w{i} = {_W.format(i=i)}\n  %m{i} = {_MM.format(i=i)}\n" for i in range(4))
              + '  %s:2 = "taso.split"(%m0) {axis = 1 : i64, resultSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0, 0, 0, 0, '
              "0, 0, 0, 0, 0, 0, 0>, sizes = array<i64: 32, 32>} : (tensor<256x64xf32>) -> (tensor<256x32xf32>, "
              "tensor<256x32xf32>)\n"
              "  return %m0, %s#0, %s#1, %m1, %m2, %m3 : tensor<256x64xf32>, tensor<256x32xf32>, tensor<256x32xf32>, "
              "tensor<256x64xf32>, tensor<256x64xf32>, tensor<256x64xf32>\n}\n")


def _graph(name: str, builder: T.Builder) -> T.TGraph:
    ctx = make_context()
    with ctx, ir.Location.unknown():
        if name == "split uses":
            module = ir.Module.parse(SPLIT_USES)
        else:
            module = import_onnx(suite.build(name, quick=True), ctx)
        f = next(o.operation for o in module.body.operations if o.operation.name == "func.func")
        g, _ = T.from_function(f, builder)
    return g


@pytest.mark.parametrize("name", ["nasrnn", "squeezenet", "inception3", "split uses"])
def test_incremental_sites_uses_and_costs_match_a_fresh_computation(name, monkeypatch):
    builder = T.Builder(get_cost_model("analytic"))
    g0 = _graph(name, builder)
    rws = taso_search.rewrites()
    child_sites = T.child_sites
    counts = {"graphs": 0, "sites": 0, "costs": 0, "patched ranks": 0, "nested splits": 0, "shared ops": 0,
              "nested splits costed": 0, "split users costed": 0}

    def checked(rewrites, table, radius, g, parent_sites, index, rejected=None):
        got = child_sites(rewrites, table, radius, g, parent_sites, index, rejected)
        fresh = T.TGraph(g.nodes, g.outputs, g.next_id, g.key, g.cost, g.num_ops)  # no parent: built from scratch
        want = T.all_sites(rewrites, fresh, T.Index(fresh, index.eligible))
        assert [s[:4] for s in got] == [s[:4] for s in want]
        assert g.uses() == fresh.uses()
        # ranks patched from the parent's (where it has them) are a topological order
        rank = g.ranks()
        assert rank.keys() == g.nodes.keys()
        assert all(rank[v[0]] < rank[nid] for nid, n in g.nodes.items() for v in n.operands)
        counts["patched ranks"] += g.parent is not None and g.parent._ranks is not None
        counts["shared ops"] += bool(g.history and g.history[-1][3])
        counts["nested splits"] += any(T.split_axis(g.nodes[n.operands[0][0]]) is not None
                                       for n in g.nodes.values() if n.kind == "split")
        # node costs as from scratch: a nested split costs 0 only where its piece has no other use
        uses = fresh.uses()
        assert T._split_tree_costs(builder, g.nodes, lambda v: [u for u in uses[v] if u is not None], g.outputs,
                                   uses) == {}
        assert g.cost == pytest.approx(sum(n.cost for n in g.nodes.values()), rel=1e-12)
        counts["nested splits costed"] += any(n.cost > 0 and T.split_axis(g.nodes[n.operands[0][0]]) == T.split_axis(n)
                                              for n in g.nodes.values() if n.kind == "split")
        for ri, ops, _k, b, cached in got:
            if T.check_global(rewrites[ri], g, ops, b) is None:
                costs = T.target_costs(rewrites[ri], g, ops, b, builder)
                if cached != 0:  # what the search computed in an ancestor graph and inherited
                    assert T.info_costs(rewrites[ri], g, ops, b, cached, builder) == costs
                if costs is not None:
                    assert T.rewrite_cost(g, ops, costs) == T.rewrite(rewrites[ri], g, ops, b, builder).cost
                    counts["costs"] += 1
                    counts["split users costed"] += bool(costs[1])
        counts["graphs"] += 1
        counts["sites"] += len(got)
        return got

    monkeypatch.setattr(T, "child_sites", checked)
    best, stats = S.search(g0, rws, builder, S.Options(budget=30, window=40))
    # what each model has at this budget: NasRNN all of it, Inception no shared op, SqueezeNet neither,
    # and only the small function a nested split whose piece has another use
    if name != "nasrnn":
        del counts["shared ops"]
    if name == "squeezenet":
        del counts["nested splits"], counts["split users costed"]
    if name != "split uses":
        del counts["nested splits costed"]
    assert all(counts.values()), counts
    # window roots are matched in full (the other graphs matched: the popped ones and those built to
    # look past a merge that does not pay)
    assert stats.popped + stats.lookahead_built > counts["graphs"]
    assert best.cost <= g0.cost
