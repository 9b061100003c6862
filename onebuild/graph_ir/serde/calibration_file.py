"""Calibration statistics files (`.calib.npz`), the artifact between calibration and quantization.

An npz archive (no pickles) with `method` and `samples` (0-d arrays), `names` (unicode [V]),
`ranges` (float64 [V, 2]) and, for the `mse` method, `limits` (float64 [V]) and `counts`
(int64 [V, bins]); the per-channel sums of layer inputs as `sum_names` (unicode [S]),
`sum_counts` (int64 [S], elements summed per channel), `sum_sizes` (int64 [S], channels) and
`sums` (float64, the S sums concatenated); the per-channel ranges of the values on the edges
into depthwise convolutions as `range_names` (unicode [R]), `range_sizes` (int64 [R],
channels) and `channel_ranges` (float64 [sum of sizes, 2]: min, max). Names are sorted, so
the same statistics give the same bytes.
"""

import os

import numpy as np

from ...errors import FormatError
from ...npz import read_npz, write_npz
from ..quant.calibrate import CalibrationStats

KEYS = {"method", "samples", "names", "ranges"}
SUM_KEYS = {"sum_names", "sum_counts", "sum_sizes", "sums"}
RANGE_KEYS = {"range_names", "range_sizes", "channel_ranges"}


def save_calibration(stats: CalibrationStats, path: str | os.PathLike) -> None:
    names = sorted(stats.ranges)
    arrays = {
        "method": np.array(stats.method),
        "samples": np.array(stats.samples, np.int64),
        "names": np.array(names, dtype=str),
        "ranges": np.array([stats.ranges[n] for n in names], np.float64).reshape(-1, 2),
    }
    if stats.histograms:
        arrays["limits"] = np.array([stats.histograms[n][0] for n in names], np.float64)
        arrays["counts"] = np.stack([stats.histograms[n][1] for n in names]).astype(np.int64)
    summed = sorted(stats.channel_sums)
    sums = [np.asarray(stats.channel_sums[n][1], np.float64).ravel() for n in summed]
    arrays["sum_names"] = np.array(summed, dtype=str)
    arrays["sum_counts"] = np.array([stats.channel_sums[n][0] for n in summed], np.int64)
    arrays["sum_sizes"] = np.array([len(s) for s in sums], np.int64)
    arrays["sums"] = np.concatenate(sums) if sums else np.zeros(0, np.float64)
    ranged = sorted(stats.channel_ranges)
    if ranged:  # (an npz array may not be empty)
        pairs = [np.stack(stats.channel_ranges[n], axis=1).astype(np.float64) for n in ranged]
        arrays["range_names"] = np.array(ranged, dtype=str)
        arrays["range_sizes"] = np.array([len(p) for p in pairs], np.int64)
        arrays["channel_ranges"] = np.concatenate(pairs)
    write_npz(path, arrays)


def _require(path, condition: bool, message: str) -> None:
    if not condition:
        raise FormatError(f"{path}: invalid calibration file: {message}")


def load_calibration(path: str | os.PathLike) -> CalibrationStats:
    """Statistics saved by `save_calibration`; every array's dtype and shape is checked and
    ranges must be finite with lo <= hi (a FormatError names the file and the array)."""
    arrays = read_npz(path, batch=False)
    missing = KEYS - set(arrays)
    if missing:
        raise FormatError(f"{path}: not a calibration file (missing {', '.join(sorted(missing))})")
    method, samples, names = arrays["method"], arrays["samples"], arrays["names"]
    ranges = arrays["ranges"]
    _require(path, method.shape == () and method.dtype.kind == "U", "'method' is not a string")
    _require(path, samples.shape == () and samples.dtype.kind in "iu", "'samples' not an int")
    _require(path, int(samples) >= 0, "'samples' is negative")
    _require(path, names.ndim == 1 and names.dtype.kind == "U", "'names' is not a string list")
    _require(path, len(set(names.tolist())) == len(names), "'names' has duplicates")
    _require(path, ranges.dtype.kind == "f", "'ranges' is not float")
    _require(path, ranges.shape == (len(names), 2), "'ranges' does not match 'names'")
    finite = np.isfinite(ranges).all(axis=1) & (ranges[:, 0] <= ranges[:, 1])
    if not finite.all():
        bad = int(np.argmin(finite))
        raise FormatError(
            f"{path}: invalid calibration file: range of '{names[bad]}' is "
            f"{ranges[bad].tolist()} (must be finite with lo <= hi; recalibrate)"
        )
    names = [str(n) for n in names]
    stats = CalibrationStats(
        str(method), int(samples), {n: tuple(map(float, r)) for n, r in zip(names, ranges)}
    )
    if "limits" in arrays or "counts" in arrays:
        limits, counts = arrays.get("limits"), arrays.get("counts")
        ok = limits is not None and counts is not None and limits.shape == (len(names),)
        ok = ok and limits.dtype.kind == "f" and bool(np.isfinite(limits).all())
        ok = ok and counts.ndim == 2 and len(counts) == len(names) and counts.dtype.kind == "i"
        _require(path, ok and bool((counts >= 0).all()), "histograms do not match 'names'")
        stats.histograms = {
            n: (float(limit), counts)
            for n, limit, counts in zip(names, arrays["limits"], arrays["counts"])
        }
    if SUM_KEYS & set(arrays):
        stats.channel_sums = _channel_sums(path, arrays)
    if RANGE_KEYS & set(arrays):
        stats.channel_ranges = _channel_ranges(path, arrays)
    return stats


def _channel_ranges(path, arrays) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    bad = FormatError(f"{path}: channel ranges do not match their names and sizes")
    if not set(arrays) >= RANGE_KEYS:
        raise bad
    names, sizes, pairs = arrays["range_names"], arrays["range_sizes"], arrays["channel_ranges"]
    if (
        names.ndim != 1
        or sizes.shape != names.shape
        or sizes.dtype.kind != "i"
        or (sizes < 0).any()
        or pairs.dtype.kind != "f"
        or pairs.shape != (int(sizes.sum()), 2)
        or not np.isfinite(pairs).all()
        or (pairs[:, 0] > pairs[:, 1]).any()
    ):
        raise bad
    ends = np.cumsum(sizes)
    return {
        str(n): (pairs[end - size : end, 0], pairs[end - size : end, 1])
        for n, size, end in zip(names, sizes, ends)
    }


def _channel_sums(path, arrays) -> dict[str, tuple[int, np.ndarray]]:
    bad = FormatError(f"{path}: channel sums do not match their names, counts and sizes")
    if not set(arrays) >= SUM_KEYS:
        raise bad
    names, counts, sizes = arrays["sum_names"], arrays["sum_counts"], arrays["sum_sizes"]
    sums = arrays["sums"]
    if (
        counts.dtype.kind != "i"
        or sizes.dtype.kind != "i"
        or sums.dtype.kind != "f"
        or not names.ndim == counts.ndim == sizes.ndim == sums.ndim == 1
        or not names.shape == counts.shape == sizes.shape
        or (sizes < 0).any()
        or (counts <= 0).any()
        or int(sizes.sum()) != sums.size
    ):
        raise bad
    ends = np.cumsum(sizes)
    return {
        str(n): (int(c), sums[end - size : end])
        for n, c, size, end in zip(names, counts, sizes, ends)
    }
