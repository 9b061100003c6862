"""Build steps: one thin module per step, config in, artifacts out.

Each step module defines `VERSION` (bump it when the step's output for the same inputs changes)
and `run(config, inputs, outputs)`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import calibrate, codegen, evaluate, import_model, optimize, pack, partition, quantize


@dataclass(frozen=True)
class Step:
    name: str
    version: int
    run: Callable[[dict[str, Any], list[Path], list[Path]], None]


STEPS: dict[str, Step] = {
    "import": Step("import", import_model.VERSION, import_model.run),
    "optimize": Step("optimize", optimize.VERSION, optimize.run),
    "calibrate": Step("calibrate", calibrate.VERSION, calibrate.run),
    "quantize": Step("quantize", quantize.VERSION, quantize.run),
    "evaluate": Step("evaluate", evaluate.VERSION, evaluate.run),
    "partition": Step("partition", partition.VERSION, partition.run),
    "codegen": Step("codegen", codegen.VERSION, codegen.run),
    "pack": Step("pack", pack.VERSION, pack.run),
}
