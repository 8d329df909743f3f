"""Round-trip sweep over the ONNX backend test models shipped inside the ``onnx`` package.

For each model: load, import (into the `taso` dialect), export, ``onnx.checker.check_model(full_check=True)``
on the export; the graph inputs and outputs must keep their names and order, and every generic node (one
that convert-onnx-to-taso does not raise to a `taso` op) must come back exactly: op type, domain,
attributes with their ONNX types and values, input/output arity with omitted optional ones ("") in place.
Then the export runs in onnxruntime on the model's test_data_set_0 inputs (the light/ models: the backend
runner's dummy inputs) and is compared with the expected outputs (rtol=1e-3, atol=1e-5):

- where onnxruntime cannot run the original (old opsets, training ops), onnx's ReferenceEvaluator is used
  instead if it reproduces the expected outputs on the original; else nothing numeric is compared;
- where onnxruntime does not reproduce the expected outputs on the original either, the export is
  compared with onnxruntime's outputs for the original.

Each model ends up as

- ``ok``        it round-trips (``ort`` says whether numerics were compared, ``note`` how or why not),
- ``rejected``  taso-mlir refused it with a one-line ``TasoError`` (the reason is kept),
- ``fail``      anything else: another exception, a checker failure, a changed node, a numeric mismatch,
                a crash of the process (an MLIR abort), a hang.

Imports and exports run in-process in worker subprocesses, so that a crash of the MLIR library kills a
worker, not the test: the orchestrator notices, blames the model that was running (and the stage: a crash
of onnxruntime on the original model is not ours), and restarts a worker on the rest. Used by
``test_onnx_backend_data.py``; runnable by hand::

    python test/unit/onnx_backend_sweep.py                # sweep everything, print a summary
    python test/unit/onnx_backend_sweep.py -k Conv2d -v   # only matching models, one line each
    python test/unit/onnx_backend_sweep.py --root DIR     # another data root (e.g. generated node tests)
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Optional

SUITES = ("node", "simple", "pytorch-converted", "pytorch-operator", "real", "light")
RTOL, ATOL = 1e-3, 1e-5
#: Seconds one model may take before it counts as hung.
MODEL_TIMEOUT = 120.0


#: Environment variable naming another data root with the same layout (e.g. one where the node tests,
#: which the onnx wheel does not ship, were generated from ``onnx.backend.test.case.node``).
ROOT_ENV = "TASO_ONNX_BACKEND_DATA"


def data_root() -> str:
    import onnx

    return os.environ.get(ROOT_ENV) or os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def discover(root: Optional[str] = None) -> tuple[list[dict], dict]:
    """The test cases, and per-suite notes for suites that add no model of their own.

    A case is ``{"id", "suite", "model", "data" (a test_data_set dir or None), "expected" (list of
    output .pb files, for the light models), "dummy_inputs" (bool)}``.
    """
    root = root or data_root()
    cases: list[dict] = []
    notes: dict = {}
    for suite in SUITES:
        d = os.path.join(root, suite)
        if not os.path.isdir(d):
            notes[suite] = "not shipped in this onnx package"
            continue
        if suite == "light":
            # light_<name>.onnx with light_<name>_output_<i>.pb; inputs are the backend runner's dummy data
            for path in sorted(glob.glob(os.path.join(d, "light_*.onnx"))):
                stem = path[: -len(".onnx")]
                cases.append(dict(id=f"light/{os.path.basename(stem)}", suite=suite, model=path, data=None,
                                  expected=sorted(glob.glob(stem + "_output_*.pb"), key=_index),
                                  dummy_inputs=True))
            continue
        n_before = len(cases)
        aliases = 0
        for sub in sorted(os.listdir(d)):
            mdir = os.path.join(d, sub)
            model = os.path.join(mdir, "model.onnx")
            if os.path.exists(model):
                ds = os.path.join(mdir, "test_data_set_0")
                cases.append(dict(id=f"{suite}/{sub}", suite=suite, model=model,
                                  data=ds if os.path.isdir(ds) else None, expected=None, dummy_inputs=False))
            elif os.path.exists(os.path.join(mdir, "data.json")):
                aliases += 1  # real/*: a pointer ("url") to the light model of the same network
        if aliases and len(cases) == n_before:
            notes[suite] = f"{aliases} data.json pointers to the light/ models (swept there)"
    return cases, notes


def _index(path: str) -> int:
    m = re.search(r"_(\d+)\.pb$", path)
    return int(m.group(1)) if m else 0


# ------------------------------------------------------------------------------------------------
# one model (runs in a worker process)


def _read_tensor(path: str):
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def _dummy(vi):
    """The onnx backend runner's dummy input for the light models (arange / n, float32)."""
    import numpy as np

    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def _ort_run(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare(got, want) -> Optional[str]:
    """None if ``got`` matches ``want`` (lists of arrays), else a one-line description."""
    import numpy as np

    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        if w.dtype == object or w.dtype.kind in "biuUS":
            if not np.array_equal(g, w):
                return f"output {i}: values differ"
            continue
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            err = np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))
            return f"output {i}: max abs error {err:.3g} beyond rtol={RTOL}, atol={ATOL}"
    return None


