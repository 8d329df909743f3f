"""taso-verify: validate the operator axioms, then prove every rule of a rules file with Z3.

    taso-verify rules.jsonl -o proved.jsonl --timeout 2 --jobs 2
    taso-verify --in-place                          # the packaged library
    taso-verify rules.jsonl --cluster ray -o proved.jsonl   # proofs and shape fuzzing as Ray tasks

Every axiom is first checked on concrete shapes against the reference semantics, its Z3 shape conditions
against the specs' type-checking (a failing axiom stops the run). Each rule is then proved per mapped
output under a timeout, from the assumption that both sides type-check at the shapes the search relates
them by; a proved rule with stride-1 window ops is proved again with a symbolic stride (and stated with
it where that proves); every proved rule is then compared numerically at shapes a constraint solver
samples where both sides type-check.
Rules that do not prove, or that the shape fuzzing refutes, stay in the file with status "unknown",
"refuted" or "untranslatable" and the reason, and are never used by the search.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

from . import cli

#: recorded in a verified file's header: what the proofs assume and how they were checked
PROVER_DESCRIPTION = ("shape-aware: tensors sorted by rank with dimension functions, every axiom guarded by its "
                      "shape conditions, rules proved under the search's hypotheses (generator ranks, dims >= 1, "
                      "both sides type-check with equal output shapes, stride 1 or 2)")


def main(argv=None) -> int:
    return cli.run("taso-verify", _main, argv)


def _main(argv) -> int:
    from ..dialect.errors import TasoError
    ap = argparse.ArgumentParser(prog="taso-verify", description=__doc__.strip().splitlines()[0])
    ap.add_argument("rules", nargs="?", default=None, help="rules file (default: the packaged library)")
    ap.add_argument("-o", "--output", help="where to write the rules with their proof results")
    ap.add_argument("--in-place", action="store_true", help="rewrite the rules file itself (atomically)")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per rule (default 2)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="worker processes (default: all cores); with --cluster ray, the local Ray runtime's CPUs")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the shape fuzzing")
    ap.add_argument("--show", metavar="ID[,ID...]", default=None,
                    help="print these rules (ids as in a report: R0091, or R0091f for one direction) with "
                         "their proofs, from the file given or every shipped file; nothing is proved or written")
    dist = ap.add_argument_group("distributed verification (Ray: pip install 'taso-mlir[distributed]')")
    dist.add_argument("--cluster", metavar="ray|ray://HOST:PORT", default=None,
                      help="run the proofs and the shape fuzzing as Ray tasks, one worker per CPU: 'ray' starts a "
                           "local Ray runtime of --jobs workers, ray://HOST:PORT uses a running cluster (its Ray "
                           "Client port; every node needs taso-mlir[distributed] of the same version); each rule "
                           "keeps its --timeout and its hard budget of 2 x timeout + 5 s; the results are a local "
                           "run's")
    args = ap.parse_args(argv)
    if args.show is not None:
        return _show(args.rules, args.show)
    from ..generator import library
    if args.output is None and not args.in_place:
        raise TasoError("give -o FILE or --in-place")
    if args.timeout <= 0 or args.jobs < 1:
        raise TasoError("--timeout must be positive and --jobs at least 1")
    if args.cluster is not None and not (args.cluster == "ray" or args.cluster.startswith("ray://")):
        raise TasoError(f"--cluster {args.cluster}: give 'ray' (a local Ray runtime) or ray://HOST:PORT")
    path = args.rules or str(library.default_path())
    try:
        header, records = library.read(path)
    except library.LibraryError as e:
        raise TasoError(str(e)) from None
    out = path if args.in_place else args.output
    if args.cluster is None:
        return _verify(args, header, records, out, None)
    from ..generator.distributed import DistributedError
    from ..verifier.distributed import Pool
    try:  # one Ray runtime and one set of workers for the whole run
        with Pool(None if args.cluster == "ray" else args.cluster, args.jobs) as pool:
            return _verify(args, header, records, out, pool)
    except DistributedError as e:
        raise TasoError(str(e)) from None


def _verify(args, header: dict, records: list, out: str, pool) -> int:
    """Validate the axioms, prove, generalize strides, fuzz and write; on ``pool``'s Ray workers
    (``verifier.distributed.Pool``) or, None, in ``--jobs`` local processes."""
    from ..dialect.errors import TasoError
    from ..generator import graph as G
    from ..generator import library
    from ..verifier.distributed import fuzz_rule
    from ..verifier.prove import generalize_strides, has_unit_strides, prove_many
    from ..verifier.validate import validate_all
    from ..verifier.axioms import AXIOMS
    from tqdm import tqdm
    quiet = args.no_progress
    jobs = args.jobs if pool is None else pool.workers
    how = f"{jobs} jobs" if pool is None else f"{jobs} Ray workers"

    def prove(pairs, names, progress):
        if pool is None:
            return prove_many(pairs, timeout_s=args.timeout, jobs=args.jobs, progress=progress)
        return pool.prove_many(pairs, args.timeout, progress=progress, names=names)

    # 1. axiom validation
    t0 = time.perf_counter()
    bar = tqdm(total=len(AXIOMS), desc="validating axioms", unit="axiom", file=sys.stderr, disable=quiet)
    reports = validate_all(progress=bar.update)
    bar.close()
    bad = [r for r in reports if r.failures or r.obligations == 0]
    n_obl = sum(r.obligations for r in reports)
    print(f"axioms: {len(reports)} validated on {n_obl} concrete obligations in {time.perf_counter() - t0:.1f} s")
    if bad:
        for r in bad:
            why = r.failures[0][2] if r.failures else "no shape at which both sides type-check"
            print(f"  {r.name} ({r.doc}) FAILS: {why}")
        raise TasoError(f"{len(bad)} axiom(s) fail validation against the reference semantics; no proofs run")

    # 2. proofs
    pairs = [(G.Graph.from_json(r["src"]), G.Graph.from_json(r["dst"])) for r in records]
    ranks = [{v: len(shape) for v, (shape, _kind) in r["inputs"].items()} for r in records]
    before = {r["id"]: (r.get("proof") or {}).get("status", "unverified") for r in records}
    t1 = time.perf_counter()
    bar = tqdm(total=len(pairs), desc=f"proving ({how})", unit="rule", file=sys.stderr, disable=quiet)
    status = collections.Counter()

    def tick(res):
        status[res["status"]] += 1
        bar.set_postfix(proved=status["proved"], other=sum(status.values()) - status["proved"])
        bar.update(1)
    results = prove([(a, b, rk) for (a, b), rk in zip(pairs, ranks)], [r["id"] for r in records], tick)
    bar.close()
    # 2b. stride generalization: a proved rule whose window ops have stride 1 is proved again with one
    # symbolic stride shared by all of them; where that proves too, the rule is stated with it
    todo = [i for i, ((a, b), res) in enumerate(zip(pairs, results))
            if res["status"] == "proved" and (has_unit_strides(a) or has_unit_strides(b))]
    bar = tqdm(total=len(todo), desc="generalizing strides", unit="rule", file=sys.stderr, disable=quiet)
    generalized = [(generalize_strides(pairs[i][0]), generalize_strides(pairs[i][1])) for i in todo]
    general = prove([(a, b, ranks[i]) for i, (a, b) in zip(todo, generalized)],
                    [records[i]["id"] + " (symbolic stride)" for i in todo], lambda res: bar.update(1))
    bar.close()
    for i, (a, b) in enumerate(pairs):  # (a file whose rules are stated with a symbolic stride already)
        if results[i]["status"] == "proved" and G.has_symbolic_stride(a, b):
            results[i] = dict(results[i], generalized=["strides"])
    for i, (a, b), res in zip(todo, generalized, general):
        if res["status"] != "proved":
            continue
        records[i].update(src=a.to_json(), dst=b.to_json(), text=[a.text(), b.text()])
        results[i] = dict(res, time_s=results[i]["time_s"] + res["time_s"], generalized=["strides"])
    # 2c. shape fuzzing: every proved rule is compared numerically at shapes where both sides type-check
    # (solved and sampled by generator.shape_sampler, plus independent draws), and one that disagrees
    # anywhere is refuted with those shapes: a numeric check of the proofs, independent of the prover's
    # shape reasoning
    proved = [i for i, res in enumerate(results) if res["status"] == "proved"]
    bar = tqdm(total=len(proved), desc="shape fuzzing", unit="rule", file=sys.stderr, disable=quiet)
    n_fuzzed = n_refuted = 0
    fuzz_stats: dict = {}

    def fuzzed():
        """(rule index, shapes compared, where the sides disagree or None, its counters) per proved rule, in
        order; each rule's comparisons independent of the rules fuzzed before it (``fuzz_rule``)"""
        items = [(i, records[i]["src"], records[i]["dst"],
                  {v: (tuple(shape), kind) for v, (shape, kind) in records[i]["inputs"].items()}) for i in proved]
        if pool is not None:  # (each rule on its own, as here: the same comparisons on any worker)
            yield from pool.shape_fuzz(items, args.seed, progress=lambda: bar.update(1),
                                       names={i: records[i]["id"] for i in proved})
            return
        for i, src, dst, inputs in items:
            yield (i, *fuzz_rule(src, dst, inputs, args.seed + i))
            bar.update(1)
    for i, n, bad, stats in fuzzed():
        for k, v in stats.items():
            fuzz_stats[k] = fuzz_stats.get(k, 0) + v
        n_fuzzed += n
        if bad is not None:
            n_refuted += 1
            status["proved"] -= 1
            status["refuted"] += 1
            results[i] = {"status": "refuted", "time_s": results[i]["time_s"], "axioms": [],
                          "reason": "proved from the axioms but the sides differ numerically at "
                                    f"{json.dumps(bad)}"}
    bar.close()
    elapsed = time.perf_counter() - t1
    n_general = sum(res["status"] == "proved" and bool(res.get("generalized")) for res in results)
    axiom_use = collections.Counter()
    for r, res in zip(records, results):
        r["proof"] = {"status": res["status"], "time_s": round(res["time_s"], 4),
                      "axioms": res["axioms"], "reason": res["reason"]}
        if res.get("generalized"):
            r["proof"]["generalized"] = res["generalized"]
        axiom_use.update(res["axioms"])
    # what changed against the file as it was read (its previous verification)
    changes = [{"id": r["id"], "before": before[r["id"]], "after": r["proof"]["status"],
                "reason": r["proof"]["reason"] or ("proved" if r["proof"]["status"] == "proved" else "")}
               for r in records if before[r["id"]] != r["proof"]["status"]]
    prev = header.get("verification", {})
    header["verification"] = {
        "timeout_s": args.timeout, "jobs": jobs, "time_s": round(elapsed, 1),
        "status": dict(sorted(status.items())), "axioms_validated": len(reports), "axiom_obligations": n_obl,
        "stride_generalized": n_general,
        "shape_fuzz": {"compared": n_fuzzed, "refuted": n_refuted, **fuzz_stats},
        "prover": PROVER_DESCRIPTION,
        "status_before": prev.get("status_before", prev.get("status")) if prev.get("prover") == PROVER_DESCRIPTION
        else prev.get("status"),
        "changed": changes if prev.get("prover") != PROVER_DESCRIPTION else prev.get("changed", []) + changes,
    }
    header.setdefault("counts", {})["proved"] = status["proved"]
    library.write(out, header, records)

    # 3. summary
    times = sorted(r["proof"]["time_s"] for r in records if r["proof"]["status"] == "proved")
    print(f"{'status':<16}{'rules':>7}")
    for k, v in sorted(status.items()):
        print(f"{k:<16}{v:>7}")
    if changes:
        print(f"status changed for {len(changes)} rule(s) against the file as read:")
        for c in changes[:20]:
            print(f"  {c['id']}: {c['before']} -> {c['after']}: {c['reason'][:160]}")
    print(f"stride: {n_general} proved rules are stated with a symbolic stride ({len(todo)} tried this run)")
    print(f"shape fuzzing: {n_fuzzed} comparisons ({fuzz_stats.get('sampled', 0)} at shapes the constraint "
          f"solver sampled, {fuzz_stats.get('drawn', 0)} drawn independently; {fuzz_stats.get('rejected', 0)} sampled "
          f"shapes the specs refused); {n_refuted} proved rule(s) refuted")
    if times:
        print(f"proof time: median {times[len(times) // 2] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms; "
              f"total {elapsed:.1f} s with {how}")
    if pool is not None:
        print(f"cluster: {pool.workers} Ray workers; {pool.timeouts} task(s) killed past their time budget (their "
              f"rules run again one per task), {pool.retried} submitted again after their worker died")
    unused = [a.name for a in AXIOMS if a.name not in axiom_use]
    print("axioms used by proofs (rules): " + ", ".join(f"{k} {v}" for k, v in axiom_use.most_common()))
    if unused:
        print("axioms no proof used: " + ", ".join(unused))
    excluded = [r for r in records if r["proof"]["status"] != "proved"]
    if excluded:
        print(f"excluded ({len(excluded)}), first 10:")
        for r in excluded[:10]:
            print(f"  {r['id']} {r['proof']['status']}: {r['proof']['reason']}  [{r['text'][0]}  <=>  {r['text'][1]}]")
    print(f"wrote {out}")
    return 0


