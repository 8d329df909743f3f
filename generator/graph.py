"""Rule graphs: the small operator graphs on both sides of a substitution.

A graph is a tuple of ops in topological order plus its outputs. Operands and outputs are
*references*: an input variable name (``x1``, ``c2``, ``s1``) or an op result, ``%k`` (op k's only
result) or ``%k#j`` (result j of a split). Attributes are concrete except two shape-derived kinds,
which a rule states symbolically so that it applies at any shape:

- a split's ``sizes`` is a tuple of *dims*, and a constant op's ``shape`` is a tuple of *dims*;
- a *dim* is an ``int`` (a fixed size, e.g. a kernel dimension) or a pair ``(ref, axis)``: that
  axis of that tensor in the same graph;
- a conv2d with a group other than 1 has ``group = "grouped"``: C_in(input) / C_in(weight), which
  must not be 1 (depthwise convolutions are the common case), so a rule holds for any channel count;
- window ops (conv2d, maxpool2d, avgpool2d) have ``pads = "same"``: (k-1)/2 on each side for the
  op's odd kernel k, as in TASO's SAME padding, so a rule holds for any odd kernel size;
- window ops may have ``strides = "s"``: one stride shared by every such op of the rule (both sides),
  given where the rule is applied as ``STRIDE_VAR`` in the shapes mapping (``taso-verify`` states a
  rule so when it also proves with a symbolic stride; see ``verifier.prove.generalize_strides``).

The graph's meaning is the operator specs' reference semantics (``dialect.specs.evaluate``); the
only deviation is the fingerprinting mode of the generator, which evaluates in uint32 with TASO's
non-linear ReLU surrogate (see ``evaluate(..., relu_surrogate=True)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..dialect import specs

Ref = str

#: the key of a rule's symbolic stride (``strides = "s"``) in a shapes mapping
STRIDE_VAR = "@strides"


@dataclass(frozen=True)
class Op:
    name: str  # taso op name without the prefix
    attrs: tuple  # sorted (key, value) pairs; list values are tuples
    operands: tuple[Ref, ...]
    num_results: int = 1

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Graph:
    ops: tuple[Op, ...]
    outputs: tuple[Ref, ...]

    def inputs(self) -> list[str]:
        """Input variables in order of first use (operands, then dims referring to them)."""
        seen: dict[str, None] = {}
        for op in self.ops:
            for r in op.operands:
                if not r.startswith("%"):
                    seen.setdefault(r)
            for d in _dims_of(op):
                if isinstance(d, tuple) and not d[0].startswith("%"):
                    seen.setdefault(d[0])
        for r in self.outputs:
            if not r.startswith("%"):
                seen.setdefault(r)
        return list(seen)

    def text(self) -> str:
        """A one-line human-readable form: ``%0 = matmul(x1, w1); %1 = ...; -> %1``."""
        parts = []
        for i, op in enumerate(self.ops):
            attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in op.attrs)
            lhs = f"%{i}" if op.num_results == 1 else ", ".join(f"%{i}#{j}" for j in range(op.num_results))
            parts.append(f"{lhs} = {op.name}({', '.join(op.operands)}){' {' + attrs + '}' if attrs else ''}")
        return "; ".join(parts) + " -> " + ", ".join(self.outputs)

    # ---- JSON (the rules file) ----
    def to_json(self) -> dict:
        return {"ops": [[op.name, {k: _attr_json(v) for k, v in op.attrs}, list(op.operands), op.num_results]
                        for op in self.ops],
                "outputs": list(self.outputs)}

    @staticmethod
    def from_json(d: Mapping) -> "Graph":
        ops = []
        for name, attrs, operands, nres in d["ops"]:
            ops.append(Op(name, tuple(sorted((k, _attr_from_json(k, v)) for k, v in attrs.items())),
                          tuple(operands), int(nres)))
        return Graph(tuple(ops), tuple(d["outputs"]))


def _dims_of(op: Op):
    if op.name == "split":
        return op.attr("sizes")
    if op.name in specs.CONSTANTS:
        return op.attr("shape")
    return ()


def _attr_text(v) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(f"{d[0]}.{d[1]}" if isinstance(d, tuple) else str(d) for d in v) + "]"
    return json.dumps(v)


def _attr_json(v):
    if isinstance(v, tuple):
        return [list(d) if isinstance(d, tuple) else d for d in v]
    return v


def _attr_from_json(key: str, v):
    if isinstance(v, list):
        return tuple(tuple(d) if isinstance(d, list) else d for d in v)
    return v


def parse_ref(ref: Ref) -> tuple[int, int] | None:
    """``%k`` -> (k, 0), ``%k#j`` -> (k, j), an input variable -> None."""
    if not ref.startswith("%"):
        return None
    k, _, j = ref[1:].partition("#")
    return int(k), int(j or 0)


def op_ref(k: int, j: int, num_results: int) -> Ref:
    return f"%{k}" if num_results == 1 else f"%{k}#{j}"


