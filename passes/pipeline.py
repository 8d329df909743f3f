"""Function passes, their statistics, and the pipelines made of them.

A *function pass* rewrites one ``func.func`` body. It declares the statistics it counts (each a key of
``taso-search``'s report, e.g. ``weights_folded``) and, where it needs them, a cost model or the rule
library. Every function pass is registered (``registry.REGISTRY``), so it runs alone from
``taso-opt --pass-pipeline='builtin.module(taso-fold-constants)'`` or from the Python API, and is a
named step of the IR debug mode (``dialect/handles.py``). This module imports no pass: the passes
import it, and ``registry.py`` imports them.

``taso-search`` (``passes/search/taso_search.py``) is a pipeline of them: the *prepare* passes, then a
*guarded segment* (the flattening, the search proper and the *cleanup* passes) whose result is kept
only where it costs no more as written than the function did when the segment began (``run_guarded``,
the never-worse guard; where it is dropped, so are the changes the segment counted). ``taso-opt
--dump-pass-pipeline`` prints it; ``taso-opt --mlir-pass-statistics`` prints the counters each pass declared
(``statistics_text``, after MLIR's ``--mlir-pass-statistics``). The report is built from the statistics:
a new pass declares its counters and needs no report code.

A pass declares two kinds of counter: ``statistics`` count changes to the IR (``neutral`` ones among them
change nothing by themselves, e.g. matmuls flattened for the search and restored after it), ``work``
counts what it did without changing the IR (graphs the search explored).
"""

from __future__ import annotations

import functools
import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from taso_mlir.dialect import progress
from taso_mlir.dialect.handles import step
from taso_mlir.dialect.mlir import ir


@dataclass
class FuncState:
    """What a function pass reads and changes: the function (a pass may replace it), the cost model's
    graph builders, the rules, and the statistics counted so far in this run."""

    f: ir.Operation
    builder: Any = None  # tgraph.Builder over the cost model (split trees priced as the search does)
    written: Any = None  # tgraph.Builder pricing the function as written (every split its own)
    rws: list = field(default_factory=list)  # the rule library's rewrites
    by_id: dict = field(default_factory=dict)
    replayer: Any = None
    sopts: Any = None  # search.Options
    opts: dict = field(default_factory=dict)  # the options of the pass or pipeline that runs
    stats: Counter = field(default_factory=Counter)  # statistic -> count, this run
    extra: dict = field(default_factory=dict)  # report values that are not counters
    times: dict = field(default_factory=dict)  # pass argument -> seconds
    current: str = ""  # the pass running
    pass_stats: dict = field(default_factory=dict)  # pass argument -> Counter of its statistics

    @property
    def cost_model(self):
        return self.builder.cost_model if self.builder is not None else None

    @property
    def name(self) -> str:
        return ir.StringAttr(self.f.attributes["sym_name"]).value

    def count(self, key: str, n) -> None:
        self.stats[key] += n
        self.pass_stats.setdefault(self.current, Counter())[key] += n


@dataclass(frozen=True, eq=False)
class FunctionPass:
    argument: str  # its name in pipelines, e.g. "taso-fold-constants"
    summary: str  # one line: what it does (its docstring in the module that implements it says why)
    run: Callable[[FuncState], None]
    statistics: dict = field(default_factory=dict)  # the counters of changes it declares: name -> what it counts
    needs_cost_model: bool = False
    needs_rules: bool = False
    group: str = "prepare"  # prepare | search | cleanup
    neutral: tuple[str, ...] = ()  # of ``statistics``, those that change nothing by themselves
    work: dict = field(default_factory=dict)  # counters of work that changes nothing (kept where the result is dropped)

    @property
    def counters(self) -> dict:
        """Every counter it declares, name -> what it counts."""
        return {**self.statistics, **self.work}

    @property
    def changes(self) -> tuple[str, ...]:
        """The statistics that count changes to the IR."""
        return tuple(k for k in self.statistics if k not in self.neutral)

    def option_names(self) -> tuple[str, ...]:
        """The options it takes, of ``taso-search``'s (``registry.search_options``)."""
        if self.needs_rules:
            return SEARCH_PASS_OPTIONS
        return ("target", "cost-model") if self.needs_cost_model else ()


_FROZEN = [0]  # searches running in this process with the heap frozen (``frozen_heap``)


#: the collector's thresholds while a search runs (``frozen_heap``): a young-generation pass after a
#: million net new objects (a suite model's search makes at most a few hundred thousand), older ones
#: after a thousand of those: in effect never
SEARCH_GC_THRESHOLDS = (1_000_000, 1000, 1000)


def frozen_heap(run: Callable) -> Callable:
    """``run`` (a search) with the objects alive as it starts (the rules, the caches, the MLIR module's
    Python objects) frozen out of the cyclic garbage collector's passes (``gc.freeze``), and the
    collector's thresholds raised (``SEARCH_GC_THRESHOLDS``), until it returns. A search makes a few
    hundred thousand small objects that live to its end (e-nodes, memo entries, graphs); at the default
    thresholds each was scanned again and again as it aged: SqueezeNet's eqsat search spent 0.1 s of
    0.7 s in full collections before the freeze, and 44 ms of its 0.3 s in collections after it (NasNet-A
    166 ms of 1.2 s). The searches make no reference cycles (recursive closures clear themselves when
    done; a test checks), so what they drop is freed at once by reference counting; a search that made
    cyclic garbage anyway holds at most the threshold's worth until a young pass."""

    @functools.wraps(run)
    def frozen(*args, **kwargs):
        if _FROZEN[0] or gc.get_freeze_count():  # (a search inside a search, or a host that froze its own)
            return run(*args, **kwargs)
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(*SEARCH_GC_THRESHOLDS)
        _FROZEN[0] += 1
        try:
            return run(*args, **kwargs)
        finally:
            _FROZEN[0] -= 1
            gc.set_threshold(*thresholds)
            gc.unfreeze()

    return frozen


