#!/usr/bin/env python3
"""Measure the op signatures the search prices on a GPU, into the table ``cost-model=cuda:<gpu>`` reads (issue 24).

Runs on the GPU machine with its preinstalled packages only: the standard library and numpy here, and, in the
``cuda`` backend, torch (cuBLAS, cuDNN), cuda-python (``cuda.core``: device, stream, events, NVRTC) and CuPy
(NVRTC, where ``cuda.core`` fails). It does not import taso_mlir: it reads the signatures file that
``python -m taso_mlir.passes.cost.calibration dump`` wrote on the CPU (``benchmarks/gpu/signatures.jsonl``),
whose records carry their table keys.

    python3 benchmarks/gpu/calibrate.py --smoke 12 --out smoke.json           # seconds: ~12 ops, checked, a table
    python3 benchmarks/gpu/calibrate.py --out h100.json --budget-s 300        # everything, within 5 minutes
    python3 benchmarks/gpu/calibrate.py --dry-run --out dry.json              # the same loop, numpy on the CPU

The kernels, the plans, the numpy references, the two backends and the method (TASO's: 8 warm-up runs, then
32 timed runs between device events behind a spin kernel, medians; strict FP32 unless ``--tf32``) are the
kernel layer ``passes/cost/cuda_kernels.py``, which ``cost-model=cuda`` measures with in the searching process
too; this script loads that file by its path (taso_mlir need not be installed) and drives it over a
signatures file. Every name the executor (``execute.py``) and the speedup run (``speedup.py``) use as
``calibrate.<name>`` is the kernel layer's.

Robustness: each signature runs in its own try/except (a failure is recorded with its reason and the run goes
on); the table is written atomically every ``--checkpoint-s`` seconds and at the end (``complete``: false
until every signature has a result); the loop stops before ``--budget-s`` (counted from the start); a
watchdog thread writes the table and exits if one signature hangs; ``--resume`` continues a table of the same
device. A few signatures per kind and kernel path are checked against numpy (relative error in ``checks``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kernel_layer():
    """``passes/cost/cuda_kernels.py`` of this checkout, loaded by its path (the GPU machine has no taso_mlir)."""
    name = "taso_cuda_kernels"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "passes", "cost", "cuda_kernels.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


K = _kernel_layer()
# the kernel layer's names, as execute.py, speedup.py and the tests read them (``calibrate.Plan``, ...)
(Unsupported, Plan, plan, reference, rel_error, Prepared, DryBackend, CudaDevice, CudaBackend, short_name, measure,
 _numel, _NP_UNARY) = (K.Unsupported, K.Plan, K.plan, K.reference, K.rel_error, K.Prepared, K.DryBackend, K.CudaDevice,
                       K.CudaBackend, K.short_name, K.measure, K._numel, K._NP_UNARY)

TABLE_FORMAT = "taso-mlir cuda table 1"
SIGS_FORMAT = "taso-mlir signatures 1"
DEFAULT_SIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signatures.jsonl")


# ---------------------------------------------------------------------------------------------------------
# signatures


def read_signatures(path: str) -> tuple[dict, list[dict]]:
    header, recs = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r.get("header"):
                    header = r
                else:
                    recs.append(r)
    if header.get("format") != SIGS_FORMAT:
        raise SystemExit(f"calibrate: {path} is not a taso-mlir signatures file (format {header.get('format')!r})")
    return header, recs


# ---------------------------------------------------------------------------------------------------------
# the measuring loop


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Calibration:
    """The loop's state: the table being written, its checkpoints, the budget."""

    def __init__(self, args, backend, sig_header: dict, recs: list, t0: float):
        self.args, self.backend, self.t0 = args, backend, t0
        self.recs = recs
        self.lock = threading.RLock()
        dev = backend.device_info()
        self.table = {
            "format": TABLE_FORMAT,
            "name": args.name or ("dry" if backend.name == "dry" else short_name(dev["gpu"])), "device": dev, "date": _now_iso(),
            "method": {"backend": backend.name, "warmup": args.warmup, "repeats": args.repeats,
                       "statistic": "median of per-run device-event times (q1/q3 the quartiles)",
                       "cap_s": args.cap_s, "inputs": "uniform [0.5, 1.5), the same buffers over the repeats",
                       "timing": "each run between two events, behind a spin kernel (device time, no host gaps)"
                       if backend.name == "cuda" else "wall clock around numpy (a rehearsal, not a GPU timing)",
                       "tf32": bool(args.tf32),
                       "in_graph": ({"copies_at_most": args.in_graph, "replays": 8, "statistic": "graph_ms: the median "
                                     "over the replays of a CUDA graph of copies of the op, per copy (launches "
                                     "overlapped, as a model run as one CUDA graph runs them)"}
                                    if args.in_graph else None),
                       "cold": ({"runs": args.cold, "statistic": "cold_ms: the median of runs each after a 256 MB "
                                 "buffer was written (the L2 flushed), between two events"} if args.cold else None),
                       "cold_weights": ({"runs": args.cold_weights, "statistic": "coldw_ms: the median of runs each "
                                         "after a 256 MB buffer was written (the L2 flushed) and the operands that "
                                         "are not weights were read (a sum of each), between two events"}
                                        if args.cold_weights else None)},
            "paths": backend.paths(),
            "signatures_file": {k: sig_header.get(k) for k in ("commit", "date", "suite", "models", "targets",
                                                               "strategies")} | {"count": len(recs)},
            "complete": False, "stopped": None, "elapsed_s": 0.0,
            "counts": {}, "entries": {}, "failed": {}, "unsupported": {}, "checks": {}}
        self.current = None  # (key, start time) of the signature being measured
        self._last_write = 0.0

    def resume_from(self, path: str) -> int:
        """Take over the results of an earlier table of the same device and backend; how many."""
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("format") != TABLE_FORMAT:
            raise SystemExit(f"calibrate: cannot resume {path}: not a table")
        if old["device"].get("gpu") != self.table["device"]["gpu"] or \
                old["method"].get("backend") != self.table["method"]["backend"]:
            raise SystemExit(f"calibrate: cannot resume {path}: measured on {old['device'].get('gpu')} "
                             f"({old['method'].get('backend')}), this is {self.table['device']['gpu']}")
        for k in ("entries", "failed", "unsupported", "checks"):
            self.table[k].update(old.get(k) or {})
        self.table["resumed_from"] = {"date": old.get("date"), "elapsed_s": old.get("elapsed_s")}
        return len(old.get("entries") or {}) + len(old.get("failed") or {}) + len(old.get("unsupported") or {})

    def _put(self, section: str, key: str, value) -> None:
        with self.lock:  # (the watchdog may be writing the table)
            self.table[section][key] = value

    def done(self, key: str) -> bool:
        t = self.table
        return key in t["entries"] or key in t["failed"] or key in t["unsupported"]

    def write(self, final: bool = False, stopped=None) -> None:
        with self.lock:
            t = self.table
            t["elapsed_s"] = round(time.monotonic() - self.t0, 2)
            if stopped:
                t["stopped"] = stopped
            todo = sum(1 for r in self.recs if not self.done(r["key"]))
            t["complete"] = todo == 0
            t["counts"] = {"signatures": len(self.recs), "measured": len(t["entries"]), "failed": len(t["failed"]),
                           "unsupported": len(t["unsupported"]), "not_reached": todo,
                           "views": sum(1 for e in t["entries"].values() if e.get("backend", "").startswith("view")),
                           "approximate": sum(1 for e in t["entries"].values() if e.get("approx"))}
            tmp = f"{self.args.out}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(t, f, indent=0, sort_keys=False)
            os.replace(tmp, self.args.out)
            self._last_write = time.monotonic()

    def maybe_checkpoint(self) -> None:
        if time.monotonic() - self._last_write >= self.args.checkpoint_s:
            self.write()

    def measure_one(self, rec: dict, check: bool) -> str:
        """Measure one signature into the table; 'measured', 'failed' or 'unsupported'."""
        key, a = rec["key"], self.args
        try:
            pl = plan(rec)
        except Unsupported as e:
            self._put("unsupported", key, str(e))
            return "unsupported"
        except Exception as e:  # a malformed record
            self._put("failed", key, f"plan: {type(e).__name__}: {e}"[:300])
            return "failed"
        try:
            cap = max(0.05, min(a.cap_s, self.deadline - time.monotonic()))
            inspect = (lambda pl, prep, entry: entry.update(rel_err=self._check(rec, pl, prep))) if check else None
            entry = measure(self.backend, rec, pl, a.warmup, a.repeats, cap, inspect, in_graph=a.in_graph,
                            cold=a.cold, cold_weights=a.cold_weights)
            self._put("entries", key, entry)
            return "measured"
        except Unsupported as e:
            self._put("unsupported", key, str(e))
            return "unsupported"
        except Exception as e:
            self._put("failed", key, f"{type(e).__name__}: {e}"[:300])
            return "failed"

    def _check(self, rec: dict, pl: Plan, prep: Prepared) -> float:
        """The relative error of the kernel's results against numpy's (float64), recorded per kind and path."""
        want = reference(pl, [np.asarray(x, dtype=np.float64) for x in prep.inputs], rec["out_shapes"])
        got = prep.outputs()
        err = max(rel_error(g, w) for g, w in zip(got, want))
        tol = 1e-2 if (self.args.tf32 or rec["dtype"] != "f32") else 1e-3  # (FP32 lands far under 1e-3)
        c = self.table["checks"].setdefault(f"{rec['kind']} | {prep.backend}", {"n": 0, "max_rel_err": 0.0})
        c["n"] += 1
        c["max_rel_err"] = max(c["max_rel_err"], err)
        c["ok"] = c["max_rel_err"] <= tol
        return err

    def run(self, recs: list, budget_s: float, smoke: bool = False) -> dict:
        a = self.args
        self.deadline = self.t0 + budget_s - a.reserve_s
        stats = {"measured": 0, "failed": 0, "unsupported": 0, "skipped": 0}
        checked: dict = {}
        self._start_watchdog()
        stopped = None
        for i, rec in enumerate(recs):
            if self.done(rec["key"]):
                stats["skipped"] += 1
                continue
            if time.monotonic() >= self.deadline:
                stopped = f"budget: {budget_s:g} s reached before signature {i + 1} of {len(recs)}"
                break
            # a few small signatures of each kind are checked against numpy (smoke: every small one)
            check = work(rec) <= a.check_work and (smoke or checked.get(rec["kind"], 0) < a.checks_per_kind)
            if check:
                checked[rec["kind"]] = checked.get(rec["kind"], 0) + 1
            self.current = (rec["key"], time.monotonic())
            what = self.measure_one(rec, check)
            self.current = None
            stats[what] += 1
            if a.verbose or smoke:
                e = self.table["entries"].get(rec["key"])
                print(_row(rec, what, e, self.table), flush=True)
            self.maybe_checkpoint()
        self.write(final=True, stopped=stopped)
        self._stop_watchdog = True
        return stats

    def _start_watchdog(self):
        self._stop_watchdog = False
        a = self.args

        def watch():
            while not self._stop_watchdog:
                time.sleep(0.5)
                cur = self.current
                now = time.monotonic()
                late = now > self.deadline + a.reserve_s + a.hang_s
                hung = cur is not None and now - cur[1] > a.hang_s
                if hung or late:
                    why = (f"watchdog: signature {cur[0][:120]} ran over {a.hang_s:g} s" if hung
                           else "watchdog: past the budget")
                    try:
                        if cur is not None:
                            self._put("failed", cur[0], why)
                        self.write(final=True, stopped=why)
                    finally:
                        sys.stderr.write(f"calibrate: {why}; the table so far is in {a.out}\n")
                        sys.stderr.flush()
                        os._exit(3)
        threading.Thread(target=watch, daemon=True).start()


