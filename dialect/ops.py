"""Building and reading `taso` operations (attributes as Python values, segment sizes, shapes)."""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Sequence

import numpy as np

from .errors import TasoError
from .handles import OP_CHECKS, check_operands, erase_op, ir_step
from .mlir import ir
from .specs import MAX_ARITY, SpecError, spec

_LOC_NAME = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"(?:\)|\()')


def loc_name(loc: ir.Location) -> Optional[str]:
    """The name of a ``loc("name")`` location (possibly wrapping another), else None."""
    # (not NameLoc.name_str: on a name that is not UTF-8 it aborts the whole process; the printed
    # location escapes such bytes)
    m = _LOC_NAME.match(str(loc))
    return _unescape_mlir_string(m.group(1)) if m else None


_MLIR_ESCAPE = re.compile(r"\\(\\|[0-9A-Fa-f]{2})")


def _unescape_mlir_string(text: str) -> str:
    r"""MLIR's printed string escapes (``\\`` and ``\XX`` per byte) back to the UTF-8 string."""
    out = bytearray()
    pos = 0
    for m in _MLIR_ESCAPE.finditer(text):
        out += text[pos:m.start()].encode()
        out += b"\\" if m.group(1) == "\\" else bytes([int(m.group(1), 16)])
        pos = m.end()
    out += text[pos:].encode()
    return out.decode("utf-8", errors="replace")


_STR_LITERAL = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_COMPLEX_DENSE = re.compile(rb'dense(?:<[^<>]*>|_resource<__elided__>)\s*:\s*(?:tensor|vector)<[^<>]*complex<')
_ESCAPE_BYTES = re.compile(rb"\\(\\|[0-9A-Fa-f]{2})")


def check_readable(module_op: ir.Operation, where: str) -> None:
    """Reject a parsed module that the Python bindings cannot walk without aborting the process:
    strings (op names, attribute names, string attributes, symbol names) that are not UTF-8 make
    ``Operation.name`` / ``NamedAttribute.name`` throw across C++ frames, and a complex-valued dense
    attribute aborts as soon as the attribute is enumerated. Checked on the printed generic form,
    which escapes every such byte, before anything in Python touches the operations."""
    text = module_op.get_asm(binary=True, large_elements_limit=16, large_resource_limit=16,
                             print_generic_op_form=True, assume_verified=True)
    m = _COMPLEX_DENSE.search(text)
    if m:
        raise TasoError(f"{where}: complex-valued dense attributes are not supported "
                        f"('{m.group().decode('ascii', 'replace')[:100]}...')")
    for m in _STR_LITERAL.finditer(text):
        body = m.group(1)
        if b"\\" not in body and body.isascii():
            continue
        raw = _ESCAPE_BYTES.sub(lambda e: b"\\" if e.group(1) == b"\\" else bytes([int(e.group(1), 16)]), body)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TasoError(f"{where}: the string \"{body.decode('ascii', 'replace')[:80]}\" (an op, attribute or "
                            f"symbol name or a string attribute) is not UTF-8 text, which is not supported") from None


def named(attrs) -> list:
    """The NamedAttributes of an op's attribute map or of a DictAttr (iteration yields only names)."""
    return [attrs[i] for i in range(len(attrs))]


def str_value(attr: ir.Attribute, what: str = "a string attribute") -> str:
    """A StringAttr's text. Raises TasoError (never the bindings' RuntimeError, never an abort) when
    the attribute is not a string or its bytes are not UTF-8."""
    if not isinstance(attr, ir.StringAttr):
        down = attr.maybe_downcast() if hasattr(attr, "maybe_downcast") else attr
        if not isinstance(down, ir.StringAttr):
            raise TasoError(f"{what} must be a string, got {attr}")
        attr = down
    try:
        return bytes(attr.value_bytes).decode("utf-8")
    except UnicodeDecodeError:
        raise TasoError(f"{what} {attr} is not UTF-8 text") from None


def _downcast(attr: ir.Attribute) -> ir.Attribute:
    return attr.maybe_downcast() if hasattr(attr, "maybe_downcast") else attr


def int_value(attr: ir.Attribute, what: str, lo: int = -(1 << 63), hi: int = (1 << 63) - 1) -> int:
    """An IntegerAttr's value in [lo, hi], else a TasoError (a wide integer's ``.value`` raises
    std::bad_cast in the bindings)."""
    a = _downcast(attr)
    if not isinstance(a, ir.IntegerAttr) or isinstance(a, ir.BoolAttr):
        raise TasoError(f"{what} must be an integer, got {attr}")
    try:
        v = int(a.value)
    except Exception:
        raise TasoError(f"{what} {attr} is out of range") from None
    if not lo <= v <= hi:
        raise TasoError(f"{what} {attr} is out of range [{lo}, {hi}]")
    return v


