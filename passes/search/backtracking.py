"""TASO's cost-based backtracking search over the in-memory graph (``tgraph``).

A priority queue of graphs ordered by cost, seeded with the input graph. Pop the cheapest; for every
rewrite and every site where its check passes, the rewritten graph is kept if its op count is at
most ``max_growth`` x the original's and its key is new, and queued if its cost is below ``alpha`` x
the best cost so far. Stop after ``budget`` pops (per window) or at the deadline, with the best
graph so far.

One extension of TASO's loop: a child made by a merge (a rewrite whose target has a split) that costs
no less than its parent, where a further sibling of the merged ops exists, is built at once and the
merges of the op it created are costed; each pair of merges cheaper than the parent is queued as
such (``_merge_on``). TASO's rules merge two ops at a time, so merging three siblings (a
transformer's query, key and value projections) can start with a step that does not pay, which the
queue would reach only after every neutral rewrite of the window.

What makes it fast (the graphs popped are the same as doing the above literally, up to the last
bits of a cost; the sites of one rewrite are visited in the order of their op ids):

- a child is queued by its cost alone, computed without building it (``T.rewrite_cost``); the part
  of the site check that reads the rest of the graph, the rewritten graph and its key are computed
  when it is popped, and a popped child that fails the check or was popped before is dropped
  (``_search_window`` says why this pops the same graphs);
- a popped graph's sites are its parent's, less those the rewrite touched, plus the matches around
  the ops the rewrite created or rewired (``T.child_sites``); only a window's first graph is
  matched in full.

Big graphs are searched in windows (MetaFlow's graph split): overlapping ranges of consecutive ops
in the function's order. A window's search sees only its ops (and the ops earlier windows created),
so the time grows about linearly with the number of ops. Opaque ops (not ``taso``) are never
matched, so they split the graph into regions that are optimized independently.

The search is deterministic: the same input, rules and options give the same graph, unless the
timeout stops it (the report says so).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from taso_mlir.passes.search import rulebook as RB
from taso_mlir.passes.search import tgraph as T


@dataclass
class Options:
    alpha: float = 1.05
    budget: int = 100  # graphs popped per window
    timeout: float = 30.0  # seconds for the whole search
    window: int = 120  # ops per window
    max_growth: float = 2.0


@dataclass
class Stats:
    windows: int = 0
    windows_skipped: int = 0
    popped: int = 0
    generated: int = 0  # children costed (sites that passed the local check, within the op limit)
    pruned: int = 0  # of those, not queued: cost >= alpha x best
    duplicates: int = 0  # children popped whose graph was popped before
    lookahead: int = 0  # pairs of merges queued by looking one merge past a merge that does not pay
    lookahead_built: int = 0  # children built for that look (each matched around its rewrite)
    #: reason -> sites rejected (by the local check: once, when the site is found; by the rest of
    #: the check: when the child is popped; by the op count: each time)
    rejected: Counter = field(default_factory=Counter)
    timed_out: bool = False
    time_s: float = 0.0


def search(g0: T.TGraph, rewrites: list, builder: T.Builder, opts: Options,
           progress: Optional[Callable[[int, int, float], None]] = None) -> tuple[T.TGraph, Stats]:
    stats = Stats()
    t0 = time.monotonic()
    deadline = t0 + opts.timeout
    first_new = g0.next_id
    op_ids = [nid for nid, n in g0.nodes.items() if n.is_taso]
    limit = int(opts.max_growth * g0.num_ops)
    step = max(1, opts.window // 2)
    starts = list(range(0, max(1, len(op_ids) - opts.window + step), step)) if len(op_ids) > opts.window else [0]
    best = g0
    # where a rewritten graph's new sites can be anchored; how far a match reaches from one op
    table = T.AnchorTable(rewrites)
    radius = max((len(rw.src.ops) - 1 for rw in rewrites), default=0)
    for wi, s in enumerate(starts):
        if time.monotonic() >= deadline:
            stats.timed_out = True
            stats.windows_skipped = len(starts) - wi
            break
        ids = op_ids[s:s + opts.window]
        lo, hi = (ids[0], ids[-1]) if ids else (0, -1)

        def eligible(nid, lo=lo, hi=hi):
            return lo <= nid <= hi or nid >= first_new

        best = _search_window(best, rewrites, builder, opts, eligible, limit, deadline, stats, table, radius)
        stats.windows += 1
        if progress:
            progress(wi + 1, len(starts), best.cost)
    stats.time_s = time.monotonic() - t0
    return best, stats


def _search_window(g0, rewrites, builder, opts, eligible, limit, deadline, stats, table, radius) -> T.TGraph:
    """One window's search.

    A child is known by its cost alone until it is popped (``T.rewrite_cost``): the queue holds
    (cost, seq, parent, rewrite index, ops, binding), and the rest of the site check, the rewrite
    and the key are computed when it is popped. A popped child that fails the check or whose key
    was seen is dropped without counting against the budget. This pops the same graphs in the
    same order as checking, building and deduplicating every child when it is generated (the
    first instance of a graph has the lowest seq; a child costing alpha x best or more is never
    queued either way, as best only falls), but builds only the graphs it pops; the one
    difference: a graph reached along two paths may get costs that differ in the last bits, and
    then the cheaper instance is popped first. A child that would be a new best is checked when
    it is generated.

    A popped graph's sites are its parent's, updated for the one rewrite between them
    (``T.child_sites``); the window's first graph is matched in full."""
    best_cost = g0.cost
    best = g0  # a graph, or the queue entry of the best child
    merges = [introduces_split(rw) for rw in rewrites]
    looked: set = set()  # keys of the children built to look past a merge (at most budget / 2)
    seen = {g0.key}  # keys of the graphs popped
    heap = [(g0.cost, 0, None, -1, (), None)]
    seq = 1
    pops = 0
    sites_of: dict = {}  # popped graph -> its sites in this window
    while heap and pops < opts.budget:
        if time.monotonic() >= deadline:
            stats.timed_out = True
            break
        entry = heapq.heappop(heap)
        _cost, _seq, p, ri, ops, b = entry
        if p is None:
            g = g0
        else:
            rw = rewrites[ri]
            why = T.check_global(rw, p, ops, b)
            if why is not None:
                stats.rejected[why.split(":")[0]] += 1
                continue
            child = T.rewrite(rw, p, ops, b, builder)
            if child.key in seen:
                stats.duplicates += 1
                continue
            seen.add(child.key)
            g = child.graph()
        pops += 1
        stats.popped += 1
        index = T.Index(g, eligible)
        parent_sites = sites_of.get(g.parent) if g.parent is not None else None
        if parent_sites is None:
            sites = T.all_sites(rewrites, g, index, stats.rejected)
        else:
            sites = T.child_sites(rewrites, table, radius, g, parent_sites, index, stats.rejected)
        sites_of[g] = sites
        for st in sites:
            ri, ops, _bkey, b, _costs = st
            rw = rewrites[ri]
            cost = _site_cost(rewrites, g, st, builder, limit, stats)
            if cost is None:
                continue
            stats.generated += 1
            entry = (cost, seq, g, ri, ops, b)
            if cost < best_cost - 1e-12:
                why = T.check_global(rw, g, ops, b)
                if why is not None:
                    stats.rejected[why.split(":")[0]] += 1
                    continue
                best, best_cost = entry, cost
            if cost < opts.alpha * best_cost:
                heapq.heappush(heap, entry)
                seq += 1
            else:
                stats.pruned += 1
                continue
            if merges[ri] and cost >= g.cost - 1e-12:
                # a merge that does not pay by itself (two of three siblings): look one merge further
                for entry2 in _merge_on(rewrites, merges, g, sites, st, builder, eligible, limit, stats, table,
                                        radius, sites_of, looked, max(1, opts.budget // 2), deadline):
                    cost2 = entry2[0]
                    stats.generated += 1
                    if cost2 >= opts.alpha * best_cost:  # best may have fallen since g was queued
                        stats.pruned += 1
                        continue
                    entry2 = (cost2, seq) + entry2[2:]
                    if cost2 < best_cost - 1e-12:
                        best, best_cost = entry2, cost2
                    heapq.heappush(heap, entry2)
                    seq += 1
                    stats.lookahead += 1
    if isinstance(best, T.TGraph):
        return best
    _cost, _seq, p, ri, ops, b = best
    return T.rewrite(rewrites[ri], p, ops, b, builder).graph()


def introduces_split(rw: RB.Rewrite) -> bool:
    """The rewrite's target splits a computed tensor: a merge of sibling ops, whose gain depends on
    the data layouts around the split (which per-op costs do not see) and, merging two at a time, on
    the next merge (``_merge_on``)."""
    return any(op.name == "split" for op in rw.dst.ops)


def _site_cost(rewrites, g, st, builder, limit, stats) -> Optional[float]:
    """The cost of rewriting ``g`` at the site ``st`` (its target costs computed once, kept in it), or
    None where the child would have more ops than ``limit``."""
    ri, ops, _bkey, b, costs = st
    rw = rewrites[ri]
    if g.num_ops - len(ops) + len(rw.dst.ops) > limit:
        stats.rejected["op count over the limit"] += 1
        return None
    if costs == 0:
        costs = st[4] = T.target_info(rw, g, ops, b, builder)
    costs = T.info_costs(rw, g, ops, b, costs, builder)
    if costs is None:  # the rewrite changes other ops' costs: build it to know its cost
        # (``rewrite`` needs the site's global check, which the other sites get only when they are
        # popped or become the best: a result of a matched op used outside the match is no output of
        # the rewrite, and rewiring that user would read a removed node)
        why = T.check_global(rw, g, ops, b)
        if why is not None:
            stats.rejected[why.split(":")[0]] += 1
            return None
        return T.rewrite(rw, g, ops, b, builder).cost
    return T.rewrite_cost(g, ops, costs)


def _merge_on(rewrites, merges, g, sites, st, builder, eligible, limit, stats, table, radius, sites_of, looked,
              cap, deadline) -> list:
    """Merges of the op a merge at ``st`` created with a further sibling that make the two together
    cheaper than ``g``: queue entries (cost, None, child, rewrite index, ops, binding) on the built
    child, whose sites are recorded in ``sites_of``.

    TASO's rules merge two ops at a time, so merging k > 2 siblings (a transformer's query, key and
    value projections) starts with a merge of two that can cost more than it saves: the split it adds
    is paid at once, the savings come with the next merge, which the split tree makes free. Queued
    by cost, that first step waits behind every neutral rewrite of the window, which a small budget
    never gets through. So a merge that does not pay is followed at once by the merges of the op it
    created, and a pair that pays is queued as the two rewrites it is; the child in between is
    queued as usual too (not past the deadline). Each child is looked past once (``looked``: the
    window's, keyed by graph), and at most ``cap`` children a window: with many siblings whose
    merges never pay (an RNN's gate projections under onnxruntime's measured costs) the look would
    otherwise cost more than the search."""
    ri, ops, _bkey, b, _costs = st
    rw = rewrites[ri]
    if len(looked) >= cap or time.monotonic() >= deadline or not _more_siblings(g, ops) \
            or T.check_global(rw, g, ops, b) is not None:
        return []
    c = T.rewrite(rw, g, ops, b, builder)
    if c.key in looked:
        return []
    looked.add(c.key)
    child = c.graph()
    stats.lookahead_built += 1
    fresh = {nid for nid, n in child.changes.items() if n is not None and nid >= g.next_id}
    index = T.Index(child, eligible)
    sites2 = T.child_sites(rewrites, table, radius, child, sites, index, stats.rejected)
    out = []
    for st2 in sites2:
        ri2, ops2, _bkey2, b2, _ = st2
        if not merges[ri2] or fresh.isdisjoint(ops2):
            continue
        cost2 = _site_cost(rewrites, child, st2, builder, limit, stats)
        if cost2 is None or cost2 >= g.cost - 1e-12:
            continue
        why = T.check_global(rewrites[ri2], child, ops2, b2)
        if why is not None:
            stats.rejected[why.split(":")[0]] += 1
            continue
        out.append((cost2, None, child, ri2, ops2, b2))
    if out:
        sites_of[child] = sites2
    return out


def _more_siblings(g: T.TGraph, ops) -> bool:
    """Some value that two of the matched ops read has a further user of their kind outside the match
    (a third sibling the merged op could merge with next)."""
    nodes, uses = g.nodes, g.uses()
    matched = set(ops)
    kinds = {nodes[o].kind for o in ops}
    readers: dict = {}
    for o in ops:
        for v in set(nodes[o].operands):
            readers[v] = readers.get(v, 0) + 1
    return any(n >= 2 and any(u is not None and u not in matched and nodes[u].kind in kinds for u in uses.get(v, ()))
               for v, n in readers.items())


def applied_counts(g: T.TGraph) -> Counter:
    return Counter(h[0] for h in g.history)


def usable_rewrites(rewrites: list) -> list:
    return [rw for rw in rewrites if not rw.why_not_emitted]


__all__ = ["Options", "Stats", "search", "introduces_split", "applied_counts", "usable_rewrites", "RB"]
