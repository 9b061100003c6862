"""Per-channel activation layers of the real models in onnxruntime, layer by layer. Prints JSON,
one entry per model.

Each model is calibrated on the bench's calibration images and quantized to uint8 with
`activation_granularity = "channel"`; every layer that reads or writes a value quantized per
channel is exported alone as QDQ ONNX and run in onnxruntime (default graph optimizations) on
the integer reference's own inputs (the first calibration image), and its codes compared with
the reference's: per kind of layer (QConv reading its input with the scales folded into its
weights, other QConv, QLookup), the layers, the largest code difference and how many layers are
within 1 code. Also the edges chosen: those into depthwise convolutions only, and the others.

    python bench/qdq_layers.py [--samples 4] [--models layout_cdla,...]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from real_models import MODELS, fixed_export, samples

from onebuild.compile import QuantizeOptions, optimize, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model, node_alone
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.channel_activations import (
    chosen_edges,
    depthwise,
    folds_scales,
    per_channel_value,
)
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.onnx_export import export_onnx


def _kind(node) -> str:
    if node.op == "QConv":
        return "QConv_folded" if folds_scales(node) else "QConv"
    return node.op


def ort_code_differences(quantized: Graph, feeds: dict, kind, optimized: bool = True) -> dict:
    """Each layer `kind(node)` names (None: skipped) exported alone as QDQ ONNX and run in
    onnxruntime on the integer reference's own inputs: per kind, the layers, the largest code
    difference from the reference and how many are within 1 code. `optimized`: onnxruntime's
    graph optimizations on."""
    trace = {}
    Interpreter(quantized, observer=lambda v, a: trace.__setitem__(v.name, a)).run_batch(feeds)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    worst: dict[str, list[int]] = {}
    for node in quantized.nodes:
        name = kind(node)
        if name is None:
            continue
        proto = export_onnx(Model([node_alone(node)])).SerializeToString()
        session = ort.InferenceSession(proto, options, ["CPUExecutionProvider"])
        inputs = {v.name: trace[v.name] for v in node.inputs if v is not None and not v.is_const}
        (theirs,) = session.run(None, inputs)
        diff = np.abs(theirs.astype(np.int64) - trace[node.output.name].astype(np.int64))
        worst.setdefault(name, []).append(int(diff.max()))
    return {
        name: {"layers": len(d), "max_code_difference": max(d), "within_1": sum(x <= 1 for x in d)}
        for name, d in sorted(worst.items())
    }


def layer_differences(quantized: Graph, feeds: dict) -> dict:
    """Per-channel layers alone in onnxruntime against the integer reference, in codes."""

    def kind(node) -> str | None:
        return _kind(node) if any(map(per_channel_value, (*node.inputs, *node.outputs))) else None

    return ort_code_differences(quantized, feeds, kind)


def measure(spec, count: int, work: Path) -> dict:
    path = fixed_export(spec, work)
    calib, _ = samples(spec, count)
    float_graph = optimize(load_onnx(path)).main
    stats = calibrate(float_graph, [("calibration", {float_graph.inputs[0].name: calib})])
    edges = chosen_edges(float_graph, lambda node: "uint8", stats.channel_ranges)
    only_depthwise = sum(all(map(depthwise, edge.readers)) for edge, _ in edges)
    options = QuantizeOptions(activation_granularity="channel")
    quantized = quantize(optimize(load_onnx(path)), options, stats).main
    feeds = {float_graph.inputs[0].name: calib[:1]}
    return {
        "model": spec.name,
        "edges_depthwise_only": only_depthwise,
        "edges_other_readers": len(edges) - only_depthwise,
        **layer_differences(quantized, feeds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="calibration samples")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    names = set(filter(None, args.models.split(",")))
    for spec in MODELS:
        if not names or spec.name in names:
            with tempfile.TemporaryDirectory() as folder:
                print(json.dumps(measure(spec, args.samples, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
