"""taso-search's latency check with the measured cost model (``cost-model=cpu``): the result is timed
against the input in onnxruntime; where it is slower beyond the noise, the search runs again without the
rewrites that introduce a split, and where that is slower too the input is kept.

The decision tests replace the timing (``latency.compare``) with fixed answers and the measured costs with
the T4 roofline's (so that the search merges sibling convolutions, which is what the check is for); one
test times for real. Every outcome is checked in the IR and in onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from taso_mlir.benchmarks.example_models import build_inception
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.context import make_context
from taso_mlir.dialect.onnx_export import export_onnx
from taso_mlir.dialect.onnx_import import import_onnx
from taso_mlir.passes.cost import oracle as C
from taso_mlir.passes.cost import latency as L
from taso_mlir.passes.search import taso_search
from taso_mlir.passes.search.backtracking import introduces_split
from taso_mlir.passes.registry import build_pass_manager, run_pass_manager


class _RooflineCpu(C.CpuMeasured):
    """The measured model's class (so the check runs) with the T4 roofline's costs (so merges win)."""

    def __init__(self):
        super().__init__()
        self._t4 = C.get_cost_model("analytic:t4")

    def _cost(self, sig):
        return self._t4.cost(sig)


@pytest.fixture(scope="module")
def model():
    return build_inception()  # the bundled example: sibling convolutions the T4 roofline merges


def _optimize(model, **opts):
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = import_onnx(model, ctx)
        before = str(m)
        o = " ".join(f"{k}={v}" for k, v in {"cost-model": "cpu", **opts}.items())
        run_pass_manager(build_pass_manager(f"builtin.module(taso-search{{{o}}})", ctx), m.operation)
        assert m.operation.verify()
        return before, str(m), export_onnx(m), taso_search.LAST_REPORT["functions"][0]


def _same_numbers(a, b):
    import onnxruntime as ort

    from taso_mlir.dialect.numerics import random_feeds

    sa = ort.InferenceSession(a.SerializeToString(), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(b.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = random_feeds(sa, np.random.default_rng(3))
    for x, y in zip(sa.run(None, feeds), sb.run(None, feeds)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """Costs from the roofline; ``latency.compare`` answers from ``answers`` in order (and records calls)."""
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(taso_search, "get_cost_model", lambda spec="analytic": _RooflineCpu())
    answers, calls = [], []

    def compare(before, after, settings=L.Settings(), seed=0):
        calls.append((before, after))
        speedup, lo, hi = answers.pop(0)
        return {"speedup": speedup, "iqr": [lo, hi], "rounds": 9, "epochs": 3, "inner": 1,
                "before_ms": 1.0, "after_ms": 1.0 / speedup}

    monkeypatch.setattr(L, "compare", compare)
    return answers, calls


def _splits(text: str) -> int:
    return text.count('"taso.split"') + text.count("taso.split ")


def test_a_result_within_the_noise_is_kept(model, scripted):
    answers, calls = scripted
    answers.append((0.998, 0.99, 1.004))  # slower in the median, but 1.0 is inside the quartiles
    before, after, out, fr = _optimize(model)
    assert len(calls) == 1
    assert fr["latency_check"]["kept"] == "search result"
    assert any(introduces_split(rw) for rw in taso_search.rewrites() if rw.id in fr["applied"])
    _same_numbers(calls[0][0], out)


def test_a_slower_result_is_searched_again_without_splits(model, scripted):
    answers, calls = scripted
    answers.extend([(0.95, 0.94, 0.96), (1.02, 1.0, 1.03)])
    before, after, out, fr = _optimize(model)
    assert len(calls) == 2
    lc = fr["latency_check"]
    assert lc["kept"] == "search without splits"
    assert [t["what"] for t in lc["tried"]] == ["search result", "search without splits"]
    assert fr["relus_fused"] > 0, "the prepare passes still fuse the relus"
    by_id = {rw.id: rw for rw in taso_search.rewrites()}
    assert not any(introduces_split(by_id[r]) for r in fr["applied"])
    assert _splits(after) == 0 and _splits(before) == 0
    assert calls[1][0].SerializeToString() == calls[0][0].SerializeToString(), "both timed against the input"
    _same_numbers(calls[0][0], out)
    assert fr["cost_after_ms"] < fr["cost_before_ms"]


def test_the_input_is_kept_when_both_are_slower(model, scripted):
    answers, calls = scripted
    answers.extend([(0.95, 0.94, 0.96), (0.97, 0.96, 0.99)])
    before, after, out, fr = _optimize(model)
    assert fr["latency_check"]["kept"] == "input"
    assert after == before, "the function is exactly the input"
    assert fr["applied"] == {} and fr["rewrites_applied"] == 0
    assert fr["cost_after_ms"] == pytest.approx(fr["cost_before_ms"])
    assert "kept: input" in taso_search.format_report(taso_search.LAST_REPORT)


def test_the_check_can_be_turned_off(model, scripted):
    answers, calls = scripted
    _, after, _, fr = _optimize(model, **{"latency-check": 0})
    assert calls == [] and "latency_check" not in fr and fr["applied"]


def test_analytic_models_are_not_timed(model, monkeypatch):
    monkeypatch.setattr(L, "compare", lambda *a, **k: pytest.fail("timed with an analytic model"))
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = import_onnx(model, ctx)
        run_pass_manager(build_pass_manager("builtin.module(taso-search)", ctx), m.operation)
    assert "latency_check" not in taso_search.LAST_REPORT["functions"][0]


def test_real_timing_decides_consistently(model, monkeypatch, tmp_path):
    """Measured for real: what was kept follows from what was timed, and the numbers are the input's."""
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(taso_search, "get_cost_model", lambda spec="analytic": _RooflineCpu())
    _, _, out, fr = _optimize(model)
    lc = fr["latency_check"]
    tried = lc["tried"]
    for t in tried:
        assert t["rounds"] >= L.Settings().min_rounds and 0 < t["iqr"][0] <= t["speedup"] <= t["iqr"][1]
    if lc["kept"] == "search result":
        assert len(tried) == 1 and tried[0]["iqr"][1] >= 1.0
    else:
        assert tried[0]["iqr"][1] < 1.0
    ctx = make_context()
    with ctx:
        ref = export_onnx(import_onnx(model, ctx))
    _same_numbers(ref, out)


