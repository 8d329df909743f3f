"""``taso-fuse-relu6``: fuse ReLU6 (ONNX ``Clip(x, 0, 6)``) into the convolution before it.

TASO fuses a ReLU into the convolution before it (``conv2d {activation = "relu"}``); MobileNet-style
models use ReLU6 instead, exported by torch as ``Clip`` with constant bounds 0 and 6, which the
conversion leaves as a generic ``onnx.Clip``. A site is::

    y = taso.conv2d(x, w[, b]) {activation = "none" or "relu", ...}     (y has no other use)
    z = onnx.Clip(y, lo, hi)       lo, hi: taso.weight scalars equal to 0 and 6 (before opset 11:
                                   attributes min = 0, max = 6); or Clip(taso.relu(y)), the relu's
                                   result with no other use

with one float element type (f16, f32, f64) throughout. It becomes::

    z = taso.conv2d(x, w[, b]) {activation = "relu6", ...}

The export writes it back as ``Conv`` then ``Clip(0, 6)``: the same ONNX ops, so onnxruntime computes
the same numbers (for float32 its CPU provider makes the Clip the Conv's activation, as it does a
Relu), while the cost models and the search see one op, as for a fused relu: the reduction reported
is the cost model's, not onnxruntime's. ``relu6`` is ``min(max(y, 0), 6)``, which is ONNX's
``Clip(y, 0, 6)`` by definition, and so is ``Clip(max(y, 0), 0, 6)``; ``prove()`` proves both with Z3.
A Clip with other bounds, a missing bound, bounds that are not constants, a conv result with other
uses, or an integer or bf16 type is left as is. ``taso-search`` runs it after the folding of constants
(bounds computed by a Cast) and the merging of repeated ops (two equal convs, one of them clipped,
merge first). The rules of the library are stated for ``none`` and ``relu`` convolutions only and
match every attribute exactly, so a ``relu6`` convolution is opaque to the search.

Identity: ``Clip(y, 0, 6)[e] = min(max(y[e], 0), 6) = relu6(y)[e]`` for every element ``e``, and
``Clip(relu(y), 0, 6) = relu6(y)``; the conv's ``relu6`` is applied after its bias, per element.

Conditions (``_site``, ``_bounds``):
- both bounds are constants equal to 0 and 6: one-element weights (``[]``, ``[1]``, any one-element
  shape) of the input's element type, or the ``min``/``max`` attributes before opset 11; a missing
  bound, a bound that is not a constant, or other values leave the Clip alone;
- the Clip's result has the conv result's type (so nothing broadcasts: a one-element bound of
  higher rank than ``y`` would change the result's shape, and is refused by this check), and the
  relu between (where there is one) too;
- the conv's activation is ``none`` or ``relu``, its result (and the relu's) has no other use; any
  conv shape, group, stride, padding, bias; a float element type (f16, f32, f64: 0 and 6 exact).
``prove()`` proves the scalar identities, and ``prove_shapes()`` the elementwise Clip with
broadcast one-element bounds on symbolic tensors.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from taso_mlir.dialect.convert_onnx_to_taso import weight_of
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import check_live, erase_op, ir_step, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import dense_array, find_sites, function_bodies, named, taso_attrs
from taso_mlir.dialect.specs import RELU6_MAX

from taso_mlir.passes.prepare.fold_batchnorm import FLOAT_ELEMS, single_use_producer
from taso_mlir.passes.pipeline import FuncState, FunctionPass

#: the conv activations a Clip(0, 6) after it turns into relu6
_FUSABLE = ("none", "relu")


def _scalar(v: ir.Value) -> Optional[float]:
    """The value of a one-element ``taso.weight`` operand, else None."""
    w = weight_of(v)
    if w is None:
        return None
    try:
        a = dense_array(w.attributes["value"])
    except (TasoError, KeyError):
        return None
    return float(a.reshape(-1)[0]) if a.size == 1 else None


def _elem(v: ir.Value) -> Optional[str]:
    """The element type of a tensor value; None for another type (an omitted input is ``none``)."""
    try:
        return str(ir.ShapedType(v.type).element_type)
    except ValueError:
        return None


def _bounds(clip: ir.Operation) -> Optional[tuple]:
    """(lo, hi) of a Clip with both bounds constant: operands from opset 11, attributes before; else None."""
    attrs = {na.name: na.attr for na in named(clip.attributes)}
    if len(clip.operands) == 3 and not attrs:
        elem = _elem(clip.operands[0])
        if elem is None or any(_elem(v) != elem for v in clip.operands[1:]):
            return None
        return _scalar(clip.operands[1]), _scalar(clip.operands[2])
    if len(clip.operands) == 1 and set(attrs) == {"min", "max"} and all(isinstance(a, ir.FloatAttr) for a in attrs.values()):
        return ir.FloatAttr(attrs["min"]).value, ir.FloatAttr(attrs["max"]).value
    return None


def _site(clip: ir.Operation) -> Optional[tuple]:
    """(conv, relu op or None) whose conv's activation becomes relu6 if ``clip`` fuses, else None."""
    if len(clip.results) != 1 or _bounds(clip) != (0.0, RELU6_MAX):
        return None
    y = clip.operands[0]
    relu = single_use_producer(y, "taso.relu")
    if relu is not None:  # Clip(relu(conv)): relu6 too
        y = relu.operands[0]
        if y.type != relu.results[0].type:
            return None
    conv = single_use_producer(y, "taso.conv2d")
    if conv is None or y.type != clip.results[0].type or _elem(y) not in FLOAT_ELEMS:
        return None
    if taso_attrs(conv).get("activation", "none") not in _FUSABLE:
        return None
    return conv, relu


