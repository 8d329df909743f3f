"""``cost-model=cuda:<gpu>``: op costs measured on an NVIDIA GPU, read from a shipped table (issue 24).

The table ``passes/cost/tables/<gpu>.json`` is written on a GPU machine by ``benchmarks/gpu/calibrate.py``
from the signatures the search prices on the suite (``passes/cost/calibration.py``), and read here on any
machine, GPU or not. ``$TASO_CUDA_TABLES`` names another folder to read ``<gpu>.json`` from.

The table (JSON)::

    {"format": "taso-mlir cuda table 1",
     "device": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "...", "cuda_runtime": "...", "cublas": "...",
                "cudnn": "...", "machine": "...", ...},
     "date": "2026-11-30T12:00:00Z",
     "method": {"warmup": 8, "repeats": 32, "statistic": "median", ...},
     "entries": {"<OpSig.key()>": {"ms": 0.0123, "q1_ms": ..., "q3_ms": ..., "repeats": 32, "backend": "..."}},
     "failed": {"<key>": "why"}, "unsupported": {"<key>": "why"}, ...}

A signature found in ``entries`` costs its measured median. Any other (not measured, failed, unsupported, or
never dumped because the search had not visited it) is estimated by the analytic roofline of the GPU
(``oracle.PROFILES[gpu]``, else the H100's) *fitted to the table*: per op class (``op_class``), a weighted
least-squares line ``ms = a + b x`` over the class's measured entries, ``x`` the roofline's time without its
launch overhead (its compute/memory body), ``a`` the class's fitted fixed cost per kernel (launch and
prologue, seconds the roofline sets by hand) and ``b`` the class's fitted scale on the body (how far the
library's kernels are from the roofline's efficiencies). It minimizes the squared log of estimate over
measurement, a relative error that weighs over- and underestimates alike (measurements span four orders of
magnitude). A class with fewer than ``MIN_FIT`` entries, or without two distinct ``x``, uses the fit over all
entries; views (no body) cost their class's median. Each distinct
signature priced is counted once: ``hits`` measured, ``estimated`` fitted.

Where a table exists, ``analytic:<gpu>`` (for a GPU of ``GPU_PROFILES``) is that fitted model alone
(``FittedAnalytic``: every signature estimated, none looked up), replacing the hand-set profile; the hand-set
one stays ``analytic:<gpu>:datasheet``, and is ``analytic:<gpu>`` wherever no table exists.

How far the analytic model is from the measurements, per op class (``class_stats``, ``fit_report``)::

    python -m taso_mlir.passes.cost.calibration report cuda:h100      # or a table file
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Optional

from taso_mlir.dialect.errors import TasoError, one_line
from taso_mlir.passes.cost.roofline import GPU_PROFILES, PROFILES, Analytic, CostModel, OpSig

FORMAT = "taso-mlir cuda table 1"
#: a folder of ``<gpu>.json`` tables read instead of the shipped ones (tests, a table just measured)
TABLES_ENV = "TASO_CUDA_TABLES"
#: entries a class needs for a fit of its own
MIN_FIT = 3
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")

_GEMM = frozenset({"conv2d", "matmul"})
_POOL = frozenset({"maxpool2d", "avgpool2d", "onnx.MaxPool", "onnx.AveragePool", "onnx.GlobalAveragePool",
                   "onnx.GlobalMaxPool"})
_ELEMENTWISE = frozenset({"ewadd", "ewmul", "smul", "relu", "sigmoid", "tanh", "batchnorm"})
_MOVES = frozenset({"concat", "split", "transpose", "enlarge"})
_VIEWS = frozenset({"reshape", "onnx.Reshape", "onnx.Flatten", "onnx.Squeeze", "onnx.Unsqueeze", "onnx.Identity"})
#: the op classes, in report order
CLASSES = ("gemm", "grouped-conv", "pool", "elementwise", "movement", "view", "generic")


def op_class(sig: OpSig) -> str:
    """The op class whose fitted line estimates ``sig``: gemm (conv2d of one group, matmul), grouped-conv,
    pool, elementwise (including batchnorm), movement (concat, split, transpose, enlarge), view (reshape and
    the generic views), generic (other ``onnx.<Op>``)."""
    k = sig.kind
    if k == "conv2d" and int(dict(sig.attrs).get("group", 1)) > 1:
        return "grouped-conv"
    if k in _GEMM:
        return "gemm"
    if k in _POOL:
        return "pool"
    if k in _ELEMENTWISE:
        return "elementwise"
    if k in _MOVES:
        return "movement"
    if k in _VIEWS:
        return "view"
    return "generic"


def table_dir() -> str:
    return os.environ.get(TABLES_ENV) or SHIPPED_DIR


def table_path(gpu: str) -> str:
    return os.path.join(table_dir(), f"{gpu}.json")


def display_path(path: str) -> str:
    """Where a table is, as the reports print it: relative to the package (``passes/cost/tables/h100.json``)
    or to ``$TASO_CUDA_TABLES``, never a machine's absolute path."""
    d, base = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if d == os.path.abspath(SHIPPED_DIR):
        return f"passes/cost/tables/{base}"
    env = os.environ.get(TABLES_ENV)
    if env and d == os.path.abspath(env):
        return f"${TABLES_ENV}/{base}"
    return base