def str_list(attr: ir.Attribute, what: str) -> list[str]:
    """An ArrayAttr of strings as a list of str, else a TasoError."""
    a = _downcast(attr)
    if not isinstance(a, ir.ArrayAttr):
        raise TasoError(f"{what} must be an array of strings, got {attr}")
    return [str_value(x, f"an element of {what}") for x in a]


#: Element types whose dense attributes numpy reads back. ``np.array`` of any other raises (bf16,
#: f8, i4) or aborts the whole process (complex).
NUMPY_ELEMS = frozenset({"f16", "f32", "f64", "i1"} | {f"{s}i{w}" for s in ("", "s", "u") for w in (8, 16, 32, 64)})


def max_materialize_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def dense_array(attr: ir.Attribute, what: str = "dense attribute") -> np.ndarray:
    """``np.array`` of a DenseElementsAttr, checked first: an element type numpy cannot hold, or a
    splat that would expand to more than half the machine's memory, is a TasoError."""
    st = ir.ShapedType(attr.type)
    elem = str(st.element_type)
    if elem not in NUMPY_ELEMS:
        raise TasoError(f"{what} of type {attr.type}: element type {elem} is not supported")
    if attr.is_splat:
        nbytes = max(1, int(re.search(r"\d+", elem).group()) // 8)
        for d in st.shape:
            nbytes *= d
        if nbytes > max_materialize_bytes():
            raise TasoError(f"{what} of type {attr.type} is too large ({nbytes / 2**30:.3g} GiB)")
    try:
        return np.array(attr)
    except (TypeError, ValueError, MemoryError) as e:
        raise TasoError(f"{what} of type {attr.type} cannot be read ({type(e).__name__}: {e})") from None


def pyval(attr: ir.Attribute) -> Any:
    """A Python value for an MLIR attribute (ints, floats, strings, lists, numpy arrays)."""
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, ir.StringAttr):
        return str_value(attr)
    if isinstance(attr, ir.DenseI64ArrayAttr) or isinstance(attr, ir.DenseI32ArrayAttr):
        return tuple(int(x) for x in attr)
    if isinstance(attr, ir.ArrayAttr):
        return [pyval(a) for a in attr]
    if isinstance(attr, ir.DenseElementsAttr):
        return dense_array(attr)
    if isinstance(attr, ir.UnitAttr):
        return True
    # try a downcast (attributes from some accessors arrive as plain ir.Attribute)
    down = attr.maybe_downcast() if hasattr(attr, "maybe_downcast") else attr
    if type(down) is not type(attr):
        return pyval(down)
    raise TasoError(f"unsupported attribute {attr}")


def mlir_attr(kind: str, value: Any) -> ir.Attribute:
    if kind == "int":
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))
    if kind == "ints":
        return ir.DenseI64ArrayAttr.get([int(v) for v in value])
    if kind == "float":
        # FloatAttr.get needs a location for its diagnostics (none is active in create_taso_op)
        return ir.FloatAttr.get(ir.F32Type.get(), float(value), loc=ir.Location.unknown())
    if kind == "str":
        return ir.StringAttr.get(value)
    raise ValueError(kind)


def type_shape(t: ir.Type) -> Optional[tuple[int, ...]]:
    """Static shape of a ranked tensor type, else None."""
    try:
        shp = ir.RankedTensorType(t).shape
    except ValueError:
        return None
    if any(d < 0 for d in shp):
        return None
    return tuple(shp)


def shape_of(value: ir.Value) -> Optional[tuple[int, ...]]:
    """Static shape of a ranked tensor value, else None."""
    return type_shape(value.type)


def elem_type(value_or_type) -> ir.Type:
    t = value_or_type.type if isinstance(value_or_type, ir.Value) else value_or_type
    return ir.ShapedType(t).element_type


