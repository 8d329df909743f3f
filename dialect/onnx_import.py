"""ONNX -> MLIR: ONNX shape inference, the upstream torch-mlir ONNX importer, then
``convert-onnx-to-taso``.

Weights are kept readable from Python: the importer would turn initializers into ``dense_resource``
blobs, whose bytes Python cannot read back, so we hand it a context cache that builds inline
``dense<...>`` attributes from our own numpy copy of each initializer instead. Shape inference runs on a
skeleton of the model whose large weights are replaced by typed graph inputs, so it never copies them.

Dynamic dimensions: every graph input must have a static shape (give one with ``input_shapes`` /
``taso-opt --input-shape name=1x3x224x224``); a symbolic or unknown input dimension is rejected with an
error naming the input. Intermediate values whose shape depends on data (NonZero, ...) may keep
unknown (``?``) dimensions on generic ``onnx.*`` ops; `taso` ops always have static shapes.
"""

from __future__ import annotations

import base64
import os
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import TasoError, one_line
from .mlir import ir, onnx_importer
from .onnx_common import FUNCTIONS_ATTR, check_loadable, checker_stub
from .ops import dense_attr
from .types import DTYPE_TABLE, numpy_dtype, onnx_dtype_name

#: Node attribute that carries a node's domain through the upstream importer (which drops it).
DOMAIN_ATTR = "taso_domain"
#: Node attribute recording the types of empty list attributes of nodes outside the default domain
#: ("name:FLOATS,..."): MLIR's empty array does not say whether it held ints, floats or strings.
ATTR_TYPES_ATTR = "taso_attr_types"
#: Integer initializers up to this many elements keep their values during shape inference
#: (Reshape's shape, Split's sizes, ... are needed to infer shapes).
_SMALL = 4096


def load_onnx(path: str) -> onnx.ModelProto:
    """Read an ONNX file (with its external data) or raise a one-line TasoError."""
    if path != "-" and not os.path.exists(path):
        raise TasoError(f"{path}: no such file")
    if path != "-" and os.path.isdir(path):
        raise TasoError(f"{path}: is a directory, expected an ONNX file")
    try:
        if path == "-":
            import sys

            model = onnx.load_model_from_string(sys.stdin.buffer.read())
        else:
            model = onnx.load(path, load_external_data=True)
    except Exception as e:  # DecodeError, missing external data, ...
        raise TasoError(f"{path}: not a readable ONNX model ({one_line(e)})") from None
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise TasoError(f"{path}: not a valid ONNX model (no graph)")
    return model


def check_model(model: onnx.ModelProto, where: str) -> None:
    """``onnx.checker`` on the model, without copying its weights (``onnx_export.checker_stub``), so
    also on a model of 2 GB or more."""

    try:
        onnx.checker.check_model(checker_stub(model))
    except Exception as e:
        raise TasoError(f"{where}: invalid ONNX model: {one_line(e)}") from None


def _constant_node_value(node: onnx.NodeProto, where: str = "") -> np.ndarray:
    (attr,) = node.attribute
    what = f"Constant node '{node.name or node.output[0]}'"
    if attr.name == "value":
        return _to_numpy(attr.t, what, where)
    if attr.name in ("value_string", "value_strings"):
        raise TasoError(f"{where + ': ' if where else ''}{what} is a string tensor; string tensors are not supported")
    if attr.name == "sparse_value":
        raise TasoError(f"{where + ': ' if where else ''}{what} is a sparse tensor; sparse constants are not supported")
    if attr.name == "value_float":
        return np.array(attr.f, dtype=np.float32)
    if attr.name == "value_floats":
        return np.array(list(attr.floats), dtype=np.float32)
    if attr.name == "value_int":
        return np.array(attr.i, dtype=np.int64)
    if attr.name == "value_ints":
        return np.array(list(attr.ints), dtype=np.int64)
    raise TasoError(f"{where + ': ' if where else ''}{what}: unsupported constant kind '{attr.name}'")


def _to_numpy(t: onnx.TensorProto, what: Optional[str] = None, where: str = "") -> np.ndarray:
    what = what or f"initializer '{t.name}'"
    try:
        numpy_dtype(t.data_type)  # rejects types we cannot carry
    except TasoError:
        raise TasoError(f"{where + ': ' if where else ''}{what} has element type {onnx_dtype_name(t.data_type)}, "
                        f"which is not supported for weight data") from None
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise TasoError(f"{where + ': ' if where else ''}{what}: external data was not loaded")
    if any(d < 0 for d in t.dims):
        raise TasoError(f"{where + ': ' if where else ''}{what} has a negative dimension {list(t.dims)}")
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, MemoryError) as e:  # data that does not make the declared shape, ...
        raise TasoError(f"{where + ': ' if where else ''}{what} of shape {list(t.dims)}: its data does not "
                        f"match its shape and type ({one_line(e)})") from None


