"""The search's in-memory graph: a persistent (copy-on-write) dataflow graph of one function.

Nodes are the function's arguments, its ops (``taso`` ops by kind; anything else is an opaque node
the rules never match) and the values the function returns. A rewrite makes a new graph that shares
every untouched node with its parent, so a search can hold thousands of graphs.

Each node has a *name* for deduplication: an original op is named by its position in the function,
an op a rewrite created is named by its structure (kind, attributes, operand names). The graph key
is a sum over nodes of (name, operand names), so two rewrite orders that reach the same graph give
the same key, and the key is updated in O(size of the rewrite).
"""

from __future__ import annotations

import operator
from collections import ChainMap
from dataclasses import dataclass, replace
from typing import Optional

from taso_mlir.dialect import specs
from taso_mlir.dialect.errors import TasoError
from taso_mlir.generator import graph as G

from taso_mlir.passes.search import pdl as P
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.cost.oracle import OpSig

MASK = (1 << 64) - 1
Value = tuple  # (node id, result index)


@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # taso op kind, "arg", or "other:<op name>" (opaque)
    attrs: tuple  # sorted complete attributes (taso ops), () otherwise
    operands: tuple  # of Value
    shapes: tuple  # result shapes (None where not static)
    dtype: str
    weight: bool  # computes only from weights and constants (folded before export)
    name: int  # see module docstring
    contrib: int  # this node's term in the graph key
    cost: float

    @property
    def is_taso(self) -> bool:
        return not (self.kind == "arg" or self.kind.startswith("other:"))


def _h(x) -> int:
    return hash(x) & MASK


class TGraph:
    __slots__ = ("nodes", "outputs", "next_id", "key", "cost", "num_ops", "_uses", "_ranks", "history", "parent",
                 "changes")

    def __init__(self, nodes: dict, outputs: tuple, next_id: int, key: int, cost: float, num_ops: int):
        self.nodes = nodes
        self.outputs = outputs
        self.next_id = next_id
        self.key = key
        self.cost = cost
        self.num_ops = num_ops
        self._uses = None
        self._ranks = None
        # ((rewrite id, matched node ids, node id of each target op, the target ops that are old ops
        # (``_targets``' sharing), the operand order of the match (``pdl.variant_of``)), ...) from
        # the original
        self.history: tuple = ()
        self.parent = None  # the graph one rewrite before (None for a graph built from scratch)
        self.changes: dict = {}  # what that rewrite changed: node id -> new node, or None where removed

    # ---- derived indexes (built once per graph, on demand) ----
    def uses(self) -> dict:
        """value -> list of (user node id or None for a function result): the users in ascending id
        order, once per use, then None once per function result."""
        if self._uses is None:
            p = self.parent
            if p is not None and p._uses is not None:
                self._uses = _patched_uses(p, self)
                return self._uses
            u: dict = {}
            for nid, n in self.nodes.items():
                for v in n.operands:
                    u.setdefault(v, []).append(nid)
            for v in self.outputs:
                u.setdefault(v, []).append(None)
            self._uses = u
        return self._uses

    def ranks(self) -> dict:
        """node id -> a number increasing along every edge (a topological order; built once per
        graph, on demand, from the parent's where the rewrite's new ops fit between their operands
        and their users)."""
        if self._ranks is None:
            p = self.parent
            if p is not None and p._ranks is not None:
                self._ranks = _patched_ranks(p, self)
                if self._ranks is not None:
                    return self._ranks
            nodes, rank = self.nodes, {}
            for root in nodes:
                if root in rank:
                    continue
                stack = [(root, False)]
                while stack:
                    nid, expanded = stack.pop()
                    if nid in rank:
                        continue
                    if expanded:
                        rank[nid] = len(rank)
                        continue
                    stack.append((nid, True))
                    stack.extend((v[0], False) for v in nodes[nid].operands if v[0] not in rank)
            self._ranks = rank
        return self._ranks

    def value_name(self, v: Value) -> tuple:
        return (self.nodes[v[0]].name, v[1])


def _patched_uses(p: TGraph, g: TGraph) -> dict:
    """g's uses from its parent's (a copy with the values the rewrite touched rebuilt): the same
    lists, in the same order, as building them from scratch (node ids are in ascending order in
    the node dicts, so users are listed by ascending id)."""
    changes, pn, pu = g.changes, p.nodes, p._uses
    u = dict(pu)
    touched: set = set()
    added: dict = {}  # value -> ids of changed nodes that use it (once per use)
    for nid, n in changes.items():
        old = pn.get(nid)
        if old is not None:
            touched.update(old.operands)
            if n is None:
                for j in range(len(old.shapes)):
                    u.pop((nid, j), None)
        if n is not None:
            for v in n.operands:
                touched.add(v)
                added.setdefault(v, []).append(nid)
    if g.outputs != p.outputs:
        touched.update(p.outputs)
        touched.update(g.outputs)
    for v in touched:
        if v[0] in changes and changes[v[0]] is None:
            continue  # a value the rewrite removed (unused now)
        ids = [x for x in pu.get(v, ()) if x is not None and x not in changes] + added.get(v, [])
        ids.sort()
        ids.extend([None] * g.outputs.count(v))
        if ids:
            u[v] = ids
        else:
            u.pop(v, None)
    return u


