"""Derivability by equality saturation: drop a candidate rule that smaller rules already give.

A candidate ``a <=> b`` is *derivable* when the two graphs become equal in an e-graph that holds both
and is saturated, for a few rounds, with the rules of a smaller library (Ruler's redundancy check: a
rewrite system that contains those rules reaches ``b`` from ``a`` by equational steps, so the
candidate adds no equivalence). The candidate is then dropped before verification; a rule is only
ever dropped when a derivation is found, never because a check failed (``failed`` counts those, which
are kept). Pruning can only remove candidates: no rule becomes usable through it, so it has no
bearing on soundness, which rests on each shipped rule's own proof.

The e-graph is concrete: every e-class is a value at the generator's shapes, with one shape, and every
e-node has its attributes resolved at those shapes (a split's sizes, a constant's shape, the group of
a grouped convolution, 'same' padding). A rule is matched bottom-up over its source ops, operands bound
to e-classes (ewadd and ewmul modulo commutativity), and applied only where, at the bound shapes, its
source's symbolic attributes resolve to the matched ones and its target type-checks with the source's
output shapes (the library's preconditions). Multi-output rules (merges) match all their source ops
and union every mapped output. Rules whose source is a bare variable (``x -> conv(x, I)``, which
matches every e-class) are not used.
"""

from __future__ import annotations

from ..dialect import specs
from . import graph as G
from . import library

COMMUTATIVE = frozenset(library.COMMUTATIVE)
#: attribute values a rule states symbolically (resolved per site); the others must match exactly
_SYMBOLIC = {"sizes", "shape"}
_SYMBOLIC_VALUES = {"same", "grouped", "s"}
_STRIDE1 = {G.STRIDE_VAR: (1, 1)}


def _concrete(op: G.Op, shapes: dict) -> tuple:
    """The op's attributes resolved at ``shapes``, hashable (a constant's shape included)."""
    a, hint = G.spec_attrs(op, shapes)
    if hint is not None:
        a["shape"] = hint[0]
    return tuple(sorted(a.items()))


class EGraph:
    def __init__(self):
        self.parent: list[int] = []
        self.shape: list[tuple] = []
        self.memo: dict[tuple, int] = {}  # canonical e-node -> e-class
        self.version = 0  # bumped by every union that merges two classes

    # e-node: (name, attrs, children e-classes, result index); an input variable: ("var", name, (), 0)
    def find(self, c: int) -> int:
        p = self.parent
        while p[c] != c:
            p[c] = p[p[c]]
            c = p[c]
        return c

    def canon(self, node: tuple) -> tuple:
        name, attrs, kids, j = node
        kids = tuple(self.find(k) for k in kids)
        if name in COMMUTATIVE:
            kids = tuple(sorted(kids))
        return (name, attrs, kids, j)

    def add(self, node: tuple, shape: tuple) -> int:
        node = self.canon(node)
        got = self.memo.get(node)
        if got is not None:
            return self.find(got)
        c = len(self.parent)
        self.parent.append(c)
        self.shape.append(shape)
        self.memo[node] = c
        return c

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)
            self.version += 1

    def rebuild(self) -> None:
        """Restore congruence: e-nodes that became equal after unions put their classes together."""
        while True:
            before = self.version
            memo: dict[tuple, int] = {}
            for node, c in self.memo.items():
                n = self.canon(node)
                other = memo.get(n)
                if other is not None:
                    self.union(other, c)
                memo[n] = self.find(c)
            self.memo = memo
            if self.version == before:
                return

    def add_graph(self, g: G.Graph, input_shapes: dict) -> list[int]:
        """Insert a rule graph (at concrete input shapes); returns its outputs' e-classes."""
        shapes = {**{v: tuple(s) for v, s in input_shapes.items()}, **_STRIDE1}
        shapes.update(G.infer(g, shapes))
        cls = {v: self.add(("var", v, (), 0), tuple(input_shapes[v])) for v in g.inputs()}
        for k, op in enumerate(g.ops):
            attrs = _concrete(op, shapes)
            kids = tuple(cls[r] for r in op.operands)
            for j in range(op.num_results):
                ref = G.op_ref(k, j, op.num_results)
                cls[ref] = self.add((op.name, attrs, kids, j), shapes[ref])
        return [self.find(cls[r]) for r in g.outputs]

    def index(self) -> tuple[dict, dict]:
        """(name -> [(e-node, class)], class -> [e-node]) as the e-graph is now."""
        by_name: dict[str, list] = {}
        members: dict[int, list] = {}
        for node, c in self.memo.items():
            c = self.find(c)
            by_name.setdefault(node[0], []).append((node, c))
            members.setdefault(c, []).append(node)
        return by_name, members


