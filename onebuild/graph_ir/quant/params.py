"""Quantization parameters and the fixed-point arithmetic of the integer reference.

- Activations: uint8 asymmetric (the range is widened to contain 0, zero point in [0, 255]);
  int8 / int16 symmetric (zero point 0, q in [-qmax, qmax]).
- Weights: symmetric, per channel (an axis) or per tensor.
- Quantize: q = clamp(round_half_even(x / scale) + zero_point), as ONNX QuantizeLinear.
- Requantize an integer accumulator by a real multiplier M > 0: M = m * 2^-r with a 31-bit
  integer m in [2^30, 2^31) and r >= 1, then out = round_half_even(acc * m / 2^r) computed
  exactly (the product may need up to 80 bits): one rounding, ties to even as in quantize.
"""

import math

import numpy as np

from ..compiled import compiled
from ..tensor import QuantParams

ADD_SHIFT = 20  # integer Add scales both inputs by 2^20 before rescaling them to a common scale
QRANGE = {"uint8": (0, 255), "int8": (-127, 127), "int16": (-32767, 32767), "int32": None}
SYMMETRIC = {"int8", "int16"}
# Calibrated ranges widened for 16-bit activations: one bit of their resolution (86 dB of it)
# buys room for data beyond the calibration samples, which would otherwise clip (digits: the
# held-out logits at 46.7 dB with the bare range, 78.9 with the headroom).
HEADROOM = {"int16": 2.0}
MIN_MULTIPLIER = 2.0**-31  # below it a requantization multiplier is flushed to zero
BIAS_ROOM = 1 << 55  # |bias| in accumulator units: acc + bias stays below 2^56 (`requantize`)


def activation_params(lo: float, hi: float, dtype: str) -> QuantParams:
    """Per-tensor parameters for values observed in [lo, hi] (a zero range still gets a scale)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    qmin, qmax = QRANGE[dtype]
    if dtype in SYMMETRIC:
        bound = max(-lo, hi)
        scale = bound / qmax if bound > 0 else 1.0
        return QuantParams((scale,), (0,), None)
    scale = (hi - lo) / (qmax - qmin) if hi > lo else 1.0
    zero_point = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return QuantParams((scale,), (zero_point,), None)


def channel_params(lo: np.ndarray, hi: np.ndarray, dtype: str, axis: int = 1) -> QuantParams:
    """Per-channel activation parameters (`axis`, channels observed in [lo[c], hi[c]]): each
    channel as `activation_params` would quantize it alone."""
    each = [activation_params(a, b, dtype) for a, b in zip(np.ravel(lo), np.ravel(hi))]
    scales = tuple(p.scale[0] for p in each)
    return QuantParams(scales, tuple(p.zero_point[0] for p in each), axis)


def channel_of(params: QuantParams, c: int) -> QuantParams:
    """Channel `c`'s parameters, per tensor (per-tensor parameters serve every channel)."""
    if params.axis is None:
        return params
    return QuantParams((params.scale[c],), (params.zero_point[c],), None)


