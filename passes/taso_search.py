"""The ``taso-search`` pass: cost-based backtracking search with the verified rules, applied as PDL.

For every function: fold inference batchnorms into the convolutions before them (``fold_batchnorm``,
TASO's built-in conv + batchnorm rule); fold generic ONNX ops with constant results and the ops
that compute only from weights (``fold_generic``, ``fold_weights``), raise Squeeze/Unsqueeze/Flatten
and gathers of a whole axis to `taso` ops (``raise_generic``), fold scalar multiplies (and divisions
by powers of two) into the weights they reach (``fold_scale``), merge repeated ops (``cse``), fuse
ReLU6 (``Clip(0, 6)``) into the convolutions before them (``fuse_clip``), fold bias
adds into matmuls (``matmul_bias``) and flatten matmuls of a shared 3-D input (``flatten_matmul``);
build the in-memory graph (``tgraph``), search it (``search``), then replay the best graph's rewrites
on the IR with the emitted PDL patterns at the chosen sites (``pdl.Replayer``), check that the IR now
has exactly the structure the search scored, fold the ops that compute only from weights into new
weights, lift elementwise ops over splits (``lift_elementwise``), restore the flattened matmuls
(merged ones read the 3-D input again where that costs less), lift layout ops over splits
(``lift_layout``), make reshape/transpose chains one transpose (``layout_chains``), and remove dead
ops. Where the result costs more as written than the function the search started from, that function
is kept. ``report`` writes what happened; its cost before is the input's (before the batchnorm
folding), so the reduction it reports includes the folding and the ReLU6 fusion.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from typing import Optional

import numpy as np

from taso_mlir.dialect import handles as H
from taso_mlir.dialect import specs
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import check_live, each_live, erase_op, internal_error, ir_step, ops_of, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, dense_array, function_bodies, function_dce, new_weight, taso_attrs

from . import pdl as P
from . import pipeline as PL
from .pipeline import FuncState, FunctionPass
from . import rulebook as RB
from . import search as S
from . import tgraph as T
from .cost import CpuMeasured, get_cost_model
from .cse import eliminate_common_subexpressions
from .flatten_matmul import flatten_shared_matmuls, unflatten_matmuls, unflatten_split_matmuls
from .identities import drop_identities
from .lift_elementwise import lift_elementwise
from .layout_chains import compose_layout_chains, move_row_chains
from .lift_layout import lift_layout
from .matmul_bias import fuse_matmul_bias
from .raise_generic import gathers_to_split, views_to_reshapes
from .fold_batchnorm import fold_function
from .fuse_clip import fuse_function as fuse_relu6
from .fold_generic import fold_generic, fresh_name, weight_names
from .fold_scale import div_to_smul, fold_scalar_scales

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


def run(module_op: ir.Operation, opts: dict) -> dict:
    with module_op.context, ir.Location.unknown(module_op.context):
        return _run(module_op, opts)


def _run(module_op: ir.Operation, opts: dict) -> dict:
    global LAST_REPORT
    t0 = time.monotonic()
    rws = rewrites(opts.get("rules") or None)
    by_id = {rw.id: rw for rw in rws}
    cm = get_cost_model(opts.get("cost-model", "analytic"))
    builder = T.Builder(cm)
    sopts = S.Options(alpha=opts.get("alpha", 1.05), budget=opts.get("budget", 100),
                      timeout=opts.get("timeout", 30.0), window=opts.get("window", 120))
    report = {"cost_model": cm.name, "rules": len(rws), "options": asdict(sopts), "functions": []}
    replayer = P.Replayer(rws)
    funcs = function_bodies(module_op)
    # the measured model can check the whole result on this machine; it needs the module as one ONNX graph
    check = opts.get("latency-check", True) and isinstance(cm, CpuMeasured) and len(funcs) == 1
    try:
        for f in funcs:
            if check:
                fr = _run_checked(module_op, f, rws, by_id, builder, sopts, replayer, opts)
            else:
                fr, _ = _run_function(f, rws, by_id, builder, sopts, replayer, opts)
            report["functions"].append(fr)
    finally:
        cm.close()
    report["time_s"] = round(time.monotonic() - t0, 3)
    fr = report["functions"]
    report["cost_before_ms"] = sum(x["cost_before_ms"] for x in fr)
    report["cost_after_ms"] = sum(x["cost_after_ms"] for x in fr)
    report["applied"] = dict(sum((Counter(x["applied"]) for x in fr), Counter()).most_common())
    report["estimated_costs"] = getattr(cm, "estimated", 0)
    LAST_REPORT = report
    dest = opts.get("report", "")
    if dest:
        _write_report(report, dest)
    return report


# ---------------------------------------------------------------------------------------------
# the passes of the pipeline (each also registered on its own: passes/pipeline.py)


def _fold_batchnorm(st: FuncState) -> None:
    st.count("batchnorms_folded", fold_function(st.f))


def _fold_constants(st: FuncState) -> None:
    # constants the generic ops compute (from static shapes, from weights) and the weight-only ops, so
    # that identities they reveal (x + a folded zero) go before the search
    f = st.f
    generic_folded = pre_folded = 0
    while True:  # (a generic op can use a taso op's folded result, and the other way round)
        g_n = fold_generic(f, FOLDED_PREFIX, weight_names(f))
        t_n = fold_weights(f)
        generic_folded, pre_folded = generic_folded + g_n, pre_folded + t_n
        if not (g_n or t_n):
            break
        function_dce(f)  # (the taso ops folded are dead, and would be folded again)
    st.count("generic_folded", generic_folded)
    st.count("weights_folded", pre_folded)
    if pre_folded or generic_folded:
        st.count("identities_dropped", drop_identities(f))
        function_dce(f)


def _raise_views(st: FuncState) -> None:
    st.count("views_raised", views_to_reshapes(st.f))


def _raise_gathers(st: FuncState) -> None:
    st.count("gathers_raised", gathers_to_split(st.f))


def _raise_divs(st: FuncState) -> None:
    st.count("divs_raised", div_to_smul(st.f))


def _fold_scales(st: FuncState) -> None:
    scales = fold_scalar_scales(st.f)
    st.count("scales_folded", scales)
    if scales:
        function_dce(st.f)


def _merge_repeats(st: FuncState) -> None:
    # equal folded weights first (``taso_folded_*``: the input's own weights stay as they are): the
    # repeats of an op on them then have the same operands
    f = st.f
    merged = merge_duplicate_weights(f)
    repeats = eliminate_common_subexpressions(f)
    st.count("weights_merged", merged)
    st.count("repeats_merged", repeats)
    if merged or repeats:
        function_dce(f)


def _fuse_relu6(st: FuncState) -> None:
    st.count("relu6_fused", fuse_relu6(st.f))


def _fold_matmul_bias(st: FuncState) -> None:
    st.count("matmul_biases_fused", fuse_matmul_bias(st.f, st.cost_model))


def _dce(st: FuncState) -> None:
    function_dce(st.f)


def _flatten_matmuls(st: FuncState) -> None:
    st.count("matmuls_flattened", flatten_shared_matmuls(st.f))


def _backtracking_search(st: FuncState) -> None:
    """TASO's search on the function's graph, then the replay of the best graph's rewrites on the IR
    with the PDL patterns at the chosen sites, checked to give exactly the graph the search scored."""
    f, name = st.f, st.name
    # the graph the search starts from, and the function's ops by node id, as the function is now (no op
    # handle from before the passes that ran is kept)
    g0, mops = T.from_function(f, st.builder)
    tick = time.monotonic()

    def progress(i, n, cost):
        sys.stderr.write(f"\rtaso-search @{name}: window {i}/{n}, cost {cost:.4g} ms")
        if i == n:
            sys.stderr.write("\n")
        sys.stderr.flush()

    best, stats = S.search(g0, st.rws, st.builder, st.sopts, progress if st.opts.get("progress") else None)
    st.extra["search_s"] = time.monotonic() - tick
    st.extra["replay_tick"] = time.monotonic()
    replay(f, best, mops, st.replayer, st.by_id)
    if best.history:
        g_ir, _ = T.from_function(f, st.builder)
        if T.structure(g_ir) != T.structure(best):
            raise TasoError(f"internal error: @{name}: the IR after the PDL rewrites differs from the graph "
                            "the search chose")
    st.extra.update(history=best.history, cost_searched_ms=best.cost, search_stats=stats)
    st.count("rewrites_applied", len(best.history))


def _fold_weights(st: FuncState) -> None:
    f = st.f
    folded = fold_weights(f)
    st.count("weights_folded", folded)
    if folded:
        st.count("identities_dropped", drop_identities(f))
    function_dce(f)


def _fuse_split_trees(st: FuncState) -> None:
    st.count("splits_fused", fuse_split_trees(st.f))


def _lift_elementwise(st: FuncState) -> None:
    f = st.f
    lifted, permuted = lift_elementwise(f, st.cost_model)
    st.count("elementwise_lifted", lifted)
    st.count("weights_permuted", permuted)
    if permuted:
        st.count("weights_folded", fold_weights(f))
    # equal folded weights (the folding after the search makes new ones) are merged
    merged = merge_duplicate_weights(f)
    st.count("weights_merged", merged)
    if lifted or permuted or merged:
        function_dce(f)


def _fuse_concat_trees(st: FuncState) -> None:
    st.count("concats_fused", fuse_concat_trees(st.f))


def _unflatten_matmuls(st: FuncState) -> None:
    st.count("matmuls_unflattened", unflatten_matmuls(st.f))
    st.count("merged_matmuls_unflattened", unflatten_split_matmuls(st.f, st.cost_model))


def _lift_layout(st: FuncState) -> None:
    composed, lifted = lift_layout(st.f, st.cost_model)
    st.count("reshapes_composed", composed)
    st.count("layout_lifted", lifted)


def _move_row_chains(st: FuncState) -> None:
    st.count("row_chains_moved", move_row_chains(st.f, st.cost_model))


def _compose_layout_chains(st: FuncState) -> None:
    st.count("layout_chains", compose_layout_chains(st.f, st.cost_model))
    function_dce(st.f)  # (what the layout passes, and the cleanup before them, left unused)


FP = FunctionPass
#: taso-search's passes, in order: prepare, then the guarded segment (search and cleanup)
PREPARE = (
    FP("taso-fold-batchnorm", "Fold inference batchnorms into the convolutions before them (fold_batchnorm.py)",
       _fold_batchnorm, ("batchnorms_folded",)),
    FP("taso-fold-constants", "Fold the generic ops with constant results and the taso ops computing only "
       "from weights into new weights, then drop the identities that reveals (fold_generic.py, identities.py)",
       _fold_constants, ("generic_folded", "weights_folded", "identities_dropped")),
    FP("taso-raise-views", "Squeeze/Unsqueeze/Flatten with static shapes as taso.reshape "
       "(raise_generic.py)", _raise_views, ("views_raised",)),
    FP("taso-raise-gathers", "Gathers of every index of an axis as one taso.split (raise_generic.py)",
       _raise_gathers, ("gathers_raised",)),
    FP("taso-raise-divs", "A division by a power of two as a scalar multiply, bit-exact (fold_scale.py)",
       _raise_divs, ("divs_raised",)),
    FP("taso-fold-scales", "Scalar multiplies folded into the weights they reach (fold_scale.py)",
       _fold_scales, ("scales_folded",)),
    FP("taso-merge-repeats", "Merge equal folded weights (taso_folded_*) and repeated ops (cse.py)", _merge_repeats, ("weights_merged", "repeats_merged")),
    FP("taso-fuse-relu6", "Fuse ReLU6 (Clip 0, 6) into the convolutions before it (fuse_clip.py)",
       _fuse_relu6, ("relu6_fused",)),
    FP("taso-fold-matmul-bias", "Fold bias adds into the matmuls before them where the biased matmul costs no "
       "more under the cost model (matmul_bias.py)", _fold_matmul_bias, ("matmul_biases_fused",), needs_cost_model=True),
    FP("taso-dce", "Remove ops whose results are unused", _dce),
)
SEARCH = (
    FP("taso-flatten-matmuls", "Sibling matmuls of one [..., K] input on 2-D reshapes of it, so that 2-D "
       "rules apply (flatten_matmul.py)", _flatten_matmuls, ("matmuls_flattened",), group="search"),
    FP("taso-backtracking-search", "TASO's cost-based backtracking search with the verified rules, replayed "
       "on the IR as PDL patterns (search.py, pdl.py)", _backtracking_search, ("rewrites_applied",),
       needs_rules=True, group="search"),
)
CLEANUP = (
    FP("taso-fold-weights", "Fold the ops computing only from weights into new weights, drop identities, "
       "DCE", _fold_weights, ("weights_folded", "identities_dropped"), group="cleanup"),
    FP("taso-fuse-split-trees", "A split of a split's piece on the same axis becomes part of its parent",
       _fuse_split_trees, ("splits_fused",), group="cleanup"),
    FP("taso-lift-elementwise", "Elementwise ops over a split's pieces lifted over the split; weights "
       "permuted to align (lift_elementwise.py)", _lift_elementwise,
       ("elementwise_lifted", "weights_permuted", "weights_folded", "weights_merged"), needs_cost_model=True,
       group="cleanup"),
    FP("taso-fuse-concat-trees", "A concat of a concat on the same axis becomes one concat",
       _fuse_concat_trees, ("concats_fused",), group="cleanup"),
    FP("taso-unflatten-matmuls", "The flattened matmuls the search left alone (and merged ones, where it "
       "costs less) read their 3-D input again (flatten_matmul.py)", _unflatten_matmuls,
       ("matmuls_unflattened", "merged_matmuls_unflattened"), needs_cost_model=True, group="cleanup"),
    FP("taso-lift-layout", "Reshapes composed and layout ops lifted over splits (lift_layout.py)",
       _lift_layout, ("reshapes_composed", "layout_lifted"), needs_cost_model=True, group="cleanup"),
    FP("taso-move-row-chains", "Row reshapes and transposes moved across matmuls (layout_chains.py)",
       _move_row_chains, ("row_chains_moved",), needs_cost_model=True, group="cleanup"),
    FP("taso-compose-layout-chains", "A chain of reshapes and transposes made one transpose, then DCE "
       "(layout_chains.py)", _compose_layout_chains, ("layout_chains",), needs_cost_model=True,
       group="cleanup"),
)
#: every function pass (each registered on its own as well)
FUNCTION_PASSES = PREPARE + SEARCH + CLEANUP


def dump_pipeline(options: dict | None = None) -> str:
    """``taso-search`` as the passes it runs (what ``taso-opt --dump-pass-pipeline`` prints)."""
    options = options or {}
    head = " ".join(f"{k}={v}" for k, v in options.items())
    return "\n".join([
        "taso-search" + (f"{{{head}}}" if head else "") + " runs, on every function:",
        PL.pipeline_text([("prepare", PREPARE)], options),
        "  then, kept only where the function costs no more as written than before it (never worse):",
        PL.pipeline_text([("search", SEARCH), ("cleanup", CLEANUP)], options),
        "  (with cost-model=cpu, the whole result is then timed against the input: latency-check)",
    ])


def _run_function(f, rws, by_id, builder, sopts, replayer, opts) -> dict:
    """The taso-search pipeline on one function; its report is built from the passes' statistics."""
    name = ir.StringAttr(f.attributes["sym_name"]).value
    # the costs reported are those of the function as written, where every split costs its own: the
    # search charges nothing for a split of a split's piece on the same axis where nothing else uses
    # the piece, which fuse_split_trees makes part of its parent only where the pieces are at most 16
    written = T.Builder(builder.cost_model, split_trees=False)
    st = FuncState(f, builder=builder, written=written, rws=rws, by_id=by_id, replayer=replayer, sopts=sopts,
                   opts=opts)
    # the cost before is the input's, so the reduction reported includes the batchnorm folding
    g_in, _ = T.from_function(f, builder)
    cost_in = T.from_function(f, written)[0].cost

    def after_batchnorm(st):
        folded = st.stats["batchnorms_folded"]
        st.extra["cost_after_fold_ms"] = T.from_function(st.f, written)[0].cost if folded else cost_in
        st.extra["ops_after_fold"] = T.from_function(st.f, builder)[0].num_ops if folded else g_in.num_ops

    PL.run_passes(st, PREPARE, after={"taso-fold-batchnorm": after_batchnorm})
    # the guarded segment: kept, detached, for where its result costs more as written than the function
    # it started from (the search prices the flattened matmuls' reshapes, which the restoring takes away)
    before_search = st.f.clone()
    cost_pre = T.from_function(st.f, written)[0].cost
    kept_stats = Counter(st.stats)
    PL.run_passes(st, SEARCH + CLEANUP)
    f = st.f
    # the cost and op count of the function as written (split trees fused), which the search's cost
    # model predicts except where a split tree could not be fused (more than MAX_ARITY pieces)
    g_out, _ = T.from_function(f, written)
    replay_s = time.monotonic() - st.extra["replay_tick"]
    dropped, history = None, st.extra["history"]
    if g_out.cost > cost_pre * (1 + 1e-9):  # never worse than the segment's starting point
        dropped = {"cost_ms": g_out.cost, "ops": g_out.num_ops, "rewrites": len(history)}
        ir.InsertionPoint(f).insert(before_search)
        erase_op(f)
        f = st.f = before_search
        g_out, _ = T.from_function(f, written)
        history = []
        st.stats = kept_stats  # (the segment's statistics go with its result)
    stats = st.extra["search_stats"]
    fr = {
        "function": name,
        "ops_before": g_in.num_ops, "ops_after": g_out.num_ops,
        "cost_before_ms": cost_in, "cost_after_ms": g_out.cost, "cost_searched_ms": st.extra["cost_searched_ms"],
        "ops_after_fold": st.extra["ops_after_fold"], "cost_after_fold_ms": st.extra["cost_after_fold_ms"],
        "fold_batchnorm_s": round(st.times["taso-fold-batchnorm"], 3),
        "applied": dict(Counter(h[0] for h in history).most_common()),
        "rewrites_applied": len(history),
        "graphs_popped": stats.popped, "graphs_generated": stats.generated, "graphs_pruned": stats.pruned,
        "duplicates": stats.duplicates, "merge_pairs_queued": stats.lookahead,
        "merge_children_built": stats.lookahead_built,
        "windows": stats.windows, "windows_skipped": stats.windows_skipped, "timed_out": stats.timed_out,
        "rejected_sites": dict(stats.rejected.most_common(8)),
        "search_s": round(st.extra["search_s"], 3), "replay_s": round(replay_s, 3),
        "pass_s": {k: round(v, 3) for k, v in st.times.items()},
    }
    for p in FUNCTION_PASSES:  # the statistics every pass declares
        for k in p.statistics:
            if k != "rewrites_applied":
                fr[k] = st.stats[k]
    if dropped:
        fr["search_result_dropped"] = dropped
    return fr, f


