"""taso-bench and the benchmark suite (benchmarks/suite.py).

- ``taso-bench --quick`` (the console script, every model of the suite in its tiny variant): exit 0, the
  report files, a JSON result for every model with finite numbers, op counts, the default optimizer
  (taso-search) with its costs and the same numbers as the original, every latency ratio marked resolved or
  unresolved consistently with its IQR, the published figures labelled as such; ``--optimizer identity``
  changes nothing.
- The report's formatting (a synthetic report): a ratio whose IQR spans 1.0 is "~1.0x (unresolved: ...)" in
  the table, report.md, results.json and the chart, never a speedup.
- User errors: one line on stderr and exit 1, never a traceback; a model that fails is a failed row in
  the report and a non-zero exit.
- The full-size builders (slow): TASO's configurations, checked against the parameter counts of the real
  architectures, accepted by onnx.checker (full check), runnable in onnxruntime, and (those under
  150 MB of weights) round-tripped through the taso dialect.
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from taso_mlir.benchmarks import runner as R
from taso_mlir.benchmarks import suite as S
from taso_mlir.benchmarks.example_models import random_inputs
from taso_mlir.tools import taso_bench
from taso_mlir.tools.taso_bench import main

QUICK = [m.name for m in S.suite(quick=True)]
REPORT_FILES = ("report.md", "results.json", "speedup.png", "search_time.png")


def _bench_cmd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "taso-bench")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "taso_mlir.tools.taso_bench"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    p = subprocess.run(_bench_cmd() + ["--quick", "--out", str(out)], capture_output=True, text=True, timeout=600)
    return p, out


def _finite_numbers(obj, path=""):
    """Every number in ``obj`` (recursively) with its path; bools excluded."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _finite_numbers(v, f"{path}[{i}]")


