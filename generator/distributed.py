"""Rule generation on a Ray cluster (``taso-gen --cluster ray``): the generator's stages as tasks on Ray
actors (one ``Worker`` per core), each task's result checkpointed on disk, the rules file the same
byte for byte for any number of workers and shards and for a run interrupted and resumed.

Stages (the driver writes each result to the checkpoint folder as it comes back, and a resumed run
submits only the tasks whose results are not there):

1. ``enumerate``, one task per shard: shard s of S enumerates the graphs whose first op is base op i
   with i % S == s (``Enumerator.run(s, S)``: every graph has exactly one first op). It returns its
   fingerprints and op sets with its op table (``Enumerator.table``: op ids are the worker's own), and
   its fingerprint table (distinct fingerprints and counts) cut into B buckets, contiguous ranges of
   the 64-bit fingerprint space, one part each: no task holds the fingerprints of more than one shard
   or one bucket. The worker keeps the shard's graphs and ops (``Enumerator.compact``: no tensor
   values) for stage 3.
2. ``group``, one task per bucket: the fingerprints of that range that two or more graphs share,
   summing every shard's counts.
3. ``members``, one task per shard, on the worker that kept it: the shard's graphs with a shared
   fingerprint (``members_of``), one part per bucket. A shard no worker holds (its worker restarted,
   the run resumed, the worker's memory allowance full) is rebuilt from its saved op table instead, on
   any worker: the same graphs.
4. ``pairs``, one task per bucket: candidate pairs, common-subgraph and transitivity pruning
   (``candidates.group_pairs``) over every shard's members of that bucket, and each pair's
   input-renaming key. Fingerprint classes are independent and buckets are ranges, so the buckets'
   pairs in bucket order are the pairs in the order the single-process generator has; the driver keeps
   the first pair of each renaming key.
5. ``float`` and 6. ``derive`` (with ``--derive-from``): chunks of pairs in that order: the
   floating-point test (its random generator advanced to the chunk's start: ``candidates.float_rng``)
   and derivability (``egraph.Deriver``, built once per worker).

Every result part travels pickled once: the worker that makes it pickles it, the driver writes those
bytes to the checkpoint and passes this run's object reference (or, resumed, the file's bytes) to the
tasks of the next stage, which unpickle it. The driver then states the constants' shapes and numbers
the rules (``pipeline.build_records``, the single-process code) and writes the file atomically. Every
result depends on the configuration and the run's shard, bucket and chunk sizes only, never on which
worker ran it, when, or how often; the final file depends on the configuration alone (its header has
no times or job counts: those go to the run report).

A task whose worker dies is submitted again (the worker restarts, keeping nothing); one that runs past
the task timeout too, its worker restarted.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import resource
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

from . import candidates as C
from . import pipeline
from .enumerate import Config, Enumerator

#: the checkpoint folder's format (its run.json)
FORMAT = "taso-mlir ray checkpoint v2"
DEFAULT_SHARDS = 32
DEFAULT_BUCKETS = 16
#: pairs per task of the float stage, and of the derive stage (whose pairs take longer and vary more)
CHUNK = 512
DERIVE_CHUNK = 128
#: how often Ray retries a task whose worker died, and the driver one that ran past the task timeout
RETRIES = 3

INSTALL_HINT = "pip install 'taso-mlir[distributed]'"


class DistributedError(RuntimeError):
    """A one-line error of the distributed run (no Ray, an unreachable cluster, a failed task, a
    checkpoint of another run)."""


def bucket_of(fps: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each fingerprint: ``buckets`` contiguous ranges of the 64-bit space, in order."""
    return (((fps >> np.uint64(32)) * np.uint64(buckets)) >> np.uint64(32)).astype(np.int64)


# ---- the workers ----

def _stats(t0: float, **kw) -> dict:
    return {"seconds": round(time.perf_counter() - t0, 3),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **kw}


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _rss_mb() -> float:
    """This process's resident memory now (Linux; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def default_hold_mb() -> float:
    """How much memory a worker may fill with the enumerations it keeps for the rebuild: half its
    node's memory, shared by one worker per core."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0
    return total / 2 / (os.cpu_count() or 1)