_A = onnx.AttributeProto
_LIST_ATTR_TYPES = (_A.INTS, _A.FLOATS, _A.STRINGS, _A.TENSORS, _A.SPARSE_TENSORS, _A.TYPE_PROTOS, _A.GRAPHS)


def _attr_len(a: onnx.AttributeProto) -> int:
    return len(a.ints) + len(a.floats) + len(a.strings) + len(a.tensors) + len(a.sparse_tensors) \
        + len(a.type_protos) + len(a.graphs)


def _attr_problems(graph: onnx.GraphProto):
    """Node attributes MLIR cannot carry (readably): some tensors, strings that are not UTF-8."""
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue  # a weight: checked, with its own message, where it is read
        for a in node.attribute:
            if a.type in (_A.STRING, _A.STRINGS):
                try:
                    for b in [a.s] if a.type == _A.STRING else list(a.strings):
                        b.decode("utf-8")
                except UnicodeDecodeError:
                    yield node, a, "the string is not UTF-8 text, which is not supported"
            elif a.type in (_A.SPARSE_TENSOR, _A.SPARSE_TENSORS):
                yield node, a, "sparse tensor attributes are not supported"
            elif a.type == _A.TENSORS:
                yield node, a, "lists of tensors in attributes are not supported"
            elif a.type == _A.TENSOR:
                for t in [a.t]:
                    if t.data_type == onnx.TensorProto.STRING:
                        yield node, a, "string tensors are not supported"
                    elif t.data_type not in DTYPE_TABLE or DTYPE_TABLE[t.data_type][1] is None:
                        yield node, a, f"{onnx_dtype_name(t.data_type)} tensors are not supported in attributes"


def _walk_subgraph_attrs(graph: onnx.GraphProto):
    for node in graph.node:
        for a in node.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                yield node, a


def _value_type_ok(vi: onnx.ValueInfoProto) -> Optional[str]:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        kind = t.WhichOneof("value") or "unknown"
        return f"its type is {kind.replace('_type', '')}, only tensors are supported"
    if not t.tensor_type.HasField("shape"):
        return "its rank is unknown (ONNX shape inference could not infer it; it may depend on input data)"
    if t.tensor_type.elem_type == 0:
        return "its element type is unknown"
    if t.tensor_type.elem_type == onnx.TensorProto.STRING:
        return "it is a string tensor; string tensors are not supported"
    if t.tensor_type.elem_type not in DTYPE_TABLE:
        return f"its element type {onnx_dtype_name(t.tensor_type.elem_type)} is not supported"
    return None