def work(rec: dict) -> float:
    """Multiply-adds (conv2d, matmul) or elements touched: what a numpy check of the signature costs."""
    outs = sum(_numel(s) for s in rec["out_shapes"])
    try:
        if rec["kind"] == "conv2d":
            return outs * _numel(rec["in_shapes"][1][1:])
        if rec["kind"] == "matmul":
            return outs * rec["in_shapes"][0][-1]
    except (IndexError, TypeError):
        pass
    return outs + sum(_numel(s) for s in rec["in_shapes"])


def _row(rec: dict, what: str, e, table) -> str:
    shapes = " ".join("x".join(map(str, s)) or "()" for s in rec["in_shapes"])
    if e is None:
        why = table["failed"].get(rec["key"]) or table["unsupported"].get(rec["key"]) or ""
        return f"{rec['kind']:<24} {shapes[:44]:<44} {what}: {why[:100]}"
    err = f" err {e['rel_err']:.1e}" if "rel_err" in e else ""
    return (f"{rec['kind']:<24} {shapes[:44]:<44} {e['ms'] * 1e3:10.2f} us  IQR {e['q1_ms'] * 1e3:.2f}-"
            f"{e['q3_ms'] * 1e3:.2f}  x{e['repeats']}{err}  {e['backend']}")