def run_case(case: dict) -> dict:
    """Round-trip one model; never raises."""
    res = dict(id=case["id"], suite=case["suite"])
    try:
        res.update(_run_case(case))
    except Exception as e:  # a bug: report it with where it happened
        tb = traceback.extract_tb(e.__traceback__)
        frame = tb[-1] if tb else None
        at = f" at {os.path.basename(frame.filename)}:{frame.lineno}" if frame else ""
        res.update(status="fail", reason=f"{type(e).__name__}: {_line(e)}{at}")
    return res


def _line(e) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= 300 else s[:297] + "..."


def _run_case(case: dict) -> dict:
    import onnx

    from taso_mlir.dialect.errors import TasoError
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx, load_onnx

    path = case["model"]
    stage = "load"
    try:
        model = load_onnx(path)
        stage = "import"
        module = import_onnx(model, make_context(), where=path)
        stage = "export"
        model2 = export_onnx(module)
    except TasoError as e:
        msg = str(e)
        return dict(status="rejected", stage=stage, reason=msg, one_line="\n" not in msg and "\r" not in msg)
    try:
        onnx.checker.check_model(model2, full_check=True)
    except Exception as e:
        return dict(status="fail", reason=f"exported model fails onnx.checker: {_line(e)}")

    # graph inputs (the ones that are not initializers) and outputs must be kept, in order
    inits = {t.name for t in model.graph.initializer}
    ins = [vi for vi in model.graph.input if vi.name not in inits]
    inits2 = {t.name for t in model2.graph.initializer}
    ins2 = [vi.name for vi in model2.graph.input if vi.name not in inits2]
    if [vi.name for vi in ins] != ins2:
        return dict(status="fail", reason=_line(f"graph inputs changed: {[vi.name for vi in ins]} -> {ins2}"))
    outs, outs2 = [o.name for o in model.graph.output], [o.name for o in model2.graph.output]
    if outs != outs2:
        return dict(status="fail", reason=_line(f"graph outputs changed: {outs} -> {outs2}"))

    bad = _generic_nodes_differ(model, model2)
    if bad:
        return dict(status="fail", reason=f"a generic node was not exported exactly: {bad}")
    unseeded = _unseeded_random_ops(model)
    if unseeded:
        # each run draws new numbers: no two runs compare, so the exact-node check above is the check
        return dict(status="ok", ort="not compared",
                    note=f"random op(s) without a seed ({', '.join(unseeded)}): outputs differ run to run; "
                         "the exported nodes are checked to be identical instead")

    # test data
    try:
        if case["dummy_inputs"]:
            feeds = {vi.name: _dummy(vi) for vi in ins}
            expected = [_read_tensor(p) for p in case["expected"]]
        else:
            ds = case["data"]
            ips = sorted(glob.glob(os.path.join(ds, "input_*.pb")), key=_index)
            ops = sorted(glob.glob(os.path.join(ds, "output_*.pb")), key=_index)
            feeds = {vi.name: _read_tensor(p) for vi, p in zip(ins, ips)}
            expected = [_read_tensor(p) for p in ops]
    except Exception as e:
        return dict(status="ok", ort="not compared", note=f"test data not readable as tensors: {_line(e)}")
    if len(expected) != len(outs):
        return dict(status="ok", ort="not compared", note="test data does not cover every output")

    _stage(ORT_ORIGINAL)
    try:
        orig = _ort_run(model, feeds)
    except Exception as e:
        why = f"onnxruntime cannot run the original: {_line(e)}"
        return _compare_with_reference_evaluator(model, model2, feeds, expected, why)
    _stage("onnxruntime on the export")
    try:
        got = _ort_run(model2, feeds)
    except Exception as e:
        return dict(status="fail", reason=f"onnxruntime cannot run the exported model: {_line(e)}")
    _stage("comparison")
    bad = _compare(got, expected)
    if not bad:
        return dict(status="ok", ort="compared")
    bad_orig = _compare(orig, expected)
    if not bad_orig:
        return dict(status="fail", reason=f"numeric mismatch: {bad}")
    # onnxruntime does not reproduce the expected outputs on the original either: compare the export
    # with what onnxruntime computes for the original, unless that is not deterministic
    if _compare(_ort_run(model, feeds), orig):
        return dict(status="ok", ort="not compared", note="the original's outputs differ between two runs")
    bad = _compare(got, orig)
    if bad:
        return dict(status="fail", reason=f"numeric mismatch with onnxruntime on the original: {bad}")
    return dict(status="ok", ort="compared",
                note=f"with onnxruntime on the original, which deviates from the expected outputs ({bad_orig})")


