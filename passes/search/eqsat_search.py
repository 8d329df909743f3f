"""``taso-eqsat-search``: equality saturation with the verified rules and optimal extraction (TENSAT).

The function's graph becomes an e-graph (``eqsat.from_graph``), every rewrite the backtracking search
uses is applied to it until saturation or a limit (``eqsat.saturate``), and the cheapest acyclic graph
it holds is extracted by an integer program (``extract.extract``), priced as the function is written.
The extracted graph is then written into the function: ops of the input that it keeps stay (moved into
an order where operands come first, their operands set to the extracted values), new ops are created
from their kind, attributes and result shapes; what nothing uses any more is removed. Every e-node the
extraction can choose is the input's or the target of a proved rule at a site that passed the rule's
site check, so the extracted graph computes what the input computes (as each rule's proof says).

The report gives the e-graph's size, why saturation stopped, the extraction's method and cost, and the
solver's lower bound: ``cost - bound`` is how far the result can be from the best graph under the rules
and the limits.
"""

from __future__ import annotations

import dataclasses
import math
import time

from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import ir_step, set_operand
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, elem_type, function_dce
from taso_mlir.passes.pipeline import FuncState, FunctionPass, frozen_heap
from taso_mlir.passes.search import eqsat as E
from taso_mlir.passes.search import extract as X
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T


def limits_of(opts: dict) -> E.Limits:
    return E.Limits(iterations=int(opts.get("eqsat-iterations", 4)), nodes=int(opts.get("eqsat-nodes", 20000)),
                    time_s=float(opts.get("eqsat-time", 60.0)), k_multi=int(opts.get("eqsat-k-multi", 1)),
                    chains=bool(opts.get("eqsat-chains", True)), matches=int(opts.get("eqsat-matches", 300_000)))


class Search:
    """One e-graph of the function as it is: saturated (``saturate``, which can go on to more rounds
    where an extraction found nothing cheaper) and extracted (``extract``)."""

    def __init__(self, f: ir.Operation, st: FuncState):
        self.f, self.st = f, st
        self.g0, self.mops = T.from_function(f, st.written)
        self.eg, self.cls = E.from_graph(self.g0)
        self.sat = E.Saturation(self.eg, st.rws)
        self.written = False
        self.stall = int(st.opts.get("eqsat-ilp-stall", 100))

    def saturate(self, lim: E.Limits) -> E.Stats:
        """Rounds until ``lim.iterations`` are done in all (``E.Saturation.run``)."""
        self.eg.blocked = set()  # (the last extraction's cycle filter: made again below)
        return self.sat.run(lim)

    def extract(self, stats: E.Stats, ilp_time: float, bar: float = math.inf) -> dict:
        """Extract, and write the result into ``f`` where it is cheaper than ``f`` as the e-graph prices it
        and than ``bar`` (the last round's result); returns what the report says of it (``stats``: the
        saturation's since the last extraction)."""
        tick, tick_cpu = time.monotonic(), time.process_time()
        eg, cls, g0, st = self.eg, self.cls, self.g0, self.st
        blocked = eg.filter_cycles()
        filter_s, filter_cpu_s = time.monotonic() - tick, time.process_time() - tick_cpu
        roots = [eg.find(cls[v]) for v in g0.outputs]
        costs = X.Costs(eg, st.written)
        input_choice: dict = {}
        original: dict = {}  # canonical op key -> node id of the input
        for (nid, j), c in cls.items():
            n = g0.nodes[nid]
            op = _op_key(eg, n, nid, cls)
            original.setdefault(op, nid)
            input_choice.setdefault(eg.find(c), []).append(op + (j,))
        ex = X.extract(eg, costs, roots, input_choice, ilp_time, self.stall)
        better = ex.cost < min(ex.input_cost, bar) - 1e-12
        new_ops = write(self.f, eg, ex, g0, self.mops, original, cls, costs) if better else 0
        self.written = self.written or better
        return {
            "enodes": eg.num_nodes(), "eclasses": len(eg.classes()), "iterations": self.sat.it,
            "stop": stats.stop, "matches": stats.matches, "applied": stats.applied,
            "lifted": stats.lifted, "saturation_s": round(stats.time_s, 3),
            "extraction": ex.method, "status": ex.status, "cost_ms": ex.cost, "bound_ms": ex.bound,
            "gap": ex.gap, "cycle_cuts": ex.cuts, "blocked": blocked, "solve_s": round(ex.solve_s, 3),
            "filter_s": round(filter_s, 3), "solver_s": round(ex.solver_s, 3),
            # (the same three as CPU time: what a loaded machine's other work does not add to)
            "tensat_cpu_s": round(stats.cpu_s + filter_cpu_s + ex.solver_cpu_s, 3),
            "new_ops": new_ops, "rejected": dict(sorted(stats.rejected.items(), key=lambda kv: -kv[1])[:8]),
            "time_s": round(time.monotonic() - tick + stats.time_s, 3), "input_cost_ms": ex.input_cost,
            "written": better,
        }


