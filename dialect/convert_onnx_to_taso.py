"""The ``convert-onnx-to-taso`` pass.

Input: functions made of ONNX operations in either spelling
- the upstream importer's ``torch.operator "onnx.<Op>"`` on ``!torch.vtensor`` types, or
- onnx-mlir's ONNX dialect printed in generic form (``"onnx.<Op>"(...)`` on builtin tensors).

Output: the same functions on builtin tensor types, where
- operators in TASO's set (see ``specs.py``) become `taso` ops when the spec expresses the node exactly
  (static shapes, supported attribute values); the spec's shape function is checked against ONNX's
  inferred result types. A node may become several ops: ``Gemm`` (2-D, alpha = 1, beta = 1 or no C) is
  ``[taso.transpose] -> taso.matmul -> [taso.ewadd]``, where a transposed weight is a new weight
  ``<name>.T`` (one per weight, uniquely named);
- initializers and ``Constant`` nodes become ``taso.weight`` ops with inline dense values;
- ``Identity`` nodes are removed;
- every other node stays a generic ``"onnx.<Op>"`` operation (onnx-mlir's spelling) with its
  attributes, types and domain (``taso.domain`` when not the default), so that export restores it.
Nothing is dropped. Graph input/output names, the opsets and the IR version are recorded on the
function as ``taso.input_names``, ``taso.output_names``, ``taso.opset_imports``, ``taso.ir_version``.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from .errors import TasoError, one_line
from .handles import erase_op, ir_step
from .mlir import func, ir
from .ops import (TASO_ELEMS, dead_code_elimination, dense_array, dense_attr, type_shape, create_taso_op, int_value, loc_name,
                  named, new_weight, pyval, shape_of, str_list, str_value, verify_taso_op)
from .specs import MAX_ARITY, SpecError, broadcast_shape, resolve_auto_pad, spec
from .onnx_common import read_opsets
from .types import vtensor_to_builtin

DEFAULT_OPSET = 17
_NONE = object()  # a missing optional operand


class _Node:
    """A normalized ONNX node: op type, domain, operands, result types, attributes."""

    __slots__ = ("op_type", "domain", "operands", "results", "attrs", "loc", "old")

    def __init__(self, op_type, domain, operands, results, attrs, loc, old):
        self.op_type, self.domain, self.operands = op_type, domain, operands
        self.results, self.attrs, self.loc, self.old = results, attrs, loc, old

    def get(self, name, default=None):
        a = self.attrs.get(name)
        return default if a is None else pyval(a)

    def where(self) -> str:
        n = loc_name(self.loc)
        return f"{self.op_type} node '{n}'" if n else f"{self.op_type} node at {self.loc}"


# --------------------------------------------------------------------------------------------
# raising ONNX nodes to taso ops: each returns (taso name, operands, attrs) or None (stay generic)


def _static(*values) -> bool:
    return all(v is not _NONE and shape_of(v) is not None for v in values)


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _window_attrs(n: _Node, kernel, in_hw):
    strides = n.get("strides") or [1, 1]
    dil = n.get("dilations") or [1, 1]
    auto_pad = n.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("NOTSET", ""):
        pads = n.get("pads") or [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        pads = resolve_auto_pad(auto_pad, in_hw, kernel, strides, dil)
    else:
        return None
    if len(strides) != 2 or len(dil) != 2 or len(pads) != 4:
        return None
    return list(strides), list(pads), list(dil)


def _r_conv(n: _Node):
    x, w = n.operands[0], n.operands[1]
    b = n.operands[2] if len(n.operands) > 2 else _NONE
    if not _static(x, w) or len(shape_of(x)) != 4 or len(shape_of(w)) != 4 or len(n.results) != 1:
        return None
    k = list(shape_of(w)[2:])
    if n.get("kernel_shape") not in (None, k):
        return None
    wa = _window_attrs(n, k, shape_of(x)[2:])
    if wa is None:
        return None
    strides, pads, dil = wa
    ops = [x, w] + ([b] if b is not _NONE else [])
    return "conv2d", ops, dict(strides=strides, pads=pads, dilations=dil, group=n.get("group", 1), activation="none")


def _r_matmul(n: _Node):
    x, y = n.operands
    if not _static(x, y) or len(shape_of(x)) < 2 or len(shape_of(y)) < 2:
        return None
    return "matmul", [x, y], dict(activation="none")


def _r_add(n: _Node):
    if not _static(*n.operands):
        return None
    return "ewadd", list(n.operands), {}


def _r_mul(n: _Node):
    x, y = n.operands
    if not _static(x, y):
        return None
    rx, ry = len(shape_of(x)), len(shape_of(y))
    if ry == 0 and rx > 0:
        return "smul", [x, y], {}
    if rx == 0 and ry > 0:
        return "smul", [y, x], {}
    return "ewmul", [x, y], {}


def _r_unary(name):
    def r(n: _Node):
        if not _static(n.operands[0]):
            return None
        return name, [n.operands[0]], {}
    return r


def _r_transpose(n: _Node):
    (x,) = n.operands
    if not _static(x):
        return None
    r = len(shape_of(x))
    perm = n.get("perm") or list(range(r - 1, -1, -1))
    return "transpose", [x], dict(perm=[_norm_axis(p, r) for p in perm])


def _r_reshape(n: _Node):
    x = n.operands[0]
    if not _static(x) or type_shape(n.results[0]) is None:
        return None
    return "reshape", [x], dict(shape=list(shape_of_type(n.results[0])))


shape_of_type = type_shape


def _r_concat(n: _Node):
    ins = list(n.operands)
    if not 2 <= len(ins) <= MAX_ARITY or not _static(*ins):
        return None
    r = len(shape_of(ins[0]))
    return "concat", ins, dict(axis=_norm_axis(n.get("axis", 0), r))


def _r_split(n: _Node):
    x = n.operands[0]
    if not 2 <= len(n.results) <= MAX_ARITY or not _static(x) or any(shape_of_type(t) is None for t in n.results):
        return None
    r = len(shape_of(x))
    ax = _norm_axis(n.get("axis", 0), r)
    return "split", [x], dict(axis=ax, sizes=[shape_of_type(t)[ax] for t in n.results])


def _pool_common(n: _Node):
    x = n.operands[0]
    if len(n.results) != 1 or not _static(x) or len(shape_of(x)) != 4:
        return None
    if n.get("ceil_mode", 0) != 0:
        return None
    dil = n.get("dilations")
    if dil is not None and list(dil) != [1, 1]:
        return None
    k = n.get("kernel_shape")
    if k is None or len(k) != 2:
        return None
    wa = _window_attrs(n, k, shape_of(x)[2:])
    if wa is None:
        return None
    strides, pads, _ = wa
    return x, dict(kernel_shape=list(k), strides=strides, pads=pads)


def _r_maxpool(n: _Node):
    if n.get("storage_order", 0) != 0:
        return None
    c = _pool_common(n)
    return None if c is None else ("maxpool2d", [c[0]], c[1])


def _r_avgpool(n: _Node):
    c = _pool_common(n)
    if c is None:
        return None
    c[1]["count_include_pad"] = n.get("count_include_pad", 0)
    return "avgpool2d", [c[0]], c[1]


def _r_batchnorm(n: _Node):
    if len(n.results) != 1 or n.get("training_mode", 0) != 0 or len(n.operands) != 5:
        return None
    if not _static(*n.operands) or len(shape_of(n.operands[0])) < 2:
        return None
    return "batchnorm", list(n.operands), dict(epsilon=n.get("epsilon", 1e-5))


class _Step:
    """The result of an earlier step of a multi-op raise (an operand of a later step)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _r_gemm(n: _Node):
    """``Gemm``: Y = alpha * op(A) @ op(B) + beta * C, raised for 2-D static A and B with alpha = 1 and
    (no C or beta = 1) as ``[transpose(A)] -> matmul(., op(B)) -> [ewadd(., C)]``; op(B) of a weight is a
    transposed weight (``_transposed_weight``). C broadcasts to (M, N) unidirectionally, as ewadd's ONNX
    broadcasting does here. Other alpha/beta stay generic: scaling by ``taso.smul`` would round
    differently from onnxruntime's fused Gemm."""
    a, b = n.operands[0], n.operands[1]
    c = n.operands[2] if len(n.operands) > 2 else _NONE
    if len(n.results) != 1 or not _static(a, b) or len(shape_of(a)) != 2 or len(shape_of(b)) != 2:
        return None
    out = type_shape(n.results[0])
    if out is None or len(out) != 2:
        return None
    if float(n.get("alpha", 1.0)) != 1.0:
        return None
    if c is not _NONE:
        if float(n.get("beta", 1.0)) != 1.0 or not _static(c):
            return None
        cs = shape_of(c)
        try:
            if len(cs) > 2 or broadcast_shape(cs, out) != out:
                return None  # only C -> (M, N) (unidirectional)
        except SpecError:
            return None
    steps = []
    if n.get("transA", 0):
        steps.append(("transpose", [a], dict(perm=[1, 0])))
        a = _Step(len(steps) - 1)
    if n.get("transB", 0):
        steps.append(("transpose", [b], dict(perm=[1, 0])))
        b = _Step(len(steps) - 1)
    steps.append(("matmul", [a, b], dict(activation="none")))
    if c is not _NONE:
        steps.append(("ewadd", [_Step(len(steps) - 1), c], {}))
    return steps


