"""The calibrate step (part of [quantize], mode = "full"): IR file + samples -> statistics.

Statistics do not depend on the quantized dtype, so changing only the dtype reuses them.
"""

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild")

OPTIONS = {  # recipe key -> observer argument, per method
    "percentile": {"min_percentile": "lo_percent", "max_percentile": "hi_percent"},
    "moving_average": {"moving_avg_batch": "batch", "moving_avg_const": "constant"},
}
KEYS = ("calibration", "method", "random_calibration", "random_samples", "min_samples")


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    """The part of the [quantize] table calibration depends on."""
    config = {key: quantize[key] for key in KEYS}
    config["options"] = {key: quantize[key] for key in OPTIONS.get(quantize["method"], {})}
    return config


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..datasets import iter_batches, random_batch
    from ..graph_ir.quant.calibrate import calibrate
    from ..graph_ir.serde import load_ir
    from ..graph_ir.serde.calibration_file import save_calibration
    from ..progress import Progress

    graph = load_ir(inputs[0]).main
    specs = [(v.name, v.shape) for v in graph.inputs]
    if config["calibration"]:
        batches = iter_batches(config["calibration"], specs)
    else:
        log.warning(
            "calibrating on %d RANDOM samples (quantize.random_calibration = true): activation "
            "ranges will not match real data and accuracy will suffer",
            config["random_samples"],
        )
        batches = [random_batch(specs, config["random_samples"])]
    names = OPTIONS.get(config["method"], {})
    options = {names[key]: value for key, value in config["options"].items()}
    progress = Progress("calibrate")
    stats = calibrate(graph, batches, config["method"], options, config["min_samples"], progress)
    progress.finish()
    save_calibration(stats, outputs[0])
