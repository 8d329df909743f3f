"""Real exported models round-trip with equal outputs, and come out of ``taso-search`` with equal outputs.

CNNs (ResNet-18/50, MobileNetV2, ResNeXt) and transformer encoders (BERT, ``torch.nn.TransformerEncoder``)
defined in ``benchmarks/torch_models.py`` are exported by PyTorch's ONNX exporter at opset 17 with random
weights, imported into the `taso` dialect and exported back by ``taso-opt in.onnx -o out.onnx`` (a fresh
process, timed, with its peak RSS). The result must pass ``onnx.checker`` (full check) and give the
original's onnxruntime outputs within 1e-5 x max(1, max|output|) on two input sets (token ids over the
whole vocabulary, a padded attention mask). Models up to ~100 MB must round-trip in under 30 s and 4 GB.

Needs torch (``pip install torch==2.13.0``; skipped without it). The ``dynamo`` exporter also needs
onnxscript (skipped without it). BERT-base (~440 MB) and the ~600 MB encoder run only with
``TASO_BIG_MODELS=1``. Each model's measurements are printed in the summary at the end.
"""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest

torch = pytest.importorskip(
    "torch", reason="torch not installed: pip install torch==2.13.0 to run the exported-model round trips")

from taso_mlir.benchmarks import torch_models as tm  # noqa: E402

BIG = os.environ.get("TASO_BIG_MODELS") == "1"
TOL = 1e-5
#: the requirement's budget for a ~100 MB model, applied to every model of up to 110 MB of weights
BUDGET_S, BUDGET_MB, BUDGET_WEIGHTS_MB = 30.0, 4096.0, 110.0


def _have_onnxscript() -> bool:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def _params():
    out = []
    for exporter in ("torchscript", "dynamo"):
        for name, info in tm.MODELS.items():
            marks = []
            if info.big and not BIG:
                marks.append(pytest.mark.skip(reason=f"{name} is big: set TASO_BIG_MODELS=1 to run it"))
            if exporter == "dynamo" and not _have_onnxscript():
                marks.append(pytest.mark.skip(reason="onnxscript not installed: the dynamo exporter needs it"))
            out.append(pytest.param(name, exporter, id=f"{name}-{exporter}", marks=marks))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_exported")


def _export(workdir, name: str, exporter: str) -> str:
    path = str(workdir / f"{name}.{exporter}.onnx")
    if not os.path.exists(path):
        tm.export(name, path, exporter)
    return path


def _cleanup(*paths):
    for p in paths:
        for q in (p, p + ".data"):
            if os.path.exists(q):
                os.remove(q)


@pytest.mark.parametrize("name,exporter", _params())
def test_exported_model_round_trips(workdir, name, exporter, taso_summary):
    src = _export(workdir, name, exporter)
    dst = str(workdir / f"{name}.{exporter}.taso.onnx")
    stats = tm.model_stats(src)
    # the TorchScript exporter writes opset 17; the dynamo exporter's conversion down to 17 fails for
    # graphs with ReduceMean-18 (the CNNs' global pooling), which then stay at opset 18
    assert stats["opset"] == 17 or (exporter == "dynamo" and stats["opset"] == 18), stats
    try:
        rt = tm.roundtrip(src, dst)
        assert rt.rc == 0, rt.stderr
        onnx.checker.check_model(dst, full_check=True)  # path-based: works for any size
        out = onnx.load(dst, load_external_data=False)
        orig = onnx.load(src, load_external_data=False)
        assert [i.name for i in out.graph.input] == [i.name for i in orig.graph.input]
        assert [o.name for o in out.graph.output] == [o.name for o in orig.graph.output]
        assert [(o.domain, o.version) for o in out.opset_import] == [(o.domain, o.version) for o in orig.opset_import]
        del out, orig
        max_abs, scale = tm.compare_outputs(src, dst, tm.feeds_for(name))
        taso_summary(
            f"{name} ({exporter}, opset {stats['opset']}): {stats['nodes']} nodes, {stats['weight_mb']:.1f} MB "
            f"of weights: round trip {rt.wall_s:.2f} s, peak RSS {rt.peak_rss_mb:.0f} MB, max |diff| "
            f"{max_abs:.3g} (output scale {scale:.3g})")
        assert max_abs <= TOL * scale, f"max |diff| {max_abs} > {TOL} x {scale}"
        if stats["weight_mb"] <= BUDGET_WEIGHTS_MB:
            assert rt.wall_s < BUDGET_S, f"round trip took {rt.wall_s:.1f} s"
            assert rt.peak_rss_mb < BUDGET_MB, f"round trip peak RSS {rt.peak_rss_mb:.0f} MB"
    finally:
        _cleanup(src, dst)


