"""The accuracy gate of [quantize.accuracy]: float IR + quantized IR + data -> JSON report.

The report is written in every case; below a threshold the step then fails, naming the checks
that failed and the layers that lose the most.
"""

import json
import math
from pathlib import Path
from typing import Any

VERSION = 1
WORST_LAYERS = 5


def _finite(value):
    """JSON has no infinity: an SQNR with no noise at all is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def gate_checks(config: dict[str, Any], comparison) -> list[dict[str, Any]]:
    """One entry per configured threshold: what was measured and whether it passed."""
    checks = []
    for name, metrics in comparison.outputs.items():
        if config.get("min_sqnr_db") is not None:
            value = metrics["sqnr_db"]
            checks.append(
                {"check": f"sqnr_db of '{name}'", "value": value, "min": config["min_sqnr_db"]}
            )
        if config.get("min_top1_match") is not None:
            value = metrics["top1_match"]
            checks.append(
                {
                    "check": f"top1_match of '{name}'",
                    "value": value,
                    "min": config["min_top1_match"],
                }
            )
    if config.get("max_accuracy_drop") is not None and comparison.accuracy:
        drop = comparison.accuracy["reference"] - comparison.accuracy["candidate"]
        checks.append({"check": "accuracy drop", "value": drop, "max": config["max_accuracy_drop"]})
    for check in checks:
        value = check["value"]
        check["passed"] = value >= check["min"] if "min" in check else value <= check["max"]
    return checks


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..datasets import iter_batches
    from ..errors import UserError
    from ..fileio import atomic_write_bytes
    from ..graph_ir.quant.evaluate import compare_graphs
    from ..graph_ir.serde import load_ir
    from ..npz import read_npz

    reference = load_ir(inputs[0]).main
    candidate = load_ir(inputs[1]).main
    labels = None
    if config.get("labels"):
        arrays = read_npz(config["labels"])
        if len(arrays) != 1:
            raise UserError(
                f"{config['labels']}: expected one array of labels, found {len(arrays)}"
            )
        labels = next(iter(arrays.values())).reshape(-1)
    specs = [(v.name, v.shape) for v in reference.inputs]
    batches = list(iter_batches(config["data"], specs))
    samples = sum(len(next(iter(b.values()))) for _, b in batches)
    if labels is not None and len(labels) != samples:
        raise UserError(
            f"{config['labels']}: {len(labels)} labels for {samples} evaluation samples"
        )
    comparison = compare_graphs(reference, candidate, batches, labels)
    checks = gate_checks(config, comparison)
    report = {
        "samples": comparison.samples,
        "outputs": comparison.outputs,
        "accuracy": comparison.accuracy,
        "layers": comparison.layers,
        "gate": {"passed": all(c["passed"] for c in checks), "checks": checks},
    }
    text = json.dumps(_finite(report), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(outputs[0], text.encode())
    failed = [c for c in checks if not c["passed"]]
    if failed:
        worst = ", ".join(
            f"{layer['node']} ({layer['sqnr_db']:.1f} dB)"
            for layer in comparison.layers[:WORST_LAYERS]
        )
        problems = "; ".join(
            f"{c['check']} = {c['value']:.4g} (needs {'>=' if 'min' in c else '<='} "
            f"{c.get('min', c.get('max'))})"
            for c in failed
        )
        raise UserError(
            f"accuracy gate failed: {problems}; worst layers: {worst}; see {outputs[0]}"
        )
