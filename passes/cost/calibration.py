"""The op signatures the search prices, dumped for measuring them on a GPU (issue 24).

A GPU is available only for minutes at a time, so what it must measure is prepared here, on the CPU: every
op signature (``OpSig``) the search prices on the suite's models, with TASO's backtracking search and with
equality saturation, under the analytic T4 and H100 profiles (what the search visits depends on the costs it
sees). ``benchmarks/gpu/calibrate.py`` measures them on the GPU machine and writes the table that
``cost-model=cuda:<gpu>`` reads (``passes/cost/cuda_table.py``).

How the signatures are collected: inside this process, every cost model ``get_cost_model`` makes is
wrapped (``oracle.wrapping_cost_models``) in a ``Recording`` that delegates to it and notes each signature it
is asked to price (free ones, weights and constants, never reach it: they cost 0 everywhere). The search runs
as it always does, through the pass pipeline; no target option names the recorder.

The file: one JSON object a line. The first is the header (``"header": true``: format, commit, date, the
models, targets and strategies, counts per kind, what was skipped and why); then one line per distinct
signature, sorted by its key (``OpSig.key()``, the tables' key): ``key``, ``kind``, ``attrs`` ([name, value]
pairs), ``in_shapes``, ``out_shapes``, ``dtype``, ``weights`` (per operand, 1 where it is a weight or
constant), ``models`` (how many of the dumped models priced it) and ``rank`` (the earliest position at which
a search priced it, over all runs: a model's own ops come first, its rewrites' variants later; the
calibration measures in that order, so that a cut-short run has the ops that matter most).

    python -m taso_mlir.passes.cost.calibration dump -o benchmarks/gpu/signatures.jsonl
    python -m taso_mlir.passes.cost.calibration dump --quick --models nasrnn -o sigs.jsonl
    python -m taso_mlir.passes.cost.calibration report cuda:h100     # or a table file; --json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Optional

from taso_mlir.dialect.errors import TasoError, one_line
from taso_mlir.passes.cost.oracle import CostModel, OpSig, wrapping_cost_models
from taso_mlir.passes.cost.roofline import sig_from_record, sig_record  # noqa: F401 (re-exported)

FORMAT = "taso-mlir signatures 1"
#: what the dump runs by default: both searches under every analytic profile (the sites a search visits
#: depend on the costs it sees: from launch-bound to compute-bound devices, more of them are visited; the
#: full suite: 1,246 signatures under t4 and h100, 1,477 with v100, a100 and cpu too)
DEFAULT_TARGETS = ("analytic:t4", "analytic:h100", "analytic:v100", "analytic:a100", "analytic:cpu")
DEFAULT_STRATEGIES = ("backtracking", "eqsat")


class Collector:
    """The distinct signatures priced so far: key -> [sig, rank, models]."""

    def __init__(self):
        self.sigs: dict[str, list] = {}
        self.model = ""  # the model being searched (counted in each signature's ``models``)
        self._seq = 0  # pricings in the current run

    def start(self, model: str) -> None:
        self.model, self._seq = model, 0

    def add(self, sig: OpSig) -> None:
        k = sig.key()
        e = self.sigs.get(k)
        if e is None:
            self.sigs[k] = [sig, self._seq, {self.model}]
        else:
            e[1] = min(e[1], self._seq)
            e[2].add(self.model)
        self._seq += 1


class Recording(CostModel):
    """A cost model that prices as ``inner`` does and notes every signature it prices in ``collector``."""

    def __init__(self, inner: CostModel, collector: Collector):
        super().__init__()
        self.inner, self.collector = inner, collector
        self.name = inner.name

    def _cost(self, sig: OpSig) -> float:
        self.collector.add(sig)
        c = self.inner.cost(sig)
        self.estimated = self.inner.estimated
        return c

    def close(self) -> None:
        self.inner.close()


def read_signatures(path: str) -> tuple[dict, list[dict]]:
    """(header, records) of a signatures file."""
    header, recs = {}, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise TasoError(f"{path}:{n}: not a JSON line ({one_line(e)})") from None
            if r.get("header"):
                header = r
            else:
                recs.append(r)
    if header.get("format") != FORMAT:
        raise TasoError(f"{path}: not a taso-mlir signatures file (no header of format '{FORMAT}')")
    return header, recs


# ---------------------------------------------------------------------------------------------
# the models and the searches


def suite_models(quick: bool, names: Optional[list[str]] = None) -> list[tuple[str, object]]:
    """(name, build) of the suite's models (``benchmarks/suite.py``), all or ``names``."""
    from taso_mlir.benchmarks.suite import suite

    ms = [(m.name, m.build) for m in suite(quick)]
    if names:
        known = {n for n, _ in ms}
        bad = [n for n in names if n not in known]
        if bad:
            raise TasoError(f"unknown suite model(s) {', '.join(bad)} (models: {', '.join(sorted(known))})")
        ms = [(n, b) for n, b in ms if n in names]
    return ms


