"""``convert-taso-to-onnx``: a `taso`-dialect module -> an ONNX ModelProto.

`taso` ops are lowered by their spec's ``to_onnx``; constants (``taso.weight`` and TASO's C_pool,
I_conv, I_matmul, I_ewmul) become initializers (a weight keeps its name); generic ``onnx.<Op>``
operations are written back as the nodes they were, attributes typed by the ONNX schema. The
model keeps the recorded opsets, IR version and graph input/output names, except an IR version newer
than the pinned onnxruntime reads (onnx 1.23.2's ``make_model`` stamps 14, onnxruntime 1.31.1 reads 13):
that one is lowered to the smallest the model needs (``onnx_common.loadable_ir_version``), or the
export is a one-line error naming both numbers. Unused weights are dropped.
Models over 2 GB are saved with ONNX external data (``save_onnx``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import TasoError, one_line
from .mlir import ir
from .ops import (max_materialize_bytes, dense_array, int_value, loc_name, named, pyval, str_list, str_value,
                  taso_attrs, type_shape)
from .onnx_common import (FUNCTIONS_ATTR, checker_stub, copy_fields, loadable_ir_version, plain_raw_itemsize,
                          read_opsets)
from .specs import SpecError, spec
from .types import onnx_dtype_of_mlir, parse_tensor_type

_TWO_GB = 2**31 - 1


class _Names:
    def __init__(self):
        self.used: set[str] = set()
        # the last suffix handed out per hint: the names are the same as counting from 1 each time (``used``
        # only grows), without the quadratic time that took minutes for 50,000 nodes named alike
        self._next: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        name, i = hint, self._next.get(hint, 0)
        while name in self.used:
            i += 1
            name = f"{hint}_{i}"
        self._next[hint] = i
        self.used.add(name)
        return name


class ExportSite:
    """What a spec's ``to_onnx`` sees of one `taso` op."""

    def __init__(self, ex: "Exporter", op: ir.Operation, inputs, outputs):
        self._ex, self._op = ex, op
        self.attrs = {k: v for k, v in taso_attrs(op).items() if k not in ("value", "name")}
        self.inputs, self.outputs = inputs, outputs
        self.in_shapes = [type_shape(v.type) for v in op.operands]
        self.opset = ex.opset
        self.name = loc_name(op.location) or ""

    @property
    def dtype(self):
        """The numpy type of the op's first result (constants the export adds are of it)."""
        return _np_dtype(str(ir.ShapedType(self._op.results[0].type).element_type))

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