#: the options of taso-search that the search run alone takes (not the report or the latency check)
SEARCH_PASS_OPTIONS = ("alpha", "budget", "timeout", "window", "target", "cost-model", "rules", "progress",
                       "eqsat-iterations", "eqsat-nodes", "eqsat-time", "eqsat-k-multi", "eqsat-ilp-time",
                       "eqsat-restarts", "eqsat-chains", "eqsat-step", "eqsat-matches", "eqsat-confirm-time",
                       "eqsat-ilp-stall")


def run_passes(st: FuncState, passes, after: Optional[dict] = None) -> None:
    """Run ``passes`` in order on ``st.f``, each a named step; ``after``: argument -> callback(st). Each
    pass is reported to ``progress`` (shown where a tool turned progress on)."""
    for p in passes:
        tick = time.monotonic()
        if progress.active():
            progress.update(f"@{st.name}: {p.argument}")
        st.current = p.argument
        for k in p.counters:  # (declared: shown, as zero, where the pass changed nothing)
            st.pass_stats.setdefault(p.argument, Counter())[k] += 0
        with step(p.argument, st.f):
            p.run(st)
        st.times[p.argument] = st.times.get(p.argument, 0.0) + time.monotonic() - tick
        if after and p.argument in after:
            after[p.argument](st)


def run_guarded(st: FuncState, passes, measure: Callable[[ir.Operation], tuple],
                keep_start: bool = False) -> Optional[dict]:
    """Run ``passes`` and keep their result only where it costs no more than the function they started
    from: ``measure(f) -> (cost, ops)``. Where it costs more, the function they started from is put
    back (``st.f`` is then that function) with the statistics as they were before ``passes``, but for
    their ``work`` counters, and the result's ``{"cost_ms", "ops"}`` is returned; else None. ``keep_start``:
    also keep the function and the statistics ``passes`` started from in ``st.extra`` (``segment_start``,
    detached; ``stats_before_segment``, ``pass_stats_before_segment``), to run another segment from there."""
    before = st.f.clone()  # detached
    cost0, _ = measure(st.f)
    kept = Counter(st.stats)
    kept_pass = {k: Counter(v) for k, v in st.pass_stats.items()}
    if keep_start:
        st.extra.update(segment_start=before.clone(), stats_before_segment=Counter(kept),
                        pass_stats_before_segment={k: Counter(v) for k, v in kept_pass.items()})
    run_passes(st, passes)
    cost1, ops1 = measure(st.f)
    if cost1 <= cost0 * (1 + 1e-9):
        return None
    from taso_mlir.dialect.handles import erase_op

    ir.InsertionPoint(st.f).insert(before)
    erase_op(st.f)
    st.f = before
    work = {k for p in passes for k in p.work}
    now = st.stats
    st.stats = Counter({k: (now[k] if k in work else kept[k]) for k in set(now) | set(kept)})
    for p in passes:
        mine = st.pass_stats.get(p.argument, Counter())
        old = kept_pass.get(p.argument, Counter())
        st.pass_stats[p.argument] = Counter({k: (v if k in p.work else old.get(k, 0)) for k, v in mine.items()})
    return {"cost_ms": cost1, "ops": ops1}


def pipeline_text(groups: list, options: dict | None = None) -> str:
    """Groups of passes as text, ``name: builtin.module(a, b{opt=v}, ...)`` one line per group; each pass
    shows the ``options`` it takes."""
    options = options or {}
    lines = []
    for name, passes in groups:
        args = []
        for p in passes:
            takes = set(p.option_names())
            mine = " ".join(f"{k}={v}" for k, v in options.items() if k in takes)
            args.append(p.argument + (f"{{{mine}}}" if mine else ""))
        lines.append(f"  {name}: builtin.module({', '.join(args)})")
    return "\n".join(lines)


#: the statistics of the passes run in this process since ``take_statistics`` last ran: pass -> Counter
_COLLECTED: dict = {}


def record_statistics(pass_stats: dict) -> None:
    """Add one function's statistics (pass argument -> counts) to what ``take_statistics`` returns."""
    for arg, counts in pass_stats.items():
        _COLLECTED.setdefault(arg, Counter()).update(counts)
        for k in counts:  # (a zero count is shown too)
            _COLLECTED[arg][k] += 0


def take_statistics() -> dict:
    """The statistics recorded since the last call (pass argument -> Counter), and forget them."""
    out = dict(_COLLECTED)
    _COLLECTED.clear()
    return out


def statistics_text(stats: dict, passes) -> str:
    """``stats`` (pass argument -> counts) as MLIR's ``--mlir-pass-statistics`` prints them: each pass
    that ran, then its counters with what they count (from the passes' declarations, ``passes``)."""
    what = {p.argument: p.counters for p in passes}
    bar = "===" + "-" * 73 + "==="
    lines = [bar, "... Pass statistics report ...".center(len(bar)).rstrip(), bar]
    for arg, counts in stats.items():
        lines.append(arg)
        for k, n in counts.items():
            lines.append(f"  ({k}) {n} - {what.get(arg, {}).get(k, k)}")
    return "\n".join(lines) + "\n"
