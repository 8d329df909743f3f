"""Cleanup passes: they run after the search and write its result as cheaply as the IR allows (weights
folded, split and concat trees fused, elementwise and layout ops lifted over splits, flattened matmuls
restored, layout chains composed, dead ops removed)."""
