"""Helpers shared by unit tests (imported as a sibling module, like ``onnx_backend_sweep``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from taso_mlir.dialect import specs
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import dense_array, taso_attrs


def run_function(fop, inputs: list) -> list:
    """Evaluate a function of taso ops with the reference semantics (weights and constants in float64)."""
    block = fop.regions[0].blocks[0]
    vals = dict(zip(block.arguments, inputs))
    for o in block.operations:
        op = o.operation
        if op.name == "func.return":
            return [vals[v] for v in op.operands]
        kind = op.name[5:]
        shapes = [tuple(ir.RankedTensorType(r.type).shape) for r in op.results]
        if kind in specs.CONSTANTS:
            outs = [specs.constant(kind, shapes[0], np.float64)]
        elif kind == "weight":
            outs = [dense_array(op.attributes["value"]).astype(np.float64)]
        else:
            a = {k: v for k, v in taso_attrs(op).items() if not k.startswith("taso.")}
            outs = specs.evaluate(kind, [vals[v] for v in op.operands], a, shapes)
        for r, x in zip(op.results, outs):
            vals[r] = x
    raise AssertionError("no return")


def run_pass(text: str, apply, seed: int = 1, scale: float = 1.0, evaluate=None) -> tuple:
    """Parse the one function of ``text``, evaluate it on seeded random inputs (standard normal x
    ``scale``; ``evaluate``: the evaluator, ``run_function`` by default), call ``apply(f)`` on it (a
    function pass), remove dead ops, verify it and evaluate it again. Returns (op names after,
    ``apply``'s result, outputs before, outputs after)."""
    from taso_mlir.dialect.context import make_context
    from taso_mlir.dialect.ops import function_dce

    with make_context(), ir.Location.unknown():
        m = ir.Module.parse(text)
        f = m.body.operations[0].operation
        evaluate = evaluate or run_function
        rng = np.random.default_rng(seed)
        args = [rng.standard_normal(ir.RankedTensorType(a.type).shape) * scale
                for a in f.regions[0].blocks[0].arguments]
        before = evaluate(f, args)
        got = apply(f)
        function_dce(f)
        assert f.verify()
        after = evaluate(f, args)
        names = [o.operation.name for o in f.regions[0].blocks[0].operations]
    return names, got, before, after


def assert_same_in_onnxruntime(src, out, feeds: dict, rtol: float, atol: float) -> None:
    """The ONNX models at paths ``src`` and ``out`` give the same outputs on ``feeds`` in onnxruntime."""
    import onnxruntime as ort

    ya = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    yb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ya) == len(yb)
    for a, b in zip(ya, yb):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


ROOT = Path(__file__).resolve().parents[2]
#: the GPU benchmark scripts (benchmarks/gpu: scripts, not a package; its tests put it on sys.path)
GPU_BENCH = ROOT / "benchmarks" / "gpu"


def gpu_manifest(set_name: str) -> dict:
    """The manifest of a prepared model set (benchmarks/gpu/models/<set>)."""
    return json.loads((GPU_BENCH / "models" / set_name / "manifest.json").read_text())
