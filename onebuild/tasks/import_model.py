"""The import step: ONNX, circle or tflite model -> IR file."""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..graph_ir.serde import load_source, save_ir  # onnx loads only when a step runs

    model = load_source(inputs[0], config.get("input_shapes"), config.get("constants"))
    save_ir(model, outputs[0])
