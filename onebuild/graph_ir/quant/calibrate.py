"""Calibration: stream samples through the float interpreter and observe every float value.

Memory stays bounded: each value keeps one observer (a few numbers, or a fixed histogram),
never the activations themselves.
"""

from collections.abc import Callable, Mapping

import numpy as np

from ...errors import UserError
from ..interpreter import Interpreter, check_feeds
from ..ir import Graph, Value
from .observers import MinMax, MovingAverage, Percentile

METHODS = {"minmax": MinMax, "percentile": Percentile, "moving_average": MovingAverage}


def check_calibration_data(graph: Graph, data: Mapping[str, np.ndarray], min_samples: int):
    """One-line errors for unusable calibration data; returns the sample count."""
    check_feeds(graph, data, batched=True)
    counts = {name: len(data[name]) for name in (v.name for v in graph.inputs)}
    if len(set(counts.values())) > 1:
        raise UserError(f"calibration inputs have different sample counts: {counts}")
    samples = next(iter(counts.values()), 0)
    if samples < min_samples:
        raise UserError(
            f"calibration data has {samples} sample(s); at least {min_samples} are needed"
        )
    for value in graph.inputs:
        array = data[value.name]
        finite = np.isfinite(array.reshape(samples, -1)).all(axis=1)
        if not finite.all():
            bad = int(np.argmin(finite))
            raise UserError(f"calibration input '{value.name}' sample {bad} contains NaN or Inf")
    return samples


def calibrate(
    graph: Graph,
    data: Mapping[str, np.ndarray],
    method: str = "minmax",
    options: Mapping | None = None,
    min_samples: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, tuple[float, float]]:
    """Observed (lo, hi) of every float value (graph inputs and node outputs), by name."""
    if method not in METHODS:
        raise UserError(f"unknown calibration method '{method}' (known: {', '.join(METHODS)})")
    samples = check_calibration_data(graph, data, min_samples)
    observers: dict[int, object] = {}
    names: dict[int, str] = {}

    def observe(value: Value, array: np.ndarray) -> None:
        if not np.issubdtype(array.dtype, np.floating):
            return
        key = id(value)
        if key not in observers:
            observers[key] = METHODS[method](**dict(options or {}))
            names[key] = value.name
        observers[key].update(array)

    interpreter = Interpreter(graph, observer=observe)
    for index in range(samples):
        interpreter.run({v.name: data[v.name][index] for v in graph.inputs})
        if progress:
            progress(index + 1, samples)
    return {names[key]: observer.range() for key, observer in observers.items()}
