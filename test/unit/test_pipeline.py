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
from taso_mlir.passes.search.taso_search import CLEANUP, EQSAT_SEARCH, FUNCTION_PASSES, PREPARE, SEARCH

#: the passes taso-search runs by default (strategy=backtracking); FUNCTION_PASSES also has the eqsat search
DEFAULT = PREPARE + SEARCH + CLEANUP

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
EXAMPLE = sorted(MODELS.glob("*.onnx"))[0]


def _opt(*args):
    return subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", *map(str, args)],
                          capture_output=True, text=True)


def test_the_pipeline_is_printed_with_every_pass():
    r = _opt("--dump-pass-pipeline", "--pass-pipeline=builtin.module(taso-search{budget=7})")
    assert r.returncode == 0, r.stderr
    for p in DEFAULT:
        assert p.argument in r.stderr
    assert "taso-eqsat-search" not in r.stderr
    r2 = _opt("--dump-pass-pipeline", "--pass-pipeline=builtin.module(taso-search{strategy=best})")
    assert r2.returncode == 0, r2.stderr
    assert r2.stderr.index("taso-backtracking-search") < r2.stderr.index("taso-eqsat-search")
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
    for p in DEFAULT:
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
    pipeline = "builtin.module(" + ",".join(p.argument for p in DEFAULT) + ")"
    r = _opt(EXAMPLE, f"--pass-pipeline={pipeline}", "-o", steps)
    assert r.returncode == 0, r.stderr
    assert whole.read_bytes() == steps.read_bytes()


