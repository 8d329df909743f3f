"""Greedy shrinking of a failing model to a small one that fails the same way.

A candidate is kept when it is still a valid model (``gen.validate``) and ``still_fails(candidate)``
(the runner's failure key is preserved). Steps, repeated until none applies or the time budget is spent:

1. keep one graph output only, then drop outputs one at a time (dead nodes go with them);
2. remove one node: its outputs' consumers read a same-typed, same-shaped input of the node (or graph
   input) instead, or the outputs become graph inputs (float) or constants (integer values such as
   shapes, computed with ``onnx.reference``); what is left dead is removed;
3. shrink a dimension: every graph-input and weight axis of size ``d`` (and every integer constant equal
   to ``d``, e.g. a reshape target) becomes ``1``, ``2`` or ``d // 2``;
4. turn a weight initializer into a graph input (fewer constants for the optimizer to fold).
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from . import gen


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def value_types(model: onnx.ModelProto) -> dict:
    """name -> (elem_type, dims tuple or None) of every value shape inference can type."""
    try:
        inf = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        inf = model
    g = inf.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        out[vi.name] = (tt.elem_type, dims)
    for t in g.initializer:
        out[t.name] = (t.data_type, tuple(t.dims))
    return out


def cleanup(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove nodes whose outputs nobody reads, then unused initializers and graph inputs."""
    g = model.graph
    while True:
        used = {o.name for o in g.output}
        for n in g.node:
            used.update(i for i in n.input if i)
        dead = [i for i, n in enumerate(g.node) if not any(o in used for o in n.output if o)]
        if not dead:
            break
        for i in reversed(dead):
            del g.node[i]
    used = {o.name for o in g.output}
    for n in g.node:
        used.update(i for i in n.input if i)
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    keep_in = [vi for vi in g.input if vi.name in used]
    del g.input[:]
    g.input.extend(keep_in)
    return model


def _rename_uses(g, old: str, new: str) -> None:
    for n in g.node:
        for k, i in enumerate(n.input):
            if i == old:
                n.input[k] = new


def _set_output(g, idx: int, name: str, types: dict) -> bool:
    et, dims = types.get(name, (0, None))
    if dims is None or any(d < 0 for d in dims):
        return False
    vi = onnx.helper.make_tensor_value_info(name, et, list(dims))
    g.output[idx].CopyFrom(vi)
    return True


def _constant_values(model: onnx.ModelProto, names: list) -> Optional[list]:
    """The values of ``names`` in ``model`` on random inputs (for values that do not depend on input
    data, such as shapes)."""
    from onnx.reference import ReferenceEvaluator

    try:
        feeds = gen.random_feeds(model, np.random.default_rng(0))
        return ReferenceEvaluator(model).run(names, feeds)
    except Exception:
        return None


def remove_node(model: onnx.ModelProto, out0: str, mode, types: dict) -> Optional[onnx.ModelProto]:
    """The model without the node whose first output is ``out0``: ``mode`` is ``("bypass", name)`` (its
    outputs' readers read ``name``) or ``("cut",)`` (its outputs become graph inputs or constants)."""
    m = _copy(model)
    g = m.graph
    idx = next((i for i, n in enumerate(g.node) if n.output and n.output[0] == out0), None)
    if idx is None:
        return None
    node = g.node[idx]
    outs = [o for o in node.output if o]
    graph_outs = [o.name for o in g.output]
    consts = []
    if mode[0] == "truncate":  # (the node's one output is a graph output: its input ``u`` becomes it)
        u = mode[1]
        if len(outs) != 1 or outs[0] not in graph_outs or u in graph_outs or u in {i.name for i in g.input}:
            return None
        if not _set_output(g, graph_outs.index(outs[0]), u, types):
            return None
    elif mode[0] == "bypass":
        if len(outs) != 1:
            return None
        v, u = outs[0], mode[1]
        _rename_uses(g, v, u)
        if v in graph_outs:
            if u in graph_outs or u in {i.name for i in g.input}:
                if len(graph_outs) == 1:
                    return None
                del g.output[graph_outs.index(v)]
            elif not _set_output(g, graph_outs.index(v), u, types):
                return None
    else:
        used = set()
        for n in g.node:
            used.update(n.input)
        for v in outs:
            if v in graph_outs:
                continue
            if v not in used:
                continue
            et, dims = types.get(v, (0, None))
            if dims is None or any(d < 0 for d in dims):
                return None
            if et == TensorProto.FLOAT:
                g.input.append(onnx.helper.make_tensor_value_info(v, et, list(dims)))
            else:
                consts.append(v)
        for v in [v for v in outs if v in graph_outs]:
            if len(g.output) == 1:
                return None
            del g.output[[o.name for o in g.output].index(v)]
        if consts:
            vals = _constant_values(model, consts)
            if vals is None:
                return None
            for v, a in zip(consts, vals):
                g.initializer.append(numpy_helper.from_array(np.asarray(a), v))
    del g.node[idx]
    return cleanup(m)


