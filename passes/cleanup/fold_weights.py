"""``taso-fold-weights``: the ops the search left computing only from weights become weights.

A rewrite can leave an op whose operands are all weights (a concat of two kernels that a merged
convolution reads, a transpose of a weight): computing it once, at optimization time, costs nothing at
run time. Each such op is replaced by a ``taso_folded_*`` weight holding its value, computed with the
operator's reference semantics (``passes/weights.py``); identities that reveals (x + 0, x * 1) are
dropped and dead ops removed. The result is bit-identical to what the op computes in float32 (the
reference semantics are the ones the rule proofs are checked against).
"""

from __future__ import annotations

from taso_mlir.dialect.ops import function_dce
from taso_mlir.passes.pipeline import FuncState, FunctionPass
from taso_mlir.passes.prepare.identities import drop_identities
from taso_mlir.passes.weights import fold_weights


def _run(st: FuncState) -> None:
    f = st.f
    folded = fold_weights(f)
    st.count("weights_folded", folded)
    if folded:
        st.count("identities_dropped", drop_identities(f))
    function_dce(f)


PASS = FunctionPass("taso-fold-weights", "Fold the ops computing only from weights into new weights, drop "
                    "identities, DCE", _run, {"weights_folded": "weight-only ops folded into weights", "identities_dropped": "identity ops (x + 0, x * 1) dropped"}, group="cleanup")