def _patched_ranks(p: TGraph, g: TGraph) -> Optional[dict]:
    """g's ranks from its parent's: removed ops dropped, every other old node keeps its rank, and the
    new ops (made in an order where operands come first) get evenly spaced ranks above their old
    operands' and below the rewired users'. None where that interval is empty (a multi-output
    rewrite can need old ops reordered) or too narrow for floats: then they are recomputed."""
    r = dict(p._ranks)
    new = []
    lowest_user = float("inf")
    for nid, n in g.changes.items():
        if n is None:
            del r[nid]
        elif nid in r:
            lowest_user = min(lowest_user, r[nid])
            # a rewired user of an old op the rewrite shared (``_targets``) may rank below it
            if any(v[0] in p._ranks and v[0] not in g.changes and p._ranks[v[0]] >= r[nid] for v in n.operands):
                return None
        else:
            new.append(nid)
    if not new:
        return r
    above = max((r[v[0]] for nid in new for v in g.changes[nid].operands if v[0] in r), default=-1.0)
    if above >= lowest_user:
        return None
    step = 1.0 if lowest_user == float("inf") else (lowest_user - above) / (len(new) + 1)
    last = above
    for i, nid in enumerate(new, start=1):
        x = above + step * i
        if not last < x < lowest_user:
            return None
        r[nid] = last = x
    return r


def _contrib(name: int, operand_names: tuple) -> int:
    return _h(("n", name, operand_names))


def _out_key(names: tuple) -> int:
    return _h(("out", names))


class Builder:
    """Makes nodes with their names, weight flags and costs. ``split_trees``: a split of a split's
    piece on the same axis costs 0 (the search's model, see ``node``); False: every split costs its
    own (the function as written, where ``fuse_split_trees`` has already fused what it can)."""

    def __init__(self, cost_model, split_trees: bool = True):
        self.cost_model = cost_model
        self.split_trees = split_trees
        self._costs: dict = {}  # (kind, attrs, operand shapes, shapes, dtype, weight) -> cost
        self.target_costs: dict = {}  # see target_costs

    def node(self, g_nodes, kind: str, attrs: tuple, operands: tuple, shapes: tuple, dtype: str,
             name: Optional[int] = None, weight: Optional[bool] = None) -> Node:
        """``g_nodes``: node id -> Node for the operands (a dict, or a mapping over a parent's nodes)."""
        ins = [g_nodes[v[0]] for v in operands]
        onames = tuple((n.name, v[1]) for n, v in zip(ins, operands))
        if name is None:
            name = _h(("new", kind, attrs, onames))
        if weight is None:
            weight = kind in specs.CONSTANTS or kind == "weight" or (
                kind != "arg" and not kind.startswith("other:") and bool(operands)
                and all(n.weight for n in ins))
        cost = 0.0
        if self.split_trees and kind == "split" and ins and split_axis(ins[0]) is not None and split_axis(ins[0]) == dict(attrs).get("axis"):
            # a split of a piece of a split on the same axis: the export makes the tree one split
            # (``fuse_split_trees``), whose cost is the root's (the same bytes, one launch), where
            # nothing else uses the piece; where something does, the graph gives it its own cost
            # (``_split_tree_costs``)
            pass
        elif kind != "arg":
            cost = self.cost(kind, attrs, ins, operands, shapes, dtype, weight)
        return Node(kind, attrs, operands, shapes, dtype, weight, name, _contrib(name, onames), cost)

    def cost(self, kind: str, attrs: tuple, ins: list, operands: tuple, shapes: tuple, dtype: str,
             weight: bool) -> float:
        """The op's own cost (``ins``: its operands' nodes)."""
        in_shapes = tuple(n.shapes[v[1]] or () for n, v in zip(ins, operands))
        weights = tuple(n.weight for n in ins)
        ck = (kind, attrs, in_shapes, shapes, dtype, weight, weights)
        try:
            cost = self._costs.get(ck)
        except TypeError:  # an unhashable attribute value: not memoized here
            ck, cost = None, None
        if cost is None:
            sig = OpSig(kind.removeprefix("other:"), attrs, in_shapes, tuple(s or () for s in shapes), dtype, weight,
                        weights)
            cost = self.cost_model.cost(sig)
            if ck is not None:
                self._costs[ck] = cost
        return cost


def _split_tree_costs(builder: Builder, nodes, users, outputs: tuple, values) -> dict:
    """The splits of a split's piece on the same axis among the users of ``values`` whose cost in the
    graph (``nodes``, ``users(value)``: its user ids, once per use, ``outputs``) differs from their
    node's: node id -> the node with that cost. Such a split costs 0 (``Builder.node``) only where
    the piece has no other use, as ``fuse_split_trees`` makes it part of its parent only there; else
    its own cost."""
    out: dict = {}
    if not builder.split_trees:
        return out
    for v in sorted(values):
        p = nodes.get(v[0])
        if p is None or p.kind != "split":
            continue
        us = users(v)
        for s in sorted(set(us)):
            n = nodes[s]
            if split_axis(n) != split_axis(p):
                continue
            if len(us) == 1 and v not in outputs:
                want = 0.0
            else:
                want = builder.cost(n.kind, n.attrs, [p], n.operands, n.shapes, n.dtype, n.weight)
            if want != n.cost:
                out[s] = replace(n, cost=want)
    return out


def split_axis(n: Node) -> Optional[int]:
    """The axis of a split node, None for any other node."""
    return dict(n.attrs).get("axis") if n.kind == "split" else None


