"""The project's e-graph (``passes/search/eqsat.py``) against egglog (Rust, through its Python bindings), measured.

Issue 23 asked to choose the e-graph engine by measurement. This script builds, for each suite model, the
e-graph that ``taso-search{strategy=eqsat}`` starts from (the function after the prepare passes and the
matmul flattening, captured where ``eqsat_search.Search`` calls ``eqsat.from_graph``), in both engines,
saturates it with the same rewrites for the same number of rounds, and compares the e-graphs' sizes
(e-nodes, e-classes, after every round) and the wall time of the saturation.

**The rewrites: the structural subset.** The project checks every match in Python (``rulebook.check_local``)
and computes the target's attributes from the site's shapes (``rulebook.dst_op_attrs``); an egglog rule has
neither. The subset is every rewrite of the library that needs no shape to be stated (no attribute derived
from shapes on either side: no split (its sizes), no constant op (its shape), no ``pads="same"``, no
``group="grouped"``, no symbolic stride ``strides="s"``). What ``check_local`` still checks for those is
encoded structurally, so that no Python runs per match:

- attributes: part of the egglog constructor's name (``O<k>`` stands for one (kind, complete attributes,
  operand ranks, result rank)); both engines compare complete attributes;
- ranks: the operand and result ranks are part of the name too, so a rule made at the generator's ranks
  matches only ops of those ranks; a rank-free rule (every op elementwise) is instantiated once per rank
  assignment the model has;
- equal operand shapes of ewadd/ewmul, float element types, static shapes: the model's ops that break them
  get a name of their own (``|bcast``, ``|nonfloat``) that no rule uses; the ops rules create satisfy them
  where the source did;
- commutativity of ewadd/ewmul: the project's hash-cons sorts the operands (one e-node); egglog gets both
  operand orders in the same e-class wherever such an op is made, and its e-node count is read back with the
  two orders counted once;
- two source ops of a rule are two ops (the project's matcher); egglog rules do not say so (see
  ``EgglogProgram._rule``): a match of two source ops on one e-node, which only a cycle in the e-graph
  allows, would make the sizes differ.

Shapes themselves are not modelled in egglog. What the structural encoding cannot express (the target
type-checks at the site with the source's output shapes, every dimension >= 1) is counted: the project
runs the same subset with its site check on, and every match it refuses is reported (``rejected``); where
that is 0, the two engines apply exactly the same matches and their sizes must agree. Both run without
the project's own extensions egglog lacks: merge chains (``Limits(chains=False)``), the elementwise lifting
(``eqsat.lift_elementwise``, switched off inside this script only), multi-output rewrites in every round
(``k_multi`` = rounds), and no node/match caps.

Also measured: what the whole library would need (how many rewrites need shapes, and why; multi-output
rules), and what a call back into Python per match costs egglog (a ``py-call`` condition on every rule),
on one model.

    python -m taso_mlir.benchmarks.egglog_compare [--models squeezenet,nasrnn,bert-b1,inception3]
        [--rounds 3] [--quick] [--out DIR] [--callback-model squeezenet]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from typing import Optional

from taso_mlir.dialect import specs
from taso_mlir.generator import graph as G
from taso_mlir.passes.search import eqsat as E
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T

MODELS = ("squeezenet", "nasrnn", "bert-b1", "inception3")
COMMUTATIVE = RB.COMMUTATIVE
#: ops whose result rank is their first operand's
_SAME_RANK = frozenset({"ewadd", "ewmul", "relu", "smul", "matmul", "concat"})
#: ops whose result is NCHW
_RANK4 = frozenset({"conv2d", "maxpool2d", "avgpool2d", "enlarge"})


# ---------------------------------------------------------------------------------------------------------
# the rewrites


def shape_needs(rw: RB.Rewrite) -> list:
    """Why a rewrite cannot be stated without the site's shapes (empty: it can)."""
    why = set()
    for op in rw.src.ops + rw.dst.ops:
        a = dict(op.attrs)
        if op.name == "split":
            why.add("split sizes")
        if op.name in specs.CONSTANTS:
            why.add("constant shape")
        if a.get("pads") == "same":
            why.add("pads=same")
        if a.get("group") == "grouped":
            why.add("group=grouped")
        if a.get("strides") == "s":
            why.add("symbolic stride")
    return sorted(why)