def _retype_outputs(m: onnx.ModelProto) -> Optional[onnx.ModelProto]:
    """Declare the graph outputs with the shapes inference gives them now."""
    g = m.graph
    for o in g.output:
        o.type.tensor_type.ClearField("shape")
    del g.value_info[:]
    try:
        inf = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception:
        return None
    known = {vi.name: vi for vi in list(inf.graph.value_info) + list(inf.graph.output) + list(inf.graph.input)}
    for i, o in enumerate(g.output):
        vi = known.get(o.name)
        if vi is None or not vi.type.tensor_type.HasField("shape") or \
                not all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim):
            return None
        g.output[i].type.CopyFrom(vi.type)
    return m


def resize_dim(model: onnx.ModelProto, d: int, d2: int) -> Optional[onnx.ModelProto]:
    """Every axis of size ``d`` of the graph inputs and float weights becomes ``d2`` (weights keep
    their first ``d2`` entries), and every entry ``d`` of a small integer constant too."""
    m = _copy(model)
    g = m.graph
    for vi in g.input:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_value == d:
                dim.dim_value = d2

    def shrink_tensor(t):
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f" and d in a.shape:
            a = a[tuple(slice(0, d2) if s == d else slice(None) for s in a.shape)]
            return numpy_helper.from_array(np.ascontiguousarray(a), t.name)
        if a.dtype == np.int64 and a.ndim <= 1 and a.size <= 8 and np.any(a == d):
            return numpy_helper.from_array(np.where(a == d, d2, a).astype(np.int64), t.name)
        return None

    for i, t in enumerate(g.initializer):
        new = shrink_tensor(t)
        if new is not None:
            g.initializer[i].CopyFrom(new)
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                new = shrink_tensor(a.t)
                if new is not None:
                    a.t.CopyFrom(new)
            elif a.name == "kernel_shape":
                a.ints[:] = [d2 if k == d else k for k in a.ints]
    return _retype_outputs(m)


def _dims(model: onnx.ModelProto) -> list:
    """Axis sizes over 1 of graph inputs and float weights, largest first."""
    seen = set()
    for vi in model.graph.input:
        seen.update(dd.dim_value for dd in vi.type.tensor_type.shape.dim)
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            seen.update(t.dims)
    return sorted((x for x in seen if x > 1), reverse=True)


