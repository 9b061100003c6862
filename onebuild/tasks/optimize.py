"""The optimize step: IR file -> IR file after a pass preset."""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..graph_ir.passes import run_preset  # numeric code loads only when a step runs
    from ..graph_ir.serde import load_ir, save_ir

    model = load_ir(inputs[0])
    run_preset(model, config["preset"])
    save_ir(model, outputs[0])
