"""``taso-fold-batchnorm``: fold inference batch normalization into the convolution before it.

TASO's built-in conv + batchnorm rule. A site is::

    y = taso.conv2d(x, w[, b]) {activation = "none", ...}      (y has no other use)
    z = taso.batchnorm(y, scale, bias, mean, var) {epsilon}

with ``w``, ``b``, ``scale``, ``bias``, ``mean``, ``var`` all ``taso.weight`` constants of one float
element type (f16, f32, f64) and ``var[o] + epsilon > 0`` for every channel. It becomes::

    z = taso.conv2d(x, w', b') {same attributes}

where, per output channel o (``w``'s first axis, also for grouped convolutions),
``k = scale[o] / sqrt(var[o] + epsilon)``, ``w'[o] = w[o] * k`` and
``b'[o] = (b[o] (0 if absent) - mean[o]) * k + bias[o]``, computed in float64 and rounded once to the
element type; ``w'`` and ``b'`` are new weights with unique names (``<w>.bn``, ``<bias>.bn``).

Identity (per output element, a convolution output being a finite sum over the window):
``s*inv*(sum_k w_k x_k + b - m) + beta == sum_k (s*inv*w_k) x_k + ((b - m)*s*inv + beta)`` with
``inv = 1/sqrt(var + eps) > 0``. ``prove()`` proves it over the reals with Z3 for windows of 1..4
terms, and on symbolic tensors at the shapes the site admits (``prove_shapes``). Everything else
(batchnorm after another op, a conv with a fused relu, parameters that are not constants, a conv
result with other uses, integer or bf16 types, ``var + eps <= 0``) is left as is.

Conditions (``_site`` and ``fold_function``):
- the batchnorm normalizes axis 1 of its input (the spec's), which is the convolution's output
  channel axis; its four parameters and the conv's bias have shape exactly ``[O]``, ``O = w.shape[0]``
  (checked against the weight itself), so channel ``o``'s factor scales filter ``w[o]``: for a
  grouped or depthwise convolution too, where output channel ``o`` reads only its group's inputs
  but still through ``w[o]`` alone;
- any stride, padding (the padded zeros stay zeros: only the weights and the bias change, and the
  bias is added at every position, borders included), dilation, group and kernel;
- activation ``none`` (a relu between would not commute with a negative factor), the conv result
  used only by the batchnorm, every parameter a weight, one float element type, ``var + eps > 0``
  and the folded values finite in that type.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from taso_mlir.dialect.convert_onnx_to_taso import weight_of, Weights
from taso_mlir.dialect.errors import TasoError
from taso_mlir.dialect.handles import check_live, erase_op, ir_step, replace_uses
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.ops import create_taso_op, dense_array, find_sites, function_bodies, named, new_weight, str_value, taso_attrs
from taso_mlir.dialect.specs import SpecError, spec
from taso_mlir.passes.pipeline import FuncState, FunctionPass

FLOAT_ELEMS = ("f16", "f32", "f64")


def folded_params(w: np.ndarray, b: Optional[np.ndarray], scale: np.ndarray, bias: np.ndarray,
                  mean: np.ndarray, var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(w', b') in float64 (see the module docstring); the caller rounds them to the element type."""
    k = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    return fold_by(w.astype(np.float64), None if b is None else b.astype(np.float64), k,
                   bias.astype(np.float64), mean.astype(np.float64))


def fold_by(w: np.ndarray, b: Optional[np.ndarray], k: np.ndarray, bias: np.ndarray, mean: np.ndarray):
    """(w', b') for the per-channel factor ``k`` (``scale / sqrt(var + eps)``): ``w'[o] = w[o] k[o]`` on
    ``w``'s first axis (its output channels), ``b' = (b - mean) k + bias``. Works on symbolic arrays."""
    w2 = w * k.reshape((-1,) + (1,) * (w.ndim - 1))
    b0 = np.zeros_like(k) if b is None else b
    return w2, (b0 - mean) * k + bias


def single_use_producer(v: ir.Value, name: str) -> Optional[ir.Operation]:
    """The ``name`` op producing ``v`` where ``v`` has no other use, else None."""
    op = getattr(v.owner, "operation", v.owner)
    if not isinstance(op, ir.Operation) or op.name != name or sum(1 for _ in v.uses) != 1:
        return None
    return op


