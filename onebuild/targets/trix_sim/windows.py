"""Sliding windows of the TRIX simulator: a tile's padded input rows, their window view
(convolutions and pooling), and max/average pooling by the integer rules of
docs/quantization.md."""

from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...graph_ir.quant.params import count_multipliers, requantize
from . import kernels
from .exact import saturate
from .lower import Layer, window_span


def padded_rows(
    layer: Layer, x: np.ndarray, r0: int, rows: int, i0: int, w: int, fill: int, dtype=None
) -> np.ndarray:
    """The input window rows of a tile, padded (top/bottom from the tile's position), as
    `dtype` (default: floats as they are, integers as int64); x itself where nothing pads."""
    a = layer.attrs
    top = r0 * a["strides"][0] - a["pads"][0]  # first logical input row (may be < 0)
    span = window_span(layer, rows)
    left, right = a["pads"][1], a["pads"][3]
    dtype = dtype or (x.dtype if x.dtype.kind == "f" else np.int64)
    start = i0 - top
    if not left and not right and not start and x.shape[1] == span and x.dtype == dtype:
        return x
    padded = np.full((x.shape[0], span, w + left + right), fill, dtype=dtype)
    padded[:, start : start + x.shape[1], left : left + w] = x
    return padded


def window_view(layer: Layer, padded: np.ndarray, rows: int, ow: int) -> np.ndarray:
    """[C, rows, ow, kh, kw] window view (read-only; strides set directly, a few times
    cheaper than sliding_window_view's)."""
    a = layer.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a["dilations"]
    c, h, w = padded.shape
    if (rows - 1) * sh + (kh - 1) * dh >= h or (ow - 1) * sw + (kw - 1) * dw >= w:
        raise ValueError(f"{rows} x {ow} windows do not fit {h} x {w} padded rows")
    s0, s1, s2 = padded.strides
    strides = (s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw)
    return as_strided(padded, (c, rows, ow, kh, kw), strides, writeable=False)


def window_max(layer: Layer, padded: np.ndarray, rows: int, ow: int) -> np.ndarray:
    """[C, rows, ow] maxima of the pooling windows, separably (`_separable`). The vector unit
    takes the kernel's columns first (`perf.pool_ops`); the order does not change a maximum,
    and rows first is the faster one in numpy."""
    return _separable(layer, padded, rows, ow, np.maximum, padded.dtype)


def window_sum(layer: Layer, padded: np.ndarray, rows: int, ow: int) -> np.ndarray:
    """[C, rows, ow] int64 sums of the pooling windows, separably (exact: integers); one
    reduction where a single window covers the padded rows (a global pool)."""
    a = layer.attrs
    if (rows, ow) == (1, 1) and padded.shape[1:] == tuple(a["kernel"]):
        codes, fused = padded.reshape(len(padded), -1), kernels.compiled()
        if fused is None:
            return codes.sum(axis=1, dtype=np.int64)[:, None, None]
        sums = np.empty((len(codes), 1, 1), np.int64)
        fused.row_sums(codes, sums.reshape(-1))
        return sums
    return _separable(layer, padded, rows, ow, np.add, np.int64)


def _separable(layer: Layer, padded: np.ndarray, rows: int, ow: int, ufunc, dtype) -> np.ndarray:
    """`ufunc` over every window as `dtype`: over the kernel's rows at each output row (whole
    contiguous rows, which numpy vectorizes), then over the kernel's columns of those at each
    output column (strided)."""
    a = layer.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a["dilations"]
    width = (ow - 1) * sw + (kw - 1) * dw + 1
    taps = [padded[:, i * dh : i * dh + (rows - 1) * sh + 1 : sh, :width] for i in range(kh)]
    down = ufunc(taps[0], taps[1], dtype=dtype) if kh > 1 else taps[0].astype(dtype)
    for tap in taps[2:]:
        ufunc(down, tap, out=down)
    cols = [down[:, :, j * dw : j * dw + (ow - 1) * sw + 1 : sw] for j in range(kw)]
    result = ufunc(cols[0], cols[1]) if kw > 1 else cols[0].copy()
    for tap in cols[2:]:
        ufunc(result, tap, out=result)
    return result


def pool(
    layer: Layer,
    x: np.ndarray,
    r0: int,
    rows: int,
    i0: int,
    h: int,
    w: int,
    ow: int,
    maximum: bool,
) -> np.ndarray:
    """Output rows [r0, r0 + rows) of a max or average pool from the input rows `x` held from
    row i0 (of h, width w; ow output columns), by the integer rules."""
    a = layer.attrs
    if maximum:
        fill = np.iinfo(x.dtype).min  # the codes themselves: a maximum needs no widening
        padded = padded_rows(layer, x, r0, rows, i0, w, fill, x.dtype)
        return window_max(layer, padded, rows, ow)
    zp = a["x_zero_point"]
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a["dilations"]
    padded = padded_rows(layer, x, r0, rows, i0, w, zp, x.dtype)  # pads hold the zero point
    sums = window_sum(layer, padded, rows, ow)
    sums -= zp * kh * kw
    window = (kh, kw, sh, sw, dh, dw, *a["pads"], bool(a["count_include_pad"]))
    tile = (r0, rows, i0, x.shape[1], h, w, ow, *padded.shape[1:])
    m, r = _count_scaling(float(layer.arrays["ratio"]), window, tile)
    return saturate(layer, requantize(sums, m, r))


@lru_cache(maxsize=4096)
def _count_scaling(ratio: float, window: tuple, tile: tuple) -> tuple[np.ndarray, np.ndarray]:
    """`count_multipliers` of an average pool tile's windows (they depend on its geometry
    only: cached, as np.unique costs tens of microseconds a call)."""
    kh, kw, sh, sw, dh, dw, pad_top, pad_left, pad_bottom, _, include_pad = window
    r0, rows, i0, held, h, w, ow, span, width = tile
    # the inputs each window counts: a row range times a column range of the padded rows
    counted_rows = np.zeros(span, np.int64)
    counted_cols = np.ones(width, np.int64)
    top = r0 * sh - pad_top
    if include_pad:  # explicit pads count, rows beyond them do not
        first, last = max(-pad_top, top), min(h + pad_bottom, top + span)
        counted_rows[first - top : last - top] = 1
    else:
        counted_rows[i0 - top : i0 - top + held] = 1
        counted_cols[:pad_left] = counted_cols[pad_left + w :] = 0
    counts = np.outer(
        _axis_sums(counted_rows, kh, sh, dh, rows), _axis_sums(counted_cols, kw, sw, dw, ow)
    )
    m, r = count_multipliers(ratio, counts)
    m.flags.writeable = r.flags.writeable = False  # shared by every call
    return m, r


def _axis_sums(counted: np.ndarray, kernel: int, stride: int, dilation: int, n: int):
    """Per output position along one axis, the counted inputs its window covers."""
    return sum(
        counted[j * dilation : j * dilation + (n - 1) * stride + 1 : stride] for j in range(kernel)
    )
