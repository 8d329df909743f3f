"""Backtracking vs equality saturation on the benchmark suite: how far is each search from the best graph
the rules allow?

For every suite model (``benchmarks/suite.py``), ``taso-search`` runs once with ``strategy=backtracking``
and once with ``strategy=eqsat``, each in a fresh process (its peak memory is its own), with the same
target (default ``analytic:t4``: the figures TASO and TENSAT published are GPU cost-model figures) and
the same prepare and cleanup passes. Reported per model: the cost of the prepared function both searches
start from (batchnorms, scales, bias adds and activations fused, as runtimes run a model) and after each
strategy (after the cleanup passes), eqsat's cost relative to backtracking's, the search times (eqsat's split into
saturation and extraction), eqsat's time as TENSAT's published times count it (its ``analysis/stats.py``: the
saturation, cycle filtering included, plus the ILP solver's wall time; here every round's saturation, cycle
filter and HiGHS runs, without building the e-graph and the integer program or writing the graph back: the
median of ``--repeat`` runs (3), each in a fresh process, as wall time and as the process's CPU time, with
the wall times' range; the runs must give the same result), peak memory, the e-graph's size and why saturation stopped (the last
e-graph's; and how many e-graphs the restarts built), and the
extraction's method, solver status and gap (the solver's bound against its result). A gap of 0 proves
the extracted graph the cheapest of the graphs the e-graph holds (priced as written, before cleanup);
it says nothing of graphs the saturation did not reach within its limits, which is where backtracking
can be ahead.

    python -m taso_mlir.benchmarks.strategies [--models a,b] [--target analytic:t4] [--json FILE] [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

_CHILD = """
import sys
from taso_mlir.passes.cost.oracle import unwrap, wrapping_cost_models
from taso_mlir.tools.taso_opt import main
made = []
with wrapping_cost_models(lambda cm: made.append(cm) or cm):
    rc = main(sys.argv[1:], contain=False)
kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
sys.stderr.write("\\ntaso-strategies-peak-rss-kb %d\\n" % kb)
tables = [unwrap(cm) for cm in made if hasattr(unwrap(cm), "counts")]
if tables:
    sys.stderr.write("taso-strategies-signatures %d %d\\n" % (sum(t.hits for t in tables), sum(t.estimated for t in tables)))
sys.exit(rc)
"""

#: a fixed piece of pure-Python work (tuple-keyed dict inserts and lookups, as a search does), timed in CPU
#: seconds: the same work every run, so its time gauges how fast this machine runs Python at the moment
#: (a shared machine's speed moves by a third within a day, and the table's times move with it)
_GAUGE = """
import statistics, time
def work():
    t = time.process_time()
    d = {}
    for i in range(200000):
        d[(i, "conv2d", (i % 7, i % 11))] = i
    s = 0
    for i in range(200000):
        s += d[(i, "conv2d", (i % 7, i % 11))]
    return time.process_time() - t
print(statistics.median(work() for _ in range(3)))
"""


def gauge() -> float:
    """The CPU seconds of the reference work (``_GAUGE``) in a fresh process: a gauge of the machine's
    speed at the time, reported beside the table's times (lower is faster)."""
    r = subprocess.run([sys.executable, "-c", _GAUGE], capture_output=True, text=True, timeout=120)
    return round(float(r.stdout.strip()), 4)


HEADER = ("| model | cost prepared ms | backtracking ms (less) | eqsat ms (less) | eqsat vs backtracking | search s "
          "backtracking / eqsat (saturation, extraction) | eqsat s as TENSAT counts: median wall (CPU; range) | "
          "peak MB backtracking / eqsat | "
          "e-nodes (stop; e-graphs) | extraction (status, gap) |\n|---|---|---|---|---|---|---|---|---|---|")


def run_one(src: str, strategy: str, target: str, work: str, extra: str = "") -> dict:
    rep = os.path.join(work, f"{os.path.basename(src)}.{strategy}.json")
    out = os.path.join(work, f"{os.path.basename(src)}.{strategy}.onnx")
    opts = f"target={target} strategy={strategy} report={rep} {extra}".strip()
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _CHILD, src, "-o", out, f"--pass-pipeline=builtin.module(taso-search{{{opts}}})",
                        "--no-progress"], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "peak-rss" not in ln]
        return {"error": lines[-1] if lines else f"exit {p.returncode}"}
    kb = int(p.stderr.rsplit("taso-strategies-peak-rss-kb", 1)[1].split()[0])
    with open(rep) as f:
        r = json.load(f)
    fr = r["functions"][0]
    os.unlink(out)
    # (before: the prepared function the search starts from, activations fused as runtimes run them)
    res = {"before": fr["cost_prepared_ms"], "imported": fr["cost_before_ms"], "after": fr["cost_after_ms"],
           "search_s": fr["search_s"], "wall_s": wall,
           "peak_mb": kb / 1024, "eqsat": fr.get("eqsat")}
    if "taso-strategies-signatures" in p.stderr:  # a measured table: the signatures found in it and estimated
        hits, est = p.stderr.rsplit("taso-strategies-signatures", 1)[1].split()[:2]
        res["signatures"] = {"measured": int(hits), "estimated": int(est)}
    return res