def test_the_kept_input_reports_no_changes(model, scripted):
    answers, _ = scripted
    answers.extend([(0.95, 0.94, 0.96), (0.97, 0.96, 0.99)])
    *_, fr = _optimize(model)
    assert fr["latency_check"]["kept"] == "input"
    assert all(fr[k] == 0 for k in taso_search._CHANGE_COUNTS), {k: fr[k] for k in taso_search._CHANGE_COUNTS}


def test_a_result_that_cannot_be_timed_stands_and_says_why(model, scripted, monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("onnxruntime refuses the model\nsecond line")

    monkeypatch.setattr(L, "compare", refuse)
    *_, fr = _optimize(model)
    lc = fr["latency_check"]
    assert lc["kept"] == "search result" and lc["why"] == "not timed: onnxruntime refuses the model second line"
    assert fr["applied"]


LIFT_ONLY = """
func.func @f(%x: tensor<1x1024xf32>, %h: tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>) {
  %xs:4 = "taso.split"(%x) {axis = 1 : i64, sizes = array<i64: 256, 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %hs:4 = "taso.split"(%h) {axis = 1 : i64, sizes = array<i64: 256, 256, 256, 256>, resultSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>} : (tensor<1x1024xf32>) -> (tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>)
  %a0 = "taso.ewadd"(%xs#0, %hs#0) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a1 = "taso.ewadd"(%xs#1, %hs#1) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  %a2 = "taso.ewadd"(%xs#2, %hs#2) : (tensor<1x256xf32>, tensor<1x256xf32>) -> tensor<1x256xf32>
  return %a0, %a1, %a2 : tensor<1x256xf32>, tensor<1x256xf32>, tensor<1x256xf32>
}
"""


def test_a_function_changed_only_by_lifting_is_timed(scripted):
    answers, calls = scripted
    answers.append((1.01, 1.0, 1.02))
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(LIFT_ONLY)
        run_pass_manager(build_pass_manager("builtin.module(taso-search{cost-model=cpu})", ctx), m.operation)
    fr = taso_search.LAST_REPORT["functions"][0]
    assert fr["rewrites_applied"] == 0 and fr["elementwise_lifted"] == 3
    assert len(calls) == 1 and fr["latency_check"]["kept"] == "search result"
