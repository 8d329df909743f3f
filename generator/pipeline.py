"""Generation end to end: enumerate (in parallel), pair, prune, test, and build rule records.

Parallelism: the search space is split by the first op of each graph (the enumeration adds ops in a
fixed order, so every graph has exactly one first op, and the cone-size-1 ops are created in the same
order in every process). Worker processes return their fingerprints; the parent finds the shared
ones and asks the workers only for those graphs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from . import candidates as C
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


def _derive_init(rewrites):
    global _DERIVER
    from .egraph import Deriver
    _DERIVER = Deriver(rewrites)


def _derive_one(args):
    a, b, shapes = args
    before = _DERIVER.failed
    return _DERIVER.derivable(a, b, shapes), _DERIVER.failed - before


def derive_parallel(cands: list, inputs: dict, rewrites: list, jobs: int, progress=None) -> tuple[list, int]:
    """The candidates that the rewrites do not derive (``egraph.Deriver``), and how many checks failed
    (those candidates are kept)."""
    work = [(c.a, c.b, {v: inputs[v][0] for v in set(c.a.inputs()) | set(c.b.inputs())}) for c in cands]
    serial = jobs <= 1 or len(work) < 64
    if serial:
        _derive_init(rewrites)
    flags, failed = [], 0
    with (contextlib.nullcontext() if serial else mp.get_context("fork").Pool(jobs, _derive_init, (rewrites,))) as pool:
        for ok, f in (map(_derive_one, work) if serial else pool.imap(_derive_one, work, chunksize=32)):
            flags.append(ok)
            failed += f
            if progress:
                progress(1)
    return [c for c, d in zip(cands, flags) if not d], failed


def _in_base(cfg: Config, base_paths: list) -> int:
    """The largest N of a derive-from library generated with this configuration otherwise (its pairs
    with no side above that N are its own candidates, verified there); 0 if none."""
    n = 0
    for p in base_paths:
        header, _ = library.read(p)
        other = header.get("config")
        if other and {**other, "max_ops": 0, "id_prefix": ""} == {**cfg.to_json(), "max_ops": 0, "id_prefix": ""}:
            n = max(n, int(other["max_ops"]))
    return n


def generate(cfg: Config, jobs: int = 1, progress=None, log=print, derive_from=None,
             derive_progress=None) -> tuple[dict, list[dict]]:
    """Run the generator; returns the library header and the rule records (proof: unverified).
    ``derive_from``: rules files (comma-separated) whose rules make a candidate redundant where they
    derive it (``egraph.Deriver``: equality saturation with them and concat associativity); such
    candidates are dropped. The rules used are the proved ones and those that passed the generator's
    tests but did not prove ("unknown"): Ruler's choice, as pruning can only drop a candidate, never
    make a rule usable, and a candidate that follows from an equivalence Z3 cannot prove (the
    avgpool-conv commutation, a concat rearrangement) would mostly not prove either. A candidate of a
    derive-from library with the same configuration and a smaller N (both sides within its N) is that
    library's, and is dropped too."""
    times = {}
    t0 = time.perf_counter()
    members, n_graphs = enumerate_parallel(cfg, jobs, progress)
    times["enumerate"] = time.perf_counter() - t0
    log(f"enumerated {n_graphs} graphs in {times['enumerate']:.1f} s; "
        f"{len(members)} share a fingerprint with another graph")
    t1 = time.perf_counter()
    cands, counts = C.find_candidates(members, cfg, n_graphs, log=log, jobs=jobs)
    times["prune"] = time.perf_counter() - t1
    derived_from = None
    if derive_from:
        t3 = time.perf_counter()
        cands, derived_from = derive_stage(
            cfg, cands, counts, derive_from, log,
            lambda cs, inputs, rewrites: derive_parallel(cs, inputs, rewrites, jobs,
                                                         derive_progress(len(cs)) if derive_progress else None))
        times["derivability"] = time.perf_counter() - t3
    t2 = time.perf_counter()
    records = build_records(cfg, cands, counts, log)
    times["symbolic_shapes"] = time.perf_counter() - t2
    times["total"] = time.perf_counter() - t0
    header = {**library_header(cfg, counts, derived_from),
              "times_s": {k: round(v, 2) for k, v in times.items()}, "jobs": jobs}
    return header, records


def library_header(cfg: Config, counts: dict, derived_from: dict | None) -> dict:
    """The header of a generated library, less what depends on the run (``times_s``, ``jobs``)."""
    header = {"config": cfg.to_json(), "counts": counts, "preconditions": library.PRECONDITIONS,
              "commutative": library.COMMUTATIVE}
    if derived_from:
        header["derived_from"] = derived_from
    return header


def derive_stage(cfg: Config, cands: list, counts: dict, derive_from: str, log, derive) -> tuple[list, dict]:
    """The derivability stage (``generate``'s ``derive_from``): the candidates left and the header's
    ``derived_from``. ``derive(cands, inputs, rewrites)`` gives the candidates the rewrites do not
    derive, in order, and how many checks failed (``derive_parallel``)."""
    from . import egraph
    inputs = {s.name: (s.shape, s.kind) for s in cfg.inputs}
    paths = [p for p in str(derive_from).split(",") if p]
    base_n = _in_base(cfg, paths)
    if base_n:
        cands = [c for c in cands if max(len(c.a.ops), len(c.b.ops)) > base_n]
        counts["beyond_base"] = len(cands)
        log(f"  {len(cands)} with a side of more than {base_n} ops (the others are the N = {base_n} library's)")
    rewrites = egraph.load_rewrites(paths, ("proved", "unknown")) + egraph.concat_associativity()
    cands, failed = derive(cands, inputs, rewrites)
    counts["after_derivability"] = len(cands)
    log(f"  {len(cands)} not derivable from the {len(rewrites)} rewrites of {derive_from} "
        f"and concat associativity ({failed} could not be checked and are kept)")
    return cands, {"files": [Path(p).name for p in paths], "rewrites": len(rewrites),
                   **({"base_max_ops": base_n} if base_n else {})}


def build_records(cfg: Config, cands: list, counts: dict, log=print) -> list[dict]:
    """The rule records of the candidates left (constant shapes stated symbolically, usable directions,
    ids in order of size then text); sets ``counts["usable"]``."""
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
    records.sort(key=lambda r: (r["ops"][0] + r["ops"][1], r["text"]))
    for i, r in enumerate(records):
        r["id"] = f"{cfg.id_prefix}{i + 1:04d}"
    log(f"  {len(records)} usable rules (a direction whose source binds every variable)")
    return records
