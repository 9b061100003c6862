"""The accuracy gate of [quantize.accuracy]: float IR + quantized IR + data -> JSON report.

The report is written in every case; below a threshold the step then fails, naming the checks
that failed and the layers that lose the most.
"""

import json
import logging
from pathlib import Path
from typing import Any

WORST_LAYERS = 5
log = logging.getLogger("onebuild.progress")  # quiet with --json, like progress lines


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..datasets import iter_batches
    from ..errors import GateFailed, UserError
    from ..fileio import atomic_write_bytes
    from ..gates import described, failures, gate_checks, json_safe
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
    progress = Progress("evaluate", samples)
    comparison = compare_graphs(reference, candidate, batches, labels, progress)
    progress.finish()
    checks = gate_checks(config, comparison.outputs, comparison.accuracy)
    report = {
        "samples": comparison.samples,
        "outputs": comparison.outputs,
        "accuracy": comparison.accuracy,
        "layers": comparison.layers,
        "gate": {"passed": all(c["passed"] for c in checks), "checks": checks},
    }
    if "mixed_precision" in quantized.metadata:
        report["mixed_precision"] = json.loads(quantized.metadata["mixed_precision"])
    text = json.dumps(json_safe(report), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(outputs[0], text.encode())
    failed = [c for c in checks if not c["passed"]]
    if failed:
        worst = ", ".join(
            f"{layer['node']} ({layer['sqnr_db']:.1f} dB)"
            for layer in comparison.layers[:WORST_LAYERS]
        )
        raise GateFailed(
            f"accuracy gate failed: {failures(checks)}; worst layers: {worst}; see {outputs[0]}"
        )
    if checks:
        log.info("evaluate: accuracy gate passed: %s", described(checks))
