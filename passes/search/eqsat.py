"""Equality saturation over a function's graph with the verified rules (TENSAT, MLSys'21).

An e-graph holds every graph the rules reach at once: an *e-class* is one tensor value (with its shape,
element type and whether it computes only from weights), an *e-node* one result of one op whose
operands are e-classes. Multi-result ops (split) are one e-node per result index; the results of one
op share an *op key* ``(kind, attrs, operand classes)``, which is what extraction pays for, once. The
function's arguments, weights and opaque (non-taso) ops are e-nodes no rule matches; opaque ops keep
their operands as e-classes, so the graph around them is rewritten too.

Saturation applies every rewrite of the library at every match, adding its target and merging the
classes of the mapped outputs, until nothing changes or a limit is reached (iterations, e-nodes, time).
A match must pass the same local site check as the backtracking search (``rulebook.check_local``:
static shapes, ranks, float types, attributes resolved at the site, both sides type-check with equal
output shapes, dimensions >= 1), read through an ``EView`` of the e-graph. Rewrites whose source has
several outputs (merges of siblings) are matched, as TENSAT's multi-patterns, only in the first
``k_multi`` iterations: each pair of siblings they merge adds nodes that the next iteration can merge
again. Unlike a graph, an e-graph has no "uses outside the match" to check (``check_uses``): the source
stays in the e-graph, and extraction decides.

Merging can make an e-class reachable from itself (a split of a concat of x and of a value computed
from x); extraction (``extract.py``) only ever returns acyclic graphs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import math
import operator
import os
import sys
import tempfile
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from taso_mlir.dialect import specs
from taso_mlir.generator import graph as G
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T


@dataclass
class Limits:
    iterations: int = 8  # saturation rounds (TENSAT: 15)
    nodes: int = 20000  # e-nodes (TENSAT: 50,000)
    time_s: float = 60.0  # seconds of saturation (a safety net: the other limits are deterministic)
    k_multi: int = 1  # rounds in which multi-output rewrites match (TENSAT's k_multi)
    chains: bool = True  # extend each merge of two siblings by the next ones (``_extend_chains``)
    matches_per_rewrite: int = 2000  # matches of one rewrite applied per round
    matches: int = 300_000  # matches found in all rounds: saturation stops after the round that reaches it


@dataclass
class Stats:
    iterations: int = 0
    stop: str = ""  # why saturation stopped: saturated | iterations | nodes | matches | time
    matches: int = 0  # matches found
    applied: int = 0  # of those, passing the site check and changing the e-graph
    lifted: int = 0  # elementwise ops on split pieces lifted to the whole (``lift_elementwise``)
    rejected: dict = field(default_factory=lambda: defaultdict(int))
    time_s: float = 0.0
    cpu_s: float = 0.0  # of it, this process's CPU time (``time.process_time``)


class EGraph:
    """Union-find over e-classes, a hash-cons of e-nodes, and per class its members and data."""

    def __init__(self):
        self.parent: list = []
        self.shape: list = []  # per class: its static shape (a tuple) or None
        self.dtype: list = []
        self.memo: dict = {}  # e-node (kind, attrs, kids, j) -> class
        self.members: dict = defaultdict(dict)  # class -> its e-nodes (a dict as an ordered set: deterministic)
        self.nres: dict = {}  # op key (kind, attrs, kids) -> number of results
        self.pending: list = []  # unions not yet propagated by rebuild
        self.gone: set = set()  # classes merged into another since the last rebuild
        self.read: set = set()  # classes an e-node's key names (a superset: a class stays once named)
        self.dirty: set = set()  # classes made or merged since ``take_dirty``
        self.age: dict = {}  # e-node -> when it was added (its rank)
        self.order: dict = {}  # e-node -> its place in ``memo`` (a counter; after a rebuild, the first place)
        self.blocked: set = set()  # e-nodes extraction may not choose (``filter_cycles``)
        self.sigs: dict = {}  # op key -> (its attributes, its result shapes): the site check memo's key (``_apply``)

    # ---- union-find
    def find(self, c: int) -> int:
        p = self.parent
        while p[c] != c:
            p[c] = p[p[c]]
            c = p[c]
        return c

    def index_find(self):
        """``find`` for the classes an ``Index``'s keys name: where no union happened since the last rebuild
        every one of them is canonical and ``find`` is the identity, so ``operator.index`` (an int as it is,
        without a Python call) stands in for it."""
        return self.find if self.pending else operator.index

    def new_class(self, shape, dtype) -> int:
        c = len(self.parent)
        self.parent.append(c)
        self.shape.append(shape)
        self.dtype.append(dtype)
        return c

    def canon(self, node: tuple) -> tuple:
        kind, attrs, kids, j = node
        return (kind, attrs, self.canon_kids(kind, kids), j)

    def canon_op(self, op: tuple) -> tuple:
        """An op key (kind, attributes, operand classes) with its operands' classes canonical."""
        return (op[0], op[1], self.canon_kids(op[0], op[2]))

    def canon_kids(self, kind: str, kids: tuple) -> tuple:
        return _in_order(kind, tuple(map(self.find, kids)))

    def add_op(self, kind: str, attrs: tuple, kids: tuple, shapes: list, dtype: str) -> list:
        """The classes of the results of op ``kind(kids){attrs}``: existing ones where the e-graph has
        the op, else new classes. ``kids``: classes canonical at the last rebuild or made since (a class
        merged away before the last rebuild must be ``find``-ed first)."""
        if not kids:
            attrs = key_attrs(kind, attrs, kids, shapes, dtype)
        # (``kids`` are classes canonical at some time since the last rebuild, as every caller's are: one
        # not merged away since (``gone``) is canonical still)
        kids = _in_order(kind, tuple(map(self.find, kids)) if not self.gone.isdisjoint(kids) else tuple(kids))
        if len(shapes) == 1:  # (most ops; most of them found: an e-node made before names read classes)
            c = self.memo.get((kind, attrs, kids, 0))
            if c is not None:
                return [self.find(c)]
        out = []
        for j, s in enumerate(shapes):
            n = (kind, attrs, kids, j)
            c = self.memo.get(n)
            if c is None:
                self.read.update(kids)
                c = self.new_class(s, dtype)
                self.dirty.add(c)
                self.age[n] = len(self.age)
                self.order[n] = len(self.parent)  # (a class per new e-node: increasing)
                self.memo[n] = c
                self.members[c][n] = None
                self.nres[n[:3]] = len(shapes)
            out.append(self.find(c))
        return out

    def union(self, a: int, b: int) -> bool:
        a, b = self.find(a), self.find(b)
        if a == b:
            return False
        if self.shape[a] != self.shape[b] or self.dtype[a] != self.dtype[b]:  # (what ``_apply`` relies on)
            raise ValueError(f"e-graph: a union of classes of two types {self.shape[a]} {self.dtype[a]} "
                             f"and {self.shape[b]} {self.dtype[b]}")
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        self.parent[b] = a
        self.members[a].update(self.members.pop(b, {}))
        self.gone.add(b)
        self.pending.append(a)
        self.dirty.add(a)
        return True

    def take_dirty(self) -> set:
        d = {self.find(c) for c in self.dirty}
        self.dirty = set()
        return d

    def rebuild(self) -> None:
        """Restore the hash-cons after unions (congruence: ops of equal operands are one op). The member
        lists keep the memo's order (``order``). An e-node's key changes only where
        it names a class merged away since the last rebuild (``gone``): where no key names one (most
        rounds' unions merge classes the round made, which nothing reads yet), no key changes, no two
        e-nodes become one, and only the merged classes' members are put back in the memo's order."""
        while self.pending:
            touched = {self.find(c) for c in self.pending}
            self.pending = []
            gone = self.gone  # (grows while the pass unions: a key naming such a class is made canonical)
            if gone.isdisjoint(self.read):
                order = self.order
                for a in touched:
                    ms = self.members[a]
                    if len(ms) > 1:
                        self.members[a] = dict.fromkeys(sorted(ms, key=order.__getitem__))
                continue
            find, old_age, old_order = self.find, self.age, self.order
            memo: dict = {}
            age: dict = {}
            order: dict = {}
            for n, c in self.memo.items():
                a = old_age.get(n, 0)
                o = old_order[n]
                if not gone.isdisjoint(n[2]):
                    # (``n`` may now be another e-node's key: one e-node, in the first one's place, with the
                    # least age)
                    n = self.canon(n)
                    self.read.update(n[2])
                c2 = find(c)
                other = memo.get(n)
                if other is None:
                    memo[n] = c2
                    age[n] = a
                    order[n] = o
                    continue
                if find(other) != c2:
                    self.union(other, c2)
                    c2 = find(c2)
                memo[n] = c2
                age[n] = min(age[n], a)
            self.memo = memo
            self.age = age
            self.order = order
            self.blocked = {self.canon(n) for n in self.blocked}
            members: dict = defaultdict(dict)
            for n, c in memo.items():
                members[find(c)][n] = None
            self.members = members
            nres: dict = {}
            for n in memo:
                nres[n[:3]] = max(nres.get(n[:3], 0), n[3] + 1)
            self.nres = nres
        self.gone = set()

    def filter_cycles(self) -> int:
        """Block, on each cycle of classes through the e-nodes not blocked, the newest e-node on it (TENSAT's
        cycle filtering), until there is none: every choice extraction can then make is acyclic.
        Returns the number of e-nodes blocked (``_walk``)."""
        return self._walk(block=True)[0]

    def _cycle(self) -> list:
        """The e-nodes of one cycle (each leads from its class to the next one's), or []; nothing blocked."""
        return self._walk(block=False)[1]

    def _walk(self, block: bool) -> tuple[int, list]:
        """One depth-first walk over the classes through the e-nodes not blocked. Where it closes a cycle,
        without ``block`` it returns it; with ``block`` the newest e-node on it is blocked, the walk goes back
        to the class that e-node leads from (the classes above it on the path are unvisited again) and on
        with that class's next edge. That blocks what a walk started over after each block (with the classes
        found to reach no cycle kept) blocks: such a walk retraces the same path to that class, as every edge
        it took before leads to a class done or on the path. Returns (e-nodes blocked, the cycle found)."""
        blocked, age = self.blocked, self.age
        n_blocked = 0
        color: dict = {}  # class -> 1 on the path, 2 done (reaches no cycle: blocking only removes edges)
        cache: dict = {}
        for start in self.classes():
            if start in color:
                continue
            color[start] = 1
            stack = [[start, self._edges(start, cache), 0]]
            via: list = []  # via[i]: the e-node that led from stack[i] to stack[i + 1]
            while stack:
                frame = stack[-1]
                c, edges, i = frame
                if i == len(edges):
                    color[c] = 2
                    stack.pop()
                    if via:
                        via.pop()
                    continue
                frame[2] = i + 1
                n, k = edges[i]
                if n in blocked:
                    continue
                if color.get(k) == 1:
                    pos = next(p for p, f in enumerate(stack) if f[0] == k)
                    cycle = via[pos:] + [n]
                    if not block:
                        return 0, cycle
                    b = max(cycle, key=lambda m: age.get(m, 0))
                    blocked.add(b)
                    n_blocked += 1
                    q = pos + cycle.index(b)  # (the path's frame whose class b leads from)
                    for f in stack[q + 1:]:
                        del color[f[0]]
                    del stack[q + 1:]
                    del via[q:]
                    continue
                if k not in color:
                    color[k] = 1
                    via.append(n)
                    stack.append([k, self._edges(k, cache), 0])
        return n_blocked, []

    def _edges(self, c: int, cache: dict) -> list:
        """A class's edges (e-node, operand class), its e-nodes in the memo's order (the oldest first; sorting
        them by their text, as before, took 40% of the filter and blocked more: NasRNN's last e-graph 243
        e-nodes against 182, at the same cost on the suite and 40 fuzzed models), blocked e-nodes' included:
        ``_walk`` skips those as it reads them, as e-nodes are blocked during the walk."""
        every = cache.get(c)
        if every is None:
            every = cache[c] = [(n, self.find(k)) for n in self.members[c] for k in n[2]]
        return every

    def num_nodes(self) -> int:
        return len(self.memo)

    def classes(self) -> list:
        return [c for c in range(len(self.parent)) if self.parent[c] == c]

    def result_class(self, op: tuple, j: int) -> Optional[int]:
        # (an op key read from ``members`` between two rebuilds is the memo's key as it was stored)
        c = self.memo.get(op + (j,))
        if c is None:
            c = self.memo.get(self.canon(op + (j,)))
        return None if c is None else self.find(c)