def torch_models(names: Optional[list[str]] = None) -> tuple[list[tuple[str, object]], Optional[str]]:
    """(name, build) of the torch-exported models (``benchmarks/torch_models.py``, the ones that are not
    ``big``), and why none are where torch is not installed."""
    from taso_mlir.benchmarks import torch_models as TM

    want = [n for n, i in TM.MODELS.items() if not i.big] if names is None else list(names)
    if not want:
        return [], None
    if importlib.util.find_spec("torch") is None:
        return [], f"torch is not installed (pip install 'taso-mlir[torch]'): skipped {', '.join(want)}"

    def builder(name):
        def build():
            import onnx

            with tempfile.TemporaryDirectory(prefix="taso-sigs-") as d:
                return onnx.load(TM.export(name, os.path.join(d, f"{name}.onnx")))
        return build
    return [(f"torch:{n}", builder(n)) for n in want], None


def search_model(model, where: str, target: str, strategy: str, timeout: float, extra: str = "") -> dict:
    """Run ``taso-search`` on the ONNX ``model`` in this process (``extra``: more pass options); its report."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager
    from taso_mlir.passes.search import taso_search

    ctx = make_context()
    module = import_onnx(model, ctx, where=where)
    opts = f"target={target} strategy={strategy} timeout={timeout:g} latency-check=false {extra}".strip()
    pm = build_pass_manager(f"builtin.module(taso-search{{{opts}}})", ctx)
    taso_search.LAST_REPORT = None
    run_pass_manager(pm, module.operation)
    return taso_search.LAST_REPORT or {}


def collect(models: list[tuple[str, object]], targets=DEFAULT_TARGETS, strategies=DEFAULT_STRATEGIES,
            timeout: float = 30.0, progress=None, extra: str = "") -> tuple[Collector, list[dict]]:
    """Search every model with every target and strategy, recording the signatures priced; (collector,
    one row per run: model, target, strategy, signatures priced, seconds, or the error)."""
    col = Collector()
    runs = []
    with wrapping_cost_models(lambda cm: Recording(cm, col)):
        for name, build in models:
            try:
                model = build()
            except Exception as e:  # an export that fails is that model's error, not the dump's
                runs.append({"model": name, "error": f"cannot build: {one_line(e, 200)}"})
                if progress:
                    progress(f"{name}: cannot build ({one_line(e, 200)})")
                continue
            for target in targets:
                for strategy in strategies:
                    before = len(col.sigs)
                    col.start(name)
                    t = time.perf_counter()
                    row = {"model": name, "target": target, "strategy": strategy}
                    try:
                        rep = search_model(model, name, target, strategy, timeout, extra)
                        row["reduction"] = round(1 - rep["cost_after_ms"] / rep["cost_before_ms"]
                                                 if rep.get("cost_before_ms") else 0.0, 4)
                        row["timed_out"] = any(f.get("timed_out") for f in rep.get("functions", ()))
                    except TasoError as e:
                        row["error"] = one_line(e, 200)
                    row.update(priced=col._seq, new=len(col.sigs) - before, seconds=round(time.perf_counter() - t, 2))
                    runs.append(row)
                    if progress:
                        progress(f"{name} {target} {strategy}: {row['priced']} signatures priced, {row['new']} new "
                                 f"ones ({len(col.sigs)} in all), {row['seconds']} s"
                                 + (f"; error: {row['error']}" if "error" in row else ""))
    return col, runs


def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True,
                           timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return r.stdout.strip() + ("+dirty" if dirty else "") if r.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_signatures(path: str, col: Collector, runs: list[dict], meta: dict) -> dict:
    """Write the header and the signatures (sorted by key); the header."""
    recs = []
    for k in sorted(col.sigs):
        sig, rank, models = col.sigs[k]
        r = sig_record(sig)
        r.update(models=len(models), rank=rank)
        recs.append(r)
    header = {"header": True, "format": FORMAT, "commit": git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), **meta,
              "counts": {"signatures": len(recs),
                         "by_kind": dict(sorted(Counter(r["kind"] for r in recs).items()))},
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(header, separators=(",", ":")) + "\n")
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    return header


# ---------------------------------------------------------------------------------------------
# command line


def _dump(a) -> int:
    def progress(msg):
        sys.stderr.write(f"taso-sigs: {msg}\n")
        sys.stderr.flush()

    names = [n for n in (a.models or "").split(",") if n]
    suite_names = [n for n in names if not n.startswith("torch:")] if names else None
    torch_names = [n.removeprefix("torch:") for n in names if n.startswith("torch:")] if names else None
    models = suite_models(a.quick, suite_names) if (suite_names or not names) else []
    skipped = []
    if not a.no_torch and (torch_names or not names):
        tms, why = torch_models(torch_names)
        if why:
            skipped.append(why)
            print(f"taso-sigs: {why}", file=sys.stderr)
        models += tms
    targets = [t for t in a.targets.split(",") if t]
    strategies = [s for s in a.strategies.split(",") if s]
    t0 = time.perf_counter()
    col, runs = collect(models, targets, strategies, a.timeout, progress, a.search_options)
    meta = {"suite": "quick" if a.quick else "full", "models": [n for n, _ in models], "targets": targets,
            "strategies": strategies, "search_timeout_s": a.timeout,
            "search_options": a.search_options, "skipped": skipped,
            "seconds": round(time.perf_counter() - t0, 1)}
    h = write_signatures(a.output, col, runs, meta)
    kinds = ", ".join(f"{k} {n}" for k, n in h["counts"]["by_kind"].items())
    print(f"{a.output}: {h['counts']['signatures']} signatures from {len(models)} models "
          f"({len(runs)} searches, {meta['seconds']} s): {kinds}")
    errors = [r for r in runs if "error" in r]
    for r in errors:
        print(f"taso-sigs: {r['model']} {r.get('target', '')} {r.get('strategy', '')}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0


def load_table(what: str):
    """A ``CudaTable`` from ``cuda:<gpu>`` (the table that cost model reads) or a table file."""
    from taso_mlir.passes.cost import cuda_table as CT

    if what.lower().startswith("cuda:") and what[5:]:
        return CT.get(what, what[5:].lower())
    if not os.path.exists(what):
        raise TasoError(f"{what}: no such table file (give a table file, or cuda:<gpu> for "
                        f"{CT.display_path(CT.table_path('<gpu>'))})")
    return CT.CudaTable.load(what)


def _report(a) -> int:
    t = load_table(a.table)
    stats = t.class_stats()
    if a.json:
        json.dump({"table": t.source(), "classes": stats}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(t.source_text())
    print(f"How far the analytic {t.base.name.upper()} roofline (hand-set: analytic:{t.base.name}:datasheet) is "
          f"from the measurements, per op class: the ratio estimate / measured over the {stats['all']['n']} "
          "signatures measured above 0 (1 = exact; median, interquartile range, worst), before and after fitting "
          "ms = a + b x per class (x: the roofline's time without its launch overhead; in-sample). "
          f"cuda:{t.gpu} prices signatures missing from the table by the fitted line, and analytic:{t.gpu} is the "
          "fitted line for every signature while this table is the one cuda:<gpu> reads.")
    print()
    print(t.fit_report())
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taso_mlir.passes.cost.calibration",
                                 description="prepare and inspect the GPU cost tables (issue 24)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="write every op signature the search prices on the suite's models")
    d.add_argument("-o", "--output", required=True, help="the signatures file (.jsonl)")
    d.add_argument("--models", default="", help="comma-separated suite models, torch:<name> for a torch-exported "
                   "one (default: the whole suite and the torch-exported models where torch is installed)")
    d.add_argument("--quick", action="store_true", help="the suite's tiny variants (tests, rehearsals)")
    d.add_argument("--no-torch", action="store_true", help="skip the torch-exported models")
    d.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help=f"the search's targets, comma-separated (default {','.join(DEFAULT_TARGETS)})")
    d.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"the searches, comma-separated (default {','.join(DEFAULT_STRATEGIES)})")
    d.add_argument("--timeout", type=float, default=30.0, help="seconds per search (taso-search's timeout)")
    d.add_argument("--search-options", default="", help="more taso-search options, space-separated "
                   "(e.g. 'alpha=1.2 budget=400': a wider search visits more sites)")
    r = sub.add_parser("report", help="a measured table: its device, and how far the analytic model is from it, "
                       "per op class")
    r.add_argument("table", help="cuda:<gpu> (the table that cost model reads: passes/cost/tables/<gpu>.json, or "
                   "$TASO_CUDA_TABLES/<gpu>.json) or a table file")
    r.add_argument("--json", action="store_true", help="the table's source and the per-class figures as JSON")
    a = ap.parse_args(argv)
    try:
        return _dump(a) if a.cmd == "dump" else _report(a)
    except TasoError as e:
        print(f"taso-sigs: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
