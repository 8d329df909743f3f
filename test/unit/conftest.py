"""Shared pytest plumbing for the unit tests."""

from __future__ import annotations

import os

import pytest

# The IR debug mode (dialect/handles.py): erased ops are kept dead but readable until the step ends, every
# value a pass uses is checked to be live and the IR is verified after every pass and every step of
# taso-search. On for the whole suite (and the tools it runs, which inherit the environment);
# TASO_DEBUG_IR=0 turns it off.
os.environ.setdefault("TASO_DEBUG_IR", "1")

_SUMMARY = pytest.StashKey[list]()


@pytest.fixture
def taso_summary(request):
    """``taso_summary(lines)``: lines to print in pytest's terminal summary (shown with or without -s/-q)."""
    store = request.config.stash.setdefault(_SUMMARY, [])

    def add(lines):
        store.extend([lines] if isinstance(lines, str) else list(lines))

    return add


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray runtime of 2 CPUs for one test module (the distributed generation and verification
    tests, which skip without Ray)."""
    import logging

    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'taso-mlir[distributed]')")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_SUMMARY, [])
    if lines:
        terminalreporter.section("taso-mlir summary")
        for line in lines:
            terminalreporter.write_line(line)

# The target the passes optimize for where a test names none: the analytic T4 profile, so that what a
# test checks (which rewrites fire, the bytes of an output) does not depend on this machine's timings.
# Tests of the measured default (auto: this machine's CPU) set the target themselves.
os.environ.setdefault("TASO_TARGET", "analytic:t4")