@ir_step(name="fuse_relu6")
def fuse_function(f: ir.Operation) -> int:
    """Fuse every Clip(0, 6) site of one function (bounds left unused are removed). Returns the
    number fused."""
    sites = find_sites(f, "onnx.Clip", _site)
    # (sites are found first; a fusion erases its Clip and relu, which are in no other site, and of the
    # bounds those nothing uses any more, which a Clip not yet fused would still use)
    for clip, conv, relu in sites:
        for op in (clip, conv) + ((relu,) if relu is not None else ()):
            check_live(op, "an op of a ReLU6 site found before the fusions")
        bounds = [weight_of(v) for v in list(clip.operands)[1:]]  # (none in the attribute form)
        conv.attributes["activation"] = ir.StringAttr.get("relu6", context=conv.context)
        replace_uses(clip.results[0], conv.results[0])
        erase_op(clip)
        if relu is not None:
            erase_op(relu)
        for w in dict.fromkeys(bounds):  # (the two bounds can be one weight only if 0 == 6: never)
            if not any(True for _ in w.results[0].uses):
                erase_op(w)
    return len(sites)


def fuse_relu6(module_op: ir.Operation) -> int:
    """Run ``fuse_function`` on every function with a body. Returns the number of Clips fused."""
    return sum(fuse_function(f) for f in function_bodies(module_op))


def prove():
    """Z3 proof over the reals that ONNX's ``Clip(y, 0, 6) = min(max(y, 0), 6)`` is the spec's relu6 of
    ``y``, and that ``Clip(max(y, 0), 0, 6)`` (a conv with a fused relu) is too. Returns ``z3.unsat``
    (no counterexample: proved) or the first other result."""
    import z3

    y = z3.Real("y")

    def clip(v, lo, hi):  # ONNX Clip: min(max(v, lo), hi)
        m = z3.If(v > lo, v, lo)
        return z3.If(m < hi, m, hi)

    def relu6(v):  # the spec's activation: below 0 -> 0, above 6 -> 6, else v
        return z3.If(v < 0, z3.RealVal(0), z3.If(v > RELU6_MAX, z3.RealVal(RELU6_MAX), v))

    relu = z3.If(y > 0, y, z3.RealVal(0))
    for lhs in (clip(y, 0, RELU6_MAX), clip(relu, 0, RELU6_MAX)):
        s = z3.Solver()
        s.add(lhs != relu6(y))
        r = s.check()
        if r != z3.unsat:
            return r
    return z3.sat if prove_shapes() else z3.unsat


def prove_shapes() -> list:
    """ONNX's Clip on tensors, on symbolic ones (``verifier.symbolic``): for conv results ``y`` of
    shapes [1, 1, 1, 1], [2, 3, 1, 2] and [1, 2, 3, 3] and one-element bounds of shape ``[]``, ``[1]``
    and ``[1, 1, 1, 1]`` holding 0 and 6 (broadcast as numpy, and ONNX, broadcast), ``Clip(y, lo, hi)``
    and ``Clip(relu(y), lo, hi)`` have ``y``'s shape (the site check's result-type condition) and equal
    the spec's relu6 element by element. Returns the cases that fail (none: proved)."""
    import numpy as np
    import z3

    from taso_mlir.verifier import symbolic as S

    def clip(v, lo, hi):
        m = z3.If(v > lo, v, lo)
        return z3.If(m < hi, m, hi)

    def relu6(v):
        return z3.If(v < 0, z3.RealVal(0), z3.If(v > RELU6_MAX, z3.RealVal(RELU6_MAX), v))

    bad = []
    for shape in ((1, 1, 1, 1), (2, 3, 1, 2), (1, 2, 3, 3)):
        y = S.tensor("y", shape)
        for bshape in ((), (1,), (1, 1, 1, 1)):
            lo = np.full(bshape, z3.RealVal(0), dtype=object)
            hi = np.full(bshape, z3.RealVal(RELU6_MAX), dtype=object)
            for what, src in (("clip", y), ("clip of relu", S.relu(y))):
                d = S.differs(S.apply(clip, src, lo, hi), S.apply(relu6, y))
                if d is not None:
                    bad.append((what, shape, bshape, d))
    return bad


def check_rounding(dtypes=(np.float16, np.float32, np.float64)) -> bool:
    """Clip(round(y), 0, 6) == round(relu6(y)) for every float type: 0 and 6 are exact in each, and
    rounding is monotone, so fusing before or after the conv's rounding gives the same bits. Checked on
    values around 0 and 6 (both signs of zero, the neighbours of 6, infinities)."""
    probe = np.array([-np.inf, -7.0, -1e-30, -0.0, 0.0, 1e-30, 3.0, 5.999999999, 6.0, 6.000000001, 7.0,
                      np.inf], dtype=np.float64)
    for dt in dtypes:
        rounded = probe.astype(dt)
        a = np.minimum(np.maximum(rounded, dt(0)), dt(RELU6_MAX))
        b = np.minimum(np.maximum(probe, 0.0), RELU6_MAX).astype(dt)
        if not np.array_equal(a, b):
            return False
    return True


def _run(st: FuncState) -> None:
    st.count("relu6_fused", fuse_function(st.f))


PASS = FunctionPass(
    "taso-fuse-relu6",
    "Fuse ReLU6 (onnx.Clip with constant bounds 0 and 6) into the convolution before it, directly or through a "
    "taso.relu (no fused activation or a fused relu, the conv result used only by the Clip): "
    "conv2d {activation = \"relu6\"}",
    _run, {"relu6_fused": "ReLU6 (Clip 0..6) fused into the convolutions before them"})
