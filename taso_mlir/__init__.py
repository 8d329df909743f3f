"""taso-mlir: a TASO-style tensor-graph superoptimizer built on the MLIR Python bindings.

The import package maps the repository's top-level folders: ``taso_mlir.dialect``,
``taso_mlir.passes``, ``taso_mlir.tools``, ... (see pyproject.toml).
"""

__version__ = "0.1.0"
