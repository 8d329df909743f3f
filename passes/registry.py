"""Our passes, their options, and pipelines that mix them with upstream MLIR passes.

MLIR's textual pipeline parser does not know Python passes, so ``build_pass_manager`` splits a
``builtin.module(...)`` pipeline itself: upstream elements go to ``PassManager.add(str)``, ours are
added as Python passes (``PassManager.add(callable)``) in order. Options use MLIR's syntax,
``name{key=value key2=value2}``.

Embedding in another compiler's pipeline::

    from taso_mlir.passes import add_taso_pass
    pm = PassManager.parse("builtin.module(canonicalize)")
    add_taso_pass(pm, "convert-onnx-to-taso", opset=17)
    pm.run(module.operation)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from taso_mlir.dialect.errors import TasoError, one_line
from taso_mlir.dialect.mlir import ir, passmanager
from taso_mlir.passes.pipeline import SEARCH_PASS_OPTIONS, FuncState, FunctionPass, record_statistics


@dataclass(frozen=True)
class PassOption:
    name: str
    type: type
    default: Any
    help: str
    #: (predicate, what it requires) for values the type alone does not rule out
    valid: Optional[tuple[Callable[[Any], bool], str]] = None


@dataclass(frozen=True)
class PassInfo:
    argument: str
    summary: str
    run: Callable[[ir.Operation, dict], None]  # (module op, options) -> None; raises TasoError
    options: tuple[PassOption, ...] = ()

    def parse_options(self, given: dict[str, str]) -> dict:
        out = {o.name: o.default for o in self.options}
        known = {o.name: o for o in self.options}
        for k, v in given.items():
            if k not in known:
                names = ", ".join(known) or "none"
                raise TasoError(f"pass '{self.argument}' has no option '{k}' (options: {names})")
            out[k] = _coerce(self.argument, known[k], v)
            if known[k].valid and not known[k].valid[0](out[k]):
                raise TasoError(f"pass '{self.argument}': option '{k}' must be {known[k].valid[1]}, got '{v}'")
        return out


def _coerce(pass_name: str, opt: PassOption, v: Any) -> Any:
    if not isinstance(v, str):
        return opt.type(v)
    try:
        if opt.type is bool:
            if v.lower() in ("1", "true", "on", "yes"):
                return True
            if v.lower() in ("0", "false", "off", "no"):
                return False
            raise ValueError(v)
        return opt.type(v)
    except ValueError:
        raise TasoError(f"pass '{pass_name}': option '{opt.name}' expects {opt.type.__name__}, got '{v}'") from None


REGISTRY: dict[str, PassInfo] = {}


def register(info: PassInfo) -> PassInfo:
    REGISTRY[info.argument] = info
    return info


# ---------------------------------------------------------------------------------------------
# the passes


def _run_convert(op: ir.Operation, opts: dict) -> None:
    from taso_mlir.dialect.convert_onnx_to_taso import convert_module

    convert_module(op, default_opset=opts["opset"])


def _run_verify(op: ir.Operation, opts: dict) -> None:
    from taso_mlir.dialect.ops import verify_module

    verify_module(op)


register(PassInfo(
    "convert-onnx-to-taso",
    "Convert ONNX operations (torch-mlir importer or onnx-mlir generic form) into the taso dialect; "
    "operators outside TASO's set stay generic onnx.<Op> operations",
    _run_convert,
    (PassOption("opset", int, 17, "default-domain opset when the input does not record one",
                (lambda v: 1 <= v < 2**31, "an ONNX opset version (1 or more)")),),
))
register(PassInfo(
    "taso-verify",
    "Check every taso op against its operator spec (attributes, static shapes, result shapes)",
    _run_verify,
))
def _run_search(op: ir.Operation, opts: dict) -> None:
    from taso_mlir.passes.search.taso_search import run

    run(op, opts)


_TARGETS = "auto, cpu[:<threads>], cuda, cuda:<gpu> or analytic[:<device>]"


def _target_name(v: str) -> bool:
    return v in ("", "auto", "analytic", "cpu") or v.split(":")[0] in ("analytic", "cpu", "cuda")


def search_options() -> tuple:
    """The options of ``taso-search`` (the pipeline) and, less the report and the latency check, of the
    search proper run alone (``taso-backtracking-search``)."""
    return (
        PassOption("alpha", float, 1.05, "queue graphs costing less than alpha x the best (1: greedy)",
            (lambda v: 1.0 <= v <= 10.0, "between 1 and 10")),
        PassOption("budget", int, 100, "graphs popped from the queue per window",
            (lambda v: 0 <= v <= 10**7, "between 0 and 10000000")),
        PassOption("timeout", float, 30.0, "seconds for the whole search (the best graph so far is kept)",
            (lambda v: v > 0, "positive")),
        PassOption("window", int, 120, "ops per search window (big graphs are searched window by window)",
            (lambda v: v >= 4, "at least 4")),
        PassOption("target", str, "",
            "what to optimize for: auto (the machine this runs on, measured: the CPU in onnxruntime), cpu, "
            "cpu:<threads>, cuda (per-op times measured on this process's GPU, cached per device), cuda:<gpu> "
            "(per-op times measured on that GPU, from a shipped table, where one has been measured), or an "
            "analytic profile analytic[:cpu|v100|t4|a100|h100|h200] (an estimate; analytic = "
            "analytic:t4; a GPU's profile is fitted to its measured table where one is shipped, "
            "analytic:<gpu>:datasheet the hand-set one); unnamed: the TASO_TARGET environment variable, else auto", (_target_name, _TARGETS)),
        PassOption("cost-model", str, "", "the older name of target", (_target_name, _TARGETS)),
        PassOption("rules", str, "", "rules file(s), comma-separated, used instead of the shipped libraries "
            "(default: rules.jsonl, rules-n4.jsonl, rules-conv-bias.jsonl and rules-matmul-bias.jsonl)"),
        PassOption("latency-check", bool, True,
            "cost-model=cpu: time the result against the input in onnxruntime; where it is slower beyond "
            "the noise, search again without the rewrites that introduce a split, else keep the input"),
        PassOption("report", str, "", "write a report: '-' for stderr, a file (.json for JSON)"),
        PassOption("progress", bool, False, "show progress on stderr"),
        PassOption("strategy", str, "backtracking",
            "backtracking (TASO's search), eqsat (equality saturation and an integer program's extraction, "
            "TENSAT's), or best (both; the cheaper result)",
            (lambda v: v in ("backtracking", "eqsat", "best"), "backtracking, eqsat or best")),
        PassOption("eqsat-iterations", int, 4, "eqsat: saturation rounds at most",
            (lambda v: 1 <= v <= 100, "between 1 and 100")),
        PassOption("eqsat-step", int, 1, "eqsat: saturation rounds of each restart's e-graph while the cost drops; "
            "a restart that finds nothing cheaper is saturated on to eqsat-iterations before the search stops "
            "(eqsat-iterations or more: every e-graph to eqsat-iterations)",
            (lambda v: 1 <= v <= 100, "between 1 and 100")),
        PassOption("eqsat-nodes", int, 20000, "eqsat: e-nodes at most (saturation stops there)",
            (lambda v: v >= 10, "at least 10")),
        PassOption("eqsat-time", float, 60.0, "eqsat: seconds for saturation and restarts (an extraction "
            "begun within them may take eqsat-ilp-time more)",
            (lambda v: v > 0, "positive")),
        PassOption("eqsat-matches", int, 300000, "eqsat: rule matches found in all saturations and restarts at "
            "most (a deterministic work budget: saturation stops after the round that reaches it, and no restart "
            "follows)", (lambda v: v >= 1, "at least 1")),
        PassOption("eqsat-k-multi", int, 1, "eqsat: rounds in which rewrites of several outputs (merges) match",
            (lambda v: 0 <= v <= 100, "between 0 and 100")),
        PassOption("eqsat-ilp-time", float, 30.0, "eqsat: seconds for each extraction's integer program (a restart's: "
            "at most what is left of eqsat-time, and 0.5 s at least)",
            (lambda v: v > 0, "positive")),
        PassOption("eqsat-confirm-time", float, 1.0, "eqsat: the confirming rounds' integer programs (of the deep "
            "rounds from graphs a shallow round could not improve) may take this many times the rest of the search "
            "together, 1 s at least each (eqsat-ilp-time and what is left of eqsat-time at most, as every round's); "
            "unproved within it, the graph found stands",
            (lambda v: v > 0, "positive")),
        PassOption("eqsat-ilp-stall", int, 100, "eqsat: an extraction's integer program stops where its best "
            "solution has stood for this many of HiGHS's interrupt checks and for as many as came before it was "
            "found (the solution stands, unproved, with its gap; status Stalled; counted in checks, not seconds, "
            "so a run stays deterministic); 0: no such stop",
            (lambda v: v >= 0, "0 or more")),
        PassOption("eqsat-chains", bool, True, "eqsat: extend each merge of two siblings by the next sibling, "
            "and so on (a merge of k siblings in one e-graph, where TASO's two-op merge rules need k - 1 rounds)"),
        PassOption("eqsat-restarts", int, 8, "eqsat: times the e-graph is built again from the extracted graph "
            "and saturated again while the cost drops and eqsat-time lasts (0: one saturation, TENSAT's)",
            (lambda v: 0 <= v <= 100, "between 0 and 100")),
    )


register(PassInfo(
    "taso-search",
    "The taso-search pipeline (taso-opt --dump-pass-pipeline prints it): the prepare passes (batchnorm and "
    "constant folding, raising, scale folding, merging repeats, ReLU6 and bias fusion, DCE), then, kept only "
    "where it costs no more, the flattening, TASO's cost-based backtracking search with the verified rules "
    "(applied as PDL patterns at the chosen sites) and the cleanup passes",
    _run_search,
    search_options(),
))


# ---------------------------------------------------------------------------------------------
# Python pass manager integration


class _PyPass:
    """A callable for PassManager.add carrying its options (the bindings have no option mechanism)."""

    def __init__(self, info: PassInfo, options: dict):
        self.info, self.options = info, options
        self.__name__ = info.argument
        self.error: Optional[str] = None

    def __call__(self, op: ir.Operation, pass_) -> None:
        from taso_mlir.dialect.handles import step

        try:
            with step(f"pass '{self.info.argument}'", op):  # (checked after it in the IR debug mode)
                self.info.run(op, self.options)
        except TasoError as e:
            self.error = str(e)
            _PENDING_ERRORS.append(self.error)
            pass_.signal_pass_failure()
        except Exception as e:  # a bug, not bad input: re-raised by run_pass_manager as it is
            self.error = f"{type(e).__name__}: {one_line(e)}"
            _PENDING_EXCEPTIONS.append(e)
            pass_.signal_pass_failure()


_PENDING_ERRORS: list[str] = []
_PENDING_EXCEPTIONS: list[BaseException] = []


def add_taso_pass(pm: passmanager.PassManager, argument: str, **options) -> None:
    """Append our pass ``argument`` (e.g. "convert-onnx-to-taso") with keyword options to ``pm``."""
    if argument not in REGISTRY:
        raise TasoError(f"unknown taso pass '{argument}' (known: {', '.join(sorted(REGISTRY))})")
    info = REGISTRY[argument]
    p = _PyPass(info, info.parse_options({k.replace("_", "-"): v for k, v in options.items()}))
    pm.add(p, name=argument, argument=argument, description=info.summary)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside (), {}, [] and quotes."""
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth < 0:
                raise TasoError(f"unbalanced brackets in pass pipeline '{text}'")
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth != 0 or quote:
        raise TasoError(f"unbalanced brackets in pass pipeline '{text}'")
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return [p for p in parts if p]


