"""The benchmark runner behind ``taso-bench`` (``tools/taso_bench.py`` is its command line): the TASO/TENSAT
benchmark models through taso-mlir, measured side by side with the peers.

    taso-bench                                   # the full suite (benchmarks/suite.py) through taso-search
    taso-bench --quick --out bench-quick         # tiny variants (the smoke test; latencies noise-dominated)
    taso-bench --optimizer identity              # the round trip alone (import, taso-dce, export): the baseline
    taso-bench --models bert-b1,nasrnn           # some models
    taso-bench --pipeline 'builtin.module(taso-dce,cse)'   # any pass pipeline as the optimizer
    taso-bench --list                            # the models and their configurations

For each model, in a fresh worker process (so that peak memory is the model's own and a crash is one
model's error): build it (``benchmarks/suite.py``), check it with ``onnx.checker`` (full check), import it
into the taso dialect, run the optimizer (a pass pipeline on the imported module: by default taso-search,
``builtin.module(taso-search,taso-dce)``; ``--optimizer identity`` for the round trip alone), export it
back to ONNX. Reported: op counts before and after (taso ops vs generic onnx ops), the optimizer's time,
the search's cost before and after, peak memory (RSS high-water mark over import + optimize + export), the
numeric max error of the optimized model vs the original in onnxruntime, and onnxruntime latencies of the
original and the optimized model (interleaved rounds in one process, median of N, ``ORT_ENABLE_ALL`` for
both) as a ratio. A ratio whose interquartile range over the rounds spans 1.0 is *unresolved*: the run
cannot tell the two apart, and the table, the report, results.json and the chart say so instead of
showing it as a speedup. Peers in the same rounds: onnxruntime's optimizer alone (the original at
``ORT_DISABLE_ALL`` vs ``ORT_ENABLE_ALL``) and onnxslim followed by onnxruntime.
TASO's and TENSAT's published figures stand beside them, labelled as published.

Writes ``report.md``, ``results.json``, ``speedup.png`` and ``search_time.png`` into ``--out``, prints a
table on stdout and progress on stderr. Errors are one line with a non-zero exit (1; 2 for internal
errors, ``TASO_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Optional


#: The optimizer presets (``--optimizer``); ``--pipeline`` gives any pipeline instead.
OPTIMIZERS = {
    "taso-search": "(the default) the cost-guided search pass with the verified rules (taso-search, then "
                   "taso-dce)",
    "identity": "import (convert-onnx-to-taso), taso-dce, export: the round trip alone, the baseline",
}
DEFAULT_OPTIMIZER = "taso-search"
IDENTITY_PIPELINE = "builtin.module(taso-dce)"
#: ``--quick``'s target for the search where neither ``--cost-model`` nor TASO_TARGET names one: the
#: analytic estimate, so that the smoke test times no ops (the measured target, the pass's default, times
#: every op signature and the whole result, which costs more than the rest of a quick run).
QUICK_COST_MODEL = "analytic"
QUICK_COST_MODEL_NOTE = ("quick mode's default target: analytic, the T4 roofline, an estimate that times "
                         "nothing; --cost-model cpu measures")
class _CostModels(tuple):
    """The ``--cost-model`` choices: the names listed, and ``cuda:<gpu>`` / ``analytic:<gpu>:datasheet`` for
    any GPU name (whether a table exists for it is checked once the command line is read:
    ``check_cost_model``)."""

    def __contains__(self, spec) -> bool:
        if tuple.__contains__(self, spec):
            return True
        if not isinstance(spec, str):
            return False
        head, _, rest = spec.partition(":")
        return (head == "cuda" and bool(rest) and ":" not in rest) or (
            head == "analytic" and rest.endswith(":datasheet") and rest.count(":") == 1)


#: The cost oracles of DESIGN.md (``--cost-model``): the analytic rooflines (a GPU's fitted to its measured
#: table where one exists; ``:datasheet`` the hand-set profile), the CPU measured, a GPU's measured table.
COST_MODELS = _CostModels(("analytic", "analytic:cpu", "analytic:t4", "analytic:v100", "analytic:a100",
                           "analytic:h100", "analytic:h200", "analytic:<gpu>:datasheet", "cpu", "cuda",
                           "cuda:<gpu>"))
COST_UNAVAILABLE = "unavailable: the optimizer is not taso-search, so no cost model ran"
COST_REPORTED = "per model, as computed by taso-search (graph cost before and after the search)"
#: The latency variants measured in the same interleaved rounds: (key, model, onnxruntime level).
VARIANTS = (("original", "original", "all"), ("optimized", "optimized", "all"),
            ("ort_disabled", "original", "disable"), ("onnxslim", "onnxslim", "all"))
DEFAULT_OUT = "taso-bench-out"


# ------------------------------------------------------------------------------------------------
# configuration


def check_cost_model(spec: str) -> dict:
    """Make the cost model ``spec`` once, so that one that cannot be had (``cuda:<gpu>`` without a measured
    table, a malformed table) is a one-line error before any model runs; what it is, for the report:
    ``spec``, ``costs`` (what its numbers are: measured where, or estimated by which model) and, for a
    measured table or a roofline fitted to one, ``table`` (``CudaTable.source``: GPU, driver, date, file)."""
    from taso_mlir.passes.cost.oracle import describe, get_cost_model, unwrap

    cm = get_cost_model(spec)
    try:
        info = {"spec": spec, "name": cm.name, "costs": describe(cm)}
        src = getattr(unwrap(cm), "source", None)
        if src is not None:
            info["table"] = src()
        return info
    finally:
        cm.close()


def resolve_optimizer(optimizer: str, pipeline: Optional[str], cost_model: Optional[str]) -> tuple[str, str]:
    """(name, pass pipeline) of the optimizer; the pipeline is checked by parsing it, and the cost model by
    making it (``check_cost_model``)."""
    from taso_mlir.dialect.errors import TasoError
    from taso_mlir.dialect.context import make_context
    from taso_mlir.passes.registry import REGISTRY, build_pass_manager

    if cost_model:
        check_cost_model(cost_model)
    if pipeline is not None:
        name, text = "pipeline", pipeline
    elif optimizer == "identity":
        name, text = "identity", IDENTITY_PIPELINE
    elif optimizer == "taso-search":
        info = REGISTRY.get("taso-search")
        if info is None:
            raise TasoError("--optimizer taso-search: the taso-search pass is not registered; "
                            "use --optimizer identity, or --pipeline with the passes there are")
        opts = ""
        if cost_model and any(o.name == "cost-model" for o in info.options):
            opts = f"{{cost-model={cost_model}}}"
        name, text = "taso-search", f"builtin.module(taso-search{opts},taso-dce)"
    else:  # (argparse's choices keep this out)
        raise TasoError(f"unknown optimizer '{optimizer}'")
    build_pass_manager(text, make_context())  # a malformed pipeline is an error now, not in every worker
    return name, text


def quick_cost_model(quick: bool, optimizer: str, pipeline: Optional[str], cost_model: Optional[str]) -> Optional[str]:
    """The cost model the taso-search preset runs with: ``cost_model`` where given; in quick mode, where
    neither it nor TASO_TARGET names a target, ``QUICK_COST_MODEL``; else None (the pass's own default)."""
    if cost_model or not quick or pipeline is not None or optimizer != "taso-search":
        return cost_model
    from taso_mlir.passes.cost.oracle import TARGET_ENV

    return None if os.environ.get(TARGET_ENV, "").strip() else QUICK_COST_MODEL


def _search_cost(cfg: dict, made: list = ()) -> dict:
    """The graph costs taso-search computed in this process's last run (None without it); ``made``: the cost
    models made during the run (a measured table among them adds its source and its counts of signatures
    measured and estimated)."""
    from taso_mlir.passes.search import taso_search

    rep = taso_search.LAST_REPORT
    if rep is None:
        return {"model": cfg["cost_model"], "before": None, "after": None, "status": COST_UNAVAILABLE}
    # the reduction is the search's, from the prepared function (batchnorms, scales, biases and activations
    # fused, as runtimes run a model); ``imported`` is the cost of the model as imported
    before, after, imported = rep["cost_prepared_ms"], rep["cost_after_ms"], rep["cost_before_ms"]
    fr = rep["functions"]
    out = {"model": rep["cost_model"], "costs": rep.get("costs"), "estimated_costs": rep.get("estimated_costs", 0)}
    tables = _tables(made)
    if tables:
        # distinct signatures over the run's cost models (taso-search makes one per run)
        out["table"] = tables[0].source()
        out["signatures"] = {k: sum(t.counts()[k] for t in tables) for k in ("measured", "estimated")}
    return out | {"before": before, "after": after, "imported": imported, "status": "ok",
            "reduction": (before - after) / before if before else 0.0,
            "reduction_imported": (imported - after) / imported if imported else 0.0,
            "search_s": sum(f["search_s"] for f in fr), "applied": rep["applied"],
            "rewrites_applied": sum(f["rewrites_applied"] for f in fr),
            "graphs_explored": sum(f["graphs_popped"] for f in fr),
            "timed_out": any(f["timed_out"] for f in fr),
            # cost-model=cpu: what the pass's own latency check timed and kept, per function
            "latency_check": [f["latency_check"] for f in fr if "latency_check" in f]}


def _tables(made: list) -> list:
    """The measured GPU tables (``cuda_table.CudaTable``) among the cost models ``made``."""
    from taso_mlir.passes.cost.cuda_table import CudaTable
    from taso_mlir.passes.cost.oracle import unwrap

    return [unwrap(cm) for cm in made if isinstance(unwrap(cm), CudaTable)]


def graph_cost(module, cost_model) -> float:
    """The module's cost under ``cost_model``: the sum over its functions as written (taso-search's
    ``cost_before_ms`` / ``cost_after_ms`` measure)."""
    from taso_mlir.dialect.mlir import ir
    from taso_mlir.dialect.ops import function_bodies
    from taso_mlir.passes.search import tgraph as T

    with module.context, ir.Location.unknown(module.context):
        b = T.Builder(cost_model, split_trees=False)
        return sum(T.from_function(f, b)[0].cost for f in function_bodies(module.operation))


def _beside_analytic(model, name: str, table, optimized_module) -> dict:
    """With a measured table (``cuda:<gpu>``): the same model searched with the GPU's hand-set analytic roofline
    (``analytic:<gpu>:datasheet``, the figures printed before any table existed), and each search's result
    priced by the other cost model: how far the choices differ, not only the numbers."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.passes.cost import cuda_table as CT
    from taso_mlir.passes.cost.oracle import get_cost_model
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager
    from taso_mlir.passes.search import taso_search

    spec = f"analytic:{table.base.name}:datasheet"
    ctx = make_context()
    module = import_onnx(model, ctx, where=name)
    taso_search.LAST_REPORT = None
    run_pass_manager(build_pass_manager(f"builtin.module(taso-search{{cost-model={spec}}},taso-dce)", ctx),
                     module.operation)
    rep = taso_search.LAST_REPORT
    fresh = CT.CudaTable.load(table.path, table.gpu)  # (its own counts: the main search's stay as they were)
    under_table = graph_cost(module, fresh)
    before, after = rep["cost_prepared_ms"], rep["cost_after_ms"]
    return {"model": spec, "costs": rep.get("costs"), "before": before, "after": after, "imported": rep["cost_before_ms"],
            "reduction": (before - after) / before if before else 0.0,
            "search_s": sum(f["search_s"] for f in rep["functions"]),
            "rewrites_applied": sum(f["rewrites_applied"] for f in rep["functions"]),
            # the analytic search's result priced by the table (its signatures counted apart), and the table
            # search's result priced by the analytic roofline
            "its_result_under_table_ms": under_table, "its_result_signatures": fresh.counts(),
            "table_result_under_it_ms": graph_cost(optimized_module, get_cost_model(spec))}


def check_peers() -> None:
    """The peers and the charts need onnxslim and matplotlib (dependencies of taso-mlir)."""
    import importlib.util

    from taso_mlir.dialect.errors import TasoError

    for mod, pin in (("onnxslim", "onnxslim==0.1.98"), ("matplotlib", "matplotlib==3.11.2")):
        if importlib.util.find_spec(mod) is None:
            raise TasoError(f"{mod} is not installed; taso-bench needs it: pip install {pin} "
                            f"(or reinstall taso-mlir)")


# ------------------------------------------------------------------------------------------------
# the run


def run(models: list, cfg: dict, opt_name: str, argv: list, baseline: Optional[dict] = None,
        baseline_path: str = "", in_process: bool = False) -> int:
    """Run ``models`` (``suite.Model``) with the optimizer of ``cfg`` (each in a worker process unless
    ``in_process``), write the report, the results and the charts into ``cfg["out"]`` and print the table.
    Raises TasoError naming the models that failed."""
    from taso_mlir.dialect.errors import TasoError

    pipeline, settings, out, quick = cfg["pipeline"], cfg["settings"], cfg["out"], cfg["quick"]
    started = time.time()
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    _progress(f"{len(models)} model(s){' (quick)' if quick else ''}, optimizer {opt_name}: {pipeline}; "
              f"report in {out}/")
    results = []
    for i, m in enumerate(models):
        tag = f"[{i + 1}/{len(models)}] {m.name}"
        if in_process:
            res = _run_guarded(m.name, cfg, tag)
        else:
            res = _run_worker(m.name, cfg, tag)
        res.setdefault("name", m.name)
        res.setdefault("title", m.title)
        res.setdefault("config", m.config)
        results.append(res)
    wall = time.time() - started
    report = {
        "tool": "taso-bench",
        "schema": 1,
        "date": date,
        "command": ["taso-bench"] + argv,
        "quick": quick,
        "machine": _machine(),
        "versions": _versions(),
        "optimizer": {"name": opt_name, "pipeline": pipeline},
        "cost_model": {"requested": cfg["cost_model"],
                       "status": COST_REPORTED if "taso-search" in pipeline else COST_UNAVAILABLE,
                       "default": cfg.get("cost_model_default")},
        "settings": settings,
        "wall_time_s": round(wall, 1),
        "models": results,
    }
    if cfg["cost_model"]:  # what the requested model's numbers are (a measured table: which one)
        report["cost_model"].update({k: v for k, v in check_cost_model(cfg["cost_model"]).items()
                                     if k in ("costs", "table")})
    from taso_mlir.benchmarks.published import README_SOURCE, SOURCE

    report["published_sources"] = [SOURCE, README_SOURCE]
    if baseline is not None:
        report["baseline"] = compare_baseline(report, baseline, baseline_path)
    _write_outputs(out, report)
    sys.stdout.write(format_table(report))
    failed = [r for r in results if r.get("status") != "ok"]
    _progress(f"done in {wall:.0f} s: {out}/report.md, results.json, speedup.png, search_time.png")
    if failed:
        raise TasoError(f"{len(failed)} of {len(results)} model(s) failed: "
                        + "; ".join(f"{r['name']}: {r.get('error', 'failed')}" for r in failed))
    return 0




def _progress(msg: str) -> None:
    sys.stderr.write(f"taso-bench: {msg}\n")
    sys.stderr.flush()


def _run_worker(name: str, cfg: dict, tag: str) -> dict:
    """One model in a child process: its result, or a failed result saying why."""
    import signal
    import tempfile

    from taso_mlir.dialect.errors import one_line

    fd, result_path = tempfile.mkstemp(prefix="taso-bench-", suffix=".json")
    os.close(fd)
    job = json.dumps({"name": name, "cfg": cfg, "tag": tag, "result": result_path})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "taso_mlir.benchmarks.runner", job],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        try:
            with open(result_path) as f:
                text = f.read()
            res = json.loads(text) if text else None
        except (OSError, ValueError) as e:
            res = None
            why = one_line(e)
        else:
            why = "it wrote no result"
        if res is None:
            if rc < 0:
                try:
                    how = signal.Signals(-rc).name
                except ValueError:
                    how = f"signal {-rc}"
                why = f"the worker process died ({how})"
            elif rc:
                why = f"the worker process exited with status {rc}"
            _progress(f"{tag}: failed: {why}")
            return {"name": name, "status": "failed", "error": why}
        return res
    finally:
        if os.path.exists(result_path):
            os.unlink(result_path)


def _worker_main(job_text: str) -> int:
    job = json.loads(job_text)
    try:
        res = _run_guarded(job["name"], job["cfg"], job["tag"])
    except KeyboardInterrupt:  # (the parent, interrupted too, says so)
        return 130
    with open(job["result"], "w") as f:
        json.dump(res, f)
    return 0


def _run_guarded(name: str, cfg: dict, tag: str) -> dict:
    """``run_model``, with errors recorded in the result (and reported as progress)."""
    from taso_mlir.dialect.errors import TasoError, one_line

    res: dict = {"name": name, "status": "running"}
    try:
        run_model(name, cfg, res, lambda msg: _progress(f"{tag}: {msg}"))
    except TasoError as e:
        res.update(status="failed", error=str(e))
    except MemoryError:
        res.update(status="failed", error="out of memory")
    except Exception as e:
        if os.environ.get("TASO_DEBUG"):
            raise
        res.update(status="failed", error=f"internal error: {type(e).__name__}: {one_line(e)}")
    if res["status"] != "ok":
        _progress(f"{tag}: failed: {res.get('error')}")
    return res


# ------------------------------------------------------------------------------------------------
# one model


def run_model(name: str, cfg: dict, res: dict, progress) -> None:
    """Build, check, import, optimize, export, compare and time model ``name``; fills ``res``."""
    import collections
    import gc

    import onnx

    from taso_mlir.benchmarks.example_models import random_inputs, weight_bytes
    from taso_mlir.benchmarks.published import published
    from taso_mlir.benchmarks.suite import parameter_count, suite
    from taso_mlir.dialect.errors import TasoError, one_line
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx
    from taso_mlir.dialect.ops import verify_module
    from taso_mlir.passes.registry import build_pass_manager, run_pass_manager

    spec = next(m for m in suite(cfg["quick"]) if m.name == name)
    settings = cfg["settings"]
    res.update(title=spec.title, config=spec.config, published=published(spec.title))
    times = res.setdefault("times_s", {})

    t = time.perf_counter()
    model = spec.build()
    times["build"] = time.perf_counter() - t
    t = time.perf_counter()
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:
        raise TasoError(f"the built model fails onnx.checker: {one_line(e)}") from None
    times["check"] = time.perf_counter() - t
    res["onnx"] = {"nodes": len(model.graph.node),
                   "by_op": dict(collections.Counter(n.op_type for n in model.graph.node).most_common()),
                   "parameters": parameter_count(model), "weight_mb": weight_bytes(model) / 1e6,
                   "opset": model.opset_import[0].version, "checker": "full_check ok"}

    # ---- import, optimize, export (peak memory over these three)
    mem = _Peak()
    t = time.perf_counter()
    ctx = make_context()
    module = import_onnx(model, ctx, where=name)
    times["import"] = time.perf_counter() - t
    before = census(module)
    pm = build_pass_manager(cfg["pipeline"], ctx)
    from taso_mlir.passes.search import taso_search

    from taso_mlir.passes.cost.oracle import wrapping_cost_models

    taso_search.LAST_REPORT = None
    made: list = []  # the cost models the pipeline makes (a measured table's counts are read from it)
    t = time.perf_counter()
    with wrapping_cost_models(lambda cm: made.append(cm) or cm):
        run_pass_manager(pm, module.operation)
    times["optimize"] = time.perf_counter() - t
    verify_module(module.operation)
    after = census(module)
    res["cost"] = _search_cost(cfg, made)
    t = time.perf_counter()
    optimized = export_onnx(module)
    times["export"] = time.perf_counter() - t
    res["memory"] = mem.done()
    tables = _tables(made)
    if tables and res["cost"]["status"] == "ok":
        res["cost"]["beside"] = _beside_analytic(model, name, tables[0], module)
        b = res["cost"]["beside"]
        progress(f"cost under {res['cost']['model']}: {res['cost']['before']:.4g} -> {res['cost']['after']:.4g} ms "
                 f"({res['cost']['signatures']['measured']} signatures measured, "
                 f"{res['cost']['signatures']['estimated']} estimated); beside it {b['model']}: "
                 f"{b['before']:.4g} -> {b['after']:.4g} ms ({100 * b['reduction']:.1f}%)")
    del module, pm, ctx
    gc.collect()
    res["ops"] = {"before": before, "after": after, "exported_nodes": len(optimized.graph.node)}
    progress(f"{res['onnx']['nodes']} ONNX nodes -> {_fmt_census(before)}; optimize {times['optimize']:.2f} s "
             f"-> {_fmt_census(after)}; export {len(optimized.graph.node)} nodes; import {times['import']:.1f} s, "
             f"export {times['export']:.1f} s, peak RSS {res['memory']['peak_rss_mb']:.0f} MB")

    # ---- the peer: onnxslim
    slim, times["onnxslim"] = _onnxslim(model)
    res["ops"]["onnxslim_nodes"] = len(slim.graph.node)

    # ---- onnxruntime: sessions (from files, so that fresh ones can be made), numerics, latency
    import tempfile

    from taso_mlir.dialect.onnx_export import save_onnx

    feeds = [random_inputs(model, seed=s) for s in range(settings["numeric_trials"])]
    keep = os.path.join(cfg["keep_dir"], name) if cfg.get("keep_dir") else None
    with tempfile.TemporaryDirectory(prefix="taso-bench-") as tmp:
        d = keep or tmp
        os.makedirs(d, exist_ok=True)
        paths = {}
        for what, m in (("original", model), ("optimized", optimized), ("onnxslim", slim)):
            paths[what] = os.path.join(d, f"{what}.onnx")
            save_onnx(m, paths[what])
        del model, optimized, slim
        gc.collect()
        res["ops"]["ort_optimized_nodes"] = _ort_optimized_nodes(paths["original"], settings["threads"])

        def make_sessions(epoch: int) -> tuple[dict, dict]:
            """The four sessions, created in an order rotated per epoch; and their creation times."""
            order = VARIANTS[epoch % len(VARIANTS):] + VARIANTS[:epoch % len(VARIANTS)]
            sessions, create = {}, {}
            for key, which, level in order:
                t = time.perf_counter()
                sessions[key] = _session(paths[which], level, settings["threads"], f"{which} model")
                create[key] = time.perf_counter() - t
            return sessions, create

        sessions, times["session_create"] = make_sessions(0)
        num = res["numerics"] = _numerics(sessions, feeds)
        del sessions
        gc.collect()
        if not num["optimized_rel"] <= settings["tolerance"]:  # (its latency would mean nothing)
            raise TasoError(f"the optimized model differs from the original by {num['optimized_max_abs']:.3g} "
                            f"({num['optimized_rel']:.3g} of the output scale, tolerance {settings['tolerance']:g})")
        lat = res["latency"] = _latency(make_sessions, feeds[0], settings)
    res["memory"]["process_peak_mb"] = _maxrss_mb()
    gc.collect()

    med = lat["median_ms"]
    progress(f"max error {num['optimized_max_abs']:.3g} (onnxslim {num['onnxslim_max_abs']:.3g}); latency "
             f"{lat['rounds']} rounds x{lat['inner']} in {lat['epochs']} session sets: original "
             f"{med['original']:.3g} ms, optimized {med['optimized']:.3g} ms ({speedup_label(lat, 'optimized')}), "
             f"ORT disabled->enabled {speedup_label(lat, 'ort_enable_all')}, onnxslim {speedup_label(lat, 'onnxslim')}")
    res["status"] = "ok"


def census(module) -> dict:
    """Counts of the module's ops: taso ops (weights apart), generic onnx ops, weights."""
    import collections

    taso, generic = collections.Counter(), collections.Counter()
    weights = 0
    for f in module.body.operations:
        if f.operation.name != "func.func":
            continue
        for block in f.operation.regions[0].blocks:
            for op in block.operations:
                name = op.operation.name
                if name == "taso.weight":
                    weights += 1
                elif name.startswith("taso."):
                    taso[name[5:]] += 1
                elif name.startswith("onnx.") and name != "onnx.NoValue":
                    generic[name[5:]] += 1
    return {"taso": sum(taso.values()), "generic": sum(generic.values()), "weights": weights,
            "taso_by_op": dict(taso.most_common()), "generic_by_op": dict(generic.most_common())}


def _fmt_census(c: dict) -> str:
    return f"{c['taso']} taso + {c['generic']} generic ops"


class _Peak:
    """Peak RSS from now until ``done()``: the kernel's high-water mark, reset through
    /proc/self/clear_refs where Linux allows it; otherwise the process's peak so far (getrusage)."""

    def __init__(self):
        self.base = _status_kb("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM after a reset (Linux clear_refs)"
        except OSError:
            self.method = "process peak (getrusage; no reset possible here)"

    def done(self) -> dict:
        hwm = _status_kb("VmHWM") if self.method.startswith("VmHWM") else None
        peak = hwm / 1024 if hwm is not None else _maxrss_mb()
        base = self.base / 1024 if self.base is not None else None
        return {"method": self.method, "peak_rss_mb": peak, "rss_before_mb": base,
                "peak_increase_mb": None if base is None else max(0.0, peak - base)}


def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (kB on Linux)


def _onnxslim(model):
    """onnxslim's result for a copy of ``model`` (its console output silenced) and the time it took."""
    import contextlib
    import io
    import logging

    import onnx
    import onnxslim

    from taso_mlir.dialect.errors import TasoError, one_line

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    sink = io.StringIO()
    logging.disable(logging.WARNING)
    t = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            slim = onnxslim.slim(copy)
    except Exception as e:
        raise TasoError(f"onnxslim failed: {one_line(e)}") from None
    finally:
        logging.disable(logging.NOTSET)
    took = time.perf_counter() - t
    if not isinstance(slim, onnx.ModelProto):
        raise TasoError("onnxslim returned no model")
    return slim, took


def _session(path: str, level: str, threads: int, what: str):
    import onnxruntime as ort

    from taso_mlir.dialect.errors import TasoError, one_line
    from taso_mlir.passes.cost.latency import session_options

    try:
        return ort.InferenceSession(path, session_options(level, threads), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise TasoError(f"onnxruntime cannot load the {what}: {one_line(e)}") from None


def _ort_optimized_nodes(path: str, threads: int) -> Optional[int]:
    """Nodes of the graph onnxruntime runs after its own optimizer (ORT_ENABLE_ALL), read back from the
    optimized model it saves; None where it cannot save it."""
    import tempfile

    import onnx
    import onnxruntime as ort

    from taso_mlir.passes.cost.latency import session_options

    with tempfile.TemporaryDirectory(prefix="taso-bench-") as d:
        so = session_options("all", threads)
        so.optimized_model_filepath = os.path.join(d, "ort.onnx")
        try:
            ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            m = onnx.load(so.optimized_model_filepath, load_external_data=False)
        except Exception:
            return None
        return len(m.graph.node)


def _numerics(sessions: dict, feeds: list) -> dict:
    """Largest |difference| of each variant's outputs from the original's (both as onnxruntime runs them
    with its optimizer on), over the random input sets; and the output scale."""
    import numpy as np

    ref_sess = sessions["original"]
    out: dict = {"trials": len(feeds), "scale": 1.0}
    worst = {k: 0.0 for k in ("optimized", "onnxslim", "ort_disabled")}
    for f in feeds:
        ref = [np.asarray(x) for x in ref_sess.run(None, f)]
        for r in ref:
            if r.dtype.kind == "f" and r.size:
                out["scale"] = max(out["scale"], float(np.abs(r[np.isfinite(r)]).max(initial=0.0)))
        for key in worst:
            got = [np.asarray(x) for x in sessions[key].run(None, f)]
            for a, b in zip(ref, got):
                worst[key] = max(worst[key], _max_diff(a, b))
    for key, v in worst.items():
        out[f"{key}_max_abs"] = v
        out[f"{key}_rel"] = v / out["scale"]
    return out


def _max_diff(a, b) -> float:
    import numpy as np

    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    if a.size == 0:
        return 0.0
    if a.dtype.kind != "f":
        return 0.0 if np.array_equal(a, b) else float("inf")
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb]):
        return float("inf")
    d = np.abs(a[fa].astype(np.float64) - b[fb].astype(np.float64))
    return float(d.max()) if d.size else 0.0


def _latency(make_sessions, feeds: dict, s: dict) -> dict:
    """Interleaved rounds over fresh session sets (``passes.latency.sample``; ``make_sessions(epoch)``
    returns the sessions and their creation times). Medians over all rounds, and the speedups as
    ratios; each ratio marked resolved or not (``resolution``)."""
    import numpy as np

    from taso_mlir.passes.cost.latency import Settings, ratio_stats, sample

    keys = [k for k, _, _ in VARIANTS]
    st = Settings(rounds=s["rounds"], min_rounds=s["min_rounds"], budget_s=s["budget_s"], epochs=s["epochs"],
                  warmup=s["warmup"], min_sample_s=s["min_sample_s"], threads=s["threads"])
    out = sample(lambda epoch: make_sessions(epoch)[0], keys, feeds, st)
    samples, rounds, epochs, inner = out["samples"], out["rounds"], out["epochs"], out["inner"]
    med = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
    q = {k: [float(np.percentile(v, 25)) * 1e3, float(np.percentile(v, 75)) * 1e3] for k, v in samples.items()}

    # the per-round ratios: (median, lower quartile, upper quartile) of each comparison
    r = {k: ratio_stats(samples[num], samples[den]) for k, (num, den) in
         (("optimized", ("original", "optimized")), ("onnxslim", ("original", "onnxslim")),
          ("ort_enable_all", ("ort_disabled", "original")))}

    lat = {
        "rounds": rounds, "epochs": epochs, "inner": inner, "median_ms": med, "iqr_ms": q,
        "samples_ms": {k: [round(x * 1e3, 6) for x in v] for k, v in samples.items()},  # in round order
        # > 1: the second model is faster
        "speedup": {"optimized": med["original"] / med["optimized"],
                    "onnxslim": med["original"] / med["onnxslim"],
                    "ort_enable_all": med["ort_disabled"] / med["original"]},
        "paired_speedup": {k: v[0] for k, v in r.items()},
        # the noise: quartiles of the per-round ratios
        "paired_iqr": {k: [v[1], v[2]] for k, v in r.items()},
    }
    lat.update(resolution(lat))
    return lat


#: The ratios of a model's latencies (``latency["speedup"]``), each with the quartiles of its per-round ratios.
RATIOS = ("optimized", "onnxslim", "ort_enable_all")


def unresolved(lat: dict, key: str) -> bool:
    """Whether ratio ``key`` is not resolved: the interquartile range of its per-round ratios spans 1.0
    (lower quartile <= 1 <= upper quartile), so this run cannot tell the two variants apart."""
    lo, hi = lat["paired_iqr"][key]
    return lo <= 1.0 <= hi


def speedup_label(lat: dict, key: str) -> str:
    """The ratio as the table shows it: ``1.327x``, or ``~1.0x (unresolved: IQR 0.918-1.064)``."""
    if unresolved(lat, key):
        return f"~1.0x (unresolved: IQR {_iqr(lat, key)})"
    return f"{lat['speedup'][key]:.3f}x"


def resolution(lat: dict) -> dict:
    """results.json's marks of a latency record: ``resolved`` (per ratio: False where its IQR spans 1.0)
    and ``speedup_label`` (what the table prints)."""
    return {"resolved": {k: not unresolved(lat, k) for k in RATIOS},
            "speedup_label": {k: speedup_label(lat, k) for k in RATIOS}}


# ------------------------------------------------------------------------------------------------
# comparison with a previous run


def load_baseline(path: str) -> dict:
    """A previous run's results.json (checked enough to compare with)."""
    from taso_mlir.dialect.errors import TasoError

    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TasoError(f"--baseline {path}: no such file") from None
    except OSError as e:
        raise TasoError(f"--baseline {path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise TasoError(f"--baseline {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("tool") != "taso-bench" or not isinstance(data.get("models"), list):
        raise TasoError(f"--baseline {path}: not a taso-bench results.json")
    return data


def compare_baseline(report: dict, base: dict, path: str) -> dict:
    """Per model present and measured in both runs: the speedups then and now, and how much the
    original's median latency moved (machine drift, which the ratios are meant to cancel)."""
    then = {m.get("name"): m for m in base["models"] if isinstance(m, dict) and m.get("status") == "ok"}
    rows = []
    for m in _ok(report):
        b = then.get(m["name"])
        try:
            bl = b["latency"]
            row = {"name": m["name"],
                   "speedup": {k: [bl["speedup"][k], m["latency"]["speedup"][k]] for k in m["latency"]["speedup"]},
                   "original_ms": [bl["median_ms"]["original"], m["latency"]["median_ms"]["original"]]}
        except (TypeError, KeyError):
            continue
        rows.append(row)
    return {"path": path, "date": base.get("date"), "quick": base.get("quick"),
            "optimizer": (base.get("optimizer") or {}).get("pipeline"), "models": rows}


# ------------------------------------------------------------------------------------------------
# the report


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu": cpu, "cpus": usable, "memory_gib": round(mem, 1) if mem else None,
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "accelerator": "none (onnxruntime CPUExecutionProvider)"}


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("taso-mlir", "onnx", "onnxruntime", "torch-mlir", "numpy", "onnxslim", "matplotlib", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _ok(report) -> list[dict]:
    return [r for r in report["models"] if r.get("status") == "ok"]


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _pct(ratio) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def _iqr(lat: dict, key: str) -> str:
    lo, hi = lat["paired_iqr"][key]
    return f"{lo:.3f}-{hi:.3f}"


def _md_ratio(lat: dict, key: str) -> str:
    """report.md's cell of a ratio: median; paired median, its IQR (the label first where unresolved)."""
    sp, paired = lat["speedup"][key], lat["paired_speedup"][key]
    if unresolved(lat, key):
        return f"{speedup_label(lat, key)}; median {sp:.3f}x, paired {paired:.3f}x"
    return f"{sp:.3f}x; {paired:.3f}x, {_iqr(lat, key)}"


UNRESOLVED_TEXT = ("~1.0x (unresolved: IQR a-b) = the interquartile range of the per-round ratios spans 1.0: "
                   "this run cannot tell the two apart, so no speedup (or slowdown) is claimed.")
QUICK_NOISE_TEXT = ("Quick mode's latency budget ({budget:g} s per model, {rounds} rounds at most) is "
                    "noise-dominated: its ratios are a smoke test, not a measurement.")


def _quick_noise(report: dict) -> str:
    s = report["settings"]
    return QUICK_NOISE_TEXT.format(budget=s["budget_s"], rounds=s["rounds"])


def format_table(report: dict) -> str:
    """The plain-text summary table (stdout)."""
    hdr = ("model", "ONNX", "taso+gen before", "after", "opt s", "peak MB", "max err", "ORT ms",
           "opt ms", "speedup", "ORT on/off", "onnxslim", "TASO pub", "TENSAT pub")
    rows = []
    for r in report["models"]:
        if r.get("status") != "ok":
            rows.append((r["name"], "FAILED: " + r.get("error", "")[:100]))
            continue
        b, a = r["ops"]["before"], r["ops"]["after"]
        lat, pub = r["latency"], r.get("published") or {}
        rows.append((
            r["name"], str(r["onnx"]["nodes"]), f"{b['taso']}+{b['generic']}", f"{a['taso']}+{a['generic']}",
            f"{r['times_s']['optimize']:.2f}", f"{r['memory']['peak_rss_mb']:.0f}",
            f"{r['numerics']['optimized_max_abs']:.2g}", f"{lat['median_ms']['original']:.3g}",
            f"{lat['median_ms']['optimized']:.3g}", speedup_label(lat, "optimized"),
            speedup_label(lat, "ort_enable_all"), speedup_label(lat, "onnxslim"),
            _pct(pub.get("taso_speedup")), _pct(pub.get("tensat_speedup"))))
    widths = [max([len(h)] + [len(row[i]) for row in rows if len(row) == len(hdr)]) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)), "  ".join("-" * w for w in widths)]
    for row in rows:
        if len(row) != len(hdr):
            lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    lines.append(f"speedup = original / optimized onnxruntime latency (ORT_ENABLE_ALL for both, interleaved, "
                 f"median); ORT on/off = ORT_DISABLE_ALL / ORT_ENABLE_ALL; onnxslim = original / onnxslim'd; "
                 f"TASO/TENSAT pub = published cost-model speedups (T4), not measured here. "
                 f"{UNRESOLVED_TEXT}{' ' + _quick_noise(report) if report['quick'] else ''} "
                 f"Wall time {report['wall_time_s']:.0f} s.")
    lines += _table_lines(report)
    return "\n".join(lines) + "\n"


def _tabled(report: dict) -> list[dict]:
    """The models whose search priced with a measured table (``cuda:<gpu>``)."""
    return [r for r in _ok(report) if (r.get("cost") or {}).get("table")]


def table_text(t: dict) -> str:
    libs = ", ".join(f"{k} {v}" for k, v in (t.get("libraries") or {}).items())
    return (f"{t['name']} = {t['table']}: measured on {t['gpu']}, driver {t.get('driver') or 'unknown'}"
            f"{', ' + libs if libs else ''}, on {t['date']}; {t['entries']} signatures in it"
            + ("; A REHEARSAL TABLE (calibrate.py --dry-run: numpy on the CPU), NOT GPU TIMINGS"
               if t.get("rehearsal") else ""))


def _table_lines(report: dict) -> list[str]:
    """stdout: with a measured table, which one, and per model the search's cost under it (signatures
    measured / estimated by the fitted roofline) beside the hand-set analytic roofline's search and TENSAT's."""
    tabled = _tabled(report)
    if not tabled:
        return []
    out = [f"cost model {table_text(tabled[0]['cost']['table'])}"]
    for r in tabled:
        c, pub = r["cost"], r.get("published") or {}
        b = c.get("beside") or {}
        out.append(f"  {r['name']}: {c['before']:.4g} -> {c['after']:.4g} ms ({100 * c['reduction']:.1f}% less; "
                   f"{c['signatures']['measured']} signatures measured, {c['signatures']['estimated']} estimated)"
                   + (f"; {b['model']} search {100 * b['reduction']:.1f}%" if b else "")
                   + (f"; TENSAT published speedup {_pct(pub.get('tensat_speedup'))}" if pub.get("tensat_speedup")
                      else ""))
    return out


def format_markdown(report: dict) -> str:
    m, v = report["machine"], report["versions"]
    ok = _ok(report)
    out = [f"# taso-bench report{' (quick)' if report['quick'] else ''}", ""]
    if report["quick"]:
        out += [f"**{_quick_noise(report)}** A ratio marked *unresolved* is one whose interquartile range "
                "spans 1.0 (see *How it is measured*).", ""]
    out.append(f"- date: {report['date']}; wall time of the run: {report['wall_time_s']:.0f} s")
    out.append(f"- machine: {m['cpu']}, {m['cpus']} CPU(s) usable, {m['memory_gib']} GiB, {m['system']}, "
               f"{m['accelerator']}")
    out.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + f", Python {m['python']}")
    out.append(f"- command: `{' '.join(report['command'])}`")
    out.append(f"- optimizer: **{report['optimizer']['name']}**, pipeline `{report['optimizer']['pipeline']}` "
               f"(after import and convert-onnx-to-taso)")
    cm = report["cost_model"]
    chosen = f" ({cm['default']})" if cm.get("default") else ""
    out.append(f"- cost model: {cm['requested'] or 'none requested'}{chosen}: {cm['status']}")
    s = report["settings"]
    out.append(f"- latency: up to {s['rounds']} interleaved rounds (at least {s['min_rounds']}, {s['budget_s']:g} s "
               f"budget per model) over {s['epochs']} sets of fresh sessions, {s['warmup']} warm-up run(s) per "
               f"variant and set, onnxruntime CPU, {s['threads'] or 'one per core (onnxruntime default)'} intra-op "
               f"thread(s), no spin-waiting; max error over {s['numeric_trials']} random input sets, tolerance "
               f"{s['tolerance']:g} x output scale")
    out += ["", "## taso-mlir (measured)", "",
            "| model | configuration | ONNX nodes | before: taso + generic ops | after: taso + generic ops | "
            "exported nodes | optimize (search) s | import s | export s | peak RSS MB (+increase) | max abs error "
            "| ORT original ms | ORT optimized ms | speedup (median; paired, its IQR) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["models"]:
        if r.get("status") != "ok":
            out.append(f"| {r['name']} | {r.get('config', '')} | FAILED: {r.get('error', '')} |" + " |" * 11)
            continue
        b, a, t, lat = r["ops"]["before"], r["ops"]["after"], r["times_s"], r["latency"]
        mem = r["memory"]
        out.append(
            f"| {r['name']} | {r['config']} | {r['onnx']['nodes']} | {b['taso']} + {b['generic']} | "
            f"{a['taso']} + {a['generic']} | {r['ops']['exported_nodes']} | {t['optimize']:.3f} | {t['import']:.2f} | "
            f"{t['export']:.2f} | {mem['peak_rss_mb']:.0f} (+{_f(mem['peak_increase_mb'], '.0f')}) | "
            f"{r['numerics']['optimized_max_abs']:.3g} | {lat['median_ms']['original']:.4g} | "
            f"{lat['median_ms']['optimized']:.4g} | {_md_ratio(lat, 'optimized')} |")
    costed = [r for r in ok if (r.get("cost") or {}).get("status") == "ok"]
    if costed:
        out += ["", f"## Cost model ({costed[0]['cost']['model']}): the search's own measure", ""]
        if costed[0]["cost"].get("costs"):
            out += [f"Costs {costed[0]['cost']['costs']}.", ""]
        out += ["*Prepared* is the model as the search starts from it, with the batchnorms, scales, bias adds and "
                "activations fused into the ops before them, as runtimes run it; the *reduction* is the search's, from "
                "it. *As imported* is each Relu an op of its own (the importer's graph).", "",
                "| model | cost as imported ms | cost prepared ms | cost after ms | reduction (from prepared) | "
                "TENSAT published speedup (T4 cost model) | search s | rewrites applied | graphs explored | rules applied |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in costed:
            c, pub = r["cost"], r.get("published") or {}
            rules = ", ".join(f"{k} x{v}" for k, v in list(c["applied"].items())[:6]) or "none"
            out.append(f"| {r['name']} | {_f(c.get('imported'), '.4g')} | {c['before']:.4g} | {c['after']:.4g} | "
                       f"{100 * c['reduction']:.1f}% | "
                       f"{_pct(pub.get('tensat_speedup'))} | {c['search_s']:.2f}"
                       f"{' (timed out)' if c['timed_out'] else ''} | {c['rewrites_applied']} | "
                       f"{c['graphs_explored']} | {rules} |")
        out += _markdown_table_section(report)
        checked = [(r["name"], lc) for r in costed for lc in r["cost"].get("latency_check") or ()]
        if checked:
            out += ["", "taso-search's latency check (the result timed against the input inside the pass; "
                    "speedup = input / result):", ""]
            from taso_mlir.passes.search.taso_search import latency_check_text

            out += [f"- **{name}**: {latency_check_text(lc)}" for name, lc in checked]
    out += ["", "Ops by kind after the optimizer:", ""]
    for r in ok:
        a = r["ops"]["after"]
        ops = ", ".join(f"{k} {n}" for k, n in a["taso_by_op"].items())
        gen = ", ".join(f"{k} {n}" for k, n in a["generic_by_op"].items()) or "none"
        out.append(f"- **{r['name']}**: taso: {ops}; generic: {gen}; {a['weights']} weights, "
                   f"{r['onnx']['parameters'] / 1e6:.2f} M parameters")
    out += ["", "## Peers (measured in the same rounds)", "",
            "| model | ORT_DISABLE_ALL ms | ORT_ENABLE_ALL ms | ORT optimizer speedup (median; paired, its IQR) | "
            "nodes after ORT's optimizer | onnxslim nodes | onnxslim + ORT ms | onnxslim speedup (median; paired, "
            "its IQR) | onnxslim s | onnxslim max abs "
            "error | ORT optimizer max abs error |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ok:
        lat, num = r["latency"], r["numerics"]
        out.append(
            f"| {r['name']} | {lat['median_ms']['ort_disabled']:.4g} | {lat['median_ms']['original']:.4g} | "
            f"{_md_ratio(lat, 'ort_enable_all')} | "
            f"{_f(r['ops']['ort_optimized_nodes'], 'd')} | {r['ops']['onnxslim_nodes']} | "
            f"{lat['median_ms']['onnxslim']:.4g} | {_md_ratio(lat, 'onnxslim')} | "
            f"{r['times_s']['onnxslim']:.2f} | {num['onnxslim_max_abs']:.3g} | {num['ort_disabled_max_abs']:.3g} |")
    caveat = (", and the identity optimizer (the round trip alone, no search)"
              if report["optimizer"]["name"] == "identity" else "")
    out += ["", "## Published figures (TASO and TENSAT; not measured here)", "",
            "Speedup of the optimized graph over the input graph in TASO's cost model (T4 GPU) and the "
            "optimizer's time, from the TENSAT paper; milliseconds from TASO's README chart (V100). Beside them, "
            f"this run's measured onnxruntime CPU speedup and optimizer time: different hardware and a different "
            f"measure{caveat}, so the numbers are side by side for reference, not as a like-for-like comparison.",
            "",
            "| model | TASO speedup | TASO time s | TENSAT speedup | TENSAT time s | TASO README ms (TensorRT -> "
            "TASO, V100) | this run: speedup, optimizer s |",
            "|---|---|---|---|---|---|---|"]
    for r in report["models"]:
        pub = r.get("published") or {}
        lat = r.get("latency")
        here = (f"{speedup_label(lat, 'optimized')}, {r['times_s']['optimize']:.3f} s" if lat else "-")
        readme = (f"{pub['readme_tensorrt_ms']:g} -> {pub['readme_taso_ms']:g}" if "readme_taso_ms" in pub else "-")
        if "taso_speedup" in pub:
            out.append(f"| {r['name']} | {_pct(pub['taso_speedup'])} | {pub['taso_time_s']:g} | "
                       f"{_pct(pub['tensat_speedup'])} | {pub['tensat_time_s']:g} | {readme} | {here} |")
        else:
            note = pub.get("note", "not in the published tables")
            out.append(f"| {r['name']} | {note} | - | - | - | {readme} | {here} |")
    base = report.get("baseline")
    if base is not None:
        out += ["", f"## Against a previous run ({base['date']}, `{base['path']}`)", "",
                "Speedups of the previous run -> this run; the original's median latency shows how much the "
                "machine itself moved between the runs.", "",
                "| model | taso-mlir speedup | ORT optimizer speedup | onnxslim speedup | original ms |",
                "|---|---|---|---|---|"]
        for row in base["models"]:
            sp = row["speedup"]

            def pair(k, sp=sp):
                a, b = sp[k]
                return f"{a:.3f}x -> {b:.3f}x ({(b - a) * 100:+.1f} pts)"

            a, b = row["original_ms"]
            out.append(f"| {row['name']} | {pair('optimized')} | {pair('ort_enable_all')} | {pair('onnxslim')} | "
                       f"{a:.4g} -> {b:.4g} ({(b / a - 1) * 100:+.1f}%) |")
        if not base["models"]:
            out.append("| (no model measured in both runs) | | | | |")
    out += ["", "## Charts", "",
            "Unresolved ratios are not drawn as speedups: the speedup chart shows each as a grey hatched bar at "
            "~1.0x with its interquartile range as a whisker, the optimizer-time chart as a grey hollow marker at "
            "1.0.", "",
            "![speedup per model](speedup.png)", "",
            "![speedup vs optimizer time](search_time.png)", "",
            "## How it is measured", "",
            "- Each model runs in its own worker process: built with `onnx.helper` (random weights, seed 0), "
            "checked with `onnx.checker` (full check), imported (ONNX shape inference, the MLIR importer, "
            "convert-onnx-to-taso), optimized by the pipeline, verified, exported to ONNX.",
            "- *before* counts the module the optimizer receives, *after* the one it returns; taso ops exclude "
            "`taso.weight` (weights are counted apart); generic ops are ONNX operators outside TASO's set.",
            "- Peak RSS is the kernel's high-water mark over import + optimize + export (reset just before), "
            "with the original model already in memory; the increase is over the RSS just before import.",
            "- Latency: the original, the optimized, the original with onnxruntime's optimizer off and the "
            "onnxslim'd model run in the same process, one after another in each round (the order rotated per "
            "round, so drifting load on a shared machine hits all alike); fast models repeat inside a sample. "
            "speedup = median original / median variant; *paired* = median of the per-round ratios, with their "
            "interquartile range (the noise: an identity optimizer's true speedup is 1). The rounds are spread over "
            "several sets of freshly created sessions, because where a session's buffers land in memory moves "
            "its latency by a few percent for the session's whole life. One onnxruntime thread by default "
            "(`--threads`), without spin-waiting, so that a second job on the machine costs all variants alike.",
            "- *Unresolved*: a ratio whose interquartile range over the interleaved rounds spans 1.0 (lower "
            "quartile <= 1 <= upper quartile) is not resolved: the run cannot tell the variant from the original, "
            "so it is printed `~1.0x (unresolved: IQR a-b)` instead of a speedup (the medians stay in the tables "
            "above for the record), marked `resolved: false` in results.json, and not charted as a bar. The "
            "range is the spread of single rounds: longer samples (20 ms each in a full run, 1 ms in quick mode) "
            "and a quieter machine narrow it, more rounds only estimate it better. `--quick`'s 0.5 s latency "
            "budget per model (at most 5 rounds) is noise-dominated, so many of its ratios are unresolved and "
            "none is a measurement to quote.",
            "- Max error: largest |difference| of the outputs from the original's, both run by onnxruntime with "
            "ORT_ENABLE_ALL, on the random input sets.",
            "- Cost under a cost model: " + cm["status"] + ".",
            ""]
    return "\n".join(out)


def _markdown_table_section(report: dict) -> list[str]:
    """report.md, with a measured table: which table, how many signatures each search found in it, and the
    search under the table beside the search under the GPU's hand-set analytic roofline (each result priced by
    both) and TENSAT's published figure."""
    tabled = _tabled(report)
    if not tabled:
        return []
    t = tabled[0]["cost"]["table"]
    bes = next((r["cost"]["beside"]["model"] for r in tabled if r["cost"].get("beside")), "the analytic roofline")
    out = ["", f"### Measured costs ({t['name']}) beside the analytic roofline and TENSAT", "",
           f"- table: {table_text(t)}" + (f" ({t['failed']} failed and {t['unsupported']} without a kernel in "
                                          "the calibration: estimated)" if t["failed"] or t["unsupported"] else ""),
           f"- *measured / estimated*: the distinct op signatures the search priced that the table has (their "
           f"measured medians) and that it lacks (estimated by the {t['fitted_profile']} roofline fitted to the "
           "table per op class)",
           f"- *{bes}*: the same model searched with the GPU's hand-set analytic roofline, the figure printed "
           "before a table existed; each search's result is also priced by the other model, so a different "
           "choice shows apart from different numbers", "",
           "- *prepared -> after*: from the function the search starts from (batchnorms, scales, bias adds and "
           "relus fused into the ops before them, as runtimes run a model), the search's own reduction", "",
           f"| model | {t['name']}: prepared -> after ms | reduction | signatures measured / estimated | {bes}: "
           f"prepared -> after ms | reduction | its result under {t['name']} ms | this result under {bes} ms | "
           "TENSAT published speedup (T4 cost model) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in tabled:
        c, pub, b = r["cost"], r.get("published") or {}, r["cost"].get("beside")
        sg = c["signatures"]
        row = (f"| {r['name']} | {c['before']:.4g} -> {c['after']:.4g} | {100 * c['reduction']:.1f}% | "
               f"{sg['measured']} / {sg['estimated']} | ")
        if b:
            bs = b["its_result_signatures"]
            row += (f"{b['before']:.4g} -> {b['after']:.4g} | {100 * b['reduction']:.1f}% | "
                    f"{b['its_result_under_table_ms']:.4g} ({bs['measured']} / {bs['estimated']}) | "
                    f"{b['table_result_under_it_ms']:.4g} | ")
        else:
            row += "- | - | - | - | "
        out.append(row + f"{_pct(pub.get('tensat_speedup'))} |")
    return out


def _write_outputs(out: str, report: dict) -> None:
    from taso_mlir.dialect.onnx_export import write_atomic

    def finite(o):  # JSON has no NaN or Infinity: such a number becomes null (and is a failed check anyway)
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {k: finite(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [finite(v) for v in o]
        return o

    text = json.dumps(finite(report), indent=1, allow_nan=False) + "\n"
    write_atomic(os.path.join(out, "results.json"), lambda f: f.write(text.encode()))
    md = format_markdown(report)
    write_atomic(os.path.join(out, "report.md"), lambda f: f.write(md.encode()))
    for name, png in _charts(report).items():
        write_atomic(os.path.join(out, name), lambda f, png=png: f.write(png))


def chart_series(report: dict) -> list[tuple]:
    """speedup.png's series: (label, per-model value or None, hatch, per-model IQR where the ratio is
    unresolved, else None). An unresolved ratio is drawn as a grey hatched ~1.0x bar with its IQR as a
    whisker, not as a speedup bar."""
    ok = _ok(report)
    opt = report["optimizer"]["name"]

    def measured(label, key):
        lats = [r["latency"] for r in ok]
        return (label, [lat["speedup"][key] for lat in lats], None,
                [tuple(lat["paired_iqr"][key]) if unresolved(lat, key) else None for lat in lats])

    none = [None] * len(ok)
    return [
        measured(f"taso-mlir ({opt}), measured ORT CPU", "optimized"),
        measured("onnxslim + ORT, measured", "onnxslim"),
        measured("ORT optimizer on vs off, measured", "ort_enable_all"),
        ("TASO, published (T4 cost model)", [(r.get("published") or {}).get("taso_speedup") for r in ok], "//", none),
        ("TENSAT, published (T4 cost model)", [(r.get("published") or {}).get("tensat_speedup") for r in ok], "xx",
         none),
    ]


def _charts(report: dict) -> dict[str, bytes]:
    """speedup.png (per model: measured ratios and the published ones; an unresolved ratio grey, hatched, at
    ~1.0x with its IQR) and search_time.png (speedup vs optimizer time, measured and published; unresolved
    points grey and hollow at ~1.0x)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from matplotlib.patches import Patch

    ok = _ok(report)
    names = [r["name"] for r in ok]
    opt = report["optimizer"]["name"]
    series = chart_series(report)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    charts = {}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 4.5), 4.5))
    x = np.arange(len(names))
    width = 0.8 / len(series)
    any_unresolved = False
    for i, (label, vals, hatch, unres) in enumerate(series):
        color = colors[i % len(colors)]
        xs = x + (i - (len(series) - 1) / 2) * width
        ys = [v if v is not None and u is None else np.nan for v, u in zip(vals, unres)]
        ax.bar(xs, ys, width, label=label, hatch=hatch, color=color, edgecolor="black" if hatch else None,
               linewidth=0.5)
        for xi, u in zip(xs, unres):
            if u is None:
                continue
            any_unresolved = True
            lo, hi = u  # "~1.0x": a grey hatched bar to 1.0, its IQR as a whisker
            ax.bar(xi, 1.0, width, color="#e0e0e0", hatch="..", edgecolor=color, linewidth=0.8, label="_nolegend_")
            ax.errorbar(xi, 1.0, yerr=[[1.0 - lo], [hi - 1.0]], color="grey", linewidth=0.8, capsize=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("speedup (x, > 1 is faster)")
    ax.set_title("Speedup per model" + (" (quick)" if report["quick"] else ""))
    handles = ax.get_legend_handles_labels()[0]
    if any_unresolved:
        handles.append(Patch(facecolor="#e0e0e0", hatch="..", edgecolor="grey",
                             label="unresolved: the IQR of the per-round\nratios (whisker) spans 1.0: ~1.0x,\n"
                                   "not a speedup"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    charts["speedup.png"] = buf.getvalue()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    t = {r["name"]: max(r["times_s"]["optimize"], 1e-4) for r in ok}
    pts = [(f"taso-mlir ({opt}): measured ORT speedup", "o", [(t[r["name"]], r["latency"]["speedup"]["optimized"],
            r["name"]) for r in ok if not unresolved(r["latency"], "optimized")])]
    grey = [(t[r["name"]], 1.0, r["name"]) for r in ok if unresolved(r["latency"], "optimized")]
    for who, mk in (("taso", "s"), ("tensat", "^")):
        seen, p = set(), []
        for r in ok:
            pub = r.get("published") or {}
            if f"{who}_speedup" in pub and r["title"] not in seen:
                seen.add(r["title"])
                p.append((pub[f"{who}_time_s"], pub[f"{who}_speedup"], r["title"]))
        pts.append((f"{who.upper()}: published cost-model speedup (T4)", mk, p))
    for label, mk, p in pts:
        if not p:
            continue
        ax.scatter([a for a, _, _ in p], [b for _, b, _ in p], marker=mk, label=label)
        for a, b, n in p:
            ax.annotate(n, (a, b), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if grey:
        ax.scatter([a for a, _, _ in grey], [b for _, b, _ in grey], marker="o", facecolors="none",
                   edgecolors="grey", label=f"taso-mlir ({opt}): unresolved (IQR spans 1.0; ~1.0x)")
        for a, b, n in grey:
            ax.annotate(n, (a, b), fontsize=6, color="grey", xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("optimizer (search) time, s (log)")
    ax.set_ylabel("speedup (x)")
    ax.set_title("Speedup vs optimizer time" + (" (quick)" if report["quick"] else ""))
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    charts["search_time.png"] = buf.getvalue()
    return charts


if __name__ == "__main__":  # a worker: python -m taso_mlir.benchmarks.runner JOB (see _run_worker)
    sys.exit(_worker_main(sys.argv[1]))