RANDOM_OPS = {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
              "RandomUniformLike"}


def _unseeded_random_ops(model) -> list[str]:
    """The random ops of ``model``'s graph and functions (subgraphs included) that have no ``seed``
    attribute, sorted."""
    import onnx

    found = set()

    def walk(nodes):
        for n in nodes:
            if n.domain in ("", "ai.onnx") and n.op_type in RANDOM_OPS and \
                    not any(a.name == "seed" for a in n.attribute):
                found.add(n.op_type)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g.node)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        walk(g.node)

    walk(model.graph.node)
    for f in model.functions:
        walk(f.node)
    return sorted(found)


def _compare_with_reference_evaluator(model, model2, feeds, expected, why: str) -> dict:
    """Where onnxruntime cannot run the original (old opsets, training ops), onnx's ReferenceEvaluator
    often can: compare with it when it reproduces the expected outputs on the original."""
    from onnx.reference import ReferenceEvaluator

    try:
        ref = ReferenceEvaluator(model).run(None, feeds)
    except Exception:
        return dict(status="ok", ort="not compared", note=f"{why}; nor can onnx's ReferenceEvaluator")
    if _compare(ref, expected):
        return dict(status="ok", ort="not compared",
                    note=f"{why}; onnx's ReferenceEvaluator does not reproduce the expected outputs")
    try:
        got = ReferenceEvaluator(model2).run(None, feeds)
    except Exception as e:
        return dict(status="fail", reason=f"ReferenceEvaluator runs the original but not the export: {_line(e)}")
    bad = _compare(got, expected)
    if bad:
        return dict(status="fail", reason=f"numeric mismatch (ReferenceEvaluator): {bad}")
    return dict(status="ok", ort="compared", note="with onnx's ReferenceEvaluator (onnxruntime cannot run it)")


def _attr_key(a):
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    def norm(v):
        if isinstance(v, onnx.TensorProto):
            arr = numpy_helper.to_array(v)
            return ("tensor", arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())
        if isinstance(v, (list, tuple)):
            return tuple(norm(x) for x in v)
        return v

    return (a.name, a.type, norm(helper.get_attribute_value(a)))


def _node_key(n):
    domain = "" if n.domain in ("", "ai.onnx") else n.domain
    attrs = tuple(sorted(_attr_key(a) for a in n.attribute))
    # arity, with omitted optional inputs/outputs ("") in place
    return (domain, n.op_type, attrs, tuple(bool(i) for i in n.input), tuple(bool(o) for o in n.output))


#: Inputs a `taso` op does not keep when it raises a node (the static result type says them): nodes
#: computing only these may disappear as dead code.
_STATIC_INPUTS = {"Reshape": {1}, "Split": {1}}


def _needed_nodes(model) -> set[int]:
    """Indices of the nodes that the graph outputs depend on, not counting _STATIC_INPUTS edges."""
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output if o}
    need: set[int] = set()
    todo = [o.name for o in model.graph.output]
    while todo:
        i = producer.get(todo.pop())
        if i is None or i in need:
            continue
        need.add(i)
        n = model.graph.node[i]
        skip = _STATIC_INPUTS.get(n.op_type, set()) if n.domain in ("", "ai.onnx") else set()
        todo.extend(x for j, x in enumerate(n.input) if x and j not in skip)
    return need


