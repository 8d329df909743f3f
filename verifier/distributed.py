"""Z3 proofs and shape fuzzing on a Ray cluster (``taso-verify --cluster ray``): the rules in chunks as
tasks on Ray actors, one ``Verifier`` per CPU of the cluster, each with one ``prove.Prover``; the results
are the ones ``prove.prove_many`` and the local fuzzing loop give, in rule order. (A proof's axiom list,
Z3's unsat core, can depend on the rules the same prover proved before, as in ``prove_many``'s worker
processes; each rule's shape fuzzing is independent of the rules fuzzed before it: ``fuzz_rule``.)

Time limits. A rule keeps its Z3 timeout, and the hard wall-clock budget ``prove_many`` gives it,
``2 * timeout + 5`` seconds; a task of k rules may take k budgets. A task's clock starts when it is
submitted to an actor known to be ready (its ``ping`` answered: a restarted actor rebuilds its prover
first), one task per actor at a time, so the clock is the task's own. A task past its budget gets its
actor killed (Ray restarts it) and its rules submitted again one per task; a single rule past its budget
gets ``prove_many``'s result for a killed worker (``unknown``, "killed: Z3 overran the rule's time
budget"). A task whose actor died is submitted again the same way; a rule whose actor dies ``RETRIES``
times, no actor ready for ``READY_TIMEOUT`` seconds (none started, or none came back after a restart),
or a task that raises ends the run with a one-line ``DistributedError``. The shape fuzzing has no time
limit (as in the local loop); its tasks are submitted again where their actor died.
"""

from __future__ import annotations

import os
import time
from collections import deque

from ..generator.distributed import RETRIES, DistributedError, connect

#: rules per task: proofs, shape fuzzing
CHUNK = 8
FUZZ_CHUNK = 8
#: seconds an actor (a new one, or one restarted after a kill) may take to answer its ping while no
#: other actor is ready
READY_TIMEOUT = 180.0
#: how often a ping that Ray could not deliver (an actor gone for good) is sent again
PING_RETRIES = 5

KILLED_REASON = "killed: Z3 overran the rule's time budget"


def killed(timeout_s: float) -> dict:
    """``prove_many``'s result for a rule whose worker overran its time budget."""
    return {"status": "unknown", "time_s": timeout_s, "axioms": [], "reason": KILLED_REASON}


def budget(timeout_s: float) -> float:
    """A rule's hard wall-clock budget (``prove_many``'s)."""
    return timeout_s * 2 + 5.0


def _test_hooks(hooks: dict | None, index: int):
    """Test hooks, every time rule ``index`` is in a task: ``sleep`` sleeps an hour (a Z3 call that
    ignores its timeout), ``kill`` ends the actor's process with SIGKILL (a crash)."""
    if not hooks:
        return
    if index in hooks.get("sleep", ()):
        time.sleep(3600)
    if index in hooks.get("kill", ()):
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def fuzz_rule(src: dict, dst: dict, inputs: dict, seed: int) -> tuple[int, dict | None, dict]:
    """``candidates.shape_fuzz`` of one rule (its sides as JSON) with ``default_rng(seed)``: (shapes
    compared, the shapes where the sides disagree or None, its counters). The shape sampler states its
    constraints in Z3's main context, and the models Z3 gives (so the shapes sampled, so the draws after
    them) depend on the terms that context made before; each rule gets a fresh one here, so its
    comparisons are the same whichever rules the process fuzzed before, on a Ray worker or in the local
    loop (both call this)."""
    import numpy as np
    import z3

    from ..generator import graph as G
    from ..generator.candidates import shape_fuzz
    z3.z3._main_ctx = None  # (z3.main_ctx() makes a new one when next asked)
    stats: dict = {}
    n, bad = shape_fuzz(G.Graph.from_json(src), G.Graph.from_json(dst), inputs, np.random.default_rng(seed),
                        stats=stats)
    return n, bad, stats


