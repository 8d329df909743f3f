"""Extraction: the cheapest acyclic graph an e-graph holds (``eqsat.py``).

Every op of the extracted graph is paid once, however many of its results and users it has, so the
cost of a choice is not a sum over classes: greedy extraction, which prices each class as the cheapest
tree below it, misses sharing (TENSAT: NasNet-A came out worse than it went in). ``ilp`` states the
choice as an integer program, TENSAT's: a binary per e-node (chosen or not) and per op (paid or not);
every output class has a chosen e-node; at most one e-node of a class is chosen; every chosen e-node
pays its op and has a chosen e-node in each of its operand classes. That last row is stated once per
class and operand class, over all the class's e-nodes that read it (valid as at most one of them is
chosen): stated per e-node, the relaxation spreads a class's choice over e-nodes sharing operands and
halves what their operands must carry at every level (SqueezeNet: a root bound 85% below the optimum
and 20 s of branching, against 0.03 s). Every class X that every choice of a class C needs is at least as
chosen as C (``_necessary_rows``). Minimize the ops' costs. It is solved by HiGHS (``highspy``)
within a time limit; the greedy choice (or the input, where cheaper) is kept where the solver's best in
time costs more. It is not handed to HiGHS as a start: HiGHS 1.16 returned a start's values as the
solution of a model whose optimum it reported cheaper. Cycles are cut lazily: where the solution's
graph has a cycle, a constraint that not all of that cycle's e-nodes are chosen is added and the
program solved again.
The solver's bound says how far the result can be from the optimum under the rules (the gap).

Costs are those of the function as written (``tgraph.Builder`` with ``split_trees=False``): an op whose
operands all compute from weights costs nothing (it is folded into a weight), and an e-class computes
from weights where any of its e-nodes does.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from taso_mlir.dialect import specs
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T
from taso_mlir.passes.search.eqsat import EGraph, own_attrs


@dataclass
class Extraction:
    choice: dict  # class -> chosen e-node (kind, attrs, kids, j), for the classes the graph uses
    order: list  # op keys (kind, attrs, kids) in an order where operands come first
    cost: float  # the sum of the chosen ops' costs
    method: str  # "ilp" | "greedy" | "input"
    bound: Optional[float] = None  # the solver's lower bound on the optimum (None: no bound)
    status: str = ""
    solve_s: float = 0.0  # the whole extraction: the program built, solved, read back
    cuts: int = 0  # cycle constraints added
    info: dict = field(default_factory=dict)
    input_cost: float = math.inf  # the input graph's cost, priced the same way
    solver_s: float = 0.0  # of ``solve_s``, HiGHS's runs (what TENSAT's extraction time counts: its solver's)
    solver_cpu_s: float = 0.0  # the same runs' CPU time (``time.process_time``: this process's, not the machine's)

    @property
    def gap(self) -> Optional[float]:
        if self.bound is None:
            return None
        if self.cost <= 0:  # (a graph of no ops, such as an identity: nothing is cheaper)
            return 0.0 if self.bound >= self.cost - 1e-12 else None
        return max(0.0, (self.cost - self.bound) / self.cost)


class _In:
    __slots__ = ("shapes", "weight")

    def __init__(self, shape, weight):
        self.shapes, self.weight = (shape,), weight


class Costs:
    """Per op key its cost, and per class whether it computes from weights."""

    def __init__(self, eg: EGraph, builder: T.Builder):
        self.eg, self.builder = eg, builder
        self.weight = self._weights()
        self._memo: dict = {}
        self._ordered: dict = {}  # op key -> its cost with its operands in the key's order

    def _weights(self) -> set:
        eg = self.eg
        w: set = set()
        changed = True
        while changed:
            changed = False
            for c, nodes in eg.members.items():
                c = eg.find(c)
                if c in w:
                    continue
                for kind, _attrs, kids, _j in nodes:
                    if _from_weights(kind, kids, (eg.find(k) in w for k in kids)):
                        w.add(c)
                        changed = True
                        break
        return w

    def cost(self, op: tuple) -> float:
        """The op's cost; a commutative op's, in the cheaper of its two operand orders (the e-graph holds
        one e-node for both, and writing it back may take either: ``swapped``)."""
        c = self._memo.get(op)
        if c is None:
            c = self.in_order(op)
            if op[0] in RB.COMMUTATIVE and len(op[2]) == 2:
                c = min(c, self.in_order(_swap(op)))
            self._memo[op] = c
        return c

    def swapped(self, op: tuple) -> Optional[bool]:
        """For a commutative op of two operands: whether its operands swapped cost less (True), more
        (False), or the same (None); None for any other op."""
        if op[0] not in RB.COMMUTATIVE or len(op[2]) != 2:
            return None
        a, b = self.in_order(op), self.in_order(_swap(op))
        if abs(a - b) <= 1e-12 * max(1.0, abs(a)):
            return None
        return b < a

    def in_order(self, op: tuple) -> float:
        """The op's cost with its operands in the order its key gives."""
        c = self._ordered.get(op)
        if c is None:
            kind, attrs, kids = op
            if kind == "arg" or kind == "weight":
                c = 0.0
            else:
                eg, weight = self.eg, self.weight
                ins = []
                for k in kids:
                    k = eg.find(k)
                    ins.append(_In(eg.shape[k], k in weight))
                results = _results(eg, op)
                c = self.builder.cost(kind, own_attrs(attrs), ins, _first_results(len(ins)),
                                      tuple(eg.shape[r] for r in results), eg.dtype[results[0]] if results else "",
                                      _from_weights(kind, kids, (i.weight for i in ins)))
            self._ordered[op] = c
        return c