@pytest.mark.parametrize("name", [n for n, info in tm.MODELS.items() if not info.big])
def test_exported_model_taso_search(workdir, name, taso_summary):
    """``taso-opt in.onnx --taso-search -o out.onnx`` on each exported model (TorchScript exporter): no
    crash, taso-opt's own onnxruntime check passes, the outputs agree here too, and the ResNets (batch norms
    folded by the exporter into biased convolutions) cost less: their relus fuse into the convolutions
    (which the ONNX export writes back as Conv + Relu, ONNX's Conv having no activation)."""
    src = _export(workdir, name, "torchscript")
    dst = str(workdir / f"{name}.search.onnx")
    try:
        rt = tm.roundtrip(src, dst, "--taso-search", "--taso-report")
        assert rt.rc == 0, rt.stderr
        assert "onnxruntime: ok" in rt.stderr, rt.stderr
        max_abs, scale = tm.compare_outputs(src, dst, tm.feeds_for(name))
        assert max_abs <= TOL * scale, f"max |diff| {max_abs} > {TOL} x {scale}"
        m = re.search(r"cost ([0-9.]+) -> ([0-9.]+) ms", rt.stderr)
        assert m, rt.stderr
        before, after = float(m.group(1)), float(m.group(2))
        assert after <= before
        if name.startswith("res"):  # biased relu fusion (the exported Conv + Relu pairs) fires
            assert after < before, rt.stderr
        taso_summary(f"{name} taso-search: cost {before} -> {after} ms (analytic T4), max |diff| {max_abs:.3g}")
    finally:
        _cleanup(src, dst)


def test_models_are_real_sized():
    """The set covers what the requirement names: 50-600 nodes (ResNet-18 with its BatchNorms folded by
    the exporter has 49), one model of ~100 MB and one of ~600 MB of weights (counted without torch)."""
    sizes = {}
    for name in tm.MODELS:
        with torch.device("meta"):  # shapes only, no memory
            m = tm.MODELS[name].build()
        sizes[name] = sum(p.numel() * p.element_size() for p in m.parameters()) / 1e6
    assert 95 <= sizes["resnet50"] <= 110, sizes
    assert 560 <= sizes["bert_600mb"] <= 600, sizes


def test_python_api_round_trip(workdir):
    """The same round trip through the Python API, in process, on a transformer encoder."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.onnx_export import export_onnx, save_onnx
    from taso_mlir.dialect.onnx_import import import_onnx, load_onnx

    src = _export(workdir, "bert_mini", "torchscript")
    dst = str(workdir / "bert_mini.api.onnx")
    try:
        module = import_onnx(load_onnx(src), make_context())
        ops = {o.operation.name for o in module.body.operations[0].operation.regions[0].blocks[0].operations}
        assert {"taso.matmul", "taso.ewadd", "taso.transpose", "taso.reshape", "taso.weight"} <= ops, ops
        save_onnx(export_onnx(module), dst)
        onnx.checker.check_model(dst, full_check=True)
        max_abs, scale = tm.compare_outputs(src, dst, tm.feeds_for("bert_mini"))
        assert max_abs <= TOL * scale
    finally:
        _cleanup(src, dst)


def test_inputs_exercise_the_mask():
    """The second sequence is padded, so the mask path matters: the outputs at unpadded positions differ
    from those of an unmasked run."""
    feeds = tm.example_inputs("bert_mini")
    assert feeds["attention_mask"][1].min() == 0 and feeds["attention_mask"][0].min() == 1
    m = tm.build("bert_mini")
    with torch.no_grad():
        args = [torch.from_numpy(v) for v in feeds.values()]
        masked = m(*args)[0].numpy()
        args[-1] = torch.ones_like(args[-1])
        unmasked = m(*args)[0].numpy()
    assert np.allclose(masked[0], unmasked[0], atol=1e-5)
    assert not np.allclose(masked[1, :8], unmasked[1, :8], atol=1e-3)


def test_search_table(tmp_path, capsys):
    """``--search`` exports, optimizes with both cost models, checks and times: a row with both results."""
    assert tm.main(["--search", "resnet18", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| resnet18 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 9 and "FAILED" not in row, row
    assert cells[3].endswith("%") and cells[7].endswith("%") and cells[6].endswith(")") and cells[8].endswith(")")