class Exporter:
    def __init__(self, fop: ir.Operation):
        self.fop = fop
        fattrs = {na.name: na.attr for na in named(fop.attributes)}
        self.opsets = {"": 17}
        if "taso.opset_imports" in fattrs:
            self.opsets = read_opsets(fattrs["taso.opset_imports"])
        self.opset = self.opsets.get("", 17)
        self.ir_version = int_value(fattrs["taso.ir_version"], "taso.ir_version", lo=0) \
            if "taso.ir_version" in fattrs else 8
        block = fop.regions[0].blocks[0]
        n_in = len(block.arguments)
        self.in_names = str_list(fattrs["taso.input_names"], "taso.input_names") if "taso.input_names" in fattrs else [
            loc_name(a.location) or f"input_{i}" for i, a in enumerate(block.arguments)]
        if len(self.in_names) != n_in:
            raise TasoError("taso.input_names does not match the function's arguments")
        ret = block.operations[len(block.operations) - 1]
        self.returned = list(ret.operation.operands)
        self.out_names = str_list(fattrs["taso.output_names"], "taso.output_names") \
            if "taso.output_names" in fattrs else [f"output_{i}" for i in range(len(self.returned))]
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
            arr = dense_array(op.attributes["value"], f"{op.location}: weight value")
            shape, elem = parse_tensor_type(op.results[0].type)
            if arr.shape != tuple(shape):  # splat
                arr = np.broadcast_to(arr, shape)
        else:
            shape = type_shape(op.results[0].type)
            _, elem = parse_tensor_type(op.results[0].type)
            _np_dtype(elem)  # a type numpy can hold, before computing the constant
            nbytes = int(np.prod(shape, dtype=object)) * 8
            if nbytes > max_materialize_bytes():
                raise TasoError(f"{op.location}: '{op.name}' of type {op.results[0].type} is too large to write out "
                                f"({nbytes / 2**30:.3g} GiB)")
            arr = spec(op.name).ref([], {}, [shape])[0]
            _, elem = parse_tensor_type(op.results[0].type)
            arr = arr.astype(_np_dtype(elem))
        self._add_initializer(arr, name)

    def _add_initializer(self, arr: np.ndarray, name: str) -> None:
        """``numpy_helper.from_array(arr, name)`` made in place in the model: building it apart and
        appending it copies the data twice more (measured: 132 ms against 49 ms for 64 MB)."""
        if sys.byteorder != "little" or arr.dtype.kind not in "biuf":
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape), name))
            return
        t = self.initializers.add()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.dims.extend(arr.shape)
        t.raw_data = np.ascontiguousarray(arr).tobytes()

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
                        hint = str_value(o.attributes["name"], f"{o.location}: weight name") or hint
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
        made: set = set()  # (an output listed twice under one name is made once: ONNX values are SSA)
        for v, n in zip(self.returned, self.out_names):
            src = self.name_of(v)
            if src != n and n not in made:
                self.nodes.append(helper.make_node("Identity", [src], [n], name=self.names_nodes.fresh(f"{n}_identity")))
                made.add(n)
            outputs.append(self._type_proto(v.type, n))
        inputs = [self._type_proto(a.type, self.vname[a]) for a in block.arguments]
        if self.ir_version < 4:
            # before IR version 4 every initializer must also be listed as a graph input
            inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.initializers]
        gname = str_value(self.fop.attributes["sym_name"], "function name")
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
            domain = str_value(attrs.pop("taso.domain"), f"{o.location}: attribute 'taso.domain'")
        # types of empty list attributes, recorded by the importer where no schema says them
        hints = {}
        if "taso.attr_types" in attrs:
            for item in str_value(attrs.pop("taso.attr_types"), f"{o.location}: attribute 'taso.attr_types'").split(","):
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
    try:
        if isinstance(a, ir.DenseElementsAttr):
            arr = dense_array(a, f"attribute '{name}'")
            shape, elem = parse_tensor_type(a.type)
            if arr.shape != tuple(shape):
                arr = np.broadcast_to(arr, shape)
            return helper.make_attribute(name, numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape)))
        v = pyval(a)
        kinds = {_A.FLOAT: (int, float), _A.FLOATS: (int, float), _A.INT: (int,), _A.INTS: (int,), _A.STRINGS: (str,)}
        if want in (_A.FLOAT, _A.INT) and not isinstance(v, kinds[want]) or \
                want in (_A.FLOATS, _A.INTS, _A.STRINGS) and not (isinstance(v, (list, tuple)) and all(
                    isinstance(x, kinds[want]) for x in v)):
            raise TasoError(f"the operator's schema wants {_A.AttributeType.Name(want)}, got {a}")
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
        return helper.make_attribute(name, v)
    except Exception as e:  # TasoError, or a value the attribute kind cannot hold (ints out of int64, ...)
        raise TasoError(f"{o.location}: cannot export attribute '{name}' of '{o.name}': {one_line(e)}") from None


