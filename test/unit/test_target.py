"""taso-search's target (issue 22): unnamed, it optimizes for the machine it runs on, measured (the CPU in
onnxruntime, with the latency check); a named analytic profile is an estimate, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taso_mlir.dialect.errors import TasoError
from taso_mlir.passes.cost.oracle import Analytic, CpuMeasured, describe, get_cost_model, is_measured, target_of

EXAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "example_cnn.onnx"


def test_target_of_precedence(monkeypatch):
    monkeypatch.delenv("TASO_TARGET", raising=False)
    assert target_of({}) == "auto"
    assert target_of({"target": "", "cost-model": ""}) == "auto"
    monkeypatch.setenv("TASO_TARGET", "analytic:h100")
    assert target_of({}) == "analytic:h100"  # the environment names the default
    assert target_of({"target": "cpu"}) == "cpu"  # an option beats it
    assert target_of({"cost-model": "analytic:v100"}) == "analytic:v100"  # (the older name)
    assert target_of({"target": "cpu", "cost-model": "CPU"}) == "cpu"
    with pytest.raises(TasoError, match="disagree"):
        target_of({"target": "cpu", "cost-model": "analytic"})


def test_auto_is_this_machine_measured_and_analytic_is_an_estimate():
    auto = get_cost_model("auto")
    try:
        assert isinstance(auto, CpuMeasured) and is_measured(auto)
        assert describe(auto).startswith("measured on this machine's CPU")
    finally:
        auto.close()
    t4 = get_cost_model("analytic:t4")
    assert isinstance(t4, Analytic) and not is_measured(t4)
    assert describe(t4) == "estimated by the analytic roofline of an NVIDIA T4"


def _search(tmp_path, *opts, env_target=None):
    env = dict(os.environ)
    env.pop("TASO_TARGET", None)
    if env_target:
        env["TASO_TARGET"] = env_target
    env["TASO_CACHE_DIR"] = str(tmp_path / "cache")
    rep = tmp_path / "r.json"
    o = " ".join([f"report={rep}", *opts])
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", str(EXAMPLE), "-o", str(tmp_path / "o.onnx"),
                        f"--pass-pipeline=builtin.module(taso-search{{{o}}})"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(rep.read_text()), r.stderr


def test_the_default_target_is_measured_on_this_machine(tmp_path):
    rep, _ = _search(tmp_path)
    assert rep["target"] == "cpu" and rep["measured"] is True
    assert rep["costs"].startswith("measured on this machine's CPU")
    fr = rep["functions"][0]
    assert "latency_check" in fr  # the result was timed against the input (or the function is unchanged)
    assert fr["compute_ops_before"] == 64 and fr["compute_ops_after"] <= fr["compute_ops_before"]
    assert os.listdir(tmp_path / "cache")  # the op timings were cached for the next run


def test_a_named_analytic_target_is_labelled_an_estimate(tmp_path):
    rep, _ = _search(tmp_path, "target=analytic:t4")
    assert rep["target"] == "analytic:t4" and rep["measured"] is False
    assert "latency_check" not in rep["functions"][0]
    from taso_mlir.passes.search.taso_search import format_report

    text = format_report(rep)
    assert "target analytic:t4, costs estimated by the analytic roofline of an NVIDIA T4" in text
    assert "% less, estimated; prepared " in text
    rep2, _ = _search(tmp_path, env_target="analytic:t4")  # (TASO_TARGET names the same)
    assert rep2["target"] == "analytic:t4" and rep2["cost_after_ms"] == rep["cost_after_ms"]