def _resolve_dim(d, shapes: Mapping[Ref, tuple]) -> int:
    if isinstance(d, tuple):
        shape = shapes[d[0]]
        if not -len(shape) <= d[1] < len(shape):  # (a rank-polymorphic match of a smaller rank)
            raise specs.SpecError(f"dimension {d[1]} of {d[0]}, which has rank {len(shape)}")
        return int(shape[d[1]])
    return int(d)


def has_symbolic_stride(*graphs: Graph) -> bool:
    """Some window op of the graphs is stated with the rule's symbolic stride (``strides = "s"``)."""
    return any(op.attr("strides") == "s" for g in graphs for op in g.ops)


def spec_attrs(op: Op, shapes: Mapping[Ref, tuple]) -> tuple[dict, list | None]:
    """The op's attributes for ``dialect.specs`` (symbolic dims resolved) and a result-shape hint."""
    a = dict(op.attrs)
    resolved, hint = _resolve(op, a, shapes)
    return _resolved(a, resolved, hint), hint


def _resolved(a: dict, resolved: dict, hint) -> dict:
    """``a`` (changed) with what ``_resolve`` resolved: the symbolic values replaced, a constant's shape
    (given as the hint) removed."""
    a.update(resolved)
    if hint is not None:
        del a["shape"]
    return a


