"""Prove rules from the operator axioms with Z3, one proof per mapped output, each under a timeout.

A rule's two graphs are translated into terms over the uninterpreted tensor sort of
``axioms.Z3Algebra`` (input variables become constants); for each output pair the solver gets every
axiom (tracked, so the unsat core names the axioms the proof used) and the negated equation, and must
answer unsat. ``unknown`` (timeout or incompleteness) and ``sat`` exclude the rule, with the reason.

``prove_many`` runs proofs in worker processes; a worker that overruns its rule's time budget (Z3
not honouring its own timeout) is killed and replaced, so nothing can hang.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait

from ..dialect import specs
from ..generator import graph as G
from . import shapes as SH
from .axioms import ACT, AXIOMS, Z3Algebra, kcode, scode


class Untranslatable(Exception):
    pass


#: the ops whose stride a rule may state symbolically
WINDOW_OPS = ("conv2d", "maxpool2d", "avgpool2d")


def _act(attrs: dict) -> int:
    """The axioms' activation code (0 none, 1 relu); an activation they do not cover (relu6) cannot be
    translated, so no rule with one is proved."""
    act = attrs.get("activation", "none")
    if act not in ACT:
        raise Untranslatable(f"activation {act}")
    return ACT[act]


def generalize_strides(g: G.Graph) -> G.Graph:
    """``g`` with every window op's stride (1, 1) replaced by the shared symbolic stride ``"s"``."""
    ops = []
    for op in g.ops:
        if op.name in WINDOW_OPS and op.attr("strides") == (1, 1):
            op = G.Op(op.name, tuple((k, "s" if k == "strides" else v) for k, v in op.attrs), op.operands,
                      op.num_results)
        ops.append(op)
    return G.Graph(tuple(ops), g.outputs)


def has_unit_strides(g: G.Graph) -> bool:
    return any(op.name in WINDOW_OPS and op.attr("strides") == (1, 1) for op in g.ops)


#: the rank of a generator input variable by its name's first letter (the generator's naming: x, w
#: matrices; i activations, c and d kernels; s scalars; b biases), for callers that give no ranks
NAME_RANKS = {"x": 2, "w": 2, "i": 4, "c": 4, "d": 4, "s": 0, "b": 1}

#: the values a rule's symbolic stride takes in a proof: those the search applies it at
#: (``rulebook.SYMBOLIC_STRIDES``), each validated for every stride axiom
PROOF_STRIDES = ((1, 1), (2, 2))


def default_ranks(names) -> dict:
    return {v: NAME_RANKS[v[0]] for v in names}