def parse_element(elem: str) -> tuple[str, dict[str, str], Optional[str]]:
    """``name{k=v k2=v2}`` -> (name, {k: v}, None); ``anchor(nested)`` -> (anchor, {}, nested)."""
    elem = elem.strip()
    name_end = len(elem)
    for i, ch in enumerate(elem):
        if ch in "{(":
            name_end = i
            break
    name = elem[:name_end].strip()
    rest = elem[name_end:].strip()
    if not rest:
        return name, {}, None
    if rest[0] == "(":
        if not rest.endswith(")"):
            raise TasoError(f"malformed pipeline element '{elem}'")
        return name, {}, rest[1:-1]
    if not rest.endswith("}"):
        raise TasoError(f"malformed pipeline element '{elem}'")
    opts = {}
    for item in split_top_level(rest[1:-1], " "):
        if "=" not in item:
            opts[item] = "true"
            continue
        k, v = item.split("=", 1)
        opts[k.strip()] = v.strip().strip("'\"")
    return name, opts, None


def build_pass_manager(pipeline: str, ctx: ir.Context) -> passmanager.PassManager:
    """A PassManager for ``builtin.module(...)`` mixing upstream and taso passes, in order."""
    text = pipeline.strip()
    name, _, inner = parse_element(text)
    if name != "builtin.module" or inner is None:
        raise TasoError(f"the pass pipeline must be 'builtin.module(...)', got '{pipeline}'")
    with ctx:
        pm = passmanager.PassManager("builtin.module")
        for elem in split_top_level(inner):
            ename, opts, nested = parse_element(elem)
            if ename in REGISTRY:
                if nested is not None:
                    raise TasoError(f"'{ename}' is a pass, not an op anchor")
                info = REGISTRY[ename]
                p = _PyPass(info, info.parse_options(opts))
                pm.add(p, name=ename, argument=ename, description=info.summary)
            else:
                if nested is not None:
                    for inner_elem in split_top_level(nested):
                        if parse_element(inner_elem)[0] in REGISTRY:
                            raise TasoError(f"taso pass '{parse_element(inner_elem)[0]}' runs on builtin.module, "
                                            f"not nested in '{ename}(...)'")
                try:
                    pm.add(elem)
                except Exception as e:
                    raise TasoError(f"unknown or malformed pass '{elem}': {one_line(e)}") from None
    return pm


