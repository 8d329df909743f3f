#!/usr/bin/env python3
"""A whole-graph executor for the exported ONNX graphs on the GPU, on calibrate.py's kernel layer (issue 25).

Runs on the GPU machine with its preinstalled packages: numpy, onnx and onnxruntime (the CPU reference) here,
and in the ``cuda`` backend torch (cuDNN convolutions, cuBLAS GEMMs), cuda-python (``cuda.core``: stream,
events, NVRTC) and CuPy (NVRTC where cuda.core fails), all through ``calibrate.CudaDevice``. It does not
import taso_mlir.

A model is planned once (``plan_graph``): the ONNX graph's shapes inferred, initializers and every node whose
inputs are all constants folded on the host (as any runtime does at load), each remaining node mapped to a
``calibrate.Plan`` (the op kinds the calibration measures: conv2d, matmul, binary, unary, batchnorm, transpose,
concat, split, pool, softmax, layernorm, ...), a Conv or a biased Gemm followed by its only user Relu fused into
one kernel (cuDNN's conv+bias+ReLU, cuBLASLt's bias+ReLU epilogue: TASO's conv and matmul carry their
activation), values numbered into slots. Every op outside the table is a one-line ``Unsupported`` error naming
it. The plan is backend-neutral; two backends run it:

- ``cuda``: every output buffer allocated once on the device; one kernel closure per step from
  ``CudaDevice.build_kernel`` (NVRTC kernels write into the buffers; cuDNN/pooling/softmax/layer norm results
  come from torch's caching allocator, the same blocks run after run); the whole model captured as one CUDA
  graph where capture works (else eager, with the reason recorded); runs timed by ``CudaDevice.time``
  (device events around each run, behind a spin kernel).
- ``dry``: the same steps run by calibrate.py's numpy references on the CPU, timed by the wall clock: the
  rehearsal of the plan, the slots, the dispatch and the output check. Its times are not GPU timings.

Both check their outputs against onnxruntime (CPU) on the same inputs before any timing counts
(``check``). Weights: the files prepared on the CPU (``prepare.py``) carry no large weights; each stripped
initializer records its shape and statistics, and ``fill_weights`` draws values with them from a seed, so the
original and the optimized files hold different (but equally scaled) weights: the check compares each file with
itself in onnxruntime, never the two files with each other (that was checked on the CPU with the real weights).

    python3 benchmarks/gpu/execute.py MODEL.onnx [--dry-run] [--repeats 20]    # check and time one model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import calibrate as C  # noqa: E402  (the kernel layer: plans, numpy references, CudaDevice)

#: the key of a stripped initializer's description in its ``doc_string`` (written by prepare.py)
WEIGHTS_KEY = "taso-gpu-weights"
#: relative error (norm of the difference over the norm of the reference) allowed against onnxruntime
TOLERANCE = 1e-3

Unsupported = C.Unsupported


class ExecError(Exception):
    """A model that cannot be run (a one-line reason)."""


# ---------------------------------------------------------------------------------------------------------
# weights and inputs


def _seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) & 0xFFFFFFFF


def fill_weights(model, seed: int = 0) -> int:
    """Give every stripped initializer of ``model`` (in place) values drawn from its recorded statistics:
    uniform with the recorded mean and standard deviation, clipped to the recorded range (a constant where the
    deviation is 0). Returns how many were filled."""
    from onnx import numpy_helper

    n = 0
    for i, t in enumerate(model.graph.initializer):
        if not t.doc_string.startswith(WEIGHTS_KEY):
            continue
        st = json.loads(t.doc_string[len(WEIGHTS_KEY) + 1:])
        shape = tuple(int(d) for d in t.dims)
        rng = np.random.default_rng(_seed(seed, t.name))
        if st["std"] == 0:
            a = np.full(shape, st["mean"], np.float32)
        else:
            a = st["mean"] + st["std"] * math.sqrt(3.0) * rng.uniform(-1.0, 1.0, size=shape)
            a = np.clip(a, st["min"], st["max"]).astype(np.float32)
        new = numpy_helper.from_array(a, t.name)
        model.graph.initializer[i].CopyFrom(new)
        n += 1
    return n


def random_feeds(model, seed: int = 0) -> dict:
    """Inputs for the graph: floats standard normal; an integer input that Gather indexes an initializer with
    takes values in [0, rows); other integer inputs (masks) are 0/1 with the first position set."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    rows = {}
    for nd in model.graph.node:
        if nd.op_type == "Gather" and len(nd.input) > 1 and nd.input[0] in inits:
            rows[nd.input[1]] = int(inits[nd.input[0]].dims[0])
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value"):
                raise ExecError(f"input '{vi.name}' has a symbolic dimension (only static shapes are run)")
            shape.append(d.dim_value)
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        elif vi.name in rows:
            feeds[vi.name] = rng.integers(0, rows[vi.name], size=shape).astype(dt)
        else:
            m = (rng.uniform(size=shape) < 0.8).astype(dt)
            m.reshape(-1)[:1] = 1
            feeds[vi.name] = m
    return feeds


