"""A fuzzing campaign over a seed range:

    python test/fuzz/campaign.py --seeds 0:10000 --jobs 2 --out fuzz-out

Each seed's model is generated, optimized by ``taso-opt --taso-search --no-verify-numerics`` (in a
worker process per job) and compared in onnxruntime against a float64 reference (``runner.py``).
Results go to ``OUT/results.jsonl`` as they come; running the same command again skips the seeds
already there (``--restart`` starts over). Failing models and their shrunk forms go to
``OUT/failures/`` (``seed-N.onnx``, ``seed-N.min.onnx``, ``seed-N.json``), models the generator got wrong to
``OUT/generator-faults/``. Progress on stderr; a summary table at the end (also ``OUT/summary.txt``).
Exit status 1 when an optimizer failure (crash, mismatch, timeout, nondeterministic) was found.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import sys
import time
from typing import Optional

if __package__ in (None, ""):  # run as a script: make ``fuzz`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402

from fuzz import gen as G  # noqa: E402
from fuzz import runner as R  # noqa: E402
from fuzz import shrink as S  # noqa: E402

_RUNNER: Optional[R.Runner] = None
_OPTS: dict = {}


def _init(opts: dict) -> None:
    global _RUNNER, _OPTS
    import multiprocessing.util

    _OPTS = opts
    _RUNNER = R.Runner(timeout=opts["timeout"], fresh_every=opts["fresh_every"], motifs=opts["motifs"])
    multiprocessing.util.Finalize(_RUNNER, _RUNNER.close, exitpriority=10)


def shrink_failure(runner: R.Runner, model: onnx.ModelProto, res: R.Result, budget_s: float,
                   log=None) -> tuple:
    """(shrunk model, its Result) for a failing ``res`` of ``model``."""
    key = res.key
    last: dict = {}

    def still_fails(m: onnx.ModelProto) -> bool:
        r = runner.run_model(m, res.seed, check_determinism=res.cls == "nondeterministic")
        if r.key == key:
            last["r"] = r
            return True
        return False

    small = S.shrink(model, still_fails, budget_s=budget_s, log=log)
    return small, last.get("r", res)


def record_failure(out_dir: str, res: R.Result, model: Optional[onnx.ModelProto], runner: Optional[R.Runner],
                   shrink_budget: float, name: Optional[str] = None) -> dict:
    """Save a failing (or generator-fault) model, shrink it, and return what was saved."""
    sub = "generator-faults" if res.cls == "generator-fault" else "failures"
    d = os.path.join(out_dir, sub)
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, name or f"seed-{res.seed}")
    info = {"result": res.to_json()}
    if model is not None:
        onnx.save(model, base + ".onnx")
        info["model"] = base + ".onnx"
        info["reproduce"] = R.repro_command(base + ".onnx")
    if res.failed and model is not None and runner is not None and shrink_budget > 0:
        t0 = time.monotonic()
        small, sres = shrink_failure(runner, model, res, shrink_budget)
        onnx.save(small, base + ".min.onnx")
        info.update(shrunk=base + ".min.onnx", shrunk_nodes=len(small.graph.node),
                    shrunk_result=sres.to_json(), shrink_s=round(time.monotonic() - t0, 1),
                    reproduce_shrunk=R.repro_command(base + ".min.onnx"))
    with open(base + ".json", "w") as f:
        json.dump(info, f, indent=1)
    return info


REGRESSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")


def open_bug_seeds() -> dict:
    """seed -> (failure class, regression file) of the bugs ``regressions/index.json`` lists as open with
    seeds of this generator version: such a seed's failure is reported as known and not shrunk again."""
    try:
        with open(os.path.join(REGRESSIONS, "index.json")) as f:
            index = json.load(f)
    except OSError:
        return {}
    out = {}
    for name, e in index.items():
        if e.get("status") == "open":
            for s in e.get("seeds", {}).get(str(G.GENERATOR_VERSION), []):
                out[int(s)] = (e["class"].split()[0], name)
    return out