def _test_hooks(hooks: dict, key: str):
    """Test hooks, once per task key (a marker file records the first attempt): ``kill`` ends the
    worker with SIGKILL (the driver submits the task again, the worker restarts with nothing kept),
    ``sleep`` sleeps that many seconds (past the task timeout: the driver restarts the worker and
    submits the task again)."""
    for what, (keys, mark_dir) in hooks.items():
        if key not in keys:
            continue
        mark = Path(mark_dir) / f"test-{what}-{key}"
        if mark.exists():
            continue
        mark.write_text("")
        if what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif what == "sleep":
            time.sleep(3600)


def _members_parts(en, fa, oa, wanted, buckets: int, t0: float, rebuilt: bool) -> tuple:
    ms = C.members_of(en, fa, oa, wanted)
    parts = [[] for _ in range(buckets)]
    if ms:
        for x, b in zip(ms, bucket_of(np.array([fp for fp, _ in ms], dtype=np.uint64), buckets)):
            parts[b].append(x)
    return (_stats(t0, members=len(ms), rebuilt=rebuilt),) + tuple(_dumps(p) for p in parts)


def _no_gc(method):
    """Run a worker's task with the cyclic garbage collector off: the tasks build and unpickle millions
    of small acyclic objects (graphs, ops), and the collections that allocation triggers, each walking
    every object the worker keeps, cost more than the tasks (8x for a bucket's members unpickled). The
    shards a worker keeps are frozen out of later collections (``gc.freeze``)."""
    import functools
    import gc

    @functools.wraps(method)
    def run(self, *args, **kw):
        was = gc.isenabled()
        gc.disable()
        try:
            return method(self, *args, **kw)
        finally:
            if was:
                gc.enable()
    return run


class Worker:
    """One Ray actor per core. Every task returns its statistics then its result parts, each already
    pickled (bytes: the driver writes them to the checkpoint as they are and the next stage's tasks
    take them, as object references where this run made them, so nothing is unpickled and pickled
    again on the way). The worker keeps each shard it enumerated (the op table and the graphs, no
    tensor values) for the rebuild of its shared graphs, within ``hold_mb`` of memory; a shard it does
    not hold (a worker restarted, a resumed run, memory) is rebuilt from the checkpoint's op table."""

    def __init__(self, hold_mb: float | None = None):
        self.hold_mb = default_hold_mb() if hold_mb is None else hold_mb
        self.held: dict = {}
        self.derivers: dict = {}

    def ping(self) -> int:
        return os.getpid()

    @_no_gc
    def enumerate(self, cfg: Config, shard: int, shards: int, buckets: int, hooks: dict) -> tuple:
        """Shard ``shard`` of ``shards``: its graphs and op table (part ""), then its fingerprint
        table (distinct fingerprints, counts) cut into ``buckets`` ranges."""
        _test_hooks(hooks, f"enumerate-{shard}")
        t0 = time.perf_counter()
        en = Enumerator(cfg)
        fps, ops = en.run(shard, shards)
        fa = np.frombuffer(fps, dtype=np.uint64).copy()
        oa = np.frombuffer(ops, dtype=np.int32).copy()
        del fps, ops
        en.fps = en.graph_ops = None
        u, c = np.unique(fa, return_counts=True)
        cuts = np.searchsorted(bucket_of(u, buckets), np.arange(buckets + 1))
        parts = (_dumps((fa, oa, en.table())),) + tuple(
            _dumps((u[cuts[b]:cuts[b + 1]], c[cuts[b]:cuts[b + 1]])) for b in range(buckets))
        n_ops = len(en.ops)
        en = en.compact()
        held = _rss_mb() <= self.hold_mb
        if held:
            self.held[shard] = (en, fa, oa)
            import gc
            gc.collect()
            gc.freeze()
        return (_stats(t0, graphs=len(fa), ops=n_ops, held=held),) + parts

    @_no_gc
    def members(self, shard: int, wanted, buckets: int, hooks: dict) -> tuple:
        """The shard's graphs whose fingerprint is in ``wanted``, one part per bucket, from the
        enumeration this worker kept; None in every place where it has none (the driver then asks
        for ``members_from_table``)."""
        _test_hooks(hooks, f"members-{shard}")
        t0 = time.perf_counter()
        got = self.held.pop(shard, None)
        if got is None:
            return (None,) * (1 + buckets)
        return _members_parts(*got, wanted, buckets, t0, rebuilt=False)

    @_no_gc
    def members_from_table(self, graphs: bytes, wanted, buckets: int, hooks: dict, shard: int) -> tuple:
        """``members``, rebuilding the shard from the op table its enumeration saved."""
        _test_hooks(hooks, f"members-{shard}")
        t0 = time.perf_counter()
        self.held.pop(shard, None)
        fa, oa, table = pickle.loads(graphs)
        return _members_parts(Enumerator.from_table(table), fa, oa, wanted, buckets, t0, rebuilt=True)

    @_no_gc
    def group(self, *parts: bytes) -> tuple:
        """The fingerprints of one bucket that two or more graphs share (every shard's counts summed)."""
        t0 = time.perf_counter()
        tables = [pickle.loads(p) for p in parts]
        u, inv = np.unique(np.concatenate([u for u, _ in tables]), return_inverse=True)
        counts = np.bincount(inv, weights=np.concatenate([c for _, c in tables]).astype(np.float64),
                             minlength=len(u))
        shared = u[counts > 1]
        return _stats(t0, distinct=len(u), shared=len(shared)), _dumps(shared)

    @_no_gc
    def pairs(self, cfg: Config, *member_parts: bytes) -> tuple:
        """One bucket's candidate pairs after common-subgraph and transitivity pruning, with each
        pair's input-renaming key."""
        t0 = time.perf_counter()
        members = [x for p in member_parts for x in pickle.loads(p)]
        pairs, n_cand, n_common = C.group_pairs(members, cfg)
        del members
        keys = C.renaming_keys(pairs, cfg)
        return (_stats(t0, candidates=n_cand, after_common_subgraph=n_common, after_transitivity=len(pairs)),
                _dumps((pairs, keys)))

    @_no_gc
    def float_test(self, cfg: Config, pairs: bytes, start: int) -> tuple:
        t0 = time.perf_counter()
        ps = pickle.loads(pairs)
        flags, msgs, regular = C.float_stage(ps, cfg, C.float_rng(cfg, start))
        return _stats(t0, pairs=len(ps), passed=sum(flags)), _dumps((flags, msgs, regular))

    @_no_gc
    def derive(self, key: str, rewrites: list, work: bytes) -> tuple:
        """Derivability of a chunk of candidates; ``rewrites``: [an object reference to the rewrites],
        fetched once per worker (``key`` names them)."""
        from .egraph import Deriver
        t0 = time.perf_counter()
        d = self.derivers.get(key)
        if d is None:
            import ray
            d = self.derivers[key] = Deriver(ray.get(rewrites[0]))
        before = d.failed
        flags = [d.derivable(a, b, shapes) for a, b, shapes in pickle.loads(work)]
        return _stats(t0, pairs=len(flags), derivable=sum(flags)), _dumps((flags, d.failed - before))