def census(rws: list) -> dict:
    """What the whole library needs of an engine."""
    why = Counter()
    need = 0
    for rw in rws:
        w = shape_needs(rw)
        need += bool(w)
        why.update(w)
    multi = [rw for rw in rws if len(rw.src.outputs) > 1]
    return {
        "rewrites": len(rws),
        "need_shapes": need,
        "need_shapes_why": dict(why.most_common()),
        "structural": len(rws) - need,
        "multi_output": len(multi),
        "multi_output_structural": sum(1 for rw in multi if not shape_needs(rw)),
        "rank_free": sum(rw.rank_free for rw in rws),
        "symbolic_stride": sum(rw.stride_op is not None for rw in rws),
    }


def structural(rws: list) -> list:
    return [rw for rw in rws if not shape_needs(rw)]


def _rank(kind: str, attrs: dict, ranks: list) -> int:
    if kind in _SAME_RANK:
        return ranks[0]
    if kind in _RANK4:
        return 4
    if kind == "transpose":
        return len(attrs["perm"])
    raise KeyError(kind)


# ---------------------------------------------------------------------------------------------------------
# egglog


class EgglogProgram:
    """One model's e-graph and the structural rewrites as an egglog program (text)."""

    def __init__(self, eg0: E.EGraph, rws: list, callback: Optional[str] = None):
        self.names: dict = {}  # (kind, attrs, operand ranks, result rank, mark) -> constructor
        self.arity: dict = {}
        self.decls: list = []
        self.callback = callback  # a py-object literal called on every match (None: no call back)
        self.init = self._initial(eg0)
        ranks = sorted({len(s) for s in eg0.shape if s is not None})
        self.rules = []
        self.skipped = Counter()
        for i, rw in enumerate(rws):
            try:
                self.rules.extend(self._rules(i, rw, ranks))
            except KeyError as e:
                self.skipped[f"op {e.args[0]}"] += 1

    def name(self, kind: str, attrs: tuple, ranks: tuple, rank, mark: str = "", arity: int = 0) -> str:
        key = (kind, attrs, ranks, rank, mark)
        n = self.names.get(key)
        if n is None:
            n = self.names[key] = f"O{len(self.names)}"
            self.arity[n] = arity
        return n

    def _initial(self, eg: E.EGraph) -> list:
        """The e-graph as ``let`` commands: one global per e-class, made by its first e-node; another
        e-node of the class (a fused conv's or matmul's, beside the relu of the op without activation:
        ``eqsat.from_graph``) is a ``union`` with it."""
        lines = []
        var: dict = {}
        for node, c in sorted(eg.memo.items(), key=lambda nc: eg.find(nc[1])):
            kind, attrs, kids, j = node
            c = eg.find(c)
            if any(a[0] == "@node" for a in attrs):  # arg, weight, opaque op: an e-node of its own (its node id)
                nid = dict(attrs)["@node"]
                f = self.name("@leaf", (), (), len(kids), arity=len(kids))
                term = f"({f} {nid}{''.join(' ' + var[eg.find(k)] for k in kids)})"
            else:
                shapes = [eg.shape[eg.find(k)] for k in kids]
                mark = ""
                if eg.shape[c] is None or any(s is None for s in shapes):
                    mark = "|noshape"
                elif eg.dtype[c] not in RB.FLOAT_TYPES:
                    mark = "|nonfloat"
                elif kind in ("ewadd", "ewmul") and shapes[0] != shapes[1]:
                    mark = "|bcast"
                ranks = tuple(len(s) if s is not None else None for s in shapes)
                rank = len(eg.shape[c]) if eg.shape[c] is not None else None
                attrs = E.op_attrs(attrs) if kids else attrs
                attrs = T.attrs_tuple(attrs) if isinstance(attrs, dict) else attrs
                f = self.name(kind, attrs, ranks, (rank, j), mark, len(kids))
                args = [var[eg.find(k)] for k in kids]
                term = f"({f}{''.join(' ' + a for a in args)})"
                if kind in COMMUTATIVE and len(args) == 2 and args[0] != args[1]:
                    term2 = f"({f} {args[1]} {args[0]})"
                    v = f"$c{c}"
                    var[c] = v
                    lines.append(f"(let {v} {term})")
                    lines.append(f"(union {v} {term2})")
                    continue
            if c in var:
                lines.append(f"(union {var[c]} {term})")
                continue
            v = f"$c{c}"
            var[c] = v
            lines.append(f"(let {v} {term})")
        return lines

    def _rank_assignments(self, rw: RB.Rewrite, ranks: list) -> list:
        """Variable -> rank: the generator's, or for a rank-free rule every assignment the model has (the
        variables that elementwise ops tie together share one; a smul's scalar is rank 0)."""
        if not rw.rank_free:
            return [dict(rw.gen_ranks)]
        parent = {v: v for v in rw.gen_ranks}
        ref_var: dict = {}

        def find(v):
            while parent[v] != v:
                v = parent[v]
            return v

        scalars = set()
        for g in (rw.src, rw.dst):
            for k, op in enumerate(g.ops):
                ins = list(op.operands)
                if op.name == "smul":
                    if G.parse_ref(ins[1]) is None:
                        scalars.add(ins[1])
                    ins = ins[:1]
                roots = [r if G.parse_ref(r) is None else ref_var.get((id(g), r)) for r in ins]
                roots = [r for r in roots if r is not None]
                for r in roots[1:]:
                    parent[find(r)] = find(roots[0])
                if roots:
                    ref_var[(id(g), G.op_ref(k, 0, 1))] = roots[0]
        groups = sorted({find(v) for v in rw.gen_ranks if v not in scalars})
        out = []
        for combo in _product([ranks] * len(groups)):
            rk = dict(zip(groups, combo))
            out.append({v: (0 if v in scalars else rk[find(v)]) for v in rw.gen_ranks})
        return out

    def _rules(self, i: int, rw: RB.Rewrite, ranks: list) -> list:
        out = []
        for inst, vr in enumerate(self._rank_assignments(rw, ranks)):
            out.extend(self._rule(f"{rw.id}.{inst}", i, rw, vr))
        return out

    def _side(self, g: G.Graph, vr: dict) -> list:
        """Per op: (constructor, operand refs)."""
        rk = dict(vr)
        ops = []
        for k, op in enumerate(g.ops):
            a, _hint = G.spec_attrs(op, {})
            full = specs.spec(op.name).complete_attrs(a)
            full = {n: tuple(x) if isinstance(x, (list, tuple)) else x for n, x in full.items()}
            in_ranks = tuple(rk[r] for r in op.operands)
            r = _rank(op.name, full, list(in_ranks))
            rk[G.op_ref(k, 0, 1)] = r
            ops.append((self.name(op.name, T.attrs_tuple(full), in_ranks, (r, 0), "", len(op.operands)),
                        op.operands))
        return ops

    def _rule(self, rid: str, i: int, rw: RB.Rewrite, vr: dict) -> list:
        src, dst = self._side(rw.src, vr), self._side(rw.dst, vr)

        def term(ref: str, prefix: str) -> str:
            p = G.parse_ref(ref)
            return f"?{ref}" if p is None else f"?__{prefix}{p[0]}"  # (not a rule variable's name: s1 is one)

        facts = []
        for k, (f, refs) in enumerate(src):
            facts.append(f"(= ?__s{k} ({f}{''.join(' ' + term(r, 's') for r in refs)}))")
        # (the project's matcher binds two source ops to two distinct e-nodes; egglog's ``!=`` on the operand
        # classes could say so, with one rule variant per way two ops can differ (64 for three ewadds): left
        # out; where it matters the sizes would differ, and the comparison says so)
        alts = [[]]
        if self.callback is not None:
            facts.append(f"(= true (py-to-bool (py-call {self.callback} (py-from-int {i}))))")
        acts = []
        for k, (f, refs) in enumerate(dst):
            args = [term(r, "s") if G.parse_ref(r) is None else f"?__d{G.parse_ref(r)[0]}" for r in refs]
            acts.append(f"(let ?__d{k} ({f}{''.join(' ' + a for a in args)}))")
            if rw.dst.ops[k].name in COMMUTATIVE and len(args) == 2:
                acts.append(f"(union ?__d{k} ({f} {args[1]} {args[0]}))")
        for rs, rd in zip(rw.src.outputs, rw.dst.outputs):
            pd = G.parse_ref(rd)
            acts.append(f"(union ?__s{G.parse_ref(rs)[0]} {'?' + rd if pd is None else f'?__d{pd[0]}'})")
        out = []
        for v, al in enumerate(alts):
            out.append(f"(rule ({' '.join(facts + al)}) ({' '.join(acts)}) :ruleset rw :name \"{rid}.{v}\")")
        return out

    def text(self) -> str:
        """The declarations and the e-graph (the rules are ``self.rules``)."""
        ctors = " ".join(f"({n} {'i64 ' if k[0] == '@leaf' else ''}{' '.join(['T'] * self.arity[n])})"
                         for k, n in self.names.items())
        return "\n".join([f"(datatype T {ctors})", *self.init, "(ruleset rw)"])

    def load(self, eg) -> None:
        """Into a ``bindings.EGraph``: the rules one command at a time (egglog 13.2 given them all in one
        ``run_program`` call grew to gigabytes: 500 rules, 3.8 GB; one at a time, 400 rules took 7 MB)."""
        eg.run_program(*eg.parse_program(self.text()))
        for r in self.rules:
            eg.run_program(*eg.parse_program(r))


