"""Derivability pruning: drop a candidate rule that smaller proved rules already give.

A candidate ``a <=> b`` is *derivable* when one rewrite of a proved rule (in a usable direction) at some
site of ``a`` and one at some site of ``b`` reach the same graph (or one side reaches the other): then
the search, which applies rules one at a time, gets from ``a`` to ``b`` without it, and a proof of the
candidate adds nothing. This is the redundancy Ruler removes with equality saturation, here bounded at
one step from each side, and it is decided with the search's own matcher and site check
(``passes.tgraph`` and ``passes.rulebook``), so "derivable" means what the search can do.

Graphs are compared by a canonical hash: an op is its kind, attributes and operand hashes (sorted for
ewadd and ewmul, which rules match modulo commutativity); an input variable is its name; a graph is the
tuple of its outputs' hashes, in order (output i of ``a`` is output i of ``b``).
"""

from __future__ import annotations

from ..dialect import specs
from . import graph as G

COMMUTATIVE = frozenset({"ewadd", "ewmul"})


class Deriver:
    def __init__(self, rules_paths=None):
        from taso_mlir.passes import rulebook as RB
        from taso_mlir.passes import search as S
        from taso_mlir.passes import tgraph as T
        from taso_mlir.passes.cost import get_cost_model

        self.T = T
        self.rewrites = S.usable_rewrites(RB.load(rules_paths))
        self.builder = T.Builder(get_cost_model("analytic"))
        self.failed = 0  # candidates whose check raised (kept: a rule is only dropped when shown redundant)

    # ---- a rule graph as the search's graph ----
    def tgraph(self, g: G.Graph, shapes: dict):
        T = self.T
        all_shapes = G.infer(g, shapes)
        nodes: dict = {}
        val: dict = {}
        nid = 0
        for v in g.inputs():
            nodes[nid] = self.builder.node(nodes, "arg", (), (), (tuple(shapes[v]),), "f32", name=T._h(("var", v)),
                                           weight=False)
            val[v] = (nid, 0)
            nid += 1
        for k, op in enumerate(g.ops):
            a, _hint = G.spec_attrs(op, all_shapes)
            attrs = T._attrs_tuple(specs.spec(op.name).complete_attrs(a))
            outs = tuple(all_shapes[G.op_ref(k, j, op.num_results)] for j in range(op.num_results))
            nodes[nid] = self.builder.node(nodes, op.name, attrs, tuple(val[r] for r in op.operands), outs, "f32",
                                           name=T._h(("o", nid)))
            for j in range(op.num_results):
                val[G.op_ref(k, j, op.num_results)] = (nid, j)
            nid += 1
        return T.TGraph(nodes, tuple(val[r] for r in g.outputs), nid, 0, 0.0, len(g.ops))

    @staticmethod
    def canon(tg) -> tuple:
        memo: dict = {}

        def h(nid):
            got = memo.get(nid)
            if got is None:
                n = tg.nodes[nid]
                if n.kind == "arg":
                    got = ("arg", n.name)
                else:
                    ops = [(h(v[0]), v[1]) for v in n.operands]
                    if n.kind in COMMUTATIVE:
                        ops.sort(key=repr)
                    got = hash((n.kind, n.attrs, tuple(ops)))
                memo[nid] = got
            return got
        return tuple((h(v[0]), v[1]) for v in tg.outputs)

    def neighbours(self, tg) -> set:
        """The canonical forms of ``tg`` and of every graph one rewrite away."""
        T = self.T
        out = {self.canon(tg)}
        index = T.Index(tg, lambda nid: True)
        for ri, ops, _bkey, b, _costs in T.all_sites(self.rewrites, tg, index):  # (local check passed)
            rw = self.rewrites[ri]
            if T.check_global(rw, tg, ops, b) is not None:
                continue
            out.add(self.canon(T.apply(rw, tg, ops, b, self.builder)))
        return out

    def derivable(self, a: G.Graph, b: G.Graph, shapes: dict) -> bool:
        try:
            ta, tb = self.tgraph(a, shapes), self.tgraph(b, shapes)
            return not self.neighbours(ta).isdisjoint(self.neighbours(tb))
        except ValueError:  # (SpecError is one): a candidate that cannot be checked is kept
            self.failed += 1
            return False
