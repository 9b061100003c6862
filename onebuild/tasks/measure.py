"""The measurement behind the accuracy gate: float IR + quantized IR + [quantize.accuracy] data
-> JSON of per-output metrics, label accuracy and per-layer SQNR.

The gate's thresholds are not part of it: the `evaluate` step applies them to this file, so
changing a threshold reruns only that (cheap) step and not the comparison.
"""

import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild.progress")  # quiet with --json, like progress lines


def step_config(accuracy: dict[str, Any], equalization: bool) -> dict[str, Any]:
    """The options that change the measurement: the data, the labels and whether the float
    reference is equalized as the quantized model was (so layers compare like for like)."""
    return {"data": accuracy["data"], "labels": accuracy["labels"], "equalization": equalization}


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..datasets import iter_batches
    from ..errors import UserError
    from ..fileio import atomic_write_bytes
    from ..gates import json_safe, unseen_hint
    from ..graph_ir.quant.evaluate import compare_graphs
    from ..graph_ir.quant.from_qdq import graph_is_quantized
    from ..graph_ir.serde import load_ir
    from ..npz import read_npz
    from ..progress import Progress

    reference = load_ir(inputs[0]).main
    if graph_is_quantized(reference):  # the gate would compare the model with itself
        raise UserError(
            "quantize.accuracy: the imported model came quantized, so there is no float model "
            "to gate it against; remove [quantize.accuracy] and compare the package with the "
            "float model: onebuild verify PKG --reference FLOAT.onnx -i DATA.npz"
        )
    if config.get("equalization"):
        from ..compile import QuantizeOptions, equalize

        equalize(reference, QuantizeOptions(equalization=True))
    quantized = load_ir(inputs[1])
    candidate = quantized.main
    labels = None
    if config.get("labels"):
        arrays = read_npz(config["labels"])
        if len(arrays) != 1:
            raise UserError(
                f"{config['labels']}: expected one array of labels, found {len(arrays)}"
            )
        labels = next(iter(arrays.values())).reshape(-1)
    specs = [(v.name, v.shape, v.dtype) for v in reference.inputs]
    batches = list(iter_batches(config["data"], specs))
    samples = sum(len(next(iter(b.values()))) for _, b in batches)
    if labels is not None and len(labels) != samples:
        raise UserError(
            f"{config['labels']}: {len(labels)} labels for {samples} evaluation samples"
        )
    record = None
    if "mixed_precision" in quantized.metadata:
        record = json.loads(quantized.metadata["mixed_precision"])
    seen = _seen_samples(record)
    progress = Progress("measure", samples)
    comparison = compare_graphs(reference, candidate, batches, labels, progress, seen)
    progress.finish()
    dtypes = {n.name: str(n.outputs[0].dtype) for n in candidate.nodes if n.outputs}
    promoted = set(record["promoted"]) if record else set()
    for layer in comparison.layers:  # what the gate's message and the report say of each
        layer["dtype"] = dtypes.get(layer["node"], "?")
        layer["promoted"] = layer["node"] in promoted
    report = {
        "samples": comparison.samples,
        "outputs": comparison.outputs,
        "accuracy": comparison.accuracy,
        "layers": comparison.layers,
    }
    if record is not None:
        report["mixed_precision"] = record
        if comparison.unseen:
            record["unseen"] = _unseen(comparison, seen)
            _warn_overfit(record, unseen_hint(record))
    text = json.dumps(json_safe(report), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(outputs[0], text.encode())


def _seen_samples(record: dict | None) -> int | None:
    """How many of the accuracy data's first samples mixed precision measured on (None: it
    measured on other data, or did not run)."""
    seen = (record or {}).get("measured_on") or {}
    return seen["samples"] if seen.get("data") == "accuracy" else None


def _unseen(comparison, seen: int) -> dict:
    """The outputs' SQNR on the samples mixed precision did not measure on, and the worst."""
    outputs = {name: m["sqnr_db"] for name, m in comparison.unseen.items()}
    worst = min(outputs.values(), default=math.inf)
    return {"samples": comparison.samples - seen, "outputs": outputs, "sqnr_db": worst}


def db(value: float | None) -> str:
    return "no noise" if value is None or math.isinf(value) else f"{value:.1f} dB"


def _warn_overfit(record: dict, hint: str) -> None:
    """Say how mixed precision does on the samples it did not measure on."""
    unseen, seen = record["unseen"], record["measured_on"]["samples"]
    tuned, held = db(record["sqnr_db"]), db(unseen["sqnr_db"])
    line = (
        f"evaluate: mixed precision reached {tuned} on the first {seen} samples (it tuned on "
        f"them), {held} on the {unseen['samples']} it did not see"
    )
    if record["target_met"] and unseen["sqnr_db"] < record["target_sqnr_db"]:
        logging.getLogger("onebuild").warning(
            "%s, below its %g dB target: %s", line, record["target_sqnr_db"], hint
        )
    else:
        log.info(line)
