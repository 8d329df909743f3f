"""``cost-model=cuda:<gpu>`` (passes/cost/cuda_table.py, issue 24): a measured table's hits, the analytic model
fitted to it for the misses, the counts, and the errors. Every table here is SYNTHETIC, written by the test
into tmp_path: no GPU number in this file was measured."""

from __future__ import annotations

import json
import math

import pytest

from taso_mlir.dialect.errors import TasoError
from taso_mlir.passes.cost import cuda_table as CT
from taso_mlir.passes.cost.oracle import describe, get_cost_model, is_measured

from test_cost import X, conv, matmul

SYNTH_GPU = "SYNTHETIC GPU (test table, not a measurement)"


def write_table(folder, gpu: str, entries: dict, **extra) -> str:
    data = {"format": CT.FORMAT, "date": "2026-01-02T03:04:05Z",
            "device": {"gpu": SYNTH_GPU, "driver": "0.0", "machine": "pytest"},
            "method": {"warmup": 8, "repeats": 32, "statistic": "median"},
            "entries": {k: {"ms": ms, "q1_ms": ms, "q3_ms": ms, "repeats": 32, "backend": "synthetic"}
                        for k, ms in entries.items()}}
    data.update(extra)
    path = folder / f"{gpu}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    monkeypatch.setenv(CT.TABLES_ENV, str(tmp_path))
    return tmp_path


def body(sig) -> float:
    """The H100 roofline's time without its overheads (the fit's x)."""
    from dataclasses import replace

    from taso_mlir.passes.cost.oracle import PROFILES, Analytic

    return Analytic(replace(PROFILES["h100"], launch_s=0.0, dispatch_s=0.0)).cost(sig)


GEMMS = [conv((1, c, hw, hw), o, k=k, pad=k // 2) for c, o, hw, k in
         ((64, 64, 56, 1), (64, 128, 28, 3), (256, 256, 14, 3), (128, 512, 7, 1), (32, 32, 112, 3))] + \
        [matmul(m, k, n) for m, k, n in ((64, 1024, 1024), (1, 512, 2048), (1024, 1024, 4096))]
ELEMS = [CT.OpSig(k, (), (s, s), (s,)) for k in ("ewadd", "ewmul") for s in
         ((1, 64, 56, 56), (1, 256, 14, 14), (16, 64, 1024), (1, 4096))]
# synthetic "measurements": exactly a + b x per class, so the fit must recover a and b
A_GEMM, B_GEMM, A_EW, B_EW = 0.006, 1.7, 0.003, 1.25


def synthetic(sigs, a, b):
    return {s.key(): a + b * body(s) for s in sigs}


def test_hits_are_the_measured_medians_and_counted(tables):
    entries = {**synthetic(GEMMS, A_GEMM, B_GEMM), **synthetic(ELEMS, A_EW, B_EW)}
    write_table(tables, "h100", entries)
    cm = get_cost_model("cuda:h100")
    assert isinstance(cm, CT.CudaTable) and cm.name == "cuda:h100" and is_measured(cm)
    for s in GEMMS + ELEMS:
        assert cm.cost(s) == pytest.approx(entries[s.key()], rel=1e-12)
        cm.cost(s)  # (memoized: counted once)
    assert cm.hits == len(GEMMS + ELEMS) and cm.estimated == 0
    assert cm.summary().startswith(f"{len(GEMMS + ELEMS)} of {len(GEMMS + ELEMS)} op signatures measured on "
                                   f"{SYNTH_GPU}")


def test_misses_use_the_fitted_line_of_their_class(tables):
    write_table(tables, "h100", {**synthetic(GEMMS, A_GEMM, B_GEMM), **synthetic(ELEMS, A_EW, B_EW)})
    cm = get_cost_model("cuda:h100")
    g, e = cm.lines["gemm"], cm.lines["elementwise"]
    assert g.own and g.n == len(GEMMS) and (g.a, g.b) == (pytest.approx(A_GEMM, rel=1e-6), pytest.approx(B_GEMM, rel=1e-6))
    assert e.own and e.n == len(ELEMS) and (e.a, e.b) == (pytest.approx(A_EW, rel=1e-6), pytest.approx(B_EW, rel=1e-6))
    new_conv = conv((1, 96, 35, 35), 96, k=3, pad=1)
    new_add = CT.OpSig("ewadd", (), ((1, 96, 35, 35),) * 2, ((1, 96, 35, 35),))
    assert cm.cost(new_conv) == pytest.approx(A_GEMM + B_GEMM * body(new_conv), rel=1e-6)
    assert cm.cost(new_add) == pytest.approx(A_EW + B_EW * body(new_add), rel=1e-6)
    assert cm.hits == 0 and cm.estimated == 2
    # a class without entries of its own (movement) uses the line fitted over all entries
    t = CT.OpSig("transpose", (("perm", (0, 2, 3, 1)),), (X,), ((1, 14, 14, 256),))
    mv = cm.lines["movement"]
    assert not mv.own and mv.n == 0 and cm.cost(t) == pytest.approx(mv.a + mv.b * body(t))
    assert "cuda" not in cm.describe() and cm.describe().startswith(f"measured on {SYNTH_GPU} (table of 2026-01-02)")
    assert describe(cm) == cm.describe() and "fitted to the table" in cm.describe()
    rep = cm.fit_report().splitlines()
    gemm = next(r for r in rep if r.startswith("| gemm |"))
    assert gemm.startswith("| gemm | 8 | ") and gemm.endswith(" | 1x (1-1), 1x | 6.00 | 1.7 |"), gemm
    mv = next(r for r in rep if r.startswith("| movement |"))
    assert mv.startswith("| movement | 0 | - | - |") and mv.endswith("(all classes') |"), mv


def test_fit_minimizes_relative_error_and_stays_physical():
    # noisy points around 0.01 + 2x: recovered closely; weights make small points count as much as big ones
    xs = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    ys = [(0.01 + 2 * x) * f for x, f in zip(xs, (1.02, 0.98, 1.01, 0.99, 1.0))]
    a, b = CT.fit_line(xs, ys)
    assert a == pytest.approx(0.01, rel=0.05) and b == pytest.approx(2.0, rel=0.05)
    # a negative intercept is refitted through the origin; a falling line is no fit
    a, b = CT.fit_line([1.0, 2.0, 3.0], [0.5, 1.9, 3.1])
    assert a == 0.0 and b > 0
    assert CT.fit_line([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) is None
    assert CT.fit_line([], []) is None


def test_table_of_a_gpu_without_a_profile_uses_the_h100_roofline(tables):
    write_table(tables, "l4", synthetic(GEMMS, A_GEMM, B_GEMM))
    cm = get_cost_model("cuda:l4")
    assert cm.name == "cuda:l4" and cm.base.name == "h100" and "H100 roofline" in cm.describe()


def test_no_table_is_a_one_line_error_saying_it_is_not_measured(tables):
    for spec in ("cuda:h100", "cuda:h200"):
        with pytest.raises(TasoError) as e:
            get_cost_model(spec)
        msg = str(e.value)
        assert "\n" not in msg and "not available" in msg and "has not been run" in msg and "none yet" in msg


def test_the_shipped_tables_are_gpu_measurements(monkeypatch):
    """A shipped table says where it was measured (GPU, driver, date), is complete, and is not a rehearsal
    (calibrate.py --dry-run); the H200's, measured 2026-11-27, is shipped."""
    monkeypatch.delenv(CT.TABLES_ENV, raising=False)
    assert "h200" in CT.shipped_tables()
    for gpu in CT.shipped_tables():
        raw = json.loads(open(CT.table_path(gpu)).read())
        assert raw["complete"] and not raw["failed"] and raw["method"]["backend"] == "cuda", gpu
        t = CT.CudaTable.load(CT.table_path(gpu), gpu)
        assert "SYNTHETIC" not in t.device["gpu"] and t.device.get("driver") and t.date
        assert not t.rehearsal(), f"{gpu}.json is a dry-run table (numpy on the CPU), not a GPU measurement"


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.update(format="other"), "its format is"),
    (lambda d: d.pop("device"), "no device.gpu"),
    (lambda d: d.pop("date"), "no date"),
    (lambda d: d.update(entries={}), "no measured entries"),
    (lambda d: next(iter(d["entries"].values())).update(ms=math.nan), "has no valid ms"),
    (lambda d: next(iter(d["entries"].values())).update(ms=-1.0), "has no valid ms"),
    (lambda d: d["entries"].update({"[\"relu\"]": {"ms": 1.0}}), "not a signature key"),
])
def test_malformed_tables_are_one_line_errors(tables, mutate, problem):
    path = write_table(tables, "h100", synthetic(GEMMS, A_GEMM, B_GEMM))
    data = json.loads(open(path).read())
    mutate(data)
    open(path, "w").write(json.dumps(data))
    with pytest.raises(TasoError) as e:
        get_cost_model("cuda:h100")
    assert "is not a taso-mlir CUDA table" in str(e.value) and problem in str(e.value) and "\n" not in str(e.value)