def attrs_tuple(d: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in d.items()))


# ---------------------------------------------------------------------------------------------
# the view the site check reads


class GraphView(RB.View):
    def __init__(self, g: TGraph):
        self.g = g

    def kind(self, op):
        k = self.g.nodes[op].kind
        return k if self.g.nodes[op].is_taso else None

    def operands(self, op):
        return self.g.nodes[op].operands

    def num_results(self, op):
        return len(self.g.nodes[op].shapes)

    def result(self, op, j):
        return (op, j)

    def producer(self, value):
        return None if self.g.nodes[value[0]].kind == "arg" else value

    def attrs(self, op):
        return dict(self.g.nodes[op].attrs)

    def shape(self, value):
        return self.g.nodes[value[0]].shapes[value[1]]

    def dtype(self, value):
        return self.g.nodes[value[0]].dtype

    def users(self, value):
        return self.g.uses().get(value, ())


# ---------------------------------------------------------------------------------------------
# matching


class Index:
    """Per graph: eligible nodes by kind (the window of the search), built on first use."""

    def __init__(self, g: TGraph, eligible):
        self.g = g
        self._by_kind = None
        self.eligible = eligible

    @property
    def by_kind(self) -> dict:
        if self._by_kind is None:
            self._by_kind = {}
            for nid, n in self.g.nodes.items():
                if n.is_taso and self.eligible(nid):
                    self._by_kind.setdefault(n.kind, []).append(nid)
        return self._by_kind


def _plan(rw: RB.Rewrite, anchor: int) -> tuple:
    """The order in which ``matches`` finds the source ops, computed once per rewrite: each step is
    (op index, how, info) with how "producer" (info: matched op i, operand position p), "user"
    (info: a variable name or an (op, result) pair already bound) or "anchor" (every op of the kind)."""
    plans = rw.__dict__.setdefault("_plans", {})
    if anchor in plans:
        return plans[anchor]
    src = rw.src.ops
    refs = [tuple((r, G.parse_ref(r)) for r in op.operands) for op in src]
    done: list = []
    bound_vars: set = set()
    steps = []
    while len(done) < len(src):
        step = None
        for i in done:  # a producer of a matched op's operand
            for pos, (_r, pr) in enumerate(refs[i]):
                if pr is not None and pr[0] not in done:
                    step = (pr[0], "producer", (i, pos))
                    break
            if step:
                break
        if step is None:
            for k in range(len(src) - 1, -1, -1):  # a user of a bound value
                if k in done:
                    continue
                for r, pr in refs[k]:
                    if pr is None and r in bound_vars:
                        step = (k, "user", r)
                    elif pr is not None and pr[0] in done:
                        step = (k, "user", pr)
                    if step:
                        break
                if step:
                    break
        if step is None:
            first = anchor if anchor not in done else max(k for k in range(len(src)) if k not in done)
            step = (first, "anchor", None)
        done.append(step[0])
        bound_vars |= {r for r, pr in refs[step[0]] if pr is None}
        steps.append(step)
    plans[anchor] = (tuple(steps), tuple(refs))
    return plans[anchor]


def matches(rw: RB.Rewrite, g: TGraph, index: Index, anchor: Optional[tuple] = None):
    """Yield (ops, binding) for every structural match of rw's source in g's eligible nodes; with
    ``anchor`` = (source op position k, node ids), only the matches whose op k is one of those
    (eligible) nodes. The site check is separate (``check_local``, ``check_global``)."""
    src = rw.src.ops
    if anchor is None:
        # anchor at the source op whose kind is rarest in the window
        by_kind = index.by_kind
        first = min(range(len(src)), key=lambda k: (len(by_kind.get(src[k].name, ())), -k))
        first_cands = by_kind.get(src[first].name, ())
    else:
        first, first_cands = anchor
    steps, refs = _plan(rw, first)
    n_ops = len(src)
    uses = g.uses()
    nodes = g.nodes
    eligible = index.eligible
    m: dict = {}
    order: dict = {}

    def solve(si: int, b: dict):
        if si == n_ops:
            yield [m[k] for k in range(n_ops)], b
            return
        k, how, info = steps[si]
        rop = src[k]
        if how == "producer":
            i, pos = info
            v = order[i][pos]
            if v[1] != refs[i][pos][1][1]:
                return
            cands = (v[0],)
        elif how == "user":
            v = b[info] if isinstance(info, str) else (m[info[0]], info[1])
            cands = sorted({u for u in uses.get(v, ()) if u is not None})
        elif si == 0:
            cands = first_cands
        else:
            cands = index.by_kind.get(rop.name, ())
        used = m.values()
        for nid in cands:
            n = nodes.get(nid)
            if (n is None or n.kind != rop.name or nid in used or (how != "anchor" and not eligible(nid))
                    or len(n.operands) != len(rop.operands) or len(n.shapes) != rop.num_results):
                continue
            for ops_order in RB.operand_orders(rop.name, n.operands):
                b2 = b
                ok = True
                for (r, pr), v in zip(refs[k], ops_order):
                    if pr is None:
                        have = b2.get(r)
                        if have is None:
                            if b2 is b:
                                b2 = dict(b)
                            b2[r] = v
                        elif have != v:
                            ok = False
                            break
                    elif pr[0] in m:
                        if v != (m[pr[0]], pr[1]):
                            ok = False
                            break
                    elif nodes[v[0]].kind != src[pr[0]].name or v[1] != pr[1]:
                        ok = False
                        break
                if not ok:
                    continue
                # matched ops that use this op's results must use them where the rule says
                if not all(order[i][pos] == (nid, pr[1]) for i in m for pos, (_r, pr) in enumerate(refs[i])
                           if pr is not None and pr[0] == k):
                    continue
                m[k] = nid
                order[k] = ops_order
                yield from solve(si + 1, b2)
                del m[k]
                del order[k]

    try:
        yield from solve(0, {})
    finally:
        solve = None  # (``solve`` reads itself: a cycle that would keep ``g`` and ``index`` to the next collection)