@functools.lru_cache(maxsize=None)
def _first_results(n: int) -> tuple:
    """``n`` operands as (input, result 0) pairs: how ``Builder.cost`` reads ``ins``."""
    return tuple((i, 0) for i in range(n))


def _results(eg: EGraph, op: tuple) -> list:
    """The classes of an op's results, in order."""
    n = eg.nres.get(op)
    if n is not None:
        out = [eg.result_class(op, j) for j in range(n)]
        if None not in out:
            return out
    out = []
    while True:
        r = eg.result_class(op, len(out))
        if r is None:
            return out
        out.append(r)


def _from_weights(kind: str, kids: tuple, weights) -> bool:
    """Whether an op computes from weights alone (it is one, a constant, or a spec'd op of operands,
    every one from weights: ``weights``, their flags, read lazily)."""
    return kind == "weight" or kind in specs.CONSTANTS or (kind in specs.SPECS and bool(kids) and all(weights))


def _swap(op: tuple) -> tuple:
    kind, attrs, kids = op
    return (kind, attrs, (kids[1], kids[0]))


def reachable(eg: EGraph, roots: list) -> list:
    seen, stack = set(), [eg.find(r) for r in roots]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for n in eg.members[c]:
            if n not in eg.blocked:
                stack.extend(eg.find(k) for k in n[2])
    return sorted(seen)


def greedy(eg: EGraph, costs: Costs, roots: list) -> Optional[dict]:
    """Each class's cheapest tree (a fixpoint over classes); None where a root has no finite tree."""
    classes = reachable(eg, roots)
    best = {c: (math.inf, None) for c in classes}
    changed = True
    while changed:
        changed = False
        for c in classes:
            for n in eg.members[c]:
                if n in eg.blocked:
                    continue
                kids = [eg.find(k) for k in n[2]]
                t = costs.cost(n[:3]) + sum(best[k][0] for k in kids)
                if t < best[c][0] - 1e-12:
                    best[c] = (t, n)
                    changed = True
    if any(best[eg.find(r)][1] is None for r in roots):
        return None
    return {c: n for c, (t, n) in best.items() if n is not None}


def walk(eg: EGraph, roots: list, chosen) -> tuple[Optional[dict], Optional[list]]:
    """A graph from the choices ``chosen(c)`` (the e-nodes chosen in class c, preferred first): the
    choice per class it uses and its ops in operand-first order, or (None, cycle) where every choice
    closes a cycle (``cycle``: the e-nodes on one)."""
    choice: dict = {}
    order: list = []
    placed: set = set()
    state: dict = {}  # class -> 1 on the path, 2 done
    path: list = []
    cycle: list = []

    def visit(c) -> bool:
        c = eg.find(c)
        if state.get(c) == 2:
            return True
        if state.get(c) == 1:
            i = next(i for i, (pc, _n) in enumerate(path) if pc == c)
            cycle[:] = [n for _pc, n in path[i:]]
            return False
        state[c] = 1
        for n in chosen(c):
            path.append((c, n))
            ok = all(visit(k) for k in n[2])
            path.pop()
            if ok:
                choice[c] = n
                if n[:3] not in placed:
                    placed.add(n[:3])
                    order.append(n[:3])
                state[c] = 2
                return True
        del state[c]
        return False

    try:
        for r in roots:
            if not visit(r):
                return None, cycle
        return choice, order
    finally:
        visit = None  # (``visit`` reads itself: the cycle through the e-graph broken)