def shipped_tables() -> list[str]:
    """The GPUs with a table in ``table_dir()``."""
    try:
        return sorted(f[:-5] for f in os.listdir(table_dir()) if f.endswith(".json"))
    except OSError:
        return []


def sig_from_key(key: str) -> OpSig:
    """The signature of a table key (``OpSig.key()``)."""
    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    p = json.loads(key)
    if not isinstance(p, list) or len(p) not in (5, 6) or not isinstance(p[0], str):
        raise ValueError(f"not a signature key: {key[:80]}")
    weights = tuple(bool(w) for w in p[5]) if len(p) == 6 else ()
    return OpSig(p[0], tuple((k, tup(v)) for k, v in p[1]), tuple(tuple(s) for s in p[2]),
                 tuple(tuple(s) for s in p[3]), p[4], False, weights)


@dataclass(frozen=True)
class Line:
    """``ms = a + b x`` (x: the roofline's body time, ms) fitted over ``n`` entries, or the global fit's."""

    a: float
    b: float
    n: int
    own: bool  # fitted on the class's own entries (else the fit over all entries)

    def __call__(self, x: float) -> float:
        return self.a + self.b * x


def fit_line(xs: list[float], ys: list[float]) -> Optional[tuple[float, float]]:
    """(a, b), a >= 0 and b > 0, minimizing sum(log((a + b x) / y)^2): the squared *relative* error taken
    symmetrically (estimating 10x too much weighs what 10x too little does), over the points with y > 0;
    None where no rising line fits (fewer than two distinct x). A grid over a (0, and fractions of the
    smallest y) with the best b for each, then Gauss-Newton from the best pair."""
    import numpy as np

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    keep = (y > 0) & (x >= 0) & np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 2 or np.ptp(x) <= 0 or not (x > 0).any():
        return None
    ly = np.log(y)

    def loss(a, b):
        v = a + b * x
        return float(np.sum((np.log(np.maximum(v, 1e-300)) - ly) ** 2)) if (v > 0).all() else math.inf

    def best_b(a):  # Newton on t = log b
        pos = x > 0
        r = (y[pos] - a) / x[pos]
        t = math.log(np.median(r[r > 0])) if (r > 0).any() else math.log(np.median(y[pos] / x[pos]))
        for _ in range(30):
            bx = math.exp(t) * x
            v = np.maximum(a + bx, 1e-300)
            res, d = np.log(v) - ly, bx / v
            g, h = float(np.sum(res * d)), float(np.sum(d * d)) + 1e-300
            t -= g / h
            if abs(g / h) < 1e-12:
                break
        return math.exp(t)

    ymin = float(y.min())
    grid = [0.0] + [ymin * f for f in np.geomspace(1e-3, 0.999, 40)]
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = min(((a, best_b(a)) for a in grid), key=lambda ab: loss(*ab))
    cur, lam = loss(a, b), 1e-3
    for _ in range(100):  # Levenberg-Marquardt on (a, b), a kept >= 0
        v = a + b * x
        res = np.log(v) - ly
        ja, jb = 1.0 / v, x / v
        m = np.array([[ja @ ja, ja @ jb], [ja @ jb, jb @ jb]])
        g = np.array([ja @ res, jb @ res])
        try:
            da, db = np.linalg.solve(m + lam * np.diag(np.diag(m) + 1e-300), -g)
        except np.linalg.LinAlgError:
            break
        na, nb = max(0.0, a + da), b + db
        new = loss(na, nb) if nb > 0 else math.inf
        if new < cur:
            done = cur - new <= 1e-15 * max(cur, 1e-300) or (abs(na - a) <= 1e-15 * max(a, 1e-300) and
                                                              abs(nb - b) <= 1e-12 * b)
            a, b, cur, lam = na, nb, new, lam * 0.3
            if done:
                break
        else:
            lam *= 10
            if lam > 1e12:
                break
    if not b > 0 or b * float(x.max()) < 1e-6 * a:  # flat: the size does not predict the time
        return None
    return a, b


