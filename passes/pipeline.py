"""Function passes, their statistics, and the pipelines made of them.

A *function pass* rewrites one ``func.func`` body. It declares the statistics it counts (each a key of
``taso-search``'s report, e.g. ``weights_folded``) and, where it needs them, a cost model or the rule
library. Every function pass is registered (``registry.REGISTRY``), so it runs alone from
``taso-opt --pass-pipeline='builtin.module(taso-fold-constants)'`` or from the Python API, and is a
named step of the IR debug mode (``dialect/handles.py``).

``taso-search`` (``passes/taso_search.py``) is a pipeline of them: the *prepare* passes, then a
*guarded segment* (the flattening, the search proper and the *cleanup* passes) whose result is kept
only where it costs no more as written than the function did when the segment began (the never-worse
guard; where it is dropped, so are the statistics the segment counted). ``taso-opt
--dump-pass-pipeline`` prints it. The report is built from the statistics: a new pass declares its
counters and needs no report code.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

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

    @property
    def cost_model(self):
        return self.builder.cost_model if self.builder is not None else None

    @property
    def name(self) -> str:
        return ir.StringAttr(self.f.attributes["sym_name"]).value

    def count(self, key: str, n) -> None:
        self.stats[key] += n


@dataclass(frozen=True)
class FunctionPass:
    argument: str  # its name in pipelines, e.g. "taso-fold-constants"
    summary: str  # one line: what it does (its docstring in the module that implements it says why)
    run: Callable[[FuncState], None]
    statistics: tuple[str, ...] = ()  # the counters it declares
    needs_cost_model: bool = False
    needs_rules: bool = False
    group: str = "prepare"  # prepare | search | cleanup

    def pass_info(self):
        """This pass as a registered pass of its own (on every function of the module)."""
        from .registry import PassInfo, PassOption, search_options

        options = ()
        if self.needs_rules:
            options = tuple(o for o in search_options() if o.name not in ("report", "latency-check"))
        elif self.needs_cost_model:
            options = tuple(o for o in search_options() if o.name == "cost-model")
        return PassInfo(self.argument, self.summary, lambda op, opts: run_alone(self, op, opts), options)


def run_passes(st: FuncState, passes, after: Optional[dict] = None) -> None:
    """Run ``passes`` in order on ``st.f``, each a named step; ``after``: argument -> callback(st)."""
    for p in passes:
        tick = time.monotonic()
        with step(p.argument, st.f):
            p.run(st)
        st.times[p.argument] = st.times.get(p.argument, 0.0) + time.monotonic() - tick
        if after and p.argument in after:
            after[p.argument](st)


def run_alone(p: FunctionPass, module_op: ir.Operation, opts: dict) -> None:
    """Run one function pass on every function of the module (``taso-opt`` / the Python API)."""
    from taso_mlir.dialect.ops import function_bodies

    from . import tgraph as T
    from .cost import get_cost_model

    with module_op.context, ir.Location.unknown(module_op.context):
        cm = get_cost_model(opts.get("cost-model", "analytic")) if (p.needs_cost_model or p.needs_rules) else None
        try:
            for f in function_bodies(module_op):
                st = FuncState(f, opts=opts)
                if cm is not None:
                    st.builder = T.Builder(cm)
                    st.written = T.Builder(cm, split_trees=False)
                if p.needs_rules:
                    from . import pdl as P
                    from . import search as S
                    from .taso_search import rewrites

                    st.rws = rewrites(opts.get("rules") or None)
                    st.by_id = {rw.id: rw for rw in st.rws}
                    st.replayer = P.Replayer(st.rws)
                    st.sopts = S.Options(alpha=opts.get("alpha", 1.05), budget=opts.get("budget", 100),
                                         timeout=opts.get("timeout", 30.0), window=opts.get("window", 120))
                p.run(st)
        finally:
            if cm is not None:
                cm.close()


def pipeline_text(groups: list, options: dict | None = None) -> str:
    """Groups of passes as text, ``name: builtin.module(a, b{opt=v}, ...)`` one line per group; each pass
    shows the ``options`` it takes."""
    options = options or {}
    lines = []
    for name, passes in groups:
        args = []
        for p in passes:
            takes = {o.name for o in p.pass_info().options}
            mine = " ".join(f"{k}={v}" for k, v in options.items() if k in takes)
            args.append(p.argument + (f"{{{mine}}}" if mine else ""))
        lines.append(f"  {name}: builtin.module({', '.join(args)})")
    return "\n".join(lines)