class Verifier:
    """One Ray actor per CPU: a prover, built once (its axioms take a moment to state)."""

    def __init__(self, hooks: dict | None = None):
        """``hooks``: {"slow_restart": (seconds, a folder)} (tests): every start after the first (a marker
        file in the folder records it) takes that much longer, as a restart on a busy node might."""
        from .prove import Prover
        if hooks and "slow_restart" in hooks:
            seconds, folder = hooks["slow_restart"]
            mark = os.path.join(folder, "verifier-started")
            if os.path.exists(mark):
                time.sleep(seconds)
            open(mark, "w").close()
        self.prover = Prover()

    def ping(self) -> str:
        """The id of this worker process (a restarted actor has another)."""
        import ray
        return ray.get_runtime_context().get_worker_id()

    def prove_chunk(self, items: list, timeout_s: float, hooks: dict | None) -> list:
        """items: [(index, a as JSON, b as JSON, ranks)] -> [(index, result)]; an exception is the
        rule's result, as in ``prove._worker``."""
        from ..generator import graph as G
        out = []
        for idx, a, b, ranks in items:
            _test_hooks(hooks, idx)
            try:
                res = self.prover.prove(G.Graph.from_json(a), G.Graph.from_json(b), timeout_s, ranks)
            except Exception as e:  # reported per rule, never a dead task
                res = {"status": "error", "time_s": 0.0, "axioms": [], "reason": f"{type(e).__name__}: {e}"}
            out.append((idx, res))
        return out

    def fuzz_chunk(self, items: list, seed: int) -> list:
        """items: [(index, src as JSON, dst as JSON, inputs)] -> [(index, shapes compared, the shapes where
        the sides disagree or None, the rule's counters)]: ``fuzz_rule`` with the generator the local
        loop gives rule ``index``."""
        return [(idx, *fuzz_rule(a, b, inputs, seed + idx)) for idx, a, b, inputs in items]


class _Unit:
    """A task's worth of rules: (index, payload) items; ``tries``: how often its actor died under it."""

    __slots__ = ("items", "tries")

    def __init__(self, items: list, tries: int = 0):
        self.items, self.tries = items, tries


def _ping(handle):
    """A ping that Ray submits again until the actor is back (a call made while it restarts fails at
    once where it may not be retried)."""
    return handle.ping.options(max_task_retries=-1).remote()


class _Actor:
    __slots__ = ("handle", "ready", "ping", "ping_since", "pings", "task", "restarted", "worker", "stale")

    def __init__(self, handle):
        self.handle = handle
        self.task = None  # (ref, unit, deadline or None) while busy
        self.worker = None  # the worker process that last answered a ping
        self.restart()
        self.restarted = False

    def restart(self):
        """Not ready until a new process answers a ping (after a kill Ray restarts the actor, and it
        builds its prover; the process killed, if idle, may answer before it is gone)."""
        self.restarted = True
        self.ready = False
        self.stale = self.worker
        self.ping = _ping(self.handle)
        self.ping_since = time.monotonic()
        self.pings = 1