class Shrinker:
    def __init__(self, still_fails: Callable[[onnx.ModelProto], bool], budget_s: float = 300.0,
                 log: Optional[Callable[[str], None]] = None):
        self.still_fails = still_fails
        self.budget_s = budget_s
        self.log = log or (lambda s: None)
        self.tries = 0
        self.accepted = 0
        self.t0 = 0.0
        self.rejected: set = set()

    def out_of_time(self) -> bool:
        return time.monotonic() - self.t0 > self.budget_s

    def accept(self, cand: Optional[onnx.ModelProto]) -> bool:
        if cand is None or self.out_of_time():
            return False
        h = hashlib.sha1(cand.SerializeToString()).digest()
        if h in self.rejected:
            return False
        self.rejected.add(h)  # (an accepted one is the new best: it is not proposed again either)
        self.tries += 1
        try:
            gen.validate(cand)
        except gen.GeneratorFault:
            return False
        if self.still_fails(cand):
            self.accepted += 1
            return True
        return False

    def shrink(self, model: onnx.ModelProto) -> onnx.ModelProto:
        self.t0 = time.monotonic()
        best = cleanup(_copy(model))
        changed = True
        while changed and not self.out_of_time():
            changed = False
            best, c = self._outputs(best)
            changed |= c
            best, c = self._nodes(best)
            changed |= c
            best, c = self._dims(best)
            changed |= c
            best, c = self._weights_to_inputs(best)
            changed |= c
        self.log(f"shrunk to {len(best.graph.node)} nodes in {self.tries} tries, "
                 f"{time.monotonic() - self.t0:.1f} s")
        return best

    def _outputs(self, best):
        changed = False
        if len(best.graph.output) > 1:
            for i in range(len(best.graph.output)):
                m = _copy(best)
                keep = m.graph.output[i]
                del m.graph.output[:]
                m.graph.output.append(keep)
                m = cleanup(m)
                if self.accept(m):
                    return m, True
        i = 0
        while len(best.graph.output) > 1 and i < len(best.graph.output):
            m = _copy(best)
            del m.graph.output[i]
            m = cleanup(m)
            if self.accept(m):
                best, changed = m, True
            else:
                i += 1
        return best, changed

    def _nodes(self, best):
        changed = False
        progress = True
        while progress and not self.out_of_time():
            progress = False
            types = value_types(best)  # (shapes are static: removing a node changes no other value's type)
            for out0 in [n.output[0] for n in reversed(best.graph.node) if n.output]:
                node = next((n for n in best.graph.node if n.output and n.output[0] == out0), None)
                if node is None:  # removed with an earlier one
                    continue
                modes = []
                outs = [o for o in node.output if o]
                if len(outs) == 1:
                    t = types.get(outs[0])
                    same = [i for i in node.input if i and types.get(i) == t]
                    same += [vi.name for vi in best.graph.input if types.get(vi.name) == t]
                    modes += [("bypass", u) for u in dict.fromkeys(same)]
                    if outs[0] in {o.name for o in best.graph.output}:
                        modes += [("truncate", u) for u in dict.fromkeys(node.input)
                                  if u and types.get(u, (0,))[0] == TensorProto.FLOAT and u not in same]
                modes.append(("cut",))
                for mode in modes:
                    cand = remove_node(best, out0, mode, types)
                    if self.accept(cand):
                        best, changed, progress = cand, True, True
                        types.update(value_types(best))
                        break
        return best, changed

    def _dims(self, best):
        changed = False
        for d in _dims(best):
            for d2 in sorted({1, 2, d // 2}):
                if d2 >= d or d2 < 1:
                    continue
                cand = resize_dim(best, d, d2)
                if self.accept(cand):
                    best, changed = cand, True
                    break
        return best, changed

    def _weights_to_inputs(self, best):
        changed = False
        for t in list(best.graph.initializer):
            if t.data_type != TensorProto.FLOAT or len(t.dims) == 0:
                continue
            m = _copy(best)
            g = m.graph
            idx = [x.name for x in g.initializer].index(t.name)
            del g.initializer[idx]
            if t.name not in {vi.name for vi in g.input}:
                g.input.append(onnx.helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)))
            if self.accept(m):
                best, changed = m, True
        return best, changed


def shrink(model: onnx.ModelProto, still_fails: Callable[[onnx.ModelProto], bool], budget_s: float = 300.0,
           log: Optional[Callable[[str], None]] = None) -> onnx.ModelProto:
    """The smallest model the greedy steps reach that is valid and ``still_fails``."""
    return Shrinker(still_fails, budget_s, log).shrink(model)
