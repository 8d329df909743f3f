"""``convert-taso-to-onnx``: a `taso`-dialect module -> an ONNX ModelProto.

`taso` ops are lowered by their spec's ``to_onnx``; constants (``taso.weight`` and TASO's C_pool,
I_conv, I_matmul, I_ewmul) become initializers (a weight keeps its name); generic ``onnx.<Op>``
operations are written back as the nodes they were, attributes typed by the ONNX schema. The
model keeps the recorded opsets, IR version and graph input/output names. Unused weights are dropped.
Models over 2 GB are saved with ONNX external data (``save_onnx``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import TasoError, one_line
from .mlir import ir
from .ops import loc_name, named, pyval, taso_attrs, type_shape
from .convert_onnx_to_taso import read_opsets
from .specs import SpecError, spec
from .types import onnx_dtype_of_mlir, parse_tensor_type

_TWO_GB = 2**31 - 1


class _Names:
    def __init__(self):
        self.used: set[str] = set()

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        name, i = hint, 0
        while name in self.used:
            i += 1
            name = f"{hint}_{i}"
        self.used.add(name)
        return name


class ExportSite:
    """What a spec's ``to_onnx`` sees of one `taso` op."""

    def __init__(self, ex: "_Exporter", op: ir.Operation, inputs, outputs):
        self._ex, self._op = ex, op
        self.attrs = {k: v for k, v in taso_attrs(op).items() if k not in ("value", "name")}
        self.inputs, self.outputs = inputs, outputs
        self.in_shapes = [type_shape(v.type) for v in op.operands]
        self.opset = ex.opset
        self.name = loc_name(op.location) or ""

    def node(self, op_type: str, inputs, outputs, **attrs) -> None:
        self._ex.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                               name=self._ex.names_nodes.fresh(self.name or op_type), **attrs))

    def const(self, array: np.ndarray, hint: str) -> str:
        name = self._ex.names.fresh(f"{self.name or 'c'}_{hint}")
        self._ex.initializers.append(numpy_helper.from_array(array, name))
        return name

    def tmp(self, hint: str) -> str:
        return self._ex.names.fresh(f"{self.name or 't'}_{hint}")

    def fold(self) -> None:
        self._ex.fold_constant(self._op, self.outputs[0])


