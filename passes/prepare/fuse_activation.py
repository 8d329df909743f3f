"""``taso-fuse-activation``: fuse a ReLU into the convolution or matmul before it.

The ONNX importer writes a ``Conv`` (or ``MatMul``/``Gemm``) followed by ``Relu`` as two ops,
``taso.conv2d {activation = "none"}`` and ``taso.relu``. Every runtime the project measures with fuses
them (onnxruntime's CPU provider makes the Relu the Conv's activation; cuDNN and cuBLASLt apply it in
the kernel's epilogue), and TASO's and TENSAT's model definitions start fused (``activation=RELU``).
Before this pass, the search's first rewrites on a CNN were those fusions, so part of every reduction
it reported was work a runtime does anyway. A site is::

    y = taso.conv2d(x, w[, b]) {activation = "none", ...}   (or taso.matmul(x, w[, b]) {activation = "none"})
    z = taso.relu(y)                                        (y has no other use; z has y's type)

It becomes ``z = taso.conv2d(x, w[, b]) {activation = "relu", ...}`` (or the matmul). The export writes
it back as ``Conv``/``MatMul``/``Gemm`` then ``Relu``, the same ONNX ops as before, so onnxruntime
computes the same numbers. The rules can still separate them where that pays (``R0009`` and the other
relu rules hold in both directions). With a cost model, a site fuses only where the fused op costs no
more than the two apart (the measured CPU table might say otherwise for some shape).

``taso-search`` runs it after the batchnorm, scale and bias foldings (a batchnorm or a scale between
the conv and the relu, or a matmul's bias add, folds first) and after the ReLU6 fusion (which takes a
``Clip(relu(conv))`` whole). The report's *baseline* prices the input after this fusion and the
batchnorm folding (``taso_search.baseline``): the model as a runtime runs it.

Identity: ``relu(op(x, w, b))[e] = max(op(x, w, b)[e], 0)``, which is ``dialect.specs``'s definition of
the op with ``activation = "relu"`` (the activation applied after the bias, per element). ``prove()``
proves the scalar identity with Z3, and ``prove_shapes()`` the elementwise one on symbolic tensors.

Conditions (``_site``): the producer is a ``taso.conv2d`` or ``taso.matmul`` with activation ``none``
(any shape, group, stride, padding, bias), its result used only by the relu, the relu's result of
the same type; any element type the ops take.
"""

from __future__ import annotations

from typing import Optional

from taso_mlir.dialect.handles import check_live, erase_op, ir_step, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import find_sites, function_bodies, taso_attrs
from taso_mlir.passes.ir_util import op_sig, static_shape
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.passes.prepare.fold_batchnorm import single_use_producer

#: the ops with a fused activation a relu after them becomes
FUSABLE = ("taso.conv2d", "taso.matmul")


def _site(relu: ir.Operation, cost_model=None) -> Optional[tuple]:
    """(producer,) if ``relu`` fuses into the op before it, else None."""
    if len(relu.operands) != 1 or len(relu.results) != 1:
        return None
    y = relu.operands[0]
    op = next(filter(None, (single_use_producer(y, name) for name in FUSABLE)), None)
    if op is None or y.type != relu.results[0].type:
        return None
    if taso_attrs(op).get("activation", "none") != "none":
        return None
    if cost_model is not None and not _gains(cost_model, op):
        return None
    return (op,)


def _gains(cost_model, op: ir.Operation) -> bool:
    """The op with a fused relu costs no more than the op and a relu apart (under ``cost_model``);
    False where a shape is not static (nothing to price)."""
    from taso_mlir.dialect.convert_onnx_to_taso import weight_of

    shapes = [static_shape(v) for v in op.operands]
    out = static_shape(op.results[0])
    if out is None or any(s is None for s in shapes):
        return False
    dtype = str(ir.RankedTensorType(op.results[0].type).element_type)
    kind, attrs = op.name[len("taso."):], taso_attrs(op)
    weights = tuple(weight_of(v) is not None for v in op.operands)

    def cost(act):
        return cost_model.cost(op_sig(kind, {**attrs, "activation": act}, shapes, [out], dtype, weights))

    return cost("relu") <= cost("none") + cost_model.cost(op_sig("relu", {}, [out], [out], dtype, (False,)))


@ir_step(name="fuse_activation")
def fuse_function(f: ir.Operation, cost_model=None) -> int:
    """Fuse every relu site of one function (with ``cost_model``, only where the fused op costs no
    more). Returns the number fused."""
    sites = find_sites(f, "taso.relu", lambda r: _site(r, cost_model))
    # (sites are found first: a fusion erases its relu, which is in no other site, and changes only its
    # producer's attribute, which no other site reads: a producer has one use)
    for relu, op in sites:
        check_live(relu, "a relu found before the fusions")
        check_live(op, "the op before a relu found before the fusions")
        op.attributes["activation"] = ir.StringAttr.get("relu", context=op.context)
        replace_uses(relu.results[0], op.results[0])
        erase_op(relu)
    return len(sites)


def fuse_activations(module_op: ir.Operation, cost_model=None) -> int:
    """Run ``fuse_function`` on every function with a body. Returns the number of relus fused."""
    return sum(fuse_function(f, cost_model) for f in function_bodies(module_op))


def prove():
    """Z3 proof over the reals that ``taso.relu`` of a value is the ``relu`` activation of
    ``dialect.specs`` (below 0 -> 0, else the value), then ``prove_shapes()``. Returns ``z3.unsat``
    (no counterexample: proved) or the first other result."""
    import z3

    y = z3.Real("y")
    s = z3.Solver()
    s.add(_relu_op(y) != _activation(y))
    r = s.check()
    if r != z3.unsat:
        return r
    return z3.sat if prove_shapes() else z3.unsat


def _relu_op(v):
    """``taso.relu`` per element: max(v, 0)."""
    import z3

    return z3.If(v > 0, v, z3.RealVal(0))


def _activation(v):
    """The spec's ``relu`` activation per element: below 0 -> 0, else v."""
    import z3

    return z3.If(v < 0, z3.RealVal(0), v)


def prove_shapes() -> list:
    """On symbolic tensors (``verifier.symbolic``) of the shapes a conv or matmul result takes (rank 2,
    3 and 4, some axes 1): ``relu(y)`` has ``y``'s shape (the site's type condition) and equals the
    activation applied per element. Returns the cases that fail (none: proved)."""
    from taso_mlir.verifier import symbolic as S

    bad = []
    for shape in ((1, 1), (2, 3), (2, 1, 3), (1, 2, 3, 3), (2, 3, 1, 2)):
        y = S.tensor("y", shape)
        got = S.apply(_relu_op, y)
        if tuple(got.shape) != shape:
            bad.append(("shape", shape, tuple(got.shape)))
            continue
        d = S.differs(got, S.apply(_activation, y))
        if d is not None:
            bad.append(("relu", shape, d))
    return bad


def _run(st: FuncState) -> None:
    st.count("relus_fused", fuse_function(st.f, st.cost_model))


PASS = FunctionPass(
    "taso-fuse-activation",
    "Fuse each taso.relu into the conv2d or matmul before it (activation none, its result used only by "
    "the relu) where the fused op costs no more under the cost model: {activation = \"relu\"}",
    _run, {"relus_fused": "relus fused into the convolutions and matmuls before them"}, needs_cost_model=True)