# ---- the checkpoint folder ----

class Checkpoint:
    """``root/run.json`` (what the run is: configuration, shards, buckets, chunk, derive-from files),
    and per stage and task ``root/<stage>/<task><part>.pkl`` then ``<task>.done`` (its statistics,
    written last: a task is done when its marker is there). Every file is written atomically."""

    def __init__(self, root: Path, identity: dict):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        run = root / "run.json"
        if run.exists():
            try:
                old = json.loads(run.read_text())
            except (OSError, ValueError):
                old = None
            if old != identity:
                diff = sorted(k for k in set(identity) | set(old or {}) if (old or {}).get(k) != identity.get(k))
                raise DistributedError(f"{root} holds a run with other settings ({', '.join(diff) or 'unreadable'}); "
                                       "give another --checkpoint folder or delete it")
        else:
            self._write(run, json.dumps(identity, sort_keys=True, indent=1).encode())

    def _write(self, path: Path, data: bytes):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def done(self, stage: str, task: str) -> bool:
        return (self.root / stage / f"{task}.done").exists()

    def stats(self, stage: str, task: str) -> dict:
        return json.loads((self.root / stage / f"{task}.done").read_text())

    def save(self, stage: str, task: str, parts: dict, stats: dict):
        """``parts``: {suffix: the pickled result}."""
        for suffix, data in parts.items():
            self._write(self.root / stage / f"{task}{suffix}.pkl", data)
        self._write(self.root / stage / f"{task}.done", json.dumps(stats, sort_keys=True).encode())

    def raw(self, stage: str, task: str, suffix: str = "") -> bytes:
        return (self.root / stage / f"{task}{suffix}.pkl").read_bytes()

    def load(self, stage: str, task: str, suffix: str = ""):
        return pickle.loads(self.raw(stage, task, suffix))

    def write_report(self, report: dict):
        self._write(self.root / "report.json", json.dumps(report, sort_keys=True, indent=1).encode())