def order(recs: list) -> list:
    """The measuring order: the earliest-priced signatures first (a model's own ops before its rewrites'
    variants), then the ones more models share."""
    return sorted(recs, key=lambda r: (r.get("rank", 0), -r.get("models", 1), r["key"]))


def smoke_pick(recs: list, n: int) -> list:
    """About ``n`` signatures for a first look: the smallest of each kind, then the largest conv2d and matmul."""
    by_kind: dict = {}
    for r in recs:
        by_kind.setdefault(r["kind"], []).append(r)
    size = lambda r: sum(_numel(s) for s in r["in_shapes"] + r["out_shapes"])  # noqa: E731
    main = ["conv2d", "matmul", "ewadd", "relu", "concat", "split", "transpose", "maxpool2d", "avgpool2d",
            "batchnorm", "ewmul", "smul", "sigmoid", "tanh", "reshape"]
    kinds = [k for k in main if k in by_kind] + sorted(k for k in by_kind if k not in main)
    pick = [min(by_kind[k], key=size) for k in kinds]
    for k in ("conv2d", "matmul"):
        if k in by_kind:
            pick.insert(2, max(by_kind[k], key=size))
    seen, out = set(), []
    for r in pick:
        if r["key"] not in seen:
            seen.add(r["key"])
            out.append(r)
    return out[:max(1, n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="measure the op signatures on this GPU into a cuda:<gpu> table")
    ap.add_argument("--sigs", default=DEFAULT_SIGS, help="the signatures file (default: signatures.jsonl beside this)")
    ap.add_argument("--out", required=True, help="the table to write (JSON; checkpointed as it goes)")
    ap.add_argument("--name", default="", help="the table's GPU name (default: from the device, e.g. h100)")
    ap.add_argument("--dry-run", action="store_true", help="rehearse on the CPU: numpy kernels, wall clock")
    ap.add_argument("--smoke", type=int, default=0, metavar="N", help="measure and check about N signatures, print them")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop measuring before this many seconds from the start")
    ap.add_argument("--reserve-s", type=float, default=3.0, help="seconds kept for the last write")
    ap.add_argument("--checkpoint-s", type=float, default=5.0, help="write the table at least this often")
    ap.add_argument("--cap-s", type=float, default=2.0, help="seconds one signature's runs may take (fewer repeats)")
    ap.add_argument("--hang-s", type=float, default=60.0, help="the watchdog's limit for one signature")
    ap.add_argument("--in-graph", type=int, default=0, metavar="N",
                    help="also time each op inside a CUDA graph of up to N copies of it (graph_ms; 0: not)")
    ap.add_argument("--cold", type=int, default=0, metavar="N",
                    help="also time each op N times with the L2 cache flushed before each run (cold_ms; 0: not)")
    ap.add_argument("--cold-weights", type=int, default=0, metavar="N",
                    help="also time each op N times with the L2 flushed and then its operands that are not weights "
                         "read back into it before each run: weights from DRAM, activations from L2 (coldw_ms; 0: not)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0, help="measure at most this many signatures (0: all)")
    ap.add_argument("--resume", action="store_true", help="continue the table in --out (same device and backend)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in cuBLAS and cuDNN (default: strict FP32)")
    ap.add_argument("--nvrtc", choices=("cuda.core", "cupy", "torch"), default="cuda.core",
                    help="the elementwise/movement kernels: NVRTC through cuda.core (default) or CuPy, or torch's own")
    ap.add_argument("--events", choices=("cuda.core", "torch"), default="cuda.core", help="the timing events")
    ap.add_argument("--checks-per-kind", type=int, default=2, help="signatures per kind checked against numpy")
    ap.add_argument("--check-work", type=float, default=2e7, help="only signatures this small are checked")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per signature")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    header, everything = read_signatures(a.sigs)
    recs = smoke_pick(everything, a.smoke) if a.smoke else order(everything)
    if a.limit:
        recs = recs[:a.limit]
    print(f"calibrate: {len(recs)} signatures from {a.sigs} (dumped at {header.get('commit')}, {header.get('date')})",
          flush=True)
    try:
        backend = DryBackend(a) if a.dry_run else CudaBackend(a)
    except Exception as e:
        print(f"calibrate: error: cannot start the {'dry' if a.dry_run else 'cuda'} backend: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    cal = Calibration(a, backend, header, everything, t0)  # (complete: every signature of the file)
    if a.resume and os.path.exists(a.out):
        print(f"calibrate: resuming {a.out}: {cal.resume_from(a.out)} signatures already done", flush=True)
    print(f"calibrate: device {cal.table['device']['gpu']}; paths: " +
          "; ".join(f"{k}: {v}" for k, v in cal.table["paths"].items() if k != "errors"), flush=True)
    for k, v in cal.table["paths"].get("errors", {}).items():
        print(f"calibrate: note: {k} failed: {v}", flush=True)
    cal.write()
    cal.run(recs, a.budget_s, smoke=bool(a.smoke))
    backend.close()
    t = cal.table
    print(f"calibrate: {t['counts']['measured']} measured ({t['counts']['views']} views, "
          f"{t['counts']['approximate']} approximate), {t['counts']['failed']} failed, "
          f"{t['counts']['unsupported']} unsupported, {t['counts']['not_reached']} not reached, in "
          f"{t['elapsed_s']:.1f} s{'; stopped: ' + t['stopped'] if t['stopped'] else ''} -> {a.out}", flush=True)
    bad = {k: v for k, v in t["checks"].items() if not v.get("ok")}
    for k, v in t["checks"].items():
        if a.smoke or not v.get("ok"):
            print(f"calibrate: check {k}: {v['n']} checked, max rel err {v['max_rel_err']:.2e}"
                  f"{'' if v.get('ok') else '  WRONG'}", flush=True)
    if t["failed"]:
        for k, v in list(t["failed"].items())[:10]:
            print(f"calibrate: failed: {k[:100]}: {v}", flush=True)
    return 1 if (bad or (a.smoke and t["failed"])) else 0


if __name__ == "__main__":
    sys.exit(main())