def _product(lists: list) -> list:
    out = [()]
    for xs in lists:
        out = [o + (x,) for o in out for x in xs]
    return out


def egglog_sizes(eg) -> tuple[int, int]:
    """(e-nodes, e-classes) of an egglog e-graph, an ewadd/ewmul counted once for its two operand orders."""
    data = json.loads(eg.serialize([]).to_json())
    nodes = data["nodes"]
    cls_of = {nid: n["eclass"] for nid, n in nodes.items()}
    keys = set()
    classes = set()
    for nid, n in nodes.items():
        if not n["eclass"].startswith("T-"):
            continue
        classes.add(n["eclass"])
        kids = [cls_of[k] for k in n["children"]]
        if n["op"] in _COMM_NAMES and len(kids) == 2:
            kids = sorted(kids)
        keys.add((n["op"], tuple(kids)))
    return len(keys), len(classes)


_COMM_NAMES: set = set()  # constructors of ewadd/ewmul (set by run_egglog)

#: matches the call back saw (``_check``, called from egglog through a py-object; pickled by reference)
CALLS = [0]


def _check(i) -> bool:
    CALLS[0] += 1
    return True


def run_egglog(eg0: E.EGraph, rws: list, rounds: int, callback: bool = False) -> dict:
    from egglog import bindings as B

    cb = None
    if callback:
        import cloudpickle

        cb = f'(py-object "{base64.standard_b64encode(cloudpickle.dumps(_check)).decode()}")'
    t = time.perf_counter()
    prog = EgglogProgram(eg0, rws, cb)
    _COMM_NAMES.clear()
    _COMM_NAMES.update(n for k, n in prog.names.items() if k[0] in COMMUTATIVE)
    text = prog.text()
    gen_s = time.perf_counter() - t
    eg = B.EGraph()
    t = time.perf_counter()
    prog.load(eg)
    load_s = time.perf_counter() - t
    sizes = [egglog_sizes(eg)]
    run_s = 0.0
    matches = 0
    CALLS[0] = 0
    run = eg.parse_program("(run rw 1)")
    for _ in range(rounds):
        t = time.perf_counter()
        out = eg.run_program(*run)
        run_s += time.perf_counter() - t
        matches += sum(out[-1].report.num_matches_per_rule.values())
        sizes.append(egglog_sizes(eg))
    return {"rules": len(prog.rules), "constructors": len(prog.names), "program_chars": len(text) + sum(map(len, prog.rules)),
            "skipped": dict(prog.skipped), "generate_s": round(gen_s, 3), "load_s": round(load_s, 3),
            "saturate_s": round(run_s, 3), "matches": matches, "python_calls": CALLS[0],
            "sizes": [list(s) for s in sizes]}