#: what a function's report counts of the changes made to it (zero where the input is kept)
_CHANGE_COUNTS = ("batchnorms_folded", "relu6_fused", "weights_folded", "generic_folded", "views_raised", "gathers_raised", "divs_raised", "scales_folded", "repeats_merged", "identities_dropped", "splits_fused", "concats_fused",
                  "matmuls_flattened", "matmuls_unflattened", "merged_matmuls_unflattened", "matmul_biases_fused", "elementwise_lifted",
                  "weights_permuted", "weights_merged", "reshapes_composed", "layout_lifted", "layout_chains", "row_chains_moved")
#: of those, the ones that change nothing by themselves: matmuls flattened for the search, and restored
#: after it where no rewrite touched them
_RESTORED = ("matmuls_flattened", "matmuls_unflattened", "merged_matmuls_unflattened")


def _changed(fr: dict) -> bool:
    """The function differs from its input."""
    return bool(fr["rewrites_applied"] or any(fr[k] for k in _CHANGE_COUNTS if k not in _RESTORED))


def _run_checked(module_op, f, rws, by_id, builder, sopts, replayer, opts) -> dict:
    """``_run_function`` with the latency check of the measured cost model: the per-op costs the search
    adds up miss how onnxruntime lays data out between ops (a split forces its neighbours out of the
    blocked NCHWc layout), so the result is timed against the input, side by side in onnxruntime
    (``latency.compare``). Where it is slower beyond the noise (the upper quartile of the per-round
    speedups below 1), the function is searched again without the rewrites that introduce a split;
    where that is slower too, or cannot be timed, the input is kept as it was. Where the first result
    cannot be timed (onnxruntime refuses the model, the inputs cannot be made), it is kept and the
    report says why. The report says what was timed and kept."""
    from taso_mlir.dialect.errors import one_line
    from taso_mlir.dialect.onnx_export import export_onnx

    from . import latency as L

    backup = f.clone()  # detached
    fr, f = _run_function(f, rws, by_id, builder, sopts, replayer, opts)
    if not _changed(fr):
        fr["latency_check"] = {"kept": "search result", "why": "the function is unchanged"}
        return fr
    settings = L.Settings(threads=builder.cost_model.threads)
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

    def restore():
        g = backup.clone()
        ir.InsertionPoint(f).insert(g)
        erase_op(f)
        return g

    f = restore()
    no_splits = [rw for rw in rws if not S.introduces_split(rw)]
    fr2, f = _run_function(f, no_splits, by_id, builder, sopts, replayer, opts)
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
    f = restore()
    g_in = T.from_function(f, T.Builder(builder.cost_model, split_trees=False))[0]
    fr.update(ops_after=g_in.num_ops, cost_after_ms=g_in.cost, cost_searched_ms=g_in.cost, applied={},
              rewrites_applied=0)
    fr.pop("search_result_dropped", None)
    for k in _CHANGE_COUNTS:
        fr[k] = 0
    fr.update(ops_after_fold=fr["ops_before"], cost_after_fold_ms=fr["cost_before_ms"])
    check.update(kept="input", time_s=round(time.monotonic() - tick, 3))
    return fr


