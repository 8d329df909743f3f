"""The GPU speedup report on the CPU (issue 25): ``speedup.py``'s results JSON (copied from the GPU run's
output folder) -> ``benchmarks/RESULTS-gpu.md`` with a chart (matplotlib, which the GPU machine may lack) and
the issue's targets (TENSAT's published cost reductions, as speedups) beside the measured ratios. The fidelity's
predictions come from the prepared set's manifest as it is now (``reprice``: the run's measurements with the
files priced as ``prepare.py`` prices them today, e.g. after ``prepare.py --reprice``; ``--as-recorded``: the
predictions the run was given).

    python benchmarks/gpu/report.py benchmarks/results/gpu/speedup-h100.json ...   # -> benchmarks/RESULTS-gpu.md
    python benchmarks/gpu/report.py out/speedup.json --md out/R.md --chart out/speedup-gpu.png

Several runs make one page: each a section, then ``across_runs``, the files two runs on one GPU share.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import speedup as SP  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def targets() -> dict:
    """title -> (the issue's target, TENSAT's published figure): the issue reads TENSAT's cost gains as reductions
    and converts them, 1 / (1 - x); TENSAT (``analysis/stats.py``) publishes measured speedups, original /
    optimized - 1, so its own figure as a speedup is 1 + x. Both are shown; the first is the stricter."""
    try:
        sys.path.insert(0, os.path.dirname(HERE))
        from published import TENSAT_TABLE
    except ImportError:
        return {}
    return {t: (1.0 / (1.0 - row[2] / 100.0), 1.0 + row[2] / 100.0) for t, row in TENSAT_TABLE.items()}


def label(res: dict, m: dict) -> str:
    """A model's title, with its name where two models share it (BERT at batch 1 and 16)."""
    t = m.get("title") or m["name"]
    same = sum(1 for x in res["models"] if (x.get("title") or x["name"]) == t)
    return t if same == 1 else f"{t} ({m['name']})"


def series(res: dict) -> list:
    """The chart's bars, one series per (cost model, executor) in the manifest's target order (analytic:t4,
    analytic:h100, then the measured tables'): (label, per-model (value, q1, q3, resolved, shared) or None);
    ``shared``: the graph is the same as an earlier cost model's (its bar repeats that ratio, drawn faint)."""
    exs = list(res["method"]["executors"])
    variants = SP.variant_order(res)
    out = []
    for v in variants:
        for ex in exs:
            vals = []
            for m in res["models"]:
                s = ((m.get("speedup") or {}).get(ex) or {}).get(v)
                shared = SP.shared_with(m, v, variants) is not None
                vals.append((s["median"], s["q1"], s["q3"], s["resolved"], shared) if s and s.get("rounds") else None)
            out.append((f"{ex} executor, optimized for {SP.target_of(v)}", vals))
    return out


