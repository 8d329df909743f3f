"""The `taso` dialect: operator specs, IRDL definition, ONNX import and export."""
