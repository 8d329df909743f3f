"""taso-search as a declared pipeline of function passes (passes/pipeline.py, issue 21): the pipeline is
printed, every pass runs alone, running the passes one by one gives the same model as taso-search, and
the report is built from the statistics the passes declare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taso_mlir.passes import REGISTRY
from taso_mlir.passes.search.taso_search import CLEANUP, FUNCTION_PASSES, PREPARE, SEARCH

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
EXAMPLE = sorted(MODELS.glob("*.onnx"))[0]


def _opt(*args):
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *map(str, args)],
                          capture_output=True, text=True)


def test_the_pipeline_is_printed_with_every_pass():
    r = _opt("--dump-pass-pipeline", "--pass-pipeline=builtin.module(taso-search{budget=7})")
    assert r.returncode == 0, r.stderr
    for p in FUNCTION_PASSES:
        assert p.argument in r.stderr
    assert "taso-backtracking-search{budget=7}" in r.stderr
    assert r.stderr.index("taso-fold-batchnorm") < r.stderr.index("taso-flatten-matmuls") < \
        r.stderr.index("taso-compose-layout-chains")


def test_every_pass_is_registered_with_a_summary_and_statistics_are_report_keys(tmp_path):
    for p in FUNCTION_PASSES:
        assert p.argument in REGISTRY and REGISTRY[p.argument].summary
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    r = _opt(EXAMPLE, "--taso-search", "-o", out, f"--taso-report={rep}")
    assert r.returncode == 0, r.stderr
    fr = json.loads(rep.read_text())["functions"][0]
    for p in FUNCTION_PASSES:
        for k in p.statistics:
            assert k in fr, (p.argument, k)
    assert set(fr["pass_s"]) == {p.argument for p in PREPARE + SEARCH + CLEANUP}


def test_the_passes_one_by_one_give_what_taso_search_gives(tmp_path):
    """Where the never-worse guard keeps the search's result, the passes run one by one from taso-opt
    are exactly taso-search (same bytes)."""
    whole, steps, rep = tmp_path / "whole.onnx", tmp_path / "steps.onnx", tmp_path / "r.json"
    r = _opt(EXAMPLE, "--taso-search", "-o", whole, f"--taso-report={rep}")
    assert r.returncode == 0, r.stderr
    assert "search_result_dropped" not in json.loads(rep.read_text())["functions"][0]
    pipeline = "builtin.module(" + ",".join(p.argument for p in FUNCTION_PASSES) + ")"
    r = _opt(EXAMPLE, f"--pass-pipeline={pipeline}", "-o", steps)
    assert r.returncode == 0, r.stderr
    assert whole.read_bytes() == steps.read_bytes()


@pytest.mark.parametrize("arg", [p.argument for p in FUNCTION_PASSES])
def test_each_pass_runs_alone(tmp_path, arg):
    out = tmp_path / "o.mlir"
    r = _opt(EXAMPLE, f"--{arg}", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "func.func" in out.read_text()
