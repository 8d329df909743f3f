"""Independent differential comparison of an optimized ONNX model with its input.

Both models run in onnxruntime with its graph optimizations off (``ORT_DISABLE_ALL``: onnxruntime
1.31.1's own optimizer computes some valid models wrongly) on the same random inputs, and each is judged
against a float64 reference: ``onnx.reference.ReferenceEvaluator`` on a float64 copy of the input model.
An output is wrong when its distance to the reference exceeds both ``RTOL`` x the output's scale
(``max(1, max |reference|)``) and ``ERR_FACTOR`` x the float32 error the input model itself allows: the
larger, over the trials, of the input model's float32 distance to the reference and of how far the
reference moves when its weights and inputs are perturbed by one float32 rounding (``PERTURBATIONS``
runs). A model whose intermediate values are large (a deep chain of products) has a float32 error far
above 1e-5 of its output scale, and its optimized form (matmuls reassociated, weights folded) rounds
differently within that error; an optimized model more accurate than the input is never called wrong.
Where the reference cannot run (an op it lacks), the two float32 runs are compared with ``RTOL_NO_REF``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .gen import FLOAT, feedable_inputs, random_feeds, session

#: an output may differ from the float64 reference by this much relative to its scale ...
RTOL = 1e-5
#: ... or by this many times the input model's own float32 error, whichever is larger
ERR_FACTOR = 4.0
#: without a reference: the largest float32 difference between the two models, relative to scale
RTOL_NO_REF = 1e-4
#: the input's float32 run must agree with the reference this well, or neither can be judged
RTOL_REF_AGREE = 1e-3
#: the reference is skipped for models of more nodes than this (it is slow there)
MAX_REF_NODES = 1500
#: float64 runs with weights and inputs perturbed by one float32 rounding, to size the float32 error
PERTURBATIONS = 2
_EPS32 = 2.0 ** -24


@dataclass
class Comparison:
    ok: bool
    detail: str = ""
    #: the worst over outputs and trials of (distance to the reference) / (allowed distance)
    ratio: float = 0.0
    reference: bool = True
    #: the input model itself is not judgeable (onnxruntime and the reference disagree on it)
    input_fault: bool = False


def float64_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 tensor, value and cast turned into float64."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph

    def retype(vi):
        if vi.type.tensor_type.elem_type == FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE

    for vi in list(g.input) + list(g.output) + list(g.value_info):
        retype(vi)
    for i, t in enumerate(g.initializer):
        if t.data_type == FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            if n.op_type == "Cast" and a.name == "to" and a.i == FLOAT:
                a.i = TensorProto.DOUBLE
    return m


def _reference_ops():
    """onnx.reference's Erf computes in float32 whatever its input; this one in float64."""
    from onnx.reference.ops._op import OpRunUnaryNum

    class Erf(OpRunUnaryNum):
        def _run(self, x):
            return (np.vectorize(math.erf, otypes=[x.dtype])(x),)

    return [Erf]


def perturbed(model64: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """``model64`` (a float64 copy) with every float weight and constant off by up to one float32
    rounding, relative."""
    m = onnx.ModelProto()
    m.CopyFrom(model64)

    def shake(t):
        a = numpy_helper.to_array(t)
        return numpy_helper.from_array(a * (1 + _EPS32 * rng.uniform(-1, 1, a.shape)), t.name)

    for i, t in enumerate(m.graph.initializer):
        if t.data_type == TensorProto.DOUBLE:
            m.graph.initializer[i].CopyFrom(shake(t))
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.DOUBLE:
                a.t.CopyFrom(shake(a.t))
    return m


class Reference:
    """Float64 evaluation of a model, and of ``PERTURBATIONS`` copies perturbed by one float32
    rounding (None where the reference cannot run it)."""

    def __init__(self, model: onnx.ModelProto, seed: int = 0):
        from onnx.reference import ReferenceEvaluator

        self.error = None
        self.ev = None
        self.shaken: list = []
        self.rng = np.random.default_rng([seed, 11])
        if len(model.graph.node) > MAX_REF_NODES:
            self.error = f"over {MAX_REF_NODES} nodes"
            return
        try:
            m64 = float64_copy(model)
            self.ev = ReferenceEvaluator(m64, new_ops=_reference_ops())
            self.shaken = [ReferenceEvaluator(perturbed(m64, self.rng), new_ops=_reference_ops())
                           for _ in range(PERTURBATIONS)]
        except Exception as e:
            self.ev = None
            self.error = f"{type(e).__name__}: {e}"

    def _run(self, ev, feeds: dict) -> list:
        with np.errstate(all="ignore"):  # (exp overflowing to inf in a saturated sigmoid is fine)
            return [np.asarray(o, np.float64) for o in ev.run(None, feeds)]

    def run(self, feeds: dict) -> Optional[tuple]:
        """(outputs, per output the largest move under the perturbations) in float64, or None."""
        if self.ev is None:
            return None
        f64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}
        try:
            ys = self._run(self.ev, f64)
            moves = [0.0] * len(ys)
            for ev in self.shaken:
                shaken = {k: v * (1 + _EPS32 * self.rng.uniform(-1, 1, v.shape)) if v.dtype.kind == "f" else v
                          for k, v in f64.items()}
                for i, (y, z) in enumerate(zip(ys, self._run(ev, shaken))):
                    if y.dtype.kind == "f":
                        moves[i] = max(moves[i], float(np.max(np.abs(z - y), initial=0.0)))
        except Exception as e:
            self.error = f"{type(e).__name__}: {str(e)[:200]}"
            return None
        return ys, moves