def _in_order(kind: str, kids: tuple) -> tuple:
    """A commutative op's two operand classes in the key's order (the smaller first)."""
    if len(kids) == 2 and kids[1] < kids[0] and kind in RB.COMMUTATIVE:
        return (kids[1], kids[0])
    return kids


def key_attrs(kind: str, attrs: tuple, kids: tuple, shapes, dtype: str) -> tuple:
    """An op's attributes as its e-node key holds them: an op of no operands (a constant such as
    ``const_imatmul``, whose shape and element type are its result type, not attributes) also holds its
    result shapes and type, so that constants of two shapes or two types are two e-nodes (one e-node
    made an f32 convolution read the f64 constant of the same shape another site had made, and merged
    an f32 class with an f64 one). Keys starting with ``@`` are the e-graph's own."""
    if kids or any(a[0] == "@node" for a in attrs) or any(a[0] == "@shape" for a in attrs):
        return attrs
    return tuple(attrs) + (("@shape", tuple(tuple(s) if s is not None else None for s in shapes)), ("@dtype", dtype))


@functools.lru_cache(maxsize=4096)
def own_attrs(attrs: tuple) -> tuple:
    """An e-node's attributes without the e-graph's own (``@node``, ``@shape``, ``@dtype``), as a tuple of
    (name, value) pairs (memoized: the same few attribute sets recur)."""
    return tuple(a for a in attrs if not a[0].startswith("@"))


def op_attrs(attrs: tuple) -> dict:
    """``own_attrs`` as a dict (a new one)."""
    return dict(own_attrs(attrs))


_OWN_ATTRS: dict = {}  # an e-node's attributes -> ``op_attrs`` of them (``EView.attrs``)


class EView(RB.View):
    """The e-graph as the site check reads it: ops are op keys, values are classes."""

    def __init__(self, eg: EGraph):
        self.eg = eg

    def kind(self, op):
        return op[0] if op[0] in specs.SPECS else None

    def operands(self, op):
        return tuple(self.eg.find(k) for k in op[2])

    def num_results(self, op):
        return self.eg.nres.get(op, 1)

    def result(self, op, j):
        return self.eg.result_class(op, j)

    def producer(self, value):
        return None  # (check_local does not ask)

    def attrs(self, op):
        # (read, never changed, by the site check: one dict per attributes tuple)
        d = _OWN_ATTRS.get(op[1])
        if d is None:
            if len(_OWN_ATTRS) >= 100_000:
                _OWN_ATTRS.clear()
            d = _OWN_ATTRS[op[1]] = op_attrs(op[1])
        return d

    def shape(self, value):
        return self.eg.shape[self.eg.find(value)]

    def dtype(self, value):
        return self.eg.dtype[self.eg.find(value)]

    def users(self, value):
        return ()


