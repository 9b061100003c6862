"""Error metrics between a reference output (float model) and a candidate (quantized, NPU...).

Accumulated sample by sample, in constant memory:
- MAE, MSE: mean absolute / squared error over all elements.
- MAPE: mean of |ref - test| / max(|ref|, 1e-6), in percent.
- MPEIR (ONE's mean peak error to interval ratio): per sample, the largest absolute error
  divided by the interval of the reference values (max - min); averaged over samples.
- SQNR: 10 log10(sum ref^2 / sum (ref - test)^2) in dB (inf when identical).
- top-1 match: fraction of samples whose arg max agrees; top-5 match: mean overlap of the two
  top-5 sets divided by 5 (for outputs with at least 5 classes).
- max abs error: the largest |ref - test| of any element; cosine: per sample, ref . test over
  the product of their norms, averaged over samples.

`OutputMetrics.summary` gives every metric (the accuracy gate's); `OutputMetrics.chosen` gives
those that mean something for the kind of output (`output_kind`), as `verify` prints them.
"""

import math

import numpy as np

MAPE_FLOOR = 1e-6
KINDS = {  # kind of output -> (the metrics that mean something for it, why)
    "scores": (
        ("top1_match", "top5_match", "sqnr_db", "max_abs_error"),
        "one vector of scores per sample (classification-like): whether the top classes agree, "
        "SQNR and the largest error",
    ),
    "dense": (
        ("sqnr_db", "max_abs_error", "cosine"),
        "a map, sequence or set of values per sample: SQNR, the largest error and cosine "
        "similarity; no top-k (its positions are not classes) nor MAPE (values near 0 blow "
        "it up)",
    ),
}


def output_kind(shape: tuple[int, ...]) -> str:
    """ "scores" when one axis of a sample holds more than one value (a vector of class scores),
    else "dense" (maps, sequences, boxes, single values)."""
    return "scores" if sum(d > 1 for d in shape) == 1 else "dense"


def sqnr_db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


class OutputMetrics:
    """Running error metrics of one output."""

    def __init__(self):
        self.samples = self.elements = 0
        self.abs_sum = self.sq_sum = self.signal = self.ape_sum = self.peir_sum = 0.0
        self.top1 = self.top5 = 0.0
        self.classes = None
        self.max_error = self.cosine_sum = 0.0

    def update(self, reference: np.ndarray, test: np.ndarray) -> None:
        """One sample of each (any shape, same size)."""
        ref = np.asarray(reference, np.float64).reshape(-1)
        out = np.asarray(test, np.float64).reshape(-1)
        error = np.abs(ref - out)
        self.samples += 1
        self.elements += ref.size
        self.abs_sum += float(error.sum())
        self.sq_sum += float(error @ error)
        self.signal += float(ref @ ref)
        self.ape_sum += float((error / np.maximum(np.abs(ref), MAPE_FLOOR)).sum())
        interval = float(ref.max() - ref.min()) if ref.size else 0.0
        self.peir_sum += float(error.max(initial=0.0)) / interval if interval > 0 else 0.0
        self.classes = ref.size
        self.max_error = max(self.max_error, float(error.max(initial=0.0)))
        norms = float(np.linalg.norm(ref)) * float(np.linalg.norm(out))
        if norms > 0:
            self.cosine_sum += float(ref @ out) / norms
        elif not (ref.any() or out.any()):  # both all zero: the same
            self.cosine_sum += 1.0
        if ref.size:
            self.top1 += float(ref.argmax() == out.argmax())
        if ref.size >= 5:
            top_ref = set(np.argpartition(-ref, 4)[:5].tolist())
            top_out = set(np.argpartition(-out, 4)[:5].tolist())
            self.top5 += len(top_ref & top_out) / 5

    def summary(self) -> dict[str, float | None]:
        n, e = max(self.samples, 1), max(self.elements, 1)
        return {
            "mae": self.abs_sum / e,
            "mse": self.sq_sum / e,
            "mape": 100 * self.ape_sum / e,
            "mpeir": self.peir_sum / n,
            "sqnr_db": sqnr_db(self.signal, self.sq_sum),
            "top1_match": self.top1 / n,
            "top5_match": self.top5 / n if (self.classes or 0) >= 5 else None,
        }

    def chosen(self, kind: str) -> dict[str, float | None]:
        """The metrics that mean something for outputs of this kind (`KINDS`)."""
        every = {
            **self.summary(),
            "max_abs_error": self.max_error,
            "cosine": self.cosine_sum / max(self.samples, 1),
        }
        return {name: every[name] for name in KINDS[kind][0] if every[name] is not None}


class SignalNoise:
    """Running SQNR of one tensor of a batched run (per-layer reports), overall and per
    channel (axis 1): a channel with a small range matters downstream as much as a large one
    when the next layer's weights scale it back up, and the overall SQNR cannot see its noise."""

    def __init__(self):
        self.signal = self.noise = 0.0
        self.channel_signal = self.channel_noise = 0.0

    def update(self, reference: np.ndarray, test: np.ndarray) -> None:
        ref = np.asarray(reference, np.float64)
        diff = ref - np.asarray(test, np.float64)
        self.signal += float(np.vdot(ref, ref))
        self.noise += float(np.vdot(diff, diff))
        if ref.ndim >= 2:
            axes = tuple(a for a in range(ref.ndim) if a != 1)
            self.channel_signal = self.channel_signal + np.square(ref).sum(axis=axes)
            self.channel_noise = self.channel_noise + np.square(diff).sum(axis=axes)

    @property
    def db(self) -> float:
        return sqnr_db(self.signal, self.noise)

    @property
    def channel_noise_ratio(self) -> float:
        """The mean over channels of noise / signal (channels without signal left out); the
        overall ratio for tensors without a channel axis."""
        signal = np.atleast_1d(self.channel_signal)
        noise = np.atleast_1d(self.channel_noise)
        alive = signal > 0
        if not np.any(alive) or signal.size == 1:
            return self.noise / self.signal if self.signal else 0.0
        return float(np.mean(noise[alive] / signal[alive]))