class _Exporter:
    def __init__(self, fop: ir.Operation):
        self.fop = fop
        fattrs = {na.name: na.attr for na in named(fop.attributes)}
        self.opsets = {"": 17}
        if "taso.opset_imports" in fattrs:
            self.opsets = read_opsets(fattrs["taso.opset_imports"])
        self.opset = self.opsets.get("", 17)
        self.ir_version = pyval(fattrs["taso.ir_version"]) if "taso.ir_version" in fattrs else 8
        block = fop.regions[0].blocks[0]
        n_in = len(block.arguments)
        self.in_names = pyval(fattrs["taso.input_names"]) if "taso.input_names" in fattrs else [
            loc_name(a.location) or f"input_{i}" for i, a in enumerate(block.arguments)]
        if len(self.in_names) != n_in:
            raise TasoError("taso.input_names does not match the function's arguments")
        ret = block.operations[len(block.operations) - 1]
        self.returned = list(ret.operation.operands)
        self.out_names = pyval(fattrs["taso.output_names"]) if "taso.output_names" in fattrs else [
            f"output_{i}" for i in range(len(self.returned))]
        if len(self.out_names) != len(self.returned):
            raise TasoError("taso.output_names does not match the function's results")
        self.names = _Names()
        self.names_nodes = _Names()
        self.vname: dict = {}
        self.nodes: list = []
        # weights go straight into the model: a list handed to make_graph and make_model would be
        # copied twice (measured: +1.1 GB transient for 600 MB of weights)
        self.model = onnx.ModelProto()
        self.initializers = self.model.graph.initializer
        self.value_info: list = []

    def _type_proto(self, t: ir.Type, name: str) -> onnx.ValueInfoProto:
        shape, elem = parse_tensor_type(t)
        return helper.make_tensor_value_info(name, onnx_dtype_of_mlir(elem), None if shape is None else [
            d if d is not None else None for d in shape])

    def name_of(self, v: ir.Value) -> str:
        if str(v.type) == "none":
            return ""
        return self.vname[v]

    def fold_constant(self, op: ir.Operation, name: str) -> None:
        if op.name == "taso.weight":
            arr = np.array(op.attributes["value"])
            shape, elem = parse_tensor_type(op.results[0].type)
            if arr.shape != tuple(shape):  # splat
                arr = np.broadcast_to(arr, shape)
        else:
            shape = type_shape(op.results[0].type)
            arr = spec(op.name).ref([], {}, [shape])[0]
            _, elem = parse_tensor_type(op.results[0].type)
            arr = arr.astype(_np_dtype(elem))
        # (np.ascontiguousarray alone turns a 0-d array into shape [1])
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape), name))

    def run(self) -> onnx.ModelProto:
        block = self.fop.regions[0].blocks[0]
        for a, n in zip(block.arguments, self.in_names):
            self.vname[a] = self.names.fresh(n)
        # names for returned values: give the producing op's result the graph output name
        out_owner: dict = {}
        for v, n in zip(self.returned, self.out_names):
            if _is_block_arg(v) or v in out_owner:
                continue
            out_owner[v] = n
        # the output names are reserved up front so that nothing else takes them
        for n in self.out_names:
            if n in self.names.used and n not in self.in_names:
                raise TasoError(f"duplicate graph output name '{n}'")
        reserved = set(self.out_names)
        self.names.used |= reserved
        uses = _use_counts(block)
        for op in block.operations:
            o = op.operation
            if o.name == "func.return":
                continue
            if all(uses.get(r, 0) == 0 for r in o.results) and o.name in _CONSTANT_OPS:
                continue  # unused weight
            outs = []
            for r in o.results:
                if str(r.type) == "none":  # an omitted optional output
                    outs.append("")
                    self.vname[r] = ""
                elif r in out_owner:
                    nm = out_owner.pop(r)
                    outs.append(nm)
                    self.vname[r] = nm
                else:
                    hint = loc_name(o.location) or "t"
                    if o.name == "taso.weight":
                        hint = o.attributes["name"].value or hint
                    if len(o.results) > 1:
                        hint = f"{hint}_{r.result_number}" if hasattr(r, "result_number") else hint
                    nm = self.names.fresh(hint)
                    outs.append(nm)
                    self.vname[r] = nm
            if o.name == "onnx.NoValue":
                continue
            ins = [self.name_of(v) for v in o.operands]
            if o.name.startswith("taso."):
                s = spec(o.name)
                site = ExportSite(self, o, ins, outs)
                try:
                    s.to_onnx(site)
                except SpecError as e:
                    raise TasoError(f"{o.location}: cannot export '{o.name}' to ONNX: {e}") from None
            elif o.name.startswith("onnx."):
                self._generic(o, ins, outs)
            else:
                raise TasoError(f"{o.location}: cannot export operation '{o.name}' to ONNX")
            for r, nm in zip(o.results, outs):
                if nm and nm not in reserved:
                    try:
                        self.value_info.append(self._type_proto(r.type, nm))
                    except TasoError:
                        pass
        # outputs that are inputs, repeated, or not yet produced under their name: Identity
        outputs = []
        for v, n in zip(self.returned, self.out_names):
            src = self.name_of(v)
            if src != n:
                self.nodes.append(helper.make_node("Identity", [src], [n], name=self.names_nodes.fresh(f"{n}_identity")))
            outputs.append(self._type_proto(v.type, n))
        inputs = [self._type_proto(a.type, self.vname[a]) for a in block.arguments]
        if self.ir_version < 4:
            # before IR version 4 every initializer must also be listed as a graph input
            inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.initializers]
        gname = self.fop.attributes["sym_name"].value
        # what helper.make_graph and make_model do, in place
        model = self.model
        graph = model.graph
        graph.node.extend(self.nodes)
        graph.name = gname
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        graph.value_info.extend(self.value_info)
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(self.opsets.items()))
        model.producer_name = "taso-mlir"
        model.ir_version = self.ir_version
        return model

    def _generic(self, o: ir.Operation, ins, outs):
        op_type = o.name[len("onnx."):]
        attrs = {na.name: na.attr for na in named(o.attributes)}
        domain = ""
        if "taso.domain" in attrs:
            domain = attrs.pop("taso.domain").value
        # types of empty list attributes, recorded by the importer where no schema says them
        hints = {}
        if "taso.attr_types" in attrs:
            for item in attrs.pop("taso.attr_types").value.split(","):
                k, _, t = item.partition(":")
                if k and t in _A.AttributeType.keys():
                    hints[k] = _A.AttributeType.Value(t)
        schema = _schema(op_type, domain, self.opsets.get(domain, self.opset))
        node = helper.make_node(op_type, ins, outs, name=self.names_nodes.fresh(loc_name(o.location) or op_type),
                                domain=domain or None)
        for k, a in attrs.items():
            node.attribute.append(_onnx_attr(k, a, schema, o, hints.get(k)))
        # omitted optional inputs are kept as "" (the node's arity is exported exactly); only trailing ones
        # beyond what the schema accepts are dropped (onnx-mlir spells every optional operand of the
        # newest opset, the model's opset may have fewer)
        while node.input and node.input[-1] == "" and schema is not None and len(node.input) > schema.max_input:
            node.input.pop()
        self.nodes.append(node)


