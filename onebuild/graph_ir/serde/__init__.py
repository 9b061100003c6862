"""Formats at the edge of the IR: ONNX import and the IR file. The only code that imports onnx."""
