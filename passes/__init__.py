"""taso-mlir passes and their registry (see registry.py for embedding them in a PassManager)."""

from taso_mlir.passes.registry import REGISTRY, add_taso_pass, build_pass_manager, run_pass_manager

__all__ = ["REGISTRY", "add_taso_pass", "build_pass_manager", "run_pass_manager"]
