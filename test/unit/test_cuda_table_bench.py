"""What a measured GPU table (``cost-model=cuda:<gpu>``, issue 24) feeds downstream, tested with a REHEARSAL table:
the quick suite's signatures dumped (``passes/cost/calibration.py dump``) and "measured" by
``benchmarks/gpu/calibrate.py --dry-run`` (numpy on the CPU, half of them), written into tmp_path and read
through ``$TASO_CUDA_TABLES``. No number here is a GPU measurement, and every report must say so.

- ``taso-bench --cost-model cuda:h100``: the search prices with the table; results.json, report.md and stdout
  say which table (GPU, driver, date, file) and how many signatures were measured and estimated, and put the
  search under the GPU's hand-set analytic roofline beside it, each result priced by both models.
- ``taso-bench --strategies --cost-model cuda:h100``: the same counts per strategy.
- Without a table: a one-line error and exit 1 before any model runs, never a traceback.
- ``calibration report cuda:h100``: per op class, the ratio estimate / measured (median, IQR) of the hand-set
  roofline and of the fitted one, and the fitted line.
- ``analytic:<gpu>`` is the roofline fitted to the table where one exists (hand-set otherwise, and always as
  ``analytic:<gpu>:datasheet``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from taso_mlir.benchmarks import runner as R
from taso_mlir.passes.cost import calibration as C
from taso_mlir.passes.cost import cuda_table as CT
from taso_mlir.passes.cost.oracle import PROFILES, Analytic, describe, get_cost_model, is_measured

ROOT = Path(__file__).resolve().parents[2]
CALIBRATE = ROOT / "benchmarks" / "gpu" / "calibrate.py"


@pytest.fixture(scope="module")
def dry_dir(tmp_path_factory):
    """A folder with a rehearsal table h100.json: the quick NasRNN's and SqueezeNet's signatures (searched under
    analytic:h100), the first half of them (by rank) timed by calibrate.py's dry backend."""
    d = tmp_path_factory.mktemp("cuda-tables")
    sigs = d / "sigs.jsonl"
    assert C.main(["dump", "--quick", "--models", "nasrnn,squeezenet", "--no-torch", "--targets", "analytic:h100",
                   "--strategies", "backtracking", "-o", str(sigs)]) == 0
    n = len(sigs.read_text().splitlines()) - 1
    tables = d / "tables"
    tables.mkdir()
    r = subprocess.run([sys.executable, str(CALIBRATE), "--dry-run", "--sigs", str(sigs), "--name", "h100",
                        "--out", str(tables / "h100.json"), "--limit", str(n // 2), "--warmup", "1", "--repeats", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return tables


@pytest.fixture
def dry(dry_dir, monkeypatch):
    monkeypatch.setenv(CT.TABLES_ENV, str(dry_dir))
    return dry_dir


@pytest.fixture
def no_tables(tmp_path, monkeypatch):
    d = tmp_path / "no-tables"
    d.mkdir()
    monkeypatch.setenv(CT.TABLES_ENV, str(d))
    return d


def _bench(capsys, *argv):
    from taso_mlir.tools.taso_bench import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc, err, prog, want):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert want in lines[0] and "Traceback" not in err and "internal error" not in err, err


# ---------------------------------------------------------------------------------------------
# taso-bench --cost-model cuda:<gpu>


def test_cost_model_choices_take_any_gpu_table_name():
    for spec in ("cuda:h100", "cuda:h200", "cuda:l4", "analytic:h100:datasheet", "analytic:h200", "cpu", "cuda"):
        assert spec in R.COST_MODELS, spec
    for spec in ("cuda:", "gpu", "cuda:h100:x", "analytic:h100:", "analytic:x:y:datasheet", None):
        assert spec not in R.COST_MODELS, spec


def test_bench_with_a_rehearsal_table(capsys, tmp_path, dry):
    rc, out, err = _bench(capsys, "--quick", "--in-process", "--models", "nasrnn", "--cost-model", "cuda:h100",
                          "--rounds", "2", "--budget", "0", "--out", tmp_path / "o")
    assert rc == 0, err
    rep = json.loads((tmp_path / "o" / "results.json").read_text())
    table = rep["cost_model"]["table"]
    # which table: the GPU (here the dry backend's own name for itself), driver, date, where, and that it is a
    # rehearsal; no machine path in it
    assert table["gpu"].startswith("DRY RUN") and table["driver"] == "none" and table["date"][:4].isdigit()
    assert table["table"] == "$TASO_CUDA_TABLES/h100.json" and table["rehearsal"] is True
    assert str(dry) not in json.dumps(rep["cost_model"])
    assert rep["cost_model"]["costs"].startswith("measured on DRY RUN")
    (m,) = rep["models"]
    c = m["cost"]
    assert m["status"] == "ok" and c["model"] == "cuda:h100" and c["table"] == table
    sg = c["signatures"]
    # half the signatures were timed: the search found some in the table and estimated others, and the search's
    # own count of estimates is the table's
    assert sg["measured"] > 0 and sg["estimated"] > 0 and sg["estimated"] == c["estimated_costs"]
    assert sg["measured"] <= table["entries"]
    # the cost as imported is the original model priced by the table, as written; the cost before is the search's
    # baseline, the prepared function, and the search never leaves it dearer. (Prepared against imported is not
    # compared: the prepare passes fuse unconditionally, and a measured table can price a fused op above its
    # parts; this rehearsal table's times are the CPU's wall clock, whose noise once did, 0.1745 against 0.1719.)
    from taso_mlir.benchmarks.suite import build
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_import import import_onnx

    module = import_onnx(build("nasrnn", quick=True), make_context(), where="nasrnn")
    assert c["imported"] == pytest.approx(R.graph_cost(module, get_cost_model("cuda:h100")), rel=1e-9)
    assert c["imported"] > 0 and c["before"] >= c["after"] > 0
    # beside it: the same model searched with the hand-set H100 roofline, each result priced by the other model
    b = c["beside"]
    assert b["model"] == "analytic:h100:datasheet" and "hand-set" in b["costs"]
    assert b["imported"] == pytest.approx(R.graph_cost(module, get_cost_model("analytic:h100:datasheet")), rel=1e-9)
    assert b["imported"] >= b["before"]
    assert b["before"] >= b["after"] > 0 and b["its_result_under_table_ms"] > 0 and b["table_result_under_it_ms"] > 0
    # the cross-pricing priced the graphs each search returned: the analytic search's result as the table prices it
    # (its own counts), the table search's as the hand-set roofline prices it
    bs = b["its_result_signatures"]
    assert bs["measured"] + bs["estimated"] > 0
    md = (tmp_path / "o" / "report.md").read_text()
    lines = md.splitlines()
    # what the costs are, said above the cost table (not inside it)
    at = lines.index(f"Costs {c['costs']}.")
    assert lines[at + 4].startswith("| model | cost as imported ms | cost prepared ms |") and lines[at - 2].startswith("## Cost model (cuda:h100)")
    assert "### Measured costs (cuda:h100) beside the analytic roofline and TENSAT" in md
    assert "A REHEARSAL TABLE (calibrate.py --dry-run: numpy on the CPU), NOT GPU TIMINGS" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| nasrnn |") and f"{sg['measured']} / " in ln)
    assert f"{c['before']:.4g} -> {c['after']:.4g}" in row and f"{b['before']:.4g} -> {b['after']:.4g}" in row
    assert row.rstrip().endswith("| +68.9% |")  # TENSAT's published NasRNN figure
    assert "cost model cuda:h100 = $TASO_CUDA_TABLES/h100.json: measured on DRY RUN" in out
    assert f"nasrnn: {c['before']:.4g} -> {c['after']:.4g} ms" in out and \
        f"{sg['measured']} signatures measured, {sg['estimated']} estimated" in out


def test_bench_without_a_table_is_a_one_line_error(capsys, tmp_path, no_tables, monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)  # (cost-model=cuda without cuda-python, on any machine)
    monkeypatch.delenv("TASO_CUDA_DRY_RUN", raising=False)
    for spec, want in (("cuda:h100", "cost model 'cuda:h100' is not available: no measured table for 'h100'"),
                       ("cuda:h200", "no measured table for 'h200' ($TASO_CUDA_TABLES/h200.json does not exist"),
                       ("cuda", "cost model 'cuda' is not available on this machine: cuda-python is not installed")):
        rc, out, err = _bench(capsys, "--quick", "--models", "nasrnn", "--cost-model", spec, "--out", tmp_path / "o")
        _one_line_error(rc, err, "taso-bench", want)
        assert "tables: none yet" in err or spec == "cuda"
        assert not (tmp_path / "o").exists()  # refused before any model ran
        rc, out, err = _bench(capsys, "--quick", "--models", "nasrnn", "--strategies", "--cost-model", spec)
        _one_line_error(rc, err, "taso-bench", want)
        assert "| model |" not in out


def test_bench_console_script_without_a_table(tmp_path, no_tables):
    """The installed command: exit status 1, one line, no traceback."""
    exe = os.path.join(os.path.dirname(sys.executable), "taso-bench")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "taso_mlir.tools.taso_bench"]
    p = subprocess.run(cmd + ["--quick", "--cost-model", "cuda:h100", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    _one_line_error(p.returncode, p.stderr, "taso-bench", "no measured table for 'h100'")
    p = subprocess.run([sys.executable, "-m", "taso_mlir.benchmarks.strategies", "--quick", "--target", "cuda:h100"],
                       capture_output=True, text=True, timeout=120)
    _one_line_error(p.returncode, p.stderr, "taso-strategies", "no measured table for 'h100'")


def test_strategies_with_a_rehearsal_table(capsys, tmp_path, dry):
    from taso_mlir.benchmarks import strategies

    out = tmp_path / "rows.json"
    assert strategies.main(["--quick", "--models", "nasrnn", "--target", "cuda:h100", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "table cuda:h100 = $TASO_CUDA_TABLES/h100.json: measured on DRY RUN" in text and "NOT GPU TIMINGS" in text
    (row,) = json.loads(out.read_text())
    assert row["table"]["gpu"].startswith("DRY RUN")
    for s in ("backtracking", "eqsat"):
        r = row[s]
        assert r["after"] <= r["before"] and r["signatures"]["measured"] > 0 and r["signatures"]["estimated"] > 0
    sb, se = row["backtracking"]["signatures"], row["eqsat"]["signatures"]
    assert (f"nasrnn {sb['measured']} / {sb['estimated']}; {se['measured']} / {se['estimated']}") in text


# ---------------------------------------------------------------------------------------------
# the per-class report


def test_per_class_report_of_a_table(capsys, dry):
    t = CT.get("cuda:h100", "h100")
    hand = Analytic(PROFILES["h100"])
    # the ratios recomputed here from the table's entries, apart from class_stats
    ratios: dict = {}
    for k, ms in t.entries.items():
        if ms > 0:
            sig = CT.sig_from_key(k)
            ratios.setdefault(CT.op_class(sig), []).append(hand.cost(sig) / ms)
    assert len(ratios) >= 4
    assert C.main(["report", "cuda:h100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cuda:h100: $TASO_CUDA_TABLES/h100.json, measured on DRY RUN") and "driver none" in out
    rows = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln}
    for c, r in ratios.items():
        q1, med, q3 = np.percentile(r, [25, 50, 75])
        assert rows[c].startswith(f"| {c} | {len(r)}") and f"| {med:.3g}x ({q1:.3g}-{q3:.3g})," in rows[c], rows[c]
        ln = t.lines[c]
        assert rows[c].rstrip().endswith(f"| {1e3 * ln.a:.2f} | {ln.b:.3g}" + ("" if ln.own else " (all classes')") + " |")
    n = sum(len(r) for r in ratios.values())
    assert rows["all"].startswith(f"| all | {n}")
    assert C.main(["report", "cuda:h100", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["table"]["gpu"].startswith("DRY RUN") and js["classes"]["all"]["n"] == n
    g = js["classes"]["gemm"]
    assert g["n"] == len(ratios["gemm"]) and g["analytic"]["median"] == pytest.approx(np.median(ratios["gemm"]))
    assert g["a_ms"] == t.lines["gemm"].a and g["b"] == t.lines["gemm"].b


def test_per_class_report_errors(capsys, tmp_path, no_tables):
    assert C.main(["report", "cuda:h100"]) == 1
    _one_line_error(1, capsys.readouterr().err, "taso-sigs", "no measured table for 'h100'")
    assert C.main(["report", str(tmp_path / "nope.json")]) == 1
    _one_line_error(1, capsys.readouterr().err, "taso-sigs", "no such table file")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "x"}')
    assert C.main(["report", str(bad)]) == 1
    _one_line_error(1, capsys.readouterr().err, "taso-sigs", "is not a taso-mlir CUDA table")


# ---------------------------------------------------------------------------------------------
# analytic:<gpu> fitted once a table exists


def test_analytic_gpu_is_the_roofline_fitted_to_its_table(dry):
    t = CT.get("cuda:h100", "h100")
    fitted, hand = get_cost_model("analytic:h100"), get_cost_model("analytic:h100:datasheet")
    assert isinstance(fitted, CT.FittedAnalytic) and fitted.name == "analytic:h100" and not is_measured(fitted)
    assert type(hand) is Analytic and hand.name == "analytic:h100:datasheet" and not is_measured(hand)
    assert describe(fitted).startswith("estimated by the analytic roofline of an NVIDIA H100 fitted to the table "
                                       "measured on DRY RUN") and "$TASO_CUDA_TABLES/h100.json" in describe(fitted)
    assert describe(hand) == "estimated by the analytic roofline of an NVIDIA H100 (hand-set datasheet profile)"
    plain = Analytic(PROFILES["h100"])
    differ = 0
    for k, ms in list(t.entries.items())[:40]:
        sig = CT.sig_from_key(k)
        # every signature estimated by the fitted line, even one the table has (the model, not a lookup)
        assert fitted.cost(sig) == pytest.approx(t.estimate(sig))
        assert hand.cost(sig) == plain.cost(sig)
        differ += fitted.cost(sig) != pytest.approx(hand.cost(sig), rel=1e-3)
    assert differ > 0
    # other GPUs keep their hand-set profiles
    assert type(get_cost_model("analytic:t4")) is Analytic and type(get_cost_model("analytic")) is Analytic


def test_analytic_gpu_is_hand_set_without_a_table(no_tables):
    a = get_cost_model("analytic:h100")
    assert type(a) is Analytic and a.p == PROFILES["h100"] and a.name == "analytic:h100"
    assert describe(a) == "estimated by the analytic roofline of an NVIDIA H100"
    h200 = get_cost_model("analytic:h200")
    assert type(h200) is Analytic and h200.p.bandwidth > PROFILES["h100"].bandwidth
    from taso_mlir.dialect.errors import TasoError

    for spec in ("analytic:cpu:datasheet", "analytic:h100:fitted", "analytic:h300:datasheet"):
        with pytest.raises(TasoError, match="unknown cost model"):
            get_cost_model(spec)


def test_a_search_under_analytic_h100_uses_the_fit(dry):
    """taso-search{target=analytic:h100} with a table: the report says the costs are the fitted roofline's, and
    the cost before is the fitted model's price of the graph (not the hand-set one's)."""
    from taso_mlir.benchmarks.suite import build

    model = build("squeezenet", quick=True)
    fitted = C.search_model(model, "squeezenet", "analytic:h100", "backtracking", 30.0)
    hand = C.search_model(model, "squeezenet", "analytic:h100:datasheet", "backtracking", 30.0)
    assert fitted["costs"].startswith("estimated by the analytic roofline of an NVIDIA H100 fitted to the table")
    assert fitted["measured"] is False and hand["measured"] is False
    assert fitted["cost_before_ms"] != pytest.approx(hand["cost_before_ms"], rel=1e-3)
