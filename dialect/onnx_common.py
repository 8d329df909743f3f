"""What the ONNX import (``onnx_import.py``), the conversion to `taso` (``convert_onnx_to_taso.py``) and
the export (``onnx_export.py``) share: the module attributes the import writes and the others read, and
the protobuf helpers both ends use to check a model without copying its weights. It imports none of
them, so the three form no import cycle (import -> conversion; import, conversion, export -> here).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .errors import TasoError
from .mlir import ir
from .ops import int_value, named

#: Module attribute holding the model-local functions (base64 of each serialized FunctionProto).
FUNCTIONS_ATTR = "taso.onnx_functions"
#: the typed (not raw) data fields of a TensorProto
_TYPED_DATA = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def read_opsets(attr: ir.Attribute) -> dict[str, int]:
    """``taso.opset_imports`` -> {domain: version}; the default domain is spelled "ai.onnx" in MLIR
    (an empty dictionary key is not representable)."""
    out = {}
    d = attr.maybe_downcast() if hasattr(attr, "maybe_downcast") else attr
    if not isinstance(d, ir.DictAttr):
        raise TasoError(f"taso.opset_imports must be a dictionary of domain = version, got {attr}")
    for na in named(d):
        out["" if na.name == "ai.onnx" else na.name] = int_value(na.attr, f"opset version of '{na.name}'", lo=0)
    return out


def plain_raw_itemsize(t: onnx.TensorProto):
    """The element size of an initializer that holds nothing but ``raw_data`` of a numeric type, of
    exactly its declared shape's size (one that can be sized, or stubbed, without reading its data);
    None for any other."""
    try:
        if not t.HasField("raw_data") or t.data_location == onnx.TensorProto.EXTERNAL or t.doc_string \
                or t.HasField("segment") or len(t.external_data) or len(t.metadata_props) \
                or any(len(getattr(t, f)) for f in _TYPED_DATA):
            return None
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except Exception:
        return None
    if dt.kind == "O" or len(t.raw_data) != int(np.prod(list(t.dims), dtype=np.int64)) * dt.itemsize:
        return None
    return dt.itemsize


def copy_fields(src, dst, skip: str) -> None:
    for fd, v in src.ListFields():
        if fd.name == skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if repeated:
            getattr(dst, fd.name).extend(v)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(v)
        else:
            setattr(dst, fd.name, v)


def checker_stub(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for ``onnx.checker`` whose initializers are scalars of their element type,
    so that weights are never copied or serialized for the check (``check_model`` on a model
    serializes it: 5.7 s for 1.2 GB of weights). Without shape inference the checker reads an
    initializer's shape only to size its data, which is checked here instead: an initializer that is
    not plain ``raw_data`` of a numeric type, of exactly its shape's size, is copied as it is, for the
    checker to judge."""
    head = onnx.ModelProto()
    copy_fields(model, head, skip="graph")
    copy_fields(model.graph, head.graph, skip="initializer")
    for t in model.graph.initializer:
        stub = head.graph.initializer.add()
        itemsize = plain_raw_itemsize(t)
        if itemsize is None:
            stub.CopyFrom(t)
            continue
        stub.name, stub.data_type = t.name, t.data_type
        stub.raw_data = b"\0" * itemsize
    return head