_CONSTANT_OPS = {"taso.weight", "taso.const_pool", "taso.const_iconv", "taso.const_imatmul", "taso.const_iewmul"}


def _np_dtype(elem: str):
    from .types import numpy_dtype

    return numpy_dtype(onnx_dtype_of_mlir(elem))


def _is_block_arg(v: ir.Value) -> bool:
    return isinstance(v, ir.BlockArgument) or isinstance(v.maybe_downcast(), ir.BlockArgument)


def _use_counts(block) -> dict:
    counts: dict = {}
    for op in block.operations:
        for v in op.operation.operands:
            counts[v] = counts.get(v, 0) + 1
    return counts


def _schema(op_type: str, domain: str, version: int):
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except Exception:
        return None


_A = onnx.AttributeProto


def _onnx_attr(name: str, a: ir.Attribute, schema, o, hint=None) -> onnx.AttributeProto:
    want = hint
    if schema is not None and name in schema.attributes:
        want = schema.attributes[name].type
    if isinstance(a, ir.DenseElementsAttr):
        arr = np.array(a)
        shape, elem = parse_tensor_type(a.type)
        if arr.shape != tuple(shape):
            arr = np.broadcast_to(arr, shape)
        return helper.make_attribute(name, numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape)))
    v = pyval(a)
    if want == _A.FLOAT:
        return helper.make_attribute(name, float(v), attr_type=_A.FLOAT)
    if want == _A.INT:
        return helper.make_attribute(name, int(v), attr_type=_A.INT)
    if want == _A.FLOATS:
        return helper.make_attribute(name, [float(x) for x in v], attr_type=_A.FLOATS)
    if want == _A.INTS:
        return helper.make_attribute(name, [int(x) for x in v], attr_type=_A.INTS)
    if want == _A.STRINGS:
        return helper.make_attribute(name, list(v), attr_type=_A.STRINGS)
    if isinstance(v, (list, tuple)) and not v:
        return helper.make_attribute(name, [], attr_type=_A.INTS)
    try:
        return helper.make_attribute(name, v)
    except Exception as e:
        raise TasoError(f"{o.location}: cannot export attribute '{name}' of '{o.name}': {one_line(e)}") from None


def export_onnx(module: ir.Module) -> onnx.ModelProto:
    """The ONNX model of the module's (single) graph function."""
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise TasoError(f"ONNX export needs exactly one function in the module, found {len(funcs)}")
    with module.context:
        model = _Exporter(funcs[0]).run()
        _add_functions(module, model)
        return model


