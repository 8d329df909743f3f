"""``taso-dce``: dead-code elimination for `taso` and generic `onnx` operations.

ONNX operators are side-effect free, so an operation none of whose results is used can go. The
greedy pattern driver never deletes dead IRDL ops (they have no side-effect interface), hence this pass.
It ends the prepare passes of ``taso-search``; several cleanup passes end with it too.
"""

from taso_mlir.dialect.ops import dead_code_elimination, function_dce
from taso_mlir.passes.pipeline import FuncState, FunctionPass

__all__ = ["dead_code_elimination", "PASS"]


def _run(st: FuncState) -> None:
    function_dce(st.f)


PASS = FunctionPass("taso-dce", "Remove taso and onnx operations whose results are unused (ONNX operators "
                    "have no side effects)", _run)