# ---------------------------------------------------------------------------------------------------------
# the project's engine


@contextlib.contextmanager
def no_lifting():
    """``eqsat.saturate`` always adds the elementwise lifting (not a rule; egglog has no counterpart):
    switched off here, for this script only."""
    saved = E.lift_elementwise
    E.lift_elementwise = lambda *a, **k: False
    try:
        yield
    finally:
        E.lift_elementwise = saved


def run_project(g0: T.TGraph, rws: list, rounds: int, defaults: bool = False) -> dict:
    """``defaults``: the project's own limits and extensions (chains, lifting, k_multi 1, node and match
    caps), as ``taso-search{strategy=eqsat}`` runs (the whole library uncapped explodes: every pair of
    siblings merged in every round)."""
    eg, _ = E.from_graph(g0)
    sizes = [(eg.num_nodes(), len(eg.classes()))]
    lim = E.Limits(iterations=rounds, nodes=10 ** 9, time_s=1e9, k_multi=rounds, chains=False,
                   matches_per_rewrite=10 ** 9, matches=10 ** 12)
    per_round = []
    with (contextlib.nullcontext() if defaults else no_lifting()):
        st = E.saturate(eg, rws, E.Limits(iterations=rounds) if defaults else lim, log=per_round.append)
    for line in per_round:  # "iteration i: N e-nodes, M e-classes"
        w = line.split()
        sizes.append((int(w[2]), int(w[4])))
    while len(sizes) <= rounds and st.stop == "saturated":  # (a round that changes nothing: egglog runs it)
        sizes.append(sizes[-1])
    return {"saturate_s": round(st.time_s, 3), "matches": st.matches, "applied": st.applied,
            "rejected": dict(st.rejected), "stop": st.stop, "iterations": st.iterations,
            "sizes": [list(s) for s in sizes]}


