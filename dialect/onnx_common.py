"""What the ONNX import (``onnx_import.py``), the conversion to `taso` (``convert_onnx_to_taso.py``) and
the export (``onnx_export.py``) share: the module attributes the import writes and the others read, and
the protobuf helpers both ends use to check a model without copying its weights, and the IR versions
and opsets the pinned onnxruntime loads (``check_loadable`` on import, ``loadable_ir_version`` on
export, ``for_onnxruntime`` for whatever hands a model to onnxruntime). It imports none of
them, so the three form no import cycle (import -> conversion; import, conversion, export -> here).
"""

from __future__ import annotations

from typing import Optional

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


# ---- versions: what the pinned onnxruntime (pyproject.toml: onnxruntime==1.31.1) loads

#: The onnxruntime release the limits below were measured with (named in messages).
ORT_MEASURED = "1.31.1"
#: The newest ONNX IR version onnxruntime 1.31.1 loads. onnxruntime has no API that says it: found by
#: loading a one-node model (Relu, opset 17) stamped with each IR version from 3 to 15 into
#: ``onnxruntime.InferenceSession``: up to 13 it loads, 14 fails with "Unsupported model IR version: 14,
#: max supported IR version: 13" (onnx 1.23.2's ``helper.make_model`` stamps 14). Checked against the
#: installed onnxruntime by test_onnx_versions.py.
ORT_MAX_IR_VERSION = 13
#: The newest opset of each domain onnxruntime 1.31.1 loads with its default session options
#: (``session.allow_released_opsets_only``). Found the same way: the default domain loads up to opset 26
#: and refuses 27 ("Current official support for domain ai.onnx is till opset 26"), although its kernel
#: registry (``get_all_opkernel_def``) lists some opset-27 kernels; ai.onnx.ml loads up to 5, refuses 6.
#: Checked by test_onnx_versions.py.
ORT_MAX_OPSETS = {"": 26, "ai.onnx.ml": 5}

#: element types and the IR version that introduced them (onnx.proto's Version enum)
_DTYPE_IR = {
    onnx.TensorProto.BFLOAT16: 4,
    onnx.TensorProto.FLOAT8E4M3FN: 9, onnx.TensorProto.FLOAT8E4M3FNUZ: 9,
    onnx.TensorProto.FLOAT8E5M2: 9, onnx.TensorProto.FLOAT8E5M2FNUZ: 9,
    onnx.TensorProto.UINT4: 10, onnx.TensorProto.INT4: 10,
    onnx.TensorProto.FLOAT4E2M1: 11,
    onnx.TensorProto.FLOAT8E8M0: 12,
    onnx.TensorProto.UINT2: 13, onnx.TensorProto.INT2: 13,
    onnx.TensorProto.FLOAT6E2M3: 14, onnx.TensorProto.FLOAT6E3M2: 14,
}
#: the newest element type the pinned onnx knows: a larger one is of a newer IR version than it knows
_NEWEST_DTYPE = max(onnx.TensorProto.DataType.values())


def _domain_name(domain: str) -> str:
    return "the default domain (ai.onnx)" if domain in ("", "ai.onnx") else f"domain '{domain}'"