def create_taso_op(name: str, operands: Sequence[ir.Value], result_types: Sequence[ir.Type],
                   attrs: dict, loc: Optional[ir.Location] = None, extra: Optional[dict] = None) -> ir.Operation:
    """Create ``taso.<name>`` with attributes completed from the spec (defaults filled, kinds checked). In the
    IR debug mode (``handles``) no operand may be a value of an erased op."""
    check_operands(operands, f"a new 'taso.{name}'")
    s = spec(name)
    full = s.complete_attrs({k: v for k, v in attrs.items() if k not in ("value", "name")})
    mattrs = {k: mlir_attr(s.attr(k).kind, v) for k, v in full.items()}
    if s.variadic_operands:
        n = len(operands)
        if not 2 <= n <= MAX_ARITY:
            raise SpecError(f"taso.{name} takes 2..{MAX_ARITY} operands, got {n}")
        mattrs["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get([1] * n + [0] * (MAX_ARITY - n))
    elif s.optional_operands:
        req = len(s.operands)
        present = len(operands) - req
        if not 0 <= present <= len(s.optional_operands):
            raise SpecError(f"taso.{name}: wrong number of operands ({len(operands)})")
        mattrs["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(
            [1] * req + [1] * present + [0] * (len(s.optional_operands) - present))
    if s.variadic_results:
        n = len(result_types)
        if not 2 <= n <= MAX_ARITY:
            raise SpecError(f"taso.{name} has 2..{MAX_ARITY} results, got {n}")
        mattrs["resultSegmentSizes"] = ir.DenseI32ArrayAttr.get([1] * n + [0] * (MAX_ARITY - n))
    if extra:
        mattrs.update(extra)
    return ir.Operation.create(f"taso.{name}", results=list(result_types), operands=list(operands),
                               attributes=mattrs, loc=loc)


def new_weight(name: str, value: Any, ttype: ir.Type, loc: Optional[ir.Location] = None) -> ir.Operation:
    """A ``taso.weight`` op named ``name`` of type ``ttype`` (at the current insertion point, if any).
    ``value`` is an elements attribute of that type, or a numpy array (any float or integer dtype,
    e.g. float64) that is rounded once to ``ttype``'s element type."""
    if not isinstance(value, ir.Attribute):
        from .types import numpy_dtype, onnx_dtype_of_mlir

        rt = ir.RankedTensorType(ttype)
        dt = numpy_dtype(onnx_dtype_of_mlir(str(rt.element_type)))
        value = ir.DenseElementsAttr.get(np.ascontiguousarray(np.asarray(value).astype(dt).reshape(rt.shape)),
                                         type=ttype)
    return create_taso_op("weight", [], [ttype], {}, loc=loc,
                          extra={"name": ir.StringAttr.get(name), "value": value})


def taso_attrs(op: ir.Operation) -> dict:
    """The spec attributes of a `taso` op as Python values (``value`` as a numpy array)."""
    s = spec(op.name)
    out = {}
    for na in named(op.attributes):
        if na.name in ("operandSegmentSizes", "resultSegmentSizes"):
            continue
        if na.name == "value" and s.value_attr:
            out["value"] = na.attr
            continue
        try:
            out[na.name] = pyval(na.attr)
        except TasoError as e:
            raise SpecError(f"attribute '{na.name}': {e}") from None
    return out


#: Element types `taso` ops compute on: ONNX's real number and boolean tensor types.
TASO_ELEMS = frozenset({"f16", "bf16", "f32", "f64", "i1"} | {f"{s}i{w}" for s in ("", "s", "u") for w in (8, 16, 32, 64)})


def verify_taso_op(op: ir.Operation) -> None:
    """Check one `taso` op against its spec: attributes, static shapes, result shapes. Raises TasoError."""
    s = spec(op.name)
    where = str(op.location)
    try:
        attrs = taso_attrs(op)
        if s.value_attr:
            v = attrs.get("value")
            if not isinstance(v, ir.DenseElementsAttr):
                raise SpecError("'value' must be an inline dense elements attribute (dense<...>)")
            if v.type != op.results[0].type:
                raise SpecError(f"value type {v.type} differs from result type {op.results[0].type}")
            if "name" not in attrs:
                raise SpecError("missing 'name'")
        full = s.complete_attrs({k: v for k, v in attrs.items() if k not in ("value", "name")})
        ins = []
        for v in op.operands:
            shp = shape_of(v)
            if shp is None:
                raise SpecError(f"operand type {v.type} is not a statically shaped tensor")
            ins.append(shp)
        outs = []
        for r in op.results:
            shp = shape_of(r)
            if shp is None:
                raise SpecError(f"result type {r.type} is not a statically shaped tensor")
            outs.append(shp)
        expect = s.shape(ins, full, outs)
        if [tuple(e) for e in expect] != outs:
            raise SpecError(f"result shapes {[list(o) for o in outs]} differ from the spec's {[list(e) for e in expect]}")
        ets = {str(elem_type(v)) for v in list(op.operands) + list(op.results)}
        if len(ets) > 1 and s.name != "weight":
            raise SpecError(f"mixed element types {sorted(ets)}")
        bad = sorted(e for e in ets if e not in TASO_ELEMS)
        if bad:
            raise SpecError(f"element type {bad[0]} is not supported (ONNX has no such tensor type, or taso ops do "
                            f"not compute on it)")
    except SpecError as e:
        raise TasoError(f"{where}: '{op.name}' op: {e}") from None


OP_CHECKS.append(verify_taso_op)  # (the IR debug mode's per-step checks, dialect/handles.py)


def verify_module(module_op: ir.Operation) -> None:
    """MLIR's verifier, then the spec checks on every `taso` op."""
    try:
        ok = module_op.verify()
    except ir.MLIRError as e:
        raise TasoError(f"invalid IR: {_diag_line(e)}") from None
    if not ok:
        raise TasoError("invalid IR (the MLIR verifier failed)")

    taso_ops = []

    def walk(op):
        # exceptions cannot cross the walk callback: collect, then check outside
        if op.name.startswith("taso."):
            taso_ops.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(walk)
    for op in taso_ops:
        verify_taso_op(op)


def _diag_line(e: ir.MLIRError) -> str:
    diags = getattr(e, "error_diagnostics", None)
    if diags:
        d = diags[0]
        return f"{d.location}: {d.message}"
    return " ".join(str(e).split())


def find_sites(f: ir.Operation, name: str, site) -> list[tuple]:
    """``(op, *site(op))`` for every op called ``name`` in the body of function ``f`` where ``site(op)``
    is not None (a pass's sites, found before it changes anything)."""
    out = []
    for o in f.regions[0].blocks[0].operations:
        op = o.operation
        if op.name == name:
            s = site(op)
            if s is not None:
                out.append((op, *s))
    return out


def _unused(op: ir.Operation) -> bool:
    for r in op.results:
        for _ in r.uses:
            return False
    return True


def function_bodies(module_op: ir.Operation) -> list:
    """The module's ``func.func`` ops that have a body (a declaration has none)."""
    return [f.operation for f in module_op.regions[0].blocks[0].operations
            if f.operation.name == "func.func" and len(f.operation.regions[0].blocks)]


def dead_code_elimination(module_op: ir.Operation) -> int:
    """Erase taso/onnx ops none of whose results is used, in every function (last to first, so
    chains go in one sweep). Returns the number erased."""
    return sum(function_dce(f) for f in function_bodies(module_op))


def producers(op: ir.Operation) -> list:
    """The ops defining ``op``'s operands, in operand order (block arguments have none)."""
    out = []
    for v in op.operands:
        p = v.owner
        if not isinstance(p, ir.Block):
            out.append(getattr(p, "operation", p))
    return out


def dce_from(ops: list) -> int:
    """Dead-code elimination from ``ops`` (live ops, in any order, repeats allowed): erase those of them
    none of whose results is used, then the producers of their operands that this leaves unused, and
    so on; the cost is that of what it reads, not of the function. Returns the number erased."""
    # Each op is known by its pointer (its hash, taken while it is alive): the Python bindings make a new
    # object each time an op is reached, so one op can be in ``work`` twice as two objects, and once it
    # is erased through one, the other reads freed memory, its own hash included. Erasing allocates
    # nothing, so no pointer is reused meanwhile (``erase_op`` in the debug mode allocates a placeholder
    # but frees nothing until the step ends).
    work = [(hash(o), o) for o in ops]
    erased: set = set()
    while work:
        h, o = work.pop()
        if h in erased:
            continue
        if not ((o.name.startswith("taso.") or o.name.startswith("onnx.")) and len(o.results) and _unused(o)):
            continue
        work.extend((hash(p), p) for p in producers(o))
        erased.add(h)
        erase_op(o)
    return len(erased)


@ir_step
def function_dce(func_op: ir.Operation) -> int:
    """Dead-code elimination in one function body (see ``dead_code_elimination``)."""
    erased = 0
    ops = [o.operation for o in func_op.regions[0].blocks[0].operations]
    for o in reversed(ops):
        # an op without results is no value computation (onnx-mlir's onnx.Return terminates the block)
        if (o.name.startswith("taso.") or o.name.startswith("onnx.")) and len(o.results) and _unused(o):
            erase_op(o)
            erased += 1
    return erased


def dense_attr(arr: np.ndarray, ttype: ir.Type) -> ir.Attribute:
    """An inline dense attribute (MLIR stores a splat once)."""
    return ir.DenseElementsAttr.get(np.ascontiguousarray(arr), type=ttype)
