"""The CPU target on exported models: does ``taso-opt M.onnx --taso-search`` make models faster on the
machine it runs on, and never slower?

For every ONNX file given (or found in a folder), each step in a fresh ``taso-opt`` process:

1. ``taso-opt M.onnx --taso-search`` with the default target (``auto``: this machine's CPU, measured in
   onnxruntime, with the latency check) and a cold op-timing cache (an empty cache folder): the time a
   first run costs;
2. the same again on the now warm cache: the time every later run costs;
3. the same with ``target=analytic:t4`` (the analytic T4 estimate, for comparison);

then both outputs are compared with the input on random inputs (largest absolute difference and the
output scale) and timed against it in onnxruntime on this machine's CPU (``latency.compare``: one
thread, interleaved rounds over fresh sessions, the median of the per-round speedups and their
quartiles). A speedup whose quartiles span 1 is within the noise. One markdown row per model and the
geometric means.

    python -m taso_mlir.benchmarks.cpu_target MODEL.onnx ... | DIR  [--rounds N] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

HEADER = ("| model | nodes | first run s (cold cache) | later runs s (warm) | rewrites | kept by the latency check | "
          "CPU speedup, target cpu (quartiles) | CPU speedup, target analytic:t4 (quartiles) | max abs diff (scale) |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _opt(src: str, dst: str, target: Optional[str], cache: str, report: str) -> tuple[float, dict]:
    opts = f"report={report}" + (f" target={target}" if target else "")
    env = dict(os.environ, TASO_CACHE_DIR=cache)
    env.pop("TASO_TARGET", None)  # (the default target is what is measured)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", src, "-o", dst,
                        f"--pass-pipeline=builtin.module(taso-search{{{opts}}})"], capture_output=True, text=True,
                       env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])
    with open(report) as f:
        return wall, json.load(f)


def _speedup_text(lat: dict) -> str:
    lo, hi = lat["iqr"]
    note = " (noise)" if lo <= 1.0 <= hi else ""
    return f"{lat['speedup']:.3f}x ({lo:.3f}-{hi:.3f}){note}"


def measure(path: str, work: str, settings) -> dict:
    import onnx

    from taso_mlir.benchmarks.torch_models import compare_outputs, model_stats
    from taso_mlir.dialect.numerics import random_feeds
    from taso_mlir.passes.cost.latency import compare

    name = os.path.splitext(os.path.basename(path))[0]
    row = {"model": name, "nodes": model_stats(path)["nodes"]}
    cache = tempfile.mkdtemp(prefix="cache-", dir=work)
    cpu_out, t4_out = os.path.join(work, f"{name}.cpu.onnx"), os.path.join(work, f"{name}.t4.onnx")
    row["cold_s"], rep = _opt(path, cpu_out, None, cache, os.path.join(work, f"{name}.cpu.json"))
    row["warm_s"], rep = _opt(path, cpu_out, None, cache, os.path.join(work, f"{name}.cpu.json"))
    _, rep_t4 = _opt(path, t4_out, "analytic:t4", cache, os.path.join(work, f"{name}.t4.json"))
    fr = rep["functions"][0]
    row["target"] = rep["target"]
    row["rewrites"] = fr["rewrites_applied"]
    row["kept"] = fr.get("latency_check", {}).get("kept", "-")
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    import numpy as np

    feeds = [random_feeds(sess, np.random.default_rng(s)) for s in (1, 2)]
    del sess
    diffs = [compare_outputs(path, out, feeds) for out in (cpu_out, t4_out)]
    row["max_abs"] = max(d[0] for d in diffs)
    row["scale"] = max(d[1] for d in diffs)
    src = onnx.load(path)
    row["cpu"] = compare(src, onnx.load(cpu_out), settings)
    row["t4"] = compare(src, onnx.load(t4_out), settings)
    return row


def format_row(r: dict) -> str:
    if "error" in r:
        return f"| {r['model']} | | FAILED: {r['error']} | | | | | | |"
    return (f"| {r['model']} | {r['nodes']} | {r['cold_s']:.1f} | {r['warm_s']:.1f} | {r['rewrites']} | {r['kept']} | "
            f"{_speedup_text(r['cpu'])} | {_speedup_text(r['t4'])} | {r['max_abs']:.3g} ({r['scale']:.3g}) |")


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.benchmarks.cpu_target", description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="ONNX files, or folders of them")
    ap.add_argument("--rounds", type=int, default=41, help="latency: at most this many rounds per model (41)")
    ap.add_argument("--budget", type=float, default=20.0, help="latency: seconds of rounds per model (20)")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    a = ap.parse_args(argv)
    from taso_mlir.passes.cost.latency import Settings

    settings = Settings(rounds=a.rounds, min_rounds=min(15, a.rounds), budget_s=a.budget, epochs=3)
    paths = []
    for m in a.models:
        if os.path.isdir(m):
            paths += sorted(os.path.join(m, f) for f in os.listdir(m) if f.endswith(".onnx"))
        elif os.path.isfile(m):
            paths.append(m)
        else:
            ap.error(f"{m}: no such file or folder")
    import onnxruntime
    import platform

    from taso_mlir.passes.cost.oracle import cpu_name

    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores), onnxruntime {onnxruntime.__version__}, one thread, "
          f"Python {platform.python_version()}\n\n{HEADER}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for p in paths:
            try:
                r = measure(p, work, settings)
            except Exception as e:  # one model's failure is its row
                r = {"model": os.path.basename(p), "error": " ".join(str(e).split())[:200]}
            rows.append(r)
            print(format_row(r), flush=True)
    ok = [r for r in rows if "error" not in r]
    print(f"\ngeometric mean CPU speedup: target cpu {geomean(r['cpu']['speedup'] for r in ok):.3f}x, "
          f"target analytic:t4 {geomean(r['t4']['speedup'] for r in ok):.3f}x over {len(ok)} model(s); "
          f"slower beyond noise (upper quartile < 1): target cpu "
          f"{sum(r['cpu']['iqr'][1] < 1 for r in ok)}, analytic:t4 {sum(r['t4']['iqr'][1] < 1 for r in ok)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