# ---------------------------------------------------------------------------------------------------------
# the starting graph


class _Captured(BaseException):
    pass


def starting_graph(name: str, quick: bool = False) -> tuple[T.TGraph, list]:
    """The graph ``taso-search{strategy=eqsat}`` builds its first e-graph from, and the rewrites it uses."""
    import onnx

    from taso_mlir.benchmarks import suite
    from taso_mlir.passes.search import taso_search
    from taso_mlir.tools.taso_opt import main

    got = {}
    real = E.from_graph

    def capture(g):
        got["g"] = g
        raise _Captured

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, f"{name}.onnx")
        onnx.save(suite.build(name, quick), src)
        E.from_graph = capture
        try:
            main([src, "-o", os.path.join(d, "out.onnx"),
                  "--pass-pipeline=builtin.module(taso-search{target=analytic:t4 strategy=eqsat})", "--no-progress"],
                 contain=False)
        except _Captured:
            pass
        finally:
            E.from_graph = real
    if "g" not in got:
        raise RuntimeError(f"{name}: the eqsat search never built an e-graph")
    return got["g"], taso_search.rewrites()


# ---------------------------------------------------------------------------------------------------------


def compare(name: str, rounds: int, quick: bool = False, full: bool = True) -> dict:
    g0, rws = starting_graph(name, quick)
    sub = structural(rws)
    eg0, _ = E.from_graph(g0)
    kinds = Counter(n[0] for n in eg0.memo)
    res = {"model": name, "quick": quick, "rounds": rounds, "rewrites": len(sub),
           "start": {"enodes": eg0.num_nodes(), "eclasses": len(eg0.classes()),
                     "kinds": dict(kinds.most_common())}}
    res["project"] = run_project(g0, sub, rounds)
    res["egglog"] = run_egglog(eg0, sub, rounds)
    res["agree"] = res["project"]["sizes"] == res["egglog"]["sizes"]
    if full:  # the project's engine with the whole library, for scale (its own limits)
        res["project_full_library"] = run_project(g0, rws, rounds, defaults=True)
    return res