def _shapes(model) -> dict:
    return {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for vi in model.graph.output}


def compare(src: onnx.ModelProto, out: onnx.ModelProto, seed: int = 0, trials: int = 2,
            reference: bool = True) -> Comparison:
    """Judge ``out`` (the optimized model) against ``src`` on ``trials`` random input sets."""
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as e:
        return Comparison(False, f"the optimized model is not valid ONNX: {str(e).strip().splitlines()[0][:300]}")
    names = [vi.name for vi in src.graph.output]
    onames = [vi.name for vi in out.graph.output]
    if names != onames:
        return Comparison(False, f"outputs {onames} where the input has {names}")
    if _shapes(src) != _shapes(out):
        return Comparison(False, f"output shapes {_shapes(out)} where the input has {_shapes(src)}")
    src_in = {n: s for n, s, _ in feedable_inputs(src)}
    out_in = {n: s for n, s, _ in feedable_inputs(out)}
    extra = [n for n in out_in if src_in.get(n) != out_in[n]]
    if extra:
        return Comparison(False, f"optimized model has inputs the input model lacks or shapes differently: {extra}")
    try:
        s_src = session(src)
    except Exception as e:
        return Comparison(False, f"input model does not load in onnxruntime: {str(e)[:200]}", input_fault=True)
    try:
        s_out = session(out)
    except Exception as e:
        return Comparison(False, f"optimized model does not load in onnxruntime: {str(e).strip()[:300]}")
    ref = Reference(src, seed) if reference else None
    used_ref = ref is not None and ref.ev is not None
    runs = []  # per trial: (input model's outputs, optimized outputs, reference outputs or None, moves)
    for t in range(trials):
        rng = np.random.default_rng([seed, t, 7])
        feeds = random_feeds(src, rng)
        y_src = s_src.run(None, feeds)
        try:
            y_out = s_out.run(None, {n: feeds[n] for n in out_in})
        except Exception as e:
            return Comparison(False, f"optimized model fails in onnxruntime: {str(e).strip()[:300]}")
        r = ref.run(feeds) if used_ref else None
        if used_ref and r is None:
            used_ref = False
        runs.append((y_src, y_out) + (r if r is not None else (None, None)))
    worst, worst_detail = 0.0, ""
    # a model that rounds to a narrow float type on the way is only as precise as that type
    from taso_mlir.dialect.numerics import rounding_floor

    rtol = max(RTOL, rounding_floor(src))
    for i, name in enumerate(names):
        # the float32 error the input model allows at this output: over all trials
        budget = 0.0
        for t, (y_src, y_out, y_ref, moves) in enumerate(runs):
            a, o = np.asarray(y_src[i], np.float64), np.asarray(y_out[i], np.float64)
            if a.shape != o.shape:
                return Comparison(False, f"output '{name}' has shape {o.shape}, the input model's {a.shape}")
            if not np.all(np.isfinite(a)):
                return Comparison(False, f"output '{name}' of the input model is not finite", input_fault=True)
            if not np.all(np.isfinite(o)):
                return Comparison(False, f"output '{name}' of the optimized model is not finite (trial {t})",
                                  ratio=math.inf)
            if used_ref:
                r = y_ref[i]
                scale = max(1.0, float(np.max(np.abs(r), initial=0.0)))
                e_in = float(np.max(np.abs(a - r), initial=0.0))
                if e_in > RTOL_REF_AGREE * scale:
                    return Comparison(False, f"output '{name}': onnxruntime and the float64 reference disagree on "
                                             f"the input model ({e_in:.3g} at scale {scale:.3g})", input_fault=True)
                budget = max(budget, e_in, moves[i])
        for t, (y_src, y_out, y_ref, moves) in enumerate(runs):
            a, o = np.asarray(y_src[i], np.float64), np.asarray(y_out[i], np.float64)
            if used_ref:
                r = y_ref[i]
                scale = max(1.0, float(np.max(np.abs(r), initial=0.0)))
                e_in = float(np.max(np.abs(a - r), initial=0.0))
                e_out = float(np.max(np.abs(o - r), initial=0.0))
                allowed = max(rtol * scale, ERR_FACTOR * budget)
                detail = (f"output '{name}' (trial {t}): |optimized - float64 reference| {e_out:.3g}, input model's "
                          f"{e_in:.3g}, float32 error allowed {budget:.3g}, scale {scale:.3g}")
            else:
                scale = max(1.0, float(np.max(np.abs(a), initial=0.0)))
                e_out = float(np.max(np.abs(o - a), initial=0.0))
                allowed = max(RTOL_NO_REF, rtol) * scale
                detail = f"output '{name}' (trial {t}): |optimized - input| {e_out:.3g}, scale {scale:.3g} (no reference)"
            q = e_out / allowed
            if q > worst:
                worst, worst_detail = q, detail
    ok = worst <= 1.0
    return Comparison(ok, worst_detail if not ok else "", worst, used_ref)
