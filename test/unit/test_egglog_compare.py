"""The project's e-graph against egglog (``benchmarks/egglog_compare.py``): on the suite's tiny NasRNN, the
two engines saturate the same starting e-graph with the structural rewrites and agree on the e-graph's
size after every round, so the measured comparison is of equal work. Needs the optional ``egglog`` extra."""

from __future__ import annotations

import pytest

egglog = pytest.importorskip("egglog", reason="egglog is not installed (pip install 'taso-mlir[egglog]')")

from taso_mlir.benchmarks import egglog_compare as C  # noqa: E402
from taso_mlir.passes.search import eqsat as E  # noqa: E402


@pytest.fixture(scope="module")
def nasrnn():
    return C.starting_graph("nasrnn", quick=True)


def test_structural_subset_needs_no_shapes(nasrnn):
    _g, rws = nasrnn
    sub = C.structural(rws)
    cen = C.census(rws)
    assert len(sub) == cen["structural"] and 0 < len(sub) < len(rws)
    assert all(not C.shape_needs(rw) for rw in sub)
    assert cen["need_shapes"] + cen["structural"] == cen["rewrites"]


def test_sizes_agree_after_every_round(nasrnn):
    g0, rws = nasrnn
    sub = C.structural(rws)
    rounds = 3
    p = C.run_project(g0, sub, rounds)
    e = C.run_egglog(E.from_graph(g0)[0], sub, rounds)
    assert p["rejected"] == {}, p["rejected"]  # (else the engines would not apply the same matches)
    assert len(p["sizes"]) == len(e["sizes"]) == rounds + 1
    assert p["sizes"] == e["sizes"]
    assert p["sizes"][-1][0] > p["sizes"][0][0]  # the rewrites did something


def test_lifting_is_restored():
    saved = E.lift_elementwise
    with C.no_lifting():
        assert E.lift_elementwise is not saved
    assert E.lift_elementwise is saved
