"""taso_mlir.benchmarks (see DESIGN.md); not built yet."""
