"""taso-search's incremental bookkeeping agrees with computing from scratch: at every popped graph of
real searches, the sites inherited from the parent plus the ones found around the rewrite equal
matching the whole window, the uses patched from the parent's equal uses built from the nodes, the
ranks patched from the parent's are a topological order, and the cost of a child computed before it
is built (from what an ancestor memoized, too) equals the built child's cost exactly, also where a
split tree's nested splits change cost with their producer."""

from __future__ import annotations

import pytest

from taso_mlir.benchmarks import suite
from taso_mlir.dialect.mlir import ir, make_context
from taso_mlir.dialect.onnx_import import import_onnx
from taso_mlir.passes import search as S
from taso_mlir.passes import taso_search
from taso_mlir.passes import tgraph as T
from taso_mlir.passes.cost import get_cost_model


def _graph(name: str, builder: T.Builder) -> T.TGraph:
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = import_onnx(suite.build(name, quick=True), ctx)
        f = next(o.operation for o in module.body.operations if o.operation.name == "func.func")
        g, _ = T.from_function(f, builder)
    return g


@pytest.mark.parametrize("name", ["nasrnn", "squeezenet", "inception3"])
def test_incremental_sites_uses_and_costs_match_a_fresh_computation(name, monkeypatch):
    builder = T.Builder(get_cost_model("analytic"))
    g0 = _graph(name, builder)
    rws = taso_search.rewrites()
    child_sites = T.child_sites
    counts = {"graphs": 0, "sites": 0, "costs": 0, "patched ranks": 0, "nested splits": 0, "shared ops": 0}

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
        for ri, ops, _k, b, cached in got:
            if T.check_global(rewrites[ri], g, ops, b) is None:
                costs = T.target_costs(rewrites[ri], g, ops, b, builder)
                if cached != 0:  # what the search computed in an ancestor graph and inherited
                    assert T.info_costs(rewrites[ri], g, ops, b, cached) == costs
                if costs is not None:
                    assert T.rewrite_cost(g, ops, costs) == T.rewrite(rewrites[ri], g, ops, b, builder).cost
                    counts["costs"] += 1
        counts["graphs"] += 1
        counts["sites"] += len(got)
        return got

    monkeypatch.setattr(T, "child_sites", checked)
    best, stats = S.search(g0, rws, builder, S.Options(budget=30, window=40))
    # what each model has at this budget: NasRNN all of it, Inception no shared op, SqueezeNet neither
    if name != "nasrnn":
        del counts["shared ops"]
    if name == "squeezenet":
        del counts["nested splits"]
    assert all(counts.values()), counts
    assert stats.popped > counts["graphs"]  # window roots are matched in full
    assert best.cost <= g0.cost
