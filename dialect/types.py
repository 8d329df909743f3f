"""Element types: ONNX data types, MLIR element types and numpy dtypes, in one table."""

from __future__ import annotations

import re

import numpy as np
import onnx

from .errors import TasoError
from .mlir import ir

P = onnx.TensorProto
# ONNX data type -> (MLIR element type spelling, numpy dtype or None when numpy cannot hold it)
DTYPE_TABLE = {
    P.FLOAT: ("f32", np.float32),
    P.DOUBLE: ("f64", np.float64),
    P.FLOAT16: ("f16", np.float16),
    P.BFLOAT16: ("bf16", None),
    P.INT8: ("si8", np.int8),
    P.INT16: ("si16", np.int16),
    P.INT32: ("si32", np.int32),
    P.INT64: ("si64", np.int64),
    P.UINT8: ("ui8", np.uint8),
    P.UINT16: ("ui16", np.uint16),
    P.UINT32: ("ui32", np.uint32),
    P.UINT64: ("ui64", np.uint64),
    P.BOOL: ("i1", np.bool_),
    # complex weights: MLIR builds the dense attribute, but reading one back from Python aborts the process
    # (the bindings cannot downcast a complex DenseElementsAttr), so they are not carried as weight data
    P.COMPLEX64: ("complex<f32>", None),
    P.COMPLEX128: ("complex<f64>", None),
}
_BY_MLIR = {v[0]: k for k, v in DTYPE_TABLE.items()}
# signless spellings that onnx-mlir prints
_BY_MLIR.update({"i8": P.INT8, "i16": P.INT16, "i32": P.INT32, "i64": P.INT64})


def onnx_dtype_name(dt: int) -> str:
    try:
        return P.DataType.Name(dt)
    except ValueError:
        return f"data type {dt}"


def mlir_elem(dt: int) -> str:
    if dt not in DTYPE_TABLE:
        raise TasoError(f"unsupported tensor element type {onnx_dtype_name(dt)}")
    return DTYPE_TABLE[dt][0]


def numpy_dtype(dt: int):
    if dt not in DTYPE_TABLE or DTYPE_TABLE[dt][1] is None:
        raise TasoError(f"unsupported tensor element type {onnx_dtype_name(dt)} for weight data")
    return DTYPE_TABLE[dt][1]


def onnx_dtype_of_mlir(elem: str) -> int:
    if elem not in _BY_MLIR:
        raise TasoError(f"unsupported MLIR element type '{elem}' for ONNX export")
    return _BY_MLIR[elem]


def tensor_type(shape, elem: str) -> ir.Type:
    dims = "x".join("?" if d is None or d < 0 else str(d) for d in shape)
    return ir.Type.parse(f"tensor<{dims + 'x' if dims else ''}{elem}>")


_TENSOR_RE = re.compile(r"^tensor<(.*)>$")


def parse_tensor_type(t) -> tuple[tuple | None, str]:
    """``tensor<2x?x3xf32>`` -> ((2, None, 3), "f32"); unranked -> (None, elem)."""
    s = str(t)
    m = _TENSOR_RE.match(s)
    if not m:
        raise TasoError(f"expected a builtin tensor type, got {s}")
    body = m.group(1)
    if body.startswith("*x"):
        return None, body[2:]
    parts = []
    rest = body
    while True:
        m2 = re.match(r"^(\?|\d+)x", rest)
        if not m2:
            break
        parts.append(None if m2.group(1) == "?" else int(m2.group(1)))
        rest = rest[m2.end():]
    return tuple(parts), rest


_VTENSOR_RE = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(.+)>$")


def vtensor_to_builtin(t) -> ir.Type:
    """``!torch.vtensor<[2,?],f32>`` -> ``tensor<2x?xf32>`` (the importer's value types)."""
    s = str(t)
    m = _VTENSOR_RE.match(s)
    if not m:
        if s == "!torch.vtensor":
            raise TasoError("a value has no known shape (ONNX shape inference could not infer it)")
        raise TasoError(f"unsupported value type {s} (only tensors are supported)")
    dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
    shape = [None if d == "?" else int(d) for d in dims]
    return tensor_type(shape, m.group(2))


def static_shape(t) -> tuple | None:
    shape, _ = parse_tensor_type(t)
    if shape is None or any(d is None for d in shape):
        return None
    return shape