_LOCAL: dict = {}


def check_local(rw: RB.Rewrite, g: TGraph, ops: list, b: dict) -> Optional[str]:
    """The part of the site check that reads only the site's ops and values (memoized by their
    attributes, shapes and types): it holds for a site as long as its ops are unchanged."""
    nodes = g.nodes
    key = (rw.memo_key, tuple((v, nodes[x[0]].shapes[x[1]], nodes[x[0]].dtype) for v, x in b.items()),
           tuple((nodes[o].attrs, nodes[o].shapes) for o in ops))
    why = _LOCAL.get(key, 0)
    if why == 0:
        why = _LOCAL[key] = RB.check_local(rw, GraphView(g), ops, b)
    return why


def check_global(rw: RB.Rewrite, g: TGraph, ops: list, b: dict) -> Optional[str]:
    """The part that reads the rest of the graph: the uses of the matched ops' results, and for a
    multi-output rewrite, that it creates no cycle."""
    why = RB.check_uses(rw, GraphView(g), ops, b)
    if why is None and len(rw.src.outputs) > 1 and _creates_cycle(g, ops, b):
        why = "the rewrite would create a cycle"
    return why


# ---------------------------------------------------------------------------------------------
# sites: the matches of every rewrite, with their local check


def _add_site(out: list, rejected, ri: int, rw: RB.Rewrite, g: TGraph, ops: list, b: dict) -> None:
    """Append the match as a site if it passes ``check_local``, else count the reason in
    ``rejected`` (a Counter, or None). A site is [rewrite index, ops, binding as sorted pairs,
    binding, target costs (for the search to fill in: ``target_costs``)]; sites sort by the first
    three. The binding is put in variable order, so that the check's answer (the first reason
    found) does not depend on the order the matcher bound the variables in. A child graph shares
    the sites it inherits (a site that fails the local check fails it in every graph that would
    inherit it, so it is not kept)."""
    bkey = tuple(sorted(b.items()))
    b = dict(bkey)
    why = check_local(rw, g, ops, b)
    if why is None:
        out.append([ri, tuple(ops), bkey, b, 0])
    elif rejected is not None:
        rejected[why.split(":")[0]] += 1


_site_order = operator.itemgetter(0, 1, 2)


def all_sites(rewrites: list, g: TGraph, index: Index, rejected=None) -> list:
    """Every site of every rewrite in g's window, sorted; the matches that fail the local check are
    counted by reason in ``rejected``."""
    present = set(index.by_kind)
    out: list = []
    for ri, rw in enumerate(rewrites):
        if rw.kinds <= present:
            for ops, b in matches(rw, g, index):
                _add_site(out, rejected, ri, rw, g, ops, b)
    out.sort(key=_site_order)
    return out


class AnchorTable:
    """Where a node can stand in a rewrite's source, for ``child_sites``: ``pairs(g, nid)`` is the
    list of (rewrite index, source op position) whose local requirements node nid meets. Built once
    per search.

    A source op's requirement: its kind and operand count; per operand, the kind and result index
    of its producer where the rule has an op there, else the kinds of the other rule ops that use
    the same variable (they use the same value); per result, the kinds of the rule ops that use it.
    A node's answer depends only on the same facts about the node (its signature), so it is
    memoized by signature."""

    def __init__(self, rewrites: list):
        groups: dict = {}  # kind -> requirement -> [(rewrite index, position)]
        for ri, rw in enumerate(rewrites):
            src = rw.src.ops
            for pos, rop in enumerate(src):
                operands = []
                for r in rop.operands:
                    pr = G.parse_ref(r)
                    if pr is None:
                        operands.append(("var", frozenset(op.name for i, op in enumerate(src)
                                                          if i != pos and r in op.operands)))
                    else:
                        operands.append(("op", (src[pr[0]].name, pr[1])))
                users = tuple(frozenset(op.name for op in src if G.op_ref(pos, j, rop.num_results) in op.operands)
                              for j in range(rop.num_results))
                groups.setdefault(rop.name, {}).setdefault((tuple(operands), users), []).append((ri, pos))
        self.groups = {k: list(v.items()) for k, v in groups.items()}
        self._memo: dict = {}

    def pairs(self, g: TGraph, nid: int) -> list:
        nodes, uses = g.nodes, g.uses()
        n = nodes[nid]
        # the node's signature: per operand its producer's (kind, result) and the kinds of its other
        # users; per result the kinds of its users
        operands = tuple(((nodes[v[0]].kind, v[1]),
                          frozenset(nodes[u].kind for u in uses.get(v, ()) if u is not None and u != nid))
                         for v in n.operands)
        users = tuple(frozenset(nodes[u].kind for u in uses.get((nid, j), ()) if u is not None)
                      for j in range(len(n.shapes)))
        sig = (n.kind, operands, users)
        out = self._memo.get(sig)
        if out is None:
            out = self._memo[sig] = self._pairs(n.kind, operands, users)
        return out

    def _pairs(self, kind: str, operands: tuple, users: tuple) -> list:
        orders = [operands]
        if kind in RB.COMMUTATIVE and len(operands) == 2:
            orders.append((operands[1], operands[0]))
        out = []
        for (want_ops, want_users), pairs in self.groups.get(kind, ()):
            if len(want_ops) != len(operands) or len(want_users) != len(users):
                continue
            if not all(w <= have for w, have in zip(want_users, users)):
                continue
            if any(all(w[1] == prod if w[0] == "op" else w[1] <= others for w, (prod, others) in zip(want_ops, order))
                   for order in orders):
                out.extend(pairs)
        return sorted(out)


