#!/usr/bin/env python3
"""Measured GPU speedups of the optimized suite models (issue 25): original vs optimized ONNX graphs, run whole
on the GPU by two independent executors, interleaved rounds in one process, the median ratio and its
interquartile range, and the cost models' predictions against the measured latencies.

Runs on the GPU machine with its preinstalled packages (numpy, onnx, onnxruntime, torch, CuPy, cuda-python); it
reads what ``prepare.py`` wrote on the CPU (``models/<set>/manifest.json`` and the weight-stripped ONNX files)
and does not import taso_mlir.

    python3 benchmarks/gpu/speedup.py --out out/speedup.json                # the full suite, 240 s budget
    python3 benchmarks/gpu/speedup.py --set quick --budget-s 30 --out s.json   # the tiny models: a smoke run
    python3 benchmarks/gpu/speedup.py --dry-run --set quick --out dry.json  # the rehearsal on the CPU (numpy)

Per model (the cheapest first, by the predicted H100 cost, so a time-out leaves the most models):

1. each distinct file (the original and each optimized variant; variants whose searches found the same graph
   share one file) is loaded with its weights drawn from the recorded statistics, planned, given random inputs,
   and run by onnxruntime on the CPU: the reference;
2. each executor builds it and runs it once; outputs that differ from onnxruntime's beyond the tolerance make
   that file ``mismatch`` for that executor, and none of its timings count;
3. rounds: every (executor, file) that passed is timed once per round (a few runs, the median), in an order
   rotated per round, until the model's share of the budget is spent (at least ``--min-rounds``, at most
   ``--max-rounds``); per round the ratio original / optimized within each executor; the median of those
   ratios and their quartiles are the speedup, *unresolved* where the quartiles span 1.0;
4. fidelity: each file's predicted whole-graph cost under each cost model (from the manifest) beside the
   primary executor's measured latency, and, with ``--table`` (the calibration table measured in the same
   session), the sum of the table's measured op latencies over the file's ops (misses priced by the analytic
   H100 roofline, counted).

The graphs optimized for a measured table (``cuda:<gpu>``: ``--later``) come after every model's original and
analytic graphs: a second pass over the models where such a search exported a graph of its own (one that is the
same as an analytic graph, prepare.py's ``same_graph_as``, is timed once, in the first pass), each with its
original again, in rounds of their own. The first pass gets the budget less the second's share (files counted
alike), so the measured tables' graphs never take the place of the original suite's comparisons.
``--variants cuda:h100`` times only those graphs beside the original (one pass): a later call of the same
session, after a calibration and a ``prepare.py`` on the CPU.

The results JSON is written atomically after every model and every ``--checkpoint-s`` seconds; the loop stops
before ``--budget-s``; a watchdog writes what there is and exits (status 3) if one step hangs. A markdown
report (``--markdown``, default RESULTS-gpu.md beside the JSON) is written at the end.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import sys
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import calibrate as C  # noqa: E402
import execute as E  # noqa: E402

RESULTS_FORMAT = "taso-mlir gpu speedups 1"
EXECUTORS = ("taso", "torch")
EXECUTOR_DESC = {
    "taso": "execute.py: calibrate.py's kernel layer (cuDNN/cuBLAS via torch, NVRTC via cuda.core), buffers "
            "allocated once, one CUDA graph per model, per-run device events behind a spin kernel",
    "torch": "torch_exec.py: a small ONNX interpreter on PyTorch ops (torch's own elementwise and data-movement "
             "kernels), torch.cuda.CUDAGraph, batches of runs between torch.cuda.Event pairs",
}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_manifest(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"speedup: error: cannot read the manifest {path}: {e}")
    if m.get("format") != "taso-mlir gpu speedup manifest 1":
        raise SystemExit(f"speedup: error: {path} is not a speedup manifest (format {m.get('format')!r})")
    return m


def model_order(man: dict) -> list:
    """The manifest's models that have files, the cheapest first (predicted analytic H100 cost of the
    original)."""
    def cost(m):
        f = m["variants"]["original"]["file"]
        return m["files"][f]["predicted"]["total_ms"].get("analytic:h100", math.inf)
    return sorted((m for m in man["models"] if m.get("files")), key=cost)


def target_of(variant: str) -> str:
    """The cost model a variant's graph was searched with: ``opt-analytic-t4`` -> ``analytic:t4``,
    ``opt-cuda-h200`` -> ``cuda:h200`` (prepare.py's ``variant_name``, read back)."""
    return variant[4:].replace("-", ":", 1) if variant.startswith("opt-") else variant


def _error(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message (at most 300 characters)."""
    return C.K.error_line(e, 300)


def variant_arg(name: str) -> str:
    """``--variants``' names: a variant (``opt-cuda-h100``) or its cost model (``cuda:h100``)."""
    return name if name == "original" or name.startswith("opt-") else f"opt-{name.replace(':', '-')}"


def plan_files(m: dict, variant_set, later_prefixes) -> dict:
    """What to time of a manifest model: {variants: the variants timed -> file, first: the files of the first
    pass (the original, then the graphs of the cost models not named by ``later_prefixes``), later: the files
    only a later cost model's search exported (a graph the same as one in ``first`` is timed once, there),
    later_variants, same_graph_as: prepare.py's notes}. ``variant_set`` (None: all) limits the variants besides
    the original; where the first pass would hold the original alone, the later files join it (one pass)."""
    orig = m["variants"]["original"]["file"]
    names = [v for v in m["variants"] if v == "original" or variant_set is None or v in variant_set]
    vmap = {v: m["variants"][v]["file"] for v in names}

    def is_later(v):
        return v != "original" and any(target_of(v).startswith(p) for p in later_prefixes)
    first = list(dict.fromkeys([orig] + [vmap[v] for v in names if v != "original" and not is_later(v)]))
    later = [f for f in dict.fromkeys(vmap[v] for v in names if is_later(v)) if f not in first]
    if len(first) == 1:
        first, later = first + later, []
    return {"variants": vmap, "first": first, "later": later,
            "later_variants": [v for v in names if is_later(v) and vmap[v] in later],
            "same_graph_as": {v: m["variants"][v]["same_graph_as"] for v in names
                              if v != "original" and m["variants"][v].get("same_graph_as")}}


def timing_of(entry: dict, ex: str, f: str):
    """A file's timing statistics for an executor: from the first pass, else the later one (None)."""
    for t in (entry.get("timing") or {}, (entry.get("later") or {}).get("timing") or {}):
        s = (t.get(ex) or {}).get(f)
        if s:
            return s
    return None


def measured(entry: dict, ex: str, f: str):
    s = timing_of(entry, ex, f)
    return s["median_ms"] if s else None


def variant_order(res: dict) -> list:
    """The optimized variants of a results file in the manifest's target order (analytic:t4, analytic:h100,
    then the measured tables': the report's columns), any others after, sorted."""
    seen = {v for m in res["models"] for v in (m.get("variants") or {}) if v != "original"}
    order = [v for v in (variant_arg(t) for t in (res.get("manifest") or {}).get("targets") or []) if v in seen]
    return order + sorted(seen - set(order))


def shared_with(m: dict, v: str, order: list):
    """The earlier variant (in ``order``) whose file ``v`` shares: the same graph, timed once; None."""
    f = (m.get("variants") or {}).get(v)
    for u in order:
        if u == v:
            return None
        if f is not None and (m.get("variants") or {}).get(u) == f:
            return u
    return None


def quartiles(v: list) -> tuple:
    q1, med, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return q1, med, q3


def ratio_stats(orig: list, opt: list) -> dict:
    """Per-round ratios original / optimized: their median and quartiles; unresolved where they span 1."""
    rs = [a / b for a, b in zip(orig, opt) if b > 0]
    if not rs:
        return {"rounds": 0}
    q1, med, q3 = quartiles(rs)
    return {"median": med, "q1": q1, "q3": q3, "rounds": len(rs), "resolved": not (q1 <= 1.0 <= q3),
            "of_medians": float(np.median(orig) / np.median(opt)) if np.median(opt) > 0 else None}


# ---------------------------------------------------------------------------------------------------------
# executors


class Executors:
    """The executors this run uses, each with its device (None in a dry run) or the reason it is skipped."""

    def __init__(self, names: list, dry: bool, args):
        self.dry, self.args = dry, args
        self.use, self.skipped, self.dev, self.info = [], {}, None, {}
        for n in names:
            if n not in EXECUTORS:
                raise SystemExit(f"speedup: error: unknown executor {n!r} (executors: {', '.join(EXECUTORS)})")
        if dry:
            self.use = ["taso"] if "taso" in names else []
            if "torch" in names:
                self.skipped["torch"] = ("a dry run: the torch executor needs torch with a CUDA device"
                                         if importlib.util.find_spec("torch") else
                                         "a dry run, and torch is not installed here")
            self.info = {"gpu": "DRY RUN: numpy on the CPU "
                                f"({platform.processor() or platform.machine()}), not a GPU measurement",
                         "driver": "none", "python": platform.python_version(), "machine": platform.platform(),
                         "numpy": np.__version__}
            self.paths = {"taso": {"all": "numpy references of calibrate.py (dry run)"}}
            return
        self.paths = {}
        if "taso" in names:
            try:
                self.dev = E.open_device(args.tf32)
                self.use.append("taso")
                self.paths["taso"] = self.dev.paths()
                self.info = self.dev.device_info()
            except Exception as e:
                self.skipped["taso"] = f"cannot start the CUDA device: {type(e).__name__}: {e}"[:300]
        if "torch" in names:
            try:
                import torch_exec

                torch_exec.check_available()
                self.use.append("torch")
                self.paths["torch"] = torch_exec.describe(args.tf32)
                if not self.info:
                    self.info = torch_exec.device_info()
            except Exception as e:
                self.skipped["torch"] = f"{type(e).__name__}: {e}"[:300]

    def make(self, ex: str, gp, model, feeds):
        if ex == "taso":
            return E.make_runner("dry" if self.dry else "cuda", gp, feeds, self.dev, graph=not self.args.eager)
        import torch_exec

        return torch_exec.TorchRunner(model, feeds, graph=not self.args.eager, tf32=self.args.tf32)

    def free(self):
        if self.dry:
            return
        try:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------------
# the run


class Run:
    def __init__(self, args, man: dict, exe: Executors, t0: float):
        self.args, self.man, self.exe, self.t0 = args, man, exe, t0
        self.lock = threading.RLock()
        self.deadline = t0 + args.budget_s - args.reserve_s
        self.current = None  # (what, start)
        self.table = load_table(args.table) if args.table else None
        self.res = {
            "format": RESULTS_FORMAT, "date": _now(), "device": exe.info,
            "method": {"backend": "dry" if exe.dry else "cuda", "executors": {e: EXECUTOR_DESC[e] for e in exe.use},
                       "skipped_executors": exe.skipped, "paths": exe.paths,
                       "rounds": {"min": args.min_rounds, "max": args.max_rounds, "runs_per_round": args.runs},
                       "statistic": "per (executor, file) and round the median of a few runs; the speedup is the "
                                    "median of the per-round ratios original / optimized with their quartiles",
                       "tolerance": args.tolerance, "tf32": bool(args.tf32), "cuda_graphs": not args.eager,
                       "timing": "device time (CUDA events)" if not exe.dry else
                                 "wall clock around numpy (a rehearsal, not a GPU timing)",
                       "weights": man.get("weights"), "seed": args.seed,
                       "variants": sorted(args.variant_set) if args.variant_set is not None else "all",
                       "later": list(args.later_prefixes)},
            "manifest": {k: man.get(k) for k in ("set", "commit", "date", "targets", "cost_models", "specs")},
            "table": self.table["summary"] if self.table else None,
            "budget_s": args.budget_s, "elapsed_s": 0.0, "complete": False, "stopped": None, "models": []}
        self._last_write = 0.0

    # -- output

    def write(self, stopped=None):
        with self.lock:
            r = self.res
            r["elapsed_s"] = round(time.monotonic() - self.t0, 2)
            if stopped:
                r["stopped"] = stopped
            tmp = f"{self.args.out}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(_finite(r), f, indent=1)
            os.replace(tmp, self.args.out)
            self._last_write = time.monotonic()

    def maybe_checkpoint(self):
        if time.monotonic() - self._last_write >= self.args.checkpoint_s:
            self.write()

    def _doing(self, what: str):
        self.current = (what, time.monotonic())

    # -- per model

    def run(self, models: list) -> None:
        """Two passes. First every model's original and the graphs of the cost models not named by ``--later``
        (the analytic ones), the cheapest model first, as before the measured tables' graphs existed; then, for
        the models where a ``--later`` cost model's search exported a graph of its own (not the same as one
        timed already: prepare.py's ``same_graph_as``), that graph with the original again, in rounds of their
        own. The first pass's models share the budget less what the second pass needs (its files counted
        alike, the originals again included), so the later graphs cannot take the first comparisons' place:
        a first-pass model is only ever left out where the whole budget is spent."""
        self._start_watchdog()
        stopped = None
        plans = {m["name"]: plan_files(m, self.args.variant_set, self.args.later_prefixes) for m in models}
        n_first = sum(len(p["first"]) for p in plans.values())
        n_later = sum(len(p["later"]) + 1 for p in plans.values() if p["later"])
        first_end = self.t0 + (self.deadline - self.t0) * n_first / max(1, n_first + n_later)
        with self.lock:
            self.res["passes"] = {"first_files": n_first, "later_files": n_later,
                                  "later": list(self.args.later_prefixes),
                                  "first_share_s": round(first_end - self.t0, 2)}
        for i, m in enumerate(models):
            left = self.deadline - time.monotonic()
            if left <= 0:
                stopped = f"budget: {self.args.budget_s:g} s reached before model {i + 1} of {len(models)} ({m['name']})"
                break
            share = max(0.0, first_end - time.monotonic()) / (len(models) - i)
            p = plans[m["name"]]
            entry = {"name": m["name"], "title": m.get("title"), "config": m.get("config"), "status": "running",
                     "variants": p["variants"], "_t0": time.monotonic()}
            if p["same_graph_as"]:
                entry["same_graph_as"] = p["same_graph_as"]
            with self.lock:
                self.res["models"].append(entry)
            # (filled as it goes: a checkpoint or the watchdog writes what is known of a model under way)
            part = {"files": {}, "timing": {}, "rounds": 0}
            entry.update(files=part["files"], timing=part["timing"], rounds=0)
            try:
                self.model(m, p["first"], time.monotonic() + share, part)
                entry["rounds"] = part["rounds"]
            except Exception as e:  # one model's failure is that model's
                entry["status"] = "failed"
                entry["error"] = _error(e)
                entry["traceback"] = traceback.format_exc(limit=4)[-1500:]
            else:
                self.summarize(m, entry)
            finally:
                self.exe.free()
                entry["elapsed_s"] = round(time.monotonic() - entry.pop("_t0", time.monotonic()), 2)
            print(_model_line(entry), flush=True)
            self.write()
        done = {m["name"] for m in self.res["models"]}
        self.res["not_reached"] = [m["name"] for m in models if m["name"] not in done]
        later = [m for m in models if plans[m["name"]]["later"] and m["name"] in done
                 and next(e for e in self.res["models"] if e["name"] == m["name"]).get("status") != "failed"]
        for i, m in enumerate(later):
            if stopped is not None:
                break
            left = self.deadline - time.monotonic()
            if left <= 0:
                stopped = (f"budget: {self.args.budget_s:g} s reached before the later graphs of model {i + 1} of "
                           f"{len(later)} ({m['name']})")
                break
            entry = next(e for e in self.res["models"] if e["name"] == m["name"])
            p = plans[m["name"]]
            orig = m["variants"]["original"]["file"]
            part = {"files": {}, "timing": {}, "rounds": 0}
            entry["later"] = {"variants": p["later_variants"], "graphs": list(p["later"]), "files": part["files"],
                              "timing": part["timing"], "rounds": 0, "status": "running"}
            t = time.monotonic()
            try:
                self.model(m, [orig] + p["later"], time.monotonic() + left / (len(later) - i), part)
                failed = None
            except Exception as e:
                failed = {"status": "failed",
                          "error": _error(e),
                          "traceback": traceback.format_exc(limit=4)[-1500:]}
            finally:
                self.exe.free()
                with self.lock:  # the later graphs' checks beside the others'; the original's second check stays
                    entry["later"]["rounds"] = part["rounds"]
                    entry["later"]["files"] = {f: fe for f, fe in part["files"].items() if f == orig}
                    entry["files"].update((f, fe) for f, fe in part["files"].items() if f != orig)
                entry["later"]["elapsed_s"] = round(time.monotonic() - t, 2)
            if failed:
                entry["later"].update(failed)
            else:
                self.summarize(m, entry)
            print(_model_line(entry, later=True), flush=True)
            self.write()
        self.res["later_not_reached"] = [m["name"] for m in models if plans[m["name"]]["later"]
                                         and not any(e["name"] == m["name"] and e.get("later")
                                                     for e in self.res["models"])]
        self.res["complete"] = not self.res["not_reached"] and not self.res["later_not_reached"] and stopped is None
        self.current = None
        self._stop = True
        self.write(stopped=stopped)

    def model(self, m: dict, files: list, until: float, part: dict) -> None:
        """Load, check and time ``files`` of model ``m`` (interleaved rounds until ``until``) into ``part``:
        {files: per file its plan and each executor's check, timing: executor -> file -> statistics, rounds}."""
        a = self.args
        # (the manifest's digest of each file: report.py matches files of two runs by it)
        part["files"].update((f, {"digest": (m["files"].get(f) or {}).get("digest")}) for f in files)
        runners = {}  # (executor, file) -> runner
        try:
            for f in files:
                fe = part["files"][f]
                if time.monotonic() >= self.deadline:
                    fe["error"] = "not reached (budget)"
                    continue
                self._doing(f"{f}: load, plan, onnxruntime")
                t = time.monotonic()
                model = E.load_model(os.path.join(a.models_dir, f), a.seed)
                try:
                    gp = E.plan_graph(model)
                except (E.ExecError, E.Unsupported) as e:
                    fe["error"] = f"plan: {e}"
                    continue
                fe["plan"] = gp.summary()
                feeds = E.random_feeds(model, a.seed)
                ref = E.ort_outputs(model, feeds)
                fe["reference_s"] = round(time.monotonic() - t, 2)
                fe["executors"] = {}
                for ex in self.exe.use:
                    self._doing(f"{f}: {ex}: build and check")
                    t = time.monotonic()
                    xe = fe["executors"][ex] = {}
                    try:
                        r = self.exe.make(ex, gp, model, feeds)
                    except (E.ExecError, E.Unsupported) as e:
                        xe.update(status="unsupported", error=str(e)[:300])
                        continue
                    except Exception as e:
                        xe.update(status="failed", error=_error(e))
                        continue
                    c = E.check(r, ref, a.tolerance)
                    xe.update(status="ok" if c["ok"] else "mismatch", check=c, mode=r.mode,
                              build_s=round(time.monotonic() - t, 2))
                    if r.capture_error:
                        xe["capture_error"] = r.capture_error
                    if getattr(r, "kernels", None):
                        xe["kernels"] = r.kernels
                    if c["ok"]:
                        runners[(ex, f)] = r
                    else:
                        r.release()
                del model, ref
                self.maybe_checkpoint()
            self.rounds(part, runners, until)
        finally:
            for r in runners.values():
                try:
                    r.release()
                except Exception:
                    pass
            runners.clear()

    def rounds(self, part: dict, runners: dict, until: float) -> None:
        a = self.args
        keys = sorted(runners)
        per = {k: [] for k in keys}
        n = 0
        while keys and n < a.max_rounds:
            now = time.monotonic()
            if now >= self.deadline or (n >= a.min_rounds and now >= until):
                break
            order = keys[n % len(keys):] + keys[:n % len(keys)]
            for k in order:
                self._doing(f"{k[1]}: {k[0]}: round {n + 1}")
                t = runners[k].time(a.warmup if n == 0 else 1, a.runs, a.cap_s)
                per[k].append(float(np.median(t)))
            n += 1
            self.maybe_checkpoint()
        part["rounds"] = n
        for (ex, f), v in per.items():
            if v:
                q1, med, q3 = quartiles(v)
                part["timing"].setdefault(ex, {})[f] = {"median_ms": med, "q1_ms": q1, "q3_ms": q3, "rounds": v}

    def summarize(self, m: dict, entry: dict) -> None:
        """The speedups (each variant's file against the original timed in the same rounds: the first pass's,
        or the later pass's for a graph timed there), the fidelity rows and the statuses, from what ``entry``
        holds (run again after the later pass)."""
        orig = m["variants"]["original"]["file"]
        later = entry.get("later") or {}
        entry["speedup"] = {}
        for v, f in entry["variants"].items():
            if v == "original":
                continue
            for timing, where in ((entry.get("timing") or {}, None), (later.get("timing") or {}, "later")):
                for ex, t in timing.items():
                    if orig in t and f in t and v not in entry["speedup"].get(ex, {}):
                        s = ratio_stats(t[orig]["rounds"], t[f]["rounds"])
                        if where:
                            s["pass"] = where
                        entry["speedup"].setdefault(ex, {})[v] = s
        fid = entry["fidelity"] = {}
        for f in entry["files"]:
            pred = m["files"][f]["predicted"]
            row = {"predicted_ms": dict(pred["total_ms"]), "measured_ms": measured(entry, "taso", f)}
            if self.table:
                row["table"] = table_cost(self.table, pred["ops"])
            fid[f] = row
        graphs = set(later.get("graphs") or ())
        entry["status"] = self._status({f: fe for f, fe in entry["files"].items() if f not in graphs},
                                       entry.get("rounds"))
        if later:
            later["status"] = self._status({**(later.get("files") or {}),
                                            **{f: fe for f, fe in entry["files"].items() if f in graphs}},
                                           later.get("rounds"))

    def _status(self, files: dict, rounds) -> str:
        st = [x.get("status") for fe in files.values() for x in (fe.get("executors") or {}).values()]
        errs = [fe.get("error") for fe in files.values() if fe.get("error")]
        if "mismatch" in st:
            return "mismatch"
        if st and all(s == "ok" for s in st) and not errs and rounds:
            return "ok"
        if rounds:
            return "partial"
        if "ok" in st and time.monotonic() >= self.deadline:
            return "checked, not timed (budget)"
        return "failed"

    def _start_watchdog(self):
        self._stop = False
        a = self.args

        def watch():
            while not self._stop:
                time.sleep(0.5)
                cur, now = self.current, time.monotonic()
                hung = cur is not None and now - cur[1] > a.hang_s
                late = now > self.deadline + a.reserve_s + a.hang_s
                if hung or late:
                    why = (f"watchdog: '{cur[0]}' ran over {a.hang_s:g} s" if hung else "watchdog: past the budget")
                    try:
                        self.write(stopped=why)
                    finally:
                        sys.stderr.write(f"speedup: {why}; the results so far are in {a.out}\n")
                        sys.stderr.flush()
                        os._exit(3)
        threading.Thread(target=watch, daemon=True).start()


def _finite(o):
    """JSON has no NaN or Infinity: such numbers become null."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def load_table(path: str):
    """A calibration table (calibrate.py's output) for the fidelity's measured column; None if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            t = json.load(f)
    except (OSError, ValueError):
        return None
    if t.get("format") != C.TABLE_FORMAT:
        return None
    return {"entries": t.get("entries") or {}, "summary": {
        "path": os.path.basename(path), "name": t.get("name"), "gpu": (t.get("device") or {}).get("gpu"),
        "date": t.get("date"), "complete": t.get("complete"), "entries": len(t.get("entries") or {})}}


def table_cost(table: dict, ops: list) -> dict:
    """The sum over a file's ops of the table's measured medians; ops missing from it priced by the analytic
    H100 roofline (unfitted), counted."""
    ms, hits, miss = 0.0, 0, 0
    for key, _kind, count, costs in ops:
        e = table["entries"].get(key)
        if e is not None:
            ms += count * float(e["ms"])
            hits += count
        else:
            ms += count * float(costs.get("analytic:h100", 0.0))
            miss += count
    return {"ms": ms, "measured_ops": hits, "estimated_ops": miss}


def _model_line(e: dict, later: bool = False) -> str:
    lt = e.get("later") or {}
    if later:
        parts = [f"speedup: {e['name']} (later: {', '.join(target_of(v) for v in lt.get('variants', []))}): "
                 f"{lt.get('status')}"]
    else:
        parts = [f"speedup: {e['name']}: {e['status']}"]
    for ex, sp in (e.get("speedup") or {}).items():
        for v, s in sp.items():
            if s.get("rounds") and (s.get("pass") == "later") == later:
                lab = f"{s['median']:.3f}x ({s['q1']:.3f}-{s['q3']:.3f})" + ("" if s["resolved"] else " unresolved")
                parts.append(f"{ex} {v} {lab}")
    err = lt.get("error") if later else e.get("error")
    if err:
        parts.append(err)
    graphs = set(lt.get("graphs") or ())
    for f, fe in (e.get("files") or {}).items():
        if (f in graphs) != later:
            continue
        if fe.get("error"):
            parts.append(f"{f}: {fe['error']}")
        for ex, xe in (fe.get("executors") or {}).items():
            if xe.get("status") != "ok":
                parts.append(f"{f} {ex}: {xe.get('status')} {xe.get('error') or ''}".strip())
    return "; ".join(parts) + f" [{(lt if later else e).get('rounds', 0)} rounds]"


# ---------------------------------------------------------------------------------------------------------
# the report


def _fmt_ratio(s: dict) -> str:
    if not s or not s.get("rounds"):
        return "-"
    if not s["resolved"]:
        return f"~1.0x (unresolved: IQR {s['q1']:.3f}-{s['q3']:.3f})"
    return f"{s['median']:.3f}x ({s['q1']:.3f}-{s['q3']:.3f})"


def markdown(res: dict, chart: str = "", fidelity_note: str = "") -> str:
    dev = res.get("device") or {}
    pk = dev.get("packages") or {}
    dry = res["method"]["backend"] == "dry"
    out = ["# Measured GPU speedups" + (" (DRY RUN: numpy on the CPU, not a GPU measurement)" if dry else ""), ""]
    out.append(f"- **Date:** {res['date']}; {res['elapsed_s']:.0f} s of a {res['budget_s']:g} s budget"
               f"{'; complete' if res['complete'] else '; INCOMPLETE: ' + str(res.get('stopped') or 'not every model reached')}")
    if res.get("note"):
        out.append(f"- **Runs:** {res['note']}")
    out.append(f"- **GPU:** {dev.get('gpu', '?')}; driver {dev.get('driver', '?')}; CUDA runtime "
               f"{dev.get('cuda_runtime', '-')}; cuDNN {dev.get('cudnn', '-')}; cuBLAS {dev.get('cublas', '-')}; "
               f"NVRTC {dev.get('nvrtc', '-')}")
    if pk:
        out.append("- **Packages:** " + ", ".join(f"{k} {v}" for k, v in sorted(pk.items())))
    out.append(f"- **Models:** the `{res['manifest'].get('set')}` set prepared at {res['manifest'].get('commit')} "
               f"({res['manifest'].get('date')}); optimized by taso-search with "
               f"{', '.join(res['manifest'].get('targets') or [])}; weights: {res['method'].get('weights')}")
    out.append("- **Executors:** " + "; ".join(f"`{k}`: {v}" for k, v in res["method"]["executors"].items())
               + "".join(f"; `{k}` skipped: {v}" for k, v in res["method"].get("skipped_executors", {}).items()))
    out.append(f"- **Method:** {res['method']['statistic']}; {res['method']['timing']}; FP32 "
               f"{'with TF32' if res['method']['tf32'] else 'strict (TF32 off)'}; outputs checked against "
               f"onnxruntime (CPU) first (relative error at most {res['method']['tolerance']:g}), a file that "
               "differs is not timed.")
    out.append("")
    out.append("## Speedup of the optimized graph (original / optimized latency)")
    out.append("")
    exs = list(res["method"]["executors"])
    variants = variant_order(res)
    later = any(m.get("later") for m in res["models"]) or res.get("later_not_reached")
    out.append("One column per cost model the graph was optimized for (taso-search's target) and executor. "
               + ("The graphs of the measured tables' cost models (" + ", ".join(
                   f"`{p}*`" for p in res["method"].get("later") or []) + ") were timed in a second pass, after "
                  "every model's other graphs, each with the original again in rounds of their own (the rounds "
                  "column: first + later pass). " if later else "")
               + "*Same graph as X*: the search exported the graph X's search did (the same file; *renamed*: the "
               "same structure under other value names), timed once; its ratio is X's.")
    out.append("")
    head = ["model", "status", "rounds"] + [f"{ex}: {target_of(v)}" for v in variants for ex in exs]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for m in res["models"]:
        same = sum(1 for x in res["models"] if (x.get("title") or x["name"]) == (m.get("title") or m["name"]))
        lt = m.get("later") or {}
        row = [(m.get("title") or m["name"]) + (f" ({m['name']})" if same > 1 else ""),
               m["status"] + (f"; later: {lt.get('status')}" if lt and lt.get("status") != m["status"] else ""),
               str(m.get("rounds", 0)) + (f" + {lt.get('rounds', 0)}" if lt else "")]
        for v in variants:
            u = shared_with(m, v, variants)
            for ex in exs:
                if v not in (m.get("variants") or {}):
                    row.append("-")
                elif u is not None:
                    how = ((m.get("same_graph_as") or {}).get(v) or {}).get("how", "")
                    row.append(f"same graph as {target_of(u)}" + (" (renamed)" if "names" in how else ""))
                else:
                    row.append(_fmt_ratio(((m.get("speedup") or {}).get(ex) or {}).get(v)))
        out.append("| " + " | ".join(row) + " |")
    if res.get("not_reached"):
        out.append("")
        out.append(f"Not reached within the budget: {', '.join(res['not_reached'])}.")
    if res.get("later_not_reached"):
        out.append("")
        out.append(f"Later graphs not reached within the budget: {', '.join(res['later_not_reached'])}.")
    out.append("")
    out.append("## Latency per file (median of the per-round medians, ms; mode; check against onnxruntime)")
    out.append("")
    out.append("| model | file | " + " | ".join(exs) + " |")
    out.append("|---|---|" + "---|" * len(exs))
    for m in res["models"]:
        lt = m.get("later") or {}
        graphs = set(lt.get("graphs") or ())
        # (file, its checks, the pass's timing, the row's label): the later pass's graphs and its original last
        rows = [(f, fe, (lt if f in graphs else m).get("timing") or {}, f) for f, fe in (m.get("files") or {}).items()]
        rows += [(f, fe, lt.get("timing") or {}, f"{f} (again, in the later pass)")
                 for f, fe in (lt.get("files") or {}).items()]
        for f, fe, timing, name in rows:
            cells = []
            for ex in exs:
                xe = (fe.get("executors") or {}).get(ex) or {}
                t = (timing.get(ex) or {}).get(f)
                if fe.get("error"):
                    cells.append(fe["error"][:80])
                elif xe.get("status") != "ok":
                    cells.append(f"{xe.get('status', '-')}: {(xe.get('error') or '')[:60]}"
                                 + (f" rel err {xe['check']['rel_err']:.2g}" if xe.get("check") else ""))
                else:
                    lat = f"{t['median_ms']:.4g} ({t['q1_ms']:.4g}-{t['q3_ms']:.4g})" if t else "not timed"
                    cells.append(f"{lat}; {xe.get('mode')}; err {xe['check']['rel_err']:.1e}")
            out.append(f"| {m['name']} | {name} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("## Cost-model fidelity (predicted whole-graph cost vs measured latency, `taso` executor)")
    out.append("")
    if fidelity_note:  # (report.py's: the predictions re-priced)
        out += [fidelity_note, ""]
    cms = list(res["manifest"].get("cost_models") or [])
    has_table = any("table" in r for m in res["models"] for r in (m.get("fidelity") or {}).values())
    head = ["model", "file", "measured ms"] + [f"{c} ms (pred/meas)" for c in cms]
    if has_table:
        head.append(f"table {res['table']['name'] if res.get('table') else ''} ms (pred/meas; ops measured/estimated)")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for m in res["models"]:
        for f, r in (m.get("fidelity") or {}).items():
            meas = r.get("measured_ms")
            row = [m["name"], f, f"{meas:.4g}" if meas else "-"]
            for c in cms:
                p = r["predicted_ms"].get(c)
                row.append(f"{p:.4g} ({p / meas:.2f})" if p is not None and meas else (f"{p:.4g}" if p is not None else "-"))
            if has_table:
                t = r.get("table")
                row.append(f"{t['ms']:.4g} ({t['ms'] / meas:.2f}; {t['measured_ops']}/{t['estimated_ops']})"
                           if t and meas else "-")
            out.append("| " + " | ".join(row) + " |")
    if chart:
        out += ["", f"![speedups]({chart})"]
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="original vs optimized suite models on the GPU: speedups, checks, "
                                             "cost-model fidelity")
    ap.add_argument("--set", default="full", help="the prepared set: full or quick (default: full)")
    ap.add_argument("--manifest", default="", help="a manifest (default: models/<set>/manifest.json beside this)")
    ap.add_argument("--out", required=True, help="the results JSON (checkpointed as it goes)")
    ap.add_argument("--markdown", default="", help="the report (default: RESULTS-gpu.md beside --out)")
    ap.add_argument("--dry-run", action="store_true", help="rehearse on the CPU: numpy kernels, wall clock")
    ap.add_argument("--models", default="", help="comma-separated models (default: every one in the manifest)")
    ap.add_argument("--executors", default="taso,torch", help="taso (execute.py), torch (torch_exec.py)")
    ap.add_argument("--variants", default="", help="comma-separated optimized variants to time beside the original, "
                                                   "by name (opt-cuda-h100) or cost model (cuda:h100); default: all")
    ap.add_argument("--later", default="cuda:", help="comma-separated cost-model prefixes whose graphs are timed in a "
                                                     "second pass, after every model's others (default: cuda:, the "
                                                     "measured tables; '' times every graph in one pass)")
    ap.add_argument("--table", default="", help="a calibration table of this GPU (calibrate.py's output) for the "
                                                "fidelity's measured column")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop before this many seconds from the start")
    ap.add_argument("--reserve-s", type=float, default=3.0, help="seconds kept for the last write")
    ap.add_argument("--checkpoint-s", type=float, default=5.0)
    ap.add_argument("--hang-s", type=float, default=90.0, help="the watchdog's limit for one step")
    ap.add_argument("--min-rounds", type=int, default=5)
    ap.add_argument("--max-rounds", type=int, default=31)
    ap.add_argument("--runs", type=int, default=10, help="timed runs per (executor, file) and round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cap-s", type=float, default=2.0, help="seconds one (executor, file) may take per round")
    ap.add_argument("--tolerance", type=float, default=E.TOLERANCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    a.manifest = a.manifest or os.path.join(HERE, "models", a.set, "manifest.json")
    a.models_dir = os.path.dirname(os.path.abspath(a.manifest))
    man = read_manifest(a.manifest)
    models = model_order(man)
    if a.models:
        want = [n for n in a.models.split(",") if n]
        bad = [n for n in want if n not in {m["name"] for m in models}]
        if bad:
            print(f"speedup: error: model(s) {', '.join(bad)} not in {a.manifest}", file=sys.stderr)
            return 2
        models = [m for m in models if m["name"] in want]
    a.later_prefixes = tuple(p for p in a.later.split(",") if p)
    a.variant_set = None
    if a.variants:
        a.variant_set = {variant_arg(v) for v in a.variants.split(",") if v}
        have = {v for m in models for v in m["variants"]}
        bad = sorted(a.variant_set - have)
        if bad:
            print(f"speedup: error: variant(s) {', '.join(bad)} not in {a.manifest} (variants: "
                  f"{', '.join(sorted(have - {'original'}))})", file=sys.stderr)
            return 2
    exe = Executors([x for x in a.executors.split(",") if x], a.dry_run, a)
    if not exe.use:
        print("speedup: error: no executor can run: " + "; ".join(f"{k}: {v}" for k, v in exe.skipped.items()),
              file=sys.stderr)
        return 2
    print(f"speedup: {len(models)} models of {a.manifest} ({man.get('set')}, prepared at {man.get('commit')}); "
          f"device {exe.info.get('gpu')}; executors {', '.join(exe.use)}"
          + "".join(f"; {k} skipped: {v}" for k, v in exe.skipped.items()), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    run = Run(a, man, exe, t0)
    if a.table and run.table is None:
        print(f"speedup: note: no usable calibration table at {a.table}: the fidelity has no measured column",
              flush=True)
    run.write()
    run.run(models)
    md = a.markdown or os.path.join(os.path.dirname(os.path.abspath(a.out)), "RESULTS-gpu.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(markdown(run.res))
    r = run.res
    bad = [m["name"] for m in r["models"]
           if m["status"] == "mismatch" or (m.get("later") or {}).get("status") == "mismatch"]
    print(f"speedup: {len(r['models'])} of {len(models)} models in {r['elapsed_s']:.1f} s"
          f"{'; stopped: ' + r['stopped'] if r['stopped'] else ''}; mismatches: {', '.join(bad) or 'none'} -> "
          f"{a.out}, {md}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