def run_pass_manager(pm: passmanager.PassManager, module_op: ir.Operation) -> None:
    """Run ``pm``; our passes' errors come back as one-line TasoErrors."""
    del _PENDING_ERRORS[:]
    del _PENDING_EXCEPTIONS[:]
    try:
        pm.run(module_op)
    except Exception as e:
        if _PENDING_ERRORS:
            raise TasoError(_PENDING_ERRORS[0]) from None
        if _PENDING_EXCEPTIONS:
            raise _PENDING_EXCEPTIONS[0]
        diags = getattr(e, "error_diagnostics", None)
        if diags:
            raise TasoError(f"{diags[0].location}: {diags[0].message}") from None
        raise TasoError(f"pass pipeline failed: {one_line(e)}") from None


def function_pass_info(p: FunctionPass) -> PassInfo:
    """A function pass as a registered pass of its own, run on every function of the module."""
    options = tuple(o for o in search_options() if o.name in p.option_names())
    return PassInfo(p.argument, p.summary, lambda op, opts: run_alone(p, op, opts), options)


def run_alone(p: FunctionPass, module_op: ir.Operation, opts: dict) -> None:
    """Run one function pass on every function of the module (``taso-opt`` / the Python API)."""
    from taso_mlir.dialect.ops import function_bodies
    from taso_mlir.passes.cost.oracle import get_cost_model, target_of
    from taso_mlir.passes.search import tgraph as T
    from taso_mlir.passes.search.taso_search import search_setup

    with module_op.context, ir.Location.unknown(module_op.context):
        cm = get_cost_model(target_of(opts)) if (p.needs_cost_model or p.needs_rules) else None
        try:
            setup = {}
            if p.needs_rules:
                setup = search_setup(opts, cm)
            elif cm is not None:
                setup = dict(builder=T.Builder(cm), written=T.Builder(cm, split_trees=False))
            for f in function_bodies(module_op):
                st = FuncState(f, opts=opts, **setup)
                st.current = p.argument
                st.pass_stats[p.argument] = Counter({k: 0 for k in p.counters})
                p.run(st)
                record_statistics(st.pass_stats)
        finally:
            if cm is not None:
                cm.close()


def _register_function_passes() -> None:
    from taso_mlir.passes.search.taso_search import FUNCTION_PASSES

    assert {o.name for o in search_options()} >= set(SEARCH_PASS_OPTIONS)
    for fp in FUNCTION_PASSES:
        register(function_pass_info(fp))


_register_function_passes()
