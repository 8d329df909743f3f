"""Per-op costs timed alone against the same ops timed inside a CUDA graph (issue 25's fidelity question), on
the CPU from the in-graph calibration run (``run_ingraph.sh``): a table whose entries carry ``graph_ms``
(calibrate.py ``--in-graph``) and the whole-model latencies that run measured (speedup.py's results).

    python benchmarks/gpu/ingraph.py benchmarks/results/gpu/h100-graph.json benchmarks/results/gpu/speedup-ingraph.json

Prints markdown: per size class of op, what timing an op alone adds over the same op in a graph (its launch
and event overhead) and the ratio of the two; then per file, the whole model's measured latency against three
sums over the kernels the executor runs (prepare.py's manifest ops): the ops timed alone, alone less the
per-kernel overhead measured above, in a graph, and where the table has ``cold_ms`` (calibrate.py ``--cold``)
with the L2 flushed before each run, with and without that overhead; where it has ``coldw_ms`` (``--cold-weights``)
with the weights from DRAM and the activations in L2, with and without it, and by footprint: each file with its
weights from DRAM where they outgrow the L2 (``--l2-mb``), else as timed alone, less the overhead either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import speedup as SP  # noqa: E402  (the table and results formats)
BUCKETS = [(0, 0.005), (0.005, 0.01), (0.01, 0.02), (0.02, 0.05), (0.05, 0.1), (0.1, 1.0), (1.0, 1e9)]


def _q(v: list) -> str:
    q1, med, q3 = statistics.quantiles(v, n=4) if len(v) > 1 else (v[0], v[0], v[0])
    return f"{med:.2f} ({q1:.2f}-{q3:.2f})"


def weight_bytes(ops: list) -> int:
    """The bytes of the weights a file's kernels read (its manifest ops: signature key, kind, count, ...),
    from each signature's operand shapes and weight flags."""
    total = 0
    for key, _kind, cnt, *_ in ops:
        k = json.loads(key)
        flags = k[5] if len(k) > 5 else [0] * len(k[2])
        size = {"f16": 2, "bf16": 2}.get(k[4], 4)
        for shape, w in zip(k[2], flags):
            if w:
                total += cnt * size * math.prod(shape)
    return total


def report(table: dict, res: dict, man: dict, l2_mb: float = 50.0) -> str:
    E = table["entries"]
    pairs = [(e["ms"], e["graph_ms"]) for e in E.values() if "graph_ms" in e and e["ms"] > 0]
    lines = [f"Table: {table.get('name')} ({(table.get('device') or {}).get('gpu')}, {table.get('date')}), "
             f"{len(pairs)} ops timed both ways; whole models: {res.get('date')}, "
             f"{(res.get('device') or {}).get('gpu')}.", "",
             "| op timed alone (ms) | ops | alone - in graph (us): median (IQR) | in graph / alone: median (IQR) |",
             "|---|---|---|---|"]
    for lo, hi in BUCKETS:
        sel = [(a, g) for a, g in pairs if lo <= a < hi]
        if sel:
            lines.append(f"| {lo:g}-{hi:g} | {len(sel)} | {_q([1e3 * (a - g) for a, g in sel])} | "
                         f"{_q([g / a for a, g in sel])} |".replace("-1e+09", "+"))
    small = [a - g for a, g in pairs if a < 0.01]
    delta = statistics.median(small) if small else 0.0
    files = {m["name"]: m.get("files") or {} for m in man.get("models", [])}
    cold = any("cold_ms" in e for e in E.values())
    coldw = any("coldw_ms" in e for e in E.values())
    cols = (["alone", "less", "graph"] + (["cold", "cold_less"] if cold else [])
            + (["coldw", "coldw_less", "footprint"] if coldw else []))
    names = {"alone": "alone", "less": "alone less the overhead", "graph": "in graph", "cold": "L2 flushed",
             "cold_less": "L2 flushed less the overhead", "coldw": "weights from DRAM",
             "coldw_less": "weights from DRAM less the overhead",
             "footprint": f"by footprint (weights over {l2_mb:g} MB from DRAM) less the overhead"}
    lines += ["", f"Per-kernel overhead of timing alone (the median over the ops under 0.01 ms): {1e3 * delta:.2f} us.",
              "", "| file | kernels | measured ms | " + " | ".join(f"{names[c]} / measured" for c in cols) + " |",
              "|---|---|---|" + "---|" * len(cols)]
    # each column's cost of one op's entry (a view costs 0 in all: no kernel, nothing to subtract)
    per_op = {"alone": lambda e: e["ms"], "less": lambda e: max(0.0, e["ms"] - delta),
              "graph": lambda e: e.get("graph_ms", e["ms"]), "cold": lambda e: e.get("cold_ms", e["ms"]),
              "cold_less": lambda e: max(0.0, e.get("cold_ms", e["ms"]) - delta),
              "coldw": lambda e: e.get("coldw_ms", e["ms"]),
              "coldw_less": lambda e: max(0.0, e.get("coldw_ms", e["ms"]) - delta)}
    within = dict.fromkeys(cols, 0)
    n, left = 0, []
    for m in res["models"]:
        for f, r in (m.get("fidelity") or {}).items():
            ops = ((files.get(m["name"]) or {}).get(f) or {}).get("predicted", {}).get("ops")
            meas = r.get("measured_ms")
            if not ops or not meas or any(k not in E for k, *_ in ops):
                left.append(f)
                continue
            k = sum(c for _, _, c, _ in ops)
            sums = {c: sum(cnt * per_op[c](E[key]) for key, _, cnt, _ in ops) for c in cols if c != "footprint"}
            if "footprint" in cols:  # (a model whose weights outgrow the L2 reads them from DRAM each run)
                sums["footprint"] = sums["coldw_less" if weight_bytes(ops) > l2_mb * 2 ** 20 else "less"]
            n += 1
            for c in cols:
                within[c] += 0.9 <= sums[c] / meas <= 1.1
            lines.append(f"| {f} | {k} | {meas:.4g} | " + " | ".join(f"{sums[c] / meas:.2f}" for c in cols) + " |")
    lines += ["", "Within 10% of the measured latency: " + ", ".join(f"{names[c]} {within[c]} of {n}" for c in cols)
              + "." + (f" Left out (kernels the table lacks): {', '.join(left)}." if left else "")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="a calibration table with graph_ms (calibrate.py --in-graph)")
    ap.add_argument("results", help="speedup.py's results of the same run")
    ap.add_argument("--manifest", default="", help="default: models/<the run's set>/manifest.json")
    ap.add_argument("--l2-mb", type=float, default=50.0,
                    help="the GPU's L2 cache in MB, for the footprint column (50: an H100 SXM's)")
    a = ap.parse_args(argv)
    try:
        with open(a.table, encoding="utf-8") as f:
            table = json.load(f)
        with open(a.results, encoding="utf-8") as f:
            res = json.load(f)
        for path, d, fmt in ((a.table, table, SP.C.TABLE_FORMAT), (a.results, res, SP.RESULTS_FORMAT)):
            if not isinstance(d, dict) or d.get("format") != fmt:
                raise ValueError(f"{path} is not a {fmt!r} file")
        with open(a.manifest or os.path.join(HERE, "models", (res.get("manifest") or {}).get("set", "full"),
                                             "manifest.json"), encoding="utf-8") as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        print(f"ingraph: error: {e}", file=sys.stderr)
        return 2
    print(report(table, res, man, a.l2_mb), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