def export_onnx(module) -> onnx.ModelProto:
    """The ONNX model of the module's (single) graph function (``module``: an ``ir.Module`` or its
    ``builtin.module`` operation, as a pass gets it)."""
    module = module.operation
    funcs = [op.operation for op in _body(module).operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise TasoError(f"ONNX export needs exactly one function in the module, found {len(funcs)}")
    _check_graph_form(module, funcs[0])
    with module.context:
        model = Exporter(funcs[0]).run()
        _add_functions(module, model)
        model.ir_version = loadable_ir_version(model)
        check_exported(model)
        return model


_CONVERT_FIRST = "; convert it with --convert-onnx-to-taso first"


def _body(module_op: ir.Operation) -> ir.Block:
    return module_op.regions[0].blocks[0]


def _check_graph_form(module: ir.Operation, fop: ir.Operation) -> None:
    """What the exporter would otherwise drop or misread: operations outside the function, a function
    without exactly one block ending in func.return, ops with regions, values that are not tensors,
    and the unconverted importer / onnx-mlir forms (whose metadata and ops would be written verbatim)."""
    for op in _body(module).operations:
        o = op.operation
        if o.name != "func.func":
            hint = " (onnx-mlir's form" + _CONVERT_FIRST + ")" if o.name == "onnx.EntryPoint" else ""
            raise TasoError(f"{o.location}: operation '{o.name}' outside the graph function cannot be exported "
                            f"to ONNX{hint}")
    if len(fop.regions[0].blocks) != 1:
        what = "is a declaration without a body" if len(fop.regions[0].blocks) == 0 else "has more than one block"
        raise TasoError(f"{fop.location}: the graph function {what}")
    fattrs = {na.name for na in named(fop.attributes)}
    if any(k.startswith("torch.onnx_meta.") for k in fattrs) and "taso.output_names" not in fattrs:
        raise TasoError(f"{fop.location}: the function is in the ONNX importer's form{_CONVERT_FIRST}")
    if ("arg_attrs" in fattrs or "res_attrs" in fattrs) and "taso.output_names" not in fattrs and \
            "onnx.name" in str(fop.attributes["arg_attrs" if "arg_attrs" in fattrs else "res_attrs"]):
        raise TasoError(f"{fop.location}: the function names its inputs/outputs with onnx-mlir's onnx.name "
                        f"attributes{_CONVERT_FIRST}")
    block = fop.regions[0].blocks[0]
    ops = list(block.operations)
    if not ops or ops[-1].operation.name != "func.return":
        last = ops[-1].operation if ops else fop
        hint = " (onnx-mlir's form" + _CONVERT_FIRST + ")" if ops and last.name == "onnx.Return" else ""
        raise TasoError(f"{last.location}: the graph function must end with func.return{hint}")
    for a in block.arguments:
        _check_value_type(a.type, fop.location, "a function argument")
    for op in ops:
        o = op.operation
        if o.name.startswith("torch."):
            raise TasoError(f"{o.location}: '{o.name}' is the ONNX importer's form{_CONVERT_FIRST}")
        if o.name in ("onnx.Return", "onnx.EntryPoint") or "onnx_node_name" in o.attributes:
            raise TasoError(f"{o.location}: '{o.name}' is in onnx-mlir's form{_CONVERT_FIRST}")
        if len(o.regions):
            raise TasoError(f"{o.location}: '{o.name}' has regions (subgraphs), which cannot be exported to ONNX")
        for r in o.results:
            if str(r.type) != "none":
                _check_value_type(r.type, o.location, f"a result of '{o.name}'")


def _check_value_type(t: ir.Type, loc, what: str) -> None:
    if str(t).startswith("!torch."):
        raise TasoError(f"{loc}: {what} has type {t}, the ONNX importer's form{_CONVERT_FIRST}")
    try:
        onnx_dtype_of_mlir(parse_tensor_type(t)[1])
    except TasoError as e:
        raise TasoError(f"{loc}: {what} has type {t}, which ONNX cannot hold ({e})") from None


def check_exported(model: onnx.ModelProto) -> None:
    """``onnx.checker`` on the exported model, so that what MLIR accepted but ONNX does not (an
    operator's attribute of the wrong kind, a node with too few inputs, ...) is an error rather than
    an invalid file; on ``checker_stub(model)``."""
    head = checker_stub(model)
    try:
        onnx.checker.check_model(head)
    except Exception as e:
        raise TasoError(f"the exported ONNX model would not be valid: {one_line(e)}") from None
    # the types MLIR gave generic ops must be what ONNX infers (as on import: large weights become typed
    # graph inputs, small integer ones keep their values)
    del head.graph.initializer[:]
    have = {i.name for i in head.graph.input}
    for t in model.graph.initializer:
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and int(np.prod(t.dims)) <= 4096:
            head.graph.initializer.append(t)
        elif t.name not in have:
            head.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        onnx.shape_inference.infer_shapes(head, check_type=True, strict_mode=True)
    except Exception as e:
        raise TasoError(f"the exported ONNX model would not be valid: {one_line(e)}") from None


def _add_functions(module: ir.Operation, model: onnx.ModelProto) -> None:
    """The model-local functions recorded by the importer (``taso.onnx_functions``)."""
    import base64


    attrs = module.attributes
    if FUNCTIONS_ATTR not in attrs:
        return
    fns = attrs[FUNCTIONS_ATTR]
    if not isinstance(fns, ir.ArrayAttr):
        raise TasoError(f"module attribute '{FUNCTIONS_ATTR}' is not a list of ONNX functions ({fns})")
    for a in fns:
        f = onnx.FunctionProto()
        try:
            f.ParseFromString(base64.b64decode(str_value(a, "an ONNX function"), validate=True))
        except Exception as e:
            raise TasoError(f"module attribute '{FUNCTIONS_ATTR}' is not a list of ONNX functions ({one_line(e)})") from None
        model.functions.append(f)


def output_target(path: str) -> tuple[str, bool]:
    """Where an output named ``path`` goes: (the file to replace, False), or (path, True) for an
    existing device or pipe (``-o /dev/null``), which is written in place: renaming a file over it
    would replace the device node itself. A symbolic link is followed (its target is replaced)."""
    if os.path.lexists(path):
        real = os.path.realpath(path)
        if os.path.exists(real) and not os.path.isfile(real) and not os.path.isdir(real):
            return real, True
        return real, False  # (a directory: the final rename fails, with a clear message)
    return path, False


def write_direct(path: str, write) -> None:
    """``write(f)`` into an existing device or pipe."""
    try:
        with open(path, "wb") as f:
            write(f)
    except OSError as e:
        raise TasoError(f"{path}: cannot write ({e.strerror})") from None


def _new_file_mode(path: str) -> int:
    """The mode a file written at ``path`` gets: that of the file it replaces, else what ``open()``
    would give a new file (0666 less the umask)."""
    if os.path.isfile(path):
        return os.stat(path).st_mode & 0o7777
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _temp_prefix(pid: Optional[int] = None) -> str:
    """Temporaries beside an output are ``.taso-<pid>-*``: the pid says whose they are
    (``remove_temporaries``)."""
    return f".taso-{os.getpid() if pid is None else pid}-"


def remove_temporaries(pid: int, outputs) -> None:
    """Remove the temporaries process ``pid`` left beside ``outputs`` (paths as given on a command
    line): what a process that died by a signal (``cli.run_contained``) had half-written."""
    import glob
    import shutil

    dirs = set()
    for out in outputs:
        dirs.add(os.path.dirname(os.path.abspath(output_target(out)[0])) or ".")
    for d in dirs:
        for p in glob.glob(os.path.join(glob.escape(d), glob.escape(_temp_prefix(pid)) + "*")):
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass


def write_atomic(path: str, write, what: str = "", check=None) -> None:
    """``write(f)`` into ``path`` atomically: a temporary file beside it, renamed into place, with the
    mode ``open()`` would give it (or that of the file it replaces). ``check(temporary path)``, where
    given, runs before the rename and may refuse the file with a TasoError. Devices and pipes are
    written in place (and checked by the caller). Nothing is left behind on failure; errors are
    one-line TasoErrors."""
    given = path
    path, direct = output_target(path)
    if direct:  # -o /dev/null, a pipe: a rename would replace the device node
        write_direct(path, write)
        return
    d = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(d):
        raise TasoError(f"{given}: directory does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(), dir=d)
    except OSError as e:
        raise TasoError(f"{given}: cannot write{what} ({e.strerror})") from None
    kept = False
    try:
        # mkstemp makes the file 0600: give it what open() would (or the mode of the file it replaces)
        os.fchmod(fd, _new_file_mode(path))
        with os.fdopen(fd, "wb") as f:
            write(f)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
        kept = True
    except Exception as e:
        if isinstance(e, TasoError):
            raise
        reason = e.strerror if isinstance(e, OSError) and e.strerror else one_line(e)
        raise TasoError(f"{given}: cannot write{what} ({reason})") from None
    finally:  # (also on Ctrl-C during a long check)
        if not kept and os.path.exists(tmp):
            os.unlink(tmp)


def save_onnx(model: onnx.ModelProto, path: str, check=None) -> None:
    """Write atomically (``write_atomic``). Models of 2 GB or more keep their weights in ONNX external
    data, ``<file>.data`` beside the model, written in a temporary folder and renamed into place data
    first, so the model never points at missing data. ``check(path of the written model)`` runs before
    anything is renamed into place (the numeric check reads the very file that is then kept)."""
    if _fits(model):
        write_atomic(path, lambda f: _write_model(model, f), " ONNX output", check=check)
        return
    given = path
    path, direct = output_target(path)
    if direct:
        raise TasoError(f"{given}: a model of 2 GB or more needs external data, which cannot go to a device")
    d = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(d):
        raise TasoError(f"{given}: directory does not exist")
    try:
        tmpdir = tempfile.mkdtemp(prefix=_temp_prefix(), dir=d)
    except OSError as e:
        raise TasoError(f"{given}: cannot write ({e.strerror})") from None
    base = os.path.basename(path)
    tmp = os.path.join(tmpdir, base)
    try:
        data = base + ".data"
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
        # (onnx writes the data file 0600)
        os.chmod(tmp, _new_file_mode(path))
        os.chmod(os.path.join(tmpdir, data), _new_file_mode(os.path.join(d, data)))
        if check is not None:
            check(tmp)
        os.replace(os.path.join(tmpdir, data), os.path.join(d, data))
        os.replace(tmp, path)
    except TasoError:
        raise
    except Exception as e:
        raise TasoError(f"{given}: cannot write ONNX output ({one_line(e)})") from None
    finally:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


#: models at least this large are written one initializer at a time (``_write_model``)
_CHUNKED_BYTES = 64 << 20


def _write_model(model: onnx.ModelProto, f) -> None:
    """``f.write(model.SerializeToString())`` without holding the serialized model in memory: that call
    holds two copies at once (protobuf's buffer and the bytes; +1.1 GB for 600 MB of weights). A large
    model is written as the model less its initializers, then one ``graph { initializer {...} }`` record
    per initializer (``_write_initializer_record``): protobuf merges repeated occurrences of a message
    field, so the file parses to the same model (only the order of fields on disk differs from
    SerializeToString's)."""
    inits = model.graph.initializer
    if len(inits) == 0 or model_size_bound(model) < _CHUNKED_BYTES:
        f.write(model.SerializeToString())
        return
    head = onnx.ModelProto()
    copy_fields(model, head, skip="graph")
    copy_fields(model.graph, head.graph, skip="initializer")
    f.write(head.SerializeToString())
    del head
    for t in inits:
        _write_initializer_record(t, f)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(message, field: str) -> bytes:
    """The wire key of a length-delimited field (wire type 2), its number from the schema."""
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def _write_initializer_record(t: onnx.TensorProto, f) -> None:
    """Write ``graph { initializer { t } }`` as protobuf's wire format, the tensor's fields other than
    ``raw_data`` serialized by protobuf and ``raw_data`` written from its buffer: serializing a copy
    of the tensor in a ModelProto copies the data twice (measured: 126 ms for 64 MB, against 26 ms)."""
    if not t.HasField("raw_data"):
        piece = onnx.ModelProto()
        piece.graph.initializer.append(t)
        f.write(piece.SerializeToString())
        return
    meta = onnx.TensorProto()
    copy_fields(t, meta, skip="raw_data")
    raw = t.raw_data
    tensor = meta.SerializeToString() + _key(onnx.TensorProto, "raw_data") + _varint(len(raw))
    n_tensor = len(tensor) + len(raw)
    graph = _key(onnx.GraphProto, "initializer") + _varint(n_tensor)
    f.write(_key(onnx.ModelProto, "graph") + _varint(len(graph) + n_tensor) + graph + tensor)
    f.write(raw)


def _fits(model) -> bool:
    try:
        return model_size_bound(model) < _TWO_GB
    except Exception:
        return False


def model_size_bound(model: onnx.ModelProto) -> int:
    """An upper bound of ``model.ByteSize()`` that does not serialize the weights: protobuf's (upb's)
    ByteSize serializes the whole model (1 s and +1.1 GB transient for 600 MB of weights). A raw_data
    initializer (``plain_raw_itemsize``) counts its data's bytes plus a bound for its name, dims and
    tags; the rest of the model is measured exactly."""
    size = 0
    rest = 0
    for t in model.graph.initializer:
        item = plain_raw_itemsize(t)
        if item is None:
            rest += 1
        else:
            size += len(t.raw_data) + len(t.name.encode()) + 11 * len(t.dims) + 64
    if rest == 0:
        head = onnx.ModelProto()
        copy_fields(model, head, skip="graph")
        copy_fields(model.graph, head.graph, skip="initializer")
        return size + head.ByteSize()
    return model.ByteSize()
