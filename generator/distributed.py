"""Rule generation on a Ray cluster (``taso-gen --cluster ray``): the generator's stages as Ray tasks,
each task's result checkpointed on disk, the rules file the same byte for byte for any number of
workers and shards and for a run interrupted and resumed.

Stages (each a set of Ray tasks; the driver writes each result to the checkpoint folder as it comes
back and frees it, and a resumed run submits only the tasks whose results are not there):

1. ``enumerate``, one task per shard: shard s of S enumerates the graphs whose first op is base op i
   with i % S == s (``Enumerator.run(s, S)``: every graph has exactly one first op). It returns its
   fingerprints and op sets, its op table (``Enumerator.table``: op ids are the worker's own), and its
   fingerprint table (distinct fingerprints and counts) cut into B buckets, contiguous ranges of the
   64-bit fingerprint space, one file each: no stage holds the fingerprints of more than one shard or
   one bucket.
2. ``group``, one task per bucket: the fingerprints of that range that two or more graphs share,
   summing every shard's counts.
3. ``members``, one task per shard: the shard's graphs with a shared fingerprint (``members_of``),
   rebuilt from its op table, one file per bucket.
4. ``pairs``, one task per bucket: candidate pairs, common-subgraph and transitivity pruning
   (``candidates.group_pairs``) over every shard's members of that bucket. Fingerprint classes are
   independent and buckets are ranges, so the buckets' pairs in bucket order are the pairs in the
   order the single-process generator has.
5. ``renaming``, 6. ``float``, 7. ``derive`` (with ``--derive-from``): chunks of ``CHUNK`` pairs in
   that order: the input-renaming keys (the driver keeps the first pair of each key), the
   floating-point test (its random generator advanced to the chunk's start: ``candidates.float_rng``)
   and derivability (``egraph.Deriver``).

The driver then states the constants' shapes and numbers the rules (``pipeline.build_records``, the
single-process code) and writes the file atomically. Every result depends on the configuration and
the run's shard, bucket and chunk sizes only, never on which worker ran it, when, or how often; the
final file depends on the configuration alone (its header has no times or job counts: those go to
the run report).

Tasks are retried by Ray where their worker dies (``max_retries``); a task that runs past the task
timeout is cancelled and submitted again, as often.
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
FORMAT = "taso-mlir ray checkpoint v1"
DEFAULT_SHARDS = 32
DEFAULT_BUCKETS = 16
#: pairs per task of the renaming, float and derive stages
CHUNK = 512
#: how often Ray retries a task whose worker died, and the driver one that ran past the task timeout
RETRIES = 3

INSTALL_HINT = "pip install 'taso-mlir[distributed]'"


class DistributedError(RuntimeError):
    """A one-line error of the distributed run (no Ray, an unreachable cluster, a failed task, a
    checkpoint of another run)."""


def bucket_of(fps: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each fingerprint: ``buckets`` contiguous ranges of the 64-bit space, in order."""
    return (((fps >> np.uint64(32)) * np.uint64(buckets)) >> np.uint64(32)).astype(np.int64)


# ---- the tasks (plain functions; ``_remote`` wraps them for Ray) ----

def _stats(t0: float, **kw) -> dict:
    return {"seconds": round(time.perf_counter() - t0, 3),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **kw}


def _test_hooks(hooks: dict, key: str):
    """Test hooks, once per task key (a marker file records the first attempt): ``kill`` ends the
    worker with SIGKILL (Ray retries the task), ``sleep`` sleeps that many seconds (past the task
    timeout: the driver cancels the task and submits it again)."""
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


def task_enumerate(cfg: Config, shard: int, shards: int, buckets: int, hooks: dict):
    _test_hooks(hooks, f"enumerate-{shard}")
    t0 = time.perf_counter()
    en = Enumerator(cfg)
    fps, ops = en.run(shard, shards)
    fa = np.frombuffer(fps, dtype=np.uint64).copy()
    oa = np.frombuffer(ops, dtype=np.int32).copy()
    del fps, ops
    u, c = np.unique(fa, return_counts=True)
    cuts = np.searchsorted(bucket_of(u, buckets), np.arange(buckets + 1))
    parts = {f"B{b:04d}": (u[cuts[b]:cuts[b + 1]], c[cuts[b]:cuts[b + 1]]) for b in range(buckets)}
    parts[""] = (fa, oa, en.table())
    return parts, _stats(t0, graphs=len(fa), ops=len(en.ops))


def task_group(*parts):
    t0 = time.perf_counter()
    us = [u for u, _ in parts]
    cs = [c for _, c in parts]
    u, inv = np.unique(np.concatenate(us), return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate(cs).astype(np.float64), minlength=len(u))
    shared = u[counts > 1]
    return {"": shared}, _stats(t0, distinct=len(u), shared=len(shared))


def task_members(graphs, wanted, buckets: int, hooks: dict, shard: int):
    _test_hooks(hooks, f"members-{shard}")
    t0 = time.perf_counter()
    fa, oa, table = graphs
    en = Enumerator.from_table(table)
    ms = C.members_of(en, fa, oa, wanted)
    parts = {f"B{b:04d}": [] for b in range(buckets)}
    if ms:
        for (fp, m), b in zip(ms, bucket_of(np.array([fp for fp, _ in ms], dtype=np.uint64), buckets)):
            parts[f"B{b:04d}"].append((fp, m))
    return parts, _stats(t0, members=len(ms))