def translate(g: G.Graph, A: Z3Algebra, variables: dict) -> tuple[list, list]:
    """The outputs of ``g`` as shaped Z3 terms, and every value of ``g`` (``variables``: input variable ->
    ``Shaped``; ``G.STRIDE_VAR``: the integer term of a symbolic stride). The conditions under which
    ``g`` type-checks accumulate in ``A.conds``; a rank mismatch raises ``shapes.ShapeError``."""
    vals = dict(variables)

    def stride(v):
        if v == "s":
            if G.STRIDE_VAR not in variables:
                raise Untranslatable("a symbolic stride without its variable")
            return variables[G.STRIDE_VAR]
        return scode(v)

    def dim(d):
        if isinstance(d, tuple):
            ref, axis = d
            dims = vals[ref].dims
            if not 0 <= axis < len(dims):
                raise SH.ShapeError(f"dimension {axis} of {ref}")
            return dims[axis]
        return int(d)
    made = []
    for k, op in enumerate(g.ops):
        a = dict(op.attrs)
        ins = [vals[r] for r in op.operands]
        n = op.name
        if n in ("ewadd", "ewmul", "smul"):
            outs = [getattr(A, {"ewadd": "add", "ewmul": "mul", "smul": "smul"}[n])(*ins)]
        elif n == "relu":
            outs = [A.relu(ins[0])]
        elif n == "transpose":
            if tuple(a["perm"]) != (1, 0):
                raise Untranslatable(f"transpose perm {a['perm']}")
            outs = [A.t(ins[0])]
        elif n == "matmul":
            mm = A.mm if len(ins) == 2 else A.mm_b  # with a bias operand: another function
            outs = [mm(_act(a), *ins)]
        elif n == "conv2d":
            if a.get("pads") != "same":
                raise Untranslatable("conv2d padding other than 'same'")
            if a["group"] not in (1, "grouped"):
                raise Untranslatable(f"conv2d group {a['group']}")
            conv = A.conv if len(ins) == 2 else A.conv_b  # with a bias operand: another function
            outs = [conv(stride(a["strides"]), 1 if a["group"] == 1 else 0, _act(a), *ins)]
        elif n == "concat":
            outs = [A.cat(a["axis"], *ins)]
        elif n == "split":
            if op.num_results != 2:
                raise Untranslatable("split into more than two parts")
            sizes = tuple(dim(d) for d in a["sizes"])
            outs = [A.split(0, a["axis"], ins[0], sizes), A.split(1, a["axis"], ins[0], sizes)]
        elif n in ("maxpool2d", "avgpool2d"):
            if a.get("pads") != "same" or (n == "avgpool2d" and a.get("count_include_pad") != 1):
                raise Untranslatable(f"{n} padding")
            f = A.maxpool if n == "maxpool2d" else A.avgpool
            outs = [f(kcode(a["kernel_shape"]), stride(a["strides"]), ins[0])]
        elif n == "enlarge":
            outs = [A.enlarge(kcode(a["kernel_shape"]), ins[0])]
        elif n in specs.CONSTANTS:
            outs = [A.const(n, [dim(d) for d in a["shape"]])]
        else:
            raise Untranslatable(f"no axioms for {n}")
        for j, o in enumerate(outs):
            vals[G.op_ref(k, j, op.num_results)] = o
        made += outs
    return [vals[r] for r in g.outputs], made


class Prover:
    """Proves rules from the shape-aware axioms (``axioms.Z3Algebra``).

    A rule is proved under exactly the hypotheses under which the search applies it: every input has
    its generator rank and dimensions >= 1, both sides type-check at those dimensions, each output of
    the target has its source output's shape, and a symbolic stride is 1 or 2. A rule whose hypotheses
    cannot hold together is not proved (it would be vacuously true)."""

    def __init__(self):
        import z3
        self.z3 = z3
        self.A = Z3Algebra()
        self.formulas = [(f"{ax.name}#{j}", f) for ax in AXIOMS for j, f in enumerate(self.A.formulas(ax))]

    def prove(self, a: G.Graph, b: G.Graph, timeout_s: float, ranks: dict | None = None) -> dict:
        """{"status": "proved" | "unknown" | "refuted" | "untranslatable", "time_s", "axioms", "reason"}"""
        z3, A = self.z3, self.A
        t0 = time.perf_counter()
        names = sorted(set(a.inputs()) | set(b.inputs()))
        try:
            ranks = ranks if ranks is not None else default_ranks(names)
            variables = {v: A.var(v, ranks[v]) for v in names}
        except KeyError as e:
            return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": f"no rank for input {e}"}
        S = z3.Int("S", A.ctx)
        variables[G.STRIDE_VAR] = S
        try:
            A.conds = []
            (ta, made_a), conds_a = translate(a, A, variables), A.conds
            A.conds = []
            (tb, made_b), conds_b = translate(b, A, variables), A.conds
            A.conds = []
        except Untranslatable as e:
            return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": str(e)}
        except SH.ShapeError as e:
            return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": f"does not type-check: {e}"}
        hyps = [z3.Or(*[S == scode(s) for s in PROOF_STRIDES])]
        hyps += [d >= 1 for v in names for d in variables[v].dims]
        hyps += conds_a + conds_b
        for x, y in zip(ta, tb):
            if x.rank != y.rank:
                return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": "output ranks differ"}
            hyps += [p == q for p, q in zip(x.dims, y.dims)]
        # every value's dimensions as ground facts (they follow from the shape axioms and the hypotheses)
        facts = [A.dimfs[(t.rank, i)](t.t) == d for t in made_a + made_b for i, d in enumerate(t.dims)]
        hyps = [h for h in hyps if h is not True]
        if any(h is False for h in hyps):
            return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": "the sides never both type-check"}
        check = z3.Solver(ctx=A.ctx)
        check.set("timeout", int(max(0.05, timeout_s / 4) * 1000))
        check.add(*hyps)
        if check.check() == z3.unsat:
            return {"status": "untranslatable", "time_s": time.perf_counter() - t0, "axioms": [],
                    "reason": "the sides never both type-check with equal output shapes"}
        used = set()
        per_output = max(0.05, timeout_s / max(1, len(ta)))
        for i, (x, y) in enumerate(zip(ta, tb)):
            s = z3.Solver(ctx=A.ctx)
            s.set("timeout", int(per_output * 1000))
            for name, f in self.formulas:
                s.assert_and_track(f, z3.Bool(name, A.ctx))
            for _name, f in A.props:
                s.add(f)
            s.add(*hyps)
            s.add(*facts)
            s.add(x.t != y.t)
            r = s.check()
            if r == z3.unsat:
                used.update(str(c).split("#")[0] for c in s.unsat_core())
                continue
            status = "refuted" if r == z3.sat else "unknown"
            why = "a model satisfies the axioms and the inequality" if r == z3.sat else s.reason_unknown()
            return {"status": status, "time_s": time.perf_counter() - t0, "axioms": [],
                    "reason": f"output {i}: {why}"}
        order = {ax.name: k for k, ax in enumerate(AXIOMS)}
        return {"status": "proved", "time_s": time.perf_counter() - t0,
                "axioms": sorted(used, key=order.get), "reason": ""}


