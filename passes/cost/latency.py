"""End-to-end latency of ONNX models in onnxruntime's CPU execution provider, measured side by side.

``sample`` is the measuring loop: interleaved rounds (every model runs once per round, in an order
rotated per round), spread over several sets of freshly created sessions, because where a session's
buffers land in memory moves its latency by a few percent for the session's whole life, which
interleaving alone cannot cancel. ``taso-bench`` reports from it; ``compare`` uses it for
``taso-search``'s latency check (``cost-model=cpu``): the speedup of one model over another as the median
of the per-round ratios, with their interquartile range as the noise.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Settings:
    rounds: int = 31  # at most this many rounds
    min_rounds: int = 6  # at least this many, even past the budget
    budget_s: float = 2.0  # stop adding rounds after this long (from the start: later sessions' creation counts)
    epochs: int = 2  # sets of fresh sessions the rounds are spread over
    warmup: int = 1  # runs of each session before its rounds
    min_sample_s: float = 0.02  # a fast model runs this long back to back per sample
    threads: int = 1  # onnxruntime intra-op threads (1: ratios a shared machine skews least)


def session_options(level: str = "all", threads: int = 1):
    """``level`` "all": onnxruntime's optimizations on (ORT_ENABLE_ALL); otherwise off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # (failures are reported in one line of our own)
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if level == "all"
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = threads
    # No spin-waiting after a run: the interleaved sessions each have their own thread pool, and threads
    # spinning on behalf of the session that just ran would take the cores from the next one.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def sample(make_sessions, keys: list, feeds: dict, s: Settings) -> dict:
    """Seconds per run of each session in ``keys``, one sample per round in round order; with the
    rounds, epochs and runs per sample (``inner``). ``make_sessions(epoch)`` returns {key: session}."""
    epochs = max(1, min(s.epochs, s.rounds))
    samples: dict = {k: [] for k in keys}
    inner = None
    rounds = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        sessions = None
        gc.collect()
        sessions = make_sessions(epoch)
        for _ in range(s.warmup):
            for k in keys:
                sessions[k].run(None, feeds)
        if inner is None:
            single = {}
            for k in keys:
                t = time.perf_counter()
                sessions[k].run(None, feeds)
                single[k] = time.perf_counter() - t
            fastest = max(min(single.values()), 1e-7)
            inner = int(min(1000, max(1, math.ceil(s.min_sample_s / fastest))))
        # this epoch's share of the rounds, of the minimum and of the time budget (cumulative)
        share = (epoch + 1) / epochs
        cap, least, budget = math.ceil(s.rounds * share), math.ceil(s.min_rounds * share), s.budget_s * share
        while rounds < cap:
            order = keys[rounds % len(keys):] + keys[:rounds % len(keys)]
            for k in order:
                sess = sessions[k]
                t = time.perf_counter()
                for _ in range(inner):
                    sess.run(None, feeds)
                samples[k].append((time.perf_counter() - t) / inner)
            rounds += 1
            if rounds >= least and time.perf_counter() - start > budget:
                break
        del sessions
    return {"samples": samples, "rounds": rounds, "epochs": epochs, "inner": inner}


def ratio_stats(num: list, den: list) -> tuple[float, float, float]:
    """Median and quartiles of the per-round ratios num / den."""
    r = np.asarray(num) / np.asarray(den)
    return float(np.median(r)), float(np.percentile(r, 25)), float(np.percentile(r, 75))


def compare(before, after, s: Settings = Settings(), seed: int = 0) -> dict:
    """Time two ONNX models (``onnx.ModelProto``) on the same random inputs. ``speedup``: before / after
    (> 1: ``after`` is faster), the median of the per-round ratios; ``iqr``: their quartiles."""
    import onnxruntime as ort

    from taso_mlir.dialect.numerics import random_feeds

    blobs = {"before": before.SerializeToString(), "after": after.SerializeToString()}
    keys = ["before", "after"]

    def new_sessions(epoch: int) -> dict:
        order = keys[epoch % 2:] + keys[:epoch % 2]
        return {k: ort.InferenceSession(blobs[k], session_options("all", s.threads),
                                        providers=["CPUExecutionProvider"]) for k in order}

    first = [new_sessions(0)]  # the first epoch's, which also give the inputs' types

    def make_sessions(epoch: int) -> dict:
        return first.pop() if epoch == 0 and first else new_sessions(epoch)

    feeds = random_feeds(first[0]["before"], np.random.default_rng(seed))
    out = sample(make_sessions, keys, feeds, s)
    sm = out["samples"]
    med, lo, hi = ratio_stats(sm["before"], sm["after"])
    return {"speedup": med, "iqr": [lo, hi], "rounds": out["rounds"], "epochs": out["epochs"],
            "inner": out["inner"], "before_ms": float(np.median(sm["before"])) * 1e3,
            "after_ms": float(np.median(sm["after"])) * 1e3}