def callback_cost(name: str, rounds: int, quick: bool = False) -> dict:
    g0, rws = starting_graph(name, quick)
    sub = structural(rws)
    eg0, _ = E.from_graph(g0)
    # (best of 3 each: the difference is small next to this machine's noise)
    plain = min((run_egglog(eg0, sub, rounds) for _ in range(3)), key=lambda r: r["saturate_s"])
    called = min((run_egglog(eg0, sub, rounds, callback=True) for _ in range(3)), key=lambda r: r["saturate_s"])
    extra = called["saturate_s"] - plain["saturate_s"]
    return {"model": name, "rounds": rounds, "plain_s": plain["saturate_s"], "with_callback_s": called["saturate_s"],
            "python_calls": called["python_calls"], "matches_plain": plain["matches"],
            "us_per_call": round(1e6 * extra / max(1, called["python_calls"]), 2),
            "sizes_equal": plain["sizes"] == called["sizes"]}


def markdown(results: list, cen: dict, cb: Optional[dict], machine: str) -> str:
    L = [f"# Project e-graph vs egglog {_egglog_version()} (structural rewrites)", "", machine, "",
         "| model | rounds | rewrites | start e-nodes / e-classes | project e-nodes / e-classes | "
         "egglog e-nodes / e-classes | agree | project s | egglog s | project rejected | project, whole library: "
         "e-nodes, s (its limits) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p, e = r["project"], r["egglog"]
        full = r.get("project_full_library")
        L.append(f"| {r['model']} | {r['rounds']} | {r['rewrites']} | {r['start']['enodes']} / {r['start']['eclasses']} | "
                 f"{p['sizes'][-1][0]} / {p['sizes'][-1][1]} | {e['sizes'][-1][0]} / {e['sizes'][-1][1]} | "
                 f"{'yes' if r['agree'] else 'NO'} | {p['saturate_s']} | {e['saturate_s']} | "
                 f"{sum(p['rejected'].values())} | "
                 f"{(str(full['sizes'][-1][0]) + ', ' + str(full['saturate_s'])) if full else '-'} |")
    L += ["", "egglog s: the `(run rw 1)` commands only (not generating or loading the program; not reading "
          "the sizes back). project s: `eqsat.saturate`.", "",
          f"Library: {cen['rewrites']} rewrites; {cen['need_shapes']} need the site's shapes "
          f"({', '.join(f'{k} {v}' for k, v in cen['need_shapes_why'].items())}; a rewrite may have several); "
          f"{cen['structural']} structural; {cen['multi_output']} multi-output, "
          f"{cen['multi_output_structural']} of them structural."]
    if cb:
        L += ["", f"Call back into Python per match ({cb['model']}, {cb['rounds']} rounds): "
              f"{cb['python_calls']} calls, {cb['plain_s']} s without, {cb['with_callback_s']} s with: "
              f"{cb['us_per_call']} us a call."]
    return "\n".join(L) + "\n"


def _egglog_version() -> str:
    try:
        from importlib.metadata import version

        return version("egglog")
    except Exception:
        return "?"


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.benchmarks.egglog_compare")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the suite's tiny models")
    ap.add_argument("--no-full", action="store_true", help="skip the project's run with the whole library")
    ap.add_argument("--callback-model", default="squeezenet", help="'' to skip the call-back measurement")
    ap.add_argument("--machine", default="", help="what machine this is, for the report")
    ap.add_argument("--out", default="", help="a folder for results.json and results.md")
    a = ap.parse_args(argv)
    try:
        import egglog.bindings
    except ImportError:
        print("egglog is not installed (pip install 'taso-mlir[egglog]')", file=sys.stderr)
        return 1
    del egglog
    results = []
    for name in [m for m in a.models.split(",") if m]:
        r = compare(name, a.rounds, a.quick, not a.no_full)
        results.append(r)
        p, e = r["project"], r["egglog"]
        print(f"{name}: project {p['sizes']} {p['saturate_s']} s (rejected {p['rejected']}); "
              f"egglog {e['sizes']} {e['saturate_s']} s; agree {r['agree']}", flush=True)
    cb = callback_cost(a.callback_model, a.rounds, a.quick) if a.callback_model else None
    if cb:
        print(f"call back: {cb}")
    from taso_mlir.passes.search import taso_search

    cen = census(taso_search.rewrites())
    machine = a.machine or f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    doc = {"egglog": _egglog_version(), "machine": machine, "library": cen, "models": results, "callback": cb}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(markdown(results, cen, cb, machine))
    print(markdown(results, cen, cb, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
