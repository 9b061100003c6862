"""Partition strategies on models the NPU only partly supports. Prints JSON, one entry per model.

For each model (uint8, calibrated on seeded uniform inputs, trix-m): the estimated end-to-end
latency of the `capability` and `cost` partitions (target performance model per NPU part plus
its invocation, host CPU model per CPU op, CPU<->NPU handoffs), their part counts, the ratio
cost / capability (never above 1 by construction) and the time each placement took.

Usage: python bench/partition.py [model ...]   (light models by name, or "mixed")
"""

import json
import sys
import time

import numpy as np

from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.model_io import with_quantized_io
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.targets import load_target
from onebuild.targets.placement import Options, place

MODELS = ["inception_v1", "shufflenet", "densenet121", "bvlc_alexnet", "squeezenet"]


def quantized(name: str, rng):
    model = import_onnx(light_model(name, seed=1, expose_logits=True))
    run_preset(model)
    graph = model.main
    data = {v.name: rng.random((2, *v.shape), dtype=np.float32) for v in graph.inputs}
    ranges = calibrate(graph, data).ranges
    return with_quantized_io(quantize_graph(graph, ranges, QuantConfig("uint8")))


def main(names: list[str]) -> None:
    rng = np.random.default_rng(0)
    target = load_target("trix_sim")
    results = []
    for name in names:
        graph = quantized(name, rng)
        entry = {"model": name, "nodes": len(graph.nodes)}
        for strategy in ("capability", "cost"):
            start = time.perf_counter()
            placement = place(graph, name, target, Options("trix", "trix-m", strategy=strategy))
            entry[strategy] = {
                "microseconds": placement.latency["microseconds"],
                "handoff_microseconds": placement.latency["handoffs"],
                "parts": len(placement.partitioning.parts),
                "npu_parts": sum(p.backend == "trix" for p in placement.partitioning.parts),
                "cpu_fallback_nodes": len(placement.fallbacks),
                "placement_seconds": round(time.perf_counter() - start, 3),
            }
            if strategy == "cost":
                entry[strategy]["explanation"] = placement.explanation
        ratio = entry["cost"]["microseconds"] / entry["capability"]["microseconds"]
        entry["cost_over_capability"] = round(ratio, 4)
        results.append(entry)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