def min_ir_version(model: onnx.ModelProto) -> tuple[int, str]:
    """The smallest IR version that holds ``model``, and what needs it: its opsets (onnx's version
    table, ``helper.find_min_ir_version_for``), the element types it uses, model-local functions and
    the other parts of the model that later IR versions introduced (onnx.proto's ``Version`` enum).
    Reads no weights. Something newer than the pinned onnx knows (an opset or an element type it has
    no number for) needs the model's own IR version."""
    best = [3, "opset imports"]

    def need(v: int, why: str) -> None:
        if v > best[0]:
            best[0], best[1] = v, why

    for o in model.opset_import:
        dom = "" if o.domain == "ai.onnx" else o.domain
        try:
            v = helper.find_min_ir_version_for([helper.make_opsetid(dom, o.version)], ignore_unknown=True)
        except ValueError:  # an opset newer than the pinned onnx knows
            v = max(model.ir_version, onnx.IR_VERSION + 1)
        need(v, f"opset {o.version} of {_domain_name(dom)}")

    def dtype(dt: int) -> None:
        v = _DTYPE_IR.get(dt, max(model.ir_version, onnx.IR_VERSION + 1) if dt > _NEWEST_DTYPE else 0)
        if v:
            need(v, f"element type {onnx.TensorProto.DataType.Name(dt) if dt <= _NEWEST_DTYPE else dt}")

    def type_proto(tp: onnx.TypeProto) -> None:
        kind = tp.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            dtype(getattr(tp, kind).elem_type)
            if kind == "sparse_tensor_type":
                need(8, "sparse tensor types")
        elif kind in ("sequence_type", "optional_type"):
            if kind == "optional_type":
                need(8, "optional types")
            type_proto(getattr(tp, kind).elem_type)
        elif kind == "map_type":
            dtype(tp.map_type.key_type)
            type_proto(tp.map_type.value_type)

    def metadata(msg, what: str) -> None:
        if len(msg.metadata_props):
            need(10, f"metadata_props on {what}")

    def nodes(ns) -> None:
        for n in ns:
            metadata(n, "nodes")
            if len(n.device_configurations):
                need(11, "device configurations")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    dtype(a.t.data_type)
                elif a.type == onnx.AttributeProto.TENSORS:
                    for t in a.tensors:
                        dtype(t.data_type)
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        graph(g)
                elif a.type == onnx.AttributeProto.TYPE_PROTO:
                    type_proto(a.tp)

    def graph(g: onnx.GraphProto) -> None:
        metadata(g, "graphs")
        inputs = {i.name for i in g.input}
        for t in g.initializer:
            dtype(t.data_type)
            metadata(t, "tensors")
            if t.name not in inputs:
                need(4, "initializers that are not graph inputs")
        if len(g.quantization_annotation):
            need(5, "quantization annotations")
        if len(g.sparse_initializer):
            need(6, "sparse initializers")
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            type_proto(vi.type)
            metadata(vi, "value infos")
        nodes(g.node)

    graph(model.graph)
    if len(model.training_info):
        need(7, "training information")
    if len(model.configuration):
        need(11, "device configurations")
    for f in model.functions:
        need(8, "model-local functions")
        if len(f.attribute_proto):
            need(9, "function attributes with default values")
        if f.overload:
            need(10, "function overloads")
        metadata(f, "functions")
        for vi in f.value_info:
            type_proto(vi.type)
        nodes(f.node)
    return best[0], best[1]


def _newer_than_ort(model: onnx.ModelProto, where: str) -> None:
    """A TasoError naming both numbers for an opset newer than onnxruntime loads."""
    for o in model.opset_import:
        dom = "" if o.domain == "ai.onnx" else o.domain
        top = ORT_MAX_OPSETS.get(dom)
        if top is not None and o.version > top:
            raise TasoError(f"{where}: the model imports opset {o.version} of {_domain_name(dom)}, but onnxruntime "
                            f"{ORT_MEASURED} loads at most opset {top} of it; convert the model to opset {top} or "
                            f"older (onnx.version_converter) or export it again at that opset")