#: the ops with a fused activation whose relu ``from_graph`` also holds apart
_ACTIVATED = ("conv2d", "matmul")


def from_graph(g: T.TGraph) -> tuple[EGraph, dict]:
    """The e-graph of one graph; also the class of each of its values (node id, result) -> class.
    Arguments, weights and opaque ops carry their node id in their attributes: no two are one e-node.

    A conv2d or matmul with a fused relu enters as the same op without activation, a relu of it, and
    itself in the relu's class: ``relu(op{none}) = op{relu}`` by the op's definition (the identity
    ``taso-fuse-activation`` proves: ``passes/prepare/fuse_activation.prove``). So a function whose relus
    are fused (that pass fuses them before the search) gives the e-graph, and the class order, that the
    same function with separate relus gives. The order matters: the merges of siblings
    (``_extend_chains``) follow it, and with the op without activation made after its siblings NasRNN's
    first step kept its one fused matmul out of the merge of eight (1.01 ms instead of 0.83, analytic
    T4)."""
    eg = EGraph()
    cls: dict = {}
    for nid in sorted(g.nodes):
        n = g.nodes[nid]
        if n.kind == "arg" or n.kind.startswith("other:") or n.kind == "weight":
            attrs = (("@node", nid),) + tuple(n.attrs)
        else:
            attrs = n.attrs
        kids = tuple(cls[v] for v in n.operands)
        shapes = list(n.shapes) or [None]
        if n.kind in _ACTIVATED and ("activation", "relu") in attrs:
            plain = tuple(("activation", "none") if a[0] == "activation" else a for a in attrs)
            inner = eg.add_op(n.kind, plain, kids, shapes, n.dtype)[0]
            r = eg.add_op("relu", (), (inner,), shapes, n.dtype)[0]
            eg.union(r, eg.add_op(n.kind, attrs, kids, shapes, n.dtype)[0])  # (r stays the root: a tie)
            cls[(nid, 0)] = eg.find(r)
            continue
        for j, c in enumerate(eg.add_op(n.kind, attrs, kids, shapes, n.dtype)):
            cls[(nid, j)] = c
    eg.rebuild()
    return eg, cls


class Index:
    """A snapshot of the e-graph that one round matches against (egg's read phase: every rewrite's
    matches are found before any is applied): the op keys by kind, by the class and result index of
    what they compute, and by an operand class (to join a pattern's several roots through a variable
    they share: the siblings a merge rewrite matches are users of one class)."""

    def __init__(self, eg: EGraph):
        self.by_kind: dict = defaultdict(dict)  # kind -> op keys (dicts as ordered sets: deterministic)
        self.of_class: dict = defaultdict(list)  # (class, kind, result index) -> op keys
        self.users: dict = defaultdict(dict)  # (operand class, kind) -> op keys
        self.eg = eg
        self._roots: dict = {}  # (id of a candidates dict, a matcher's root filter) -> the candidates it keeps
        self._base: dict = {}  # (id of a candidates dict, kind, counts, attributes) -> the candidates they keep
        self._sig: dict = {}  # op key -> its operands' positions and kinds (``_signature``)
        find = eg.find
        kinds: dict = defaultdict(set)  # class -> the kinds of its e-nodes
        self.kinds = kinds
        for n, c in eg.memo.items():
            kinds[find(c)].add(n[0])
        #: (kind of an e-node, kind of an e-node in one of its operand classes): a rewrite whose source
        #: has an edge not among these has no match (``Matcher.edges``)
        self.edges: set = {(n[0], k) for n in eg.memo for kid in set(n[2]) for k in kinds[find(kid)]}
        canonical = not eg.pending  # (no union since the last rebuild: every key is canonical)
        spec = specs.SPECS
        for n, c in eg.memo.items():
            kind = n[0]
            if kind not in spec:
                continue
            if not canonical:
                n = eg.canon(n)
            op = n[:3]
            self.of_class[(find(c), kind, n[3])].append(op)
            if n[3] == 0:
                self.by_kind[kind][op] = None
                for k in op[2]:
                    self.users[(k, kind)][op] = None

    def roots(self, first: dict, key: tuple) -> dict:
        """The candidates of ``first`` (kind -> op keys) a matcher's first root can bind (``Matcher.root_key``:
        its kind, result and operand counts, concrete attributes, and per operand the kind of the source op
        that computes it, or None for a variable): those of that kind, counts and attributes whose operand
        classes hold an e-node of each such kind (in either order for a commutative op), in ``first``'s order.
        What the join would refuse at its first op or at the first step below it, so it finds the same matches
        in the same order; rewrites of one root key share the list (one round, one snapshot)."""
        hit = self._roots.get((id(first), key))
        if hit is not None:
            return hit
        kind, nres_want, n_kids, need, req, comm = key
        base_key = (id(first), kind, nres_want, n_kids, need)
        base = self._base.get(base_key)
        if base is None:  # (the candidates of that kind, counts and attributes: shared by many root keys)
            nres = self.eg.nres.get
            need_of = dict(need)
            base = []
            agree: dict = {}  # attributes -> whether they have ``need``'s values (many ops share them)
            for o in first.get(kind, ()):
                if len(o[2]) != n_kids or nres(o, 1) != nres_want:
                    continue
                if need_of:
                    ok = agree.get(o[1])
                    if ok is None:
                        ok = agree[o[1]] = all(need_of.get(a, v) == v for a, v in o[1])
                    if not ok:
                        continue
                base.append(o)
            self._base[base_key] = base
        want = frozenset((p, q) for p, q in enumerate(req) if q is not None)
        keep = base
        if want:
            sig = self._sig
            swapped = frozenset((1 - p, q) for p, q in want) if comm and n_kids == 2 else None
            keep = [o for o in base if want <= (sig.get(o) or self._signature(o))
                    or (swapped is not None and swapped <= sig[o])]
        hit = self._roots[(id(first), key)] = {kind: keep}
        return hit

    def _signature(self, op: tuple) -> frozenset:
        """(operand position, a kind its class holds) for each operand of ``op`` (``roots`` asks whether the
        source's producer kinds are among them); made once a round per op."""
        find, kinds = self.eg.index_find(), self.kinds
        sig = self._sig[op] = frozenset((p, q) for p, k in enumerate(op[2]) for q in kinds.get(find(k), ()))
        return sig