def chart(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = [m["name"] for m in res["models"]]
    ser = series(res)
    tg = targets()
    bars = [tg.get(m.get("title") or "") or (None, None) for m in res["models"]]
    tvals, pvals = [t for t, _ in bars], [p for _, p in bars]
    nbars = len(ser) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) + 4.5), 4.5))
    x = np.arange(len(names))
    w = 0.8 / nbars
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = []  # (an empty bar's legend entry takes the default colour, not its own: patches instead)
    for i, (label, vals) in enumerate(ser):
        xs = x + (i - (nbars - 1) / 2) * w
        for xi, v in zip(xs, vals):
            if v is None:
                continue
            med, q1, q3, ok, shared = v
            ax.bar(xi, med if ok else 1.0, w, color=colors[i % len(colors)] if ok else "#e0e0e0",
                   hatch=None if ok else "..", edgecolor=colors[i % len(colors)], linewidth=0.6,
                   alpha=0.35 if shared else 1.0)
            ax.errorbar(xi, med if ok else 1.0, yerr=[[max(0.0, (med if ok else 1.0) - q1)],
                                                      [max(0.0, q3 - (med if ok else 1.0))]],
                        color="black" if ok else "grey", linewidth=0.8, capsize=2)
        handles.append(Patch(facecolor=colors[i % len(colors)], label=label))
    xs = x + (nbars - 1 - (nbars - 1) / 2) * w
    ax.bar(xs, [t if t else np.nan for t in tvals], w, color="white", edgecolor="black", hatch="//",
           linewidth=0.6)
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                         label="the issue's target: TENSAT's T4 gain read as a reduction, 1 / (1 - x)"))
    if any(pvals):
        ax.scatter(xs, [p if p else np.nan for p in pvals], marker="_", s=160, color="red", zorder=3)
        handles.append(Line2D([], [], marker="_", color="red", linestyle="none", markersize=10,
                              label="TENSAT's published speedup on a T4, 1 + x"))
    if any(v and v[4] for _, vals in ser for v in vals):
        handles.append(Patch(facecolor="grey", alpha=0.35, label="faint: the same graph as an earlier cost model's"))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("speedup (original / optimized latency)")
    dev = (res.get("device") or {}).get("gpu", "?")
    ax.set_title(f"Measured speedups on {dev}" + (" (DRY RUN)" if res["method"]["backend"] == "dry" else ""),
                 fontsize=9)
    handles.append(Patch(facecolor="#e0e0e0", hatch="..", edgecolor="grey", label="unresolved (IQR spans 1.0)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def target_table(res: dict) -> str:
    tg = targets()
    exs = list(res["method"]["executors"])
    lines = ["## Against the issue's targets", "",
             "The issue's targets: TENSAT's published gains (T4) read as cost reductions and converted, 1 / (1 - x). "
             "TENSAT publishes measured speedups (original / optimized - 1), so its own figure as a speedup is "
             "1 + x, a lower bar (NasRNN: 3.22x against 1.69x). Met where the lower quartile of the measured ratio "
             "is at or above the bar: *issue* / *TENSAT*. Best measured: the fastest of the graphs optimized for "
             "each cost model (named).", "",
             "| model | issue's target | TENSAT's speedup | " + " | ".join(f"{ex}: best measured" for ex in exs)
             + " |", "|---|---|---|" + "---|" * len(exs)]
    order = SP.variant_order(res)
    for m in res["models"]:
        t, pub = tg.get(m.get("title") or "") or (None, None)
        cells = []
        for ex in exs:
            sp = [(v, s) for v, s in ((m.get("speedup") or {}).get(ex) or {}).items() if s.get("rounds")]
            if not sp:
                cells.append("-")
                continue
            # the fastest; of equal ratios (one graph) the first cost model's
            v, b = max(sp, key=lambda vs: (vs[1]["median"], -order.index(vs[0]) if vs[0] in order else 0))
            met = "" if t is None else \
                f" (issue: {_met(b['q1'], t)}; TENSAT: {_met(b['q1'], pub)})"
            cells.append(f"{b['median']:.3f}x ({b['q1']:.3f}-{b['q3']:.3f}), {SP.target_of(v)}{met}")
        lines.append(f"| {label(res, m)} | {f'{t:.2f}x' if t else '-'} | {f'{pub:.3f}x' if pub else '-'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _met(q1: float, bar: float) -> str:
    return "met" if q1 >= bar else "not met"


def _run_name(k: int, res: dict) -> str:
    return f"run {k} ({(res.get('device') or {}).get('gpu', '?')}, {res.get('date', '?')})"


def _demote(text: str, title: str) -> str:
    """A run's page as a section of a page of several runs: its headings one level down, its title ``title``."""
    lines = text.splitlines()
    out = [f"## {title}" if i == 0 and ln.startswith("# ") else ("#" + ln if ln.startswith("#") else ln)
           for i, ln in enumerate(lines)]
    return "\n".join(out) + "\n"


def across_runs(runs: list) -> str:
    """The same files timed in more than one run on the same GPU (another device call, so another machine):
    per model, executor and file, the original's latency and each optimized file's ratio in each run, and the
    spread (largest / smallest - 1). The quartiles within one run show that run's noise alone; this shows how
    far two runs of the same files differ. Files are matched by name (``digest`` where both runs recorded it).
    Empty where no two runs share a GPU and a file."""
    by_gpu: dict = {}
    for k, res in enumerate(runs, 1):
        by_gpu.setdefault((res.get("device") or {}).get("gpu", "?"), []).append((k, res))
    parts = []
    for gpu, rs in by_gpu.items():
        if len(rs) < 2:
            continue
        rows = []
        exs = [ex for ex in rs[0][1]["method"]["executors"] if all(ex in r["method"]["executors"] for _, r in rs)]
        for name in (m["name"] for m in rs[0][1]["models"]):
            ms = [next((m for m in res["models"] if m["name"] == name), None) for _, res in rs]
            if any(m is None for m in ms):
                continue
            for ex in exs:
                cells: dict = {}  # file -> per run "ratio" or "latency"
                for i, m in enumerate(ms):
                    orig = (m.get("variants") or {}).get("original")
                    t = ((m.get("timing") or {}).get(ex) or {}).get(orig) or {}
                    if t.get("median_ms"):
                        cells.setdefault((0, orig), {})[i] = (t["median_ms"], f"{t['median_ms']:.4g} ms")
                    for v, s in ((m.get("speedup") or {}).get(ex) or {}).items():
                        f = (m.get("variants") or {}).get(v)
                        if f and s.get("rounds"):
                            cells.setdefault((1, f), {})[i] = (s["median"], f"{s['median']:.3f}x")
                for (kind, f), per in sorted(cells.items()):
                    if len(per) < 2:
                        continue
                    digests = {((m.get("files") or {}).get(f) or {}).get("digest") for m in ms}
                    if len(digests - {None}) > 1:
                        continue  # (files of the same name with other contents)
                    vals = [per[i][0] for i in per]
                    rows.append(f"| {name} | {ex} | {f}{' (latency)' if kind == 0 else ''} | "
                                + " | ".join(per[i][1] if i in per else "-" for i in range(len(ms)))
                                + f" | {100 * (max(vals) / min(vals) - 1):.1f}% |")
        if rows:
            parts += [f"### {gpu}", "", "| model | executor | file | " + " | ".join(
                _run_name(k, r) for k, r in rs) + " | spread |", "|---|---|---|" + "---|" * (len(rs) + 1)] + rows + [""]
    if not parts:
        return ""
    return "\n".join(["## The same files in two runs", "",
                       "Each device call starts a fresh machine. Files timed in more than one run on the same GPU: the "
                       "original's latency (device time) and each optimized file's speedup, per run and executor, "
                       "and the spread between runs (largest / smallest - 1). Within a run the quartiles are narrow "
                       "(interleaved rounds); between runs the same ratio moves by the spread, which is the noise to "
                       "read the tables above with.", ""] + parts)


def _within(rows: list, lo: float = 0.9, hi: float = 1.1) -> str:
    """``rows``: predicted/measured ratios; "a-b (k of n within 10%)"."""
    if not rows:
        return "-"
    k = sum(1 for r in rows if lo <= r <= hi)
    return f"{min(rows):.2f}-{max(rows):.2f} ({k} of {len(rows)} within 10%)"


def reprice(res: dict, man: dict, table, man_path: str) -> str:
    """The fidelity's predictions (in place) from the prepared set's manifest as it is now (``man``:
    ``prepare.predicted``'s prices, e.g. after ``prepare.py --reprice``), and the table column from its ops and
    ``table`` (``speedup.load_table``'s, the table the run used; None: that column as recorded). The measured
    latencies stay the run's. A file whose plan on the GPU (steps, fused activations, folded nodes, as the run
    recorded them) is not the manifest's ``as_run`` keeps the run's predictions. Returns the markdown paragraph
    that says what was re-priced and how (empty where nothing changed)."""
    files = {m["name"]: m.get("files") or {} for m in man.get("models", [])}
    before, after, kept, changed, total = [], [], [], 0, 0
    col = "table" if table else None
    for m in res["models"]:
        for f, r in (m.get("fidelity") or {}).items():
            fe = files.get(m["name"], {}).get(f)
            meas = r.get("measured_ms")
            old_t = (r.get("table") or {}).get("ms")
            plan = (((m.get("files") or {}).get(f) or {}).get("plan")) or {}
            ar = ((fe or {}).get("predicted") or {}).get("as_run") or {}
            if fe is None or (plan and ar and (plan.get("steps"), plan.get("fused_activations"), plan.get(
                    "folded_nodes")) != (ar.get("kernels"), ar.get("fused"), ar.get("folded"))):
                kept.append(f)
                continue
            total += 1
            new = dict(fe["predicted"]["total_ms"])
            if any(abs(new[c] - r["predicted_ms"][c]) > 1e-9 * abs(new[c]) for c in r.get("predicted_ms", {})
                   if c in new):
                changed += 1
            r["predicted_ms"].update(new)
            if table and "table" in r:
                r["table"] = SP.table_cost(table, fe["predicted"]["ops"])
                if meas and old_t:
                    before.append(old_t / meas)
                    after.append(r["table"]["ms"] / meas)
    cms = res.setdefault("manifest", {}).setdefault("cost_models", [])
    more = [c for c in man.get("cost_models") or [] if c not in cms]
    cms += more  # (the manifest's cost models the run's lacked, e.g. a table shipped since: a column each)
    if not changed and not kept and not more and all(abs(a - b) < 1e-9 * b for a, b in zip(before, after)):
        return ""
    priced = man.get("priced") or {}
    rel = os.path.relpath(man_path, ROOT) if os.path.abspath(man_path).startswith(ROOT) else os.path.basename(man_path)
    run_commit = (res.get("manifest") or {}).get("commit")
    text = (f"**Predictions re-priced** on the CPU from `{rel}`"
            + (f" (priced at commit {priced['commit']})" if priced.get("commit") else "")
            + "; the measured latencies are the run's. ")
    if priced.get("how"):
        text += f"Pricing: {priced['how']} (the search prices its graphs the same way). "
    if changed:
        text += (f"The run's own predictions (kept in its JSON; manifest of commit {run_commit}) priced every op as "
                 "imported: a Relu after a Conv or Gemm, a Gemm's bias add and the nodes folded on the host each a "
                 f"kernel of its own; {changed} of the {total} files price otherwise now. ")
    if col and before:
        text += (f"With the run's table ({table['summary']['name']}, {table['summary']['date']}; the signatures it "
                 f"lacks by the analytic H100 roofline, as speedup.py prices them), predicted/measured is now "
                 f"{_within(after)}, was {_within(before)}. ")
    elif not col:
        text += "The table column is as the run recorded it (its table was not found). "
    if more:
        text += (f"Column{'s' if len(more) > 1 else ''} {', '.join(f'`{c}`' for c in more)}: the manifest's "
                 "(the shipped table, the signatures it lacks by its fitted estimate, as `cost-model=cuda:<gpu>` "
                 "prices them).")
    if kept:
        text += (f" Not re-priced (the manifest's plan of the file is not the one the GPU ran, or the file is not "
                 f"in it): {', '.join(kept)}.")
    return text.strip()


def find_table(res: dict, path: str = ""):
    """The table the run priced its fidelity column with: ``path``, else the shipped table of the run's table
    name (``passes/cost/tables/<name>.json``), if its date and size are the run's; None otherwise."""
    want = res.get("table") or {}
    cands = [path] if path else ([os.path.join(ROOT, "passes", "cost", "tables", f"{want['name']}.json")]
                                 if want.get("name") else [])
    for p in cands:
        t = SP.load_table(p) if os.path.exists(p) else None
        same = t and t["summary"]["date"] == want.get("date") and t["summary"]["entries"] == want.get("entries")
        if t and (path or same):
            return t
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the GPU speedup report: markdown and a chart from speedup.json; with "
                                             "several runs, one page: each run a section, then the files two runs "
                                             "on the same GPU share")
    ap.add_argument("results", nargs="+", help="speedup.py's results JSON (one or more runs, the first on top)")
    ap.add_argument("--md", default=os.path.join(ROOT, "benchmarks", "RESULTS-gpu.md"))
    ap.add_argument("--chart", default="", help="the chart of one run (default: <the results JSON's name>.png "
                                                "beside it)")
    ap.add_argument("--chart-dir", default="", help="the charts' folder (default: beside each results JSON)")
    ap.add_argument("--manifest", default="", help="re-price the fidelity's predictions from this manifest (default: "
                                                   "benchmarks/gpu/models/<the run's set>/manifest.json, if there)")
    ap.add_argument("--table", default="", help="the run's calibration table, for the table column (default: the "
                                                "shipped passes/cost/tables/<name>.json, if its date is the run's)")
    ap.add_argument("--as-recorded", action="store_true", help="the predictions as the run recorded them")
    a = ap.parse_args(argv)
    if a.chart and len(a.results) > 1:
        print("report: error: --chart names one run's chart: use --chart-dir with several runs", file=sys.stderr)
        return 2
    runs, pages = [], []
    for k, path in enumerate(a.results, 1):
        try:
            with open(path, encoding="utf-8") as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            print(f"report: error: cannot read {path}: {e}", file=sys.stderr)
            return 2
        if res.get("format") != SP.RESULTS_FORMAT:
            print(f"report: error: {path} is not a speedup results file", file=sys.stderr)
            return 2
        note = ""
        man_path = a.manifest or os.path.join(HERE, "models", (res.get("manifest") or {}).get("set", "full"),
                                              "manifest.json")
        if not a.as_recorded and os.path.exists(man_path):
            with open(man_path, encoding="utf-8") as f:
                note = reprice(res, json.load(f), find_table(res, a.table) if res.get("table") else None, man_path)
        stem = os.path.splitext(os.path.basename(path))[0] + ".png"
        png = a.chart or os.path.join(a.chart_dir or os.path.dirname(os.path.abspath(path)), stem)
        rel = ""
        try:
            chart(res, png)
            rel = os.path.relpath(png, os.path.dirname(os.path.abspath(a.md)))
        except ImportError as e:
            print(f"report: note: no chart ({e})", file=sys.stderr)
        text = SP.markdown(res, chart=rel, fidelity_note=note) + "\n" + target_table(res)
        if k > 1:
            text = _demote(text, f"Run {k}: measured GPU speedups on {(res.get('device') or {}).get('gpu', '?')}")
        runs.append(res)
        pages.append(text)
        print(f"report: {path}" + (f" -> {png}" if rel else ""))
    more = across_runs(runs)
    if len(runs) > 1:  # (the first page's title, then what the page holds)
        head, _, rest = pages[0].partition("\n")
        pages[0] = (head + "\n\n" + f"{len(runs)} runs, each a section: " + "; ".join(
            _run_name(k, r) + (" (this section)" if k == 1 else "") for k, r in enumerate(runs, 1))
            + (". Then the files two runs on one GPU share." if more else ".") + "\n" + rest)
    text = "\n".join(pages)
    if more:
        text += "\n" + more
    tmp = a.md + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, a.md)
    print(f"report: {a.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