def child_sites(rewrites: list, table: AnchorTable, radius: int, g: TGraph, parent_sites: list, index: Index,
                rejected=None) -> list:
    """g's sites from its parent's (g = parent + one rewrite, ``g.changes``), sorted: the same list as
    ``all_sites``. A match whose ops the rewrite did not change is a match in both graphs (matching
    reads only the matched ops), and so is its local check; the other matches use a node the
    rewrite created or rewired, and are found by matching anchored at those nodes (those that fail
    the local check are counted in ``rejected``). ``table``: an ``AnchorTable`` of the rewrites;
    ``radius``: the most ops of a rewrite's source, less one."""
    changed = g.changes.keys()
    keep = [s for s in parent_sites if changed.isdisjoint(s[1])]
    eligible = index.eligible
    fresh = sorted(nid for nid, n in g.changes.items() if n is not None and n.is_taso and eligible(nid))
    if not fresh:
        return keep
    # (rewrite, position) -> the fresh nodes that can stand there
    anchors: dict = {}
    for nid in fresh:
        for pair in table.pairs(g, nid):
            anchors.setdefault(pair, []).append(nid)
    near = _near_kinds(g, fresh, eligible, radius)
    new = []
    for (ri, pos), cands in sorted(anchors.items()):
        rw = rewrites[ri]
        if not rw.kinds <= near:
            continue
        for ops, b in matches(rw, g, index, (pos, cands)):
            # each match once: from the first position that holds a fresh node
            if changed.isdisjoint(ops[:pos]):
                _add_site(new, rejected, ri, rw, g, ops, b)
    out = keep + new
    out.sort(key=_site_order)
    return out


def _near_kinds(g: TGraph, start: list, eligible, radius: int) -> set:
    """The kinds of the eligible taso ops within ``radius`` steps of ``start`` (a step: to the
    producer of an operand, to a user of a result, to another user of an operand). The ops of a
    match are connected by such steps, so a match with an op in ``start`` has only these kinds."""
    nodes, uses = g.nodes, g.uses()
    seen = set(start)
    seen_values: set = set()  # values whose users were listed (a value can have many)
    frontier = list(start)
    for _ in range(radius):
        nxt = []
        for nid in frontier:
            n = nodes[nid]
            near = [v[0] for v in n.operands]
            for v in n.operands + tuple((nid, j) for j in range(len(n.shapes))):
                if v not in seen_values:
                    seen_values.add(v)
                    near.extend(uses.get(v, ()))
            for x in near:
                if x is not None and x not in seen and nodes[x].is_taso and eligible(x):
                    seen.add(x)
                    nxt.append(x)
        frontier = nxt
    return {nodes[x].kind for x in seen}


def _creates_cycle(g: TGraph, ops: list, b: dict) -> bool:
    """A multi-output rewrite merges ops: a cycle appears if a variable depends on a matched op.
    The search walks back from the variables, only through nodes ranked after the earliest
    matched op in a topological order (nothing before it can depend on it)."""
    rank = g.ranks()
    matched = set(ops)
    lo = min(rank[o] for o in ops)
    stack = [v[0] for v in b.values()]
    seen = set()
    nodes = g.nodes
    while stack:
        nid = stack.pop()
        if nid in matched:
            return True
        if nid in seen or rank[nid] < lo:
            continue
        seen.add(nid)
        stack.extend(v[0] for v in nodes[nid].operands)
    return False


# ---------------------------------------------------------------------------------------------
# applying a rewrite


_TARGETS: dict = {}


class Child:
    """A graph one rewrite away from a built graph, not built yet: the parent, what the rewrite
    changes (node id -> new node, or None where removed; new nodes first, in id order), and the
    child's key, cost and op count, already known. ``graph()`` builds it (a copy of the parent's
    node dict with the changes), so the search builds only the graphs it pops."""

    __slots__ = ("parent", "changes", "outputs", "next_id", "key", "cost", "num_ops", "step")

    def graph(self) -> TGraph:
        nodes = dict(self.parent.nodes)
        for nid, n in self.changes.items():
            if n is None:
                del nodes[nid]
            else:
                nodes[nid] = n  # a new id is appended, a rewired one keeps its place
        g = TGraph(nodes, self.outputs, self.next_id, self.key, self.cost, self.num_ops)
        g.history = self.parent.history + (self.step,)
        g.parent, g.changes = self.parent, self.changes
        return g