def _task(seed: int) -> dict:
    every = _OPTS["determinism_every"]
    check = every > 0 and seed % every == 0
    try:
        res, model = _RUNNER.run_seed(seed) if check else _run_seed_nodet(seed)
    except Exception as e:  # a bug of the fuzzer: recorded, and the campaign goes on
        import traceback

        tb = traceback.format_exc().strip().splitlines()
        return R.Result(seed, "fuzzer-error", f"{type(e).__name__}: {str(e)[:300]} ({tb[-3].strip()})").to_json()
    rec = res.to_json()
    rec["generator"] = G.GENERATOR_VERSION
    if _OPTS["motifs"]:
        rec["only_motifs"] = _OPTS["motifs"]
    known = _OPTS["known"].get(seed)
    if known and known[0] == res.cls:
        rec["known"] = known[1]
    elif res.failed or res.cls == "generator-fault":
        try:
            info = record_failure(_OPTS["out"], res, model, _RUNNER, _OPTS["shrink_budget"])
        except Exception as e:  # (a fault of the shrinker must not end the campaign)
            info = {}
            rec["shrink_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rec["saved"] = info.get("model")
        rec["shrunk"] = info.get("shrunk")
        rec["shrunk_nodes"] = info.get("shrunk_nodes")
    return rec


def _run_seed_nodet(seed: int):
    saved = _RUNNER.determinism
    _RUNNER.determinism = False
    try:
        return _RUNNER.run_seed(seed)
    finally:
        _RUNNER.determinism = saved


def parse_seeds(text: str) -> range:
    if ":" in text:
        a, b = text.split(":", 1)
        return range(int(a), int(b))
    return range(int(text), int(text) + 1)


def load_done(path: str) -> dict:
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # (a line cut short by an interrupted run)
                done[r["seed"]] = r
    return done


def summarize(records: list, seconds: float, ran: int) -> str:
    counts = collections.Counter(r["cls"] for r in records)
    n = len(records)
    lines = [f"{'class':<18}{'models':>8}{'share':>9}"]
    for c in R.CLASSES:
        lines.append(f"{c:<18}{counts.get(c, 0):>8}{100.0 * counts.get(c, 0) / max(1, n):>8.2f}%")
    lines.append(f"{'total':<18}{n:>8}")
    rate = ran / seconds if seconds > 0 else 0.0
    lines.append(f"time {seconds:.1f} s for {ran} models run now ({rate:.2f} models/s)")
    opt = sum(r.get("t_opt", 0) for r in records)
    cmp_ = sum(r.get("t_cmp", 0) for r in records)
    gen_ = sum(r.get("t_gen", 0) for r in records)
    lines.append(f"summed over models: generate+check {gen_:.1f} s, optimize {opt:.1f} s, compare {cmp_:.1f} s")
    oks = [r for r in records if r["cls"] == "ok" and r.get("ratio") is not None]
    if oks:
        w = max(oks, key=lambda r: r["ratio"])
        noref = sum(1 for r in oks if not r.get("reference", True))
        lines.append(f"closest ok model to the tolerance: seed {w['seed']} at {w['ratio']:.3f} of it; "
                     f"{noref} ok model(s) judged without the float64 reference")
    reasons = collections.Counter(r["detail"] for r in records if r["cls"] == "refused")
    if reasons:
        lines.append("refusals:")
        lines += [f"  {c:>5}  {why}" for why, c in reasons.most_common(10)]
    motifs = collections.Counter(m for r in records for m in r.get("motifs", []))
    if motifs:
        lines.append("motifs: " + ", ".join(f"{k} {v}" for k, v in sorted(motifs.items())))
    bad = [r for r in records if r["cls"] in R.FAILURES or r["cls"] in R.OWN_FAULTS]
    if bad:
        lines.append("failures:")
        for r in sorted(bad, key=lambda r: r["seed"]):
            lines.append(f"  seed {r['seed']}: {r['cls']}: {r['detail'][:200]}")
            if r.get("known"):
                lines.append(f"    known open bug: regressions/{r['known']}")
            elif r.get("shrunk"):
                lines.append(f"    shrunk ({r.get('shrunk_nodes')} nodes): {r['shrunk']}")
            elif r.get("saved"):
                lines.append(f"    model: {r['saved']}")
    return "\n".join(lines)


def run_one(a) -> int:
    """``--model``: one model through the runner; a failure is shrunk and saved."""
    model = onnx.load(a.model)
    with R.Runner(timeout=a.timeout) as r:
        res = r.run_model(model, seed=0, check_determinism=a.determinism_every != 0)
        print(f"{a.model}: {res.cls}" + (f": {res.detail}" if res.detail else ""))
        if res.failed:
            name = os.path.splitext(os.path.basename(a.model))[0]
            info = record_failure(a.out, res, model, r, a.shrink_budget, name=name)
            if info.get("shrunk"):
                print(f"shrunk ({info['shrunk_nodes']} nodes, {info['shrunk_result']['cls']}): {info['shrunk']}")
    return 1 if res.failed else 0


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="campaign.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0:1000", help="A:B (B excluded) or one seed (default 0:1000)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs, each with its own optimizer process")
    ap.add_argument("--out", required=True, help="output directory (results.jsonl, failures/, summary.txt)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per optimization (default 60)")
    ap.add_argument("--shrink-budget", type=float, default=300.0,
                    help="seconds to shrink each failing model (0: do not shrink; default 300)")
    ap.add_argument("--determinism-every", type=int, default=1,
                    help="optimize every n-th seed twice and compare the bytes (0: never; default 1: all)")
    ap.add_argument("--fresh-every", type=int, default=50,
                    help="every n-th model's second run is a new taso-opt process (0: never; default 50)")
    ap.add_argument("--progress-every", type=int, default=100, help="a progress line every n models (not a TTY)")
    ap.add_argument("--restart", action="store_true", help="forget the results already in OUT")
    ap.add_argument("--model", help="run this ONNX model instead of seeds (shrunk into OUT/failures/ if it fails)")
    ap.add_argument("--motifs", help="only these motifs (comma-separated; a targeted campaign: seeds name other "
                                     "models than without)")
    ap.add_argument("--search", default="",
                    help="taso-search's options for every model, e.g. 'strategy=eqsat' (default: plain --taso-search)")
    ap.add_argument("--target", default=os.environ.get("TASO_TARGET") or "analytic:t4",
                    help="the target the optimizer prices with (TASO_TARGET of its processes; default: TASO_TARGET, "
                         "else analytic:t4, which times nothing: deterministic and fast, as the determinism check "
                         "needs; 'auto' measures on this CPU)")
    a = ap.parse_args(argv)
    os.environ["TASO_TARGET"] = a.target  # (the optimizer processes inherit it)
    if a.search:
        os.environ[R.SEARCH_ENV] = a.search
    if a.model:
        return run_one(a)

    os.makedirs(a.out, exist_ok=True)
    results_path = os.path.join(a.out, "results.jsonl")
    if a.restart and os.path.exists(results_path):
        os.remove(results_path)
    seeds = parse_seeds(a.seeds)
    done = load_done(results_path)
    todo = [s for s in seeds if s not in done]
    if len(todo) < len(seeds):
        sys.stderr.write(f"campaign: {len(seeds) - len(todo)} of {len(seeds)} seeds already in {results_path}\n")
    motifs = [m for m in (a.motifs or "").split(",") if m]
    for m in motifs:
        G._motif_id(m)  # (an unknown name is an error before anything runs)
    opts = dict(out=a.out, timeout=a.timeout, shrink_budget=a.shrink_budget, determinism_every=a.determinism_every,
                fresh_every=a.fresh_every, known={} if motifs else open_bug_seeds(), motifs=motifs or None)
    tty = sys.stderr.isatty()
    counts = collections.Counter()
    t0 = time.monotonic()
    ran = 0

    def progress(final: bool = False) -> None:
        el = time.monotonic() - t0
        line = (f"[{ran}/{len(todo)}] {ran / el if el else 0:.2f} models/s, {el:.0f} s: "
                + " ".join(f"{c} {counts[c]}" for c in R.CLASSES if counts[c]))
        if tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    new = []
    with open(results_path, "a") as out:
        if todo:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(max(1, a.jobs), initializer=_init, initargs=(opts,)) as pool:
                try:
                    for rec in pool.imap_unordered(_task, todo, chunksize=1):
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                        new.append(rec)
                        ran += 1
                        counts[rec["cls"]] += 1
                        if rec["cls"] in R.FAILURES:
                            sys.stderr.write(("\n" if tty else "") +
                                             f"campaign: seed {rec['seed']}: {rec['cls']}: {rec['detail'][:200]}\n")
                        if tty or (ran % max(1, a.progress_every) == 0 and ran < len(todo)):
                            progress()
                except KeyboardInterrupt:
                    pool.terminate()
                    sys.stderr.write("\ncampaign: interrupted; run the same command again to go on\n")
                    return 130
            progress(final=True)
    elapsed = time.monotonic() - t0
    allrec = [r for s, r in sorted({**done, **{r["seed"]: r for r in new}}.items()) if s in seeds]
    text = summarize(allrec, elapsed, ran)
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write(f"seeds {a.seeds}, generator version {G.GENERATOR_VERSION}"
                + (f", motifs {','.join(motifs)} only" if motifs else "") + f"\n{text}\n")
    print(text)
    return 1 if any(r["cls"] in R.FAILURES for r in allrec) else 0


if __name__ == "__main__":
    if __package__ in (None, ""):  # (so that the pool's processes find the tasks in fuzz.campaign)
        from fuzz.campaign import main as _main

        sys.exit(_main())
    sys.exit(main())