def _attrs(op: ir.Operation) -> dict:
    """The op's complete spec attributes ({} if they do not check: the site is left alone)."""
    try:
        return spec(op.name).complete_attrs({k: v for k, v in taso_attrs(op).items() if k not in ("value", "name")})
    except (SpecError, TasoError):
        return {}


def _site(bn: ir.Operation) -> Optional[tuple]:
    """(conv op, [w, b or None, scale, bias, mean, var] weight ops) if ``bn`` folds, else None."""
    if len(bn.operands) != 5:
        return None
    conv = single_use_producer(bn.operands[0], "taso.conv2d")
    if conv is None:
        return None
    if _attrs(conv).get("activation") != "none":
        return None
    conv_params = list(conv.operands)[1:]
    ws = [weight_of(v) for v in conv_params + list(bn.operands)[1:]]
    if any(w is None for w in ws):
        return None
    elems = {str(ir.ShapedType(v.type).element_type) for v in list(conv.operands) + list(bn.operands)}
    if len(elems) != 1 or elems.pop() not in FLOAT_ELEMS:
        return None
    if len(conv_params) == 1:
        ws.insert(1, None)
    return conv, ws


@ir_step(name="fold_batchnorm")
def fold_function(f: ir.Operation) -> int:
    """Fold every batchnorm site of one function (source weights left unused are removed). Returns
    the number folded."""
    sites = find_sites(f, "taso.batchnorm", _site)
    if not sites:
        return 0
    names = Weights(f.regions[0].blocks[0])
    folded = 0
    # (sites are found first; a fold erases its batchnorm and convolution, which are in no other site,
    # and of its weights those nothing uses any more, which a site not yet folded would still use)
    for bn, conv, ws in sites:
        for op in [bn, conv] + [w for w in ws if w is not None]:
            check_live(op, "an op of a batchnorm site found before the folds")
        try:
            w, b, scale, bias, mean, var = (None if op is None else dense_array(op.attributes["value"])
                                            for op in ws)
        except TasoError:
            continue  # a value numpy cannot read: leave the site as it is
        eps = _attrs(bn).get("epsilon")
        if eps is None or any(a is not None and a.shape != (w.shape[0],) for a in (b, scale, bias, mean, var)):
            continue
        if not np.all(var.astype(np.float64) + eps > 0):
            continue
        w2, b2 = folded_params(w, b, scale, bias, mean, var, eps)
        # finite as stored: a value that overflows the element type (f16) when rounded leaves the site alone
        with np.errstate(over="ignore"):
            stored = (w2.astype(w.dtype), b2.astype(w.dtype))
        if not all(np.all(np.isfinite(a)) for a in stored):
            continue
        w_op, bias_op = ws[0], ws[3]
        with ir.InsertionPoint(bn):
            nw = _new_weight(names, w_op, w2, conv.operands[1].type)
            nb = _new_weight(names, bias_op, b2, bn.operands[2].type)
            keep = {na.name: na.attr for na in named(conv.attributes) if na.name != "operandSegmentSizes"}
            new = create_taso_op("conv2d", [conv.operands[0], nw.results[0], nb.results[0]], [bn.results[0].type],
                                 {}, loc=conv.location, extra=keep)
        params = []  # the source weights, each once
        for v in list(conv.operands)[1:] + list(bn.operands)[1:]:
            if v not in params:
                params.append(v)
        replace_uses(bn.results[0], new.results[0])
        erase_op(bn)
        erase_op(conv)
        for v in params:  # the source weights nothing reads any more
            if not any(True for _ in v.uses):
                erase_op(weight_of(v))
        folded += 1
    return folded


def _new_weight(names: Weights, src: ir.Operation, value: np.ndarray, ttype: ir.Type) -> ir.Operation:
    """A weight named ``<src's name>.bn`` (made unique) holding ``value`` rounded to ``ttype``."""
    name = names.fresh(str_value(src.attributes["name"], f"{src.location}: weight name") + ".bn")
    return new_weight(name, value, ttype, loc=ir.Location.name(name, childLoc=src.location))


