"""Calibration statistics files (`.calib.npz`), the artifact between calibration and quantization.

An npz archive (no pickles) with `method` and `samples` (0-d arrays), `names` (unicode [V]),
`ranges` (float64 [V, 2]) and, for the `mse` method, `limits` (float64 [V]) and `counts`
(int64 [V, bins]). Values are sorted by name, so the same statistics give the same bytes.
"""

import os

import numpy as np

from ...errors import FormatError
from ...npz import read_npz, write_npz
from ..quant.calibrate import CalibrationStats

KEYS = {"method", "samples", "names", "ranges"}


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
    return stats