def test_quick_run_writes_the_report(quick_run):
    p, out = quick_run
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    for f in REPORT_FILES:
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    for png in ("speedup.png", "search_time.png"):
        data = (out / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, png
    # progress on stderr, one table on stdout, every model in both
    for i, name in enumerate(QUICK):
        assert f"[{i + 1}/{len(QUICK)}] {name}:" in p.stderr
        assert any(line.startswith(name + " ") for line in p.stdout.splitlines()), name
    md = (out / "report.md").read_text()
    for name in QUICK:
        assert f"| {name} |" in md
    assert "not measured here" in md and "![speedup per model](speedup.png)" in md
    assert not [f for f in os.listdir(out) if f.startswith(".taso-")]  # atomic writes leave nothing behind


def test_quick_run_json(quick_run):
    p, out = quick_run
    rep = json.loads((out / "results.json").read_text())
    assert rep["quick"] is True
    # the default optimizer is the search (its target: TASO_TARGET, which the unit tests pin to analytic:t4)
    assert rep["optimizer"] == {"name": "taso-search", "pipeline": "builtin.module(taso-search,taso-dce)"}
    assert rep["cost_model"]["status"] == R.COST_REPORTED and rep["cost_model"]["default"] is None
    assert rep["versions"]["onnxruntime"] == ort.__version__ and rep["versions"]["onnx"] == onnx.__version__
    assert rep["wall_time_s"] > 0 and rep["machine"]["cpus"] >= 1
    assert [m["name"] for m in rep["models"]] == QUICK
    for m in rep["models"]:
        name = m["name"]
        assert m["status"] == "ok", (name, m.get("error"))
        for path, v in _finite_numbers(m):
            assert math.isfinite(v), (name, path, v)
        # op counts
        assert m["onnx"]["nodes"] > 0 and m["onnx"]["parameters"] > 0
        before, after = m["ops"]["before"], m["ops"]["after"]
        assert before["taso"] > 0 and before["weights"] > 0
        assert sum(before["taso_by_op"].values()) == before["taso"]
        assert sum(before["generic_by_op"].values()) == before["generic"]
        assert sum(after["taso_by_op"].values()) == after["taso"]
        assert after["taso"] + after["generic"] > 0
        assert m["ops"]["exported_nodes"] > 0 and m["ops"]["onnxslim_nodes"] > 0
        assert m["ops"]["ort_optimized_nodes"] is None or m["ops"]["ort_optimized_nodes"] > 0
        # numerics: the optimized model computes the original's numbers (within the tolerance)
        num = m["numerics"]
        assert num["trials"] == 2 and num["scale"] >= 1.0
        assert num["optimized_rel"] <= rep["settings"]["tolerance"], (name, num)
        assert num["onnxslim_rel"] <= 1e-4, (name, num)
        # latency: every variant timed in every round, positive medians, consistent ratios
        lat = m["latency"]
        assert lat["rounds"] >= rep["settings"]["min_rounds"] and lat["inner"] >= 1
        assert set(lat["median_ms"]) == {"original", "optimized", "ort_disabled", "onnxslim"}
        assert all(v > 0 for v in lat["median_ms"].values())
        med = lat["median_ms"]
        assert lat["speedup"]["optimized"] == pytest.approx(med["original"] / med["optimized"])
        assert lat["speedup"]["ort_enable_all"] == pytest.approx(med["ort_disabled"] / med["original"])
        assert lat["epochs"] == rep["settings"]["epochs"] == 2
        assert all(len(v) == lat["rounds"] for v in lat["samples_ms"].values())
        for key, (lo, hi) in lat["paired_iqr"].items():
            assert 0 < lo <= lat["paired_speedup"][key] <= hi, key
        # each ratio marked resolved exactly where its IQR does not span 1.0, and labelled to match
        assert set(lat["resolved"]) == set(lat["speedup_label"]) == set(lat["paired_iqr"]) == set(R.RATIOS)
        for key, (lo, hi) in lat["paired_iqr"].items():
            spans = lo <= 1.0 <= hi
            assert lat["resolved"][key] is (not spans), (name, key, lo, hi)
            want = (f"~1.0x (unresolved: IQR {lo:.3f}-{hi:.3f})" if spans
                    else f"{lat['speedup'][key]:.3f}x")
            assert lat["speedup_label"][key] == want, (name, key)
        assert all(v > 0 for v in lat["paired_speedup"].values())
        # times and memory
        for k in ("build", "check", "import", "optimize", "export", "onnxslim"):
            assert m["times_s"][k] >= 0, k
        assert m["memory"]["peak_rss_mb"] > 10 and m["memory"]["process_peak_mb"] >= m["memory"]["peak_rss_mb"] - 1
        c = m["cost"]
        assert c["status"] == "ok" and c["model"] == "analytic:t4", (name, c)
        assert c["before"] > 0 and 0 < c["after"] <= c["before"], (name, c)
    # published figures: where the TENSAT table has the model, as ratios, labelled with their source
    pub = {m["name"]: m["published"] for m in rep["models"]}
    assert pub["nasrnn"]["tensat_speedup"] == pytest.approx(1.689)
    assert pub["nasrnn"]["taso_time_s"] == pytest.approx(177.3)
    assert "TENSAT" in pub["bert-b1"]["source"]
    assert "taso_speedup" not in (pub["resnet50"] or {})
    # the marks reach the table and report.md: each model's row shows its label
    md = (out / "report.md").read_text()
    rows = {line.split()[0]: line for line in p.stdout.splitlines() if line.split()}
    for m in rep["models"]:
        label = m["latency"]["speedup_label"]["optimized"]
        assert label in rows[m["name"]], (m["name"], label)
        assert any(line.startswith(f"| {m['name']} | quick") and label in line for line in md.splitlines()), label
    assert "*Unresolved*" in md and "noise-dominated" in md


def test_identity_optimizer(capsys, tmp_path):
    """--optimizer identity: the round trip alone, which changes nothing and computes the same numbers."""
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "nasrnn,squeezenet", "--out", tmp_path,
                        "--optimizer", "identity", "--rounds", "1", "--min-rounds", "1", "--budget", "0")
    assert rc == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["optimizer"] == {"name": "identity", "pipeline": taso_bench.IDENTITY_PIPELINE}
    assert "unavailable" in rep["cost_model"]["status"]
    for m in rep["models"]:
        assert m["status"] == "ok", m
        assert m["ops"]["after"] == m["ops"]["before"], m["name"]
        assert m["numerics"]["optimized_rel"] <= 1e-5, m["numerics"]
        assert m["cost"]["before"] is None and "unavailable" in m["cost"]["status"]