def apply(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, builder: Builder) -> TGraph:
    return rewrite(rw, g, ops, b, builder).graph()


def _twin(g: TGraph, kind: str, attrs: tuple, operands: tuple, ops: list) -> Optional[int]:
    """An op of g, other than the matched ``ops``, that computes exactly ``kind(attrs)(operands)``
    (ops have no side effects, so a target op equal to it can be it), or None."""
    if not operands:
        return None
    gn = g.nodes
    for u in g.uses().get(operands[0], ()):
        if u is not None and u not in ops:
            n = gn[u]
            if n.kind == kind and n.operands == operands and n.attrs == attrs:
                return u
    return None


def _targets(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, changes: dict, nodes, builder: Builder,
             dtype: str, shared: Optional[dict] = None) -> dict:
    """Build the target ops (new ids from g.next_id into ``changes``; ``nodes``: the mapping the
    builder reads). Returns rule reference -> value (the variables' and the new ops' results).
    With ``shared`` (a dict), a target op equal to an op g has (``_twin``) is that op, not a new
    one, and ``shared`` gets target op index -> that op's id: TASO's search would make a second
    copy; sharing it is what lets, e.g., eight matmuls that each got ``concat(x, h)`` from one rule
    merge into one (an e-graph gets this from hash-consing)."""
    gn = g.nodes
    shapes = {v: tuple(gn[val[0]].shapes[val[1]]) for v, val in b.items()} | RB.site_env(rw, GraphView(g), ops)
    ref_val: dict = dict(b)
    nid = g.next_id
    dkey = (rw.memo_key, tuple(sorted(shapes.items())))
    targets = _TARGETS.get(dkey)
    if targets is None:
        targets = _TARGETS[dkey] = [(attrs_tuple(a), tuple(o)) for a, o in RB.dst_op_attrs(rw, shapes)]
    for k, ((attrs, outs), rop) in enumerate(zip(targets, rw.dst.ops)):
        operands = tuple(ref_val[r] for r in rop.operands)
        if shared is not None:
            twin = _twin(g, rop.name, attrs, operands, ops)
            if twin is not None:
                shared[k] = twin
                for j in range(rop.num_results):
                    ref_val[G.op_ref(k, j, rop.num_results)] = (twin, j)
                continue
        changes[nid] = builder.node(nodes, rop.name, attrs, operands, outs, dtype)
        for j in range(rop.num_results):
            ref_val[G.op_ref(k, j, rop.num_results)] = (nid, j)
        nid += 1
    return ref_val


def target_info(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, builder: Builder) -> Optional[tuple]:
    """What the rewrite ``rewrite(rw, g, ops, b)`` adds, for costing it without building it: None
    where it changes whether a replaced value is computed from weights only (then the users' costs
    change too, and only ``rewrite`` knows them) or where a target op is a split of a split's piece
    on the same axis (its cost depends on the piece's other uses, ``_split_tree_costs``), else (the
    costs of the target ops in order, the positions of the mapped outputs whose old or new producer
    is a split, with those splits' axes: a split on such an axis using such a value can change
    cost, see ``Builder.node``). Memoized by the
    rewrite, the variables' shapes, weight flags and producers' split axes (``b`` in variable
    order), the element type and the matched ops' weight flags: for a site of a graph it holds in
    every graph the site is inherited by. The key includes the site's stride where the rule's is
    symbolic."""
    gn = g.nodes
    dtype = gn[ops[-1]].dtype
    key = (rw.id, tuple((gn[x[0]].shapes[x[1]], gn[x[0]].weight, split_axis(gn[x[0]])) for x in b.values()), dtype,
           tuple(gn[o].weight for o in ops), tuple(RB.site_env(rw, GraphView(g), ops).items()))
    hit = builder.target_costs.get(key, 0)
    if hit == 0:
        changes: dict = {}
        nodes = ChainMap(changes, gn)
        ref_val = _targets(rw, g, ops, b, changes, nodes, builder, dtype)
        pairs = [(nodes[ref_val[rd][0]], gn[ops[G.parse_ref(rs)[0]]]) for rs, rd in zip(rw.src.outputs, rw.dst.outputs)]
        # a target split of a split's piece on the same axis: its cost depends on the piece's other
        # uses in the child (``_split_tree_costs``)
        nested = builder.split_trees and any(
            split_axis(n) is not None and split_axis(nodes[n.operands[0][0]]) == split_axis(n) for n in changes.values())
        if all(new.weight == old.weight for new, old in pairs) and not nested:
            # where a mapped output's old or new producer is a split: (output position, the axes of
            # those splits, the target op and result it maps to (None: a variable), the new
            # producer's split axis, the target ops' uses of it)
            moved = tuple((i, axes, G.parse_ref(rd), split_axis(new),
                           sum(r == rd for rop in rw.dst.ops for r in rop.operands))
                          for i, ((new, old), rd) in enumerate(zip(pairs, rw.dst.outputs))
                          for axes in [frozenset((split_axis(new), split_axis(old))) - {None}] if axes)
            # the target ops on variables alone: only they can equal an op of the graph (``_twin``)
            leaves = tuple((n.kind, n.attrs, tuple(rop.operands)) for n, rop in zip(changes.values(), rw.dst.ops)
                           if rop.operands and all(r in b for r in rop.operands))
            hit = (tuple(n.cost for n in changes.values()), moved, leaves)
        else:
            hit = None
        builder.target_costs[key] = hit
    return hit