def _fill_inference_gaps(model: onnx.ModelProto) -> None:
    """Types ONNX shape inference leaves out although the operator's schema fixes them.

    - Dropout before opset 10: the optional ``mask`` output has the input's type and shape (ONNX infers
      only the first output).
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    g = model.graph
    known = {vi.name: vi for vi in list(g.value_info) + list(g.output) + list(g.input)}
    for n in g.node:
        if n.op_type == "Dropout" and n.domain in ("", "ai.onnx") and opset < 10 and len(n.output) > 1 \
                and n.output[1] and n.input and n.input[0] in known:
            vi = known.get(n.output[1])
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                if vi is None:
                    vi = g.value_info.add()
                    known[n.output[1]] = vi
                vi.name = n.output[1]
                vi.type.CopyFrom(known[n.input[0]].type)


def _parse_dims(text: str) -> list[int]:
    try:
        dims = [int(d) for d in text.lower().split("x")] if text else []
    except ValueError:
        raise TasoError(f"bad shape '{text}' (expected e.g. 1x3x224x224)") from None
    if any(d < 0 for d in dims):
        raise TasoError(f"bad shape '{text}': dimensions must be >= 0")
    return dims


def import_onnx(
    model: onnx.ModelProto,
    ctx: ir.Context,
    *,
    input_shapes: Optional[dict[str, str | list[int]]] = None,
    where: str = "model",
    convert: bool = True,
) -> ir.Module:
    """Import ``model`` into a new module of ``ctx`` (made by ``context.make_context``).

    With ``convert`` (the default) the result is in the `taso` dialect; otherwise it is the
    upstream importer's ``torch.operator "onnx.*"`` form with inline weights.

    A model the pinned onnxruntime could not load (an opset newer than it loads) is refused first,
    before any work (``onnx_common.check_loadable``, which says why a model stamped with a newer IR
    version than onnxruntime reads is accepted, and written out at one it reads).
    """
    bad = _first_non_utf8(model)
    if bad:
        raise TasoError(f"{where}: {bad} is not UTF-8 text (a protobuf string must be)")
    check_loadable(model, where)
    check_model(model, where)
    g = model.graph
    if len(g.output) == 0:
        raise TasoError(f"{where}: the graph has no outputs (it computes nothing)")
    # parts of a model that would otherwise be dropped without a word
    if len(model.training_info):
        raise TasoError(f"{where}: training information (ModelProto.training_info) is not supported")
    if len(g.quantization_annotation):
        raise TasoError(f"{where}: quantization annotations (GraphProto.quantization_annotation) are not supported")
    for node, a in _walk_subgraph_attrs(g):
        raise TasoError(
            f"{where}: node '{node.name or node.output[0]}' ({node.op_type}) has a subgraph attribute "
            f"'{a.name}'; control flow (If/Loop/Scan) is not supported yet"
        )
    for node, a, why in _attr_problems(g):
        raise TasoError(f"{where}: node '{node.name or node.output[0]}' ({node.op_type}) attribute '{a.name}': {why}")
    if any(n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) != 1 for n in g.node):
        raise TasoError(f"{where}: a Constant node must have exactly one attribute")

    # ---- weights: initializers and Constant nodes, as numpy arrays keyed by tensor name
    weights: dict[str, np.ndarray] = {}
    for t in g.initializer:
        weights[t.name] = _to_numpy(t, where=where)
    if len(g.sparse_initializer):
        raise TasoError(f"{where}: sparse initializers are not supported")
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            weights[n.output[0]] = _constant_node_value(n, where)

    # ---- skeleton for shape inference: weights become typed inputs (small ints keep values)
    sk = onnx.ModelProto()
    sk.ir_version = model.ir_version
    sk.opset_import.extend(model.opset_import)
    sk.producer_name = model.producer_name
    sk.producer_version = model.producer_version
    sk.functions.extend(model.functions)
    sg = sk.graph
    sg.name = g.name or "main_graph"
    overrides = dict(input_shapes or {})
    real_inputs = [vi for vi in g.input if vi.name not in weights]
    unknown = set(overrides) - {v.name for v in real_inputs}
    if unknown:
        raise TasoError(f"{where}: --input-shape names unknown graph input(s): {', '.join(sorted(unknown))}")
    real_inputs = _with_overrides(real_inputs, overrides)
    for v in real_inputs:
        vi = v
        sg.input.append(v)
        why = _value_type_ok(v)
        if why:
            raise TasoError(f"{where}: graph input '{vi.name}' is not supported: {why}")
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                sym = f" ('{d.dim_param}')" if d.dim_param else ""
                raise TasoError(
                    f"{where}: graph input '{vi.name}' has a dynamic dimension {i}{sym}; dynamic shapes are "
                    f"not supported: give a static shape with --input-shape {vi.name}=<d0>x<d1>x..."
                )
            if d.dim_value < 0:
                raise TasoError(f"{where}: graph input '{vi.name}' has a negative dimension {i} ({d.dim_value})")
    # float weights whose values decide a shape keep them too: Resize's roi and scales, Upsample's scales
    # (as typed inputs, inference leaves the result's shape unknown and a valid model is refused)
    shape_values = {x for n in g.node if n.op_type in ("Resize", "Upsample") and n.domain in ("", "ai.onnx")
                    for x in list(n.input)[1:] if x}
    for name, arr in weights.items():
        if (np.issubdtype(arr.dtype, np.integer) or name in shape_values) and arr.size <= _SMALL:
            sg.initializer.append(numpy_helper.from_array(arr, name))
        else:
            sg.input.append(onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            continue
        nn = sg.node.add()
        nn.CopyFrom(n)
        if n.domain not in ("", "ai.onnx"):
            nn.attribute.append(onnx.helper.make_attribute(DOMAIN_ATTR, n.domain))
            empty = [f"{a.name}:{onnx.AttributeProto.AttributeType.Name(a.type)}" for a in n.attribute
                     if a.type in _LIST_ATTR_TYPES and not _attr_len(a)]
            if empty:
                nn.attribute.append(onnx.helper.make_attribute(ATTR_TYPES_ATTR, ",".join(empty)))
    sg.output.extend(g.output)
    # ONNX has no shape inference for custom-domain ops (com.microsoft, ...): keep the types that the
    # model declares for their outputs (exporters write them as value_info)
    custom_outs = {o for n in g.node if n.domain not in ("", "ai.onnx") for o in n.output}
    sg.value_info.extend(vi for vi in g.value_info if vi.name in custom_outs and vi.name not in weights)
    try:
        sk = onnx.shape_inference.infer_shapes(sk, check_type=True, strict_mode=True, data_prop=_data_prop_safe(sk))
    except Exception as e:
        raise TasoError(f"{where}: ONNX shape inference failed: {one_line(e)}") from None
    sk = _refine_shapes(sk)

    _fill_inference_gaps(sk)
    # every value must have a tensor type with a known rank
    known = {vi.name: vi for vi in list(sk.graph.value_info) + list(sk.graph.output) + list(sk.graph.input)}
    for n in sk.graph.node:
        for o in n.output:
            if not o:
                continue
            vi = known.get(o)
            why = "ONNX shape inference could not infer its type" if vi is None else _value_type_ok(vi)
            if why and n.domain not in ("", "ai.onnx"):
                why += f" (ONNX cannot infer '{n.domain}' ops: declare the output's type in the graph's value_info)"
            if why:
                raise TasoError(
                    f"{where}: value '{o}' (output of {n.op_type} node " + (f"'{n.name}'" if n.name else "with no name")
                    + f") is not supported: {why}"
                )
    # ---- the importer sees placeholders for every weight; our context cache supplies the data
    del sk.graph.input[:]
    sk.graph.input.extend(real_inputs)
    del sk.graph.initializer[:]
    for name, arr in weights.items():
        ph = sk.graph.initializer.add()
        ph.name = name
        ph.data_type = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        ph.dims.extend(arr.shape)

    module = _run_importer(sk, ctx, weights, where)
    with ctx:
        fop = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
        fop.attributes["taso.input_names"] = ir.ArrayAttr.get([ir.StringAttr.get(v.name) for v in real_inputs])
        fop.attributes["taso.output_names"] = ir.ArrayAttr.get([ir.StringAttr.get(v.name) for v in g.output])
        if len(model.functions):
            # model-local functions: their call sites stay generic ops; the definitions travel with the
            # module (serialized) so that export writes them back
            module.operation.attributes[FUNCTIONS_ATTR] = ir.ArrayAttr.get(
                [ir.StringAttr.get(base64.b64encode(f.SerializeToString()).decode()) for f in model.functions])
    if convert:
        from .convert_onnx_to_taso import convert_module

        convert_module(module, where=where)
    return module


#: Integer-valued operators that ``_refine_shapes`` evaluates when all their inputs are known.
_SHAPE_ARITH = frozenset({
    "Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Identity", "Add", "Sub",
    "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Not", "And", "Or", "Where", "Range", "Expand", "Reshape", "Flatten", "Tile",
    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "ConstantOfShape", "Transpose", "Sign", "Clip"})
_REFINE_ROUNDS = 8


def _static_dims(vi) -> Optional[list[int]]:
    if vi is None or vi.type.WhichOneof("value") != "tensor_type" or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        return None
    return [d.dim_value for d in dims]


def _refine_shapes(sk: onnx.ModelProto) -> onnx.ModelProto:
    """Make shapes static where ONNX shape inference alone leaves dimensions unknown.

    Exporters compute shapes at run time (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``, a
    ``Slice`` of ``position_ids`` ending at ``Shape(input_ids)[1]``, ``Expand`` to a computed shape);
    ONNX's data propagation does not follow all of these (Slice with a computed ``ends`` keeps ``?``
    dimensions, and so does everything downstream). With static graph inputs those values are
    constants: evaluate the small integer computations whose inputs are known (``onnx.reference``),
    infer a copy of the skeleton in which they are initializers, and attach the resulting types to the
    skeleton as value_info. The nodes themselves are unchanged (nothing is folded away), and a final
    strict inference checks the refined types against every node; if it disagrees, the unrefined
    inference is kept.
    """
    types = {vi.name: vi for vi in list(sk.graph.value_info) + list(sk.graph.input) + list(sk.graph.output)}

    def unknown() -> bool:
        return any(o and _static_dims(types.get(o)) is None for n in sk.graph.node for o in n.output)

    if not unknown():
        return sk
    from onnx.reference import ReferenceEvaluator

    opsets = list(sk.opset_import)
    values = {t.name: numpy_helper.to_array(t) for t in sk.graph.initializer}
    folded: dict[str, np.ndarray] = {}
    refined = False
    for _ in range(_REFINE_ROUNDS):
        new = 0
        for n in sk.graph.node:
            if n.domain not in ("", "ai.onnx") or n.op_type not in _SHAPE_ARITH or len(n.output) != 1:
                continue
            out = n.output[0]
            if not out or out in values:
                continue
            if n.op_type in ("Shape", "Size"):
                dims = _static_dims(types.get(n.input[0]))
                if dims is None:
                    continue
                if n.op_type == "Size":
                    arr = np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
                else:
                    at = {a.name: a.i for a in n.attribute}
                    arr = np.array(dims, dtype=np.int64)[at.get("start", 0):at.get("end", len(dims))]
            else:
                ins = [i for i in n.input if i]
                if any(i not in values for i in ins):
                    continue
                if _result_size_bound(n, values) > _SMALL:
                    continue  # (ConstantOfShape [100000, 100000] would fill memory before the size check)
                try:
                    fn = onnx.helper.make_function("taso.refine", "f", list(dict.fromkeys(ins)), [out], [n], opsets)
                    arr = np.asarray(ReferenceEvaluator(fn).run(None, {i: values[i] for i in ins}, attributes={})[0])
                except Exception:
                    continue
            if arr.dtype.kind not in "iub" or arr.size > _SMALL:
                continue
            values[out] = folded[out] = arr
            new += 1
        if not new:
            break
        tmp = onnx.ModelProto()
        tmp.CopyFrom(sk)
        del tmp.graph.node[:]
        tmp.graph.node.extend(n for n in sk.graph.node if not (len(n.output) == 1 and n.output[0] in folded))
        del tmp.graph.value_info[:]
        tmp.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in folded.items())
        try:
            tmp = onnx.shape_inference.infer_shapes(tmp, check_type=True, strict_mode=True,
                                                    data_prop=_data_prop_safe(tmp))
        except Exception:
            break
        types.update({vi.name: vi for vi in tmp.graph.value_info})
        for k, v in folded.items():
            types[k] = onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        refined = True
        if not unknown():
            break
    if not refined:
        return sk
    out_model = onnx.ModelProto()
    out_model.CopyFrom(sk)
    skip = {vi.name for vi in list(sk.graph.input) + list(sk.graph.output)} | {t.name for t in sk.graph.initializer}
    del out_model.graph.value_info[:]
    out_model.graph.value_info.extend(vi for name, vi in types.items() if name not in skip)
    try:
        # no data propagation here: ONNX's propagates a Slice whose starts/ends are computed (not
        # constants) as if it took the whole input (nn.MultiheadAttention's `Shape -> Slice(0, Mod(..))
        # -> Concat -> Reshape` becomes rank 7 instead of 4) and then rejects the refined, correct type
        return onnx.shape_inference.infer_shapes(out_model, check_type=True, strict_mode=True, data_prop=False)
    except Exception:
        return sk


#: A 1-D tensor with more elements than this turns ONNX's data propagation off: it materializes a 1-D
#: value's dimensions as if the value were a shape (memory grows with the size: an Add of two
#: [2**31] tensors exhausts the machine's memory and the process is killed).
_DATA_PROP_MAX = 1 << 16


def _data_prop_safe(m: onnx.ModelProto) -> bool:
    """Whether shape inference with data propagation is safe for ``m`` (no large 1-D tensor)."""
    try:
        inf = onnx.shape_inference.infer_shapes(m, data_prop=False)
    except Exception:
        return True  # the caller's inference reports the error
    for vi in list(inf.graph.input) + list(inf.graph.value_info) + list(inf.graph.output):
        dims = _static_dims(vi)
        if dims is not None and len(dims) == 1 and dims[0] > _DATA_PROP_MAX:
            return False
    return not any(len(t.dims) == 1 and t.dims[0] > _DATA_PROP_MAX for t in inf.graph.initializer)


def _result_size_bound(n: onnx.NodeProto, values: dict) -> float:
    """Elements of the result of a node that makes data out of a shape (ConstantOfShape, Expand,
    Tile, Range), computed before evaluating it; 0 for other nodes (their inputs are all small)."""
    try:
        v = [values[i] if i else None for i in n.input]
        if n.op_type == "ConstantOfShape":
            return float(np.prod(v[0].astype(np.float64)))
        if n.op_type == "Expand":
            return float(np.prod(np.broadcast_shapes(v[0].shape, tuple(int(d) for d in v[1])), dtype=np.float64))
        if n.op_type == "Tile":
            return float(np.prod(np.array(v[0].shape, np.float64) * v[1].astype(np.float64)))
        if n.op_type == "Range":
            start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in v[:3])
            return float(np.ceil((limit - start) / delta)) if delta else float("inf")
    except Exception:
        return float("inf")
    return 0.0


def _first_non_utf8(msg, path: str = "model") -> Optional[str]:
    """The first string field whose bytes are not UTF-8 (protobuf's parser hands those to Python as
    bytes, which the importer cannot use), as a path like ``model.graph.node[3].name``; else None."""
    for fd, v in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if fd.type == fd.TYPE_STRING and fd.name != "doc_string":  # (documentation is not read)
            for i, x in enumerate(v if repeated else [v]):
                if isinstance(x, bytes):
                    return f"{path}.{fd.name}" + (f"[{i}]" if repeated else "") + f" ({x!r})"
        elif fd.type == fd.TYPE_MESSAGE:
            for i, x in enumerate(v if repeated else [v]):
                found = _first_non_utf8(x, f"{path}.{fd.name}" + (f"[{i}]" if repeated else ""))
                if found:
                    return found
    return None


def _with_overrides(real_inputs, overrides) -> list:
    out = []
    for vi in real_inputs:
        v = onnx.ValueInfoProto()
        v.CopyFrom(vi)
        if vi.name in overrides:
            dims = overrides[vi.name]
            dims = _parse_dims(dims) if isinstance(dims, str) else list(dims)
            if v.type.WhichOneof("value") != "tensor_type":
                raise TasoError(f"--input-shape: graph input '{vi.name}' is not a tensor")
            v.type.tensor_type.shape.Clear()
            v.type.tensor_type.shape.SetInParent()
            for d in dims:
                v.type.tensor_type.shape.dim.add().dim_value = d
        out.append(v)
    return out


class _InlineWeights(onnx_importer.ContextCache):
    """The importer's context cache, building inline dense attributes from our numpy weights."""

    __slots__ = ["_weights", "_made"]

    def __init__(self, context, weights):
        super().__init__(context)
        self._weights = weights
        self._made: dict = {}

    def tensor_proto_to_attr(self, tp: onnx.TensorProto):
        ttype = self.tensor_proto_to_builtin_type(tp)
        if (tp.name in self._weights or tp.name in self._made) and not tp.raw_data \
                and tp.data_location != onnx.TensorProto.EXTERNAL and not _has_typed_data(tp):
            if tp.name not in self._made:
                # the numpy copy is dropped once the attribute holds the data: the weights are never
                # held three times over (the model, numpy, MLIR; -600 MB peak for 600 MB of weights)
                self._made[tp.name] = dense_attr(self._weights.pop(tp.name), ttype)
            return self._made[tp.name]
        return dense_attr(_to_numpy(tp), ttype)


def _has_typed_data(tp) -> bool:
    return any(len(getattr(tp, f)) for f in (
        "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"))


def _run_importer(sk: onnx.ModelProto, ctx: ir.Context, weights, where: str) -> ir.Module:
    cfg = onnx_importer.Config(function_expansion_allowlists_by_domain={"": set()})
    import warnings

    try:
        with ctx, ir.Location.unknown(), warnings.catch_warnings():
            # omitted optional outputs ("") have no type proto; the importer warns and gives them a none
            # type, which is what we want
            warnings.filterwarnings("ignore", message="Found a node without a valid type proto")
            info = onnx_importer.ModelInfo(sk, config=cfg)
            module = info.create_module(ctx)
            cc = _InlineWeights(ctx, weights)
            imp = onnx_importer.NodeImporter.define_function(info.main_graph, module.operation, context_cache=cc)
            imp.import_all()
            return module
    except TasoError:
        raise
    except Exception as e:
        raise TasoError(f"{where}: the ONNX importer failed: {one_line(e)}") from None
