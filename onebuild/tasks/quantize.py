"""The quantize step: IR file (+ calibration statistics for mode "full") -> quantized IR file."""

import logging
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild")
KEYS = ("mode", "dtype", "granularity", "input_type", "output_type", "bias_correction", "layers")


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    return {key: quantize[key] for key in KEYS}


def quant_config(config: dict[str, Any]):
    from ..graph_ir.quant.config import LayerOverride, QuantConfig

    layers = tuple(
        LayerOverride(tuple(layer["names"]), layer["dtype"], layer["granularity"])
        for layer in config["layers"]
    )
    return QuantConfig(
        config["dtype"],
        config["granularity"],
        config["input_type"],
        config["output_type"],
        layers,
        config["bias_correction"],
    )


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..graph_ir.quant.quantize_graph import quantize_graph
    from ..graph_ir.quant.weight_only import weight_only_quantize
    from ..graph_ir.serde import load_ir, save_ir
    from ..graph_ir.serde.calibration_file import load_calibration

    model = load_ir(inputs[0])
    settings = quant_config(config)
    if config["mode"] == "weight_only":
        count = weight_only_quantize(model.main, settings)
        log.info("quantize: %d weight tensor(s) stored as %s", count, config["dtype"])
    else:
        stats = load_calibration(inputs[1])
        ranges = stats.ranges_for(config["dtype"])
        model.graphs[0] = quantize_graph(model.main, ranges, settings, stats.channel_means())
        ops = Counter(node.op for node in model.main.nodes)
        log.info("quantize: %s", ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())))
    save_ir(model, outputs[0])
