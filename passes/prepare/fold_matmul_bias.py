"""Folding a bias add into the matmul it follows: ``ewadd(matmul(x, W), b) -> matmul(x, W, b)``.

Where a ``taso.matmul`` without activation or bias has one use, an ``ewadd`` with a weight ``b`` of
shape ``[N]`` (one value per output column: a Gemm's C, a linear layer's bias), the add is the
matmul's bias operand by the operator's definition (``dialect.specs``: ``x @ W + b``, then the
activation). ``taso-search`` does this before the search, so that the ``matmul-bias`` rules (merging
biased matmuls, fusing relu into them) see the bias, and a Gemm's or a linear layer's bias add is no
longer an op of its own between the matmul and what follows. The export writes a biased matmul as
``Gemm`` (2-D) or ``MatMul`` + ``Add``, which is what it came from.

Numerics: the same sums in the same order except for where the bias is added (onnxruntime's Gemm may
start its accumulation from C); tested against the reference semantics and in onnxruntime
(``test/unit/test_matmul_bias.py``).

Identity: ``ewadd(matmul(x, W), b)[..., i, j] = sum_k x[..., i, k] W[..., k, j] + b[j]``, which is the
biased matmul's element (``ewadd(b, matmul(x, W))`` too: IEEE addition commutes).

Conditions (``fuse_matmul_bias``'s site check):
- ``b`` is a weight of shape exactly ``[N]``, ``N`` the matmul result's last dimension: numpy
  broadcasting aligns a rank-1 operand with the last axis, so ``b[j]`` is added to column ``j`` of
  every row and batch, whatever the other dimensions (``M = N`` included); any other shape (``[1]``
  with ``N > 1``, ``[1, N]``, ``[M, 1]``, ``[M, N]``) is left alone (the biased matmul takes ``[N]``);
- the add's result has the matmul result's type (no broadcasting beyond it, one element type);
- the matmul has no bias and activation ``none`` (the bias is added before the activation), any
  ranks of ``x`` and ``W`` (batch axes broadcast), and its result no other use.
``prove()`` proves the identity on symbolic tensors at every such shape within small bounds.
"""

from __future__ import annotations

from taso_mlir.dialect.convert_onnx_to_taso import weight_of
from taso_mlir.dialect.mlir import ir
from taso_mlir.dialect.handles import each_live, erase_op, ir_step, ops_of, replace_uses
from taso_mlir.dialect.ops import create_taso_op, taso_attrs
from taso_mlir.passes.ir_util import static_shape, defining_op
from taso_mlir.passes.pipeline import FuncState, FunctionPass



def _gains(cost_model, m: ir.Operation, b: ir.Value, add: ir.Operation) -> bool:
    """The biased matmul costs no more than the matmul and the add apart (under ``cost_model``)."""
    from taso_mlir.passes.cost.oracle import OpSig

    x, w = m.operands[0], m.operands[1]
    xs, ws, ys, bs = static_shape(x), static_shape(w), static_shape(m.results[0]), static_shape(b)
    dtype = str(ir.RankedTensorType(m.results[0].type).element_type)
    wx, ww = weight_of(x) is not None, weight_of(w) is not None
    act = (("activation", "none"),)
    apart = (cost_model.cost(OpSig("matmul", act, (tuple(xs), tuple(ws)), (tuple(ys),), dtype, False, (wx, ww)))
             + cost_model.cost(OpSig("ewadd", (), (tuple(ys), tuple(bs)), (tuple(ys),), dtype, False, (False, True))))
    fused = cost_model.cost(OpSig("matmul", act, (tuple(xs), tuple(ws), tuple(bs)), (tuple(ys),), dtype, False,
                                  (wx, ww, True)))
    return fused <= apart


