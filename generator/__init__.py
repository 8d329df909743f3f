"""taso_mlir.generator: graph enumeration, fingerprints, candidate pruning, the shape sampler and the rules files (docs/rules.md)."""