def _op_key(eg: E.EGraph, n: T.Node, nid: int, cls: dict) -> tuple:
    if n.kind == "arg" or n.kind.startswith("other:") or n.kind == "weight":
        attrs = (("@node", nid),) + tuple(n.attrs)
    else:
        attrs = E.key_attrs(n.kind, n.attrs, n.operands, list(n.shapes) or [None], n.dtype)
    return eg.canon((n.kind, attrs, tuple(cls[v] for v in n.operands), 0))[:3]


@ir_step
def write(f: ir.Operation, eg: E.EGraph, ex: X.Extraction, g0: T.TGraph, mops: list, original: dict,
          cls: dict, costs: X.Costs) -> int:
    """Make ``f`` compute the extracted graph; returns the number of ops created. A commutative op's
    operands go in the order that costs less (``costs.swapped``; its e-node stands for both orders), an
    op of the input's keeping its own where both cost the same."""
    block = f.regions[0].blocks[0]
    ret = next(o.operation for o in block.operations if o.operation.name == "func.return")
    args = list(block.arguments)
    value: dict = {}  # class -> ir.Value
    made = 0
    for op in ex.order:
        kind, attrs, kids = op
        nid = original.get(op)
        operands = [value[eg.find(k)] for k in kids]
        swap = costs.swapped(op)
        if swap is None and len(kids) == 2 and kind in RB.COMMUTATIVE and nid is not None:
            # (both orders cost the same: an op of the input keeps its own)
            swap = [eg.find(cls[v]) for v in g0.nodes[nid].operands] == [eg.find(k) for k in kids[::-1]]
        if swap:
            operands.reverse()
        if kind == "arg":
            results = [args[dict(attrs)["@node"]]]
        elif nid is not None and mops[nid] is not None:  # an op of the input: kept, after its operands
            o = mops[nid]
            for i, v in enumerate(operands):
                if o.operands[i] != v:
                    set_operand(o, i, v)
            o.move_before(ret)
            results = list(o.results)
        elif kind in ("weight",) or kind.startswith("other:"):
            raise TasoError(f"internal error: @{ir.StringAttr(f.attributes['sym_name']).value}: the extracted "
                            f"graph has an op of the input ({kind}) that is not in the function")
        else:
            types = []
            j = 0
            while True:
                r = eg.result_class(op, j)
                if r is None:
                    break
                et = elem_type(operands[0]) if operands else ir.F32Type.get()
                types.append(ir.RankedTensorType.get(list(eg.shape[r]), et))
                j += 1
            with ir.InsertionPoint(ret), ret.location:
                o = create_taso_op(kind, operands, types, E.op_attrs(attrs), loc=ret.location)
            results = list(o.results)
            made += 1
        for j, r in enumerate(results):
            c = eg.result_class(op, j)
            if c is not None:
                value[c] = r
    for i, v in enumerate(g0.outputs):
        new = value[eg.find(cls[v])]
        if ret.operands[i] != new:
            set_operand(ret, i, new)
    function_dce(f)
    return made


def _round(rep: dict) -> dict:
    return {k: rep[k] for k in ("input_cost_ms", "cost_ms", "enodes", "saturation_s", "filter_s", "solve_s", "solver_s",
                                "tensat_cpu_s",
                                "status", "bound_ms", "gap", "cycle_cuts",
                                "blocked", "matches", "applied", "lifted", "stop", "written", "depth", "ilp_limit_s")}


