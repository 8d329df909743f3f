"""``taso-search``: the pipeline of passes that optimizes a model with the verified rules.

On every function it runs the *prepare* passes (``PREPARE``: batchnorms and constants folded, views,
gathers and divisions raised to `taso` ops, scales folded, repeats merged, ReLU6, bias adds and relus
fused, DCE), then a *guarded segment*: the search (``SEARCH``: 3-D matmuls flattened, TASO's backtracking search
replayed on the IR as PDL patterns) and the *cleanup* passes (``CLEANUP``: weights folded, split and
concat trees fused, elementwise and layout ops lifted over splits, flattened matmuls restored, layout
chains composed). Each is a registered pass in its own module (``passes/prepare``, ``passes/search``,
``passes/cleanup``); ``taso-opt --dump-pass-pipeline`` prints the pipeline.

Checks wrap the pipeline rather than living in a pass: the never-worse guard (``pipeline.run_guarded``:
where the segment's result costs more as written than the function it started from, that function is
kept); with the measured CPU cost model, the latency check (``_run_checked``: the result is timed
against the input in onnxruntime); with any other, the whole result against the input
(``_run_never_worse``: the prepare passes are outside the segment's guard). The report (``report``) is built from the statistics the passes
declare; its cost before is the input's (before the batchnorm folding), so the reduction from it
includes the prepare passes; its prepared cost (``cost_prepared_ms``) is the function the search starts
from, the baseline of the search's own reduction.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from typing import Optional

from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import erase_op
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import function_bodies
from taso_mlir.passes import pipeline as PL
from taso_mlir.passes.cleanup import dce, fold_weights, fuse_trees, layout_chains, lift_elementwise, lift_layout
from taso_mlir.passes.cost.oracle import CpuMeasured, describe, get_cost_model, is_measured, target_of
from taso_mlir.passes.pipeline import FuncState
from taso_mlir.passes.prepare import (fold_batchnorm, fold_constants, fold_matmul_bias, fold_scale, fuse_activation,
                                      fuse_relu6, merge_repeats, raise_generic)
from taso_mlir.passes.search import backtracking as S
from taso_mlir.passes.search import backtracking_search, eqsat_search, flatten_matmul
from taso_mlir.passes.search import pdl as P
from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T

#: taso-search's passes, in order: prepare, then the guarded segment (search and cleanup)
PREPARE = (fold_batchnorm.PASS, fold_constants.PASS, raise_generic.VIEWS, raise_generic.GATHERS, fold_scale.DIVS,
           fold_scale.SCALES, merge_repeats.PASS, fuse_relu6.PASS, fold_matmul_bias.PASS, fuse_activation.PASS, dce.PASS)
SEARCH = (flatten_matmul.FLATTEN, backtracking_search.PASS)
#: the search with strategy=eqsat
EQSAT_SEARCH = (flatten_matmul.FLATTEN, eqsat_search.PASS)
CLEANUP = (fold_weights.PASS, fuse_trees.SPLITS, lift_elementwise.PASS, fuse_trees.CONCATS, flatten_matmul.UNFLATTEN,
           lift_layout.PASS, layout_chains.ROWS, layout_chains.COMPOSE)
#: every function pass (each registered on its own as well)
FUNCTION_PASSES = PREPARE + SEARCH + CLEANUP + (eqsat_search.PASS,)
#: the statistics that count changes to the IR (zero where the input is kept), the search's rewrites aside
_CHANGE_COUNTS = tuple(dict.fromkeys(k for p in FUNCTION_PASSES for k in p.changes if k != "rewrites_applied"))

_REWRITES: dict = {}
#: the report of the last run in this process (taso-bench reads it)
LAST_REPORT: Optional[dict] = None


def rewrites(path: Optional[str] = None) -> list:
    key = path or ""
    if key not in _REWRITES:
        try:
            _REWRITES[key] = S.usable_rewrites(RB.load(path))
        except ValueError as e:  # library.LibraryError
            raise TasoError(str(e)) from None
    return _REWRITES[key]


def search_setup(opts: dict, cost_model) -> dict:
    """The ``FuncState`` fields the search needs, from the pass options: the rules, the graph builders
    over ``cost_model``, the replayer and the search options."""
    rws = rewrites(opts.get("rules") or None)
    return dict(rws=rws, by_id={rw.id: rw for rw in rws}, replayer=P.Replayer(rws),
                builder=T.Builder(cost_model), written=T.Builder(cost_model, split_trees=False),
                sopts=S.Options(alpha=opts.get("alpha", 1.05), budget=opts.get("budget", 100),
                                timeout=opts.get("timeout", 30.0), window=opts.get("window", 120)))


def run(module_op: ir.Operation, opts: dict) -> dict:
    with module_op.context, ir.Location.unknown(module_op.context):
        return _run(module_op, opts)


def _run(module_op: ir.Operation, opts: dict) -> dict:
    global LAST_REPORT
    t0 = time.monotonic()
    cm = get_cost_model(target_of(opts))
    setup = search_setup(opts, cm)
    report = {"target": cm.name, "measured": is_measured(cm), "costs": describe(cm), "cost_model": cm.name,
              "rules": len(setup["rws"]), "options": asdict(setup["sopts"]), "functions": []}
    funcs = function_bodies(module_op)
    # the measured model can check the whole result on this machine; it needs the module as one ONNX graph
    check = opts.get("latency-check", True) and isinstance(cm, CpuMeasured) and len(funcs) == 1
    try:
        for f in funcs:
            if check:
                fr = _run_checked(module_op, f, setup, opts)
            else:
                fr = _run_never_worse(f, setup, opts)
            report["functions"].append(fr)
            PL.record_statistics(fr["pass_statistics"])
    finally:
        cm.close()
    report["time_s"] = round(time.monotonic() - t0, 3)
    fr = report["functions"]
    report["cost_before_ms"] = sum(x["cost_before_ms"] for x in fr)
    report["cost_after_ms"] = sum(x["cost_after_ms"] for x in fr)
    report["cost_prepared_ms"] = sum(x["cost_prepared_ms"] for x in fr)
    report["compute_ops_before"] = sum(x["compute_ops_before"] for x in fr)
    report["compute_ops_after"] = sum(x["compute_ops_after"] for x in fr)
    report["applied"] = dict(sum((Counter(x["applied"]) for x in fr), Counter()).most_common())
    report["estimated_costs"] = getattr(cm, "estimated", 0)
    LAST_REPORT = report
    dest = opts.get("report", "")
    if dest:
        _write_report(report, dest)
    return report


def dump_pipeline(options: dict | None = None) -> str:
    """``taso-search`` as the passes it runs (what ``taso-opt --dump-pass-pipeline`` prints)."""
    options = options or {}
    head = " ".join(f"{k}={v}" for k, v in options.items())
    return "\n".join([
        "taso-search" + (f"{{{head}}}" if head else "") + " runs, on every function:",
        PL.pipeline_text([("prepare", PREPARE)], options),
        "  then, kept only where the function costs no more as written than before it (never worse):",
        PL.pipeline_text([("search", _searches(options.get("strategy", "backtracking"))[0]), ("cleanup", CLEANUP)],
                         options),
    ] + (["  and again from the same function with the other search:",
          PL.pipeline_text([("search", EQSAT_SEARCH), ("cleanup", CLEANUP)], options),
          "  keeping the cheaper result"] if options.get("strategy") == "best" else []) + [
        "  (with target cpu, the whole result is then timed against the input: latency-check; with any other "
        "target, the input is kept where the whole result costs more as written)",
    ])


def _searches(strategy: str) -> list:
    """The search passes a strategy runs, each followed by the cleanup (best: both, the cheaper kept)."""
    return {"backtracking": [SEARCH], "eqsat": [EQSAT_SEARCH], "best": [SEARCH, EQSAT_SEARCH]}[strategy]


def _run_pipeline(f, setup: dict, opts: dict) -> tuple[dict, ir.Operation]:
    """The taso-search pipeline on one function: the prepare passes, then the search and cleanup passes
    under the never-worse guard. Returns the function's report, built from the passes' statistics, and
    the function (the guard may replace it)."""
    st = FuncState(f, opts=opts, **setup)
    written = st.written
    # the costs reported are those of the function as written, where every split costs its own: the
    # search charges nothing for a split of a split's piece on the same axis where nothing else uses
    # the piece, which fuse_split_trees makes part of its parent only where the pieces are at most 16
    g_in, _ = T.from_function(f, st.builder)
    cost_in = T.from_function(f, written)[0].cost
    compute_in = compute_ops(f)

    def after_batchnorm(st):  # (the report's cost and ops after the batchnorm folding)
        folded = st.stats["batchnorms_folded"]
        st.extra["cost_after_fold_ms"] = T.from_function(st.f, written)[0].cost if folded else cost_in
        st.extra["ops_after_fold"] = T.from_function(st.f, st.builder)[0].num_ops if folded else g_in.num_ops

    PL.run_passes(st, PREPARE, after={fold_batchnorm.PASS.argument: after_batchnorm})
    # the baseline: the function prepared (batchnorms, scales, biases and activations fused, as runtimes
    # run a model), which the search starts from; the reduction by the search is from this cost
    cost_prepared = T.from_function(st.f, written)[0].cost

    def measure(fn):
        g = T.from_function(fn, written)[0]
        return g.cost, g.num_ops

    # (the search prices the flattened matmuls' reshapes, which the restoring takes away)
    searches = _searches(opts.get("strategy", "backtracking"))
    dropped = PL.run_guarded(st, searches[0] + CLEANUP, measure, keep_start=len(searches) > 1)
    if len(searches) > 1:  # strategy=best: the other search from the same function, the cheaper kept
        st, dropped = _best_of(st, dropped, searches[1], measure)
    f = st.f
    # the cost and op count of the function as written (split trees fused), which the search's cost
    # model predicts except where a split tree could not be fused (more than MAX_ARITY pieces)
    g_out, _ = T.from_function(f, written)
    history = st.extra["history"]
    if dropped:
        dropped["rewrites"] = len(history)
        history = []
    fr = {
        "function": st.name,
        "ops_before": g_in.num_ops, "ops_after": g_out.num_ops,
        "compute_ops_before": compute_in, "compute_ops_after": compute_ops(f),
        "cost_before_ms": cost_in, "cost_after_ms": g_out.cost, "cost_searched_ms": st.extra["cost_searched_ms"],
        "cost_prepared_ms": cost_prepared,
        "ops_after_fold": st.extra["ops_after_fold"], "cost_after_fold_ms": st.extra["cost_after_fold_ms"],
        "fold_batchnorm_s": round(st.times[fold_batchnorm.PASS.argument], 3),
        "applied": dict(Counter(h[0] for h in history).most_common()),
        "timed_out": st.extra["timed_out"], "rejected_sites": st.extra["rejected_sites"],
        "search_s": round(st.extra["search_s"], 3),
        "replay_s": round(sum(st.times.get(p.argument, 0.0) for p in SEARCH + EQSAT_SEARCH[1:] + CLEANUP)
                          - st.extra["search_s"] - st.times[flatten_matmul.FLATTEN.argument], 3),
        "pass_s": {k: round(v, 3) for k, v in st.times.items()},
        "pass_statistics": {k: dict(v) for k, v in st.pass_stats.items()},
    }
    for p in FUNCTION_PASSES:  # the statistics every pass declares
        for k in p.counters:
            fr[k] = st.stats[k]
    if dropped:
        fr["search_result_dropped"] = dropped
    if "eqsat" in st.extra:
        fr["eqsat"] = st.extra["eqsat"]
    if "strategies" in st.extra:
        fr["strategies"] = st.extra["strategies"]
    fr["strategy"] = opts.get("strategy", "backtracking")
    return fr, f


def _best_of(st: FuncState, dropped, other: tuple, measure) -> tuple:
    """``st`` after one guarded segment, and that segment's start kept aside (``st.extra["segment_start"]``):
    run ``other`` (and the cleanup) from that start too and keep the cheaper result, its state and
    statistics. Only one of the two functions is in the module at a time (they share their name)."""
    start = st.extra.pop("segment_start")
    first = st.f.clone()  # detached
    cost_first = measure(st.f)[0]
    ir.InsertionPoint(st.f).insert(start)
    erase_op(st.f)
    st2 = FuncState(start, builder=st.builder, written=st.written, rws=st.rws, by_id=st.by_id, replayer=st.replayer,
                    sopts=st.sopts, opts=st.opts, stats=Counter(st.extra["stats_before_segment"]),
                    extra={k: v for k, v in st.extra.items() if k in ("cost_after_fold_ms", "ops_after_fold")},
                    times=dict(st.times), pass_stats={k: Counter(v) for k, v in st.extra["pass_stats_before_segment"].items()})
    dropped2 = PL.run_guarded(st2, other + CLEANUP, measure)
    cost_second = measure(st2.f)[0]
    names = [p.argument for p in (SEARCH[1], other[1])]
    kept = 1 if cost_second < cost_first * (1 - 1e-9) else 0
    report = {names[0]: cost_first, names[1]: cost_second, "kept": names[kept]}
    if kept == 0:
        ir.InsertionPoint(st2.f).insert(first)
        erase_op(st2.f)
        st.f = first
        st.extra["strategies"] = report
        for k in ("eqsat",):
            if k in st2.extra:
                st.extra[k] = st2.extra[k]
        return st, dropped
    st2.extra["strategies"] = report
    return st2, dropped2


def compute_ops(f: ir.Operation) -> int:
    """The ops of function ``f`` that compute: taso and generic onnx ops, not weights (as ``taso-opt
    --summary``'s census counts them)."""
    return sum(1 for o in f.regions[0].blocks[0].operations
               if (o.operation.name.startswith("taso.") and o.operation.name != "taso.weight")
               or (o.operation.name.startswith("onnx.") and o.operation.name != "onnx.NoValue"))


def _changed(fr: dict) -> bool:
    """The function differs from its input."""
    return bool(fr["rewrites_applied"] or any(fr[k] for k in _CHANGE_COUNTS))


def _run_checked(module_op, f, setup: dict, opts: dict) -> dict:
    """``_run_pipeline`` with the latency check of the measured cost model: the per-op costs the search
    adds up miss how onnxruntime lays data out between ops (a split forces its neighbours out of the
    blocked NCHWc layout), so the result is timed against the input, side by side in onnxruntime
    (``latency.compare``). Where it is slower beyond the noise (the upper quartile of the per-round
    speedups below 1), the function is searched again without the rewrites that introduce a split;
    where that is slower too, or cannot be timed, the input is kept as it was. Where the first result
    cannot be timed (onnxruntime refuses the model, the inputs cannot be made), it is kept and the
    report says why. The report says what was timed and kept."""
    from taso_mlir.dialect.errors import one_line
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.passes.cost import latency as L

    backup = f.clone()  # detached
    fr, f = _run_pipeline(f, setup, opts)
    if not _changed(fr):
        fr["latency_check"] = {"kept": "search result", "why": "the function is unchanged"}
        return fr
    settings = L.Settings(threads=setup["builder"].cost_model.threads)
    scratch = ir.Module.create()
    for na in module_op.attributes:
        scratch.operation.attributes[na.name] = na.attr
    ir.InsertionPoint(scratch.body).insert(backup.clone())
    tick = time.monotonic()

    def timed(what):
        return dict(L.compare(before, export_onnx(module_op), settings), what=what)

    try:
        before = export_onnx(scratch)
        tried = [timed("search result")]
    except Exception as e:  # TasoError, or onnxruntime refusing a model: the result stands, untimed
        fr["latency_check"] = {"kept": "search result", "why": f"not timed: {one_line(e)}"}
        return fr
    check = {"tried": tried}
    fr["latency_check"] = check

    def slower(t):
        return t["iqr"][1] < 1.0

    if not slower(tried[-1]):
        check.update(kept="search result", time_s=round(time.monotonic() - tick, 3))
        return fr

    f = _restore(f, backup)
    no_splits = dict(setup, rws=[rw for rw in setup["rws"] if not S.introduces_split(rw)])
    fr2, f = _run_pipeline(f, no_splits, opts)
    if _changed(fr2):
        try:
            tried.append(timed("search without splits"))
        except Exception as e:
            check["why"] = f"the search without splits not timed: {one_line(e)}"
        else:
            if not slower(tried[-1]):
                fr2["latency_check"] = check
                fr2["search_s"] = round(fr2["search_s"] + fr["search_s"], 3)  # both searches ran
                check.update(kept="search without splits", time_s=round(time.monotonic() - tick, 3))
                return fr2
    _keep_input(_restore(f, backup), fr, setup)
    check.update(kept="input", time_s=round(time.monotonic() - tick, 3))
    return fr


def _restore(f: ir.Operation, backup: ir.Operation) -> ir.Operation:
    """A clone of ``backup`` (the function as it was, detached) in ``f``'s place; ``f`` erased."""
    g = backup.clone()
    ir.InsertionPoint(f).insert(g)
    erase_op(f)
    return g


def _keep_input(f: ir.Operation, fr: dict, setup: dict) -> None:
    """``fr`` made the report of ``f``, the function restored as it was before the pipeline: nothing
    applied or changed, its cost and ops after its own."""
    g_in = T.from_function(f, setup["written"])[0]
    fr.update(ops_after=g_in.num_ops, cost_after_ms=g_in.cost, cost_searched_ms=g_in.cost, applied={},
              rewrites_applied=0, compute_ops_after=fr["compute_ops_before"])
    fr.pop("search_result_dropped", None)
    for k in _CHANGE_COUNTS:
        fr[k] = 0
    for counts in fr["pass_statistics"].values():
        for k in counts:
            if k in _CHANGE_COUNTS or k == "rewrites_applied":
                counts[k] = 0
    fr.update(ops_after_fold=fr["ops_before"], cost_after_fold_ms=fr["cost_before_ms"],
              cost_prepared_ms=fr["cost_before_ms"])


def _run_never_worse(f: ir.Operation, setup: dict, opts: dict) -> dict:
    """``_run_pipeline``, and where its result costs more as written than the input did (the prepare
    passes are not under the segment's guard: a measured table may price a batchnorm folded into its
    convolution's bias above the two ops), the input kept as it was and the report saying so."""
    backup = f.clone()  # detached
    fr, f = _run_pipeline(f, setup, opts)
    before, after = fr["cost_before_ms"], fr["cost_after_ms"]
    if after <= before * (1 + 1e-9) + 1e-12:
        return fr
    g = _restore(f, backup)
    fr["input_kept"] = {"cost_ms": after, "why": f"the pipeline's result costs {after:.6g} ms as written, more "
                        f"than the input's {before:.6g} ms"}
    _keep_input(g, fr, setup)
    return fr


def latency_check_text(lc: dict) -> str:
    """One line of what a function's latency check timed (speedups and quartiles) and kept."""
    timed = "; ".join(f"{t['what']} {t['speedup']:.3f}x (quartiles {t['iqr'][0]:.3f}-{t['iqr'][1]:.3f}, "
                      f"{t['rounds']} rounds)" for t in lc.get("tried", ()))
    return f"{timed or lc.get('why', '')}; kept: {lc['kept']}"


def format_report(rep: dict) -> str:
    """The report as text: per function, the cost and op counts before and after, then each pass that
    changed something with its statistics (as the pass declares them), the rules applied, and what the
    never-worse guard and the latency check kept."""
    what = {p.argument: p.counters for p in FUNCTION_PASSES}
    L = [f"taso-search: target {rep['target']}, costs {rep['costs']}; {rep['rules']} rewrites (proved rules, "
         f"both usable directions), alpha {rep['options']['alpha']}, budget {rep['options']['budget']} per window"]
    for fr in rep["functions"]:
        before, after, prepared = fr["cost_before_ms"], fr["cost_after_ms"], fr["cost_prepared_ms"]
        red = 100.0 * (before - after) / before if before else 0.0
        by_search = 100.0 * (prepared - after) / prepared if prepared else 0.0
        L.append(f"  @{fr['function']}: cost {before:.4g} -> {after:.4g} ms ({red:.1f}% less, "
                 f"{'per-op times measured' if rep['measured'] else 'estimated'}; prepared {prepared:.4g} ms, "
                 f"{by_search:.1f}% less by the search), ops {fr['ops_before']} -> {fr['ops_after']} "
                 f"({fr['compute_ops_before']} -> {fr['compute_ops_after']} without weights), "
                 f"{fr['rewrites_applied']} rewrites applied, search "
                 f"{fr['search_s']} s" + (", TIMED OUT (best so far kept)" if fr["timed_out"] else ""))
        for arg, counts in fr.get("pass_statistics", {}).items():
            done = [f"{n} {what.get(arg, {}).get(k, k)}" for k, n in counts.items() if n]
            if done:
                L.append(f"    {arg}: " + ", ".join(done))
        q = fr.get("eqsat")
        if q:
            bound = "no bound" if q.get("bound_ms") is None else f"bound {q['bound_ms']:.4g} ms" + (
                "" if q.get("gap") is None else f", gap {100 * q['gap']:.1f}%")
            L.append(f"    eqsat: {q['enodes']} e-nodes in {q['eclasses']} e-classes after {q['iterations']} rounds (stopped: "
                     f"{q['stop']}), {q['blocked']} e-nodes blocked on cycles; extraction {q['extraction']} "
                     f"({q['status']}): {q['cost_ms']:.4g} ms, {bound}")
        if fr.get("strategies"):
            st_ = fr["strategies"]
            L.append("    strategies: " + ", ".join(f"{k} {v:.4g} ms" for k, v in st_.items() if k != "kept")
                     + f"; kept: {st_['kept']}")
        if fr.get("input_kept"):
            L.append(f"    input kept: {fr['input_kept']['why']}")
        if fr.get("search_result_dropped"):
            d = fr["search_result_dropped"]
            L.append(f"    the search's result ({d['rewrites']} rewrites) cost {d['cost_ms']:.4g} ms as written, more than "
                     f"the function it started from: that function is kept")
        if fr["applied"]:
            L.append("    rules applied: " + ", ".join(f"{k} x{v}" for k, v in fr["applied"].items()))
        lc = fr.get("latency_check")
        if lc:
            L.append(f"    latency check (onnxruntime, against the input): {latency_check_text(lc)}"
                     + (f" ({lc['time_s']} s)" if "time_s" in lc else ""))
    if rep.get("estimated_costs"):
        L.append(f"  {rep['estimated_costs']} op signatures had no measurement and were estimated analytically")
    L.append(f"  total time {rep['time_s']} s")
    return "\n".join(L) + "\n"


def _write_report(rep: dict, dest: str) -> None:
    text = format_report(rep)
    if dest in ("-", "stderr"):
        sys.stderr.write(text)
        return
    from taso_mlir.dialect.onnx_export import write_atomic

    if dest.endswith(".json"):
        data = (json.dumps(rep, indent=1, sort_keys=True) + "\n").encode()
    else:
        data = text.encode()
    write_atomic(dest, lambda f: f.write(data))
