"""Prepare passes: they run before the search and put the graph into the form the rules match
(constants folded, generic ops raised to `taso` ops, scales and batchnorms folded into weights, repeats
merged, activations and biases fused). Each module is one pass (or two close ones)."""