@ir_step
def replay(f: ir.Operation, best: T.TGraph, mops: list, replayer: P.Replayer, by_id: dict) -> None:
    """Apply the searched graph's rewrites (``best.history``) to the function ``f`` whose ops by node
    id are ``mops``, each with its PDL pattern at its site and in the operand order the search bound.

    The function mirrors the searched graph step by step: a rewrite removes exactly the ops the graph's
    rewrite removes (its matched ops: PDL erases those whose results it replaces, the others have no
    use left outside the match and are erased here), and an op the graph keeps stays, even where it
    is dead (the graph keeps dead nodes, and a later step may match one or share it as a target op).
    ``op_of`` holds the live ops only: an entry goes when its op is erased, so no handle to an erased
    op is ever read; a step that names a node without an entry is an internal error."""
    op_of = {n: op for n, op in enumerate(mops) if op is not None}
    steps = len(best.history)

    def live(n, i, rid, what):
        op = op_of.get(n)
        if op is None:
            raise internal_error(f"@{ir.StringAttr(f.attributes['sym_name']).value}: step {i + 1} of the replay "
                                 f"({rid}) names {what} node {n}, which an earlier step removed")
        check_live(op, f"{what} node {n} of step {i + 1} of the replay ({rid})")
        return op

    for i, (rid, matched, made, shared, variant) in enumerate(best.history):
        rw = by_id[rid]
        with H.step(f"replay of rewrite {i + 1} of {steps} ({rid})", f, specs=False):
            site = [live(n, i, rid, "matched") for n in matched]
            replaced = P.replaced_positions(rw)
            for n in matched:
                op_of.pop(n, None)
            created = replayer.apply(f, rw, site, variant)
            # (PDL erased the replaced ops: ``site`` is not read past this point but for the others,
            # whose results the match alone used; erased users first, in reverse rule order)
            for k in reversed(range(len(site))):
                if k not in replaced:
                    erase_op(site[k])
            del site
            for k, (nid, op) in enumerate(zip(made, created)):
                if k in shared:  # the search shared an op the function has: use it instead of the new copy
                    old = live(nid, i, rid, "shared")
                    if op.is_before_in_block(old):
                        old.move_before(op)  # its operands are the copy's, defined before the copy
                    for a, r in zip(op.results, old.results):
                        replace_uses(a, r)
                    erase_op(op)
                else:
                    op_of[nid] = op
    function_dce(f)