# ---- Ray ----

def _ray():
    try:
        import ray
    except ImportError:
        raise DistributedError(f"--cluster ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def connect(address: str | None, cpus: int):
    """Start a local Ray runtime of ``cpus`` workers (``address`` None) or connect to a cluster
    (``ray://HOST:PORT``, or an address Ray's own ``ray start`` printed). Where this process is
    connected to Ray already, that runtime is used as it is. Returns the ray module and whether this
    call started it (and so should shut it down)."""
    ray = _ray()
    if ray.is_initialized():
        return ray, False
    import logging
    import warnings
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kw = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
    if address is not None:
        _probe(address)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if address is None:
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, **kw)
            else:
                ray.init(address=address, **kw)
    except Exception as e:  # (ConnectionError, RuntimeError, ValueError, grpc's errors...)
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
        raise DistributedError(f"cannot start or reach {where}: {msg}") from None
    return ray, True


def _probe(address: str, timeout: float = 10.0):
    """A one-line error at once where nothing listens at a ``ray://HOST:PORT`` (Ray Client waits 30 s)."""
    import socket
    from urllib.parse import urlsplit
    try:
        u = urlsplit(address)
        host, port = u.hostname, u.port
    except ValueError:
        host = port = None
    if u.scheme != "ray" or not host or not port:
        raise DistributedError(f"--cluster {address}: give ray://HOST:PORT (the Ray Client port of the head node, "
                               "10001 by default)")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise DistributedError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


class _Stage:
    """Runs one stage's tasks on the workers: one task per idle worker (``where``: the worker a task
    must run on, or None for any), results saved as they come, done tasks skipped; a task whose worker
    died is submitted again, and one that ran past ``timeout`` too, its worker restarted."""

    def __init__(self, run: "Run", stage: str, names: list, call, suffixes: list, desc: str, unit: str,
                 on_stats=None, keep=(), where=None, on_missing=None, on_done=None):
        self.run, self.stage, self.names, self.call, self.suffixes = run, stage, names, call, suffixes
        self.desc, self.unit, self.on_stats, self.keep = desc, unit, on_stats, set(keep)
        self.where = where or (lambda n: None)
        self.on_missing, self.on_done = on_missing, on_done

    def go(self):
        run, ray, ck = self.run, self.run.ray, self.run.ck
        todo = [n for n in self.names if not ck.done(self.stage, n)]
        resumed = len(self.names) - len(todo)
        run.resumed += resumed
        bar = run.bar(len(self.names), self.desc, self.unit)
        for n in self.names:
            if n not in todo and self.on_stats:
                self.on_stats(ck.stats(self.stage, n), bar)
        bar.update(resumed)
        attempts = {n: 0 for n in todo}
        pending: dict = {}  # stats ref -> (task, worker, start, part refs)
        idle = list(range(len(run.workers)))
        t0 = time.perf_counter()
        try:
            while todo or pending:
                for w in list(idle):
                    n = next((n for n in todo if self.where(n) in (None, w)), None)
                    if n is None:
                        continue
                    todo.remove(n)
                    idle.remove(w)
                    attempts[n] += 1
                    method, args = self.call(n, attempts[n])
                    refs = getattr(run.workers[w], method).options(
                        num_returns=1 + len(self.suffixes)).remote(*args)
                    pending[refs[0]] = (n, w, time.monotonic(), refs[1:])
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    n, w, _t, refs = pending.pop(ref)
                    idle.append(w)
                    stats = self._get(ref, n, attempts)
                    if stats is False:  # the worker died: again
                        todo.insert(0, n)
                        continue
                    if stats is None:  # the worker lacks what the task needs: ask in another way
                        attempts[n] -= 1
                        self.on_missing(n)
                        todo.insert(0, n)
                        continue
                    ck.save(self.stage, n, dict(zip(self.suffixes, ray.get(refs))), stats)
                    for suffix, r in zip(self.suffixes, refs):
                        if suffix in self.keep:
                            run.refs[(self.stage, n, suffix)] = r
                    del refs
                    run.task_stats.setdefault(self.stage, []).append(stats)
                    if self.on_done:
                        self.on_done(n, w, stats)
                    if self.on_stats:
                        self.on_stats(stats, bar)
                    bar.update(1)
                if run.task_timeout:
                    now = time.monotonic()
                    for ref, (n, w, t, _refs) in list(pending.items()):
                        if now - t <= run.task_timeout:
                            continue
                        ray.kill(run.workers[w], no_restart=False)  # restarted, keeping nothing
                        del pending[ref]
                        idle.append(w)
                        run.timeouts += 1
                        if attempts[n] > RETRIES:
                            raise DistributedError(f"{self.stage} task {n} ran past the task timeout "
                                                   f"({run.task_timeout:g} s) {attempts[n]} times")
                        todo.insert(0, n)
        finally:
            for ref in pending:
                ray.cancel(ref)
            bar.close()
        run.times[self.stage] = time.perf_counter() - t0

    def _get(self, ref, name, attempts):
        """The task's statistics (None: the worker lacked what it needs; False: the worker died and the
        task may run again)."""
        ray = self.run.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None) or e
            msg = " ".join(str(cause).split())[:300]
            raise DistributedError(f"{self.stage} task {name} failed: {type(cause).__name__}: {msg}") from None
        except ray.exceptions.RayError as e:  # the worker died (it restarts), an object was lost, ...
            if attempts[name] <= RETRIES:
                self.run.retried += 1
                return False
            msg = " ".join(str(e).split())[:300]
            raise DistributedError(f"{self.stage} task {name} failed after {RETRIES} retries: "
                                   f"{type(e).__name__}: {msg}") from None


