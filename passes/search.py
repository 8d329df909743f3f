"""TASO's cost-based backtracking search over the in-memory graph (``tgraph``).

A priority queue of graphs ordered by cost, seeded with the input graph. Pop the cheapest; for every
rewrite and every site where its check passes, build the rewritten graph; keep it if its op count is
at most ``max_growth`` x the original's and its key is new, and queue it if its cost is below
``alpha`` x the best cost so far. Stop after ``budget`` pops (per window) or at the deadline, with
the best graph so far.

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

from . import rulebook as RB
from . import tgraph as T


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
    generated: int = 0
    duplicates: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> count
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
    for wi, s in enumerate(starts):
        if time.monotonic() >= deadline:
            stats.timed_out = True
            stats.windows_skipped = len(starts) - wi
            break
        ids = op_ids[s:s + opts.window]
        lo, hi = (ids[0], ids[-1]) if ids else (0, -1)

        def eligible(nid, lo=lo, hi=hi):
            return lo <= nid <= hi or nid >= first_new

        best = _search_window(best, rewrites, builder, opts, eligible, limit, deadline, stats)
        stats.windows += 1
        if progress:
            progress(wi + 1, len(starts), best.cost)
    stats.time_s = time.monotonic() - t0
    return best, stats


def _search_window(g0, rewrites, builder, opts, eligible, limit, deadline, stats) -> T.TGraph:
    best = g0
    seen = {g0.key}
    heap = [(g0.cost, 0, g0)]
    seq = 1
    pops = 0
    while heap and pops < opts.budget:
        if time.monotonic() >= deadline:
            stats.timed_out = True
            break
        cost, _, g = heapq.heappop(heap)
        pops += 1
        stats.popped += 1
        index = T.Index(g, eligible)
        present = set(index.by_kind)
        for rw in rewrites:
            if not rw.kinds <= present:
                continue
            for ops, b in T.matches(rw, g, index):
                why = T.check(rw, g, ops, b)
                if why is not None:
                    stats.rejected[why.split(":")[0]] += 1
                    continue
                ng = T.apply(rw, g, ops, b, builder)
                stats.generated += 1
                if ng.num_ops > limit:
                    stats.rejected["op count over the limit"] += 1
                    continue
                if ng.key in seen:
                    stats.duplicates += 1
                    continue
                seen.add(ng.key)
                if ng.cost < best.cost - 1e-12:
                    best = ng
                if ng.cost < opts.alpha * best.cost:
                    heapq.heappush(heap, (ng.cost, seq, ng))
                    seq += 1
    return best


def applied_counts(g: T.TGraph) -> Counter:
    return Counter(h[0] for h in g.history)


def usable_rewrites(rewrites: list) -> list:
    return [rw for rw in rewrites if not rw.why_not_emitted]


__all__ = ["Options", "Stats", "search", "applied_counts", "usable_rewrites", "RB"]
