"""``taso-backtracking-search``: TASO's cost-based backtracking search, replayed on the IR as PDL.

The function becomes an in-memory graph (``tgraph.from_function``); ``backtracking.search`` explores the
graphs the verified rules reach from it (a priority queue by cost, graphs costing more than alpha x the
best dropped, window by window on big graphs) and returns the cheapest with the rewrites that lead to
it. ``replay`` then applies those rewrites to the function, each with its PDL pattern (``pdl.py``) at
the site the search chose, and the function's graph must then have exactly the structure the search
scored (an internal error otherwise). Every rewrite is one of the proved rules.
"""

from __future__ import annotations

import time

from taso_mlir.dialect import handles as H
from taso_mlir.dialect import progress
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import check_live, erase_op, internal_error, ir_step, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import function_dce
from taso_mlir.passes.pipeline import FuncState, FunctionPass, frozen_heap
from taso_mlir.passes.search import backtracking as S
from taso_mlir.passes.search import pdl as P
from taso_mlir.passes.search import tgraph as T


@frozen_heap
def _run(st: FuncState) -> None:
    """TASO's search on the function's graph, then the replay of the best graph's rewrites on the IR
    with the PDL patterns at the chosen sites, checked to give exactly the graph the search scored."""
    f, name = st.f, st.name
    # the graph the search starts from, and the function's ops by node id, as the function is now (no op
    # handle from before the passes that ran is kept)
    g0, mops = T.from_function(f, st.builder)
    tick = time.monotonic()

    def windows(i, n, cost):
        progress.update(f"@{name}: search window {i}/{n}, cost {cost:.4g} ms")

    # (shown where taso-opt turned progress on, or where the pass's own progress option asks for it)
    with progress.shown_if(bool(st.opts.get("progress"))):
        best, stats = S.search(g0, st.rws, st.builder, st.sopts, windows if progress.active() else None)
    st.extra["search_s"] = time.monotonic() - tick
    st.extra["replay_tick"] = time.monotonic()
    replay(f, best, mops, st.replayer, st.by_id)
    if best.history:
        g_ir, _ = T.from_function(f, st.builder)
        if T.structure(g_ir) != T.structure(best):
            raise TasoError(f"internal error: @{name}: the IR after the PDL rewrites differs from the graph "
                            "the search chose")
    st.extra.update(history=best.history, cost_searched_ms=best.cost, timed_out=stats.timed_out,
                    rejected_sites=dict(stats.rejected.most_common(8)))
    st.count("rewrites_applied", len(best.history))
    for key, n in (("graphs_popped", stats.popped), ("graphs_generated", stats.generated),
                   ("graphs_pruned", stats.pruned), ("duplicates", stats.duplicates),
                   ("merge_pairs_queued", stats.lookahead), ("merge_children_built", stats.lookahead_built),
                   ("windows", stats.windows), ("windows_skipped", stats.windows_skipped)):
        st.count(key, n)


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


PASS = FunctionPass("taso-backtracking-search", "TASO's cost-based backtracking search with the verified rules, "
                    "replayed on the IR as PDL patterns", _run, {"rewrites_applied": "rewrites applied"}, needs_rules=True,
                    group="search",
                    work={"graphs_popped": "graphs explored", "graphs_generated": "graphs generated", "graphs_pruned": "graphs not queued (cost >= alpha x best)", "duplicates": "duplicate graphs", "merge_pairs_queued": "merge pairs queued by looking past a merge that does not pay", "merge_children_built": "children built for that look", "windows": "search windows", "windows_skipped": "search windows skipped"})