def _show(path, ids: str) -> int:
    """Print the rules named by ``ids`` (a trailing direction letter f/b is ignored)."""
    from ..dialect.errors import TasoError
    from ..generator import library
    want = [i.strip() for i in ids.split(",") if i.strip()]
    keys = {i[:-1] if i[-1:] in ("f", "b") and i[:-1][1:].isdigit() else i: i for i in want}
    paths = [path] if path else [str(p) for p in library.shipped_paths()]
    found = {}
    for p in paths:
        try:
            _header, records = library.read(p)
        except library.LibraryError as e:
            raise TasoError(str(e)) from None
        for r in records:
            if r["id"] in keys:
                found[r["id"]] = (p, r)
    missing = [keys[k] for k in keys if k not in found]
    if missing:
        raise TasoError(f"no rule {', '.join(missing)} in {', '.join(os.path.basename(p) for p in paths)}")
    for k in keys:
        p, r = found[k]
        proof = r["proof"]
        print(f"{r['id']}  ({os.path.basename(p)}; usable: {', '.join(r.get('directions', [])) or 'none'})")
        print(f"  source: {r['text'][0]}")
        print(f"  target: {r['text'][1]}")
        print("  inputs: " + ", ".join(f"{v} {list(shape)} ({kind})" for v, (shape, kind) in sorted(r["inputs"].items())))
        line = f"  proof:  {proof['status']}"
        if proof.get("axioms"):
            line += " from " + ", ".join(proof["axioms"])
        if proof.get("generalized"):
            line += f" (generalized: {', '.join(proof['generalized'])})"
        print(line + (f"; {proof['reason']}" if proof.get("reason") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