@pytest.mark.parametrize("arg", [p.argument for p in FUNCTION_PASSES])
def test_each_pass_runs_alone(tmp_path, arg):
    out = tmp_path / "o.mlir"
    r = _opt(EXAMPLE, f"--{arg}", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "func.func" in out.read_text()


def test_each_pass_runs_from_the_python_api_and_records_its_statistics():
    """Every function pass added to an upstream PassManager by name (``add_taso_pass``) runs on an
    imported model; its declared counters are recorded (``take_statistics``), and taso-fold-batchnorm
    counts the example's batchnorms."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.mlir import passmanager
    from taso_mlir.dialect.onnx_import import import_onnx, load_onnx
    from taso_mlir.passes import add_taso_pass
    from taso_mlir.passes.pipeline import take_statistics

    take_statistics()
    for p in FUNCTION_PASSES:
        ctx = make_context()
        module = import_onnx(load_onnx(str(EXAMPLE)), ctx)
        with ctx:
            pm = passmanager.PassManager.parse("builtin.module(canonicalize)")
            add_taso_pass(pm, p.argument)
            pm.run(module.operation)
            assert module.operation.verify()
        stats = take_statistics()
        assert set(stats) == {p.argument}
        assert set(stats[p.argument]) == set(p.counters)
        if p.argument == "taso-fold-batchnorm":
            assert stats[p.argument]["batchnorms_folded"] > 0


def test_pass_statistics_are_printed_mlir_style(tmp_path):
    r = _opt(EXAMPLE, "--taso-search", "-o", tmp_path / "o.mlir", "--mlir-pass-statistics")
    assert r.returncode == 0, r.stderr
    text = r.stderr[r.stderr.index("... Pass statistics report ..."):]
    for p in DEFAULT:  # every pass of the pipeline that declares counters, each with what it counts
        assert (f"\n{p.argument}\n" in text) == bool(p.counters), p.argument
        for k, what in p.counters.items():
            assert f"({k}) " in text and f" - {what}" in text
    assert "(batchnorms_folded) 0 " not in text  # (the example has batchnorms: counted, not zero)


def test_the_input_is_kept_where_the_whole_pipeline_costs_more(tmp_path, monkeypatch):
    """The prepare passes are outside the segment's never-worse guard: where a target prices the
    batchnorm folded into its convolution (a conv with a bias) above the two ops, the pipeline's result
    costs more than the input, and taso-search keeps the input, saying why. Without that pricing the
    batchnorm is folded as before."""
    from taso_mlir.passes.cost import roofline
    from taso_mlir.tools import taso_opt

    src = tmp_path / "fold.mlir"
    src.write_text((Path(__file__).resolve().parents[2] / "test" / "Passes" / "taso-fold-batchnorm.mlir").read_text().split("// -----")[0])

    def run(name):
        out, rep = tmp_path / f"{name}.mlir", tmp_path / f"{name}.json"
        rc = taso_opt.main([str(src), "-o", str(out), "--no-progress", "--pass-pipeline=builtin.module("
                            f"taso-search{{target=analytic:t4 report={rep}}})"], contain=False)
        assert rc == 0
        return out.read_text(), json.loads(rep.read_text())["functions"][0]

    text, fr = run("plain")
    assert "taso.batchnorm" not in text and fr["batchnorms_folded"] == 1 and "input_kept" not in fr
    assert fr["cost_after_ms"] <= fr["cost_before_ms"]

    real = roofline.Analytic._cost

    def biased_conv_is_dear(self, sig):
        return 1000.0 if sig.kind == "conv2d" and len(sig.in_shapes) == 3 else real(self, sig)

    monkeypatch.setattr(roofline.Analytic, "_cost", biased_conv_is_dear)
    text, fr = run("dear")
    assert "taso.batchnorm" in text and "taso.conv2d" in text, text
    assert "more than the input's" in fr["input_kept"]["why"]
    assert fr["cost_after_ms"] == pytest.approx(fr["cost_before_ms"]) and fr["batchnorms_folded"] == 0
    assert fr["ops_after"] == fr["ops_before"] and fr["applied"] == {}
    from taso_mlir.passes.search import taso_search

    assert "input kept" in taso_opt.search_summary(taso_search.LAST_REPORT)


def test_a_search_runs_with_the_heap_frozen_and_unfreezes_it():
    """The objects alive as a search starts are out of the garbage collector's passes while it runs
    (``gc.freeze``) and back after, also where it raises; a search inside a search leaves that to the
    outer one."""
    import gc

    from taso_mlir.passes.pipeline import frozen_heap

    seen = []

    @frozen_heap
    def search(inner: bool = False, fail: bool = False):
        seen.append(gc.get_freeze_count())
        if inner:
            search()
            seen.append(gc.get_freeze_count())
        if fail:
            raise ValueError("search failed")

    before = gc.get_freeze_count()
    keep = [object() for _ in range(100)]  # (alive as the search starts: frozen)
    search(inner=True)
    assert seen[0] >= len(keep) and seen[1] == seen[0] and seen[2] == seen[0]
    assert gc.get_freeze_count() == before
    with pytest.raises(ValueError):
        search(fail=True)
    assert gc.get_freeze_count() == before


def test_a_search_runs_with_the_collector_s_thresholds_raised_and_restores_them():
    import gc

    from taso_mlir.passes.pipeline import SEARCH_GC_THRESHOLDS, frozen_heap

    seen = []

    @frozen_heap
    def search(fail: bool = False):
        seen.append(gc.get_threshold())
        if fail:
            raise ValueError("search failed")

    before = gc.get_threshold()
    assert before != SEARCH_GC_THRESHOLDS
    search()
    assert seen == [SEARCH_GC_THRESHOLDS] and gc.get_threshold() == before
    with pytest.raises(ValueError):
        search(fail=True)
    assert gc.get_threshold() == before


#: runs both searches on a model in this process with the collector off from each search's start, and
#: prints what a collection at its end finds unreachable (reference cycles the search dropped)
_CYCLES = '''
import collections, gc, json, sys
import taso_mlir.passes.pipeline as P
from taso_mlir.tools.taso_opt import main
found = []
class Collector:  # (the collector as frozen_heap sees it: off and saving what it finds while a search runs)
    def __getattr__(self, name):
        return getattr(gc, name)
    def freeze(self):
        gc.collect(); gc.freeze(); gc.disable(); gc.set_debug(gc.DEBUG_SAVEALL)
    def unfreeze(self):
        gc.collect()
        found.append(dict(collections.Counter(type(o).__name__ for o in gc.garbage)))
        gc.garbage.clear(); gc.set_debug(0); gc.enable(); gc.unfreeze()
P.gc = Collector()
for strategy in ("eqsat", "backtracking"):
    rc = main([sys.argv[1], "-o", sys.argv[2] + f".{strategy}.onnx", "--no-progress",
               f"--pass-pipeline=builtin.module(taso-search{{target=analytic:t4 strategy={strategy}}})"])
    assert rc == 0
print(json.dumps(found))
'''


def test_searches_make_no_reference_cycles(tmp_path):
    """Both searches drop what they made by reference counting alone (``frozen_heap`` runs them with the
    collector's thresholds raised): no object they made is left in a cycle (recursive closures, the
    e-graphs and graphs they read, clear themselves when done)."""
    r = subprocess.run([sys.executable, "-c", _CYCLES, str(EXAMPLE), str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(found) >= 2  # (a search per strategy, at least: one per function)
    assert found == [{}] * len(found), found
