"""The optimize step: IR file -> IR file after a pass preset."""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import optimize  # numeric code loads only when a step runs
    from ..graph_ir.serde import load_ir, save_ir

    save_ir(optimize(load_ir(inputs[0]), config["preset"]), outputs[0])
