"""Calibration observers: range statistics of one tensor, updated batch by batch, bounded memory.

- `MinMax`: the extreme values seen.
- `Percentile`: the lo/hi percentiles of all values seen (ONE's default 1/99), from a fixed-size
  histogram whose range doubles (merging bin pairs) when new values fall outside it. The range is
  a power of two and bins are found by exact scaling, so a histogram doubled k times equals one
  built at that range: histograms of sample shards merge into exactly the one-pass histogram.
- `MovingAverage`: ONE's moving average: the min/max of each batch of `batch` samples blended
  into the running value with weight `constant` (the first batch initializes it).
- `Histogram` (method `mse`): the percentile histogram, kept for a search at quantization time
  (`calibrate.mse_range`: the clipping range with the least squared error for a dtype).
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
    """Histogram of [-limit, limit) in `bins` equal bins; the limit doubles as needed."""

    def __init__(self, lo_percent: float = 1.0, hi_percent: float = 99.0, bins: int = 4096):
        if not 0 <= lo_percent < hi_percent <= 100:
            raise ValueError(f"percentiles {lo_percent}/{hi_percent} are not 0 <= lo < hi <= 100")
        self.lo_percent, self.hi_percent = lo_percent, hi_percent
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

    def merge(self, other: "Percentile") -> None:
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
        total = self.counts.sum()
        if total == 0:
            return 0.0, 0.0
        edges = np.linspace(-self.limit, self.limit, len(self.counts) + 1)
        cumulative = np.cumsum(self.counts) / total
        lo = edges[np.searchsorted(cumulative, self.lo_percent / 100, side="left")]
        hi = edges[np.searchsorted(cumulative, self.hi_percent / 100, side="left") + 1]
        return max(float(lo), self.minmax.lo), min(float(hi), self.minmax.hi)


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


class Histogram(Percentile):
    """Percentile's histogram, kept for a per-dtype search later; its range is the min/max."""

    def __init__(self, bins: int = 2048):
        super().__init__(0.0, 100.0, bins)

    def range(self) -> tuple[float, float]:
        return self.minmax.range()