def info_costs(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, info: Optional[tuple],
               builder: Builder) -> Optional[tuple]:
    """(the target ops' costs, the changes of other ops' costs in the order ``rewrite`` adds them)
    from ``target_info``'s answer in g, or None where the rewrite changes the cost of an op it does
    not build in a way only ``rewrite`` works out (a weight flag changes, a split of a variable's
    piece on its producer's axis, whose other uses change; a split on the axis of a mapped output's
    producer where the output maps to a variable or to a target op another output maps to) or a
    target op is an op g has (``_twin``: it costs nothing new, and what uses it changes).

    The changes it works out: a split using a mapped output whose old or new producer is a split
    on its axis. Rewired to the new producer it costs 0 where that is a split on its axis
    (``Builder.node``), else its own cost; then, as part of the new split's tree, its own cost
    again where the piece has another use or is an output (``_split_tree_costs``)."""
    if info is None:
        return None
    costs, moved, leaves = info
    for kind, attrs, refs in leaves:
        if _twin(g, kind, attrs, tuple(b[r] for r in refs), ops) is not None:
            return None
    uses, gn = g.uses(), g.nodes
    for v in b.values():  # a split of a variable's piece: the rewrite changes the piece's other uses
        ax = split_axis(gn[v[0]])
        if ax is not None and any(u is not None and u not in ops and split_axis(gn[u]) == ax for u in uses.get(v, ())):
            return None
    rewired: list = []  # cost changes as the users are rewired, in ``rewrite``'s order
    tree: list = []  # (new value, user, cost change) as the new split trees are costed
    targets = set()
    for i, axes, target, new_axis, inner in moved:
        p = G.parse_ref(rw.src.outputs[i])
        old = (ops[p[0]], p[1])
        users = [u for u in uses.get(old, ()) if u is not None and u not in ops]
        splits = [u for u in users if split_axis(gn[u]) in axes]
        if not splits:
            continue
        if target is None or target in targets:
            return None
        targets.add(target)
        new = (g.next_id + target[0], target[1])  # no twins: target op k is node next_id + k
        alone = len(users) + inner == 1 and old not in g.outputs
        for u in splits:
            n = gn[u]
            own = builder.cost(n.kind, n.attrs, [gn[v[0]] for v in n.operands], n.operands, n.shapes, n.dtype,
                               n.weight)
            in_tree = builder.split_trees and new_axis == split_axis(n)
            first = 0.0 if in_tree else own
            if first != n.cost:
                rewired.append(first - n.cost)
            if in_tree and not alone:
                tree.append((new, u, own - first))
    return costs, tuple(rewired) + tuple(d for _v, _u, d in sorted(tree))


def target_costs(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, builder: Builder) -> Optional[tuple]:
    """``info_costs`` of the rewrite ``rewrite(rw, g, ops, b)``, computed without building it."""
    return info_costs(rw, g, ops, b, target_info(rw, g, ops, b, builder), builder)


def rewrite_cost(g: TGraph, ops: list, info: tuple) -> float:
    """The cost of the rewrite of g at ops from its ``target_costs``, without building it: the same
    sum in the same order as ``rewrite``, so the same float."""
    gn = g.nodes
    cost = g.cost
    costs, changes = info
    for c in costs:
        cost += c
    for m in ops:
        cost -= gn[m].cost
    for c in changes:
        cost += c
    return cost


def rewrite(rw: RB.Rewrite, g: TGraph, ops: list, b: dict, builder: Builder) -> Child:
    """The rewrite of g at a site that passed ``check_local`` and ``check_global``, as a ``Child``."""
    gn = g.nodes
    changes: dict = {}
    nodes = ChainMap(changes, gn)  # the child's nodes as far as the builder reads them
    key, cost = g.key, g.cost
    shared: dict = {}
    ref_val = _targets(rw, g, ops, b, changes, nodes, builder, gn[ops[-1]].dtype, shared)
    made = list(changes)
    # the node of each target op: a new one, or the op of g it equals
    by_target = tuple(ref_val[G.op_ref(k, 0, rop.num_results)][0] for k, rop in enumerate(rw.dst.ops))
    for n in changes.values():
        key = (key + n.contrib) & MASK
        cost += n.cost
    nid = g.next_id + len(made)
    repl = {(ops[p[0]], p[1]): ref_val[rd]
            for rs, rd in zip(rw.src.outputs, rw.dst.outputs) for p in [G.parse_ref(rs)]}
    for m in ops:
        n = gn[m]
        changes[m] = None
        key = (key - n.contrib) & MASK
        cost -= n.cost
    uses = g.uses()
    outputs = g.outputs
    todo = []
    for old, new in repl.items():
        for u in uses.get(old, ()):
            if u is None:
                continue
            if u not in todo and changes.get(u, 0) is not None:
                todo.append(u)
    if any(v in repl for v in outputs):
        okey = _out_key(tuple(g.value_name(v) for v in outputs))
        outputs = tuple(repl.get(v, v) for v in outputs)
        key = (key - okey + _out_key(tuple((nodes[v[0]].name, v[1]) for v in outputs))) & MASK
    # rewire users; a user whose weight flag changes passes the change on
    while todo:
        u = todo.pop(0)
        n = nodes[u]
        operands = tuple(repl.get(v, v) for v in n.operands)
        nn = builder.node(nodes, n.kind, n.attrs, operands, n.shapes, n.dtype, name=n.name)
        if nn.weight != n.weight:
            for j in range(len(n.shapes)):
                todo.extend(x for x in uses.get((u, j), ()) if x is not None and x not in todo)
        changes[u] = nn
        key = (key - n.contrib + nn.contrib) & MASK
        cost += nn.cost - n.cost
    if builder.split_trees:
        # a split of a split's piece costs 0 only where nothing else uses the piece: the splits using
        # a value whose uses changed get the cost they have in the child
        touched: set = set()
        added: dict = {}  # value -> ids of changed nodes that use it (once per use)
        for x, n in changes.items():
            if x in gn:
                touched.update(gn[x].operands)
            if n is not None:
                touched.update(n.operands)
                for v in n.operands:
                    added.setdefault(v, []).append(x)
        if outputs != g.outputs:
            touched.update(g.outputs)
            touched.update(outputs)

        def users(v):
            return [x for x in uses.get(v, ()) if x is not None and x not in changes] + added.get(v, [])

        for x, n in _split_tree_costs(builder, nodes, users, outputs, touched).items():
            cost += n.cost - nodes[x].cost
            changes[x] = n
    c = Child()
    c.parent, c.changes, c.outputs, c.next_id = g, changes, outputs, nid
    c.key, c.cost, c.num_ops = key, cost, g.num_ops - len(ops) + len(made)
    c.step = (rw.id, tuple(ops), by_target, tuple(sorted(shared)),
              P.variant_of(rw, ops, b, [gn[o].operands for o in ops]))
    return c