class Pool:
    """Verifier actors on a Ray runtime: ``cluster`` None starts a local one of ``cpus`` CPUs (unless
    this process is connected to Ray already), else the address of a running cluster. One actor per
    CPU of the cluster (``workers``: another count; ``hooks``: the actors', see ``Verifier``). Use as a
    context manager, or ``close()``."""

    def __init__(self, cluster: str | None = None, cpus: int = 2, workers: int | None = None,
                 hooks: dict | None = None):
        self.ray, self.owned = connect(cluster, cpus)
        ray = self.ray
        try:
            n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            actor = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)(Verifier)
            self.actors = [_Actor(actor.remote(hooks)) for _ in range(n)]
        except BaseException:
            if self.owned:
                ray.shutdown()
            raise
        self.workers = n
        self.timeouts = 0  # tasks killed past their budget
        self.retried = 0  # tasks submitted again after their actor died

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a.handle, no_restart=True)
            except Exception:  # (already gone)
                pass
        self.actors = []
        if self.owned:
            self.owned = False
            self.ray.shutdown()

    # ---- the scheduler ----

    def _run(self, units: list, submit, limit, on_done, on_overrun, what: str, names=None):
        """Run ``units`` on the actors, one task per ready actor: ``submit(handle, unit)`` -> object
        reference of the task; ``limit(unit)``: its budget in seconds (None: none); ``on_done(unit,
        value)``; ``on_overrun(unit)``: the units to run instead of one past its budget, at the front
        of the queue (its actor is restarted). ``names``: the rules' names in errors, by index."""
        ray = self.ray
        name = (lambda i: names[i]) if names is not None else str
        queue = deque(units)
        actors = self.actors
        try:
            while queue or any(a.task for a in actors):
                now = time.monotonic()
                for a in actors:
                    if a.ready and a.task is None and queue:
                        unit = queue.popleft()
                        lim = limit(unit)
                        a.task = (submit(a.handle, unit), unit, None if lim is None else now + lim)
                # wait for a task or a ping, at most until the nearest deadline
                waiting = {a.task[0]: a for a in actors if a.task} | {a.ping: a for a in actors if not a.ready}
                deadlines = [a.task[2] for a in actors if a.task and a.task[2] is not None]
                deadlines += [t for t in (a.ping_since + READY_TIMEOUT for a in actors if not a.ready) if t > now]
                timeout = max(0.0, min(deadlines, default=now + 1.0) - now)
                ready, _ = ray.wait(list(waiting), num_returns=1, timeout=min(timeout, 1.0))
                if ready:
                    more = [r for r in waiting if r not in ready]
                    if more:
                        ready += ray.wait(more, num_returns=len(more), timeout=0)[0]
                for ref in ready:
                    a = waiting[ref]
                    if not a.ready:
                        self._pinged(a)
                        continue
                    _ref, unit, _deadline = a.task
                    a.task = None
                    try:
                        value = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        cause = getattr(e, "cause", None) or e
                        msg = " ".join(str(cause).split())[:300]
                        raise DistributedError(f"a {what} task (rules {_span(unit, name)}) failed: "
                                               f"{type(cause).__name__}: {msg}") from None
                    except ray.exceptions.RayError as e:  # the actor died (Ray restarts it), an object lost
                        a.restart()
                        self.retried += 1
                        queue.extendleft(reversed(self._again(unit, e, what, name)))
                        continue
                    on_done(unit, value)
                now = time.monotonic()
                for a in actors:
                    if a.task and a.task[2] is not None and a.task[2] <= now:
                        _ref, unit, _deadline = a.task
                        a.task = None
                        self.timeouts += 1
                        ray.kill(a.handle, no_restart=False)  # (its task fails; Ray restarts the actor)
                        a.restart()
                        queue.extendleft(reversed(on_overrun(unit)))
                    elif not a.ready and a.ping_since + READY_TIMEOUT <= now and not any(b.ready for b in actors):
                        # (while another actor works, one that is late only does not help)
                        when = "after a restart" if a.restarted else "at the start"
                        raise DistributedError(f"a Ray worker did not answer within {READY_TIMEOUT:g} s {when}; "
                                               "is the cluster short of CPUs or memory?")
        finally:  # (stopped by an error: a busy actor is restarted, so the next call's clocks are its own)
            for a in actors:
                if a.task:
                    a.task = None
                    try:
                        ray.kill(a.handle, no_restart=False)
                        a.restart()
                    except Exception:  # (the caller closes the pool)
                        pass

    def _pinged(self, a: _Actor):
        ray = self.ray
        try:
            worker = ray.get(a.ping)
        except ray.exceptions.RayError as e:  # (Ray retries a ping until the actor is back: it is gone)
            if a.pings >= PING_RETRIES:
                msg = " ".join(str(e).split())[:200]
                raise DistributedError(f"a Ray worker did not come back after {a.pings} tries: "
                                       f"{type(e).__name__}: {msg}") from None
            a.ping = _ping(a.handle)
            a.pings += 1
            return
        if worker == a.stale:  # (the process being killed answered: ask again shortly)
            time.sleep(0.05)
            a.ping = _ping(a.handle)
            return
        a.worker, a.ready = worker, True

    def _again(self, unit: _Unit, err, what: str, names) -> list:
        """The units to run instead of one whose actor died: its rules one per task; a single rule again,
        ``RETRIES`` times at most."""
        if len(unit.items) > 1:
            return [_Unit([it]) for it in unit.items]
        if unit.tries + 1 > RETRIES:
            msg = " ".join(str(err).split())[:200]
            raise DistributedError(f"{what} of rule {names(unit.items[0][0])}: its Ray worker died {unit.tries + 1} "
                                   f"times ({type(err).__name__}: {msg})")
        return [_Unit(unit.items, unit.tries + 1)]

    # ---- the work ----

    def prove_many(self, pairs: list, timeout_s: float = 10.0, progress=None, hooks: dict | None = None,
                   chunk: int = CHUNK, names: list | None = None) -> list[dict]:
        """``prove.prove_many`` on the actors: [(graph a, graph b) or (a, b, input ranks)] -> one result
        dict per pair, in order. ``hooks``: {"sleep" or "kill": rule indices} (tests); ``names``: the
        rules' names, for errors (default: their indices)."""
        pairs = [tuple(p) + (None,) * (3 - len(p)) for p in pairs]
        items = [(i, a.to_json(), b.to_json(), ranks) for i, (a, b, ranks) in enumerate(pairs)]
        results: list = [None] * len(items)

        def submit(handle, unit):
            return handle.prove_chunk.remote(unit.items, timeout_s, hooks)

        def done(unit, value):
            for i, res in value:
                results[i] = res
                if progress:
                    progress(res)

        def overrun(unit):
            if len(unit.items) > 1:
                return [_Unit([it]) for it in unit.items]
            i = unit.items[0][0]
            results[i] = killed(timeout_s)
            if progress:
                progress(results[i])
            return []

        units = [_Unit(items[k:k + chunk]) for k in range(0, len(items), chunk)]
        self._run(units, submit, lambda u: len(u.items) * budget(timeout_s), done, overrun, "proof", names)
        return results

    def shape_fuzz(self, items: list, seed: int, progress=None, chunk: int = FUZZ_CHUNK,
                   names: dict | None = None) -> list:
        """The local fuzzing loop on the actors: items [(rule index, src JSON, dst JSON, inputs)] ->
        [(rule index, shapes compared, the shapes where the sides disagree or None, the rule's
        counters)] in the items' order. ``progress()`` once per rule; ``names``: {rule index: name}, for
        errors."""
        out: dict = {}

        def submit(handle, unit):
            return handle.fuzz_chunk.remote(unit.items, seed)

        def done(unit, value):
            for r in value:
                out[r[0]] = r
                if progress:
                    progress()

        units = [_Unit(items[k:k + chunk]) for k in range(0, len(items), chunk)]
        self._run(units, submit, lambda u: None, done, lambda u: [], "shape fuzzing", names)
        return [out[it[0]] for it in items]


def _span(unit: _Unit, name) -> str:
    first, last = name(unit.items[0][0]), name(unit.items[-1][0])
    return first if first == last else f"{first} to {last}"


def prove_many_ray(pairs: list, timeout_s: float, cluster: str | None = None, cpus: int = 2, progress=None,
                   hooks: dict | None = None) -> list[dict]:
    """``prove.prove_many`` as Ray tasks (a local runtime of ``cpus`` CPUs, or the cluster at
    ``cluster``); the same result dicts in the same order. Ray is shut down after only where this call
    started it."""
    with Pool(cluster, cpus) as pool:
        return pool.prove_many(pairs, timeout_s, progress, hooks)