#: the name prefix of the weights the folding makes
FOLDED_PREFIX = "taso_folded_"


@ir_step
def fold_weights(f: ir.Operation) -> int:
    """Replace every taso op whose operands are all weights or constants by a weight holding its
    value (computed with the reference semantics). Returns the number of ops folded."""
    block = f.regions[0].blocks[0]
    names = weight_names(f)
    values: dict = {}  # ir.Value -> np.ndarray, for weight-like values
    ops = [o.operation for o in block.operations]
    folded = 0
    for op in ops:
        if not op.name.startswith("taso."):
            continue
        kind = op.name[5:]
        if kind == "weight":
            values[op.results[0]] = None  # read on demand
            continue
        if kind in specs.CONSTANTS:
            values[op.results[0]] = None
            continue
        if not len(op.operands) or any(v not in values for v in op.operands):
            continue
        ins = [_value(v, values) for v in op.operands]
        attrs = {k: v for k, v in taso_attrs(op).items()}
        outs = specs.evaluate(kind, ins, attrs, [tuple(ir.RankedTensorType(r.type).shape) for r in op.results])
        for r, arr in zip(op.results, outs):
            wname = fresh_name(FOLDED_PREFIX, names)
            with ir.InsertionPoint(op):
                w = new_weight(wname, arr, r.type, loc=op.location)
            replace_uses(r, w.results[0])
            values[w.results[0]] = None  # read back on demand, as the element type rounded it
        folded += 1
    return folded