def fold_batchnorm(module_op: ir.Operation) -> int:
    """Run ``fold_function`` on every function with a body. Returns the number of batchnorms folded."""
    return sum(fold_function(f) for f in function_bodies(module_op))


def prove(max_terms: int = 4):
    """Z3 proof of the per-output-element identity over the reals, for windows of 1..``max_terms``
    terms: with ``inv > 0`` (``1/sqrt(var + eps)``) and symbolic s, m, beta, b, w_k, x_k,
    ``s*inv*(sum_k w_k x_k + b - m) + beta == sum_k (s*inv*w_k) x_k + ((b - m)*s*inv + beta)``.
    Returns ``z3.unsat`` (no counterexample: proved) or the first other result (``sat``/``unknown``)."""
    import z3

    s, inv, m, beta, b = z3.Reals("s inv m beta b")
    for n in range(1, max_terms + 1):
        w = z3.Reals(" ".join(f"w{k}" for k in range(n)))
        x = z3.Reals(" ".join(f"x{k}" for k in range(n)))
        conv = z3.Sum([wk * xk for wk, xk in zip(w, x)]) + b
        batchnorm = s * inv * (conv - m) + beta
        folded = z3.Sum([(s * inv * wk) * xk for wk, xk in zip(w, x)]) + ((b - m) * s * inv + beta)
        solver = z3.Solver()
        solver.add(inv > 0, batchnorm != folded)
        r = solver.check()
        if r != z3.unsat:
            return r
    return z3.sat if prove_shapes() else z3.unsat


def prove_shapes() -> list:
    """The fold at the shapes the site admits, on symbolic tensors (``verifier.symbolic``):
    ``conv2d(x, w', b')`` (``fold_by`` with a symbolic factor ``k[o] = scale[o] inv[o]``) equals the
    spec's batchnorm (axis 1, per channel ``(y - mean) inv scale + bias``) of ``conv2d(x, w, b)``, for
    convolutions with groups 1, 2 and depthwise (input channels 1 to 4, output channels 1 to 4, so
    ``C = O`` and ``C != O`` both occur), kernels 1x1, 3x1, 1x3 and 3x3, strides 1 and 2, zero
    padding at the borders, dilation 2, batch 1 and 2, with and without a conv bias. Returns the
    cases that fail (none: proved)."""
    from taso_mlir.verifier import symbolic as S

    bad = []
    for n, (c, o, g), (kh, kw), strides, pads, dil, with_b in (
            (1, (1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), False),
            (2, (2, 3, 1), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True),
            (1, (2, 4, 2), (3, 1), (2, 1), (1, 0, 1, 0), (1, 1), True),
            (1, (3, 3, 3), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
            (1, (4, 2, 2), (1, 3), (1, 2), (0, 1, 0, 1), (1, 1), True),
            (2, (2, 2, 1), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), True),
            (1, (4, 4, 4), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True)):
        x, w = S.tensor("x", (n, c, 3, 4)), S.tensor("w", (o, c // g, kh, kw))
        b = S.tensor("b", (o,)) if with_b else None
        scale, inv, beta, mean = (S.tensor(t, (o,)) for t in ("scale", "inv", "beta", "mean"))
        y = S.conv2d(x, w, b, strides, pads, dil, g)
        ch = (1, -1, 1, 1)
        batchnorm = (y - mean.reshape(ch)) * inv.reshape(ch) * scale.reshape(ch) + beta.reshape(ch)
        w2, b2 = fold_by(w, b, scale * inv, beta, mean)
        d = S.differs(S.conv2d(x, w2, b2, strides, pads, dil, g), batchnorm, [v > 0 for v in inv])
        if d is not None:
            bad.append(((n, c, o, g, kh, kw, strides, pads, dil, with_b), d))
    return bad


def _run(st: FuncState) -> None:
    st.count("batchnorms_folded", fold_function(st.f))


PASS = FunctionPass(
    "taso-fold-batchnorm",
    "Fold inference batchnorm into the convolution before it (constant parameters, no fused activation, "
    "the conv result used only by the batchnorm): conv2d(x, w*k, (b - mean)*k + bias), k = scale/sqrt(var+eps)",
    _run, {"batchnorms_folded": "batchnorms folded into convolutions"})