class Matcher:
    """The matches of one rewrite's source in the e-graph: a backtracking join from the source's root ops
    (those no other source op reads) down to their producers; a root after the first is looked for
    among the users of a variable bound before it where it reads one, else among all ops of its kind."""

    def __init__(self, rw: RB.Rewrite):
        self.rw = rw
        src = rw.src
        self.refs = [[G.parse_ref(r) for r in op.operands] for op in src.ops]
        read = {pr[0] for refs in self.refs for pr in refs if pr is not None}
        self.roots = [k for k in range(len(src.ops)) if k not in read]
        #: per root: its operands that are variables (where one is bound, its users are the candidates)
        self.root_vars = {k: [r for r, pr in zip(src.ops[k].operands, self.refs[k]) if pr is None] for k in self.roots}
        #: per source op, its concrete attributes (numbers, and strings of a string attribute's choices,
        #: such as an activation; not a symbolic stride or a pads mode): an op whose attribute differs is
        #: not a match (a quick filter: ``check_local`` checks all of them at the site's shapes)
        self.need = [{a: v for a, v in op.attrs if _concrete(op.name, a, v)} for op in src.ops]
        #: per source op, the attribute values that never pass the site check (``_refused``): a grouped
        #: convolution's group is not 1
        self.refuse = [dict(_refused(op.attrs)) for op in src.ops]
        #: per variable, the rank the site check wants of its value (None: any, a rank-free rewrite)
        self.rank = {r: None if rw.rank_free else rw.gen_ranks.get(r)
                     for op, refs in zip(src.ops, self.refs) for r, pr in zip(op.operands, refs) if pr is None}
        #: (reader kind, producer kind) of every edge between two source ops: a match needs each of them
        #: among the e-graph's (``Index.edges``); most rewrites that match nothing fail this test
        self.edges = frozenset((op.name, src.ops[pr[0]].name) for op, refs in zip(src.ops, self.refs)
                               for pr in refs if pr is not None)

    @property
    def need(self) -> list:
        return self._need

    @need.setter
    def need(self, need: list) -> None:
        """(setting it forgets what was derived from it: the agreements and the compiled join)"""
        self._need = need
        self.agree: list = [{} for _ in need]  # per source op: attributes -> whether they agree (``need``)
        self._compiled = None
        self._root_key = None
        self._source_key = None

    @property
    def source_key(self) -> tuple:
        """What the join's matches depend on: the source's structure (variables numbered by first use),
        kinds, concrete and refused attributes, and the variables' ranks. Rewrites of one source key (a
        rule's two directions share none, but rules of one source and several targets do: 2,525 rewrite
        forms have 1,994 sources) find the same matches, up to their variables' names (``renamed``)."""
        if self._source_key is None:
            structure, numbers = self._structure()
            self._numbers = numbers
            self._source_key = (structure, tuple(op.name for op in self.rw.src.ops),
                                tuple(tuple(sorted(n.items())) for n in self.need),
                                tuple(tuple(sorted(r.items())) for r in self.refuse),
                                tuple(self.rank[v] for v in sorted(numbers, key=numbers.get)))
        return self._source_key

    def renamed(self, other: "Matcher", found: list) -> list:
        """``other``'s matches (of this matcher's ``source_key``) with this source's variable names."""
        mine = self.names(other, found)
        if mine is None:
            return found
        return [(ops, dict(zip(mine, b.values()))) for ops, b in found]

    def names(self, other: "Matcher", found: list) -> Optional[list]:
        """This source's names of the variables of ``other``'s matches (of this matcher's ``source_key``),
        in the order they bind them; None where they are the same names (or there are no matches)."""
        if not found:
            return None
        assert other.source_key == self.source_key
        names = {n: v for v, n in self._numbers.items()}
        theirs = list(found[0][1])  # (every match binds its variables in the join's one order)
        mine = [names[other._numbers[v]] for v in theirs]
        return None if mine == theirs else mine

    @property
    def root_key(self) -> tuple:
        """What the first root's candidates must have (``Index.roots``)."""
        if self._root_key is None:
            src = self.rw.src
            k, rop = self.roots[0], src.ops[self.roots[0]]
            self._root_key = (rop.name, rop.num_results, len(rop.operands), tuple(sorted(self.need[k].items())),
                              tuple(None if pr is None else src.ops[pr[0]].name for pr in self.refs[k]),
                              rop.name in RB.COMMUTATIVE)
        return self._root_key

    def matches(self, eg: EGraph, idx: Index, cap: int, near: Optional[dict] = None,
                deadline: float = math.inf, first: Optional[dict] = None, second=None):
        """``near``: where given, the candidates of the (single) root op, by kind: the matches found are
        those rooted there (the others were found before). ``first``: the candidates of the first root
        op, by kind, whatever the number of roots. ``second``: (keep, key): the second root's candidates
        are those ``keep`` takes, tried in the order of ``key`` (with ``cap`` 1: the first in that order
        that matches). Runs the join compiled for this rewrite (``_compile``); ``matches_generic`` is the
        same join interpreted, the reference it is tested against."""
        if first is None:
            first = idx.roots(near if (near is not None and len(self.roots) == 1) else idx.by_kind, self.root_key)
        if self._compiled is None:
            self._compiled = self._compile()
        return self._compiled(eg.index_find(), eg.nres.get, idx.of_class.get, idx.users.get, idx.by_kind, first,
                              second, cap, deadline, self.agree, eg.shape)

    def _compile(self):
        """The join of ``matches_generic`` as one Python function of nested loops for this rewrite's
        source: the order in which it tries candidates and binds variables is the interpreter's, so it
        finds the same matches in the same order, without the interpreter's closures and copies (which
        took most of a round's time). Which source ops and variables are bound at each step is known
        from the pattern, so each step is a loop over candidates, a comparison or an assignment. The
        code depends on the pattern's shape only (kinds, variable names and attributes are arguments of
        the function that makes it): the 3,040 rewrites have a few hundred shapes, each compiled once a
        process (``_MAKERS``). The code is looked up by the pattern's structure first (``_structure``:
        making it took a tenth of a first search), and made where the structure is new (``_emit``)."""
        src = self.rw.src
        key, canon = self._structure()
        hit = _BY_STRUCTURE.get(key)
        if hit is None:
            text, bound = self._emit()
            make = _MAKERS.get(text)
            if make is None:
                env = {"monotonic": time.monotonic}
                exec(_CODE.code(text), env)  # noqa: S102 (code made above, from a pattern)
                make = _MAKERS[text] = env["make"]
            hit = _BY_STRUCTURE[key] = (make, [canon[v] for v in bound])
        make, order = hit
        actual = {c: v for v, c in canon.items()}
        return make(*[op.name for op in src.ops], *self.need, *self.refuse,
                    *[op.name in RB.COMMUTATIVE for op in src.ops], *[actual[c] for c in order],
                    *[self.rank[actual[c]] for c in order])

    def _structure(self) -> tuple[tuple, dict]:
        """What the join's code depends on: the roots, and per source op its result count and operands
        (another op's result, or a variable named by its first use); and that naming (variable -> its
        number). Kinds, attributes and variable names are the code's arguments."""
        canon: dict = {}
        ops = []
        for op, refs in zip(self.rw.src.ops, self.refs):
            operands = []
            for r, pr in zip(op.operands, refs):
                if pr is None:
                    operands.append(canon.setdefault(r, len(canon)))
                else:
                    operands.append(pr)
            ops.append((op.num_results, tuple(operands)))
        return (tuple(self.roots), tuple(ops)), canon

    def _emit(self) -> tuple[str, list]:
        """The join's code (a module defining ``make``) and the variables in the order it binds them."""
        src = self.rw.src
        lines: list = []
        bound_ops: list = []  # source ops bound, in order
        bound_vars: dict = {}  # variable -> its local name, in binding order

        def emit(depth, text):
            lines.append("    " * depth + text)

        def tick(depth):  # (the deadline, checked every 1024 candidates)
            emit(depth, "steps += 1")
            emit(depth, "if not steps & 1023 and monotonic() > deadline:")
            emit(depth + 1, "return out")

        def bind(depth, k, then):
            """Source op k bound to ``o{k}`` (a candidate of the innermost loop, which ``continue`` skips)."""
            rop = src.ops[k]
            if bound_ops:
                emit(depth, f"if o{k} in ({', '.join(f'o{j}' for j in bound_ops)},):")
                emit(depth + 1, "continue")
            emit(depth, f"if nres(o{k}, 1) != {rop.num_results} or len(o{k}[2]) != {len(rop.operands)}:")
            emit(depth + 1, "continue")
            # (an op of no concrete attribute has N{k} = {}: it agrees)
            emit(depth, f"ok = g{k}.get(o{k}[1])")
            emit(depth, "if ok is None:")
            emit(depth + 1, f"ok = g{k}[o{k}[1]] = all(N{k}.get(a, v) == v and R{k}.get(a, None) != v for a, v in o{k}[1])")
            emit(depth, "if not ok:")
            emit(depth + 1, "continue")
            bound_ops.append(k)
            if len(rop.operands) == 2:  # (C{k}: commutative, both operand orders)
                emit(depth, f"kk = o{k}[2]")
                emit(depth, f"for kids{k} in ((kk, (kk[1], kk[0])) if C{k} and kk[0] != kk[1] else (kk,)):")
                operand(depth + 1, k, 0, then)
            else:
                emit(depth, f"kids{k} = o{k}[2]")
                operand(depth, k, 0, then)

        def operand(depth, k, p, then):
            rop = src.ops[k]
            if p == len(rop.operands):
                then(depth)
                return
            c = f"c{k}_{p}"
            emit(depth, f"{c} = find(kids{k}[{p}])")
            pr = self.refs[k][p]
            if pr is None:
                ref = rop.operands[p]
                if ref in bound_vars:
                    emit(depth, f"if {c} == {bound_vars[ref]}:")
                    operand(depth + 1, k, p + 1, then)
                else:
                    emit(depth, f"if Q{len(bound_vars)} is not None and len(shape[{c}] or ()) != Q{len(bound_vars)}:")
                    emit(depth + 1, "continue")
                    bound_vars[ref] = c
                    operand(depth, k, p + 1, then)
                return
            m, j = pr
            cands = f"of_class(({c}, K{m}, {j}), ())"
            if m in bound_ops:  # (an op read twice: the same op both times)
                emit(depth, f"if o{m} in {cands}:")
                operand(depth + 1, k, p + 1, then)
                return
            emit(depth, f"for o{m} in {cands}:")
            tick(depth + 1)
            bind(depth + 1, m, lambda d: operand(d, k, p + 1, then))

        def root(depth, i):
            if i == len(self.roots):
                ops = ", ".join(f"o{k}" for k in range(len(src.ops)))
                b = ", ".join(f"V{n}: {name}" for n, name in enumerate(bound_vars.values()))
                emit(depth, f"out.append((({ops},), {{{b}}}))")
                emit(depth, "if len(out) >= cap:")
                emit(depth + 1, "return out")
                return
            k = self.roots[i]
            cands = None
            if i > 0:
                for v in self.root_vars[k]:
                    if v in bound_vars:
                        cands = f"users(({bound_vars[v]}, K{k}), ())"
                        break
            if cands is None:
                cands = f"{'first' if i == 0 else 'by_kind'}.get(K{k}, ())"
            emit(depth, f"cands{i} = {cands}")
            if i == 1:
                emit(depth, "if second is not None:")
                emit(depth + 1, "cands1 = sorted(filter(second[0], cands1), key=second[1])")
            emit(depth, f"for o{k} in cands{i}:")
            tick(depth + 1)
            bind(depth + 1, k, lambda d: root(d, i + 1))

        emit(1, "def match(find, nres, of_class, users, by_kind, first, second, cap, deadline, agree, shape):")
        emit(2, "out = []")
        emit(2, f"{', '.join(f'g{k}' for k in range(len(src.ops)))}, = agree")
        emit(2, "if cap <= 0:")
        emit(3, "return out")
        emit(2, "steps = 0")
        root(2, 0)
        emit(2, "return out")
        emit(1, "return match")
        n = len(src.ops)
        params = ([f"K{k}" for k in range(n)] + [f"N{k}" for k in range(n)] + [f"R{k}" for k in range(n)]
                  + [f"C{k}" for k in range(n)] + [f"V{i}" for i in range(len(bound_vars))]
                  + [f"Q{i}" for i in range(len(bound_vars))])
        text = "\n".join([f"def make({', '.join(params)}):"] + lines)
        bind = operand = root = None  # (they read each other: the cycle broken)
        return text, list(bound_vars)

    def matches_generic(self, eg: EGraph, idx: Index, cap: int, near: Optional[dict] = None,
                        deadline: float = math.inf, first: Optional[dict] = None, second=None):
        """``matches``, interpreted: a backtracking join over the source's structure."""
        src = self.rw.src
        refs = self.refs
        need, refuse, agree, rank = self.need, self.refuse, self.agree, self.rank
        if first is None:
            first = near if (near is not None and len(self.roots) == 1) else idx.by_kind
        out = []

        def bind_op(k, op, ops, b, then):
            """Bind source op k to op key ``op`` (its operands' structure checked), then ``then``."""
            if ops[k] is not None:
                if ops[k] != op:
                    return
                then(ops, b)
                return
            if op in ops:
                return  # (two source ops are two ops)
            rop = src.ops[k]
            if eg.nres.get(op, 1) != rop.num_results or len(op[2]) != len(rop.operands):
                return
            if need[k] or refuse[k]:
                ok = agree[k].get(op[1])
                if ok is None:
                    ok = agree[k][op[1]] = all(need[k].get(a, v) == v and refuse[k].get(a, None) != v
                                                 for a, v in op[1])
                if not ok:
                    return
            for kids in RB.operand_orders(rop.name, op[2]):
                ops2 = list(ops)
                ops2[k] = op
                operand(k, 0, kids, ops2, b, then)

        steps = [0]

        def operand(k, p, kids, ops, b, then):
            if len(out) >= cap:
                return
            steps[0] += 1
            if not steps[0] & 1023 and time.monotonic() > deadline:
                raise _OutOfTime
            rop = src.ops[k]
            if p == len(rop.operands):
                then(ops, b)
                return
            c = eg.find(kids[p])
            pr = refs[k][p]
            if pr is None:
                ref = rop.operands[p]
                have = b.get(ref)
                if have is not None:
                    if have == c:
                        operand(k, p + 1, kids, ops, b, then)
                    return
                if rank[ref] is not None and len(eg.shape[c] or ()) != rank[ref]:
                    return  # (the site check refuses it: ``Matcher.rank``)
                b2 = dict(b)
                b2[ref] = c
                operand(k, p + 1, kids, ops, b2, then)
                return
            m, j = pr
            for op in idx.of_class.get((c, src.ops[m].name, j), ()):
                bind_op(m, op, ops, b, lambda ops2, b2: operand(k, p + 1, kids, ops2, b2, then))

        def root(i, ops, b):
            if len(out) >= cap:
                return
            if i == len(self.roots):
                out.append((tuple(ops), dict(b)))
                return
            k = self.roots[i]
            kind = src.ops[k].name
            cands = None
            if i > 0:
                for v in self.root_vars[k]:
                    if v in b:
                        cands = idx.users.get((b[v], kind), ())
                        break
            if cands is None:
                cands = (first if i == 0 else idx.by_kind).get(kind, ())
            if i == 1 and second is not None:
                cands = sorted(filter(second[0], cands), key=second[1])
            for op in cands:
                bind_op(k, op, ops, b, lambda ops2, b2: root(i + 1, ops2, b2))

        try:
            root(0, [None] * len(src.ops), {})
        except _OutOfTime:
            pass
        return out