def _resolve(op: Op, a: dict, shapes: Mapping[Ref, tuple]) -> tuple[dict, list | None]:
    """What ``spec_attrs`` resolves from the shapes: the symbolic attributes' values (``a``: the op's
    attributes as a dict), and a constant's result-shape hint."""
    out: dict = {}
    hint = None
    if a.get("pads") == "same":  # symmetric (k-1)/2 padding for the op's odd kernel
        k = shapes[op.operands[1]][2:] if op.name == "conv2d" else a["kernel_shape"]
        if len(k) != 2 or k[0] % 2 == 0 or k[1] % 2 == 0:
            raise specs.SpecError(f"{op.name}: 'same' padding needs an odd kernel, got {list(k)}")
        out["pads"] = (k[0] // 2, k[1] // 2, k[0] // 2, k[1] // 2)
    if a.get("group") == "grouped":  # group = C_in(input) / C_in(weight), and not 1
        x, w = shapes[op.operands[0]], shapes[op.operands[1]]
        if len(x) != 4 or len(w) != 4 or w[1] == 0 or x[1] % w[1] or x[1] == w[1]:
            raise specs.SpecError(f"conv2d: a grouped rule conv needs input channels a multiple > 1 of the "
                                  f"weight's, got {list(x)} and {list(w)}")
        out["group"] = x[1] // w[1]
    if a.get("strides") == "s":
        if STRIDE_VAR not in shapes:
            raise specs.SpecError(f"{op.name}: the rule's symbolic stride is not bound")
        out["strides"] = tuple(shapes[STRIDE_VAR])
    if op.name == "split":
        out["sizes"] = tuple(_resolve_dim(d, shapes) for d in a["sizes"])
    elif op.name in specs.CONSTANTS:
        hint = [tuple(_resolve_dim(d, shapes) for d in a["shape"])]
    return out, hint


def rule_attrs(op: Op, shapes: Mapping[Ref, tuple]) -> dict:
    """The op's complete attributes at these shapes (``spec_attrs`` completed by its spec, list values
    as tuples), as a site check compares them with a matched op's and gives them to a target op. Memoized
    per op (by identity: a rule's ops live as long as the rulebook) and the values resolved from the
    shapes (the rule's own attributes are the same at every site, and completing them took a fifth of a
    site check). The dict is shared: read it, do not change it. Raises ``specs.SpecError`` as
    ``spec_attrs`` and ``complete_attrs`` do."""
    base = _OP_ATTRS.get(id(op))
    if base is None or base[0] is not op:
        if len(_OP_ATTRS) >= 100_000:
            _OP_ATTRS.clear()
        base = _OP_ATTRS[id(op)] = (op, dict(op.attrs))
    a = base[1]
    resolved, hint = _resolve(op, a, shapes)
    try:
        key = (id(op), tuple(resolved.items()), None if hint is None else tuple(hint))
        hit = _RULE_ATTRS.get(key)
    except TypeError:  # (an unhashable value)
        key = hit = None
    if hit is not None and hit[0] is op:
        return hit[1]
    full = specs.spec(op.name).complete_attrs(_resolved(dict(a), resolved, hint))
    full = {n: tuple(x) if isinstance(x, (list, tuple)) else x for n, x in full.items()}
    if key is not None:
        if len(_RULE_ATTRS) >= 100_000:
            _RULE_ATTRS.clear()
        _RULE_ATTRS[key] = (op, full)
    return full


_OP_ATTRS: dict = {}  # id(op) -> (op, its attributes as a dict)
#: (id(op), the values resolved from the shapes, the hint) -> (op, its complete attributes): ``rule_attrs``
_RULE_ATTRS: dict = {}


def infer(graph: Graph, input_shapes: Mapping[str, tuple], ints: bool | None = None) -> dict[Ref, tuple]:
    """Shapes of every tensor; raises ``specs.SpecError`` where the graph does not type-check.
    ``ints``: given by a caller whose shapes are tuples already (a site check, which types both sides
    at one site's shapes): whether every dimension is an int (checked here where not given).

    Elementwise ops must have equal operand shapes here (TASO's same-shape operators): broadcasting
    is a precondition no rule assumes."""
    # (an op's result shapes are a function of its kind, attributes, operand shapes and the symbolic
    # stride, except a split's or a constant's, whose sizes may name other variables' dimensions:
    # memoized where every dimension is an int, so that the shapes' types are the ones given. The
    # dimensions are checked once, the inputs' here and each op's results where it is inferred: the
    # memo's hold ints)
    if ints is None:
        shapes: dict[Ref, tuple] = {k: tuple(v) for k, v in input_shapes.items()}
        ints = all(type(d) is int for s in shapes.values() for d in s)
    else:
        shapes = dict(input_shapes)
    stride = shapes.get(STRIDE_VAR)
    for op, typed, results in _infer_plan(graph):
        ins = tuple([shapes[r] for r in op.operands])
        key = None
        if ints and typed is not None:
            key = (op.name, typed, ins, stride)
            outs = _INFERRED.get(key)
            if outs is not None:
                for r, s in zip(results, outs):
                    shapes[r] = s
                continue
        a, hint = spec_attrs(op, shapes)
        if op.name in ("ewadd", "ewmul") and ins[0] != ins[1]:
            raise specs.SpecError(f"{op.name}: operand shapes {list(ins[0])} and {list(ins[1])} differ")
        outs = [tuple(s) for s in specs.infer_shapes(op.name, ins, a, hint)]
        if key is not None:
            if len(_INFERRED) >= 100_000:
                _INFERRED.clear()
            _INFERRED[key] = outs
        if ints:
            ints = all(type(d) is int for s in outs for d in s)
        for r, s in zip(results, outs):
            shapes[r] = s
    return shapes


#: (kind, the rule's attributes, operand shapes, symbolic stride) -> result shapes (``infer``: a rewrite's
#: site check types its source and target at each site's shapes, and the same ops at the same shapes
#: recur across rules and sites)
_INFERRED: dict = {}
_PLAN: dict = {}  # id(graph) -> (graph, per op: (op, its attributes with their values' types or None, result refs))


def _infer_plan(graph: Graph) -> list:
    """Per op of ``graph``: the op, its attributes typed as the memo's key has them (``True`` is not ``1``;
    None: not memoized: a split, a constant, an attribute that cannot be a key), its results' refs."""
    hit = _PLAN.get(id(graph))
    if hit is None or hit[0] is not graph:
        plan = []
        for k, op in enumerate(graph.ops):
            typed = None
            if op.name != "split" and op.name not in specs.CONSTANTS:
                try:
                    typed = specs._typed(op.attrs)
                    hash(typed)
                except TypeError:  # (an unhashable attribute, or a NaN)
                    typed = None
            plan.append((op, typed, [op_ref(k, j, op.num_results) for j in range(op.num_results)]))
        if len(_PLAN) >= 100_000:
            _PLAN.clear()
        hit = _PLAN[id(graph)] = (graph, plan)
    return hit[1]


def evaluate(graph: Graph, inputs: Mapping[str, np.ndarray], relu_surrogate: bool = False,
             strides=None) -> list[np.ndarray]:
    """Run the graph on ``inputs`` with the reference semantics; returns the outputs (``strides``: the
    value of a symbolic stride).

    ``relu_surrogate``: integer fingerprinting mode: relu (and fused relu activations) become
    x*(x+1)+1, which is not piecewise linear, so rules that only hold because relu is piecewise
    linear on the random inputs cannot slip through (TASO's trick).
    """
    vals: dict[Ref, np.ndarray] = dict(inputs)
    shapes = {k: v.shape for k, v in vals.items()}
    if strides is not None:
        shapes[STRIDE_VAR] = tuple(strides)
    dtype = next(iter(vals.values())).dtype if vals else np.dtype(np.float64)
    for k, op in enumerate(graph.ops):
        a, hint = spec_attrs(op, shapes)
        if op.name in specs.CONSTANTS:
            outs = [specs.constant(op.name, hint[0], dtype)]
        else:
            ins = [vals[r] for r in op.operands]
            if op.name in ("ewadd", "ewmul") and ins[0].shape != ins[1].shape:
                raise specs.SpecError(f"{op.name}: operand shapes differ")
            surrogate = relu_surrogate and (op.name == "relu" or a.get("activation") == "relu")
            if surrogate:
                if op.name == "relu":
                    outs = [ins[0]]
                else:
                    a["activation"] = "none"
                    outs = specs.evaluate(op.name, ins, a, hint)
                outs = [o * (o + o.dtype.type(1)) + o.dtype.type(1) for o in outs]
            else:
                outs = specs.evaluate(op.name, ins, a, hint)
        for j, o in enumerate(outs):
            r = op_ref(k, j, op.num_results)
            vals[r] = o
            shapes[r] = o.shape
    return [vals[r] for r in graph.outputs]