RAISERS = {
    "Conv": _r_conv,
    "MatMul": _r_matmul,
    "Add": _r_add,
    "Mul": _r_mul,
    "Relu": _r_unary("relu"),
    "Sigmoid": _r_unary("sigmoid"),
    "Tanh": _r_unary("tanh"),
    "Transpose": _r_transpose,
    "Reshape": _r_reshape,
    "Concat": _r_concat,
    "Split": _r_split,
    "MaxPool": _r_maxpool,
    "AveragePool": _r_avgpool,
    "BatchNormalization": _r_batchnorm,
    "Gemm": _r_gemm,
}

#: The attributes each raiser understands. A node carrying any other attribute (a legacy one such as
#: ``consumed_inputs``, ``broadcast``/``axis`` of Add-6, ``is_test`` of BatchNormalization-6, or one from a
#: newer opset) is kept as a generic operation, so that nothing is dropped or reinterpreted.
RAISER_ATTRS = {
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "MatMul": set(),
    "Add": set(),
    "Mul": set(),
    "Relu": set(),
    "Sigmoid": set(),
    "Tanh": set(),
    "Transpose": {"perm"},
    "Reshape": {"shape", "allowzero"},  # the result type is static: both only restate it
    "Concat": {"axis"},
    "Split": {"axis", "split", "num_outputs"},  # the result types give the sizes
    "MaxPool": {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"},
    "AveragePool": {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"},
    # momentum only matters for training; spatial (opsets 7-8) must be 1, checked below
    "BatchNormalization": {"epsilon", "momentum", "training_mode", "spatial"},
    "Gemm": {"alpha", "beta", "transA", "transB"},  # (Gemm-1..6's broadcast attribute keeps it generic)
}


def _raisable(n: _Node, opset: int) -> bool:
    """Whether the node means, in its opset, what its raiser (and the taso op's export) assumes."""
    if set(n.attrs) - RAISER_ATTRS.get(n.op_type, set()):
        return False
    if n.op_type in ("Add", "Mul") and opset < 7:
        # legacy broadcasting (broadcast/axis attributes) differs from numpy's; the taso op is exported
        # without them, which is only right for equal shapes
        shapes = [shape_of(v) for v in n.operands]
        return all(s is not None for s in shapes) and len(set(shapes)) == 1
    if n.op_type == "Concat" and opset < 4 and "axis" not in n.attrs:
        return False  # Concat-1's default axis is 1
    if n.op_type == "BatchNormalization":
        # before opset 7 the node runs in training mode unless is_test=1, and the export cannot say so
        return opset >= 7 and n.get("spatial", 1) == 1
    if n.op_type == "Gemm" and opset < 7 and len(n.operands) > 2:
        # Gemm-1..6 broadcast C only with broadcast=1, and the exported Add-1..6 does not broadcast at all
        c, y = shape_of(n.operands[2]) if n.operands[2] is not _NONE else None, type_shape(n.results[0])
        return c is not None and c == y
    return True


def _arity_ok(n: _Node, opset: int) -> bool:
    """Whether the node has as many inputs and outputs as its ONNX schema allows (the raisers read
    them by position; a malformed node stays generic, and ONNX's checker reports it on export)."""
    import onnx

    try:
        sch = onnx.defs.get_schema(n.op_type, opset, "")
    except Exception:
        return False
    return sch.min_input <= len(n.operands) <= sch.max_input and sch.min_output <= len(n.results) <= sch.max_output


def _spec_accepts(tname: str, operand_types, results, attrs) -> bool:
    """Whether ``taso.<tname>`` expresses the node: its spec's constraints hold (e.g. pooling pads
    smaller than the kernel) and all element types agree. A result shape that differs from ONNX's
    inference is not caught here: ``verify_taso_op`` reports that loudly, as a disagreement."""
    s = spec(tname)
    try:
        full = s.complete_attrs(attrs)
        ins = [type_shape(t) for t in operand_types]
        outs = [type_shape(t) for t in results]
        if any(x is None for x in ins + outs):
            return False
        s.shape(ins, full, outs)
    except SpecError:
        return False
    ets = {str(ir.ShapedType(t).element_type) for t in operand_types}
    ets |= {str(ir.ShapedType(t).element_type) for t in results}
    return len(ets) <= 1 and ets <= TASO_ELEMS


def _typed_plan(plan, n: _Node) -> Optional[list]:
    """A raiser's steps ``(taso name, operands, attrs)`` (an operand may be a ``_Step``) with their result
    types: the last step's are the node's, an earlier step's come from its spec's shape function. None
    (the node stays generic) if a step is not expressible (see ``_spec_accepts``)."""
    types: list = []
    out = []
    for i, (tname, operands, attrs) in enumerate(plan):
        if any(v is _NONE for v in operands):
            return None
        ins = [types[v.index][0] if isinstance(v, _Step) else v.type for v in operands]
        if i == len(plan) - 1:
            results = list(n.results)
        else:
            s = spec(tname)
            try:
                shapes = s.shape([type_shape(t) for t in ins], s.complete_attrs(attrs), None)
            except (SpecError, TypeError):
                return None
            et = ir.ShapedType(ins[0]).element_type
            results = [ir.RankedTensorType.get(list(shp), et, loc=ir.Location.unknown()) for shp in shapes]
        if not _spec_accepts(tname, ins, results, attrs):
            return None
        types.append(results)
        out.append((tname, operands, attrs, results))
    return out


class Weights:
    """One function's weights: unique names for the weights the conversion makes, and the transposed
    weights made for raised nodes (one per source weight, shared by all its readers)."""

    def __init__(self, old_block, reserved=()):
        self._block = old_block
        self._reserved = set(reserved)
        self._names: Optional[set] = None  # every name the function's weights have or will have
        self.count = 0  # const_<n> names
        self.transposed: dict = {}  # (source weight value, perm) -> transposed weight value

    def _taken(self) -> set:
        """The names of all ops of the function being converted, read on first need: a weight's name is its
        location name, its dense_resource key, or its ``name`` attribute (over-reserving is harmless)."""
        if self._names is None:
            names = set(self._reserved)
            for op in self._block.operations:
                o = op.operation
                ln = loc_name(o.location)
                if ln:
                    names.add(ln)
                for key in ("name", "value", "torch.onnx.value"):
                    if key not in o.attributes:
                        continue
                    a = o.attributes[key]
                    if isinstance(a, ir.StringAttr):
                        names.add(str_value(a))
                    elif not isinstance(a, ir.DenseElementsAttr):
                        m = _DENSE_RESOURCE_RE.match(str(a))
                        if m:
                            names.add(m.group(1))
            self._names = names
        return self._names

    def add(self, name: str) -> None:
        """Record the name of a weight the conversion made."""
        self._reserved.add(name)
        if self._names is not None:
            self._names.add(name)

    def fresh(self, hint: str) -> str:
        taken = self._taken()
        name, i = hint, 0
        while name in taken:
            i += 1
            name = f"{hint}_{i}"
        taken.add(name)
        return name


def weight_of(v) -> Optional[ir.Operation]:
    """The ``taso.weight`` op producing ``v``, else None."""
    owner = v.owner
    op = getattr(owner, "operation", owner)
    return op if isinstance(op, ir.Operation) and op.name == "taso.weight" else None


def _transposed_weight(v, perm, weights: Weights) -> Optional[ir.Value]:
    """``transpose(v, perm)`` for a weight ``v`` as a new weight (its value transposed in numpy, its name
    ``<name>.T`` made unique), made once per weight and permutation; None if ``v`` is not a weight whose
    value numpy can read (bf16, ...): the caller keeps a ``taso.transpose``."""
    key = (v, tuple(perm))
    if key in weights.transposed:
        return weights.transposed[key]
    w = weight_of(v)
    if w is None:
        return None
    value = w.attributes["value"]
    if not isinstance(value, ir.DenseElementsAttr):
        return None
    src = ir.RankedTensorType(v.type)
    ttype = ir.RankedTensorType.get([src.shape[p] for p in perm], src.element_type, loc=ir.Location.unknown())
    try:
        if value.is_splat:
            new_value = ir.DenseElementsAttr.get_splat(ttype, value.get_splat_value())
        else:
            arr = dense_array(value, f"{w.location}: weight value")
            new_value = dense_attr(np.transpose(arr, perm), ttype)
    except TasoError:
        return None
    name = weights.fresh(str_value(w.attributes["name"], f"{w.location}: weight name") + ".T")
    t = new_weight(name, new_value, ttype, loc=ir.Location.name(name, childLoc=w.location))
    weights.transposed[key] = t.results[0]
    return t.results[0]


# --------------------------------------------------------------------------------------------
# resources: dense_resource blobs can only be read back from the printed module


_RES_RE = re.compile(r'^\s*"?([^":\s]+)"?\s*:\s*"0x([0-9A-Fa-f]*)"', re.M)


class _Resources:
    def __init__(self, module_op: ir.Operation):
        self._op = module_op
        self._blobs: Optional[dict[str, bytes]] = None

    def get(self, key: str) -> bytes:
        if self._blobs is None:
            text = self._op.get_asm(large_elements_limit=None, large_resource_limit=None)
            start = text.find("{-#")
            self._blobs = {}
            if start >= 0:
                for m in _RES_RE.finditer(text[start:]):
                    raw = bytes.fromhex(m.group(2))
                    self._blobs[m.group(1)] = raw[4:]  # first 4 bytes: alignment
        if key not in self._blobs:
            raise TasoError(f"dense_resource blob '{key}' not found in the module")
        return self._blobs[key]


_DENSE_RESOURCE_RE = re.compile(r"^dense_resource<([^>]+)>\s*:\s*(.+)$")


def _weight_value(attr: ir.Attribute, res: _Resources, where: str) -> ir.Attribute:
    if isinstance(attr, ir.DenseElementsAttr):
        return attr
    m = _DENSE_RESOURCE_RE.match(str(attr))
    if m:
        from .types import parse_tensor_type, numpy_dtype, onnx_dtype_of_mlir

        ttype = ir.Type.parse(m.group(2))
        shape, elem = parse_tensor_type(ttype)
        dt = numpy_dtype(onnx_dtype_of_mlir(elem))
        try:
            data = res.get(m.group(1))
        except TasoError as e:
            raise TasoError(f"{where}: {e}") from None
        if shape is None or any(d is None for d in shape):
            raise TasoError(f"{where}: constant type {ttype} is not statically shaped")
        arr = np.frombuffer(data, dtype=np.uint8 if elem == "i1" else dt)
        if elem == "i1":
            arr = arr.astype(np.bool_)
        if arr.size != int(np.prod(shape, dtype=object)):
            raise TasoError(f"{where}: dense_resource blob '{m.group(1)}' holds {len(data)} bytes, which do not "
                            f"make a {ttype}")
        return ir.DenseElementsAttr.get(arr.reshape(shape).copy(), type=ttype)
    raise TasoError(f"{where}: unsupported constant value {str(attr)[:80]}")


def _scalar_constant(n: _Node) -> Optional[np.ndarray]:
    for k, dt, kinds in (("value_float", np.float32, (int, float)), ("value_int", np.int64, (int,)),
                         ("value_floats", np.float32, (int, float)), ("value_ints", np.int64, (int,))):
        if k in n.attrs:
            v = pyval(n.attrs[k])
            items = v if k.endswith("s") and isinstance(v, (list, tuple)) else [v]
            if k.endswith("s") != isinstance(v, (list, tuple)) or \
                    not all(isinstance(x, kinds) and not isinstance(x, bool) for x in items):
                raise TasoError(f"{n.where()}: attribute '{k}' has the wrong kind: {n.attrs[k]}")
            try:
                return np.array(v, dtype=dt)
            except (ValueError, OverflowError, TypeError) as e:
                raise TasoError(f"{n.where()}: attribute '{k}': {one_line(e)}") from None
    return None


# --------------------------------------------------------------------------------------------


@ir_step
def convert_module(module, *, where: str = "module", default_opset: int = DEFAULT_OPSET) -> None:
    """Run convert-onnx-to-taso over every function of ``module`` (an ir.Module or its operation),
    in place. Raises TasoError on input it cannot convert faithfully."""
    op = module.operation if isinstance(module, ir.Module) else module
    res = _Resources(op)
    with op.context:
        for f in list(op.regions[0].blocks[0].operations):
            if f.operation.name == "func.func":
                _convert_func(f.operation, res, where, default_opset)
        _drop_unused_weights(op)


def _drop_unused_weights(op: ir.Operation) -> None:
    """Conversion leaves some values unused (Reshape's shape input, its Shape->Gather->Concat chain,
    Split's sizes): remove dead taso/onnx ops. ONNX operators have no side effects, so this never
    changes what the graph computes."""
    dead_code_elimination(op)


def _node_of(o: ir.Operation, vmap) -> Optional[_Node]:
    name = o.name
    node_name = None
    if name == "torch.operator":
        if "name" not in o.attributes:
            raise TasoError(f"{o.location}: torch.operator has no 'name' attribute")
        full = str_value(o.attributes["name"], f"{o.location}: torch.operator name")
        if not full.startswith("onnx."):
            raise TasoError(f"{o.location}: torch.operator '{full}' is not an ONNX operator")
        op_type = full[len("onnx."):]
        attrs = {}
        domain = ""
        for na in named(o.attributes):
            if na.name.startswith("torch.onnx."):
                key = na.name[len("torch.onnx."):]
                if key == "taso_domain":
                    domain = str_value(na.attr, f"{o.location}: attribute '{na.name}'")
                elif key == "taso_attr_types":  # see onnx_import.ATTR_TYPES_ATTR
                    str_value(na.attr, f"{o.location}: attribute '{na.name}'")
                    attrs["taso.attr_types"] = na.attr
                else:
                    attrs[key] = na.attr
            elif na.name != "name":
                # the importer prefixes every ONNX attribute; anything else would be dropped silently
                raise TasoError(f"{o.location}: torch.operator attribute '{na.name}' is not an ONNX attribute "
                                f"(expected 'torch.onnx.{na.name}')")
    elif name.startswith("onnx."):
        op_type = name[len("onnx."):]
        attrs = {na.name: na.attr for na in named(o.attributes)}
        domain = ""
        if "taso.domain" in attrs:
            domain = str_value(attrs.pop("taso.domain"), f"{o.location}: attribute 'taso.domain'")
        if "taso.attr_types" in attrs:
            str_value(attrs["taso.attr_types"], f"{o.location}: attribute 'taso.attr_types'")
        node_name = attrs.pop("onnx_node_name", None)
        if node_name is not None:
            node_name = str_value(node_name, f"{o.location}: attribute 'onnx_node_name'")
        if op_type == "Custom" and "function_name" in attrs:
            op_type = str_value(attrs.pop("function_name"), f"{o.location}: attribute 'function_name'")
            domain = str_value(attrs.pop("domain_name"), f"{o.location}: attribute 'domain_name'") \
                if "domain_name" in attrs else domain
    else:
        return None
    loc = o.location
    if name.startswith("onnx.") and node_name is not None:
        loc = ir.Location.name(node_name, childLoc=o.location)
    if len(o.regions):
        raise TasoError(f"{o.location}: '{op_type}' has regions (subgraphs); control flow is not supported yet")
    operands = [_mapped(vmap, v, o) for v in o.operands]
    results = [_builtin(r.type, o) for r in o.results]
    return _Node(op_type, domain, operands, results, attrs, loc, o)


def _mapped(vmap, v: ir.Value, o: ir.Operation):
    if v not in vmap:
        raise TasoError(f"{o.location}: '{o.name}' uses a value that is not defined in the function's body "
                        f"(by an operation that was not converted)")
    return vmap[v]


def _builtin(t: ir.Type, o) -> ir.Type:
    s = str(t)
    if s.startswith("!torch.vtensor"):
        try:
            return vtensor_to_builtin(t)
        except TasoError as e:
            raise TasoError(f"{o.location}: {e}") from None
    if s == "none" or s.startswith("!torch.none"):
        return ir.NoneType.get()  # an omitted optional input or output ("" in ONNX)
    if s.startswith("tensor<"):
        return t
    raise TasoError(f"{o.location}: unsupported value type {s} (only tensors are supported)")


def _named_from_attrs(attr, count) -> Optional[list]:
    """onnx-mlir's ``{onnx.name = "x"}`` argument/result attributes -> names (None if absent)."""
    if attr is None:
        return None
    names = []
    arr = attr.maybe_downcast() if hasattr(attr, "maybe_downcast") else attr
    if not isinstance(arr, ir.ArrayAttr):
        return None
    for d in arr:
        if not isinstance(d, ir.DictAttr):
            return None
        names.append(str_value(d["onnx.name"], "argument/result attribute 'onnx.name'") if "onnx.name" in d else None)
    if not any(names) or (count is not None and len(names) != count):
        return None
    return names


def _convert_func(fop: ir.Operation, res: _Resources, where: str, default_opset: int) -> None:
    if len(fop.regions[0].blocks) == 0:
        return  # a declaration: nothing to convert
    if len(fop.regions[0].blocks) > 1:
        raise TasoError(f"{fop.location}: a function with more than one block is not an ONNX graph")
    old_block = fop.regions[0].blocks[0]
    fattrs = {na.name: na.attr for na in named(fop.attributes)}
    ctx = fop.context

    # graph metadata
    opsets = {}
    if "taso.opset_imports" in fattrs:
        opsets = read_opsets(fattrs["taso.opset_imports"])
    else:
        if "torch.onnx_meta.opset_version" in fattrs:
            opsets[""] = int_value(fattrs["torch.onnx_meta.opset_version"], "torch.onnx_meta.opset_version", lo=0)
        if "torch.onnx_meta.opset_versions" in fattrs:
            versions = fattrs["torch.onnx_meta.opset_versions"]
            if not isinstance(versions, ir.DictAttr):
                raise TasoError(f"torch.onnx_meta.opset_versions must be a dictionary, got {versions}")
            for na in named(versions):
                opsets[na.name] = int_value(na.attr, f"opset version of '{na.name}'", lo=0)
        opsets.setdefault("", default_opset)
    ir_version = int_value(fattrs["taso.ir_version"], "taso.ir_version", lo=0) if "taso.ir_version" in fattrs else (
        int_value(fattrs["torch.onnx_meta.ir_version"], "torch.onnx_meta.ir_version", lo=0)
        if "torch.onnx_meta.ir_version" in fattrs else 8)
    in_names = _named_from_attrs(fattrs.get("arg_attrs"), len(old_block.arguments)) or \
        [loc_name(a.location) for a in old_block.arguments]
    if "taso.input_names" in fattrs:
        in_names = str_list(fattrs["taso.input_names"], "taso.input_names")
        if len(in_names) != len(old_block.arguments):
            raise TasoError(f"{fop.location}: taso.input_names has {len(in_names)} names for "
                            f"{len(old_block.arguments)} function arguments")
    in_names = [n or f"input_{i}" for i, n in enumerate(in_names)]
    out_names = str_list(fattrs["taso.output_names"], "taso.output_names") if "taso.output_names" in fattrs else \
        _named_from_attrs(fattrs.get("res_attrs"), None)

    vmap: dict = {}
    arg_types = [_builtin(a.type, fop) for a in old_block.arguments]
    with ir.Location.unknown(ctx):
        ftype = ir.FunctionType.get(arg_types, [])
        new = func.FuncOp(str_value(fop.attributes["sym_name"], "function name") + ".taso_tmp", ftype,
                          ip=ir.InsertionPoint(fop))
        block = new.add_entry_block([a.location for a in old_block.arguments])
    for a, b in zip(old_block.arguments, block.arguments):
        vmap[a] = b
    none_value = None
    returned = None
    weights = Weights(old_block, in_names + list(out_names or ()))

    def none():
        nonlocal none_value
        if none_value is None:
            with ir.InsertionPoint.at_block_begin(block), ir.Location.unknown(ctx):
                none_value = ir.Operation.create("onnx.NoValue", results=[ir.NoneType.get()],
                                                 attributes={"value": ir.UnitAttr.get()}).result
        return none_value

    with ir.InsertionPoint(block):
        for op in old_block.operations:
            o = op.operation
            name = o.name
            if name in ("torch.constant.none", "onnx.NoValue"):
                vmap[o.results[0]] = _NONE
                continue
            if name in ("func.return", "onnx.Return"):
                if returned is not None:
                    raise TasoError(f"{o.location}: a second '{name}' in the function")
                if len(o.results):
                    raise TasoError(f"{o.location}: '{name}' has results")
                returned = [_mapped(vmap, v, o) for v in o.operands]
                continue
            n = _node_of(o, vmap)
            if n is None:
                if len(o.regions):
                    raise TasoError(f"{o.location}: unsupported operation '{name}' with regions")
                # already-converted taso ops and other ops on builtin types are carried over unchanged
                for v in o.operands:
                    if vmap[v] is _NONE:
                        raise TasoError(f"{o.location}: '{name}' uses a missing optional value")
                new_op = ir.Operation.create(name, results=[_builtin(r.type, o) for r in o.results],
                                             operands=[vmap[v] for v in o.operands],
                                             attributes={na.name: na.attr for na in named(o.attributes)}, loc=o.location)
                if name.startswith("taso."):
                    verify_taso_op(new_op)
                for a, b in zip(o.results, new_op.results):
                    vmap[a] = b
                continue
            _convert_node(n, vmap, none, res, where, weights, opset=opsets.get("", default_opset))
        if returned is None:
            raise TasoError(f"{where}: function has no return")
        if any(v is _NONE for v in returned):
            raise TasoError(f"{where}: a graph output is a missing optional value")
        declared = ir.FunctionType(ir.TypeAttr(fop.attributes["function_type"]).value).results
        if len(declared) != len(returned) or any(
                str(_builtin(t, fop)) != str(v.type) for t, v in zip(declared, returned)):
            raise TasoError(f"{fop.location}: the function returns ({', '.join(str(v.type) for v in returned)}) "
                            f"but is declared to return ({', '.join(str(t) for t in declared)})")
        func.ReturnOp(returned, loc=ir.Location.unknown(ctx))

    if out_names is None:
        out_names = [f"output_{i}" for i in range(len(returned))]
    new.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(arg_types, [v.type for v in returned]))
    for k, v in fattrs.items():
        if k in ("sym_name", "function_type", "arg_attrs", "res_attrs") or k.startswith("torch.onnx_meta.") \
                or k.startswith("taso."):
            continue
        new.attributes[k] = v
    i64 = ir.IntegerType.get_signless(64)
    with ctx:
        new.attributes["taso.input_names"] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in in_names])
        new.attributes["taso.output_names"] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in out_names])
        new.attributes["taso.opset_imports"] = ir.DictAttr.get(
            {(k or "ai.onnx"): ir.IntegerAttr.get(i64, v) for k, v in opsets.items()})
        new.attributes["taso.ir_version"] = ir.IntegerAttr.get(i64, ir_version)
    name = fop.attributes["sym_name"]
    erase_op(fop)
    new.attributes["sym_name"] = name


