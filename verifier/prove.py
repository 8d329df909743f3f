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

from ..generator import graph as G
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


def translate(g: G.Graph, A: Z3Algebra, variables: dict) -> list:
    """The outputs of ``g`` as Z3 terms (``variables``: input variable -> term; ``G.STRIDE_VAR``: the
    integer term of a symbolic stride)."""
    vals = dict(variables)

    def stride(v):
        if v == "s":
            if G.STRIDE_VAR not in variables:
                raise Untranslatable("a symbolic stride without its variable")
            return variables[G.STRIDE_VAR]
        return scode(v)
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
            outs = [conv(stride(a["strides"]), 1 if a["group"] == 1 else 0,
                         _act(a), *ins)]
        elif n == "concat":
            outs = [A.cat(a["axis"], *ins)]
        elif n == "split":
            if op.num_results != 2:
                raise Untranslatable("split into more than two parts")
            outs = [A.split(0, a["axis"], ins[0]), A.split(1, a["axis"], ins[0])]
        elif n in ("maxpool2d", "avgpool2d"):
            if a.get("pads") != "same" or (n == "avgpool2d" and a.get("count_include_pad") != 1):
                raise Untranslatable(f"{n} padding")
            f = A.maxpool if n == "maxpool2d" else A.avgpool
            outs = [f(kcode(a["kernel_shape"]), stride(a["strides"]), ins[0])]
        elif n == "enlarge":
            outs = [A.enlarge(kcode(a["kernel_shape"]), ins[0])]
        elif n in ("const_pool", "const_iconv"):
            shape = a["shape"]
            outs = [(A.cpool if n == "const_pool" else A.iconv)(kcode(shape[2:]))]
        elif n == "const_imatmul":
            outs = [A.imatmul()]
        elif n == "const_iewmul":
            outs = [A.iewmul()]
        else:
            raise Untranslatable(f"no axioms for {n}")
        for j, o in enumerate(outs):
            vals[G.op_ref(k, j, op.num_results)] = o
    return [vals[r] for r in g.outputs]


class Prover:
    def __init__(self):
        import z3
        self.z3 = z3
        self.A = Z3Algebra()
        self.formulas = [(ax.name, self.A.formula(ax)) for ax in AXIOMS]

    def prove(self, a: G.Graph, b: G.Graph, timeout_s: float) -> dict:
        """{"status": "proved" | "unknown" | "refuted" | "untranslatable", "time_s", "axioms", "reason"}"""
        z3 = self.z3
        t0 = time.perf_counter()
        names = sorted(set(a.inputs()) | set(b.inputs()))
        variables = {v: z3.Const(v, self.A.T) for v in names}
        variables[G.STRIDE_VAR] = z3.Int("S", self.A.ctx)  # free: proved for every stride
        try:
            ta, tb = translate(a, self.A, variables), translate(b, self.A, variables)
        except Untranslatable as e:
            return {"status": "untranslatable", "time_s": 0.0, "axioms": [], "reason": str(e)}
        used = set()
        per_output = max(0.05, timeout_s / max(1, len(ta)))
        for i, (x, y) in enumerate(zip(ta, tb)):
            s = z3.Solver(ctx=self.A.ctx)
            s.set("timeout", int(per_output * 1000))
            for name, f in self.formulas:
                s.assert_and_track(f, z3.Bool(name, self.A.ctx))
            s.add(x != y)
            r = s.check()
            if r == z3.unsat:
                used.update(str(c) for c in s.unsat_core())
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
        idx, a, b, timeout_s = msg
        try:
            res = prover.prove(G.Graph.from_json(a), G.Graph.from_json(b), timeout_s)
        except Exception as e:  # reported per rule, never a dead pool
            res = {"status": "error", "time_s": 0.0, "axioms": [], "reason": f"{type(e).__name__}: {e}"}
        conn.send((idx, res))


def prove_many(pairs: list, timeout_s: float = 10.0, jobs: int = 1, progress=None) -> list[dict]:
    """Prove [(graph a, graph b), ...]; returns one result dict per pair, in order."""
    results: list = [None] * len(pairs)
    if jobs <= 1:
        prover = Prover()
        for i, (a, b) in enumerate(pairs):
            results[i] = prover.prove(a, b, timeout_s)
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
            a, b = pairs[i]
            conn.send((i, a.to_json(), b.to_json(), timeout_s))
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