def test_unreadable_table(tables):
    (tables / "h100.json").write_text("{not json")
    with pytest.raises(TasoError, match="is unreadable"):
        get_cost_model("cuda:h100")


def test_search_with_a_table_counts_measured_and_estimated_signatures(tables):
    """taso-search{target=cuda:h100} over a synthetic table of half the signatures a search prices: the
    report says where the costs were measured, and the estimated half is counted."""
    from taso_mlir.benchmarks.suite import build
    from taso_mlir.passes.cost import calibration as C
    from taso_mlir.passes.cost.oracle import wrapping_cost_models

    model = build("nasrnn", quick=True)
    col = C.Collector()
    with wrapping_cost_models(lambda cm: C.Recording(cm, col)):
        C.search_model(model, "nasrnn", "analytic:h100", "backtracking", 30.0)
    sigs = [col.sigs[k][0] for k in sorted(col.sigs)]
    assert len(sigs) > 10
    kept = sigs[::2]
    write_table(tables, "h100", {s.key(): A_EW + 1.3 * body(s) for s in kept})
    seen = []
    with wrapping_cost_models(lambda cm: seen.append(cm) or cm):
        rep = C.search_model(model, "nasrnn", "cuda:h100", "backtracking", 30.0)
    assert rep["cost_model"] == "cuda:h100" and rep["measured"] is True
    assert rep["costs"].startswith(f"measured on {SYNTH_GPU} (table of 2026-01-02)")
    cm = seen[0]
    assert cm.hits > 0 and cm.estimated > 0 and rep["estimated_costs"] == cm.estimated
    assert cm.hits <= len(kept) and rep["cost_after_ms"] <= rep["cost_before_ms"]