class _OutOfTime(Exception):
    pass


_MATCHERS: dict = {}  # id(rewrite) -> (the rewrite, its matcher): built once a process, kept with their caches


def _per_rewrite(cache: dict, rw: RB.Rewrite, build):
    """``build(rw)``, made once a process per rewrite (keyed by its id, checked to be the same rewrite)."""
    hit = cache.get(id(rw))
    if hit is None or hit[0] is not rw:
        hit = cache[id(rw)] = (rw, build(rw))
    return hit[1]


#: compiled joins by their code (``Matcher._compile``): one per pattern shape
_MAKERS: dict = {}
#: the same by the pattern's structure (``Matcher._structure``), with the order the code binds variables in
_BY_STRUCTURE: dict = {}


class CodeCache:
    """The matchers' compiled code, kept on disk across processes as Python keeps modules' bytecode in
    ``__pycache__``: a folder ``$TASO_CACHE_DIR/eqsat-matchers.<interpreter tag>-<bytecode magic>/`` (``cache_dir``)
    of one file per matcher source, named by the source's SHA-256 and holding its marshalled code object. The
    source depends on the pattern's shape only (455 shapes among the shipped rules), so a process compiles only
    the shapes no earlier process compiled (compiling took 0.05-0.1 s of a first search), and reads only the
    files of the shapes its search needs (60-80 for a suite model; one marshalled dict of every entry took
    8 ms to read once the tests had compiled 910 shapes). ``save`` writes this process's new entries, each
    atomically (temp file and rename), so processes saving at once keep each other's entries. An unreadable
    entry, or one another user owns or others may write (its code is run), is ignored with a one-line warning
    and replaced at the next save; a folder that cannot be written costs the compile time only, with a
    warning."""

    def __init__(self, path: Optional[str] = None):
        self._path = path
        self._mem: dict = {}  # SHA-256 of a source -> its code object (read or compiled by this process)
        self._new: dict = {}  # the same, marshalled, for those this process compiled and has not saved
        self.compiled = 0  # sources compiled by this process (not found on disk)
        self._warned = False

    @property
    def path(self) -> str:
        """The cache's folder."""
        if self._path is not None:
            return self._path
        from taso_mlir.passes.cost.disk_cache import cache_dir

        tag = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"  # (bytecode's version)
        return os.path.join(cache_dir(), f"eqsat-matchers.{tag}")

    def code(self, text: str):
        """The code object of ``text`` (a module defining ``make``): from disk, or compiled."""
        key = hashlib.sha256(text.encode()).hexdigest()
        code = self._mem.get(key)
        if code is None:
            code = self._read(key)
            if code is None:
                code = compile(text, "<eqsat matcher>", "exec")
                self._new[key] = marshal.dumps(code)
                self.compiled += 1
            self._mem[key] = code
        return code

    def _read(self, key: str):
        """The code object on disk under ``key``, or None (none there, or one that is not to be run: warned)."""
        path = os.path.join(self.path, f"{key}.marshal")
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    # (its code is run: only a file of this user's that no one else may write)
                    self._warn(f"ignoring the matcher cache entry {path}: not this user's, or writable by others")
                    return None
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):  # (none yet; a folder that is not one: save says)
            return None
        except OSError as e:
            self._warn(f"ignoring the unreadable matcher cache entry {path} ({type(e).__name__}: {e})")
            return None
        try:
            code = marshal.loads(data)
            if not isinstance(code, types.CodeType) or "make" not in code.co_names:
                raise ValueError("not a matcher's code")
        except (EOFError, ValueError, TypeError) as e:
            self._warn(f"ignoring an unreadable entry of the matcher cache {path} ({type(e).__name__}: {e})")
            return None
        return code

    def _warn(self, msg: str) -> None:
        if not self._warned:
            self._warned = True
            from taso_mlir.passes.cost.disk_cache import warn

            warn(msg)

    def save(self) -> None:
        """Write this process's new entries (each replacing its file atomically); nothing if none."""
        if not self._new:
            return
        folder = self.path
        try:
            os.makedirs(folder, exist_ok=True)
            for key, data in list(self._new.items()):
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".new-")
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    os.replace(tmp, os.path.join(folder, f"{key}.marshal"))
                except BaseException:
                    os.unlink(tmp)
                    raise
                del self._new[key]
        except OSError as e:
            self._warn(f"cannot write the matcher cache {folder} ({type(e).__name__}: {e}); "
                       "matchers are compiled again by the next process")