def format_row(name: str, b: dict, e: dict) -> str:
    def red(r):
        return f"{r['after']:.4g} ({100 * (r['before'] - r['after']) / r['before']:.1f}%)"

    if "error" in b or "error" in e:
        return f"| {name} | FAILED: {b.get('error') or e.get('error')} | | | | | | | | |"
    q = e["eqsat"]
    gap = "no bound" if q.get("gap") is None else f"gap {100 * q['gap']:.1f}%"
    walls, cpus = e.get("tensat_runs_s") or [q["tensat_counted_s"]], e.get("tensat_runs_cpu_s") or [q["tensat_counted_cpu_s"]]
    spread = f"; {min(walls):.2f}-{max(walls):.2f} in {len(walls)} runs" if len(walls) > 1 else ""
    return (f"| {name} | {b['before']:.4g} | {red(b)} | {red(e)} | {100 * (e['after'] - b['after']) / b['after']:+.1f}% | "
            f"{b['search_s']:.2f} / {e['search_s']:.2f} ({q['saturation_s']:.1f}, {q['solve_s']:.1f}) | "
            f"{statistics.median(walls):.2f} (CPU {statistics.median(cpus):.2f}{spread}) | "
            f"{b['peak_mb']:.0f} / {e['peak_mb']:.0f} | {q['enodes']} ({q['stop']}; {len(q.get('round_costs') or [1])} e-graphs) | {q['extraction']} ({q['status']}, {gap}) |")


def repeated(runs: list) -> dict:
    """The first of several eqsat runs of one model, with every run's time as TENSAT counts it (wall and
    CPU: ``tensat_runs_s``, ``tensat_runs_cpu_s``); an error where a run failed or where two runs'
    results differ (the search is deterministic: same cost, e-graph and rounds)."""
    bad = next((r for r in runs if "error" in r), None)
    if bad is not None:
        return bad

    def result(r):
        q = r["eqsat"]
        return (r["after"], q["enodes"], q["iterations"], q["matches"], q["applied"], q["cost_ms"],
                [(x["enodes"], x["matches"], x["applied"], x["cost_ms"]) for x in q.get("round_costs") or []])

    if any(result(r) != result(runs[0]) for r in runs[1:]):
        return {"error": f"eqsat's {len(runs)} runs of one model differ (the search should be deterministic)"}
    return runs[0] | {"tensat_runs_s": [r["eqsat"]["tensat_counted_s"] for r in runs],
                      "tensat_runs_cpu_s": [r["eqsat"]["tensat_counted_cpu_s"] for r in runs]}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.benchmarks.strategies", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="", help="comma-separated suite models (default: all)")
    ap.add_argument("--quick", action="store_true", help="the suite's tiny variants")
    ap.add_argument("--target", default="analytic:t4")
    ap.add_argument("--eqsat", default="", help="extra taso-search options for the eqsat run, e.g. 'eqsat-k-multi=2'")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    ap.add_argument("--repeat", type=int, default=3,
                    help="eqsat runs per model, each in a fresh process (default 3): the time as TENSAT counts is "
                         "their median, and their results must be the same")
    a = ap.parse_args(argv)
    import onnx

    from taso_mlir.benchmarks.runner import check_cost_model, table_text
    from taso_mlir.benchmarks.suite import suite

    # the target made once here: one that cannot be had (cuda:<gpu> without a measured table) is a one-line
    # error before any model runs (TasoError: taso-bench prints it; run as a module, _cli does)
    target = check_cost_model(a.target)

    models = suite(a.quick)
    if a.models:
        want = [m.strip() for m in a.models.split(",") if m.strip()]
        unknown = sorted(set(want) - {m.name for m in models})
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)} (models: {', '.join(m.name for m in models)})")
        models = [m for m in models if m.name in want]
    where = f"\ncosts {target['costs']}" + (f"\ntable {table_text(target['table'])}" if "table" in target else "")
    print(f"target {a.target}; eqsat options: {a.eqsat or 'defaults'}{where}\n\n{HEADER}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for m in models:
            src = os.path.join(work, f"{m.name}.onnx")
            onnx.save(m.build(), src)
            speed = gauge()
            b = run_one(src, "backtracking", a.target, work)
            e = repeated([run_one(src, "eqsat", a.target, work, a.eqsat) for _ in range(max(1, a.repeat))])
            rows.append({"model": m.name, "backtracking": b, "eqsat": e, "gauge_s": speed})
            print(format_row(m.name, b, e), flush=True)
            os.unlink(src)
    print("\nthis machine's speed as each model's runs began (CPU seconds of a fixed piece of pure-Python work, "
          "lower is faster; `strategies.gauge`): " + "; ".join(f"{r['model']} {r['gauge_s']:.3f}" for r in rows),
          flush=True)
    counted = [r for r in rows if "signatures" in r["backtracking"] or "signatures" in r["eqsat"]]
    if counted:
        def sg(x):
            return f"{x['signatures']['measured']} / {x['signatures']['estimated']}" if "signatures" in x else "-"

        print("\nop signatures measured (in the table) / estimated (the fitted roofline), backtracking; eqsat: "
              + "; ".join(f"{r['model']} {sg(r['backtracking'])}; {sg(r['eqsat'])}" for r in counted), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r | {"table": target["table"]} for r in rows] if "table" in target else rows, f, indent=1)
    return 0 if all("error" not in r["backtracking"] and "error" not in r["eqsat"] for r in rows) else 1


def _cli() -> int:
    from taso_mlir.dialect.errors import TasoError

    try:
        return main()
    except TasoError as e:
        print(f"taso-strategies: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_cli())