def check_loadable(model: onnx.ModelProto, where: str = "model") -> None:
    """Refuse, before any work, an input model that onnxruntime (the pinned release) could not load in
    some form: one that imports an opset newer than it loads, or needs a newer IR version than it reads.

    An IR version newer than onnxruntime reads is not refused by itself: the IR version is a stamp on
    the file format, and onnx 1.23.2's ``helper.make_model`` stamps its own newest (14) on every model,
    whatever the model uses. A model at opset 17 with nothing newer in it means the same at IR version
    13 or lower, so it is accepted and its optimized model is written at the smallest IR version its
    content needs (``loadable_ir_version``), which onnxruntime reads. Refusing it would refuse every
    model the pinned onnx writes by default, for no difference in meaning.

    An opset newer than onnxruntime loads is refused: the operators' meaning at that opset is not one
    onnxruntime knows, so neither the input nor its optimized form could run there, the numeric check
    and the measured costs of the search included (which found out only after the whole search). A model
    that needs a newer IR version than onnxruntime reads (an element type it has no number for) is
    refused likewise, and so is an IR version newer than the pinned onnx knows (it cannot tell what
    such a model holds). All are one-line TasoErrors naming the model's number and onnxruntime's.

    The check reads no weights, and runs whatever the output (MLIR too): the pinned onnxruntime is
    what checks and times every optimized model."""
    _newer_than_ort(model, where)
    if model.ir_version > onnx.IR_VERSION:  # (what it may hold, the pinned onnx cannot tell)
        raise TasoError(f"{where}: the model's ONNX IR version {model.ir_version} is newer than onnx "
                        f"{onnx.__version__} knows ({onnx.IR_VERSION}) and onnxruntime {ORT_MEASURED} reads "
                        f"({ORT_MAX_IR_VERSION}); save it at IR version {ORT_MAX_IR_VERSION} or older")
    if model.ir_version > ORT_MAX_IR_VERSION:
        v, why = min_ir_version(model)
        if v > ORT_MAX_IR_VERSION:
            raise TasoError(f"{where}: the model needs ONNX IR version {v} for its {why}, but onnxruntime "
                            f"{ORT_MEASURED} reads at most IR version {ORT_MAX_IR_VERSION}")


def loadable_ir_version(model: onnx.ModelProto, what: str = "the exported model") -> int:
    """The IR version to stamp on ``model`` so that the pinned onnxruntime loads it: its own where that
    is at most ``ORT_MAX_IR_VERSION``, else the smallest its content needs (``min_ir_version``: the
    most readers read it). A TasoError naming both numbers where even that is newer than onnxruntime
    reads."""
    if model.ir_version <= ORT_MAX_IR_VERSION:
        return model.ir_version
    v, why = min_ir_version(model)
    if v > ORT_MAX_IR_VERSION:
        raise TasoError(f"{what} needs ONNX IR version {v} for its {why}, but onnxruntime {ORT_MEASURED} "
                        f"reads at most IR version {ORT_MAX_IR_VERSION}")
    return v


def _leading_ir_version(data: bytes) -> Optional[int]:
    """The IR version of serialized ModelProto bytes where it is their first field (protobuf writes
    fields in number order, and ``ir_version`` is field 1), else None."""
    if data[:1] != b"\x08":
        return None
    v, shift = 0, 0
    for b in data[1:11]:
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v
    return None


def for_onnxruntime(model, what: str = "model"):
    """What to hand ``onnxruntime.InferenceSession`` for ``model`` (a ModelProto, its serialized bytes or
    the path of an ONNX file) so that the pinned onnxruntime loads it, and the folder of its external
    data where onnxruntime must be told it (the session option
    ``session.model_external_initializers_file_folder_path``), else None.

    A model stamped with an IR version onnxruntime reads is handed over as it is (a path stays a path:
    onnxruntime maps its external data). One stamped newer (onnx 1.23.2's ``make_model`` stamps 14) is
    handed over as bytes at ``loadable_ir_version`` (a path: read without its external data, which
    onnxruntime then reads from the folder returned). TasoError naming both numbers where the model
    needs a newer IR version than onnxruntime reads."""
    import os

    if isinstance(model, (bytes, bytearray)):
        v = _leading_ir_version(bytes(model[:11]))
        if v is not None and v <= ORT_MAX_IR_VERSION:
            return model, None
        m = onnx.ModelProto.FromString(bytes(model))
        if m.ir_version <= ORT_MAX_IR_VERSION:
            return model, None
        m.ir_version = loadable_ir_version(m, what)
        return m.SerializeToString(), None
    if isinstance(model, onnx.ModelProto):
        if model.ir_version <= ORT_MAX_IR_VERSION:
            return model, None
        old = model.ir_version
        try:
            model.ir_version = loadable_ir_version(model, what)
            return model.SerializeToString(), None
        finally:
            model.ir_version = old
    head = onnx.load(model, load_external_data=False)
    if head.ir_version <= ORT_MAX_IR_VERSION:
        return model, None
    head.ir_version = loadable_ir_version(head, what)
    return head.SerializeToString(), os.path.dirname(os.path.abspath(model))