_CODE = CodeCache()


def matcher(rw: RB.Rewrite) -> Matcher:
    return _per_rewrite(_MATCHERS, rw, Matcher)


def _refused(attrs: tuple) -> list:
    """A source op's attribute values that the site check refuses at every site: a ``grouped``
    convolution's group is its operands' channel ratio and not 1 (``graph.spec_attrs``)."""
    return [("group", 1)] if ("group", "grouped") in attrs else []


def _concrete(kind: str, attr: str, v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, str) and v in _str_choices(kind, attr)


@functools.lru_cache(maxsize=None)
def _str_choices(kind: str, attr: str) -> tuple:
    """The values a string attribute of the kind's spec may take (none for any other attribute)."""
    a = next((a for a in specs.spec(kind).attrs if a.name == attr), None) if kind in specs.SPECS else None
    return tuple(a.choices or ()) if a is not None and a.kind == "str" else ()


_DISTINCT: dict = {}  # id(a rewrites list) -> (the list, its rewrites of distinct forms): once a process


def distinct_rewrites(rewrites: list) -> list:
    """``RB.distinct(rewrites)``: a rewrite of the same form as an earlier one (only its variables named
    apart) would find the same matches and add nothing, so a round tries one of them. Their grouping by
    source kinds (``_by_kinds``, what a round's choice of rewrites reads) is made with them: both are the
    rules' and made once a process, as egg makes its rewrites' patterns when it makes the rewrites."""
    hit = _DISTINCT.get(id(rewrites))
    if hit is None or hit[0] is not rewrites or len(hit[0]) != hit[2]:
        hit = _DISTINCT[id(rewrites)] = (rewrites, RB.distinct(rewrites), len(rewrites))
        _by_kinds(hit[1])
    return hit[1]


def saturate(eg: EGraph, rewrites: list, limits: Limits, log=None) -> Stats:
    """Saturate ``eg`` with ``rewrites`` within ``limits`` (``Saturation``: one call)."""
    return Saturation(eg, rewrites, log).run(limits)