@frozen_heap
def _run(st: FuncState) -> None:
    lim = limits_of(st.opts)
    restarts = int(st.opts.get("eqsat-restarts", 8))
    step = min(lim.iterations, int(st.opts.get("eqsat-step", 1)))
    ilp_time = float(st.opts.get("eqsat-ilp-time", 30.0))
    confirm = float(st.opts.get("eqsat-confirm-time", 1.0))
    # (the rewrites of distinct forms: made once a process with the rules, as their loading, before the
    # search's clock starts)
    E.distinct_rewrites(st.rws)
    compiled0 = E._CODE.compiled
    t0 = time.monotonic()
    s = Search(st.f, st)
    rep = s.extract(s.saturate(dataclasses.replace(lim, iterations=step)), ilp_time)
    rep["depth"] = step
    rep["ilp_limit_s"] = ilp_time
    rounds = [_round(rep)]
    matches = rep["matches"]
    confirm_s = 0.0  # the confirming rounds' extractions so far
    for _ in range(restarts):
        if matches >= lim.matches or time.monotonic() - t0 > lim.time_s:
            break
        limit = ilp_time
        confirming = False
        if rep["written"]:
            depth = step
            s = Search(st.f, st)  # a restart: the e-graph of the graph just written
        elif rep["depth"] < lim.iterations:
            # a shallow round found nothing: look deeper from the same graph, in the same e-graph (its
            # rounds go on: the same e-graph a restart saturated to this depth would have)
            depth = lim.iterations
            confirming = True
        else:
            break
        left = max(0.1, lim.time_s - (time.monotonic() - t0))
        stats = s.saturate(dataclasses.replace(lim, iterations=depth, time_s=left, matches=lim.matches - matches))
        if confirming:
            # the confirming round (the deep one, from a graph a shallow round could not improve): the
            # confirming rounds' programs together may take eqsat-confirm-time times the rest of the
            # search, 1 s at least each. Such a round finds a cheaper graph rarely (3% of fuzzed models),
            # and its e-graph can be one whose relaxation is weak (a fuzzed chain of 8x8 matmuls: 9,163
            # e-nodes, 18% under the optimum, unproved in 30 s)
            rest = time.monotonic() - t0 - confirm_s
            limit = min(limit, max(1.0, confirm * rest - confirm_s))
        limit = min(limit, max(0.5, left))
        rep = s.extract(stats, limit, bar=rep["cost_ms"])
        if confirming:
            confirm_s += rep["solve_s"]
        rep["depth"] = depth
        rep["ilp_limit_s"] = round(limit, 3)
        rounds.append(_round(rep))
        matches += rep["matches"]
    rep["round_costs"] = rounds
    for k in ("saturation_s", "filter_s", "solve_s", "solver_s", "matches", "applied", "lifted"):
        rep[k] = round(sum(r[k] for r in rounds), 3)
    rep["time_s"] = round(time.monotonic() - t0, 3)
    # the time as TENSAT's own figures count it (its analysis/stats.py: the runner's saturation, cycle
    # filtering included, plus the ILP solver's wall time; the e-graph built from the model, the program
    # built from the e-graph and the graph written back are outside both): every round's saturation, cycle
    # filter and HiGHS runs
    rep["tensat_counted_s"] = round(sum(r["saturation_s"] + r["filter_s"] + r["solver_s"] for r in rounds), 3)
    rep["tensat_counted_cpu_s"] = round(sum(r["tensat_cpu_s"] for r in rounds), 3)
    rep["matchers_compiled"] = E._CODE.compiled - compiled0  # (the others' code was on disk: E.CodeCache)
    E._CODE.save()
    st.count("eqsat_ops_created", rep["new_ops"])
    for key in ("enodes", "eclasses", "iterations", "matches", "applied"):
        st.count(f"eqsat_{key}", rep[key])
    st.extra.update(history=[], cost_searched_ms=rep["cost_ms"], timed_out=rep["stop"] == "time",
                    rejected_sites=rep["rejected"], search_s=rep["time_s"], eqsat=rep)


PASS = FunctionPass(
    "taso-eqsat-search", "Equality saturation with the verified rules and the cheapest acyclic graph the "
    "e-graph holds, extracted by an integer program (HiGHS)", _run,
    {"eqsat_ops_created": "ops the extracted graph created"}, needs_rules=True, group="search",
    work={"eqsat_enodes": "e-nodes", "eqsat_eclasses": "e-classes", "eqsat_iterations": "saturation rounds",
          "eqsat_matches": "rule matches", "eqsat_applied": "rule matches that grew the e-graph"})
