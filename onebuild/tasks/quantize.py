"""The quantize step: IR file (+ calibration statistics for mode "full") -> quantized IR file.

In mode "full" the step also reads samples: mixed precision measures on the [quantize.accuracy]
data (else the calibration data), and without an accuracy gate a few of them are compared with
the float model, so an unusable model never passes silently; learned weight rounding and
empirical bias correction fit on the calibration data (else the accuracy data), so a gate
measures them on samples they did not see.
"""

import json
import logging
import math
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..compile import QuantizeOptions

log = logging.getLogger("onebuild")
CHECK_SAMPLES = 8
ROUNDING_SAMPLES = 32  # learned weight rounding
MIN_SQNR_DB = 20.0  # below this, an ungated build warns
WORST_LAYERS = 3


def step_config(quantize: dict[str, Any]) -> dict[str, Any]:
    """Every option of `QuantizeOptions` (a recipe without one is a KeyError, not a silent
    default) and the sample files the step reads."""
    names = [f.name for f in fields(QuantizeOptions)]
    config = {name: quantize[name] for name in names if name != "channel_dtypes"}
    if "channel_dtypes" in quantize:  # set by the plan from the [codegen] target
        config["channel_dtypes"] = quantize["channel_dtypes"]
    accuracy = quantize.get("accuracy")
    config["check_sqnr"] = accuracy is None
    config["measure_on"] = accuracy["data"] if accuracy else quantize["calibration"]
    # learned rounding and empirical bias correction fit on the calibration data, so an
    # accuracy gate measures them on samples they did not see
    config["fit_on"] = quantize["calibration"] or config["measure_on"]
    return config


def _measures(config: dict[str, Any]) -> bool:
    return bool(config["mixed_precision"] or config["check_sqnr"])


def _fits(config: dict[str, Any]) -> bool:
    return config["weight_rounding"] != "nearest" or config["bias_correction"] == "empirical"


def measured_data(config: dict[str, Any]) -> list[Path]:
    """The sample files the step reads (inputs of its task): to measure, and to fit on."""
    if config["mode"] != "full":
        return []
    paths = [config["measure_on"]] if _measures(config) else []
    paths += [config["fit_on"]] if _fits(config) else []
    return [Path(p) for p in dict.fromkeys(paths) if p]


def _warn_tensor_edges(config: dict[str, Any]) -> None:
    """Per-channel activations asked for in dtypes (the recipe's, or of [[quantize.layers]])
    that the [codegen] target lowers per tensor only."""
    lowered = config.get("channel_dtypes")
    asked = config["activation_granularity"] == "channel" and config["mode"] == "full"
    if not asked or lowered is None:
        return
    dtypes = [config["dtype"], *(layer["dtype"] for layer in config["layers"] if layer["dtype"])]
    kept = sorted({d for d in dtypes if d not in lowered and d != "float32"})
    if kept:
        log.warning(
            'quantize: activation_granularity = "channel": the [codegen] target lowers '
            "per-channel activations in %s only, so %s edges stay per tensor",
            " and ".join(lowered) or "no dtype",
            " and ".join(kept),
        )


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import options_from, quantize
    from ..datasets import first_samples
    from ..graph_ir.serde import load_ir, save_ir
    from ..graph_ir.serde.calibration_file import load_calibration

    options = options_from(QuantizeOptions, config)
    _warn_tensor_edges(config)
    model = load_ir(inputs[0])
    float_graph = model.main
    samples, fit = [], []
    specs = [(v.name, v.shape, v.dtype) for v in float_graph.inputs]
    if measured_data(config) and _measures(config) and config["measure_on"]:
        count = options.mixed_precision.samples if options.mixed_precision else CHECK_SAMPLES
        samples = first_samples(config["measure_on"], specs, count)
    if measured_data(config) and _fits(config) and config["fit_on"]:
        fit = first_samples(config["fit_on"], specs, ROUNDING_SAMPLES)
        if config["fit_on"] == config["measure_on"] and not config["check_sqnr"]:
            log.warning(
                "quantize: learned rounding and empirical bias correction fit on the "
                "[quantize.accuracy] data (no calibration data), so the gate measures them on "
                "samples they saw: set quantize.calibration for an unbiased gate"
            )
    stats = load_calibration(inputs[1]) if options.mode == "full" else None
    model = quantize(model, options, stats, samples, fit)
    ops = Counter(node.op for node in model.main.nodes)
    log.info("quantize: %s", ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())))
    if "mixed_precision" in model.metadata:
        record = json.loads(model.metadata["mixed_precision"])
        record["measured_on"] = {
            "data": "calibration" if config["check_sqnr"] else "accuracy",
            "samples": sum(len(next(iter(batch.values()))) for batch in samples),
        }
        record["max_high_precision_mac_fraction"] = (
            options.mixed_precision.max_high_precision_mac_fraction
        )
        model.metadata["mixed_precision"] = json.dumps(record, sort_keys=True)
        _report_mixed_precision(record)
    elif config["check_sqnr"] and samples:
        record = _check_sqnr(float_graph, model.main, samples)
        model.metadata["sqnr_check"] = json.dumps(record, sort_keys=True)
    save_ir(model, outputs[0])