@ir_step
def merge_duplicate_weights(f: ir.Operation) -> int:
    """Make each weight the folding created (``taso_folded_*``) that holds the same type and values as
    an earlier weight that weight: merges that concatenate the same kernels at several sites, or a
    weight permuted alike for several matmuls, would otherwise write one copy each into the model.
    Returns the number of weights merged (their ops are dead afterwards)."""
    import hashlib

    def folded(w):
        return ir.StringAttr(w.attributes["name"]).value.startswith(FOLDED_PREFIX)

    block = f.regions[0].blocks[0]
    weights = [o.operation for o in block.operations if o.operation.name == "taso.weight"]
    folded_types = {str(w.results[0].type) for w in weights if folded(w)}
    seen: dict = {}
    merged = 0
    for w in weights:
        t = str(w.results[0].type)
        if t not in folded_types:  # (no folded weight can equal it: its values are not read)
            continue
        arr = np.ascontiguousarray(dense_array(w.attributes["value"]))
        key = (t, hashlib.blake2b(arr.tobytes(), digest_size=16).digest())
        first = seen.setdefault(key, (w, arr))
        if first[0] is w or not folded(w) or not np.array_equal(first[1], arr):
            continue  # the first of its values, or one of the input's own weights (they stay as they are)
        replace_uses(w.results[0], first[0].results[0])
        merged += 1
    return merged