class Saturation:
    """Rounds of saturation of one e-graph that can go on where they stopped: ``run`` with a larger
    ``iterations`` limit continues from the rounds already done (the matches tried, the classes changed
    since the last round, the round count that ``k_multi`` reads), so that N rounds and then M more are
    the rounds ``run`` to N + M makes at once. The e-graph may be read in between (extraction: only its
    ``blocked`` e-nodes change, which saturation does not read)."""

    def __init__(self, eg: EGraph, rewrites: list, log=None, distinct: bool = True):
        self.eg = eg
        #: (``distinct``: one rewrite of each form; False: all of them, the same e-graph more slowly)
        self.rewrites = distinct_rewrites(rewrites) if distinct else rewrites
        self.log = log
        self.seen: set = set()  # matches tried (applied, or refused by the site check), canonical
        self.depth = max((len(rw.src.ops) for rw in rewrites), default=1)
        self.it = 0  # rounds done
        self.done = False  # saturated (a round changed nothing): more rounds change nothing either
        eg.take_dirty()

    def run(self, limits: Limits) -> Stats:
        """Rounds until ``limits.iterations`` rounds are done in all (or another limit of ``limits``, which
        count this call's work only); the Stats of this call's rounds."""
        eg, log, seen, depth = self.eg, self.log, self.seen, self.depth
        st = Stats()
        t0, c0 = time.monotonic(), time.process_time()
        st.iterations = self.it
        if self.done:
            st.stop = "saturated"
        view = EView(eg)
        while not self.done and self.it < limits.iterations:
            it = self.it
            idx = Index(eg)
            old = len(eg.parent)
            present = set(idx.by_kind)
            near = None
            if it > 0:  # a new match has an op within ``depth`` above a class made or merged since
                near = _near(eg, eg.take_dirty(), depth)
            else:
                eg.take_dirty()
            found_all = []
            multi = it < limits.k_multi
            tried = _tried(self.rewrites, frozenset(present), multi)
            shared: dict = {}  # source key -> (the first matcher of that source, its matches)
            for rw, m in tried:  # read: every rewrite's matches in the e-graph as the round began
                if not m.edges <= idx.edges:
                    continue
                hit = shared.get(m.source_key)
                names = None  # (another rewrite's matches: this one's names of their variables, where they differ)
                if hit is None:
                    found = m.matches(eg, idx, limits.matches_per_rewrite, near, t0 + limits.time_s)
                    shared[m.source_key] = (m, found)
                else:
                    found = hit[1]
                    names = m.names(*hit)
                st.matches += len(found)
                found_all.append((rw, m, found, names))
                if time.monotonic() - t0 > limits.time_s:
                    break
            changed = False
            chains: list = []  # (matcher, the merged op, the id of the last sibling in it)
            find, canon_op, gone = eg.find, eg.canon_op, eg.gone
            for rw, m, found, names in found_all:  # write: apply them
                starts = _chain_starts(eg, m, found) if limits.chains and len(m.roots) == 2 else {}
                for i, (ops, b) in enumerate(found):
                    # (canonical now: two matches that unions since the round began made one are tried
                    # once; the variables' classes in the order the rewrite's join binds them, one order
                    # per rewrite, so no sorting by name. The keys were canonical as the round began, so
                    # a key none of whose classes was merged away since is canonical as it is)
                    if all(map(gone.isdisjoint, [op[2] for op in ops])):
                        key = (rw.id, ops, tuple(b.values()))
                    else:
                        key = (rw.id, tuple(map(canon_op, ops)), tuple(map(find, b.values())))
                    n_seen = len(seen)
                    seen.add(key)  # (one hash of the key: tried before where the set did not grow)
                    if len(seen) == n_seen:
                        continue
                    if names is not None:  # (the key holds the values only, in the join's order: the same)
                        b = dict(zip(names, b.values()))
                    made: Optional[list] = [] if i in starts else None
                    if _apply(eg, view, rw, list(ops), b, st, made):
                        changed = True
                        merged = _merged_op(m, made)
                        if merged is not None:
                            chains.append((m, merged, starts[i]))
                    if eg.num_nodes() >= limits.nodes:
                        break
                if eg.num_nodes() >= limits.nodes or time.monotonic() - t0 > limits.time_s:
                    break
            if chains and _extend_chains(eg, view, chains, st, limits, t0 + limits.time_s, old):
                changed = True
            # the cleanup's exact identity (not a rule), so extraction sees what cleanup would write
            if eg.num_nodes() < limits.nodes and lift_elementwise(eg, idx, st, limits.nodes):
                changed = True
            eg.rebuild()
            self.it = st.iterations = it + 1
            if log:
                log(f"iteration {it + 1}: {eg.num_nodes()} e-nodes, {len(eg.classes())} e-classes")
            if eg.num_nodes() >= limits.nodes:
                st.stop = "nodes"
                break
            if st.matches >= limits.matches:
                st.stop = "matches"
                break
            if time.monotonic() - t0 > limits.time_s:
                st.stop = "time"
                break
            if not changed:
                self.done = True
                st.stop = "saturated"
                break
        else:
            if not self.done:
                st.stop = "iterations"
        st.time_s = time.monotonic() - t0
        st.cpu_s = time.process_time() - c0
        return st


_TRIED: dict = {}  # (id(rewrites), kinds present, multi-output ones too) -> (rewrites, their number, [(rewrite, matcher)])
_BY_KINDS: dict = {}  # id(rewrites) -> (rewrites, their number, [(source kinds, [index], [index of one output])])


def _by_kinds(rewrites: list) -> list:
    """The rewrites' positions grouped by their source's kinds (a few hundred sets for 2,525 rewrites),
    and within each group those of one output: what ``_tried`` filters by."""
    hit = _BY_KINDS.get(id(rewrites))
    if hit is None or hit[0] is not rewrites or hit[1] != len(rewrites):
        groups: dict = {}
        for i, rw in enumerate(rewrites):
            g = groups.setdefault(rw.kinds, ([], []))
            g[0].append(i)
            if len(rw.src.outputs) == 1:
                g[1].append(i)
        hit = _BY_KINDS[id(rewrites)] = (rewrites, len(rewrites), [(k, a, one) for k, (a, one) in groups.items()])
    return hit[2]


def _tried(rewrites: list, present: frozenset, multi: bool) -> list:
    """The rewrites a round tries, in their order, with their matchers: those whose kinds the e-graph has
    (and with one output unless ``multi``). Few, and the same for most rounds and e-graphs of a search:
    made once a process per set of kinds."""
    key = (id(rewrites), present, multi)
    hit = _TRIED.get(key)
    if hit is None or hit[0] is not rewrites or hit[1] != len(rewrites):
        if len(_TRIED) >= 1000:
            _TRIED.clear()
        picked = sorted(i for kinds, every, one in _by_kinds(rewrites) if kinds <= present
                        for i in (every if multi else one))
        hit = _TRIED[key] = (rewrites, len(rewrites), [(rewrites[i], matcher(rewrites[i])) for i in picked])
    return hit[2]


def _oid(eg: EGraph, op: tuple) -> int:
    """An op's order among siblings: the class of its first result."""
    c = eg.result_class(op, 0)
    return -1 if c is None else c


def _chain_starts(eg: EGraph, m: Matcher, found: list) -> dict:
    """The matches of a two-root rewrite (a merge of two siblings) that start a chain: per first op a,
    the match with the next sibling after it (the smallest order above a's). Index -> that sibling's order."""
    r0, r1 = m.roots
    best: dict = {}
    for i, (ops, _b) in enumerate(found):
        ia, ic = _oid(eg, ops[r0]), _oid(eg, ops[r1])
        if ic > ia and (ops[r0] not in best or ic < best[ops[r0]][0]):
            best[ops[r0]] = (ic, i)
    return {i: ic for ic, i in best.values()}


def _merged_op(m: Matcher, made: Optional[list]) -> Optional[tuple]:
    """Of the ops a merge rewrite made, the one of the first root's kind (the merged op)."""
    kind = m.rw.src.ops[m.roots[0]].name
    return next((op for op in made or () if op[0] == kind), None)


def _extend_chains(eg: EGraph, view: "EView", chains: list, st: Stats, limits: Limits, deadline: float,
                   old: int) -> bool:
    """Extend each merge of two siblings by the next sibling, and that merge by the next, until none is
    left: the same rewrite applied again (with its site check) to the merged op and a sibling. TASO's
    merge rules take two ops, so a merge of k siblings needs k - 1 applications in a row, and an e-graph
    holds it only after k - 1 rounds of multi-output rewrites (each of which pairs everything with
    everything: TENSAT's k_multi limit). One chain per sibling, in one order, grows the e-graph by about
    k per sibling instead. Siblings are ops of classes below ``old`` (made before the round). Returns
    whether the e-graph changed."""
    changed = False
    # the siblings are ops made before the round: the index of the e-graph as the chains begin has them
    # (a merged op, made since, is the first root, given)
    idx = Index(eg)
    oid = functools.partial(_oid, eg)
    while chains and eg.num_nodes() < limits.nodes and time.monotonic() < deadline:
        nxt = []
        for m, op, top in chains:
            opc = eg.canon(op + (0,))[:3]
            found = m.matches(eg, idx, 1, deadline=deadline, first={op[0]: {opc: None}},
                              second=(lambda o: top < oid(o) < old, oid))
            if not found:
                continue
            ops, b = found[0]
            ic = oid(ops[m.roots[1]])
            made: list = []
            if _apply(eg, view, m.rw, list(ops), b, st, made):
                changed = True
                merged = _merged_op(m, made)
                if merged is not None:
                    nxt.append((m, merged, ic))
            if eg.num_nodes() >= limits.nodes:
                break
        chains = nxt
    return changed


