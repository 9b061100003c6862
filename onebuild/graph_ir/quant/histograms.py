"""Histograms of chosen float values over sample batches (for pictures of calibration ranges).

Calibration keeps a histogram only for the `mse` method; the other methods keep a range. To draw
a value's distribution under the range it was quantized with, its activations are counted again
in fixed bins, one chunk of samples at a time (memory stays bounded).
"""

from collections.abc import Iterable, Mapping

import numpy as np

from ..interpreter import Interpreter
from ..ir import Graph

Batch = Mapping[str, np.ndarray]


def value_histograms(
    graph: Graph,
    batches: Iterable[tuple[str, Batch]],
    edges: Mapping[str, np.ndarray],
    max_samples: int = 256,
    chunk: int = 32,
) -> dict[str, np.ndarray]:
    """Counts of each named value's elements in the bins `edges[name]` over the first
    `max_samples` samples; elements outside the bins count in the first or last bin."""
    counts = {name: np.zeros(len(e) - 1, np.int64) for name, e in edges.items()}

    def observe(value, array: np.ndarray) -> None:
        bins = edges.get(value.name)
        if bins is None or array.dtype.kind != "f":
            return
        data = np.clip(array.ravel(), bins[0], bins[-1])
        counts[value.name] += np.histogram(data, bins)[0]

    interpreter = Interpreter(graph, observer=observe)
    seen = 0
    for _, batch in batches:
        total = len(next(iter(batch.values()), ()))
        for start in range(0, total, chunk):
            if seen >= max_samples:
                return counts
            stop = min(start + chunk, total, start + max_samples - seen)
            part = {v.name: batch[v.name][start:stop] for v in graph.inputs}
            with np.errstate(over="ignore", invalid="ignore"):
                interpreter.run_batch(part, chunk)
            seen += stop - start
    return counts