def task_pairs(cfg: Config, *member_lists):
    t0 = time.perf_counter()
    members = [x for ms in member_lists for x in ms]
    pairs, n_cand, n_common = C.group_pairs(members, cfg)
    return {"": pairs}, _stats(t0, members=len(members), candidates=n_cand, after_common_subgraph=n_common,
                               after_transitivity=len(pairs))


def task_renaming(cfg: Config, pairs):
    t0 = time.perf_counter()
    return {"": C.renaming_keys(pairs, cfg)}, _stats(t0, pairs=len(pairs))


def task_float(cfg: Config, pairs, start: int):
    t0 = time.perf_counter()
    flags, msgs, regular = C.float_stage(pairs, cfg, C.float_rng(cfg, start))
    return {"": (flags, msgs, regular)}, _stats(t0, pairs=len(pairs), passed=sum(flags))


def task_derive(rewrites, work):
    from .egraph import Deriver
    t0 = time.perf_counter()
    d = Deriver(rewrites)
    flags = [d.derivable(a, b, shapes) for a, b, shapes in work]
    return {"": (flags, d.failed)}, _stats(t0, pairs=len(work), derivable=sum(flags))


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
        for suffix, obj in parts.items():
            self._write(self.root / stage / f"{task}{suffix}.pkl", pickle.dumps(obj, protocol=5))
        self._write(self.root / stage / f"{task}.done", json.dumps(stats, sort_keys=True).encode())

    def load(self, stage: str, task: str, suffix: str = ""):
        return pickle.loads((self.root / stage / f"{task}{suffix}.pkl").read_bytes())

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
    """Runs one stage's tasks on the cluster: at most ``window`` in flight, results saved as they
    come, done tasks skipped, tasks past ``timeout`` cancelled and submitted again."""

    def __init__(self, run: "Run", stage: str, fn, names: list, args, desc: str, unit: str, on_stats=None):
        self.run, self.stage, self.names, self.args, self.on_stats = run, stage, names, args, on_stats
        ray = run.ray
        self.fn = ray.remote(max_retries=RETRIES, num_cpus=1)(fn)
        self.desc, self.unit = desc, unit

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
        pending: dict = {}
        t0 = time.perf_counter()
        try:
            while todo or pending:
                while todo and len(pending) < run.window:
                    n = todo.pop(0)
                    attempts[n] += 1
                    pending[self.fn.remote(*self.args(n))] = (n, time.monotonic())
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    n, _t = pending.pop(ref)
                    parts, stats = self._get(ref, n)
                    ck.save(self.stage, n, parts, stats)
                    del parts
                    run.task_stats.setdefault(self.stage, []).append(stats)
                    if self.on_stats:
                        self.on_stats(stats, bar)
                    bar.update(1)
                if run.task_timeout:
                    now = time.monotonic()
                    for ref, (n, t) in list(pending.items()):
                        if now - t <= run.task_timeout:
                            continue
                        ray.cancel(ref, force=True)
                        del pending[ref]
                        run.timeouts += 1
                        if attempts[n] > RETRIES:
                            raise DistributedError(f"{self.stage} task {n} ran past the task timeout "
                                                   f"({run.task_timeout:g} s) {attempts[n]} times")
                        todo.insert(0, n)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            bar.close()
        run.times[self.stage] = time.perf_counter() - t0

    def _get(self, ref, name):
        ray = self.run.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None) or e
            msg = " ".join(str(cause).split())[:300]
            raise DistributedError(f"{self.stage} task {name} failed: {type(cause).__name__}: {msg}") from None
        except ray.exceptions.RayError as e:
            msg = " ".join(str(e).split())[:300]
            raise DistributedError(f"{self.stage} task {name} failed after {RETRIES} retries: "
                                   f"{type(e).__name__}: {msg}") from None


