"""Calibration: stream samples through the float interpreter and observe every float value.

Memory stays bounded: batches arrive one at a time (one npz file of a folder, say) and each value
keeps one observer (a few numbers, or a fixed histogram), never the activations themselves.
The inputs of Conv/Gemm/MatMul layers also get per-channel sums (their means drive bias
correction at quantization time), kept exactly (integers in units of the smallest float64) and
rounded once at the end. The values on the edges into depthwise convolutions
(`channel_activations.edge_values`) also get each channel's min and max (axis 1), for
per-channel activation quantization.
Recorders of sample shards merge (`RangeRecorder.merge`, `merge_recorders`) into exactly the
statistics of one pass over all samples, when shards start at multiples of `CHUNK` samples.
The result, `CalibrationStats`, does not depend on the quantized dtype, so it is computed once
and reused when only the dtype changes (the `mse` search runs per dtype from the histogram).
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ...errors import UserError
from ..interpreter import Interpreter, check_feeds
from ..ir import Graph, Value
from ..ops import OPS, weight_axes
from ..ops.recurrent import cell_state_name, lstm_reporting_cells
from .channel_activations import edge_values
from .observers import Histogram, MinMax, MovingAverage, Percentile
from .params import activation_params, dequantize, quantize

METHODS = {
    "minmax": MinMax,
    "percentile": Percentile,
    "moving_average": MovingAverage,
    "mse": Histogram,
}

Batch = Mapping[str, np.ndarray]
CHUNK = 32  # samples per interpreter pass (bounded memory: one chunk of activations at a time)
EXACT_BITS = 1074  # every finite float64 is an integer multiple of 2**-1074
EXACT_ONE = 1 << EXACT_BITS


def _exact(value: float) -> int:
    """`value` as an exact integer count of 2**-EXACT_BITS."""
    numerator, denominator = value.as_integer_ratio()  # the denominator is a power of two
    return numerator << (EXACT_BITS + 1 - denominator.bit_length())


@dataclass
class CalibrationStats:
    """The method's range of every float value by name; for search methods (`mse`) the range
    is the observed min/max and the histogram (limit, counts) is kept for the search."""

    method: str
    samples: int
    ranges: dict[str, tuple[float, float]]
    histograms: dict[str, tuple[float, np.ndarray]] = field(default_factory=dict)
    channel_sums: dict[str, tuple[int, np.ndarray]] = field(default_factory=dict)
    """value name -> (elements summed per channel, float64 sum per channel)"""
    channel_ranges: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """value name -> (min per channel, max per channel), axis 1 (min/max whatever the method)"""

    def channel_means(self) -> dict[str, np.ndarray]:
        return {name: total / count for name, (count, total) in self.channel_sums.items()}

    def ranges_for(self, dtype: str) -> dict[str, tuple[float, float]]:
        """The ranges to quantize with for `dtype` (the search methods depend on it)."""
        if not self.histograms:
            return dict(self.ranges)
        return {
            name: mse_range(limit, counts, self.ranges[name], dtype)
            for name, (limit, counts) in self.histograms.items()
        }


def check_calibration_data(graph: Graph, data: Batch, where: str = "calibration data") -> int:
    """One-line errors for an unusable batch; returns its sample count."""
    try:
        check_feeds(graph, data, batched=True)
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
    counts = {v.name: len(data[v.name]) for v in graph.inputs}
    if len(set(counts.values())) > 1:
        raise UserError(f"{where}: inputs have different sample counts: {counts}")
    samples = next(iter(counts.values()), 0)
    for value in graph.inputs:
        array = np.asarray(data[value.name])
        finite = np.isfinite(array.reshape(samples, -1)).all(axis=1)
        if not finite.all():
            bad = int(np.argmin(finite))
            raise UserError(f"{where}: input '{value.name}' sample {bad} contains NaN or Inf")
    return samples


def channel_axes(graph: Graph) -> dict[str, int]:
    """The float inputs of Conv/Gemm/MatMul layers with constant weights, each with the axis its
    layer's weights contract over (the input channels)."""
    axes = {}
    for node in graph.nodes:
        layout = weight_axes(node) if OPS[node.op].quant == "matmul" else None
        if layout is not None and node.inputs[1].is_const:
            data = node.inputs[0]
            if not data.is_const and len(data.shape) >= 2 and not node.attrs.get("transA"):
                axes[data.name] = layout.data % len(data.shape)
    return axes


