"""The `taso` dialect in IRDL, generated from the operator specs and loaded at runtime.

``taso_irdl_text()`` is also what ``taso-opt --emit-irdl`` prints, so upstream ``mlir-opt
--irdl-file=...`` can parse our IR. The verifier checks operand/result counts, that they are builtin
tensors, and attribute presence and kinds; shapes are checked by ``verify.verify_taso_ops`` from the
specs (IRDL cannot express them).
"""

from __future__ import annotations

import sys

from .mlir import ir, irdl
from .specs import MAX_ARITY, SPECS

_TENSOR = 'irdl.base "!builtin.tensor"'

_KIND = {
    "int": '"#builtin.integer"',
    "ints": '"#builtin.dense_array"',
    "float": '"#builtin.float"',
    "str": '"#builtin.string"',
}


def taso_irdl_text() -> str:
    lines = ["irdl.dialect @taso {"]
    for s in SPECS.values():
        body: list[str] = []
        n = 0

        def var(expr: str) -> str:
            nonlocal n
            name = f"%v{n}"
            n += 1
            body.append(f"    {name} = {expr}")
            return name

        # One constraint variable per operand/result: IRDL binds a variable to one type.
        operands = []
        if s.variadic_operands:
            for i in range(MAX_ARITY):
                opt = "optional " if i >= 2 else ""
                operands.append(f"in{i}: {opt}{var(_TENSOR)}")
        for name in s.operands:
            operands.append(f"{name}: {var(_TENSOR)}")
        for name in s.optional_operands:
            operands.append(f"{name}: optional {var(_TENSOR)}")
        results = []
        if s.variadic_results:
            for i in range(MAX_ARITY):
                opt = "optional " if i >= 2 else ""
                results.append(f"out{i}: {opt}{var(_TENSOR)}")
        else:
            results.append(f"result: {var(_TENSOR)}")
        attrs = []
        for a in s.attrs:
            if a.choices and a.kind == "str":
                alts = [var(f'irdl.is "{c}"') for c in a.choices]
                attrs.append(f'"{a.name}" = {var("irdl.any_of(" + ", ".join(alts) + ")")}')
            else:
                attrs.append(f'"{a.name}" = {var("irdl.base " + _KIND[a.kind])}')
        if s.value_attr:
            attrs.append(f'"value" = {var("irdl.any")}')
            attrs.append(f'"name" = {var("irdl.base " + _KIND["str"])}')
        lines.append(f"  irdl.operation @{s.name} {{")
        lines.extend(body)
        if attrs:
            lines.append("    irdl.attributes {" + ", ".join(attrs) + "}")
        lines.append("    irdl.operands(" + ", ".join(operands) + ")")
        lines.append("    irdl.results(" + ", ".join(results) + ")")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def load_taso_dialect(ctx: ir.Context) -> None:
    """Parse the generated IRDL and register the `taso` dialect in ``ctx``. The loaded dialect refers
    to the IRDL module, so the module is kept (in ``_KEEP``) as long as anything else holds the
    context; ``release_unused_contexts`` lets both go after that."""
    release_unused_contexts()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(taso_irdl_text())
        irdl.load_dialects(m)
    _KEEP.setdefault(id(ctx), []).append((ctx, m))


def release_unused_contexts() -> int:
    """Drop the IRDL modules of contexts that nothing but ``_KEEP`` holds any more: the module and then
    the context are destroyed, with every weight the context stores (dense attributes live as long as
    their context). Every Python handle into a context (its modules, operations, values, types,
    attributes, an active ``with ctx:``) holds a reference to it, so a context is unused when its
    reference count is what ``_KEEP`` accounts for: one per kept (context, module) pair, one per kept
    module's own handle, plus this function's variable and the count's argument. Returns how many
    contexts were released."""
    released = 0
    for key, kept in list(_KEEP.items()):
        c = kept[0][0]
        if sys.getrefcount(c) <= 2 * len(kept) + 2:
            del c
            del _KEEP[key]  # (the tuples go, then each module, then the context)
            released += 1
    return released


_KEEP: dict[int, list] = {}
