"""Calibration observers: range statistics of one tensor, updated batch by batch, bounded memory.

- `MinMax`: the extreme values seen.
- `Percentile`: ONE's percentile: the lo-th percentile of the samples' minima and the hi-th of
  their maxima (default 1/99), linearly interpolated; one pair of numbers per sample.
- `MovingAverage`: ONE's moving average: the min/max of each batch of `batch` samples blended
  into the running value with weight `constant` (the first batch initializes it).
- `Histogram` (method `mse`): a fixed-size histogram whose range doubles (merging bin pairs) when
  new values fall outside it, kept for a search at quantization time (`calibrate.mse_range`:
  the clipping range with the least squared error for a dtype). The range is a power of two and
  bins are found by exact scaling, so a histogram doubled k times equals one built at that
  range: histograms of sample shards merge into exactly the one-pass histogram.

Each observer's `merge` adds another's observations of other samples (shards of calibration).
"""

import math

import numpy as np

from ...errors import UserError


class MinMax:
    def __init__(self):
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))

    def range(self) -> tuple[float, float]:
        return (self.lo, self.hi) if self.lo <= self.hi else (0.0, 0.0)

    def merge(self, other: "MinMax") -> None:
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)


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

    def merge(self, other: "Percentile") -> None:
        self.minima.extend(other.minima)  # percentiles do not depend on the order
        self.maxima.extend(other.maxima)

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
        if self.limit == 0.0:  # the power of two above the peak
            self.limit = math.ldexp(1.0, math.frexp(peak)[1]) if peak > 0 else 2.0**-30
        while peak >= self.limit:
            self._double()
        bins = len(self.counts)
        scaled = np.floor(x.reshape(-1) * (bins / (2 * self.limit)))  # exact: a power of two
        index = scaled.astype(np.int64) + bins // 2
        self.counts += np.bincount(np.clip(index, 0, bins - 1), minlength=bins)

    def merge(self, other: "Histogram") -> None:
        """Add another histogram of the same settings (both doubled to the larger range)."""
        if other.limit == 0.0:
            return
        if self.limit == 0.0:
            self.counts, self.limit = other.counts.copy(), other.limit
        else:
            counts, limit = other.counts.copy(), other.limit
            while self.limit < limit:
                self._double()
            while limit < self.limit:
                counts, limit = _doubled(counts), limit * 2
            self.counts = self.counts + counts
        self.minmax.merge(other.minmax)

    def _double(self) -> None:
        self.counts, self.limit = _doubled(self.counts), self.limit * 2

    def range(self) -> tuple[float, float]:
        return self.minmax.range()


def _doubled(counts: np.ndarray) -> np.ndarray:
    """A histogram over twice the range: old bins map to the middle half, merged in pairs."""
    bins = len(counts)
    doubled = np.zeros(bins, np.int64)
    doubled[bins // 4 : bins // 4 + bins // 2] = counts.reshape(-1, 2).sum(axis=1)
    return doubled


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

    def merge(self, other: "MovingAverage") -> None:
        raise UserError(
            "moving_average statistics depend on the order of all samples and cannot be merged "
            "from shards; calibrate in one pass or use minmax, percentile or mse"
        )

    def range(self) -> tuple[float, float]:
        if self.seen % self.batch and self.lo is None:  # fewer samples than one batch
            return self.pending.range()
        return (self.lo, self.hi) if self.lo is not None else (0.0, 0.0)