class NonFiniteError(UserError):
    """A float value became NaN or Inf while recording (its range would be useless)."""

    def __init__(self, name: str, bad: float):
        self.name, self.bad = name, bad
        super().__init__(f"value '{name}' becomes {bad}")


class RangeRecorder:
    """One observer per float value (by name), fed as an interpreter observer: by calibration
    batch by batch, and by an on-device session run by run (the same numbers either way).
    Values named in `channel_axes` (see `channel_axes()`) also get per-channel sums."""

    def __init__(
        self,
        method: str = "minmax",
        options: Mapping | None = None,
        channel_axes: Mapping[str, int] | None = None,
        finite: bool = False,
        channel_ranges: Iterable[str] = (),
    ):
        """`finite`: raise NonFiniteError when a value holds NaN or Inf (before recording it);
        `channel_ranges`: values whose per-channel min/max (axis 1) are recorded too."""
        if method not in METHODS:
            raise UserError(f"unknown calibration method '{method}' (known: {', '.join(METHODS)})")
        self.method, self.options = method, dict(options or {})
        self.channel_axes = dict(channel_axes or {})
        self.finite = finite
        self.observers: dict[str, object] = {}
        self.sums: dict[str, tuple[int, list[int]]] = {}  # exact: units of 2**-EXACT_BITS
        self.channel_names = frozenset(channel_ranges)
        self.extremes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.samples = 0

    @classmethod
    def resume(
        cls,
        stats: CalibrationStats,
        channel_axes: Mapping[str, int] | None = None,
        channel_ranges: Iterable[str] = (),
    ) -> "RangeRecorder":
        """Continue recording where saved `minmax` statistics left off."""
        if stats.method != "minmax":
            raise UserError(f"cannot resume '{stats.method}' statistics; only 'minmax' ones")
        recorder = cls(channel_axes=channel_axes, channel_ranges=channel_ranges)
        recorder.extremes = dict(stats.channel_ranges)
        for name, (lo, hi) in stats.ranges.items():
            observer = recorder.observers[name] = MinMax()
            observer.lo, observer.hi = lo, hi
        recorder.sums = {
            name: (count, [_exact(v) for v in total.tolist()])
            for name, (count, total) in stats.channel_sums.items()
        }
        recorder.samples = stats.samples
        return recorder

    def observe(self, value: Value, array: np.ndarray) -> None:
        self.record(value.name, array)

    def record(self, name: str, array: np.ndarray) -> None:
        """Observe `array` as the value `name` (a value of the graph or a layer's internal
        values, such as an LSTM's cell states)."""
        if array.dtype.kind != "f":
            return
        if self.finite and array.size:
            for extreme in (array.min(), array.max()):
                if not np.isfinite(extreme):
                    raise NonFiniteError(name, float(extreme))
        axis = self.channel_axes.get(name)
        if axis is not None and array.size:
            self._add_channel_sums(name, array, axis)
        if name in self.channel_names and array.ndim > 1 and array.size:
            self._add_channel_extremes(name, array)
        observer = self.observers.get(name)
        if observer is None:
            try:
                observer = METHODS[self.method](**self.options)
            except (TypeError, ValueError) as error:
                raise UserError(f"calibration method '{self.method}': {error}") from None
            self.observers[name] = observer
        observer.update(array)

    def interpreter(self, graph: Graph) -> Interpreter:
        """An interpreter of `graph` recording into this recorder: every float value, and the
        values inside layers (every LSTM's cell states, as `cell_state_name(node)`)."""
        kernels = {}
        for node in graph.nodes:
            if node.op == "LSTM":
                name = cell_state_name(node.name)
                kernels[node.name] = lstm_reporting_cells(lambda a, name=name: self.record(name, a))
        return Interpreter(graph, self.observe, kernels)

    def _add_channel_sums(self, name: str, array: np.ndarray, axis: int) -> None:
        """Sum each sample's channels in float64, then add those exactly: how samples are split
        into batches, files or shards does not change a bit of the result."""
        inner = tuple(range(1, array.ndim))
        rows = array.sum(axis=tuple(i for i in inner if i != axis), dtype=np.float64)
        count, total = self.sums.get(name, (0, [0] * array.shape[axis]))
        columns = rows.reshape(len(rows), -1).T.tolist()
        total = [t + sum(map(_exact, column)) for t, column in zip(total, columns)]
        self.sums[name] = (count + array.size // array.shape[axis], total)

    def _add_channel_extremes(self, name: str, array: np.ndarray) -> None:
        rows = np.moveaxis(array, 1, 0).reshape(array.shape[1], -1)
        lo, hi = rows.min(axis=1).astype(np.float64), rows.max(axis=1).astype(np.float64)
        if name in self.extremes:
            lo = np.minimum(lo, self.extremes[name][0])
            hi = np.maximum(hi, self.extremes[name][1])
        self.extremes[name] = (lo, hi)

    def merge(self, other: "RangeRecorder") -> None:
        """Add the statistics of another shard of samples (same method and options)."""
        if (other.method, other.options) != (self.method, self.options):
            raise UserError("cannot merge calibration shards recorded with different methods")
        for name, observer in other.observers.items():
            if name in self.observers:
                self.observers[name].merge(observer)
            else:
                self.observers[name] = observer
        for name, (count, total) in other.sums.items():
            mine, summed = self.sums.get(name, (0, [0] * len(total)))
            self.sums[name] = (mine + count, [a + b for a, b in zip(summed, total)])
        for name, (lo, hi) in other.extremes.items():
            if name in self.extremes:
                lo = np.minimum(lo, self.extremes[name][0])
                hi = np.maximum(hi, self.extremes[name][1])
            self.extremes[name] = (lo, hi)
        self.samples += other.samples

    def stats(self) -> CalibrationStats:
        items = self.observers.items()
        stats = CalibrationStats(
            self.method,
            self.samples,
            {n: tuple(map(float, o.range())) for n, o in items},
            channel_sums={
                name: (count, np.array([t / EXACT_ONE for t in total], np.float64))
                for name, (count, total) in self.sums.items()
            },
            channel_ranges=dict(self.extremes),
        )
        if self.method == "mse":
            stats.histograms = {n: (o.limit, o.counts) for n, o in items}
        return stats


def calibrate(
    graph: Graph,
    data: Batch | Iterable[tuple[str, Batch]],
    method: str = "minmax",
    options: Mapping | None = None,
    min_samples: int = 1,
    progress: Callable[[int], None] | None = None,
) -> CalibrationStats:
    """Observe every float value (graph inputs and node outputs) and every LSTM's cell states
    over all samples.

    `data` is one batch (`{input name: [N, *shape]}`) or an iterable of (where, batch) pairs,
    `where` naming the batch's source in error messages.
    """
    return merge_recorders([record(graph, data, method, options, progress)], min_samples)


def record(
    graph: Graph,
    data: Batch | Iterable[tuple[str, Batch]],
    method: str = "minmax",
    options: Mapping | None = None,
    progress: Callable[[int], None] | None = None,
    select: Callable[[int], bool] | None = None,
) -> RangeRecorder:
    """The recorder of one shard of samples (see `calibrate`); shards merge exactly. With
    `select`, only the interpreter chunks whose running number it accepts are observed (the
    chunks are the same as in one pass: a file's samples, `CHUNK` at a time)."""
    batches = [("calibration data", data)] if isinstance(data, Mapping) else data
    options = dict(options or {})
    recorder = RangeRecorder(
        method, dict(options), channel_axes(graph), finite=True, channel_ranges=edge_values(graph)
    )
    interpreter = recorder.interpreter(graph)
    chunk = CHUNK
    if method == "moving_average":  # ONE blends the min/max of each batch of samples
        chunk = options.get("batch", 1)
        if interpreter.batchable:
            recorder.options["batch"] = 1  # each observed array is already a whole batch
    number = -1
    for where, batch in batches:
        samples = check_calibration_data(graph, batch, where)
        for start in range(0, samples, chunk):
            number += 1
            if select is not None and not select(number):
                continue
            part = {v.name: batch[v.name][start : start + chunk] for v in graph.inputs}
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    interpreter.run_batch(part, chunk)
            except NonFiniteError as error:
                raise _non_finite_sample(graph, part, start, where, error) from None
            recorder.samples += len(next(iter(part.values()), ()))
            if progress:
                progress(recorder.samples)
    return recorder


def merge_recorders(recorders: list[RangeRecorder], min_samples: int = 1) -> CalibrationStats:
    """The statistics of shards recorded separately (in any grouping), as of one pass."""
    merged = recorders[0]
    for recorder in recorders[1:]:
        merged.merge(recorder)
    if merged.samples < min_samples:
        raise UserError(
            f"calibration data has {merged.samples} sample(s); at least {min_samples} are needed"
        )
    return merged.stats()


def _non_finite_sample(
    graph: Graph, part: Batch, start: int, where: str, error: NonFiniteError
) -> UserError:
    """The error naming the first sample of `part` (its first sample is `start`) that drives a
    value to NaN or Inf, and the input with the largest magnitude in it."""

    def check(value: Value, array: np.ndarray) -> None:
        if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
            raise NonFiniteError(value.name, float(array[~np.isfinite(array)].flat[0]))

    single = Interpreter(graph, observer=check)
    for i in range(len(next(iter(part.values()), ()))):
        sample = {name: array[i : i + 1] for name, array in part.items()}
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                single.run_batch(sample, 1)
        except NonFiniteError as found:
            error = found
            break
    else:  # no single sample reproduces it: name the chunk's first
        i, sample = 0, {name: array[:1] for name, array in part.items()}
    peaks = {n: float(np.abs(a).max()) if a.size else 0.0 for n, a in sample.items()}
    name = max(peaks, key=peaks.get) if peaks else "?"
    return UserError(
        f"{where}: input '{name}' sample {start + i} (values up to {peaks.get(name, 0):.3g}) "
        f"drives value '{error.name}' to {error.bad}; calibration ranges must be finite: "
        f"scale or clip the data"
    )


def mse_range(
    limit: float, counts: np.ndarray, observed: tuple[float, float], dtype: str, candidates=100
) -> tuple[float, float]:
    """The [lo, hi] (observed range scaled by a factor in (0, 1]) whose quantization of the
    histogram has the least squared error: rounding inside plus clipping outside."""
    lo_obs, hi_obs = min(observed[0], 0.0), max(observed[1], 0.0)
    if counts.sum() == 0 or hi_obs <= lo_obs:
        return observed
    edges = np.linspace(-limit, limit, len(counts) + 1)
    centers, weights = (edges[:-1] + edges[1:]) / 2, counts.astype(np.float64)
    used = weights > 0
    centers, weights = centers[used], weights[used]
    best, best_error = (lo_obs, hi_obs), np.inf
    for factor in np.linspace(1.0, 1.0 / candidates, candidates):
        params = activation_params(lo_obs * factor, hi_obs * factor, dtype)
        error = (centers - dequantize(quantize(centers, params, dtype), params)) ** 2
        total = float(weights @ error)
        if total < best_error:
            best, best_error = (lo_obs * factor, hi_obs * factor), total
    return best
