"""Helpers shared by unit tests (imported as a sibling module, like ``onnx_backend_sweep``)."""

from __future__ import annotations

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


def assert_same_in_onnxruntime(src, out, feeds: dict, rtol: float, atol: float) -> None:
    """The ONNX models at paths ``src`` and ``out`` give the same outputs on ``feeds`` in onnxruntime."""
    import onnxruntime as ort

    ya = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    yb = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ya) == len(yb)
    for a, b in zip(ya, yb):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
