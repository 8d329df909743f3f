"""Small IR helpers the passes share (public: no pass imports another pass's private names).

``static_shape``, ``defining_op``, ``use_owner`` and ``tensor_like`` read and build values' types and
their producers and users; ``op_sig`` is the cost model's signature of an op described by its kind,
attributes, operand and result shapes (``cost.OpSig``), for passes that price a plan before building it.
"""

from __future__ import annotations

from taso_mlir.dialect import specs
from taso_mlir.dialect.mlir import ir


def static_shape(v: ir.Value):
    """``v``'s shape as a list, or None where it is not static."""
    t = ir.RankedTensorType(v.type)
    return list(t.shape) if t.has_static_shape else None


def defining_op(v: ir.Value):
    """The op that defines ``v`` (None for a block argument)."""
    o = v.owner
    return o.operation if isinstance(o, ir.OpView) else (o if isinstance(o, ir.Operation) else None)


def use_owner(use) -> ir.Operation:
    """The op of a use of a value."""
    o = use.owner
    return o.operation if isinstance(o, ir.OpView) else o


def tensor_like(shape, like: ir.Value) -> ir.Type:
    """A ranked tensor type of ``shape`` with ``like``'s element type."""
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(like.type).element_type)


def op_sig(kind: str, attrs: dict, ins: list, outs: list, dtype: str, weights: tuple):
    """The cost model's signature of a ``taso.<kind>`` op (attributes completed from its spec)."""
    from taso_mlir.passes.cost.oracle import OpSig
    from taso_mlir.passes.search.tgraph import attrs_tuple

    return OpSig(kind, attrs_tuple(specs.spec(kind).complete_attrs(attrs)), tuple(tuple(s) for s in ins),
                 tuple(tuple(s) for s in outs), dtype, False, weights)