# ---------------------------------------------------------------------------------------------
# from MLIR


def from_function(func_op, builder: Builder) -> tuple[TGraph, list]:
    """The graph of a func.func body; also the list of MLIR ops by node id (arguments: None)."""
    from taso_mlir.dialect.mlir import ir
    from taso_mlir.dialect.ops import elem_type, shape_of, taso_attrs

    block = func_op.regions[0].blocks[0]
    nodes: dict = {}
    val_of: dict = {}
    mlir_ops: list = []
    key = 0
    nid = 0
    for i, arg in enumerate(block.arguments):
        n = builder.node(nodes, "arg", (), (), (shape_of(arg),), str(elem_type(arg)), name=_h(("o", nid)),
                         weight=False)
        nodes[nid] = n
        key = (key + n.contrib) & MASK
        val_of[arg] = (nid, 0)
        mlir_ops.append(None)
        nid += 1
    outputs = ()
    num_ops = 0
    for o in block.operations:
        op = o.operation
        if op.name == "func.return":
            outputs = tuple(val_of[v] for v in op.operands)
            continue
        try:
            operands = tuple(val_of[v] for v in op.operands)
        except KeyError:
            raise TasoError(f"{op.location}: an operand of '{op.name}' is not defined in the function body "
                            "before it (nested regions are not supported)") from None
        if op.name.startswith("taso."):
            kind = op.name[5:]
            a = taso_attrs(op)
            if kind == "weight":
                attrs = (("name", a["name"]),)
            else:
                attrs = attrs_tuple(specs.spec(kind).complete_attrs(a))
        else:
            kind, attrs = "other:" + op.name, ()
        shapes = tuple(shape_of(r) for r in op.results)
        # (an omitted optional operand, ``onnx.NoValue``, is of type none)
        dtype = str(elem_type(op.results[0])) if len(op.results) and isinstance(op.results[0].type, ir.ShapedType) \
            else ""
        n = builder.node(nodes, kind, attrs, operands, shapes, dtype, name=_h(("o", nid)))
        nodes[nid] = n
        key = (key + n.contrib) & MASK
        for j, r in enumerate(op.results):
            val_of[r] = (nid, j)
        mlir_ops.append(op)
        nid += 1
        num_ops += 1
    g = TGraph(nodes, outputs, nid, 0, 0.0, num_ops)
    uses = g.uses()
    nodes.update(_split_tree_costs(builder, nodes, lambda v: [u for u in uses[v] if u is not None], outputs, uses))
    g.key = (key + _out_key(tuple(g.value_name(v) for v in outputs))) & MASK
    g.cost = sum(n.cost for n in nodes.values())
    return g, mlir_ops


def structure(g: TGraph) -> tuple:
    """A canonical structural form of the graph (independent of node ids and of how it was
    reached): the sorted Merkle hashes of the values the function returns, plus the op census.
    Two graphs with the same structure compute the same thing the same way."""
    memo: dict = {}

    def h(nid):
        if nid not in memo:
            n = g.nodes[nid]
            if n.kind == "arg":
                memo[nid] = _h(("arg", n.name))
            elif not n.operands:  # (a constant: its shape and element type are its result type)
                memo[nid] = _h((n.kind, n.attrs, n.shapes, n.dtype))
            else:
                memo[nid] = _h((n.kind, n.attrs, tuple((h(v[0]), v[1]) for v in n.operands)))
        return memo[nid]

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10 * len(g.nodes) + 1000))
    try:
        outs = tuple((h(v[0]), v[1]) for v in g.outputs)
    finally:
        sys.setrecursionlimit(old)
        h = None  # (``h`` reads itself: the cycle through ``g`` broken)
    live = set(memo)
    census = tuple(sorted(__import__("collections").Counter(g.nodes[n].kind for n in live).items()))
    return outs, census