#: elementwise ops whose op on a whole tensor, split, equals the op on the pieces (``taso-lift-elementwise``)
_LIFT_UNARY = ("relu", "sigmoid", "tanh")


def _split_pieces(eg: EGraph, c: int) -> list:
    """The split e-nodes of class c: (source class, axis, sizes, piece index)."""
    out = []
    for n in eg.members.get(eg.find(c), ()):
        if n[0] == "split" and len(n[2]) == 1:
            a = dict(n[1])
            out.append((eg.find(n[2][0]), a.get("axis"), tuple(a.get("sizes", ())), n[3]))
    return out


def _on_every_piece(eg: EGraph, idx: Index, kind: str, attrs: tuple, piece: tuple) -> bool:
    """Whether every piece of the split ``piece`` names is read by a ``kind`` op of these attributes."""
    x, axis, sizes, _i = piece
    op = ("split", T.attrs_tuple({"axis": axis, "sizes": list(sizes)}), (x,))
    for j in range(len(sizes)):
        c = eg.result_class(op, j)
        if c is None or not any(u[1] == attrs for u in idx.users.get((eg.find(c), kind), ())):
            return False
    return True


def lift_elementwise(eg: EGraph, idx: Index, st: Stats, limit: int) -> bool:
    """Add the exact identity of ``taso-lift-elementwise`` for unary ops: ``g(split(X)#i) =
    split(g(X))#i`` (g elementwise: each element of the result from the element at the same position;
    proved by ``lift_elementwise.prove``). Merged convolutions or matmuls followed by an activation per
    piece can so become one activation on the whole and the split it already had, which extraction
    prices. Only where the op is on every piece of the split (as the cleanup lifts: an activation on
    the whole tensor for one piece is dearer), and per op the widest such split of its operand's class
    (a class holds a split piece per merge that made it). The binary form (``f(split(X)#i, split(Y)#i)``) is left to the cleanup pass: in an
    e-graph every pair of equal-sized pieces of two classes matches it, and NasRNN's e-graph went past
    290,000 e-nodes. Returns whether the e-graph changed."""
    changed = False
    for kind in _LIFT_UNARY:
        for op in idx.by_kind.get(kind, ()):
            out = eg.result_class(op, 0)
            if out is None or eg.num_nodes() >= limit:
                continue
            pieces = sorted(_split_pieces(eg, op[2][0]), key=lambda t: (-len(t[2]), t))
            pieces = [p for p in pieces if _on_every_piece(eg, idx, kind, op[1], p)]
            if not pieces:
                continue
            x, axis, sizes, i = pieces[0]
            whole = eg.add_op(kind, op[1], (x,), [eg.shape[x]], eg.dtype[out])[0]
            shape = eg.shape[whole]
            piece = eg.add_op("split", T.attrs_tuple({"axis": axis, "sizes": list(sizes)}), (whole,),
                              [tuple(k if d == axis else n for d, n in enumerate(shape)) for k in sizes],
                              eg.dtype[whole])[i]
            if eg.union(out, piece):
                changed = True
                st.lifted += 1
    return changed


#: the site check and the target's attributes by what they read: the rewrite, the bound values' shapes and
#: types, the matched ops' attributes and result shapes (many sites of a model share them)
_LOCAL: dict = {}


def _near(eg: EGraph, dirty: set, depth: int) -> dict:
    """The op keys (by kind) that are ``dirty`` classes' ops or their users within ``depth`` levels."""
    users: dict = defaultdict(set)  # (of ints: their order is deterministic)
    ops_of: dict = defaultdict(dict)
    for n, c in eg.memo.items():
        op = n[:3]
        ops_of[eg.find(c)][op] = None
        for k in op[2]:
            users[eg.find(k)].add(eg.find(c))
    affected, frontier = set(dirty), set(dirty)
    for _ in range(depth):
        frontier = {u for c in frontier for u in users.get(c, ())} - affected
        if not frontier:
            break
        affected |= frontier
    near: dict = defaultdict(dict)
    for c in sorted(affected):
        for op in ops_of.get(c, ()):
            near[op[0]][op] = None
    return near


_PLANS: dict = {}  # id(rewrite) -> (the rewrite, its target's ops and outputs with their refs parsed)


def _target_plan(rw: RB.Rewrite) -> tuple:
    """The target's ops as (kind, [(ref, parsed ref)]) and the outputs as (source result, target ref,
    parsed target ref): what ``_apply`` reads per match (``_plan``: parsed once a process)."""
    ops = [(dop.name, [(ref, G.parse_ref(ref)) for ref in dop.operands]) for dop in rw.dst.ops]
    outs = [(G.parse_ref(rs), rd, G.parse_ref(rd)) for rs, rd in zip(rw.src.outputs, rw.dst.outputs)]
    return ops, outs


def _plan(rw: RB.Rewrite) -> tuple:
    return _per_rewrite(_PLANS, rw, _target_plan)


def _apply(eg: EGraph, view: EView, rw: RB.Rewrite, ops: list, b: dict, st: Stats,
           made_ops: Optional[list] = None) -> bool:
    sigs = eg.sigs
    for op in ops:
        if op not in sigs:  # (an op's result shapes never change: its key names its operands' classes)
            sigs[op] = (op[1], tuple(eg.shape[view.result(op, j)] for j in range(view.num_results(op))))
    # (a class's shape and type are those of every class merged into it (``EGraph.union``): no ``find``)
    shape_of, dtype_of = eg.shape, eg.dtype
    bv = b.values()
    key = (rw.memo_key, tuple(zip(b, map(shape_of.__getitem__, bv), map(dtype_of.__getitem__, bv))),
           tuple(map(sigs.__getitem__, ops)))
    memo = _LOCAL.get(key)
    if memo is None:
        why, shapes, dst_shapes = RB.local_site(rw, view, ops, b)
        dst = None
        if why is None:  # (per target op: kind, attributes, result shapes, operand refs; and the outputs)
            dst_ops, outs_plan = _plan(rw)
            dst = ([(name, T.attrs_tuple(full), [tuple(s) for s in outs], refs)
                    for (full, outs), (name, refs) in zip(RB.dst_op_attrs(rw, shapes, dst_shapes), dst_ops)],
                   outs_plan)
        memo = _LOCAL[key] = (why, dst)
    why, dst = memo
    if why is not None:
        st.rejected[why.split(":")[0][:60]] += 1
        return False
    dtype = dtype_of[next(iter(bv))] if b else eg.dtype[eg.result_class(ops[0], 0)]
    steps, outs_plan = dst
    add = eg.add_op
    made: list = []
    for name, attrs, outs, refs in steps:
        kids = tuple([b[ref] if pr is None else made[pr[0]][pr[1]] for ref, pr in refs])
        made.append(add(name, attrs, kids, outs, dtype))
        if made_ops is not None:
            made_ops.append((name, attrs, kids))
    changed = False
    for (k, j), rd, pd in outs_plan:
        a = eg.result_class(ops[k], j)
        d = b[rd] if pd is None else made[pd[0]][pd[1]]
        if a is not None and eg.union(a, d):
            changed = True
    if changed:
        st.applied += 1
    return changed
