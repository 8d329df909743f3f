"""``taso-dce``: dead-code elimination for `taso` and generic `onnx` operations.

ONNX operators are side-effect free, so an operation none of whose results is used can go. The
greedy pattern driver never deletes dead IRDL ops (they have no side-effect interface), hence this pass.
"""

from taso_mlir.dialect.ops import dead_code_elimination

__all__ = ["dead_code_elimination"]
