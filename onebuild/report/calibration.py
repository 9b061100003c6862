"""The calibration histograms of the report: which values to draw (the layers that lose the
most, else the coarsest quantization steps) and their counts under the ranges used."""

from pathlib import Path

import numpy as np

from ..datasets import iter_batches
from ..graph_ir.quant.histograms import value_histograms
from ..graph_ir.quant.params import activation_params
from ..graph_ir.serde import load_ir
from ..graph_ir.serde.calibration_file import load_calibration

BINS = 64
MAX_VALUES = 6
MAX_SAMPLES = 256  # counted for the histograms

Histogram = tuple[str, np.ndarray, np.ndarray, tuple[float, float]]


def worst_values(
    model: Path, ranges: dict[str, tuple[float, float]], accuracy: dict | None, dtype: str
) -> list[tuple[str, str]]:
    """Up to MAX_VALUES (label, value name): the outputs of the worst-SQNR layers when the
    build evaluated accuracy, else the values with the widest ranges (the coarsest steps in
    `dtype`)."""
    graph = load_ir(model).main
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
    model: Path, stats_file: Path, data: str | None, dtype: str, accuracy: dict | None
) -> tuple[str, int, list[Histogram]]:
    """(method, samples counted, histograms) of the chosen values, counted again on the
    calibration data (its first MAX_SAMPLES samples) in bins around the range each was
    quantized with."""
    stats = load_calibration(stats_file)
    ranges = stats.ranges_for(dtype)
    chosen = worst_values(model, ranges, accuracy, dtype)
    if not chosen or data is None:
        return stats.method, 0, []
    edges = {}
    for _, value in chosen:
        lo, hi = ranges[value]
        pad = max(hi - lo, 1e-6) * 0.1
        edges[value] = np.linspace(lo - pad, hi + pad, BINS + 1)
    graph = load_ir(model).main
    read = [0]

    def batches():
        for where, batch in iter_batches(data, [(v.name, v.shape, v.dtype) for v in graph.inputs]):
            read[0] += len(next(iter(batch.values()), ()))
            yield where, batch

    counts = value_histograms(graph, batches(), edges, MAX_SAMPLES)
    items = [(label, edges[v], counts[v], ranges[v]) for label, v in chosen]
    return stats.method, min(read[0], MAX_SAMPLES), items
