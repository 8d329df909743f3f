"""taso_mlir.verifier: the operator axioms, their validation, the shape rules and the shape-aware Z3 proofs (docs/rules.md)."""
