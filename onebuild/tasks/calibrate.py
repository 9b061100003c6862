"""The calibrate step (part of [quantize], mode = "full"): IR file + samples -> statistics.

Statistics do not depend on the quantized dtype, so changing only the dtype reuses them.
"""

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild")

KEYS = (
    "calibration",
    "method",
    "random_calibration",
    "random_samples",
    "min_samples",
    "equalization",
)
METHOD_KEYS = {  # the options each method reads
    "percentile": ("min_percentile", "max_percentile"),
    "moving_average": ("moving_avg_batch", "moving_avg_const"),
}


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    """The part of the [quantize] table calibration depends on."""
    keys = KEYS + METHOD_KEYS.get(quantize["method"], ())
    return {key: quantize[key] for key in keys}


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import CalibrationOptions, QuantizeOptions, calibrate, equalize, options_from
    from ..datasets import iter_batches, random_batch
    from ..graph_ir.serde import load_ir
    from ..graph_ir.serde.calibration_file import save_calibration
    from ..progress import Progress

    graph = equalize(load_ir(inputs[0]).main, options_from(QuantizeOptions, config))
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
    progress = Progress("calibrate")
    stats = calibrate(graph, batches, options_from(CalibrationOptions, config), progress)
    progress.finish()
    save_calibration(stats, outputs[0])