def test_default_optimizer_is_the_search(monkeypatch):
    """taso-search is the default preset, the help says so; --quick picks the analytic target only where
    neither --cost-model nor TASO_TARGET names one."""
    ap = taso_bench._build_parser()
    assert ap.parse_args([]).optimizer == "taso-search" == R.DEFAULT_OPTIMIZER
    assert "default: taso-search" in " ".join(ap.format_help().split())
    assert "taso-search" in taso_bench.__doc__.split("\n\n")[2] and "identity" in taso_bench.__doc__
    monkeypatch.delenv("TASO_TARGET", raising=False)
    assert R.quick_cost_model(True, "taso-search", None, None) == R.QUICK_COST_MODEL == "analytic"
    assert R.quick_cost_model(True, "taso-search", None, "cpu") == "cpu"
    assert R.quick_cost_model(False, "taso-search", None, None) is None
    assert R.quick_cost_model(True, "identity", None, None) is None
    assert R.quick_cost_model(True, "taso-search", "builtin.module(cse)", None) is None
    monkeypatch.setenv("TASO_TARGET", "cpu")
    assert R.quick_cost_model(True, "taso-search", None, None) is None


# ------------------------------------------------------------------------------------------------
# the report's formatting, on a synthetic report


def _lat(median_ratio: float, iqr: tuple) -> dict:
    """A latency record whose three ratios all have ``median_ratio`` and the per-round IQR ``iqr``."""
    orig = 1.0
    lat = {"rounds": 5, "epochs": 2, "inner": 1, "iqr_ms": {},
           "median_ms": {"original": orig, "optimized": orig / median_ratio, "onnxslim": orig / median_ratio,
                         "ort_disabled": orig * median_ratio},
           "speedup": {k: median_ratio for k in R.RATIOS},
           "paired_speedup": {k: median_ratio for k in R.RATIOS},
           "paired_iqr": {k: list(iqr) for k in R.RATIOS}}
    lat.update(R.resolution(lat))
    return lat


def _synthetic_report() -> dict:
    ops = {"taso": 10, "generic": 1, "weights": 3, "taso_by_op": {"conv2d": 10}, "generic_by_op": {"Erf": 1}}

    def model(name, lat):
        return {"name": name, "title": name.upper(), "config": "synthetic", "status": "ok",
                "published": None, "onnx": {"nodes": 11, "parameters": 1000},
                "ops": {"before": ops, "after": ops, "exported_nodes": 11, "onnxslim_nodes": 11,
                        "ort_optimized_nodes": 9},
                "times_s": {"optimize": 0.5, "import": 0.1, "export": 0.1, "onnxslim": 0.2},
                "memory": {"peak_rss_mb": 100.0, "peak_increase_mb": 10.0},
                "numerics": {"optimized_max_abs": 0.0, "onnxslim_max_abs": 0.0, "ort_disabled_max_abs": 0.0},
                "cost": {"status": R.COST_UNAVAILABLE}, "latency": lat}

    return {"date": "2026-01-01T00:00:00+00:00", "wall_time_s": 12.0, "quick": True,
            "machine": {"cpu": "cpu", "cpus": 2, "memory_gib": 8, "system": "Linux", "accelerator": "none",
                        "python": "3"},
            "versions": {"onnx": "1"}, "command": ["taso-bench", "--quick"],
            "optimizer": {"name": "taso-search", "pipeline": "builtin.module(taso-search,taso-dce)"},
            "cost_model": {"requested": None, "status": R.COST_REPORTED, "default": None},
            "settings": {"rounds": 5, "min_rounds": 3, "budget_s": 0.5, "epochs": 2, "warmup": 1, "threads": 1,
                         "numeric_trials": 2, "tolerance": 1e-4},
            "models": [model("fast", _lat(1.3, (1.2, 1.4))), model("noisy", _lat(1.04, (0.8, 1.3))),
                       model("edge", _lat(1.0, (1.0, 1.0)))]}


