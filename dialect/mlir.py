"""The one module that imports the MLIR Python bindings provider.

Everything else in taso-mlir imports MLIR through here, so that changing the provider (today the
upstream bindings shipped in the ``torch-mlir`` wheel) touches one file.
"""

from __future__ import annotations

import sys
import types

from torch_mlir import ir, passmanager, rewrite  # noqa: F401  (re-exported)
from torch_mlir.dialects import func, irdl, pdl  # noqa: F401  (re-exported)
from torch_mlir.dialects import torch as torch_dialect  # noqa: F401  (re-exported)
from torch_mlir.extras import onnx_importer  # noqa: F401  (re-exported)

__all__ = [
    "ir",
    "passmanager",
    "rewrite",
    "func",
    "irdl",
    "pdl",
    "torch_dialect",
    "onnx_importer",
    "register_empty_dialect_modules",
]

_PREFIX = "taso_mlir._mlir_dialect_modules"


def register_empty_dialect_modules() -> None:
    """Give the runtime-defined dialects an (empty) Python module.

    Without one, every ``Value.owner`` on a `taso` or `onnx` op retries a failing import
    (measured 18 ms per 1,000 ops instead of 2 ms).
    """
    if _PREFIX in sys.modules:
        return
    pkg = types.ModuleType(_PREFIX)
    pkg.__path__ = []  # a namespace-like package
    sys.modules[_PREFIX] = pkg
    for name in ("taso", "onnx", "torch"):
        sys.modules[f"{_PREFIX}.{name}"] = types.ModuleType(f"{_PREFIX}.{name}")
    ir._globals.append_dialect_search_prefix(_PREFIX)