def _convert_node(n: _Node, vmap, none, res: _Resources, where: str, weights: Weights,
                  opset: int = DEFAULT_OPSET) -> None:
    o = n.old
    # Constants (the importer's initializers, onnx-mlir's onnx.Constant) -> taso.weight
    if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
        if len(n.results) != 1 or n.operands or len(n.attrs) != 1:
            raise TasoError(f"{where}: {n.where()}: a Constant has no operands, one result and one value "
                            f"attribute, got {len(n.operands)}, {len(n.results)} and {sorted(n.attrs)}")
        if "value" in n.attrs:
            value = _weight_value(n.attrs["value"], res, n.where())
        else:
            arr = _scalar_constant(n)
            if arr is None:
                raise TasoError(f"{where}: {n.where()}: unsupported Constant attributes {sorted(n.attrs)}")
            from .types import tensor_type
            value = dense_attr(arr, tensor_type(arr.shape, {"float32": "f32", "int64": "si64"}[str(arr.dtype)]))
        wname = loc_name(n.loc)
        if not wname and "value" in n.attrs:
            m = _DENSE_RESOURCE_RE.match(str(n.attrs["value"]))
            wname = m.group(1) if m else None
        if not wname:
            weights.count += 1
            wname = f"const_{weights.count}"
        weights.add(wname)
        if str(value.type) != str(n.results[0]):
            raise TasoError(f"{where}: {n.where()}: the value's type {value.type} differs from the result type "
                            f"{n.results[0]}")
        w = new_weight(wname, value, value.type, loc=n.loc)
        vmap[o.results[0]] = w.results[0]
        return
    if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and len(n.operands) == 1 and len(n.results) == 1 \
            and n.operands[0] is not _NONE:
        if str(n.operands[0].type) != str(n.results[0]):
            raise TasoError(f"{where}: {n.where()}: Identity changes the type {n.operands[0].type} to {n.results[0]}")
        vmap[o.results[0]] = n.operands[0]
        return
    raiser = RAISERS.get(n.op_type) if n.domain in ("", "ai.onnx") else None
    if raiser is not None and all(v is not _NONE for v in n.operands[:1]) and _arity_ok(n, opset) \
            and _raisable(n, opset):
        try:
            r = raiser(n)
            # one op (taso name, operands, attrs), or a list of such steps (a multi-op raise)
            plan = None if r is None else _typed_plan(r if isinstance(r, list) else [r], n)
        except (SpecError, ValueError, TypeError, IndexError):
            plan = None
        if plan is not None:
            made: list = []
            for tname, operands, attrs, results in plan:
                operands = [made[v.index].results[0] if isinstance(v, _Step) else v for v in operands]
                if tname == "transpose" and len(plan) > 1:
                    # a transposed weight in a multi-op raise (Gemm's transB) is a weight of its own
                    t = _transposed_weight(operands[0], attrs["perm"], weights)
                    if t is not None:
                        made.append(t.owner)
                        continue
                try:
                    new_op = create_taso_op(tname, operands, results, attrs, loc=n.loc)
                except SpecError as e:
                    raise TasoError(f"{where}: {n.where()}: {e}") from None
                verify_taso_op(new_op)  # the spec's shape function must agree with ONNX's inference
                made.append(new_op)
            for a, b in zip(o.results, made[-1].results):
                vmap[a] = b
            return
    # generic op, kept as it is
    attrs = dict(n.attrs)
    if n.domain not in ("", "ai.onnx"):
        attrs["taso.domain"] = ir.StringAttr.get(n.domain)
    operands = [none() if v is _NONE else v for v in n.operands]
    try:
        new_op = ir.Operation.create(f"onnx.{n.op_type}", results=n.results, operands=operands,
                                     attributes=attrs, loc=n.loc)
    except Exception as e:
        raise TasoError(f"{where}: {n.where()}: {one_line(e)}") from None
    for a, b in zip(o.results, new_op.results):
        vmap[a] = b