def bias_fitting(
    params: QuantParams, bias: np.ndarray, input_scale, output_scale, bias_dtype
) -> QuantParams:
    """Weight `params` with each scale raised where the bias (per output channel) would not
    fit half its integer type (at most BIAS_ROOM) in units of input scale times weight scale,
    or where the requantization multiplier s_x s_w / s_y would fall below MIN_MULTIPLIER (and
    be flushed to zero). A BatchNorm-folded dead channel (weights ~1e-20, bias ~1) otherwise
    loses its bias; now its weights round to 0 and its output is its bias."""
    room = float(min(np.iinfo(bias_dtype).max // 2, BIAS_ROOM))
    s_x = np.asarray(input_scale, np.float64)
    floor = 2 * MIN_MULTIPLIER  # twice: s_x s_w / s_y recomputed may round below the minimum
    need = np.maximum(np.abs(bias) / (s_x * room), floor * np.asarray(output_scale) / s_x)
    scales = np.asarray(params.scale, np.float64)
    raised = np.maximum(scales, need if len(scales) > 1 else need.max(initial=0.0))
    if (raised == scales).all():
        return params
    return QuantParams(tuple(map(float, raised)), params.zero_point, params.axis)


CLIP_SEARCH = np.linspace(1.0, 0.8, 11)  # candidate fractions of the largest magnitude


def weight_params(weight: np.ndarray, dtype: str, axis: int | None) -> QuantParams:
    """Symmetric parameters; per channel along `axis`, or per tensor when axis is None.

    Each scale is the one, among max|w| * f / qmax for f in CLIP_SEARCH (1.0 down to 0.8), with
    the least squared rounding-plus-clipping error: never worse than plain min/max scaling.
    """
    qmax = QRANGE[dtype][1]
    rows = (
        np.abs(weight).reshape(1, -1)
        if axis is None
        else (np.moveaxis(np.abs(weight), axis, 0).reshape(weight.shape[axis], -1))
    )
    rows = rows.astype(np.float64)
    bounds = rows.max(axis=1, initial=0.0)
    best = bounds / qmax
    best_error = np.full(len(rows), np.inf)
    for fraction in CLIP_SEARCH:
        scale = np.where(bounds > 0, bounds * fraction / qmax, 1.0)[:, None]
        error = ((rows - np.minimum(np.rint(rows / scale), qmax) * scale) ** 2).sum(axis=1)
        better = error < best_error
        best = np.where(better, scale[:, 0], best)
        best_error = np.minimum(error, best_error)
    scales = tuple(float(s) if b > 0 else 1.0 for s, b in zip(best, bounds))
    return QuantParams(scales, (0,) * len(scales), None if axis is None else axis)


def qdq_attrs(params: QuantParams) -> dict:
    """QuantizeLinear/DequantizeLinear attributes of `params` (inverse: `qdq_params`)."""
    return {"scale": list(params.scale), "zero_point": list(params.zero_point), "axis": params.axis}


def qdq_params(attrs: dict) -> QuantParams:
    return QuantParams(tuple(attrs["scale"]), tuple(attrs["zero_point"]), attrs.get("axis"))


def _broadcast(values: tuple, params: QuantParams, ndim: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if params.axis is None:
        return array.reshape(())
    shape = [1] * ndim
    shape[params.axis] = -1
    return array.reshape(shape)


def quantize(x: np.ndarray, params: QuantParams, dtype: str) -> np.ndarray:
    """Round half to even, add the zero point, saturate to the type's range."""
    scale = _broadcast(params.scale, params, x.ndim)
    zero_point = _broadcast(params.zero_point, params, x.ndim)
    q = np.divide(x, scale, dtype=np.float64)
    info = np.iinfo(dtype)
    if np.ndim(q) == 0:  # a numpy scalar (ufuncs have no `out` for it)
        return np.clip(np.rint(q) + zero_point, info.min, info.max).astype(dtype)
    q = np.rint(q, out=q)  # in place: the same arithmetic, fewer passes over memory
    q += zero_point
    return np.clip(q, info.min, info.max, out=q).astype(dtype)


def dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray:
    scale = _broadcast(params.scale, params, q.ndim)
    zero_point = _broadcast(params.zero_point, params, q.ndim)
    centered = np.subtract(q, zero_point, dtype=np.float64)
    in_place = centered if np.ndim(centered) else None  # (numpy scalars have no `out`)
    return np.multiply(centered, scale, out=in_place).astype(np.float32)


class MultiplierRangeError(ValueError):
    """A requantization multiplier the fixed-point form cannot hold (the quantizer then keeps
    the layer in float)."""


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(m, r) with real ~= m * 2^-r, m a 31-bit integer in [2^30, 2^31), 1 <= r <= 62.

    Multipliers below 2^-31 scale any accumulator to 0 and are flushed to (0, 1); those outside
    [0, 2^29) raise MultiplierRangeError.
    """
    if not 0 <= real < 2.0**29:
        raise MultiplierRangeError(f"requantization multiplier {real} is outside [0, 2^29)")
    if real < MIN_MULTIPLIER:
        return 0, 1
    mantissa, exponent = math.frexp(real)  # real = mantissa * 2^exponent, mantissa in [0.5, 1)
    m = round(mantissa * (1 << 31))
    r = 31 - exponent
    if m == 1 << 31:  # rounding carried into the next power of two
        m, r = 1 << 30, r - 1
    return m, r


SPLIT_BITS = 24


def count_multipliers(ratio: float, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, shift) arrays shaped like `counts`: `quantize_multiplier(ratio / count)`
    for each window's element count (an average pool's rescale)."""
    m = np.zeros(counts.shape, np.int64)
    r = np.ones(counts.shape, np.int64)
    for count in np.unique(counts):
        m[counts == count], r[counts == count] = quantize_multiplier(ratio / int(count))
    return m, r


def requantize(acc: np.ndarray, m: int | np.ndarray, r: int | np.ndarray) -> np.ndarray:
    """round_half_even(acc * m / 2^r), exact: floor((acc * m + 2^(r-1)) / 2^r), less one where
    acc * m / 2^r lies exactly half-way and that result is odd.

    The product can exceed 64 bits for 16-bit accumulators, so acc beyond 32 bits is split as
    hi * 2^k + lo (k = min(r, 24), 0 <= lo < 2^k) and the shift is applied in two exact parts:
    floor((hi*m*2^k + lo*m + 2^(r-1)) / 2^r) = (hi*m + ((lo*m + 2^(r-1)) >> k)) >> (r - k);
    the half-way case is the one where both parts leave no remainder. Exact for
    |acc| < 2^(32 + k), which covers int32 accumulators with any r and 48-bit accumulators when
    r >= 24 (multipliers below 2^7).
    """
    acc = np.asarray(acc, np.int64)
    m = np.asarray(m, np.int64)
    r = np.asarray(r, np.int64)
    fast = _requantize_compiled(acc, m, r)
    if fast is not None:
        return fast
    one = np.int64(1)
    if acc.size and max(-int(acc.min()), int(acc.max())) <= 1 << 31:  # acc * m below 2^62
        total = np.asarray(acc * m)  # in place below: fewer passes over large tensors
        total += one << (r - 1)
        out = np.asarray(total >> r)
        # half-way and odd: the low r + 1 bits of total are exactly 2^r; one less then
        np.bitwise_and(total, (one << (r + 1)) - 1, out=total)
        out -= total == one << r
        return out
    k = np.minimum(r, SPLIT_BITS)
    low = np.asarray(acc & ((one << k) - 1))  # lo = acc - hi * 2^k
    low *= m
    low += one << (r - 1)
    high = np.asarray(acc >> k)
    high *= m
    high += low >> k
    out = np.asarray(high >> (r - k))
    # half-way (no remainder in either part) and odd (bit r - k of high): one less
    np.bitwise_and(low, (one << k) - 1, out=low)
    np.bitwise_and(high, (one << (r - k + 1)) - 1, out=high)
    out -= (low == 0) & (high == one << (r - k))
    return out


def _requantize_compiled(acc: np.ndarray, m: np.ndarray, r: np.ndarray) -> np.ndarray | None:
    """`requantize` in one compiled pass (the same integers), or None where it does not apply:
    numba missing or off, m and r not one number or one per element of a single axis of acc,
    shifts outside [1, 62], or too small a call to load numba for."""
    kernels = compiled(acc.size)
    if kernels is None or max(m.ndim, r.ndim) > acc.ndim:
        return None
    shape = np.broadcast_shapes(m.shape, r.shape)
    shape = (1,) * (acc.ndim - len(shape)) + shape
    axes = [i for i, size in enumerate(shape) if size != 1]
    if len(axes) > 1 or any(shape[i] != acc.shape[i] for i in axes) or not r.size:
        return None
    if int(r.min()) < 1 or int(r.max()) > 62:
        return None
    axis = axes[0] if axes else 0
    channels = acc.shape[axis] if axes else 1
    outer = int(np.prod(acc.shape[:axis]))
    source = np.ascontiguousarray(acc).reshape(outer, channels, -1)
    out = np.empty(source.shape, np.int64)
    m_c, r_c = (
        np.ascontiguousarray(
            np.broadcast_to(v.reshape((1,) * (acc.ndim - v.ndim) + v.shape), shape)
        ).reshape(-1)
        for v in (m, r)
    )
    kernels.requantize(source, m_c, r_c, SPLIT_BITS, out)
    return out.reshape(acc.shape)
