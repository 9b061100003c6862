"""The calibrate step (part of [quantize], mode = "full"): IR file + samples -> statistics.

Statistics do not depend on the quantized dtype, so changing only the dtype reuses them.
"""

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..compile import CalibrationOptions

log = logging.getLogger("onebuild")

DATA_KEYS = ("calibration", "random_calibration", "random_samples", "equalization")
METHOD_KEYS = {  # the options only one method reads (the others' change reuses statistics)
    "percentile": ("min_percentile", "max_percentile"),
    "moving_average": ("moving_avg_batch", "moving_avg_const"),
}


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    """The part of the [quantize] table calibration depends on: the data, and every option of
    `CalibrationOptions` but those of other methods."""
    others = {key for method, keys in METHOD_KEYS.items() if method != quantize["method"]
              for key in keys}  # fmt: skip
    options = [f.name for f in fields(CalibrationOptions) if f.name not in others]
    return {key: quantize[key] for key in (*DATA_KEYS, *options)}


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import QuantizeOptions, calibrate, equalize, options_from
    from ..graph_ir.serde import load_ir
    from ..graph_ir.serde.calibration_file import save_calibration
    from ..progress import Progress

    graph = equalize(load_ir(inputs[0]).main, options_from(QuantizeOptions, config))
    if not (config["calibration"] or config["random_calibration"]):  # the model came quantized
        save_calibration(_no_statistics(config, graph), outputs[0])
        return
    progress = Progress("calibrate")
    stats = calibrate(
        graph, _batches(config, graph), options_from(CalibrationOptions, config), progress
    )
    progress.finish()
    save_calibration(stats, outputs[0])


def shards(config: dict[str, Any], workers: int) -> int:
    """Into how many parts an executor may split the step (moving_average: order matters;
    a model that came quantized has nothing to calibrate)."""
    sampled = config["calibration"] or config["random_calibration"]
    return 1 if config["method"] == "moving_average" or not sampled else workers


def run_shard(config: dict[str, Any], inputs: list[Path], index: int, count: int):
    """Part `index` of `count` (on a worker): the statistics recorder of its samples."""
    from ..compile import QuantizeOptions, calibrate_shard, equalize, options_from
    from ..graph_ir.serde import load_ir
    from ..progress import Progress

    graph = equalize(load_ir(inputs[0]).main, options_from(QuantizeOptions, config))
    options = options_from(CalibrationOptions, config)
    progress = Progress(f"calibrate part {index + 1}/{count}")
    recorder = calibrate_shard(graph, _batches(config, graph), options, index, count, progress)
    progress.finish()
    return recorder


def merge(config: dict[str, Any], parts: list, outputs: list[Path]) -> None:
    """The statistics file of all parts: byte-identical to `run`'s."""
    from ..compile import merge_calibration, options_from
    from ..graph_ir.serde.calibration_file import save_calibration

    stats = merge_calibration(parts, options_from(CalibrationOptions, config))
    save_calibration(stats, outputs[0])


def _no_statistics(config: dict[str, Any], graph):
    """Empty statistics for a model that came quantized (it keeps its own parameters)."""
    from ..errors import UserError
    from ..graph_ir.quant.calibrate import CalibrationStats
    from ..graph_ir.quant.from_qdq import graph_is_quantized

    if not graph_is_quantized(graph):
        raise UserError(
            "quantize.calibration: full quantization needs calibration data (an npz file, a "
            "folder of npz/npy files or ONE's .h5 data)"
        )
    return CalibrationStats(config["method"], 0, {})


def _batches(config: dict[str, Any], graph):
    from ..datasets import iter_batches, random_batch

    specs = [(v.name, v.shape, v.dtype) for v in graph.inputs]
    if config["calibration"]:
        return iter_batches(config["calibration"], specs)
    log.warning(
        "calibrating on %d RANDOM samples (quantize.random_calibration = true): activation "
        "ranges will not match real data and accuracy will suffer",
        config["random_samples"],
    )
    return [random_batch(specs, config["random_samples"])]