def _generic_nodes_differ(model, model2) -> Optional[str]:
    """Nodes that convert-onnx-to-taso may raise to `taso` ops (and Constant/Identity) aside, the export
    must hold the original's nodes exactly: op type, domain, attributes with their types and values,
    input/output arity with omitted optional ones. Dead nodes (also those that only compute a raised
    Reshape's shape or Split's sizes) may be gone. None if so, else a description."""
    from collections import Counter

    from taso_mlir.dialect.convert_onnx_to_taso import RAISERS

    skip = set(RAISERS) | {"Constant", "Identity"}

    def generic(n):
        return not (n.domain in ("", "ai.onnx") and n.op_type in skip)

    need = _needed_nodes(model)
    every = Counter(_node_key(n) for n in model.graph.node if generic(n))
    needed = Counter(_node_key(n) for i, n in enumerate(model.graph.node) if generic(n) and i in need)
    b = Counter(_node_key(n) for n in model2.graph.node if generic(n))
    lost, extra = needed - b, b - every
    if not lost and not extra:
        return None

    def show(k):
        dom, op, attrs, ins, outs = k
        at = ", ".join(f"{name}({_attr_type_name(t)})" for name, t, _ in attrs)
        io = f"{''.join('x' if i else '_' for i in ins)}->{''.join('x' if o else '_' for o in outs)}"
        return f"{dom + '.' if dom else ''}{op}<{at}>[{io}]"

    parts = []
    if lost:
        parts.append("original " + "; ".join(show(k) for k in list(lost)[:2]))
    if extra:
        parts.append("exported " + "; ".join(show(k) for k in list(extra)[:2]))
    return _line(" vs ".join(parts))


def _attr_type_name(t: int) -> str:
    import onnx

    return onnx.AttributeProto.AttributeType.Name(t)


#: Test hook: ``ID`` or ``ID@STAGE``: the worker aborts the process (as an MLIR or onnxruntime crash
#: would) when it starts that model, or when that model reaches that stage.
CRASH_ENV = "TASO_ONNX_SWEEP_CRASH_ON"
_CURRENT: Optional[str] = None


_STAGE_OUT = None
#: The stage during which a crash of onnxruntime is its own problem with the original model, not ours.
ORT_ORIGINAL = "onnxruntime on the original"


def _stage(name: str) -> None:
    """Tell the orchestrator what the worker does now (so that a crash is blamed on the right thing)."""
    if _STAGE_OUT is not None:
        _STAGE_OUT.write(json.dumps({"stage": name}) + "\n")
        _STAGE_OUT.flush()
        if os.environ.get(CRASH_ENV) == f"{_CURRENT}@{name}":
            os.abort()


def _worker(out_path: str, case_ids: list[str]) -> None:
    global _STAGE_OUT, _CURRENT
    cases = {c["id"]: c for c in discover()[0]}
    crash_on = os.environ.get(CRASH_ENV)
    with open(out_path, "a") as out:
        _STAGE_OUT = out
        for cid in case_ids:
            out.write(json.dumps({"start": cid}) + "\n")
            out.flush()
            _CURRENT = cid
            if cid == crash_on:
                os.abort()
            t0 = time.time()
            res = run_case(cases[cid])
            res["seconds"] = round(time.time() - t0, 3)
            out.write(json.dumps({"done": res}) + "\n")
            out.flush()


# ------------------------------------------------------------------------------------------------
# orchestration