def _add_functions(module: ir.Module, model: onnx.ModelProto) -> None:
    """The model-local functions recorded by the importer (``taso.onnx_functions``)."""
    import base64

    from .onnx_import import FUNCTIONS_ATTR

    attrs = module.operation.attributes
    if FUNCTIONS_ATTR not in attrs:
        return
    for a in ir.ArrayAttr(attrs[FUNCTIONS_ATTR]):
        f = onnx.FunctionProto()
        try:
            f.ParseFromString(base64.b64decode(ir.StringAttr(a).value))
        except Exception as e:
            raise TasoError(f"module attribute '{FUNCTIONS_ATTR}' is not a list of ONNX functions ({one_line(e)})") from None
        model.functions.append(f)


def save_onnx(model: onnx.ModelProto, path: str) -> None:
    """Write atomically: into a temporary folder beside ``path``, then rename into place. Models of
    2 GB or more keep their weights in ONNX external data, ``<file>.data`` beside the model (renamed
    into place first, so the model never points at missing data)."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(d):
        raise TasoError(f"{path}: directory does not exist")
    big = not _fits(model)
    try:
        tmpdir = tempfile.mkdtemp(prefix=".taso-", dir=d)
    except OSError as e:
        raise TasoError(f"{path}: cannot write ({e.strerror})") from None
    base = os.path.basename(path)
    tmp = os.path.join(tmpdir, base)
    try:
        if big:
            data = base + ".data"
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data, size_threshold=1024)
            os.replace(os.path.join(tmpdir, data), os.path.join(d, data))
        else:
            with open(tmp, "wb") as f:
                _write_model(model, f)
        os.replace(tmp, path)
    except Exception as e:
        raise TasoError(f"{path}: cannot write ONNX output ({one_line(e)})") from None
    finally:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


#: models at least this large are written one initializer at a time (``_write_model``)
_CHUNKED_BYTES = 64 << 20


def _write_model(model: onnx.ModelProto, f) -> None:
    """``f.write(model.SerializeToString())`` without holding the serialized model in memory: that call
    holds two copies at once (protobuf's buffer and the bytes; +1.1 GB for 600 MB of weights). A large
    model is written as the model less its initializers, then one ``graph { initializer {...} }`` record
    per initializer: protobuf merges repeated occurrences of a message field, so the file parses to the
    same model (only the order of fields on disk differs from SerializeToString's)."""
    inits = model.graph.initializer
    if len(inits) == 0 or model_size_bound(model) < _CHUNKED_BYTES:
        f.write(model.SerializeToString())
        return
    head = onnx.ModelProto()
    _copy_fields(model, head, skip="graph")
    _copy_fields(model.graph, head.graph, skip="initializer")
    f.write(head.SerializeToString())
    del head
    for t in inits:
        piece = onnx.ModelProto()
        piece.graph.initializer.append(t)
        f.write(piece.SerializeToString())


def _copy_fields(src, dst, skip: str) -> None:
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


def _fits(model) -> bool:
    try:
        return model_size_bound(model) < _TWO_GB
    except Exception:
        return False


def model_size_bound(model: onnx.ModelProto) -> int:
    """An upper bound of ``model.ByteSize()`` that does not serialize the weights: protobuf's (upb's)
    ByteSize serializes the whole model (1 s and +1.1 GB transient for 600 MB of weights). A raw_data
    initializer counts its declared shape's bytes plus a bound for its name, dims and tags; the rest of
    the model is measured exactly."""
    size = 0
    rest = 0
    for t in model.graph.initializer:
        try:
            if not t.HasField("raw_data") or t.data_location == onnx.TensorProto.EXTERNAL or t.doc_string \
                    or t.HasField("segment") or len(t.external_data) or len(t.metadata_props):
                raise ValueError
            item = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            size += int(np.prod(list(t.dims), dtype=np.int64)) * item + len(t.name.encode()) + 11 * len(t.dims) + 64
        except Exception:
            rest += 1
    if rest == 0:
        head = onnx.ModelProto()
        _copy_fields(model, head, skip="graph")
        _copy_fields(model.graph, head.graph, skip="initializer")
        return size + head.ByteSize()
    return model.ByteSize()