class Run:
    def __init__(self, ray, ck: Checkpoint, cfg: Config, shards: int, buckets: int, task_timeout, progress,
                 log, hooks: dict, hold_mb: float | None):
        self.ray, self.ck, self.cfg, self.shards, self.buckets = ray, ck, cfg, shards, buckets
        self.task_timeout, self.progress, self.log, self.hooks = task_timeout, progress, log, hooks
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)(Worker)
        self.workers = [actor.remote(hold_mb) for _ in range(self.cpus)]
        self.times: dict = {}
        self.task_stats: dict = {}
        self.refs: dict = {}  # (stage, task, suffix) -> this run's object reference to that result part
        self.resumed = 0
        self.timeouts = 0
        self.retried = 0

    def close(self):
        self.refs.clear()
        for w in self.workers:
            try:
                self.ray.kill(w, no_restart=True)
            except Exception:  # (already gone)
                pass

    def part(self, stage: str, task: str, suffix: str, attempt: int):
        """A task's result part as a task's argument: this run's object reference on the first attempt
        (the worker fetches it from where it was made), else the checkpoint's bytes."""
        ref = self.refs.get((stage, task, suffix)) if attempt == 1 else None
        return ref if ref is not None else self.ck.raw(stage, task, suffix)

    def drop(self, stage: str):
        for k in [k for k in self.refs if k[0] == stage]:
            del self.refs[k]

    def bar(self, total, desc, unit):
        from tqdm import tqdm
        import sys
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not self.progress, leave=False)

    def stage(self, *a, **kw):
        _Stage(self, *a, **kw).go()

    def chunks(self, stage, method, items: list, size: int, args, desc, on_stats=None) -> list:
        """Run ``method(*args(k, chunk))`` over the ``size``-sized chunks of ``items`` (a chunk given
        pickled); their results in order."""
        names = [f"C{k:05d}" for k in range((len(items) + size - 1) // size)]

        def call(name, attempt):
            k = int(name[1:])
            return method, args(k, _dumps(items[k * size:(k + 1) * size]))
        self.stage(stage, names, call, [""], desc, "chunk", on_stats)
        return [self.ck.load(stage, name) for name in names]


def identity(cfg: Config, shards: int, buckets: int, derive_from: str | None) -> dict:
    files = []
    for p in (derive_from or "").split(","):
        if p:
            files.append([Path(p).name, hashlib.sha256(Path(p).read_bytes()).hexdigest()])
    return {"format": FORMAT, "config": cfg.to_json(), "shards": shards, "buckets": buckets, "chunk": CHUNK,
            "derive_chunk": DERIVE_CHUNK, "derive_from": files}


def generate(cfg: Config, cluster: str | None = None, cpus: int = 2, shards: int = DEFAULT_SHARDS,
             buckets: int = DEFAULT_BUCKETS, checkpoint=None, task_timeout: float | None = None,
             derive_from: str | None = None, progress: bool = True, log=print,
             hold_mb: float | None = None) -> tuple[dict, list[dict], dict]:
    """Run the generator on Ray (``cluster``: None for a local runtime of ``cpus`` workers, else the
    address of a running cluster). ``checkpoint``: the folder of the per-task results (resumed where
    it holds some of this run's; None: a temporary folder, removed after). ``hold_mb``: the memory a
    worker may fill with the shards it keeps for the rebuild (default: half its node's memory over its
    cores; 0: keep none, rebuild every shard from its op table). Returns the library header (the
    configuration's alone), the records, and the run's report (times, tasks, throughput)."""
    if shards < 1 or buckets < 1:
        raise DistributedError("--shards and --buckets must be at least 1")
    ident = identity(cfg, shards, buckets, derive_from)
    tmp = None
    if checkpoint is None:
        tmp = tempfile.mkdtemp(prefix="taso-gen-ray-")
        checkpoint = tmp
    try:
        ck = Checkpoint(Path(checkpoint), ident)
        hooks = {}
        for what in ("kill", "sleep"):
            keys = os.environ.get(f"TASO_GEN_TEST_{what.upper()}")
            if keys:
                hooks[what] = (tuple(keys.split(",")), str(ck.root))
        ray, owned = connect(cluster, cpus)
        try:
            run = Run(ray, ck, cfg, shards, buckets, task_timeout, progress, log, hooks, hold_mb)
            try:
                return _generate(run, derive_from)
            finally:
                run.close()
        finally:
            if owned:
                ray.shutdown()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _generate(run: Run, derive_from) -> tuple[dict, list[dict], dict]:
    cfg, ck, ray, S, B = run.cfg, run.ck, run.ray, run.shards, run.buckets
    log = run.log
    t_start = time.perf_counter()
    shard_names = [f"S{s:04d}" for s in range(S)]
    bucket_names = [f"B{b:04d}" for b in range(B)]
    tot = {"graphs": 0}

    def count(key, label):
        def on(stats, bar):
            tot[key] = tot.get(key, 0) + stats.get(key, 0)
            bar.set_postfix({label: tot[key]}, refresh=False)
        return on

    cfg_ref = ray.put(cfg)
    # 1. enumerate; a worker keeps the shards it enumerated
    owner: dict = {}

    def enumerated(n, w, stats):
        if stats.get("held"):
            owner[n] = w
    run.stage("enumerate", shard_names, lambda n, a: ("enumerate", (cfg_ref, int(n[1:]), S, B, run.hooks)),
              [""] + bucket_names, f"enumerating (N={cfg.max_ops}, {S} shards, {run.cpus} workers)", "shard",
              count("graphs", "graphs"), keep=bucket_names, on_done=enumerated)
    n_graphs = tot["graphs"]
    # 2. group by fingerprint, per bucket
    run.stage("group", bucket_names,
              lambda n, a: ("group", tuple(run.part("enumerate", s, n, a) for s in shard_names)),
              [""], "grouping fingerprints", "bucket", count("shared", "shared"))
    run.drop("enumerate")
    wanted_ref = ray.put(np.concatenate([ck.load("group", b) for b in bucket_names]))
    # 3. members, per shard: by the worker that kept the shard, else rebuilt from its op table
    rebuild: set = set()

    def members_call(n, a):
        if n in owner and n not in rebuild:
            return "members", (int(n[1:]), wanted_ref, B, run.hooks)
        return "members_from_table", (ck.raw("enumerate", n), wanted_ref, B, run.hooks, int(n[1:]))
    run.stage("members", shard_names, members_call, bucket_names, "rebuilding shared graphs", "shard",
              count("members", "graphs"), keep=bucket_names,
              where=lambda n: owner[n] if n in owner and n not in rebuild else None, on_missing=rebuild.add)
    del wanted_ref
    log(f"enumerated {n_graphs} graphs in {run.times['enumerate']:.1f} s on {run.cpus} workers; "
        f"{tot['members']} share a fingerprint with another graph")
    # 4. candidate pairs, common-subgraph and transitivity pruning, renaming keys, per bucket
    run.stage("pairs", bucket_names,
              lambda n, a: ("pairs", (cfg_ref,) + tuple(run.part("members", s, n, a) for s in shard_names)),
              [""], "pairing", "bucket", count("candidates", "candidates"))
    run.drop("members")
    counts = {"graphs": n_graphs}
    for key in ("candidates", "after_common_subgraph", "after_transitivity"):
        counts[key] = sum(ck.stats("pairs", b)[key] for b in bucket_names)
    pairs, keys = [], []
    for b in bucket_names:
        ps, ks = ck.load("pairs", b)
        pairs += ps
        keys += ks
    log(f"  {counts['candidates']} candidate pairs, {counts['after_common_subgraph']} after common-subgraph "
        f"pruning, {counts['after_transitivity']} after transitivity pruning")
    # 5. input renaming: the first pair of each key (keys computed with the pairs)
    kept = C.drop_renamings(pairs, keys)
    del pairs, keys
    counts["after_renaming"] = len(kept)
    log(f"  {len(kept)} after input-renaming pruning")
    # 6. the floating-point test
    res = run.chunks("float", "float_test", kept, CHUNK, lambda k, ch: (cfg_ref, ch, k * CHUNK),
                     "floating-point test")
    if all(regular for _, _, regular in res):
        flags = [f for fl, _, _ in res for f in fl]
        msgs = [m for _, ms, _ in res for m in ms]
    else:  # a candidate that does not type-check drew nothing: the chunks' generators are off; in order here
        flags, msgs, _ = C.float_stage(kept, cfg, C.float_rng(cfg))
    for m in msgs:
        log(m)
    cands = [c for c, ok in zip(kept, flags) if ok]
    counts["after_float_test"] = len(cands)
    log(f"  {len(cands)} after the floating-point test")
    # 7. derivability
    derived_from = None
    if derive_from:
        def derive(cs, inputs, rewrites):
            rw = [ray.put(rewrites)]  # (in a list: a worker fetches it once, not with every chunk)
            work = [(c.a, c.b, {v: inputs[v][0] for v in set(c.a.inputs()) | set(c.b.inputs())}) for c in cs]
            out = run.chunks("derive", "derive", work, DERIVE_CHUNK, lambda k, ch: ("rewrites", rw, ch),
                             "derivability (e-graph)")
            dflags = [f for fl, _ in out for f in fl]
            return [c for c, d in zip(cs, dflags) if not d], sum(f for _, f in out)
        cands, derived_from = pipeline.derive_stage(cfg, cands, counts, derive_from, log, derive)
    # the records, in the driver (symbolic constant shapes draw from one generator in order)
    t = time.perf_counter()
    records = pipeline.build_records(cfg, cands, counts, log)
    run.times["records"] = time.perf_counter() - t
    run.times["total"] = time.perf_counter() - t_start
    header = pipeline.library_header(cfg, counts, derived_from)
    report = _report(run, n_graphs)
    ck.write_report(report)
    return header, records, report


def _report(run: Run, n_graphs: int) -> dict:
    """The run's times and tasks; per-shard enumeration costs, the throughput per worker."""
    ck = run.ck
    shard_stats = [ck.stats("enumerate", f"S{s:04d}") for s in range(run.shards)]
    member_stats = [ck.stats("members", f"S{s:04d}") for s in range(run.shards)]
    busy = sum(s["seconds"] for s in shard_stats)
    rss = [s.get("max_rss_mb", 0) for st in run.task_stats.values() for s in st]
    return {
        "workers": run.cpus, "shards": run.shards, "buckets": run.buckets, "chunk": CHUNK,
        "times_s": {k: round(v, 2) for k, v in run.times.items()},
        "tasks_resumed": run.resumed, "tasks_timed_out": run.timeouts, "tasks_retried": run.retried,
        "shards_rebuilt_from_table": sum(bool(s.get("rebuilt")) for s in member_stats),
        "enumerate": {"graphs": n_graphs, "shard_seconds_sum": round(busy, 2),
                      "shard_seconds_max": max((s["seconds"] for s in shard_stats), default=0),
                      "graphs_per_worker_second": round(n_graphs / busy) if busy else None,
                      "shards": [[s["graphs"], s["seconds"]] for s in shard_stats]},
        "worker_max_rss_mb": max(rss, default=None),
    }
