"""What people see of the tools (issue 22): progress on stderr (silent unless asked for, or on a terminal),
the one-line summary after taso-search, --version, and one-line errors for inputs that used to give an
empty module, a truncated dump, an internal error or a silent no-op."""

from __future__ import annotations

import io
import pathlib
import re
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from taso_mlir.dialect import progress
from taso_mlir.tools import taso_opt
from taso_mlir.tools.taso_opt import main, search_summary

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "benchmarks" / "models" / "example_cnn.onnx"


@pytest.fixture(autouse=True)
def _no_reporter():
    progress.disable()
    yield
    progress.disable()


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_error(capsys, want: str, *argv) -> str:
    rc, _, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 1, err
    assert len(lines) == 1 and lines[0].startswith("taso-opt: error: ") and "internal error" not in err, err
    assert want in lines[0], err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# the progress module


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_is_silent_until_enabled(capsys):
    assert not progress.active()
    progress.phase("import")
    progress.update("anything")
    progress.clear()
    assert capsys.readouterr().err == ""


def test_plain_progress_is_a_line_per_phase_and_at_most_one_update_a_second():
    out, clock = io.StringIO(), _Clock()
    progress.enable(out, tty=False, clock=clock)
    progress.phase("import m.onnx")
    for i in range(500):  # 500 updates over 3.9 s: three lines, not 500
        clock.t += 1 / 128
        progress.update(f"@main: pass {i}")
    progress.phase("export to ONNX")
    progress.disable()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert lines[0] == "taso-opt: [  0.0 s] import m.onnx", lines
    assert lines[1:4] == [f"taso-opt: [  {t:.1f} s] import m.onnx: @main: pass {i}"
                          for t, i in ((1, 127), (2, 255), (3, 383))], lines
    assert lines[4:] == ["taso-opt: [  3.9 s] export to ONNX"], lines


def test_terminal_progress_is_one_line_rewritten_and_erased(monkeypatch):
    term, clock = io.StringIO(), _Clock()
    monkeypatch.setattr(sys, "stderr", term)
    progress.enable(tty=True, width=40, clock=clock)
    assert sys.stderr is not term  # (wrapped: other output erases the line first)
    progress.phase("taso-search")
    progress.update("@main_graph: too soon after the last")  # (redrawn at most ten times a second)
    clock.t += 0.5
    progress.update("@main_graph: a pass whose name is far too long for forty columns")
    sys.stderr.write("other output\n")
    progress.phase("export to ONNX")
    progress.disable()
    assert sys.stderr is term
    text = term.getvalue()
    assert text == ("\rtaso-opt: [  0.0 s] taso-search\x1b[K"
                    "\rtaso-opt: [  0.5 s] taso-search: @ma...\x1b[K"  # (39 columns)
                    "\r\x1b[Kother output\n"  # erased before other output
                    "\rtaso-opt: [  0.5 s] export to ONNX\x1b[K"
                    "\r\x1b[K"), repr(text)  # and at the end


# ---------------------------------------------------------------------------------------------
# taso-opt: progress and the summary


SUMMARY = re.compile(r"taso-opt: target analytic:t4 \(estimated\): cost [0-9.]+ -> [0-9.]+ ms, ops 64 -> 31, "
                     r"0 rewrites, [0-9.]+ s")


def test_search_progress_in_a_log_and_the_summary(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)  # (every update shown: each pass, each window)
    rc, out, err = run(capsys, EXAMPLE, "--taso-search", "-o", tmp_path / "out.onnx", "--progress")
    assert rc == 0 and out == "", err
    assert "\r" not in err
    lines = err.splitlines()
    phases = [ln.split("] ", 1)[1] for ln in lines if ln.startswith("taso-opt: [")]
    for want in (f"import {EXAMPLE}", "taso-search", "taso-search: @main_graph: taso-fold-batchnorm",
                 "taso-search: @main_graph: taso-backtracking-search",
                 "taso-search: @main_graph: search window 1/1, cost", "taso-search: @main_graph: taso-compose-layout-chains",
                 "export to ONNX", f"write {tmp_path / 'out.onnx'}", "numeric check"):
        assert any(p.startswith(want) for p in phases), (want, phases)
    ends = lines[-2:]
    assert SUMMARY.fullmatch(ends[0]) and len(ends[0]) <= 120, ends
    assert ends[1].startswith("taso-opt: numerics: ") and ends[1].endswith("onnxruntime: ok"), ends