def _report_mixed_precision(record: dict) -> None:
    from ..gates import search_limit

    reached, seen = record["sqnr_db"], record["measured_on"]
    line = (
        f"quantize: mixed precision promoted {len(record['promoted'])} layer(s) to "
        f"{record['dtype']} ({100 * record['high_precision_mac_fraction']:.1f} % of MACs); "
        f"worst output {'∞' if reached is None else f'{reached:.1f}'} dB on {seen['samples']} "
        f"{seen['data']} samples, target {record['target_sqnr_db']} dB"
    )
    if not record["target_met"]:
        log.warning("%s NOT met: %s", line, search_limit(record))
        return
    logging.getLogger("onebuild.progress").info(line)  # shown unless --json
    if seen["data"] == "accuracy":
        log.warning(
            "quantize: mixed precision tuned on the first %d [quantize.accuracy] samples, which "
            "the gate measures again (it reports the SQNR on the others when the data has more)",
            seen["samples"],
        )


def _check_sqnr(float_graph, quantized, samples) -> dict:
    """Warn when an output of the quantized model is below MIN_SQNR_DB on a few samples; the
    measurement (samples, each output's and each layer's SQNR, worst first) for the model's
    metadata "sqnr_check", which the report draws."""
    from ..gates import first_steps, json_safe
    from ..graph_ir.quant.evaluate import compare_graphs

    comparison = compare_graphs(float_graph, quantized, [("samples", b) for b in samples])
    dtypes = {n.name: str(n.outputs[0].dtype) for n in quantized.nodes if n.outputs}
    record = {
        "data": "calibration",
        "samples": comparison.samples,
        "outputs": {k: v["sqnr_db"] for k, v in comparison.outputs.items()},
        "layers": [
            {"node": layer["node"], "op": layer["op"], "sqnr_db": layer["sqnr_db"],
             "dtype": dtypes.get(layer["node"], "?")}
            for layer in comparison.layers
        ],
    }  # fmt: skip
    low = {k: v["sqnr_db"] for k, v in comparison.outputs.items() if v["sqnr_db"] < MIN_SQNR_DB}
    if not low:
        return json_safe(record)
    outputs = ", ".join(f"'{name}' {below(db)} dB" for name, db in sorted(low.items()))
    worst = ", ".join(
        f"{layer['node']} ({layer['sqnr_db']:.1f} dB)" for layer in comparison.layers[:WORST_LAYERS]
    )
    log.warning(
        "quantize: low accuracy on %d calibration samples: output SQNR %s (below %.0f dB); "
        "worst layers: %s. Try %s; [quantize.accuracy] gates the build",
        comparison.samples,
        outputs,
        MIN_SQNR_DB,
        worst,
        first_steps(_channel_hint(float_graph, quantized)),
    )
    return json_safe(record)


def below(db: float) -> str:
    """A dB figure under a threshold, to one decimal rounded down (19.97 is not "20.0")."""
    return f"{math.floor(db * 10) / 10:.1f}"


def _channel_hint(float_graph, quantized) -> str:
    """The per-channel activation setting, when the model has depthwise edges it does not use."""
    from ..graph_ir.quant.channel_activations import depthwise_edges

    used = any(
        v.quant is not None and v.quant.axis is not None for n in quantized.nodes for v in n.outputs
    )
    if used or not depthwise_edges(float_graph):
        return ""
    return 'activation_granularity = "channel" (depthwise inputs), '