class CudaTable(CostModel):
    """Measured GPU costs from a table; misses estimated by the analytic profile fitted to the table."""

    def __init__(self, data: dict, path: str = "", gpu: Optional[str] = None, lines: Optional[dict] = None):
        super().__init__()
        self.path = path
        self.gpu = gpu or data.get("name") or os.path.splitext(os.path.basename(path))[0] or "gpu"
        self.name = f"cuda:{self.gpu}"
        self.device = data["device"]
        self.date = str(data["date"])
        self.method = dict(data.get("method") or {})
        self.complete = data.get("complete")  # (calibrate.py: whether every dumped signature has a result)
        self.entries = {k: float(v["ms"]) for k, v in data["entries"].items()}
        # signatures the calibration could not measure (estimated like any miss): key -> why
        self.failed, self.unsupported = dict(data.get("failed") or {}), dict(data.get("unsupported") or {})
        self.hits = 0  # distinct signatures priced from the table (``estimated``: by the fitted model)
        self.base = PROFILES.get(self.gpu, PROFILES["h100"])
        # the roofline's body: the base profile without its per-kernel and per-view overheads
        self._body = Analytic(replace(self.base, launch_s=0.0, dispatch_s=0.0))
        self.roofline = Analytic(self.base)  # the unfitted profile (the report compares it)
        self.lines = lines if lines is not None else self._fit()

    # -- loading

    #: (path, gpu) -> (the file's mtime and size, its data, the fitted lines): a table is read and fitted once
    #: per process (a search makes a cost model per run)
    _loaded: dict = {}

    @classmethod
    def load(cls, path: str, gpu: Optional[str] = None) -> "CudaTable":
        where = f"the CUDA cost table {display_path(path)}"
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
            hit = cls._loaded.get((os.path.abspath(path), gpu))
            if hit is not None and hit[0] == stamp:
                return cls(hit[1], path, gpu, hit[2])
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise TasoError(f"{where} does not exist") from None
        except (OSError, ValueError) as e:
            raise TasoError(f"{where} is unreadable ({one_line(e, 160)})") from None
        problem = validate(data)
        if problem:
            raise TasoError(f"{where} is not a taso-mlir CUDA table: {problem}")
        t = cls(data, path, gpu)
        cls._loaded[(os.path.abspath(path), gpu)] = (stamp, data, t.lines)
        return t

    # -- the fit

    def _fit(self) -> dict:
        by_class: dict[str, tuple[list, list]] = {c: ([], []) for c in CLASSES}
        for k, ms in self.entries.items():
            sig = sig_from_key(k)
            xs, ys = by_class[op_class(sig)]
            xs.append(self._body.cost(sig))
            ys.append(ms)
        all_x = [x for xs, _ in by_class.values() for x in xs]
        all_y = [y for _, ys in by_class.values() for y in ys]
        g = fit_line(all_x, all_y) or (0.0, 1.0)
        glob = Line(g[0], g[1], len(all_x), False)
        lines = {}
        for c, (xs, ys) in by_class.items():
            own = fit_line(xs, ys) if len(xs) >= MIN_FIT else None
            if c == "view" and len(xs) >= MIN_FIT:  # no body: the median fixed cost of the class
                own = (sorted(ys)[len(ys) // 2], 1.0)
            lines[c] = Line(own[0], own[1], len(xs), True) if own else replace(glob, n=len(xs))
        return lines

    def estimate(self, sig: OpSig) -> float:
        """The fitted analytic model's cost of ``sig`` (ms)."""
        return max(0.0, self.lines[op_class(sig)](self._body.cost(sig)))

    # -- pricing

    def _cost(self, sig: OpSig) -> float:
        ms = self.entries.get(sig.key())
        if ms is not None:
            self.hits += 1
            return ms
        self.estimated += 1
        return self.estimate(sig)

    # -- reporting

    def rehearsal(self) -> bool:
        """A table of calibrate.py's dry run (numpy on the CPU): its numbers are not GPU timings."""
        return self.method.get("backend") == "dry" or str(self.device.get("gpu", "")).startswith("DRY RUN")

    def describe(self) -> str:
        gpu = self.device.get("gpu", self.gpu)
        return (f"measured on {gpu} (table of {self.date[:10]}); signatures not in it estimated by the analytic "
                f"{self.base.name.upper()} roofline fitted to the table")

    def source(self) -> dict:
        """Which table this is, for reports: the GPU, its driver and libraries, the date, where the file is
        (``display_path``), the backend that measured it, and how many signatures it measured."""
        dev = self.device
        libs = {k: dev[k] for k in ("cuda_runtime", "cublas", "cudnn", "torch", "cuda_core", "cupy") if dev.get(k)}
        return {"table": display_path(self.path) if self.path else self.name, "name": self.name,
                "gpu": dev.get("gpu", self.gpu), "driver": dev.get("driver"), "date": self.date,
                "libraries": libs, "backend": self.method.get("backend"), "rehearsal": self.rehearsal(),
                "complete": self.complete, "entries": len(self.entries), "failed": len(self.failed),
                "unsupported": len(self.unsupported), "fitted_profile": f"analytic:{self.base.name}"}

    def source_text(self) -> str:
        """``source`` in one line."""
        s = self.source()
        libs = ", ".join(f"{k} {v}" for k, v in s["libraries"].items())
        return (f"{s['name']}: {s['table']}, measured on {s['gpu']} (driver {s['driver'] or 'unknown'}"
                f"{', ' + libs if libs else ''}) on {s['date']}: {s['entries']} signatures measured, "
                f"{s['failed']} failed, {s['unsupported']} without a kernel"
                + (" (REHEARSAL TABLE: numpy on the CPU, not GPU timings)" if s["rehearsal"] else ""))

    def counts(self) -> dict:
        """The distinct signatures priced so far: ``measured`` (found in the table), ``estimated`` (fitted)."""
        return {"measured": self.hits, "estimated": self.estimated}

    def summary(self) -> str:
        n = self.hits + self.estimated
        return (f"{self.hits} of {n} op signatures measured on {self.device.get('gpu', self.gpu)}, the rest "
                "estimated by the analytic model fitted to the table")

    def class_stats(self) -> dict:
        """Per op class (``CLASSES``, then ``all``), over the table's entries with a positive time (``n``;
        ``zero``: the entries measured at 0, views that launch no kernel), the
        ratios estimate / measured of the unfitted roofline (``analytic``: the hand-set profile) and of the
        fitted model (``fitted``, in-sample) as ``{"median", "q1", "q3", "worst"}`` (worst: the ratio farthest
        from 1 either way; None without entries), and the class's line (``a_ms``, ``b``, ``own``: fitted on
        the class's own entries, else the fit over all)."""
        ratios: dict[str, tuple[list, list]] = {c: ([], []) for c in CLASSES}
        zero = dict.fromkeys(CLASSES, 0)
        for k, ms in self.entries.items():
            sig = sig_from_key(k)
            c = op_class(sig)
            if ms <= 0:  # (a view: no kernel, no time to compare with)
                zero[c] += 1
                continue
            ratios[c][0].append(self.roofline.cost(sig) / ms)
            ratios[c][1].append(self.estimate(sig) / ms)
        every = ([r for c in CLASSES for r in ratios[c][0]], [r for c in CLASSES for r in ratios[c][1]])
        out = {}
        for c in CLASSES + ("all",):
            r0, r1 = every if c == "all" else ratios[c]
            z = sum(zero.values()) if c == "all" else zero[c]
            ln = self.lines.get(c)
            out[c] = {"n": len(r0), "zero": z, "analytic": _ratio_stats(r0), "fitted": _ratio_stats(r1),
                      "a_ms": ln.a if ln else None, "b": ln.b if ln else None, "own": ln.own if ln else None}
        return out

    def fit_report(self) -> str:
        """``class_stats`` as a Markdown table: per op class, the entries, the ratio estimate / measured of the
        hand-set roofline and of the fitted model (median and interquartile range; worst), and the fitted line
        ``a + b x`` (a in microseconds)."""
        rows = [f"| class | entries | analytic:{self.base.name} / measured: median (IQR), worst | fitted / measured: "
                "median (IQR), worst | fit: a (us) | b |", "|---|---|---|---|---|---|"]
        for c, st in self.class_stats().items():
            if c == "all":
                fit = "- | -"
            else:
                fit = f"{1e3 * st['a_ms']:.2f} | {st['b']:.3g}" + ("" if st["own"] else " (all classes')")
            n = f"{st['n']}" + (f" (+{st['zero']} at 0)" if st["zero"] else "")
            rows.append(f"| {c} | {n} | {_ratio_text(st['analytic'])} | {_ratio_text(st['fitted'])} | {fit} |")
        return "\n".join(rows)


def _ratio_stats(r: list) -> Optional[dict]:
    if not r:
        return None
    import numpy as np

    q1, med, q3 = (float(v) for v in np.percentile(r, [25, 50, 75]))
    return {"median": med, "q1": q1, "q3": q3, "worst": max(r, key=lambda v: abs(math.log(v)) if v > 0 else math.inf)}


def _ratio_text(st: Optional[dict]) -> str:
    if st is None:
        return "-"
    return f"{st['median']:.3g}x ({st['q1']:.3g}-{st['q3']:.3g}), {st['worst']:.3g}x"


def validate(data) -> Optional[str]:
    """What is wrong with a table (None: nothing)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != FORMAT:
        return f"its format is {data.get('format')!r}, not {FORMAT!r}"
    dev = data.get("device")
    if not isinstance(dev, dict) or not isinstance(dev.get("gpu"), str) or not dev["gpu"]:
        return "no device.gpu (the GPU's name)"
    if not isinstance(data.get("date"), str):
        return "no date"
    ent = data.get("entries")
    if not isinstance(ent, dict):
        return "no entries"
    for k, v in ent.items():
        ms = v.get("ms") if isinstance(v, dict) else None
        if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not math.isfinite(ms) or ms < 0:
            return f"entry {k[:60]} has no valid ms"
        try:
            sig_from_key(k)
        except (ValueError, TypeError, IndexError) as e:
            return f"entry {k[:60]}: {one_line(e, 80)}"
    if not ent:
        return "no measured entries"
    return None


def get(spec: str, gpu: str) -> CudaTable:
    """``cuda:<gpu>``: the table of ``gpu``, or a one-line error saying that it has not been measured."""
    path = table_path(gpu)
    if not os.path.exists(path):
        have = shipped_tables()
        raise TasoError(
            f"cost model '{spec}' is not available: no measured table for '{gpu}' ({display_path(path)} does not "
            f"exist: the GPU calibration has not been run for it; see docs/benchmarks.md, 'GPU calibration'); "
            f"tables: {', '.join(f'cuda:{g}' for g in have) or 'none yet'}; "
            f"analytic:{gpu if gpu in PROFILES else 'h100'} is an estimate")
    return CudaTable.load(path, gpu)


class FittedAnalytic(Analytic):
    """``analytic:<gpu>`` where a ``cuda:<gpu>`` table exists: the GPU's roofline fitted to the table, per op
    class (``CudaTable.estimate``), for every signature (none is looked up in the table: this is the model,
    an estimate). It replaces the hand-set profile (``analytic:<gpu>:datasheet``) once a table is measured."""

    def __init__(self, table: CudaTable):
        super().__init__(table.base)
        self.table = table
        self.name = f"analytic:{table.base.name}"

    def _cost(self, sig: OpSig) -> float:
        return self.table.estimate(sig)

    def describe(self) -> str:
        return (f"estimated by the analytic roofline of an NVIDIA {self.p.name.upper()} fitted to the table "
                f"measured on {self.table.device.get('gpu', self.table.gpu)} (table of {self.table.date[:10]}, "
                f"{display_path(self.table.path)})")

    def source(self) -> dict:
        return self.table.source()


def analytic(dev: str) -> Analytic:
    """``analytic:<dev>``: for a GPU with a measured table (``table_path(dev)`` exists), the roofline fitted
    to it (``FittedAnalytic``); else the hand-set profile ``PROFILES[dev]``. ``analytic:<dev>:datasheet``
    (``Analytic(PROFILES[dev])``) is the hand-set one in any case."""
    if dev in GPU_PROFILES and os.path.exists(table_path(dev)):
        return FittedAnalytic(CudaTable.load(table_path(dev), dev))
    return Analytic(PROFILES[dev])