def test_no_progress_by_default_off_a_terminal_and_with_no_progress(capsys, tmp_path):
    for flags in ([], ["--progress", "--no-progress"]):
        rc, _, err = run(capsys, EXAMPLE, "--taso-search", "-o", tmp_path / "out.onnx", *flags)
        lines = err.splitlines()
        assert rc == 0 and len(lines) == 2 and SUMMARY.fullmatch(lines[0]), err
        assert lines[1].startswith("taso-opt: numerics: ")


def test_progress_on_a_terminal_by_default(capsys, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main([str(EXAMPLE), "--taso-search", "--no-verify-numerics", "-o", str(tmp_path / "out.onnx")]) == 0
    text = term.getvalue()
    assert "\rtaso-opt: [" in text and "] import " in text and "] export to ONNX" in text
    # the progress line is erased before the summary, which is a line of its own
    summary = text.rsplit("\r\x1b[K", 1)[1]
    assert SUMMARY.fullmatch(summary.strip()) and summary.endswith("\n"), repr(text[-300:])


def test_summary_of_a_measured_search():
    rep = {"target": "cpu", "measured": True, "cost_before_ms": 0.13912, "cost_after_ms": 0.11381,
           "compute_ops_before": 64, "compute_ops_after": 31, "time_s": 2.93, "applied": {"B0005b": 8},
           "functions": [{"rewrites_applied": 13, "latency_check": {
               "tried": [{"what": "search result", "speedup": 1.0012, "iqr": [0.98, 1.02], "rounds": 12}],
               "kept": "search result"}}]}
    line = search_summary(rep)
    assert line == "target cpu (measured): cost 0.139 -> 0.114 ms, ops 64 -> 31, 13 rewrites, latency 1.00x, 2.9 s"
    rep["functions"][0]["latency_check"] = {"tried": [
        {"what": "search result", "speedup": 0.9, "iqr": [0.85, 0.95], "rounds": 9},
        {"what": "search without splits", "speedup": 1.05, "iqr": [1.01, 1.1], "rounds": 9}],
        "kept": "search without splits"}
    assert "latency 1.05x without splits" in search_summary(rep)
    rep["functions"][0]["latency_check"]["kept"] = "input"
    assert "input kept" in search_summary(rep) and len("taso-opt: " + search_summary(rep)) <= 120


def test_version(capsys):
    from importlib.metadata import version

    from taso_mlir.tools import taso_bench, taso_gen, taso_verify

    rc, out, err = run(capsys, "--version")
    assert rc == 0 and out == f"taso-opt {version('taso-mlir')}\n" and err == ""
    for prog, tool in (("taso-gen", taso_gen), ("taso-verify", taso_verify), ("taso-bench", taso_bench)):
        assert tool.main(["--version"]) == 0
        assert capsys.readouterr().out == f"{prog} {version('taso-mlir')}\n"
    # the command (contained in a child process) too; --version is not an upstream pass
    r = subprocess.run([sys.executable, "-m", "taso_mlir.tools.taso_opt", "--version"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == f"taso-opt {version('taso-mlir')}\n" and r.stderr == "", r


def test_help_has_no_project_history(capsys):
    from taso_mlir.tools import taso_bench

    for tool in (taso_opt._build_parser(), taso_bench._build_parser()):
        text = tool.format_help()
        assert not re.search(r"its own issue|until \S+ lands|until it lands", text), text
    assert "--progress" in taso_opt._build_parser().format_help()


# ---------------------------------------------------------------------------------------------
# one-line errors


@pytest.mark.parametrize("text", ["", "  \n\n", "// only a comment\n   // and another\n"])
def test_empty_mlir_input(capsys, tmp_path, text):
    src = tmp_path / "in.mlir"
    src.write_text(text)
    one_error(capsys, f"{src}: empty input: no module", src, "-o", tmp_path / "out.mlir")
    assert not (tmp_path / "out.mlir").exists()


def _model(shape):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, shape)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("spec,want", [
    ("x=1x3", "--input-shape x=1x3: graph input 'x' has rank 4 (Nx3x8x8), the shape given has rank 2"),
    ("x=", "graph input 'x' has rank 4 (Nx3x8x8), the shape given has rank 0"),
    ("x=0x3x8x8", "--input-shape x=0x3x8x8: every dimension must be at least 1, got 0"),
    ("x=1x-3x8x8", "every dimension must be at least 1, got -3"),
    ("x=1xAx8x8", "expected NAME=D0xD1x... with integer dimensions"),
    ("z=1x3x8x8", "--input-shape names unknown graph input(s): z (the graph inputs: 'x')"),
])
def test_input_shape_checked_against_the_model(capsys, tmp_path, spec, want):
    src = tmp_path / "in.onnx"
    onnx.save(_model(["N", 3, 8, 8]), src)
    line = one_error(capsys, want, src, "--input-shape", spec, "-o", tmp_path / "out.onnx")
    assert len(line) < 300  # (not a dump of ONNX's shape inference)
    rc, _, err = run(capsys, src, "--input-shape", "x=2x3x8x8", "-o", tmp_path / "out.onnx")
    assert rc == 0, err


def test_emit_pdl_and_emit_irdl_together(capsys, tmp_path):
    one_error(capsys, "--emit-pdl and --emit-irdl", "--emit-pdl", "--emit-irdl", "-o", tmp_path / "x.mlir")
    assert not (tmp_path / "x.mlir").exists()


IMPORTER_FORM = """module {
  func.func @main_graph(%arg0: !torch.vtensor<[DIM,4],f32>) -> !torch.vtensor<[DIM,4],f32> attributes {torch.onnx_meta.ir_version = 8 : si64, torch.onnx_meta.opset_version = 17 : si64} {
    %0 = torch.operator "onnx.Constant"() {torch.onnx.value = dense<0.5> : tensor<4x4xf32>} : () -> !torch.vtensor<[4,4],f32>
    %1 = torch.operator "onnx.MatMul"(%arg0, %0) : (!torch.vtensor<[DIM,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[DIM,4],f32>
    %2 = torch.operator "onnx.Relu"(%1) : (!torch.vtensor<[DIM,4],f32>) -> !torch.vtensor<[DIM,4],f32>
    return %2 : !torch.vtensor<[DIM,4],f32>
  }
}
"""


def test_importer_form_needs_the_conversion(capsys, tmp_path):
    src = tmp_path / "imported.mlir"
    src.write_text(IMPORTER_FORM.replace("DIM", "2"))
    one_error(capsys, "the input is the ONNX importer's form (torch.operator \"onnx.*\" ops): add "
                      "--convert-onnx-to-taso before --taso-search", src, "--taso-search", "-o", tmp_path / "o.mlir")
    one_error(capsys, "add --convert-onnx-to-taso before --taso-fold-batchnorm", src,
              "--pass-pipeline=builtin.module(canonicalize,taso-fold-batchnorm,convert-onnx-to-taso)")
    rc, _, err = run(capsys, src, "--convert-onnx-to-taso", "--taso-search", "-o", tmp_path / "o.mlir")
    assert rc == 0 and "note:" not in err, err
    assert "taso.matmul" in (tmp_path / "o.mlir").read_text()


def test_dynamic_shapes_after_the_importer_are_named(capsys, tmp_path):
    src = tmp_path / "imported.mlir"
    src.write_text(IMPORTER_FORM.replace("DIM", "?"))
    rc, _, err = run(capsys, src, "--convert-onnx-to-taso", "--taso-search", "-o", tmp_path / "o.mlir")
    lines = err.splitlines()
    assert rc == 0 and len(lines) == 2 and lines[0].startswith("taso-opt: target analytic:t4"), err
    assert lines[1].startswith("taso-opt: note: graph input(s) 'input_0' (?x4) have dynamic shapes") \
        and "--input-shape" in lines[1], err


def test_torch_models_without_torch_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    from taso_mlir.benchmarks import torch_models

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    for argv in (["resnet18", str(tmp_path / "r.onnx")], ["--measure"], ["--search", "resnet18"]):
        assert torch_models.main(argv) == 1
        err = capsys.readouterr().err
        assert err == ("python -m taso_mlir.benchmarks.torch_models: error: torch not installed: "
                       "pip install 'taso-mlir[torch]'\n"), err
    assert not (tmp_path / "r.onnx").exists()


def test_quick_start_and_bench_outputs_are_ignored():
    ignore = ROOT / ".gitignore"
    if not ignore.exists():
        pytest.skip("not a git checkout")
    lines = ignore.read_text().splitlines()
    assert "/example_cnn.opt.onnx" in lines and "/taso-bench-out/" in lines
    from taso_mlir.benchmarks.runner import DEFAULT_OUT

    assert DEFAULT_OUT == "taso-bench-out"