class Run:
    def __init__(self, ray, ck: Checkpoint, cfg: Config, shards: int, buckets: int, task_timeout, progress,
                 log, hooks: dict):
        self.ray, self.ck, self.cfg, self.shards, self.buckets = ray, ck, cfg, shards, buckets
        self.task_timeout, self.progress, self.log, self.hooks = task_timeout, progress, log, hooks
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        self.window = max(1, self.cpus)
        self.times: dict = {}
        self.task_stats: dict = {}
        self.resumed = 0
        self.timeouts = 0

    def bar(self, total, desc, unit):
        from tqdm import tqdm
        import sys
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not self.progress, leave=False)

    def stage(self, *a, **kw):
        _Stage(self, *a, **kw).go()

    def chunks(self, stage, fn, items: list, args, desc, on_stats=None) -> list:
        """Run ``fn(*args(k, chunk))`` over the ``CHUNK``-sized chunks of ``items``; their results in order."""
        names = [f"C{k:05d}" for k in range((len(items) + CHUNK - 1) // CHUNK)]

        def chunk_args(name):
            k = int(name[1:])
            return args(k, items[k * CHUNK:(k + 1) * CHUNK])
        self.stage(stage, fn, names, chunk_args, desc, "chunk", on_stats)
        return [self.ck.load(stage, name) for name in names]


def identity(cfg: Config, shards: int, buckets: int, derive_from: str | None) -> dict:
    files = []
    for p in (derive_from or "").split(","):
        if p:
            files.append([Path(p).name, hashlib.sha256(Path(p).read_bytes()).hexdigest()])
    return {"format": FORMAT, "config": cfg.to_json(), "shards": shards, "buckets": buckets, "chunk": CHUNK,
            "derive_from": files}


def generate(cfg: Config, cluster: str | None = None, cpus: int = 2, shards: int = DEFAULT_SHARDS,
             buckets: int = DEFAULT_BUCKETS, checkpoint=None, task_timeout: float | None = None,
             derive_from: str | None = None, progress: bool = True, log=print) -> tuple[dict, list[dict], dict]:
    """Run the generator on Ray (``cluster``: None for a local runtime of ``cpus`` workers, else the
    address of a running cluster). ``checkpoint``: the folder of the per-task results (resumed where
    it holds some of this run's; None: a temporary folder, removed after). Returns the library header
    (the configuration's alone), the records, and the run's report (times, tasks, throughput)."""
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
            return _generate(Run(ray, ck, cfg, shards, buckets, task_timeout, progress, log, hooks), derive_from)
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
    # 1. enumerate
    run.stage("enumerate", task_enumerate, shard_names, lambda n: (cfg_ref, int(n[1:]), S, B, run.hooks),
              f"enumerating (N={cfg.max_ops}, {S} shards, {run.cpus} workers)", "shard", count("graphs", "graphs"))
    n_graphs = tot["graphs"]
    # 2. group by fingerprint, per bucket
    run.stage("group", task_group, bucket_names,
              lambda n: tuple(ck.load("enumerate", s, n) for s in shard_names),
              "grouping fingerprints", "bucket", count("shared", "shared"))
    wanted = np.concatenate([ck.load("group", b) for b in bucket_names])
    wanted_ref = ray.put(wanted)
    # 3. members, per shard
    run.stage("members", task_members, shard_names,
              lambda n: (ck.load("enumerate", n), wanted_ref, B, run.hooks, int(n[1:])),
              "rebuilding shared graphs", "shard", count("members", "graphs"))
    log(f"enumerated {n_graphs} graphs in {run.times['enumerate']:.1f} s on {run.cpus} workers; "
        f"{tot['members']} share a fingerprint with another graph")
    del wanted, wanted_ref
    # 4. candidate pairs, common-subgraph and transitivity pruning, per bucket
    run.stage("pairs", task_pairs, bucket_names,
              lambda n: (cfg_ref,) + tuple(ck.load("members", s, n) for s in shard_names),
              "pairing", "bucket", count("candidates", "candidates"))
    counts = {"graphs": n_graphs}
    for key in ("candidates", "after_common_subgraph", "after_transitivity"):
        counts[key] = sum(ck.stats("pairs", b)[key] for b in bucket_names)
    pairs = [p for b in bucket_names for p in ck.load("pairs", b)]
    log(f"  {counts['candidates']} candidate pairs, {counts['after_common_subgraph']} after common-subgraph "
        f"pruning, {counts['after_transitivity']} after transitivity pruning")
    # 5. input renaming
    keys = [k for ks in run.chunks("renaming", task_renaming, pairs, lambda k, ch: (cfg_ref, ch),
                                   "renaming keys") for k in ks]
    kept = C.drop_renamings(pairs, keys)
    del pairs, keys
    counts["after_renaming"] = len(kept)
    log(f"  {len(kept)} after input-renaming pruning")
    # 6. the floating-point test
    res = run.chunks("float", task_float, kept, lambda k, ch: (cfg_ref, ch, k * CHUNK), "floating-point test")
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
            rw_ref = ray.put(rewrites)
            work = [(c.a, c.b, {v: inputs[v][0] for v in set(c.a.inputs()) | set(c.b.inputs())}) for c in cs]
            out = run.chunks("derive", task_derive, work, lambda k, ch: (rw_ref, ch), "derivability (e-graph)")
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
    busy = sum(s["seconds"] for s in shard_stats)
    rss = [s.get("max_rss_mb", 0) for st in run.task_stats.values() for s in st]
    return {
        "workers": run.cpus, "shards": run.shards, "buckets": run.buckets, "chunk": CHUNK,
        "times_s": {k: round(v, 2) for k, v in run.times.items()},
        "tasks_resumed": run.resumed, "tasks_timed_out": run.timeouts,
        "enumerate": {"graphs": n_graphs, "shard_seconds_sum": round(busy, 2),
                      "shard_seconds_max": max((s["seconds"] for s in shard_stats), default=0),
                      "graphs_per_worker_second": round(n_graphs / busy) if busy else None,
                      "shards": [[s["graphs"], s["seconds"]] for s in shard_stats]},
        "worker_max_rss_mb": max(rss, default=None),
    }