class _Worker:
    def __init__(self, ids: list[str], tmpdir: str, n: int):
        self.pending = list(ids)
        self.path = os.path.join(tmpdir, f"worker{n}.jsonl")
        self.results: dict[str, dict] = {}
        self.proc: Optional[subprocess.Popen] = None
        self.read = 0
        self.current: Optional[str] = None
        self.stage = "import/export"
        self.since = 0.0
        self.stderr = os.path.join(tmpdir, f"worker{n}.stderr")

    def start(self) -> None:
        if not self.pending:
            self.proc = None
            return
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", self.path, *self.pending],
                stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.current, self.since = None, time.time()

    def poll(self) -> None:
        """Read new results; restart after a crash or a hang, blaming the model that was running."""
        if self.proc is None:
            return
        self._read()
        rc = self.proc.poll()
        hung = self.current is not None and time.time() - self.since > MODEL_TIMEOUT
        if rc is None and not hung:
            return
        if hung:
            self.proc.kill()
            self.proc.wait()
        self._read()
        if self.current is not None:
            why = f"hung (over {MODEL_TIMEOUT:.0f} s)" if hung else f"process crashed ({_rc_text(self.proc.returncode)})"
            tail = _stderr_tail(self.stderr)
            cid = self.current
            if self.stage == ORT_ORIGINAL and not hung:
                # onnxruntime itself crashes on the original model (the export passed the checker)
                self.results[cid] = dict(id=cid, suite=cid.split("/")[0], status="ok", ort="not compared",
                                         note=f"onnxruntime crashes on the original ({_rc_text(self.proc.returncode)})")
            else:
                self.results[cid] = dict(id=cid, suite=cid.split("/")[0], status="fail",
                                         reason=f"{why} during {self.stage}{': ' + tail if tail else ''}")
            self.pending.remove(cid)
            self.current = None
        elif rc not in (None, 0) and self.pending:
            # died outside a model (e.g. at start-up): blame the next one so that we make progress
            cid = self.pending.pop(0)
            self.results[cid] = dict(id=cid, suite=cid.split("/")[0], status="fail",
                                     reason=f"worker died before the model ({_rc_text(rc)}): {_stderr_tail(self.stderr)}")
        self.start()

    def _read(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            f.seek(self.read)
            while True:
                line = f.readline()
                if not line or not line.endswith("\n"):
                    break
                self.read = f.tell()
                rec = json.loads(line)
                if "start" in rec:
                    self.current, self.since = rec["start"], time.time()
                    self.stage = "import/export"
                elif "stage" in rec:
                    self.stage = rec["stage"]
                else:
                    res = rec["done"]
                    self.results[res["id"]] = res
                    if res["id"] in self.pending:
                        self.pending.remove(res["id"])
                    self.current = None


def _rc_text(rc: int) -> str:
    if rc is not None and rc < 0:
        import signal

        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _stderr_tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return _line(lines[-1]) if lines else ""


def sweep(cases: list[dict], jobs: int = 2) -> list[dict]:
    """Run every case in ``jobs`` worker processes; one result per case, in the order given."""
    ids = [c["id"] for c in cases]
    # balance by file size (a proxy for the work), biggest first
    sized = sorted(cases, key=lambda c: -os.path.getsize(c["model"]))
    chunks: list[list[str]] = [[] for _ in range(max(1, jobs))]
    loads = [0] * len(chunks)
    for c in sized:
        i = loads.index(min(loads))
        chunks[i].append(c["id"])
        loads[i] += os.path.getsize(c["model"]) + 200_000  # + fixed per-model cost
    with tempfile.TemporaryDirectory(prefix="taso-onnx-sweep-") as tmp:
        workers = [_Worker(ch, tmp, i) for i, ch in enumerate(chunks) if ch]
        for w in workers:
            w.start()
        while any(w.proc is not None for w in workers):
            time.sleep(0.05)
            for w in workers:
                w.poll()
    results: dict[str, dict] = {}
    for w in workers:
        results.update(w.results)
    return [results[i] for i in ids]


# ------------------------------------------------------------------------------------------------
# summary

#: (category, pattern on the TasoError message); the first match wins.
CATEGORIES = [
    ("control flow", r"control flow|subgraph"),
    ("sequence/optional/map types", r"\b(sequence|optional|map)\b"),
    ("string tensors", r"\bSTRING\b|string tensor"),
    ("unsupported element type", r"element type|BFLOAT16|FLOAT8|INT4|UINT4|FLOAT4"),
    ("dynamic shape", r"dynamic|could not infer|unknown rank|rank is unknown|no known shape"),
    ("invalid model", r"invalid ONNX model|not a valid ONNX|not a readable"),
    ("shape inference", r"shape inference"),
]


def category(reason: str) -> str:
    for name, pat in CATEGORIES:
        if re.search(pat, reason, re.I):
            return name
    return "other"


def summarize(results: list[dict], notes: dict, seconds: Optional[float] = None) -> list[str]:
    from collections import Counter

    ok = [r for r in results if r["status"] == "ok"]
    rej = [r for r in results if r["status"] == "rejected"]
    fail = [r for r in results if r["status"] == "fail"]
    compared = sum(1 for r in ok if r.get("ort") == "compared")
    by_ref = sum(1 for r in ok if r.get("ort") == "compared" and "ReferenceEvaluator" in r.get("note", ""))
    lines = [f"ONNX backend test models: {len(results)} total, {len(ok)} round-trip ok "
             f"({compared - by_ref} compared numerically in onnxruntime, {by_ref} in onnx's ReferenceEvaluator, "
             f"{len(ok) - compared} checker only), "
             f"{len(rej)} rejected with TasoError, {len(fail)} FAIL"
             + (f" [{seconds:.1f} s]" if seconds is not None else "")]
    per_suite = Counter(r["suite"] for r in results)
    for suite in SUITES:
        if suite in per_suite:
            s = [r for r in results if r["suite"] == suite]
            c = Counter(r["status"] for r in s)
            lines.append(f"  {suite}: {len(s)} models: {c['ok']} ok, {c['rejected']} rejected, {c['fail']} FAIL")
        elif suite in notes:
            lines.append(f"  {suite}: {notes[suite]}")
    for cat, n in sorted(Counter(category(r["reason"]) for r in rej).items(), key=lambda kv: -kv[1]):
        lines.append(f"  rejected, {cat}: {n}")
    for r in ok:
        if r.get("ort") != "compared":
            lines.append(f"  checker only: {r['id']}: {r.get('note', '')}")
    for r in fail:
        lines.append(f"  FAIL {r['id']}: {r['reason']}")
    return lines


def generate_node_tests(dest: str) -> int:
    """Write the ONNX node tests (which the onnx wheel does not ship) as ``dest/node/<test>/`` from
    ``onnx.backend.test.case.node``, and link the shipped suites beside them; returns the count."""
    import shutil

    import numpy as np
    import onnx.backend.test.case.node as node_cases
    from onnx import TensorProto, numpy_helper

    os.makedirs(dest, exist_ok=True)
    shipped = os.path.join(os.path.dirname(onnx_package_file()), "backend", "test", "data")
    for suite in SUITES:
        src, dst = os.path.join(shipped, suite), os.path.join(dest, suite)
        if suite != "node" and os.path.isdir(src) and not os.path.exists(dst):
            os.symlink(src, dst)
    import warnings

    with warnings.catch_warnings():  # the cases' numpy reference code warns (overflow, divide by zero)
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
    for case in cases:
        d = os.path.join(dest, "node", case.name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds)
            for kind, values, infos in (("input", inputs, case.model.graph.input),
                                        ("output", outputs, case.model.graph.output)):
                for j, v in enumerate(values):
                    t = infos[j].type
                    if t.HasField("sequence_type"):
                        pb = numpy_helper.from_list(v, infos[j].name)
                    elif t.HasField("optional_type"):
                        pb = numpy_helper.from_optional(v, infos[j].name)
                    elif t.HasField("map_type"):
                        pb = numpy_helper.from_dict(v, infos[j].name)
                    elif isinstance(v, TensorProto):
                        pb = v
                    else:
                        pb = numpy_helper.from_array(np.asarray(v), infos[j].name)
                    with open(os.path.join(ds, f"{kind}_{j}.pb"), "wb") as f:
                        f.write(pb.SerializeToString())
    return len(cases)


def onnx_package_file() -> str:
    import onnx

    return onnx.__file__


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        _worker(argv[1], argv[2:])
        return 0
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only models whose id contains this")
    ap.add_argument("-j", type=int, default=2, help="worker processes")
    ap.add_argument("-v", action="store_true", help="one line per model")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--root", help=f"data root (default: ${ROOT_ENV} or the onnx package's)")
    ap.add_argument("--generate-node-tests", metavar="DIR",
                    help="write the ONNX node tests (not shipped in the wheel) to DIR beside links to the "
                         "shipped suites, then sweep DIR")
    args = ap.parse_args(argv)
    if args.generate_node_tests:
        n = generate_node_tests(args.generate_node_tests)
        print(f"wrote {n} node tests to {os.path.join(args.generate_node_tests, 'node')}")
        args.root = args.generate_node_tests
    if args.root:
        os.environ[ROOT_ENV] = os.path.abspath(args.root)
    cases, notes = discover()
    cases = [c for c in cases if args.k in c["id"]]
    t0 = time.time()
    results = sweep(cases, args.j)
    dt = time.time() - t0
    if args.v:
        for r in results:
            extra = r.get("reason") or r.get("note") or r.get("ort", "")
            print(f"{r['status']:8} {r['id']} ({r.get('seconds', '?')} s) {extra}")
    print("\n".join(summarize(results, notes, dt)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r["status"] == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
