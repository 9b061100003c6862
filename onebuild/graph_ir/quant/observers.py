"""Calibration observers: range statistics of one tensor, updated batch by batch, bounded memory.

- `MinMax`: the extreme values seen.
- `Percentile`: ONE's percentile: the lo-th percentile of the samples' minima and the hi-th of
  their maxima (default 1/99), linearly interpolated; one pair of numbers per sample.
- `MovingAverage`: ONE's moving average: the min/max of each batch of `batch` samples blended
  into the running value with weight `constant` (the first batch initializes it).
- `Histogram` (method `mse`): a fixed-size histogram whose range doubles (merging bin pairs) when
  new values fall outside it, kept for a search at quantization time (`calibrate.mse_range`:
  the clipping range with the least squared error for a dtype).
"""

import numpy as np


class MinMax:
    def __init__(self):
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))

    def range(self) -> tuple[float, float]:
        return (self.lo, self.hi) if self.lo <= self.hi else (0.0, 0.0)


class Percentile:
    """Per sample (a row of axis 0: calibration arrays carry samples along it, a session's runs
    one each), the minimum and the maximum; the range is their lo-th and hi-th percentiles.

    Percentiles of the samples' extremes, not of all values: clipping the top 1 % of every
    tensor's values would cut the informative tails of most activations."""

    def __init__(self, lo_percent: float = 1.0, hi_percent: float = 99.0):
        if not 0 <= lo_percent < hi_percent <= 100:
            raise ValueError(f"percentiles {lo_percent}/{hi_percent} are not 0 <= lo < hi <= 100")
        self.lo_percent, self.hi_percent = lo_percent, hi_percent
        self.minima: list[float] = []
        self.maxima: list[float] = []

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        rows = x.reshape(len(x), -1) if x.ndim else x.reshape(1, 1)
        self.minima.extend(rows.min(axis=1).tolist())
        self.maxima.extend(rows.max(axis=1).tolist())

    def range(self) -> tuple[float, float]:
        if not self.minima:
            return 0.0, 0.0
        lo = float(np.percentile(np.asarray(self.minima, np.float64), self.lo_percent))
        hi = float(np.percentile(np.asarray(self.maxima, np.float64), self.hi_percent))
        return lo, hi


class Histogram:
    """Values in `bins` equal bins over [-limit, limit); the limit doubles as needed. Its range
    is the observed min/max (the search uses the counts)."""

    def __init__(self, bins: int = 2048):
        self.counts = np.zeros(bins, np.int64)
        self.limit = 0.0
        self.minmax = MinMax()

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        self.minmax.update(x)
        peak = max(abs(self.minmax.lo), abs(self.minmax.hi))
        if self.limit == 0.0:
            self.limit = peak * 1.0001 if peak > 0 else 1e-8
        while peak >= self.limit:
            self._double()
        bins = len(self.counts)
        index = ((x.reshape(-1) + self.limit) * (bins / (2 * self.limit))).astype(np.int64)
        self.counts += np.bincount(np.clip(index, 0, bins - 1), minlength=bins)

    def _double(self) -> None:
        """Double the range: old bins map to the middle half, merged in pairs."""
        bins = len(self.counts)
        merged = self.counts.reshape(-1, 2).sum(axis=1)
        self.counts = np.zeros(bins, np.int64)
        self.counts[bins // 4 : bins // 4 + bins // 2] = merged
        self.limit *= 2

    def range(self) -> tuple[float, float]:
        return self.minmax.range()


class MovingAverage:
    def __init__(self, constant: float = 0.1, batch: int = 1):
        if not 0 < constant <= 1 or batch < 1:
            raise ValueError("moving average needs 0 < constant <= 1 and batch >= 1")
        self.constant, self.batch = constant, batch
        self.lo = self.hi = None
        self.pending = MinMax()
        self.seen = 0

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        self.pending.update(x)
        self.seen += 1
        if self.seen % self.batch == 0:
            self._blend()

    def _blend(self) -> None:
        lo, hi = self.pending.range()
        self.pending = MinMax()
        if self.lo is None:
            self.lo, self.hi = lo, hi
        else:
            c = self.constant
            self.lo = self.lo * (1 - c) + lo * c
            self.hi = self.hi * (1 - c) + hi * c

    def range(self) -> tuple[float, float]:
        if self.seen % self.batch and self.lo is None:  # fewer samples than one batch
            return self.pending.range()
        return (self.lo, self.hi) if self.lo is not None else (0.0, 0.0)