@ir_step
def fuse_concat_trees(f: ir.Operation) -> int:
    """Make each concat that is an operand of another concat on the same axis, and has no other use,
    part of it: one concat of all the pieces (at most ``specs.MAX_ARITY``), which reads and writes the
    outer concat's bytes in one launch instead of copying the inner pieces twice. TASO's concat takes
    two operands, so batching k tensors through rules leaves a chain of k - 1 concats (NasRNN's five
    steps' inputs). The search does not count on it: the report's cost after (the function as
    written) is where it shows. Returns the number of concats removed."""
    return _fuse_until_done(f, "taso.concat", _fuse_concat)


def _fuse_until_done(f: ir.Operation, name: str, fuse) -> int:
    """Call ``fuse(op)`` on the function's ops named ``name`` until none rewrites: ``fuse`` returns
    True after replacing ``op`` and its partner (both erased; the walk starts over, as the block
    changed). Returns the number of rewrites."""
    block = f.regions[0].blocks[0]
    fused = 0
    while True:
        for op in each_live(ops_of(block)):
            if op.name == name and fuse(op):
                fused += 1
                break
        else:
            return fused


def _fuse_concat(op: ir.Operation) -> bool:
    axis = taso_attrs(op)["axis"]
    pieces, inner = [], None
    for v in op.operands:
        o = v.owner
        p = o.operation if isinstance(o, ir.OpView) else None
        if (inner is None and p is not None and p.name == "taso.concat" and taso_attrs(p)["axis"] == axis
                and len(list(v.uses)) == 1):
            inner = p
            pieces.extend(p.operands)
        else:
            pieces.append(v)
    if inner is None or len(pieces) > specs.MAX_ARITY:
        return False
    with ir.InsertionPoint(op):
        new = create_taso_op("concat", pieces, [op.results[0].type], {"axis": axis}, loc=op.location)
    replace_uses(op.results[0], new.results[0])
    erase_op(op)
    erase_op(inner)
    return True


