"""The calibration histograms of the report: which values to draw (the layers that lose the
most, else the coarsest quantization steps) and their counts under the ranges used."""

from pathlib import Path

import numpy as np

from ..datasets import iter_batches
from ..graph_ir.ir import Graph
from ..graph_ir.macs import graph_macs
from ..graph_ir.quant.histograms import value_histograms
from ..graph_ir.quant.params import activation_params
from ..graph_ir.serde.calibration_file import load_calibration

BINS = 64
MAX_VALUES = 6
MAX_SAMPLES = 256  # counted for the histograms
MAC_BUDGET = 1e9  # of the float model's runs: a detector counts 2 samples, the digits CNN 256

Histogram = tuple[str, np.ndarray, np.ndarray, tuple[float, float]]


def worst_values(
    graph: Graph, ranges: dict[str, tuple[float, float]], accuracy: dict | None, dtype: str
) -> list[tuple[str, str]]:
    """Up to MAX_VALUES (label, value name): the outputs of the worst-SQNR layers when the
    build evaluated accuracy, else the values with the widest ranges (the coarsest steps in
    `dtype`)."""
    output_of = {n.name: n.outputs[0].name for n in graph.nodes if n.outputs}
    chosen: list[tuple[str, str]] = []
    if accuracy:
        for layer in accuracy.get("layers", []):
            value = output_of.get(layer["node"])
            if layer["sqnr_db"] is None:  # no noise at all: a float32 or exact layer
                continue
            if value in ranges and value not in (v for _, v in chosen):
                chosen.append((f"{layer['node']}: {layer['sqnr_db']:.1f} dB", value))
    else:
        widest = sorted(ranges, key=lambda v: (-(ranges[v][1] - ranges[v][0]), v))
        steps = {v: activation_params(*ranges[v], dtype).scale[0] for v in widest[:MAX_VALUES]}
        chosen = [(f"{v}: step {steps[v]:.3g}", v) for v in widest[:MAX_VALUES]]
    return chosen[:MAX_VALUES]


def calibration_histograms(
    graph: Graph, stats_file: Path, data: str | None, dtype: str, accuracy: dict | None
) -> tuple[str, int, list[Histogram]]:
    """(method, samples counted, histograms) of the chosen values of the float `graph`,
    counted again on the calibration data in bins around the range each was quantized with:
    its first samples, MAX_SAMPLES or as many as MAC_BUDGET multiply-accumulates run (at
    least one)."""
    stats = load_calibration(stats_file)
    ranges = stats.ranges_for(dtype)
    chosen = worst_values(graph, ranges, accuracy, dtype)
    if not chosen or data is None:
        return stats.method, 0, []
    edges = {}
    for _, value in chosen:
        lo, hi = ranges[value]
        pad = max(hi - lo, 1e-6) * 0.1
        edges[value] = np.linspace(lo - pad, hi + pad, BINS + 1)
    limit = int(max(1, min(MAX_SAMPLES, MAC_BUDGET // max(graph_macs(graph), 1))))
    read = [0]

    def batches():
        for where, batch in iter_batches(data, [(v.name, v.shape, v.dtype) for v in graph.inputs]):
            read[0] += len(next(iter(batch.values()), ()))
            yield where, batch

    counts = value_histograms(graph, batches(), edges, limit)
    items = [(label, edges[v], counts[v], ranges[v]) for label, v in chosen]
    return stats.method, min(read[0], limit), items