def load_model(path: str, seed: int = 0):
    """The ONNX model at ``path`` with its stripped weights filled (``fill_weights``)."""
    import onnx

    try:
        m = onnx.load(path)
    except Exception as e:
        raise ExecError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    fill_weights(m, seed)
    return m


def ort_outputs(model, feeds: dict) -> dict:
    """The reference: onnxruntime's CPU provider, graph optimizations at the basic level."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


# ---------------------------------------------------------------------------------------------------------
# the plan


class Step:
    """One kernel: a ``calibrate.Plan`` over slots ``ins`` -> ``outs``; ``nodes``: the ONNX nodes it runs."""

    __slots__ = ("nodes", "op_type", "plan", "ins", "outs", "out_shapes")

    def __init__(self, nodes, op_type, plan, ins, outs, out_shapes):
        self.nodes, self.op_type, self.plan, self.ins, self.outs = nodes, op_type, plan, ins, outs
        self.out_shapes = out_shapes

    def __repr__(self):
        return f"Step({self.op_type}: {self.plan.op} {self.ins}->{self.outs})"


class GraphPlan:
    """A model's plan: ``slots`` (value name -> slot), per slot its shape and dtype, ``consts`` (slot -> numpy
    array: initializers and folded values), ``inputs``/``outputs`` (graph value names), ``steps``."""

    def __init__(self):
        self.slots: dict = {}
        self.shapes: list = []
        self.dtypes: list = []
        self.consts: dict = {}
        self.inputs: list = []
        self.outputs: list = []
        self.steps: list = []
        self.folded = 0
        self.fused = 0
        self.ops: dict = {}  # ONNX op type -> count among the nodes run (not folded)

    def slot(self, name: str, shape, dtype) -> int:
        if name not in self.slots:
            self.slots[name] = len(self.shapes)
            self.shapes.append(tuple(int(d) for d in shape))
            self.dtypes.append(np.dtype(dtype))
        return self.slots[name]

    def summary(self) -> dict:
        kinds: dict = {}
        for s in self.steps:
            kinds[s.plan.op] = kinds.get(s.plan.op, 0) + 1
        return {"steps": len(self.steps), "kernels_by_plan": dict(sorted(kinds.items())),
                "onnx_ops": dict(sorted(self.ops.items())), "folded_nodes": self.folded, "fused_activations": self.fused,
                "values": len(self.shapes), "constants": len(self.consts)}


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(v) -> tuple:
    return tuple(int(x) for x in v)


#: ONNX ops that are views: no kernel, the output is the input reshaped
VIEW_OPS = {"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}
UNARY_OPS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt", "Exp": "exp",
             "Neg": "neg"}
BINARY_OPS = {"Add": "add", "Mul": "mul", "Sub": "sub", "Div": "div"}
#: every ONNX op type the planner maps (Constant and Gemm are resolved while planning)
PLANNED_OPS = sorted(VIEW_OPS | set(UNARY_OPS) | set(BINARY_OPS) | {
    "Constant", "Conv", "MatMul", "Gemm", "BatchNormalization", "Transpose", "Concat", "Split", "MaxPool",
    "AveragePool", "GlobalAveragePool", "Softmax", "LayerNormalization", "Gather", "Cast", "Clip", "Equal", "Where",
    "Expand", "ReduceMean"})


def _const_input(node, consts: list, pos: int):
    """The constant value of ``node``'s input ``pos`` (``consts``: one per non-empty input, None where it is
    not constant); None where that input is absent or not constant."""
    k = 0
    for i, x in enumerate(node.input):
        if not x:
            continue
        if i == pos:
            return consts[k] if k < len(consts) else None
        k += 1
    return None


def _given(node, pos: int) -> bool:
    return len(node.input) > pos and bool(node.input[pos])


def node_plan(node, in_shapes: list, out_shapes: list, consts: list) -> C.Plan:
    """The plan of one ONNX node (``consts``: each input's constant value, or None); ``Unsupported`` if none.
    Gemm and MatMul with their operands as given (``plan_graph`` rewrites Gemm's constants first)."""
    op, a = node.op_type, _attrs(node)
    rank = len(in_shapes[0]) if in_shapes else 0
    if op in VIEW_OPS:
        return C.Plan("view", shape=tuple(out_shapes[0]))
    if op in UNARY_OPS:
        return C.Plan("unary", fn=UNARY_OPS[op])
    if op in BINARY_OPS:
        return C.Plan("binary", fn=BINARY_OPS[op])
    if op == "Conv":
        if rank != 4:
            raise Unsupported(f"Conv of rank {rank} (only 2-D convolutions)")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise Unsupported("Conv with auto_pad")
        return C.Plan("conv2d", strides=_ints(a.get("strides", (1, 1))), pads=_ints(a.get("pads", (0, 0, 0, 0))),
                      dilations=_ints(a.get("dilations", (1, 1))), group=int(a.get("group", 1)), act="none",
                      bias=len(node.input) > 2 and bool(node.input[2]))
    if op == "MatMul":
        if len(in_shapes[1]) < 2 or len(in_shapes[0]) < 2:
            raise Unsupported("MatMul of a vector")
        return C.Plan("matmul", act="none", bias=False)
    if op == "Gemm":  # with B as (K, N) and alpha, beta folded (plan_graph)
        return C.Plan("matmul", act="none", bias=len(node.input) > 2 and bool(node.input[2]))
    if op == "BatchNormalization":
        if a.get("training_mode", 0):
            raise Unsupported("BatchNormalization in training mode")
        return C.Plan("batchnorm", eps=float(a.get("epsilon", 1e-5)))
    if op == "Transpose":
        perm = _ints(a["perm"]) if "perm" in a else tuple(range(rank))[::-1]
        return C.Plan("transpose", perm=perm)
    if op == "Concat":
        return C.Plan("concat", axis=int(a["axis"]) % len(out_shapes[0]))
    if op == "Split":
        ax = int(a.get("axis", 0)) % rank
        return C.Plan("split", axis=ax, sizes=tuple(s[ax] for s in out_shapes))
    if op in ("MaxPool", "AveragePool"):
        if rank != 4:
            raise Unsupported(f"{op} of rank {rank}")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise Unsupported(f"{op} with auto_pad")
        if any(d != 1 for d in a.get("dilations", (1, 1))):
            raise Unsupported(f"{op} with dilations")
        if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
            raise Unsupported("MaxPool with indices")
        p = C.Plan("pool", mode="max" if op == "MaxPool" else "avg", kernel=_ints(a["kernel_shape"]),
                   strides=_ints(a.get("strides", (1, 1))), pads=_ints(a.get("pads", (0, 0, 0, 0))),
                   count_include_pad=int(a.get("count_include_pad", 0)), ceil=int(a.get("ceil_mode", 0)))
        if p.p["ceil"]:
            (kh, kw), (sh, sw), pd = p.p["kernel"], p.p["strides"], p.p["pads"]
            floor = ((in_shapes[0][2] + pd[0] + pd[2] - kh) // sh + 1, (in_shapes[0][3] + pd[1] + pd[3] - kw) // sw + 1)
            if floor == tuple(out_shapes[0][2:]):
                p.p["ceil"] = 0  # (the same windows)
            elif p.p["mode"] == "avg" and p.p["count_include_pad"]:
                raise Unsupported("AveragePool in ceil mode counting the padding")
        return p
    if op == "GlobalAveragePool":
        if rank != 4:
            raise Unsupported(f"GlobalAveragePool of rank {rank}")
        return C.Plan("gavgpool")
    if op == "Softmax":
        return C.Plan("softmax", axis=int(a.get("axis", -1)) % rank)
    if op == "LayerNormalization":
        n = len([x for x in node.input if x])
        return C.Plan("layernorm", axis=int(a.get("axis", -1)) % rank, eps=float(a.get("epsilon", 1e-5)),
                      affine=n >= 2, bias=n >= 3)
    if op == "Gather":
        ax = int(a.get("axis", 0)) % rank
        idx = consts[1] if len(consts) > 1 else None
        if idx is not None and np.ndim(idx) == 0:
            i = int(idx)
            return C.Plan("select", axis=ax, index=i + in_shapes[0][ax] if i < 0 else i)
        return C.Plan("gather", axis=ax)
    if op == "Cast":
        from onnx import helper

        return C.Plan("cast", to=np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"]))).name)
    if op == "Clip":
        bounds = []
        for pos, attr in ((1, "min"), (2, "max")):
            if _given(node, pos):
                v = _const_input(node, consts, pos)
                if v is None or np.size(v) != 1:
                    raise Unsupported("Clip with a bound computed at run time")
                bounds.append(float(np.asarray(v).reshape(())))
            else:
                bounds.append(float(a[attr]) if attr in a else None)
        return C.Plan("clip", lo=bounds[0], hi=bounds[1])
    if op == "Equal":
        return C.Plan("equal")
    if op == "Where":
        return C.Plan("where")
    if op == "Expand":
        return C.Plan("expand")
    if op == "ReduceMean":
        if _given(node, 1):
            axes = _const_input(node, consts, 1)
            if axes is None:
                raise Unsupported("ReduceMean with axes computed at run time")
        else:
            axes = a.get("axes", range(rank))
        if a.get("noop_with_empty_axes", 0) and len(axes) == 0:
            return C.Plan("view", shape=tuple(out_shapes[0]))
        return C.Plan("reduce_mean", axes=tuple(sorted(int(x) % rank for x in axes)),
                      keepdims=bool(a.get("keepdims", 1)))
    raise Unsupported(f"no kernel for ONNX op {op}")


def _const_value(node) -> np.ndarray:
    from onnx import numpy_helper

    a = node.attribute[0]
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    if a.name in ("value_float", "value_int"):
        return np.array(a.f if a.name == "value_float" else a.i,
                        dtype=np.float32 if a.name == "value_float" else np.int64)
    if a.name in ("value_floats", "value_ints"):
        return np.array(list(a.floats) if a.name == "value_floats" else list(a.ints),
                        dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise Unsupported(f"Constant with {a.name}")


def default_opset(model) -> int:
    """The model's opset of the default ONNX domain (17 where it names none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


def shape_value(nd, dims) -> np.ndarray:
    """A Shape node's value over an input of static shape ``dims`` (its ``start`` and ``end`` applied)."""
    a = _attrs(nd)
    return np.array(list(dims)[a.get("start", 0):a.get("end", len(dims))], dtype=np.int64)


def evaluate_node(nd, ins: list, const_vals: dict, opset: int) -> list:
    """One node on constant inputs (``const_vals``: name -> value), by onnx's reference evaluator at ``opset``
    (``Unsupported`` where it cannot)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    try:
        names = [x for x in ins if x]
        g = helper.make_graph([nd], "fold", [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(
            np.asarray(const_vals[x]).dtype), np.shape(const_vals[x])) for x in names],
            [helper.make_tensor_value_info(o, 0, None) for o in nd.output if o])
        ev = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid(nd.domain or "", opset)]))
        return [np.asarray(v) for v in ev.run(None, {x: np.asarray(const_vals[x]) for x in names})]
    except Exception as e:
        raise Unsupported(f"onnx's reference evaluator: {type(e).__name__}: {str(e).splitlines()[0][:160]}") from None


def plan_graph(model) -> GraphPlan:
    """Plan ``model`` (weights filled): shapes inferred, constants folded, nodes mapped to kernels, Relu fused
    into the Conv or biased Gemm before it where that is its only user. ``Unsupported``/``ExecError`` with the
    node's name and op where a node cannot be planned."""
    import onnx
    from onnx import helper, numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ExecError(f"onnx shape inference failed: {str(e).splitlines()[0][:200]}") from None
    g = inferred.graph
    opset = default_opset(model)
    info = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            info[vi.name] = (tuple(d.dim_value for d in tt.shape.dim), helper.tensor_dtype_to_np_dtype(tt.elem_type))
    gp = GraphPlan()
    const_vals = {}  # value name -> numpy
    for t in g.initializer:
        const_vals[t.name] = numpy_helper.to_array(t)
    for vi in g.input:
        if vi.name not in const_vals:
            if vi.name not in info:
                raise ExecError(f"input '{vi.name}' has no static shape")
            gp.inputs.append(vi.name)
            gp.slot(vi.name, *info[vi.name])
    gp.outputs = [o.name for o in g.output]
    users: dict = {}
    for nd in g.node:
        for x in nd.input:
            users[x] = users.get(x, 0) + 1
    for o in gp.outputs:
        users[o] = users.get(o, 0) + 1
    producer: dict = {}  # value name -> its Step (for the Relu fusion)

    def where(nd):
        return f"node '{nd.name or nd.output[0]}' ({nd.op_type})"

    for nd in g.node:
        if nd.op_type == "Constant":
            const_vals[nd.output[0]] = _const_value(nd)
            gp.folded += 1
            continue
        ins = [x for x in nd.input]
        if nd.op_type == "Shape" and ins and ins[0] in info:  # (static shapes: a constant)
            const_vals[nd.output[0]] = shape_value(nd, info[ins[0]][0])
            gp.folded += 1
            continue
        # everything constant: folded now, on the host (numpy references; onnx's reference evaluator for the
        # shape arithmetic the kernels have no plan for: Mod, Slice, ConstantOfShape, ...)
        if ins and all((not x) or x in const_vals for x in ins):
            xs = [const_vals[x] for x in ins if x]
            shapes = [info[o][0] if o in info else None for o in nd.output]
            try:
                if nd.op_type == "Gemm":
                    a = _attrs(nd)
                    A = xs[0].T if a.get("transA", 0) else xs[0]
                    B = xs[1].T if a.get("transB", 0) else xs[1]
                    y = a.get("alpha", 1.0) * (A @ B) + (a.get("beta", 1.0) * xs[2] if len(xs) > 2 else 0)
                    outs = [np.asarray(y, dtype=xs[0].dtype)]
                else:
                    try:
                        pl = node_plan(nd, [np.shape(x) for x in xs], shapes, xs)
                        outs = C.reference(pl, xs, shapes)
                    except Exception:  # (no plan, or shapes inference left unknown: the evaluator folds it)
                        outs = evaluate_node(nd, ins, const_vals, opset)
            except Unsupported as e:
                raise Unsupported(f"{where(nd)} on constants: {e}") from None
            for o, v in zip(nd.output, outs):
                const_vals[o] = np.asarray(v)
            gp.folded += 1
            continue
        for o in nd.output:
            if o and o not in info:
                raise ExecError(f"{where(nd)}: no static shape for its output '{o}'")
        # operands: constants become slots with values
        a = _attrs(nd)
        cvals = [const_vals.get(x) if x else None for x in ins]
        if nd.op_type == "Gemm":
            if a.get("transA", 0):
                raise Unsupported(f"{where(nd)}: Gemm with transA")
            if cvals[1] is None:
                raise Unsupported(f"{where(nd)}: Gemm with a non-constant B")
            B = cvals[1].T if a.get("transB", 0) else cvals[1]
            B = np.ascontiguousarray(B * np.float32(a.get("alpha", 1.0)), dtype=cvals[1].dtype)
            ins[1], cvals[1] = f"{ins[1]}::gemm-B({nd.output[0]})", B
            const_vals[ins[1]] = B
            if len(ins) > 2 and ins[2]:
                if cvals[2] is None:
                    raise Unsupported(f"{where(nd)}: Gemm with a non-constant C")
                Cc = np.ascontiguousarray(cvals[2] * np.float32(a.get("beta", 1.0)), dtype=cvals[2].dtype)
                ins[2], cvals[2] = f"{ins[2]}::gemm-C({nd.output[0]})", Cc
                const_vals[ins[2]] = Cc
        in_shapes = []
        for x in ins:
            if not x:
                continue
            if x in const_vals:
                v = const_vals[x]
                s = gp.slot(x, np.shape(v), v.dtype)
                gp.consts[s] = v
            elif x not in gp.slots:
                raise ExecError(f"{where(nd)}: input '{x}' is not defined before it")
            in_shapes.append(gp.shapes[gp.slots[x]])
        out_shapes = [info[o][0] for o in nd.output if o]
        try:
            pl = node_plan(nd, in_shapes, out_shapes, [c for x, c in zip(ins, cvals) if x])
        except Unsupported as e:
            raise Unsupported(f"{where(nd)}: {e}") from None
        gp.ops[nd.op_type] = gp.ops.get(nd.op_type, 0) + 1
        # Relu after a Conv or a biased Gemm that only it uses: one kernel
        src = producer.get(ins[0]) if nd.op_type == "Relu" else None
        if (src is not None and users.get(ins[0], 0) == 1 and src.plan.p.get("act") == "none"
                and (src.plan.op == "conv2d" or (src.plan.op == "matmul" and src.plan.p["bias"]
                                                 and len(gp.shapes[src.ins[1]]) == 2))):
            src.plan.p["act"] = "relu"
            src.nodes.append(nd.name or nd.output[0])
            del gp.slots[ins[0]]  # (the fused value has no slot of its own: the step writes the Relu's)
            gp.slots[nd.output[0]] = src.outs[0]
            producer[nd.output[0]] = src
            gp.fused += 1
            continue
        outs = [gp.slot(o, *info[o]) for o in nd.output if o]
        st = Step([nd.name or nd.output[0]], nd.op_type, pl, [gp.slots[x] for x in ins if x], outs, out_shapes)
        gp.steps.append(st)
        for o in nd.output:
            producer[o] = st
    for o in gp.outputs:
        if o not in gp.slots:
            if o in const_vals:
                v = const_vals[o]
                gp.consts[gp.slot(o, np.shape(v), v.dtype)] = v
            else:
                raise ExecError(f"graph output '{o}' is not computed")
    return gp


# ---------------------------------------------------------------------------------------------------------
# the backends


def rel_error(got, want) -> float:
    return C.rel_error(got, want)


class DryRunner:
    """The plan run by numpy on the CPU (the rehearsal): ``run()`` runs every step once."""

    name = "dry"

    def __init__(self, gp: GraphPlan, feeds: dict, dev=None):
        self.gp = gp
        self.S = [None] * len(gp.shapes)
        for s, v in gp.consts.items():
            self.S[s] = v
        for n in gp.inputs:
            self.S[gp.slots[n]] = np.asarray(feeds[n], dtype=gp.dtypes[gp.slots[n]])
        self.mode = "numpy (dry run)"
        self.capture_error = None
        self.paths = {"all": "numpy references of calibrate.py (dry run)"}

    def run(self):
        S = self.S
        for st in self.gp.steps:
            ys = C.reference(st.plan, [S[i] for i in st.ins], st.out_shapes)
            for o, y, dt in zip(st.outs, ys, (self.gp.dtypes[o] for o in st.outs)):
                S[o] = np.asarray(y, dtype=dt)

    def outputs(self) -> dict:
        return {n: np.asarray(self.S[self.gp.slots[n]]) for n in self.gp.outputs}

    def time(self, warmup: int, repeats: int, cap_s: float) -> list:
        """Wall-clock ms of ``repeats`` runs after ``warmup`` ones; past ``cap_s`` seconds, no more warm-ups
        and at most 3 runs (numpy runs a full-size model in seconds)."""
        t_end = time.perf_counter() + cap_s
        for _ in range(warmup):
            self.run()
            if time.perf_counter() > t_end:
                break
        times = []
        t_end = time.perf_counter() + cap_s
        for i in range(repeats):
            t = time.perf_counter()
            self.run()
            times.append(1e3 * (time.perf_counter() - t))
            if time.perf_counter() > t_end and i >= 2:
                break
        return times

    def release(self):
        self.S.clear()


class CudaRunner:
    """The plan on the GPU through ``calibrate.CudaDevice``: buffers allocated once, one kernel closure per
    step, the whole model as one CUDA graph where it can be captured (``graph=False``: eager)."""

    name = "cuda"

    def __init__(self, gp: GraphPlan, feeds: dict, dev: "C.CudaDevice", graph: bool = True):
        torch = dev.torch
        self.gp, self.dev, self.torch = gp, dev, torch
        S = self.S = [None] * len(gp.shapes)
        fixed = set()
        tdt = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
               np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool,
               np.dtype(np.float64): torch.float64}
        with torch.cuda.stream(dev.stream):
            for s, v in gp.consts.items():
                S[s] = torch.from_numpy(np.require(v, requirements=("C", "W"))).to(dev.dev)  # (writable: no warning)
                fixed.add(s)
            for n in gp.inputs:
                s = gp.slots[n]
                S[s] = torch.from_numpy(np.ascontiguousarray(feeds[n], dtype=gp.dtypes[s])).to(dev.dev)
                fixed.add(s)
            self.runs, self.kernels = [], {}
            for st in gp.steps:
                for o, shp in zip(st.outs, st.out_shapes):
                    dt = gp.dtypes[o]
                    if dt not in tdt:
                        raise Unsupported(f"{st.nodes[0]}: dtype {dt}")
                    S[o] = torch.empty(shp, dtype=tdt[dt], device=dev.dev)
                f32 = all(gp.dtypes[i] == np.float32 for i in st.ins + st.outs)
                try:
                    run, what, in_place = dev.build_kernel(st.plan, S, st.ins, st.outs, fixed=fixed, f32=f32)
                    run()  # the first run: what cannot run fails here, and the next steps see real tensors
                except Unsupported as e:
                    raise Unsupported(f"node '{st.nodes[0]}' ({st.op_type}): {e}") from None
                except Exception as e:
                    raise ExecError(f"node '{st.nodes[0]}' ({st.op_type}): {C.K.error_line(e, 200)}") from None
                shapes = [tuple(S[o].shape) for o in st.outs]
                if shapes != [tuple(s) for s in st.out_shapes]:
                    raise ExecError(f"node '{st.nodes[0]}' ({st.op_type}): {what} gives {shapes}, "
                                    f"ONNX says {st.out_shapes}")
                if in_place or (st.plan.op in ("view", "select") and what.startswith("view") and st.ins[0] in fixed):
                    fixed.update(st.outs)
                self.runs.append(run)
                self.kernels[what] = self.kernels.get(what, 0) + 1
        dev.stream.synchronize()
        self.paths = dev.paths()
        self.mode, self.capture_error, self.graph = "eager", None, None
        if graph:
            self._capture()

    def _eager(self):
        with self.torch.cuda.stream(self.dev.stream):
            for r in self.runs:
                r()

    def _capture(self):
        torch = self.torch
        try:
            for _ in range(2):  # warm (cuDNN's algorithm search happens outside the capture)
                self._eager()
            self.dev.stream.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.dev.stream, capture_error_mode="thread_local"):
                for r in self.runs:
                    r()
            g.replay()
            self.dev.stream.synchronize()
            self.graph, self.mode = g, "cuda graph"
        except Exception as e:
            self.capture_error = C.K.error_line(e, 240)
            self.graph, self.mode = None, "eager"
            try:
                torch.cuda.synchronize()
            except Exception:
                pass

    def run(self):
        if self.graph is not None:
            with self.torch.cuda.stream(self.dev.stream):
                self.graph.replay()
        else:
            self._eager()

    def outputs(self) -> dict:
        self.dev.stream.synchronize()
        return {n: self.S[self.gp.slots[n]].cpu().numpy() for n in self.gp.outputs}

    def time(self, warmup: int, repeats: int, cap_s: float) -> list:
        times, _, _ = self.dev.time(self, warmup, repeats, cap_s)
        return times

    def release(self):
        self.graph = None
        self.runs.clear()
        self.S.clear()


def check(runner, ref: dict, tol: float = TOLERANCE) -> dict:
    """Run once and compare every output with onnxruntime's: {"ok", "rel_err", "max_abs", "outputs"}."""
    runner.run()
    got = runner.outputs()
    errs, absd = {}, {}
    for n, want in ref.items():
        g = got.get(n)
        if g is None or tuple(np.shape(g)) != tuple(np.shape(want)):
            errs[n], absd[n] = math.inf, math.inf
            continue
        w64, g64 = np.asarray(want, np.float64), np.asarray(g, np.float64)
        if not np.all(np.isfinite(w64)):
            errs[n] = 0.0 if np.array_equal(np.isfinite(w64), np.isfinite(g64)) else math.inf
            fin = np.isfinite(w64)
            absd[n] = float(np.max(np.abs(w64[fin] - g64[fin]))) if fin.any() else 0.0
            continue
        errs[n] = rel_error(g64, w64)
        absd[n] = float(np.max(np.abs(g64 - w64))) if w64.size else 0.0
    worst = max(errs.values()) if errs else math.inf
    return {"ok": bool(worst <= tol), "rel_err": worst, "max_abs": max(absd.values()) if absd else math.inf,
            "tolerance": tol, "outputs": len(errs)}


def make_runner(backend: str, gp: GraphPlan, feeds: dict, dev=None, graph: bool = True):
    if backend == "dry":
        return DryRunner(gp, feeds)
    return CudaRunner(gp, feeds, dev, graph=graph)


def open_device(tf32: bool = False, nvrtc: str = "cuda.core", events: str = "cuda.core") -> "C.CudaDevice":
    return C.CudaDevice(argparse.Namespace(tf32=tf32, nvrtc=nvrtc, events=events))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="check one ONNX model against onnxruntime and time it on the GPU")
    ap.add_argument("model", help="an ONNX file (weights stripped by prepare.py are drawn from their statistics)")
    ap.add_argument("--dry-run", action="store_true", help="numpy on the CPU instead of the GPU (a rehearsal)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graph")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args(argv)
    try:
        m = load_model(a.model, a.seed)
        gp = plan_graph(m)
        feeds = random_feeds(m, a.seed)
        ref = ort_outputs(m, feeds)
        dev = None if a.dry_run else open_device(a.tf32)
        r = make_runner("dry" if a.dry_run else "cuda", gp, feeds, dev, graph=not a.eager)
        c = check(r, ref)
        print(f"execute: {a.model}: {json.dumps(gp.summary())}")
        print(f"execute: mode {r.mode}{' (capture failed: ' + r.capture_error + ')' if r.capture_error else ''}; "
              f"check against onnxruntime: rel err {c['rel_err']:.2e}, max abs {c['max_abs']:.2e} "
              f"{'ok' if c['ok'] else 'MISMATCH'}")
        if not c["ok"]:
            return 1
        t = r.time(a.warmup, a.repeats, 30.0)
        q1, med, q3 = np.percentile(t, [25, 50, 75])
        print(f"execute: {len(t)} runs: median {med:.4g} ms (IQR {q1:.4g}-{q3:.4g})"
              f"{' (wall clock, numpy: not a GPU timing)' if a.dry_run else ''}")
        return 0
    except (ExecError, Unsupported) as e:
        print(f"execute: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"execute: error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