class Rewrite:
    """One usable direction of a proved rule, prepared for matching."""

    def __init__(self, rid: str, src: G.Graph, dst: G.Graph):
        self.id, self.src, self.dst = rid, src, dst
        self.names = frozenset(op.name for op in src.ops)
        # attributes that must equal the matched e-node's (symbolic ones are checked after binding)
        self.fixed = [{k: v for k, v in op.attrs if k not in _SYMBOLIC and v not in _SYMBOLIC_VALUES}
                      for op in src.ops]
        self.vars = src.inputs()

    def matches(self, eg: EGraph, index: dict, members: dict):
        """Bindings (ref -> e-class) of the source's variables and op results, one per match: top-down
        e-matching from the source's outputs (``index``: name -> [(e-node, class)]; ``members``:
        class -> its e-nodes)."""
        ops = self.src.ops
        fixed = self.fixed

        def go(todo, bind):
            if not todo:
                yield bind
                return
            (ref, c), rest = todo[0], todo[1:]
            got = bind.get(ref)
            if got is not None:
                if c is None or eg.find(got) == c:
                    yield from go(rest, bind)
                return
            if not ref.startswith("%"):
                b = dict(bind)
                b[ref] = c
                yield from go(rest, b)
                return
            k, i = G.parse_ref(ref)
            op = ops[k]
            cands = index.get(op.name, ()) if c is None else [(n, c) for n in members.get(c, ()) if n[0] == op.name]
            for node, nc in cands:
                _name, attrs, kids, j = node
                if j != i or len(kids) != len(op.operands):  # (a conv with a bias operand is not one without)
                    continue
                ad = dict(attrs)
                if any(ad.get(a) != v for a, v in fixed[k].items()):
                    continue
                if op.num_results == 1:
                    res = [nc]
                else:
                    res = [eg.memo.get(eg.canon((op.name, attrs, kids, r))) for r in range(op.num_results)]
                    if any(r is None for r in res):
                        continue
                b = dict(bind)
                for r, rc in enumerate(res):
                    b[G.op_ref(k, r, op.num_results)] = eg.find(rc)
                orders = [kids]
                if op.name in COMMUTATIVE and kids[0] != kids[1]:
                    orders.append((kids[1], kids[0]))
                for ks in orders:
                    yield from go(list(zip(op.operands, (eg.find(x) for x in ks))) + rest, b)
        yield from go([(o, None) for o in self.src.outputs], {})

    def apply(self, eg: EGraph, bind: dict) -> bool:
        """Check the match at its shapes and add the target; True where it typed and was added."""
        shapes = {v: eg.shape[bind[v]] for v in self.vars}
        shapes.update(_STRIDE1)
        try:
            s_shapes = G.infer(self.src, shapes)
            for k, op in enumerate(self.src.ops):  # symbolic attributes resolve to the matched ones
                c = eg.find(bind[G.op_ref(k, 0, op.num_results)])
                got = eg.memo.get(eg.canon((op.name, _concrete(op, s_shapes), tuple(bind[r] for r in op.operands), 0)))
                if got is None or eg.find(got) != c:
                    return False
            d_shapes = G.infer(self.dst, shapes)
        except (specs.SpecError, KeyError, IndexError, ValueError):
            return False
        if [s_shapes[o] for o in self.src.outputs] != [d_shapes[o] for o in self.dst.outputs]:
            return False
        cls = {v: bind[v] for v in self.vars}
        for k, op in enumerate(self.dst.ops):
            attrs = _concrete(op, d_shapes)
            kids = tuple(cls[r] for r in op.operands)
            for j in range(op.num_results):
                ref = G.op_ref(k, j, op.num_results)
                cls[ref] = eg.add((op.name, attrs, kids, j), d_shapes[ref])
        for so, do in zip(self.src.outputs, self.dst.outputs):
            eg.union(bind[so], cls[do])
        return True