def test_unresolved_marks_in_table_markdown_json_and_chart(tmp_path):
    rep = _synthetic_report()
    fast, noisy, edge = (m["latency"] for m in rep["models"])
    # results.json's marks
    assert fast["resolved"] == {k: True for k in R.RATIOS}
    assert noisy["resolved"] == edge["resolved"] == {k: False for k in R.RATIOS}
    assert noisy["speedup_label"]["optimized"] == "~1.0x (unresolved: IQR 0.800-1.300)"
    assert fast["speedup_label"]["optimized"] == "1.300x"
    assert R.unresolved(_lat(0.9, (0.85, 0.999)), "optimized") is False  # a resolved slowdown
    R._write_outputs(str(tmp_path), rep)
    data = json.loads((tmp_path / "results.json").read_text())
    by = {m["name"]: m["latency"] for m in data["models"]}
    assert by["noisy"]["resolved"]["optimized"] is False and by["fast"]["resolved"]["optimized"] is True
    assert by["noisy"]["speedup_label"]["onnxslim"].startswith("~1.0x (unresolved")
    # the stdout table: the unresolved rows say so in every ratio column, never "1.040x"
    rows = {line.split()[0]: line for line in R.format_table(rep).splitlines() if line.split()}
    assert rows["noisy"].count("~1.0x (unresolved: IQR 0.800-1.300)") == 3 and "1.040x" not in rows["noisy"]
    assert rows["edge"].count("~1.0x (unresolved: IQR 1.000-1.000)") == 3
    assert "1.300x" in rows["fast"] and "unresolved" not in rows["fast"]
    # report.md: the same marks in the main table, the peers and the published comparison; what it means
    md = R.format_markdown(rep)
    assert md == (tmp_path / "report.md").read_text()
    noisy_rows = [line for line in md.splitlines() if line.startswith("| noisy |")]
    assert len(noisy_rows) == 3 and all("~1.0x (unresolved: IQR 0.800-1.300)" in line for line in noisy_rows)
    assert not [line for line in md.splitlines() if line.startswith("| fast |") and "unresolved" in line]
    assert "*Unresolved*: a ratio whose interquartile range" in md and "noise-dominated" in md
    # the chart: unresolved ratios are drawn as IQRs, not speedup bars
    series = R.chart_series(rep)
    for label, vals, hatch, unres in series[:3]:
        assert unres == [None, (0.8, 1.3), (1.0, 1.0)], label
    assert all(u == [None] * 3 for *_, u in series[3:])
    assert (tmp_path / "speedup.png").read_bytes().startswith(b"\x89PNG")


def test_quick_models_are_valid_onnx():
    """The tiny variants: opset 17, onnx.checker's full check, run in onnxruntime with finite outputs."""
    for m in S.suite(quick=True):
        model = m.build()
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == 17
        so = ort.SessionOptions()
        so.log_severity_level = 3
        s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = s.run(None, random_inputs(model))
        assert all(np.isfinite(o).all() for o in outs), m.name


