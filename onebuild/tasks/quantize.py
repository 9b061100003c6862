"""The quantize step: IR file (+ calibration statistics for mode "full") -> quantized IR file."""

import logging
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild")
KEYS = (
    "mode",
    "dtype",
    "granularity",
    "input_type",
    "output_type",
    "bias_correction",
    "equalization",
    "layers",
)


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    return {key: quantize[key] for key in KEYS}


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import QuantizeOptions, options_from, quantize
    from ..graph_ir.serde import load_ir, save_ir
    from ..graph_ir.serde.calibration_file import load_calibration

    options = options_from(QuantizeOptions, config)
    full = options.mode == "full"
    model = quantize(load_ir(inputs[0]), options, load_calibration(inputs[1]) if full else None)
    ops = Counter(node.op for node in model.main.nodes)
    log.info("quantize: %s", ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())))
    save_ir(model, outputs[0])
