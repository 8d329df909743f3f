"""MLIR contexts for taso-mlir: the `taso` dialect loaded, generic ``onnx.<Op>`` operations allowed."""

from __future__ import annotations

from .irdl_gen import load_taso_dialect
from .mlir import ir, register_empty_dialect_modules, torch_dialect


def make_context(load_taso: bool = True) -> ir.Context:
    """A fresh MLIR context with the `taso` dialect loaded and unregistered dialects allowed
    (generic ``onnx.<Op>`` operations are kept as operations of an unregistered dialect)."""
    register_empty_dialect_modules()
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    # the importer's torch.operator form (torch-mlir-import-onnx output) must parse too
    torch_dialect.register_dialect(ctx)
    if load_taso:
        load_taso_dialect(ctx)
    return ctx
