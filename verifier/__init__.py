"""taso_mlir.verifier (see DESIGN.md); not built yet."""
