"""Generation end to end: enumerate (in parallel), pair, prune, test, and build rule records.

Parallelism: the search space is split by the first op of each graph (the enumeration adds ops in a
fixed order, so every graph has exactly one first op, and the cone-size-1 ops are created in the same
order in every process). Worker processes return their fingerprints; the parent finds the shared
ones and asks the workers only for those graphs.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

from . import candidates as C
from . import graph as G
from . import library
from .enumerate import Config, Enumerator


def _worker(cfg_json, part, parts, conn):
    try:
        en = Enumerator(Config.from_json(cfg_json))
        fps, ops = en.run(part, parts, progress=lambda n: conn.send(("progress", n)))
        conn.send(("fps", bytes(fps)))
        wanted = conn.recv()
        conn.send(("members", C.members_of(en, fps, ops, wanted)))
    except BaseException as e:  # reported to the parent, which fails with one line
        conn.send(("error", f"{type(e).__name__}: {e}"))


def enumerate_parallel(cfg: Config, jobs: int, progress=None) -> tuple[list, int]:
    """[(fingerprint, Member)] of every graph whose fingerprint is shared, and the graph count."""
    if jobs <= 1:
        en = Enumerator(cfg)
        fps, ops = en.run(progress=progress)
        wanted = C.colliding([fps])
        return C.members_of(en, fps, ops, wanted), len(fps)
    ctx = mp.get_context("fork")
    conns, procs = [], []
    for part in range(jobs):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(cfg.to_json(), part, jobs, child), daemon=True)
        p.start()
        conns.append(parent)
        procs.append(p)

    def recv(conn, kind):
        while True:
            tag, val = conn.recv()
            if tag == "progress":
                if progress:
                    progress(val)
                continue
            if tag == "error":
                raise RuntimeError(f"generator worker failed: {val}")
            assert tag == kind, tag
            return val
    fps = [recv(c, "fps") for c in conns]
    wanted = C.colliding(fps)
    for c in conns:
        c.send(wanted)
    members = []
    for c in conns:
        members += recv(c, "members")
    for p in procs:
        p.join()
    return members, sum(len(f) // 8 for f in fps)


def base_op_count(cfg: Config) -> int:
    return len(Enumerator(cfg).base_ops)


def generate(cfg: Config, jobs: int = 1, progress=None, log=print, derive_from=None) -> tuple[dict, list[dict]]:
    """Run the generator; returns the library header and the rule records (proof: unverified).
    ``derive_from``: rules files (comma-separated) whose proved rules make a candidate redundant where
    they derive it (``derive.Deriver``: one rewrite from each side meets); such candidates are dropped."""
    times = {}
    t0 = time.perf_counter()
    members, n_graphs = enumerate_parallel(cfg, jobs, progress)
    times["enumerate"] = time.perf_counter() - t0
    log(f"enumerated {n_graphs} graphs in {times['enumerate']:.1f} s; "
        f"{len(members)} share a fingerprint with another graph")
    t1 = time.perf_counter()
    cands, counts = C.find_candidates(members, cfg, n_graphs, log=log)
    times["prune"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    inputs = {s.name: (s.shape, s.kind) for s in cfg.inputs}
    rng = np.random.default_rng(cfg.seed + 2)
    records = []
    for c in cands:
        a, b, variants = C.symbolic_constants(c.a, c.b, inputs, rng)
        dirs = [d for d, (s, t) in (("forward", (a, b)), ("backward", (b, a))) if library.usable(s, t)]
        if not dirs:
            continue  # neither side binds every variable: nothing a search could apply
        used = sorted(set(a.inputs()) | set(b.inputs()))
        records.append({
            "src": a.to_json(), "dst": b.to_json(), "text": [a.text(), b.text()],
            "inputs": {v: [list(inputs[v][0]), inputs[v][1]] for v in used},
            "directions": dirs, "fingerprint": f"{c.fingerprint:016x}", "variants": variants,
            "ops": [len(a.ops), len(b.ops)],
            "proof": {"status": "unverified", "time_s": 0.0, "axioms": [], "reason": ""},
        })
    counts["usable"] = len(records)
    if derive_from:
        t3 = time.perf_counter()
        from .derive import Deriver
        deriver = Deriver(derive_from)
        records = [r for r in records if not deriver.derivable(
            G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"]),
            {v: tuple(shape) for v, (shape, _kind) in r["inputs"].items()})]
        counts["after_derivability"] = len(records)
        times["derivability"] = time.perf_counter() - t3
        log(f"  {len(records)} not derivable from the proved rules of {derive_from} "
            f"({deriver.failed} could not be checked and are kept)")
    records.sort(key=lambda r: (r["ops"][0] + r["ops"][1], r["text"]))
    for i, r in enumerate(records):
        r["id"] = f"{cfg.id_prefix}{i + 1:04d}"
    times["symbolic_shapes"] = time.perf_counter() - t2
    times["total"] = time.perf_counter() - t0
    log(f"  {len(records)} usable rules (a direction whose source binds every variable)")
    header = {"config": cfg.to_json(), "counts": counts, "times_s": {k: round(v, 2) for k, v in times.items()},
              "jobs": jobs, "preconditions": library.PRECONDITIONS, "commutative": library.COMMUTATIVE}
    return header, records