# ------------------------------------------------------------------------------------------------
# errors


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line_error(rc, err, want):
    lines = err.strip().splitlines()
    assert rc == 1, err
    assert len(lines) == 1 and lines[0].startswith("taso-bench: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    assert want in lines[0], err


@pytest.mark.parametrize("argv, want", [
    (["--models", "resnet51"], "unknown model 'resnet51'"),
    (["--models", ","], "names no model"),
    (["--pipeline", "builtin.module(no-such-pass)"], "no-such-pass"),
    (["--pipeline", "func.func(cse)"], "must be 'builtin.module(...)'"),
    (["--cost-model", "gpu"], "invalid choice: 'gpu'"),
    (["--optimizer", "greedy"], "invalid choice: 'greedy'"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--rounds", "x"], "invalid int value: 'x'"),
    (["--budget", "nan"], "--budget must be"),
    (["--threads", "-1"], "--threads must be"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_user_errors(capsys, tmp_path, argv, want):
    rc, out, err = _run(capsys, "--quick", "--out", tmp_path / "o", *argv)
    _one_line_error(rc, err, want)
    assert not (tmp_path / "o").exists()  # nothing written for a bad command line


def test_out_is_a_file(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    rc, out, err = _run(capsys, "--quick", "--models", "nasrnn", "--out", f)
    _one_line_error(rc, err, "exists and is not a directory")
    assert f.read_text() == "x"


def test_taso_search_optimizer(capsys, tmp_path):
    """--optimizer taso-search: the search runs on every model, its costs are reported (before, after,
    never an increase), and the optimized models agree with the originals in onnxruntime."""
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "squeezenet,resnet50", "--out", tmp_path,
                        "--optimizer", "taso-search", "--rounds", "2", "--budget", "0")
    assert rc == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["optimizer"]["name"] == "taso-search"
    for m in rep["models"]:
        assert m["status"] == "ok", m
        c = m["cost"]
        assert c["before"] > 0 and 0 < c["after"] <= c["before"], (m["name"], c)
        assert c["imported"] >= c["before"]  # (the prepared function, the search's baseline, is no dearer)
    # the tiny ResNet has Conv + BatchNormalization + Relu: the folding and the relu fusion fire before
    # the search, so the model as imported costs more than the prepared one
    resnet = next(m for m in rep["models"] if m["name"] == "resnet50")
    assert resnet["cost"]["after"] < resnet["cost"]["imported"]
    assert resnet["cost"]["reduction_imported"] > resnet["cost"]["reduction"] >= 0


def test_list(capsys):
    rc, out, err = _run(capsys, "--list")
    assert rc == 0 and err == ""
    assert [line.split()[0] for line in out.splitlines()] == S.model_names()


def test_cost_model_and_pipeline_in_process(capsys, tmp_path):
    """--cost-model is accepted and reported as unavailable (no cost is made up); --pipeline is what runs."""
    pipeline = "builtin.module(taso-verify,taso-dce,cse)"
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "nasrnn,squeezenet", "--out", tmp_path,
                        "--cost-model", "analytic", "--pipeline", pipeline, "--rounds", "2", "--budget", "0")
    assert rc == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["optimizer"] == {"name": "pipeline", "pipeline": pipeline}
    assert rep["cost_model"]["requested"] == "analytic" and "unavailable" in rep["cost_model"]["status"]
    assert [m["name"] for m in rep["models"]] == ["nasrnn", "squeezenet"]
    for m in rep["models"]:
        assert m["status"] == "ok"
        assert m["cost"] == {"model": "analytic", "before": None, "after": None, "status": taso_bench.COST_UNAVAILABLE}
        assert m["latency"]["rounds"] == 2
    assert "cost model: analytic: unavailable: the optimizer is not taso-search" in (tmp_path / "report.md").read_text()


def test_baseline(capsys, tmp_path, quick_run):
    """--baseline: the report compares this run's ratios with a previous run's (here the quick run's)."""
    _, prev = quick_run
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "vgg19,nasrnn", "--out", tmp_path,
                        "--baseline", prev / "results.json", "--rounds", "2", "--budget", "0")
    assert rc == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    base = rep["baseline"]
    old = {m["name"]: m for m in json.loads((prev / "results.json").read_text())["models"]}
    assert [r["name"] for r in base["models"]] == ["vgg19", "nasrnn"]
    for row in base["models"]:
        now = next(m for m in rep["models"] if m["name"] == row["name"])
        assert row["speedup"]["optimized"] == [old[row["name"]]["latency"]["speedup"]["optimized"],
                                               now["latency"]["speedup"]["optimized"]]
    md = (tmp_path / "report.md").read_text()
    assert "## Against a previous run" in md and "| vgg19 | " in md.split("## Against a previous run")[1]


@pytest.mark.parametrize("content, want", [
    (None, "no such file"),
    (b"\x89PNG", "not JSON"),
    (b'{"tool": "other", "models": []}', "not a taso-bench results.json"),
])
def test_bad_baseline(capsys, tmp_path, content, want):
    path = tmp_path / "prev.json"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = _run(capsys, "--quick", "--out", tmp_path / "o", "--baseline", path)
    _one_line_error(rc, err, want)
    assert not (tmp_path / "o").exists()


def test_failed_model_is_reported(capsys, tmp_path, monkeypatch):
    """A model that cannot be built correctly: a FAILED row, status in the JSON, exit 1 with one line."""
    real = S.suite

    def broken(quick=False):
        out = []
        for m in real(quick):
            if m.name == "squeezenet":
                def bad(build=m.build):
                    model = build()
                    model.graph.node[0].input[0] = "no_such_value"
                    return model
                m = S.SuiteModel(m.name, m.title, m.config, bad)
            out.append(m)
        return out

    monkeypatch.setattr(S, "suite", broken)
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "squeezenet,nasrnn", "--out", tmp_path,
                        "--rounds", "1", "--min-rounds", "1")
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("taso-bench: error: 1 of 2 model(s) failed: squeezenet: the built model fails onnx.checker")
    assert "Traceback" not in err
    rep = json.loads((tmp_path / "results.json").read_text())
    st = {m["name"]: m["status"] for m in rep["models"]}
    assert st == {"squeezenet": "failed", "nasrnn": "ok"}
    assert "| squeezenet | quick: channels /8, 1x3x64x64 | FAILED: the built model fails onnx.checker" in \
        (tmp_path / "report.md").read_text()
    assert "FAILED" in out


# ------------------------------------------------------------------------------------------------
# the full-size builders

#: Trainable parameters of the real architectures (BatchNorm running statistics excluded), as torchvision
#: and the papers count them; ResNet-50 without TASO's missing stem (25,557,032 - 7x7x3x64 conv - 64-ch BN).
PARAMS = {
    "bert-b1": 8 * (4 * (1024 * 1024 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 4 * 1024),
    "bert-b16": 8 * (4 * (1024 * 1024 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 4 * 1024),
    "resnext50": 25_028_904,
    "nasrnn": 8 * (512 * 512 + 512) + 8 * 512 * 512,
    "inception3": 23_834_568,
    "squeezenet": 1_235_496,
    "vgg19": 143_667_240,
    "resnet50": 25_557_032 - 3 * 64 * 7 * 7 - 2 * 64,
}
ROUND_TRIP_MAX_MB = 150


@pytest.mark.slow
@pytest.mark.parametrize("name", S.model_names())
def test_full_size_model(name):
    from taso_mlir.benchmarks.example_models import weight_bytes
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.numerics import compare_models
    from taso_mlir.dialect.onnx_export import export_onnx
    from taso_mlir.dialect.onnx_import import import_onnx

    model = S.build(name)
    onnx.checker.check_model(model, full_check=True)
    if name in PARAMS:
        assert S.parameter_count(model) == PARAMS[name]
    ops = collections.Counter(n.op_type for n in model.graph.node)
    quick_ops = collections.Counter(n.op_type for n in S.build(name, quick=True).graph.node)
    assert set(ops) == set(quick_ops)  # the quick variant has the same kinds of nodes
    if name == "nasnet-a":  # 15 normal cells (6-way Concat) and 2 reduction cells (4-way)
        assert ops["Concat"] == 17
        assert sorted(len(n.input) for n in model.graph.node if n.op_type == "Concat") == [4] * 2 + [6] * 15
        depthwise = [n for n in model.graph.node if n.op_type == "Conv" and
                     next(a.i for a in n.attribute if a.name == "group") > 1]
        assert len(depthwise) == 15 * 5 + 2 * 5  # separable convs: 5 per normal cell, 5 per reduction cell
    if name.startswith("bert"):
        assert ops["LayerNormalization"] == 16 and ops["Softmax"] == 8 and ops["Erf"] == 8
    if name in ("inception3", "squeezenet", "vgg19", "resnet50", "resnext50"):
        assert ops == quick_ops  # same depth, narrower
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = s.run(None, random_inputs(model))
    assert all(np.isfinite(o).all() for o in outs)
    del s
    if weight_bytes(model) / 1e6 <= ROUND_TRIP_MAX_MB:
        exported = export_onnx(import_onnx(model, make_context(), where=name))
        rep = compare_models(model, exported)
        assert rep.rel <= 1e-5, rep


def test_cpu_cost_model_reports_the_latency_check(capsys, tmp_path, monkeypatch):
    """With --cost-model cpu the search's latency check (the result timed against the input inside the pass)
    is in results.json and report.md for every model the search changed."""
    monkeypatch.setenv("TASO_CACHE_DIR", str(tmp_path / "cache"))
    rc, out, err = _run(capsys, "--quick", "--in-process", "--models", "resnet50", "--out", tmp_path / "o",
                        "--optimizer", "taso-search", "--cost-model", "cpu", "--rounds", "2", "--budget", "0")
    assert rc == 0, err
    m = json.loads((tmp_path / "o" / "results.json").read_text())["models"][0]
    assert m["status"] == "ok" and m["cost"]["model"] == "cpu"
    checks = m["cost"]["latency_check"]
    assert len(checks) == 1, m["cost"]
    assert checks[0]["kept"] in ("search result", "search without splits", "input")
    # a search result was timed (the prepared function, its relus fused, differs from the input even where
    # the search applies no rule); where the check kept the input (a noisy machine can time it slower), the
    # report counts no rewrite
    if checks[0]["kept"] == "input":
        assert m["cost"]["rewrites_applied"] == 0, m["cost"]
    assert checks[0]["tried"] and all(t["speedup"] > 0 for t in checks[0]["tried"])
    md = (tmp_path / "o" / "report.md").read_text()
    assert "taso-search's latency check" in md and f"kept: {checks[0]['kept']}" in md