@ir_step
def fuse_split_trees(f: ir.Operation) -> int:
    """Make each split of a piece of another split on the same axis part of that split, where nothing
    else uses the piece: one split into the finer pieces (at most ``specs.MAX_ARITY``), which reads
    and writes the same bytes in one launch. TASO's rules split in two; a search that merges k
    matmuls or convolutions leaves a tree of k - 1 splits, and the search costs the tree as its root
    split (``tgraph.Builder.node``). Returns the number of splits removed."""
    return _fuse_until_done(f, "taso.split", _fuse_split)


def _fuse_split(op: ir.Operation) -> bool:
    piece = op.operands[0]
    if not isinstance(piece.owner, ir.OpView) or piece.owner.operation.name != "taso.split":
        return False
    parent = piece.owner.operation
    a_in, a_out = taso_attrs(parent), taso_attrs(op)
    if a_in["axis"] != a_out["axis"] or len(list(piece.uses)) != 1:
        return False
    k = ir.OpResult(piece).result_number
    if len(parent.results) - 1 + len(op.results) > specs.MAX_ARITY:
        return False
    sizes = list(a_in["sizes"][:k]) + list(a_out["sizes"]) + list(a_in["sizes"][k + 1:])
    olds = list(parent.results[:k]) + list(op.results) + list(parent.results[k + 1:])
    with ir.InsertionPoint(parent):
        new = create_taso_op("split", [parent.operands[0]], [r.type for r in olds],
                             {"axis": a_in["axis"], "sizes": sizes}, loc=parent.location)
    for old, r in zip(olds, new.results):
        replace_uses(old, r)
    erase_op(op)
    erase_op(parent)
    return True


def _np_dtype(et) -> np.dtype:
    s = str(et)
    return {"f32": np.float32, "f64": np.float64, "f16": np.float16}.get(s, np.float32)


def _value(v: ir.Value, values: dict) -> np.ndarray:
    arr = values.get(v)
    if arr is None:
        op = v.owner.operation if hasattr(v.owner, "operation") else v.owner
        et = ir.RankedTensorType(v.type).element_type
        if op.name == "taso.weight":
            arr = dense_array(op.attributes["value"])
        else:
            arr = specs.constant(op.name, tuple(ir.RankedTensorType(v.type).shape), _np_dtype(et))
        values[v] = arr
    return arr


