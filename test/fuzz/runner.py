"""Run one model through ``taso-opt --taso-search --no-verify-numerics`` and classify the outcome.

The optimizer runs in a child process (``worker.py``: the CLI's own ``main()``, one process for many
models, started again when it dies), so a segfault is a result, not the end of the fuzzer. Classes:

- ``ok``: exit 0, and the output agrees with the input (``compare.py``), byte-identical on a rerun;
- ``mismatch``: exit 0 and a wrong (or unloadable) output model;
- ``crash``: killed by a signal, a Python traceback, an ``internal error`` message, exit 0 without output;
- ``refused``: any other non-zero exit (the reason, its one line, is recorded);
- ``timeout``: over the per-model limit (the worker is killed);
- ``nondeterministic``: two runs of the same model wrote different bytes;
- ``generator-fault``: the generator's model is invalid, or onnxruntime and the float64 reference
  disagree on it: not the optimizer's fault;
- ``fuzzer-error``: the fuzzer itself raised (recorded by the campaign, which goes on).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import onnx

from . import compare as C
from . import gen

CLASSES = ("ok", "mismatch", "crash", "refused", "timeout", "nondeterministic", "generator-fault", "fuzzer-error")
#: classes that are the optimizer's failures
FAILURES = frozenset({"mismatch", "crash", "timeout", "nondeterministic"})
#: classes that are the fuzzer's own faults (``fuzzer-error``: it raised; the campaign goes on)
OWN_FAULTS = frozenset({"generator-fault", "fuzzer-error"})

HERE = os.path.dirname(os.path.abspath(__file__))
#: environment of the optimizer's process: glibc fills freed memory and keeps no per-thread cache, so
#: a read of an erased MLIR op is likelier to crash than to read stale but plausible data
MALLOC_ENV = {"MALLOC_PERTURB_": "165", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


#: taso-search's options for a campaign (``campaign.py --search``, e.g. ``strategy=eqsat``), through the
#: environment so the campaign's job processes see it; empty: plain ``--taso-search``
SEARCH_ENV = "TASO_FUZZ_SEARCH"


def _search_arg() -> str:
    opts = os.environ.get(SEARCH_ENV, "").strip()
    return f"--pass-pipeline=builtin.module(taso-search{{{opts}}})" if opts else "--taso-search"


def taso_opt_argv(src: str, out: str) -> list:
    return [src, _search_arg(), "--no-verify-numerics", "-o", out]


def repro_command(path: str) -> str:
    arg = _search_arg()
    return f".venv/bin/taso-opt {path} {arg if arg == '--taso-search' else repr(arg)} --no-verify-numerics -o out.onnx"


@dataclass
class OptRun:
    rc: Optional[int]
    log: str = ""
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def signal(self) -> Optional[str]:
        if self.rc is None or self.rc >= 0:
            return None
        try:
            return signal.Signals(-self.rc).name
        except ValueError:
            return f"signal {-self.rc}"


_TIMEOUT = b"<timeout>"


class Worker:
    """The optimizer's child process (see ``worker.py``)."""

    def __init__(self, env: Optional[dict] = None, restart_every: int = 400):
        self.env = dict(os.environ, **(MALLOC_ENV if env is None else env))
        self.env.pop("TASO_DEBUG", None)
        self.restart_every = restart_every
        self.proc: Optional[subprocess.Popen] = None
        self.served = 0
        self.starts = 0
        self._buf = b""

    def _start(self) -> None:
        self.close()
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env)
        self.starts += 1
        self.served = 0
        self._buf = b""
        line = self._readline(120.0)
        if line is None or line is _TIMEOUT or not json.loads(line).get("ready"):
            rc = self.proc.poll()
            self.close()
            raise RuntimeError(f"the taso-opt worker did not start (exit {rc})")

    def _readline(self, timeout: float) -> Optional[bytes]:
        """A line from the worker, None at EOF, ``_TIMEOUT`` when ``timeout`` seconds pass first."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = end - time.monotonic()
                if left <= 0:
                    return _TIMEOUT
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def run(self, argv: list, log_path: str, timeout: float, selftest: Optional[str] = None) -> OptRun:
        """``taso-opt argv`` in the worker. ``selftest`` (the fuzzer's tests): ``"segfault"`` makes the
        worker crash, a number of seconds makes it sleep first."""
        if self.proc is None or self.proc.poll() is not None or self.served >= self.restart_every:
            self._start()
        self.served += 1
        t0 = time.monotonic()
        req = {"argv": argv, "log": log_path}
        if selftest is not None:
            req["selftest"] = selftest
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(timeout)
        secs = time.monotonic() - t0
        if line is _TIMEOUT:
            self.close()
            return OptRun(None, _read(log_path), timed_out=True, seconds=secs)
        if line is None:  # died
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            self.close()
            return OptRun(rc if rc is not None else -9, _read(log_path), seconds=secs)
        return OptRun(int(json.loads(line)["rc"]), _read(log_path), seconds=secs)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self.proc = None


def run_fresh(argv: list, timeout: float, env: Optional[dict] = None) -> OptRun:
    """``taso-opt`` as a new process (the installed script next to this Python, else ``-m``)."""
    exe = os.path.join(os.path.dirname(sys.executable), "taso-opt")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "taso_mlir.tools.taso_opt"]
    e = dict(os.environ, **(MALLOC_ENV if env is None else env))
    e.pop("TASO_DEBUG", None)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd + argv, capture_output=True, timeout=timeout, env=e)
    except subprocess.TimeoutExpired as x:
        return OptRun(None, (x.stderr or b"").decode(errors="replace"), timed_out=True, seconds=timeout)
    return OptRun(r.returncode, (r.stdout + r.stderr).decode(errors="replace"), seconds=time.monotonic() - t0)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def classify(opt: OptRun, out_path: str) -> tuple:
    """(class, detail) of an optimizer run, before its output is compared."""
    log = opt.log.strip()
    if opt.timed_out:
        return "timeout", f"over {opt.seconds:.0f} s"
    if opt.signal:
        stack = [ln.strip() for ln in log.splitlines() if ln.strip().startswith("File ")]
        return "crash", f"killed by {opt.signal}" + (f" at {stack[0]}" if stack else "")
    if "Traceback (most recent call last)" in log or "internal error" in log or opt.rc in (2, 3):
        line = next((ln for ln in reversed(log.splitlines()) if ln.strip()), "")
        return "crash", f"exit {opt.rc}: {line.strip()[:300]}"
    if opt.rc != 0:
        lines = [ln for ln in log.splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else "(no message)"
        reason = reason.removeprefix("taso-opt: error: ")
        if len(lines) > 1:
            reason += f" ({len(lines)} lines on stderr)"
        return "refused", reason[:400]
    if not os.path.exists(out_path):
        return "crash", "exit 0 without an output file"
    return "ok", ""


def failure_key(cls: str, detail: str) -> tuple:
    """What a shrunk model must keep of a failure: its class and, for crashes and refusals, their kind
    (the signal, the exception type; the reason with names and numbers taken out)."""
    if cls == "crash":
        m = re.match(r"killed by (\S+)", detail)
        if m:
            return cls, m.group(1)
        m = re.search(r"internal error: (\w+)", detail)
        return cls, m.group(1) if m else detail.split(":")[0]
    if cls == "refused":
        norm = re.sub(r"'[^']*'|\"[^\"]*\"|\S*\.onnx\S*", "''", detail)
        norm = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", norm)
        return cls, norm[:80]
    return cls, ""


@dataclass
class Result:
    seed: Optional[int]
    cls: str
    detail: str = ""
    ratio: float = 0.0
    reference: bool = True
    family: str = ""
    motifs: list = field(default_factory=list)
    nodes: int = 0
    t_gen: float = 0.0
    t_opt: float = 0.0
    t_cmp: float = 0.0

    @property
    def failed(self) -> bool:
        return self.cls in FAILURES

    @property
    def key(self) -> tuple:
        return failure_key(self.cls, self.detail)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ratio"] = None if d["ratio"] == float("inf") else round(d["ratio"], 4)
        for k in ("t_gen", "t_opt", "t_cmp"):
            d[k] = round(d[k], 4)
        return d


#: an optimizer: (input path, output path, log path, timeout) -> OptRun
Optimizer = Callable[[str, str, str, float], OptRun]


class Runner:
    """Generates, optimizes, compares; holds the worker process. ``optimizer`` replaces the worker (tests
    plug in a deliberately wrong one). ``determinism``: optimize each model twice and compare the bytes;
    ``fresh_every``: every n-th model's second run is a new ``taso-opt`` process instead of the worker."""

    def __init__(self, workdir: Optional[str] = None, timeout: float = 60.0, determinism: bool = True,
                 fresh_every: int = 0, optimizer: Optional[Optimizer] = None, trials: int = 2,
                 motifs: Optional[list] = None):
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="taso-fuzz-")
            workdir = self._tmp.name
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.timeout = timeout
        self.determinism = determinism
        self.fresh_every = fresh_every
        self.trials = trials
        self.motifs = motifs
        self.worker = Worker() if optimizer is None else None
        self.optimizer = optimizer or self._worker_opt
        self.count = 0

    def _worker_opt(self, src: str, out: str, log: str, timeout: float) -> OptRun:
        return self.worker.run(taso_opt_argv(src, out), log, timeout)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run_seed(self, seed: int) -> tuple:
        """(Result, the model or None) of ``seed``."""
        t0 = time.monotonic()
        try:
            g = gen.generate(seed, motifs=self.motifs)
        except gen.GeneratorFault as e:
            return Result(seed, "generator-fault", str(e), t_gen=time.monotonic() - t0), e.model
        res = self.run_model(g.model, seed)
        res.t_gen = time.monotonic() - t0 - res.t_opt - res.t_cmp
        res.family, res.motifs = g.family, list(g.motifs)
        return res, g.model

    def run_model(self, model: onnx.ModelProto, seed: Optional[int] = 0, check_determinism: Optional[bool] = None) \
            -> Result:
        self.count += 1
        tag = f"m{os.getpid()}_{self.count}"
        src = os.path.join(self.workdir, tag + ".onnx")
        out = os.path.join(self.workdir, tag + ".opt.onnx")
        out2 = os.path.join(self.workdir, tag + ".opt2.onnx")
        log = os.path.join(self.workdir, tag + ".log")
        res = Result(seed, "ok", nodes=len(model.graph.node))
        try:
            onnx.save(model, src)
            run = self.optimizer(src, out, log, self.timeout)
            res.t_opt = run.seconds
            res.cls, res.detail = classify(run, out)
            if res.cls != "ok":
                return res
            t0 = time.monotonic()
            try:
                optimized = onnx.load(out)
            except Exception as e:
                res.cls, res.detail = "mismatch", f"the output does not load: {str(e)[:200]}"
                return res
            cmp = C.compare(model, optimized, seed=seed or 0, trials=self.trials)
            res.t_cmp = time.monotonic() - t0
            res.ratio, res.reference = cmp.ratio, cmp.reference
            if cmp.input_fault:
                res.cls, res.detail = "generator-fault", cmp.detail
                return res
            if not cmp.ok:
                res.cls, res.detail = "mismatch", cmp.detail
                return res
            if self.determinism if check_determinism is None else check_determinism:
                fresh = self.fresh_every and self.count % self.fresh_every == 0 and self.worker is not None
                t1 = time.monotonic()
                run2 = run_fresh(taso_opt_argv(src, out2), self.timeout) if fresh else \
                    self.optimizer(src, out2, log, self.timeout)
                res.t_opt += time.monotonic() - t1
                c2, d2 = classify(run2, out2)
                how = "a new taso-opt process" if fresh else "the same process"
                if c2 != "ok":
                    res.cls, res.detail = "nondeterministic", f"second run ({how}): {c2}: {d2}"
                elif _bytes(out) != _bytes(out2):
                    res.cls, res.detail = "nondeterministic", f"second run ({how}) wrote different bytes"
            return res
        finally:
            for p in (src, out, out2, log):
                try:
                    os.remove(p)
                except OSError:
                    pass


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
