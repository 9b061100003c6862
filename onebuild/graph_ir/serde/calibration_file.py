"""Calibration statistics files (`.calib.npz`), the artifact between calibration and quantization.

An npz archive (no pickles) with `method` and `samples` (0-d arrays), `names` (unicode [V]),
`ranges` (float64 [V, 2]) and, for the `mse` method, `limits` (float64 [V]) and `counts`
(int64 [V, bins]); the per-channel sums of layer inputs as `sum_names` (unicode [S]),
`sum_counts` (int64 [S], elements summed per channel), `sum_sizes` (int64 [S], channels) and
`sums` (float64, the S sums concatenated). Names are sorted, so the same statistics give the
same bytes.
"""

import os

import numpy as np

from ...errors import FormatError
from ...npz import read_npz, write_npz
from ..quant.calibrate import CalibrationStats

KEYS = {"method", "samples", "names", "ranges"}
SUM_KEYS = {"sum_names", "sum_counts", "sum_sizes", "sums"}


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
    write_npz(path, arrays)


def load_calibration(path: str | os.PathLike) -> CalibrationStats:
    arrays = read_npz(path)
    missing = KEYS - set(arrays)
    if missing:
        raise FormatError(f"{path}: not a calibration file (missing {', '.join(sorted(missing))})")
    names = [str(n) for n in arrays["names"]]
    if arrays["ranges"].shape != (len(names), 2):
        raise FormatError(f"{path}: calibration ranges do not match the value names")
    stats = CalibrationStats(
        str(arrays["method"]),
        int(arrays["samples"]),
        {n: tuple(map(float, r)) for n, r in zip(names, arrays["ranges"])},
    )
    if "limits" in arrays:
        stats.histograms = {
            n: (float(limit), counts)
            for n, limit, counts in zip(names, arrays["limits"], arrays["counts"])
        }
    if SUM_KEYS & set(arrays):
        stats.channel_sums = _channel_sums(path, arrays)
    return stats


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