@ir_step
def fuse_matmul_bias(f: ir.Operation, cost_model=None) -> int:
    """Fold each bias add into its matmul (module docstring); with a cost model, only where the biased
    matmul costs no more than the two ops apart (measured on the CPU, a 3-D MatMul + Add can time
    slower as one model than its parts). Returns the number folded."""
    block = f.regions[0].blocks[0]
    done = 0
    # (a list taken first: a fold erases the add it is at and the matmul before it, which the walk has
    # passed, as its result is the add's operand)
    for add in each_live(ops_of(block)):
        if add.name != "taso.ewadd" or len(add.operands) != 2:
            continue
        for side in (0, 1):
            m, b = defining_op(add.operands[side]), add.operands[1 - side]
            if m is None or m.name != "taso.matmul" or len(m.operands) != 2:
                continue
            if taso_attrs(m).get("activation") != "none" or sum(1 for _ in m.results[0].uses) != 1:
                continue
            out, bs = static_shape(m.results[0]), static_shape(b)
            if not bias_fits(out, bs) or weight_of(b) is None or add.results[0].type != m.results[0].type:
                continue
            if cost_model is not None and (static_shape(m.operands[0]) is None or static_shape(m.operands[1]) is None
                                           or not _gains(cost_model, m, b, add)):
                continue
            with ir.InsertionPoint(add):
                fused = create_taso_op("matmul", [m.operands[0], m.operands[1], b], [m.results[0].type],
                                       {"activation": "none"}, loc=m.location)
            replace_uses(add.results[0], fused.results[0])
            erase_op(add)
            erase_op(m)
            done += 1
            break
    return done


def bias_fits(out_shape: list, bias_shape: list) -> bool:
    """The site check's shape condition: a bias of ``bias_shape`` added to a matmul result of
    ``out_shape`` is that matmul's bias operand."""
    return out_shape is not None and bias_shape == [out_shape[-1]]


def prove() -> list:
    """The identity on symbolic tensors (``verifier.symbolic``) at every shape the site check admits
    within small bounds: ``x`` of shape [M, K], [B, M, K] or [1, M, K], ``W`` [K, N] or [B, K, N] (the
    batch axes broadcast), M, K, N in 1..3 and B = 2 (so M = N, K = N and 1-sized axes occur), and
    every bias shape of up to 2 axes of sizes 1, M, N that broadcasts to the result without changing
    its shape: where ``bias_fits``, ``matmul(x, W) + b`` (numpy broadcasting: ``ewadd``) equals the
    biased matmul written per element, ``sum_k x[.., i, k] W[.., k, j] + b[j]``, in both operand
    orders (a bias of shape [M] where M = N is admitted, and it is right: broadcasting reads it per
    column). Returns the cases that fail (none: proved), among them any admitted bias shape other
    than [N]."""
    import itertools

    import numpy as np

    from taso_mlir.verifier import symbolic as S

    bad = []
    for xt, wt in ((("M", "K"), ("K", "N")), (("B", "M", "K"), ("K", "N")), (("1", "M", "K"), ("B", "K", "N")),
                   (("B", "M", "K"), ("B", "K", "N"))):
        for M, K, N in itertools.product((1, 2, 3), repeat=3):
            env = {"B": 2, "M": M, "K": K, "N": N, "1": 1}
            x, W = S.tensor("x", [env[d] for d in xt]), S.tensor("W", [env[d] for d in wt])
            prod = np.matmul(x, W)
            out = list(prod.shape)
            for bs in sorted({(n,) for n in (1, M, N)} | {(m, n) for m in (1, M) for n in (1, N)}):
                try:
                    fits = list(np.broadcast_shapes(tuple(out), bs)) == out
                except ValueError:
                    fits = False
                if not fits or not bias_fits(out, list(bs)):
                    continue
                if list(bs) != [N]:
                    bad.append(("admitted a bias that is not [N]", out, bs))
                    continue
                b = S.tensor("b", bs)
                want = np.empty(out, dtype=object)
                xb, Wb = np.broadcast_to(x, out[:-2] + [M, K]), np.broadcast_to(W, out[:-2] + [K, N])
                for idx in np.ndindex(*out):
                    *lead, i, j = idx
                    want[idx] = sum((xb[tuple(lead) + (i, k)] * Wb[tuple(lead) + (k, j)] for k in range(K)), 0) + b[j]
                for got in (prod + b, b + prod):
                    d = S.differs(got, want)
                    if d is not None:
                        bad.append(("bias", xt, wt, (M, K, N), bs, d))
    return bad


def _run(st: FuncState) -> None:
    st.count("matmul_biases_fused", fuse_matmul_bias(st.f, st.cost_model))


PASS = FunctionPass("taso-fold-matmul-bias", "Fold bias adds into the matmuls before them where the biased "
                    "matmul costs no more under the cost model", _run, {"matmul_biases_fused": "bias adds folded into matmuls"},
                    needs_cost_model=True)