def _bind(eg: EGraph, bind: dict, operands: tuple, kids: tuple) -> dict | None:
    b = dict(bind)
    for r, kc in zip(operands, kids):
        kc = eg.find(kc)
        got = b.get(r)
        if got is None:
            if r.startswith("%"):
                return None  # (topological order: an op's operands are bound before it)
            b[r] = kc
        elif eg.find(got) != kc:
            return None
    return b


def load_rewrites(paths, statuses=("proved",)) -> list[Rewrite]:
    """Every usable direction (with ops on its source) of every rule in ``paths`` with one of these
    proof statuses."""
    out = []
    for p in paths:
        for record, src, dst in library.rules(p, None):
            if record["proof"]["status"] not in statuses:
                continue
            for direction in record["directions"]:
                a, b = (src, dst) if direction == "forward" else (dst, src)
                if library.usable(a, b):
                    out.append(Rewrite(record["id"], a, b))
    return out


class Deriver:
    """``derivable(a, b, shapes)``: the candidate follows from the rewrites by saturation."""

    def __init__(self, rewrites: list[Rewrite], rounds: int = 3, max_classes: int = 400):
        self.rewrites = rewrites
        self.rounds = rounds
        self.max_classes = max_classes
        self.failed = 0

    def derivable(self, a: G.Graph, b: G.Graph, shapes: dict) -> bool:
        try:
            eg = EGraph()
            oa = eg.add_graph(a, shapes)
            ob = eg.add_graph(b, shapes)
        except (specs.SpecError, KeyError, ValueError):
            self.failed += 1
            return False

        def same():
            return all(eg.find(x) == eg.find(y) for x, y in zip(oa, ob))
        if same():
            return True
        for _ in range(self.rounds):
            index, members = eg.index()
            before = (len(eg.parent), eg.version)
            for rw in self.rewrites:
                if not rw.names <= index.keys():
                    continue
                for m in list(rw.matches(eg, index, members)):
                    if rw.apply(eg, m) and same():
                        return True
                if len(eg.parent) > self.max_classes:
                    break
            eg.rebuild()
            if same():
                return True
            if (len(eg.parent), eg.version) == before or len(eg.parent) > self.max_classes:
                break
        return False


def concat_associativity() -> list[Rewrite]:
    """cat(cat(x, y), z) = cat(x, cat(y, z)) on axes 0 and 1, both directions. True of concat (tested
    against the reference semantics in ``test_egraph``), but not a Z3 axiom: with uninterpreted splits
    that do not know their sizes it would make all tensors equal. A candidate derivable only with it
    (a rearrangement of a concat tree) would not prove anyway; the search fuses concat trees after."""
    out = []
    for axis in (0, 1):
        at = (("axis", axis),)
        left = G.Graph((G.Op("concat", at, ("x", "y")), G.Op("concat", at, ("%0", "z"))), ("%1",))
        right = G.Graph((G.Op("concat", at, ("y", "z")), G.Op("concat", at, ("x", "%0"))), ("%1",))
        out += [Rewrite(f"concat-assoc-{axis}", left, right), Rewrite(f"concat-assoc-{axis}", right, left)]
    return out