# --------------------------------------------------------------------------------------------
# parallel proving with a hard wall-clock guard


def _worker(conn):
    prover = Prover()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        idx, a, b, ranks, timeout_s = msg
        try:
            res = prover.prove(G.Graph.from_json(a), G.Graph.from_json(b), timeout_s, ranks)
        except Exception as e:  # reported per rule, never a dead pool
            res = {"status": "error", "time_s": 0.0, "axioms": [], "reason": f"{type(e).__name__}: {e}"}
        conn.send((idx, res))


def prove_many(pairs: list, timeout_s: float = 10.0, jobs: int = 1, progress=None) -> list[dict]:
    """Prove [(graph a, graph b) or (graph a, graph b, input ranks), ...]; returns one result dict per
    pair, in order (ranks default to ``default_ranks``)."""
    pairs = [tuple(p) + (None,) * (3 - len(p)) for p in pairs]
    results: list = [None] * len(pairs)
    if jobs <= 1:
        prover = Prover()
        for i, (a, b, ranks) in enumerate(pairs):
            results[i] = prover.prove(a, b, timeout_s, ranks)
            if progress:
                progress(results[i])
        return results
    ctx = mp.get_context("fork")
    todo = list(range(len(pairs)))[::-1]
    workers = {}  # conn -> (process, idx or None, deadline)

    def spawn():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child,), daemon=True)
        p.start()
        parent.recv()  # ready (axioms built)
        workers[parent] = [p, None, None]

    def feed(conn):
        if todo:
            i = todo.pop()
            a, b, ranks = pairs[i]
            conn.send((i, a.to_json(), b.to_json(), ranks, timeout_s))
            workers[conn][1:] = [i, time.monotonic() + timeout_s * 2 + 5.0]
        else:
            workers[conn][1:] = [None, None]

    for _ in range(max(1, min(jobs, len(pairs)))):
        spawn()
    for conn in list(workers):
        feed(conn)
    while any(w[1] is not None for w in workers.values()):
        busy = [c for c, w in workers.items() if w[1] is not None]
        deadline = min(workers[c][2] for c in busy)
        ready = wait(busy, timeout=max(0.0, deadline - time.monotonic()))
        for conn in ready:
            i, res = conn.recv()
            results[i] = res
            if progress:
                progress(res)
            feed(conn)
        now = time.monotonic()
        for conn in [c for c, w in workers.items() if w[1] is not None and w[2] <= now and c not in ready]:
            p, i, _ = workers.pop(conn)
            p.kill()
            p.join()
            results[i] = {"status": "unknown", "time_s": timeout_s, "axioms": [],
                          "reason": "killed: Z3 overran the rule's time budget"}
            if progress:
                progress(results[i])
            spawn()
            feed(next(reversed(workers)))
    for conn, (p, _, _) in workers.items():
        conn.send(None)
        p.join(timeout=5)
    return results
