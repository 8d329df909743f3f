"""taso_mlir.generator (see DESIGN.md); not built yet."""