def _axis(op: tuple):
    return dict(op[1]).get("axis")


def total(costs: Costs, choice: dict, order: list, roots: list) -> float:
    """The cost of a graph (its ops ``order``, ``choice``: class -> chosen e-node) as the cleanup
    writes it: a split of a piece of a split on the same axis, where nothing else uses the piece (and
    it is not an output), is part of its parent's split (``taso-fuse-split-trees``) and costs nothing
    of its own, the search's model (``tgraph.Builder``)."""
    eg = costs.eg
    uses: dict = defaultdict(int)
    for op in order:
        for k in op[2]:
            uses[eg.find(k)] += 1
    outs = {eg.find(r) for r in roots}
    t = 0.0
    for op in order:
        if op[0] == "split" and op[2]:
            k = eg.find(op[2][0])
            n = choice.get(k)
            if n is not None and n[0] == "split" and _axis(n) == _axis(op) and uses[k] == 1 and k not in outs:
                continue
        t += costs.cost(op)
    return t


def _highs():
    """A silent HiGHS instance (its banner goes to file descriptor 1, which may be the output)."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def _program(eg: EGraph, costs: Costs, roots: list, integer: bool = True):
    """The integer program (HiGHS instance, its e-nodes, their columns, the classes, the cost vector, the
    number of rows); with ``integer`` False its linear relaxation."""
    import highspy
    import numpy as np

    classes = reachable(eg, roots)
    nodes = [n for c in classes for n in sorted(eg.members[c], key=repr) if n not in eg.blocked]
    ops = sorted({n[:3] for n in nodes}, key=repr)
    xi = {n: i for i, n in enumerate(nodes)}
    results: dict = defaultdict(list)  # op -> its e-nodes (one per result it computes)
    for n in nodes:
        results[n[:3]].append(n)
    # an op of one e-node is paid where that e-node is chosen: its column is the e-node's; an op of
    # several (results) has a column of its own, at least each of theirs
    shared = [o for o in ops if len(results[o]) > 1]
    yi = {o: xi[results[o][0]] for o in ops if len(results[o]) == 1}
    yi.update((o, len(nodes) + i) for i, o in enumerate(shared))
    by_class = {c: [xi[n] for n in eg.members[c] if n in xi] for c in classes}
    reads = [{eg.find(k) for k in n[2]} for n in nodes]  # per e-node, its operand classes
    h = _highs()
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    # no probing in presolve: on an e-graph of 13,000 e-nodes (a fuzzed RNN) it lifted 110,000 nonzeros
    # into the program in 14 s of a 22 s solve, and the solve takes 1.5 s without it; on the suite's
    # programs it changes nothing (HiGHS's presolve rule 15)
    h.setOptionValue("presolve_rule_off", 1 << 15)
    outs = {eg.find(r) for r in roots}
    readers: dict = defaultdict(list)  # class -> the e-nodes reading it
    for n, ks in zip(nodes, reads):
        for k in ks:
            readers[k].append(n)
    # a split of a piece of a split on the same axis, where nothing else reads the piece, costs nothing
    # of its own (``total``): z_o (1 where split op o gets that discount) <= y_o, <= the sum of the
    # piece's class's split e-nodes on o's axis, and <= 1 - x_u for every other e-node u reading it
    zs: list = []  # (split op, its piece's same-axis split e-nodes, the other readers)
    for o in ops:
        if o[0] != "split" or not o[2]:
            continue
        k = eg.find(o[2][0])
        same = [nodes[i] for i in by_class[k] if nodes[i][0] == "split" and _axis(nodes[i]) == _axis(o)]
        if same and k not in outs:
            zs.append((o, same, [u for u in readers[k] if u[:3] != o]))
    zi = {o: len(nodes) + len(shared) + i for i, (o, _s, _u) in enumerate(zs)}
    nvar = len(nodes) + len(shared) + len(zs)
    cost = np.zeros(nvar)
    for o in ops:
        cost[yi[o]] = costs.cost(o)
    for o, _s, _u in zs:
        cost[zi[o]] = -costs.cost(o)
    h.addVars(nvar, np.zeros(nvar), np.ones(nvar))
    h.changeColsCost(nvar, np.arange(nvar, dtype=np.int32), cost)
    if integer:
        h.changeColsIntegrality(nvar, np.arange(nvar, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * nvar))
    inf = highspy.kHighsInf
    rows: list = []  # (lower, indices, values)
    for r in {eg.find(r) for r in roots}:
        rows.append((1.0, by_class[r], [1.0] * len(by_class[r])))
    for o in shared:
        rows.extend((0.0, [yi[o], xi[n]], [1.0, -1.0]) for n in results[o])
    # a chosen e-node's operand classes have a chosen e-node each; as at most one e-node of a class is
    # chosen, stated once per (class, operand class) over all the class's e-nodes reading it, which the
    # relaxation cannot meet by spreading a class's choice over e-nodes that share their operands
    for c in classes:
        reading: dict = defaultdict(list)
        for i in by_class[c]:
            for k in reads[i]:
                reading[k].append(i)
        for k, ns in sorted(reading.items()):
            if k == c:  # (a node reading its own class can never be chosen)
                rows.extend((0.0, [i], [-1.0]) for i in ns)
                continue
            idx = by_class[k]
            rows.append((0.0, idx + ns, [1.0] * len(idx) + [-1.0] * len(ns)))
    rows.extend(_necessary_rows(classes, by_class, reads))
    for c in classes:  # at most one e-node chosen per class (one suffices; the discounts need it)
        if len(by_class[c]) > 1:
            rows.append((-1.0, by_class[c], [-1.0] * len(by_class[c])))
    for o, same, others in zs:
        z = zi[o]
        rows.append((0.0, [yi[o], z], [1.0, -1.0]))
        rows.append((0.0, [xi[n] for n in same] + [z], [1.0] * len(same) + [-1.0]))
        for u in others:
            rows.append((-1.0, [xi[u], z], [-1.0, -1.0]))
    lo = np.array([r[0] for r in rows])
    starts = np.cumsum([0] + [len(r[1]) for r in rows[:-1]]).astype(np.int32)
    index = np.array([j for r in rows for j in r[1]], dtype=np.int32)
    value = np.array([v for r in rows for v in r[2]])
    h.addRows(len(rows), lo, np.full(len(rows), inf), len(index), starts, index, value)
    return h, nodes, xi, classes, cost, len(rows)


def _necessary_rows(classes: list, by_class: dict, reads: list) -> list:
    """Rows ``sum(class X) >= sum(class C)`` for the classes X every choice of C needs (whichever of
    C's e-nodes is chosen, its operands' choices, all the way down, include X): valid for every acyclic
    choice, and what the relaxation lacks most. Without them a class of two e-nodes on different paths
    down to one class X is met at 1/2 by each, and X, read by both paths at 1/2, is met at 1/2: the
    relaxation halves at every such level (SqueezeNet's fire modules: a bound 82% under the optimum, so
    HiGHS closed the gap by cuts and restarts; with them 1% under it). Stated for the classes of several
    e-nodes, and per such class only for its nearest needed classes (the others follow through the rows
    below them); classes of operand-less e-nodes only (arguments, weights: free) are left out. The
    e-nodes are the program's (``by_class``: class -> their columns; ``reads``: per column, the e-node's
    operand classes), not blocked, so they make an acyclic graph of classes (cycle filtering); a class on a
    cycle left (the program's lazy cuts then handle it) gets no rows."""
    alts = {c: [reads[i] for i in by_class[c]] for c in classes}  # class -> per e-node, its operand classes
    inner = [c for c in classes if any(alts[c])]  # (classes of some e-node with operands)
    bit = {c: 1 << i for i, c in enumerate(inner)}
    need: dict = {c: 0 for c in classes if c not in bit}  # class -> bitset of the classes every choice of it needs
    rows: list = []
    for start in inner:
        if start in need:
            continue
        stack = [(start, iter(sorted({k for ks in alts[start] for k in ks})))]
        need[start] = None  # (on the stack)
        while stack:
            c, it = stack[-1]
            k = next(it, None)
            if k is not None:
                if k not in need:
                    need[k] = None
                    stack.append((k, iter(sorted({q for ks in alts[k] for q in ks}))))
                continue
            stack.pop()
            common = None
            for ks in alts[c]:
                u = 0
                for k in ks:
                    nk = need.get(k)
                    if nk is None:  # (an operand on a cycle: what this e-node needs is not known, so
                        common = 0  # nothing is said of the class, which is safe: fewer rows)
                        break
                    u |= nk
                else:
                    common = u if common is None else common & u
                if common == 0:
                    break
            need[c] = bit[c] | (common or 0)
            if len(alts[c]) > 1 and common:
                implied = 0  # the needed classes that a nearer needed class needs in turn
                rest = common
                while rest:
                    b = rest & -rest
                    rest ^= b
                    implied |= need[inner[b.bit_length() - 1]] & ~b
                near = common & ~implied
                while near:
                    b = near & -near
                    near ^= b
                    x = inner[b.bit_length() - 1]
                    rows.append((0.0, by_class[x] + by_class[c], [1.0] * len(by_class[x]) + [-1.0] * len(by_class[c])))
    return rows


def relaxation(eg: EGraph, costs: Costs, roots: list) -> float:
    """The optimum of the program's linear relaxation: a lower bound on every extraction's cost."""
    h = _program(eg, costs, roots, integer=False)[0]
    h.run()
    return float(h.getInfo().objective_function_value)


class _StallRule:
    """Has HiGHS stop its integer program where its best solution has stood for ``checks`` of HiGHS's
    interrupt checks, and for as many as came before it was found: the solution stands, unproved, with
    its gap. Counted in checks, not seconds, so that where it stops does not depend on the machine's
    speed or load (HiGHS on one thread makes them at the same points of its work every run: a run stays a
    function of its input). Where every op costs about the same (launch-bound 8x8 matmuls) the relaxation
    is weak, and HiGHS finds the best solution early and then spends half a minute proving it.
    ``stalled`` says whether the rule stopped the last run (``reset`` before each run)."""

    def __init__(self, h, checks: int):
        import highspy

        self.kind = highspy.cb.HighsCallbackType
        self.checks = checks
        self.reset()
        h.setCallback(self._callback, None)
        h.startCallback(self.kind.kCallbackMipImprovingSolution)
        h.startCallback(self.kind.kCallbackMipInterrupt)

    def reset(self) -> None:
        self.n, self.best, self.stalled = 0, None, False

    def _callback(self, kind, _message, _out, inp, _data) -> None:
        if kind == self.kind.kCallbackMipImprovingSolution:
            self.best = self.n
        elif kind == self.kind.kCallbackMipInterrupt:
            self.n += 1
            if self.best is not None and self.n - self.best > max(self.checks, self.best):
                self.stalled = True
                inp.user_interrupt = True


def ilp(eg: EGraph, costs: Costs, roots: list, time_limit: float = 10.0,
        max_cuts: int = 50, lp_first: bool = True, stall: int = 0) -> Optional[Extraction]:
    """The optimal acyclic choice (or the best found within ``time_limit``), None if the solver found no
    solution. ``lp_first``: solve the linear relaxation first, and take its optimum where it is integral
    and acyclic (False: the integer program at once, as a check). ``stall`` (0: none): stop where the best
    solution has stood for that many of HiGHS's interrupt checks and as many as came before (``_StallRule``; the
    status is then ``Stalled``)."""
    import highspy
    import numpy as np

    t0 = time.monotonic()
    h, nodes, xi, classes, cost, n_rows = _program(eg, costs, roots, integer=False)
    h.setOptionValue("time_limit", float(time_limit))
    nvar = len(cost)
    inf = highspy.kHighsInf
    cuts = 0
    # the linear relaxation first: where its optimum is integral and acyclic it is the program's optimum
    # (no integer choice costs less than the relaxation's optimum), proved without the MIP's presolve,
    # root cuts and heuristics (NasRNN's first program: 0.09 s against 0.2 s)
    solver_s = solver_cpu_s = 0.0

    stalled = None

    def run():
        nonlocal solver_s, solver_cpu_s
        if stalled is not None:
            stalled.reset()
        t, c = time.monotonic(), time.process_time()
        h.run()
        solver_s += time.monotonic() - t
        solver_cpu_s += time.process_time() - c

    def chosen(x):
        """The graph of a solution's e-nodes (``walk``: its choice and order, or None and a cycle)."""
        picked = {c: sorted((n for n in eg.members[c] if n in xi and x[xi[n]] > 0.5), key=lambda n: costs.cost(n[:3]))
                  for c in classes}
        return walk(eg, roots, lambda c: picked.get(eg.find(c), []))

    if lp_first:
        # (the relaxation by the dual simplex with Devex pricing: NasRNN's first relaxation, 4,783 columns,
        # 129 -> 99 ms, the same solution on every suite program compared; the integer program's own
        # relaxations are no faster with it, so it gets HiGHS's default back below)
        h.setOptionValue("simplex_dual_edge_weight_strategy", 1)
        run()
        h.setOptionValue("simplex_dual_edge_weight_strategy", -1)
    if lp_first and h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        x = np.asarray(h.getSolution().col_value)
        if np.all(np.minimum(np.abs(x), np.abs(1.0 - x)) <= 1e-9):
            x = np.round(x)
            choice, order = chosen(x)
            if choice is not None:
                objective = float(np.dot(cost, x))
                return Extraction(choice, order, total(costs, choice, order, roots), "ilp", objective, "Optimal",
                                  time.monotonic() - t0, 0,
                                  {"variables": nvar, "rows": n_rows, "relaxation": "integral"},
                                  solver_s=solver_s, solver_cpu_s=solver_cpu_s)
    # (the relaxation's solution and basis are dropped: HiGHS 1.16 takes them as the MIP's start, and
    # then reported as optimal a choice dearer than the optimum, as with a start handed to it)
    h.clearSolver()
    h.changeColsIntegrality(nvar, np.arange(nvar, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * nvar))
    if stall > 0:
        stalled = _StallRule(h, stall)
    while True:
        run()
        status = h.modelStatusToString(h.getModelStatus())
        if stalled is not None and stalled.stalled:
            status = "Stalled"
        info = h.getInfo()
        if info.primal_solution_status != 2:  # no feasible solution
            return None
        x = np.asarray(h.getSolution().col_value)
        choice, order = chosen(x)
        if choice is not None:
            # (an optimal status means the bound is the objective)
            objective = float(np.dot(cost, x))
            bound, gap = float(info.mip_dual_bound), float(info.mip_gap)
            if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                bound, gap = objective, 0.0
            elif not (0.0 < bound <= objective * (1 + 1e-9)):
                gap = 1.0
            return Extraction(choice, order, total(costs, choice, order, roots), "ilp",
                              bound if math.isfinite(bound) and gap < 1.0 else None, status,
                              time.monotonic() - t0, cuts, {"variables": nvar, "rows": n_rows + cuts},
                              solver_s=solver_s, solver_cpu_s=solver_cpu_s)
        cycle = order  # (walk returned the cycle's e-nodes)
        if cuts >= max_cuts or time.monotonic() - t0 > time_limit:
            return None
        idx = np.array(sorted({xi[n] for n in cycle}), dtype=np.int32)
        h.addRow(-inf, float(len(idx) - 1), len(idx), idx, np.ones(len(idx)))
        cuts += 1


def extract(eg: EGraph, costs: Costs, roots: list, input_choice: dict, time_limit: float = 10.0,
            stall: int = 0) -> Extraction:
    """The ILP's choice; where it finds none in time, or one dearer than the greedy one or the input's,
    the cheaper of those (the greedy one where acyclic; ``input_choice``: class -> the input graph's
    e-nodes in it). The greedy choice is made only where the ILP's is not proved optimal (no acyclic
    choice costs less than a proved optimum, up to HiGHS's tolerance of 1e-6 ms): on NasRNN it took a
    tenth of the search."""
    t0 = time.monotonic()
    inp, inp_order = walk(eg, roots, lambda c: input_choice.get(eg.find(c), []))
    inp_cost = total(costs, inp, inp_order, roots) if inp is not None else math.inf
    res = ilp(eg, costs, roots, time_limit, stall=stall)
    proved = res is not None and res.status == "Optimal" and res.cost <= inp_cost + 1e-12
    start, start_order, start_cost = None, None, math.inf
    g = None if proved else greedy(eg, costs, roots)
    if g is not None:
        choice, order = walk(eg, roots, lambda c: [g[eg.find(c)]] if eg.find(c) in g else [])
        if choice is not None:
            start, start_order, start_cost = choice, order, total(costs, choice, order, roots)
    if inp is not None and inp_cost <= start_cost:  # (the input is the better start)
        start, start_order, start_cost = inp, inp_order, inp_cost
    solver_s, solver_cpu_s = (0.0, 0.0) if res is None else (res.solver_s, res.solver_cpu_s)
    if start is not None and (res is None or res.cost > start_cost + 1e-12):
        why = "ilp found no solution in time" if res is None else f"ilp's best in time ({res.status}) costs more"
        res = Extraction(start, start_order, start_cost, "greedy" if start is not inp else "input",
                         None if res is None else res.bound, why, time.monotonic() - t0, solver_s=solver_s,
                         solver_cpu_s=solver_cpu_s)
    if res is None:
        res = Extraction(inp, inp_order, inp_cost, "input", None, "no acyclic extraction found", time.monotonic() - t0)
    res.input_cost = inp_cost
    return res