def latency_check_text(lc: dict) -> str:
    """One line of what a function's latency check timed (speedups and quartiles) and kept."""
    timed = "; ".join(f"{t['what']} {t['speedup']:.3f}x (quartiles {t['iqr'][0]:.3f}-{t['iqr'][1]:.3f}, "
                      f"{t['rounds']} rounds)" for t in lc.get("tried", ()))
    return f"{timed or lc.get('why', '')}; kept: {lc['kept']}"


def format_report(rep: dict) -> str:
    L = [f"taso-search: cost model {rep['cost_model']}, {rep['rules']} rewrites (proved rules, both "
         f"usable directions), alpha {rep['options']['alpha']}, budget {rep['options']['budget']} per window"]
    for fr in rep["functions"]:
        before, after = fr["cost_before_ms"], fr["cost_after_ms"]
        red = 100.0 * (before - after) / before if before else 0.0
        L.append(f"  @{fr['function']}: cost {before:.4g} -> {after:.4g} ms ({red:.1f}% less), ops "
                 f"{fr['ops_before']} -> {fr['ops_after']}, {fr['rewrites_applied']} rewrites applied, "
                 f"{fr['graphs_popped']} graphs explored ({fr['graphs_generated']} generated, "
                 f"{fr['graphs_pruned']} not queued (cost >= alpha x best), {fr['duplicates']} duplicates, {fr.get('merge_pairs_queued', 0)} merge pairs queued by looking past {fr.get('merge_children_built', 0)} merges that do not pay) in {fr['windows']} window(s), search {fr['search_s']} s, "
                 f"PDL replay and folding {fr['replay_s']} s, {fr['weights_folded']} weight ops folded, "
                 f"{fr['splits_fused']} nested splits and {fr['concats_fused']} nested concats fused, "
                 f"{fr['identities_dropped']} identity ops (x + 0, x * 1) dropped, "
                 f"{fr.get('matmul_biases_fused', 0)} bias adds folded into matmuls, "
                 f"{fr.get('weights_merged', 0)} duplicate folded weights merged"
                 + (", TIMED OUT (best so far kept)" if fr["timed_out"] else ""))
        L.append(f"    batchnorm folding (before the search, included above): {fr['batchnorms_folded']} batchnorms "
                 f"folded into convolutions, cost {before:.4g} -> {fr['cost_after_fold_ms']:.4g} ms, ops "
                 f"{fr['ops_before']} -> {fr['ops_after_fold']}, {fr['fold_batchnorm_s']} s")
        if fr.get("elementwise_lifted"):
            L.append(f"    {fr['elementwise_lifted']} elementwise ops on split pieces lifted to one op on the whole "
                     f"tensor each group ({fr['weights_permuted']} weights' column blocks permuted to align pieces)")
        if fr.get("generic_folded"):
            L.append(f"    {fr['generic_folded']} generic ONNX ops with constant results (shapes of static tensors, "
                     f"ops on weights) folded into weights before the search")
        if fr.get("views_raised") or fr.get("gathers_raised"):
            L.append(f"    raised before the search: {fr.get('views_raised', 0)} Squeeze/Unsqueeze/Flatten to reshapes, "
                     f"{fr.get('gathers_raised', 0)} Gathers of every index of an axis to splits")
        if fr.get("relu6_fused"):
            L.append(f"    {fr['relu6_fused']} ReLU6 (Clip 0..6) fused into the convolutions before them")
        if fr.get("divs_raised") or fr.get("scales_folded"):
            L.append(f"    {fr.get('divs_raised', 0)} divisions by a power of two made scalar multiplies, "
                     f"{fr.get('scales_folded', 0)} scalar multiplies folded into the weights they scale before the search")
        if fr.get("repeats_merged"):
            L.append(f"    {fr['repeats_merged']} ops that repeat an earlier op (same operands and attributes) merged "
                     f"into it before the search")
        if fr.get("layout_lifted") or fr.get("reshapes_composed") or fr.get("layout_chains") \
                or fr.get("row_chains_moved"):
            L.append(f"    {fr.get('layout_lifted', 0)} reshapes and transposes of split pieces lifted to one op on "
                     f"the whole tensor each split, {fr.get('reshapes_composed', 0)} reshape chains composed, "
                     f"{fr.get('row_chains_moved', 0)} row reshapes/transposes moved across matmuls, "
                     f"{fr.get('layout_chains', 0)} reshape/transpose chains made one transpose")
        if fr.get("matmuls_flattened"):
            L.append(f"    {fr['matmuls_flattened']} matmuls of a shared input of rank 3 or more flattened to 2-D for "
                     f"the search ({fr['matmuls_unflattened']} it left alone restored after it, "
                     f"{fr.get('merged_matmuls_unflattened', 0)} merged ones made to read the input again)")
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
