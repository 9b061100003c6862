"""Convolution tiles of the TRIX simulator: exact integer accumulators on float32 BLAS
(exact.exact_dot) and their requantization to output codes, in float64 where a bound proves it
exact (exact.requantize_float), else in int64."""

import math

import numpy as np

from ...graph_ir.quant.params import requantize
from . import kernels
from .exact import (
    exact_dot,
    exact_int,
    float_scaling,
    lookup,
    product_bound,
    requantize_float,
    scale_in_place,
)
from .lower import Layer
from .windows import padded_rows, window_view


def convolve(
    layer: Layer,
    x,
    wq,
    r0: int,
    rows: int,
    ch0: int,
    chs: int,
    i0: int,
    w: int,
    ow: int,
    dtype,
    norms: tuple[float, float] | None = None,
    scalings: dict | None = None,
    table: np.ndarray | None = None,
) -> np.ndarray:
    """Output codes of rows [r0, r0 + rows) and channels [ch0, ch0 + chs) of a convolution
    from its input rows `x` (held from row i0, width w) and the channels' weights `wq` (codes,
    or the same values as float32; `norms`: `exact.row_norm` and `exact.row_l1` of them as a
    matrix, if known);
    `dtype` is the output's (the int64 path may return int64). `scalings`: a cache of the
    requantization constants (`requant_channels`); `table`: codes of `dtype` to look the
    results up in (a fused consumer's), if any."""
    a = layer.attrs
    zp = a["x_zero_point"]
    bound = product_bound(x.dtype, layer.arrays["weights"].dtype)  # wq may be float32
    group = a["group"]
    out_channels = layer.arrays["weights"].shape[0]
    per_group_out, per_group_in = out_channels // group, wq.shape[1]
    pointwise = a["kernel"] == [1, 1] and a["strides"] == [1, 1] and not any(a["pads"])
    if per_group_in == 1 and per_group_out == 1:  # depthwise: taps on the vector unit
        if isinstance(zp, list):  # one zero point per input channel (x holds all of them)
            zp = np.asarray(zp, np.float32)[:, None, None]
        centered = np.subtract(x, np.float32(zp), dtype=np.float32)  # exact: |x - zp| < 2^17
        padded = padded_rows(layer, centered, r0, rows, i0, w, 0)
        windows = window_view(layer, padded, rows, ow)
        taps = wq.reshape(chs, 1, 1, *wq.shape[2:]).astype(np.float64)
        acc = np.einsum("crwij,crwij->crw", windows[ch0 : ch0 + chs], taps)  # exact
    else:
        info, zps = np.iinfo(x.dtype), np.ravel(zp)
        widest = max(int(zps.max()) - int(info.min), int(info.max) - int(zps.min()))  # |x - zp|
        centered = isinstance(zp, list)  # one zero point per input channel (scales folded)
        if centered:  # exact: |x - zp| < 2^17; pads are then 0, each channel's zero point
            x = np.subtract(x, np.asarray(zp, np.float32)[:, None, None], dtype=np.float32)
            zp = 0
        if pointwise and centered:
            windows = x[..., None, None]
        elif pointwise:  # the input tile is already the im2col matrix
            windows = centered_codes(x, zp).reshape(x.shape)[..., None, None]
        else:  # codes, padded with the zero point: centered as the im2col matrix is made
            windows = window_view(
                layer, padded_rows(layer, x, r0, rows, i0, w, zp, x.dtype), rows, ow
            )
        parts = []
        for g in range(ch0 // per_group_out, (ch0 + chs - 1) // per_group_out + 1):
            lo, hi = max(ch0, g * per_group_out), min(ch0 + chs, (g + 1) * per_group_out)
            patch = windows[g * per_group_in : (g + 1) * per_group_in]  # [Cg, rows, ow, kh, kw]
            patch = patch.transpose(0, 3, 4, 1, 2)
            if pointwise:
                cols = patch.reshape(-1, rows * ow)  # a view
            else:
                cols = np.empty(
                    (patch.shape[0] * patch.shape[1] * patch.shape[2], rows * ow), np.float32
                )
                np.subtract(patch, np.float32(zp), out=cols.reshape(patch.shape), dtype=np.float32)
            kernel = wq[lo - ch0 : hi - ch0].reshape(hi - lo, -1)
            known, reach = (None, None) if norms is None or group > 1 else norms
            if reach is not None:  # times the largest |x - zp| (pads are zp)
                reach *= widest
            part = exact_dot(kernel, cols, bound, keep_float=True, a_norm=known, reach=reach)
            parts.append(part.reshape(hi - lo, rows, ow))
        acc = parts[0] if len(parts) == 1 else np.concatenate(parts)
    bound *= math.prod(wq.shape[1:])
    return requant_channels(layer, acc, ch0, chs, bound, dtype, scalings, table)


def centered_codes(x: np.ndarray, zp: int) -> np.ndarray:
    """[C, H W] float32 codes less the zero point of C x H x W codes `x` (exact: |x - zp| <
    2^17); in one compiled pass where the kernels are loaded (numpy's cast is buffered)."""
    fused = kernels.compiled()
    if fused is None:
        return np.subtract(x, np.float32(zp), dtype=np.float32).reshape(len(x), -1)
    out = np.empty((len(x), x.shape[1] * x.shape[2]), np.float32)
    fused.center(x, np.float32(zp), out)
    return out


def requant_channels(
    layer: Layer, acc: np.ndarray, ch0: int, chs: int, bound: int, dtype, scalings=None, table=None
) -> np.ndarray:
    """Output codes of channels [ch0, ch0 + chs) from their accumulators without bias
    (integers, |acc| <= bound, in int64 or float; may be updated in place): in float64
    where that is provably exact, else in int64. `scalings`: a dict that keeps the float64
    constants (`exact.float_scaling`) per layer and channel range across calls; `table`:
    codes of `dtype` to look the results up in, if any.

    An output quantized per channel (lists of zero points and clamps) is requantized with
    zero point 0 and the widest clamp [min(qmin - zp), max(qmax - zp)] over the channels into
    int32, then offset and clamped per channel: clip(clip(v, L, H) + zp, qmin, qmax) equals
    clip(v + zp, qmin, qmax) when [qmin - zp, qmax - zp] lies inside [L, H]."""
    a = layer.attrs
    if not isinstance(a["y_zero_point"], list):
        return _requant(layer, acc, ch0, chs, bound, dtype, scalings, a, table)
    zp, low, high = (
        np.asarray(a[k], np.int64)[ch0 : ch0 + chs, None, None]
        for k in ("y_zero_point", "qmin", "qmax")
    )
    wide = {"y_zero_point": 0, "qmin": int((low - zp).min()), "qmax": int((high - zp).max())}
    y = _requant(layer, acc, ch0, chs, bound, np.int32, scalings, wide)
    y = np.clip(y + zp, low, high).astype(dtype)
    return y if table is None else lookup(table, y)


def _requant(layer: Layer, acc, ch0: int, chs: int, bound: int, dtype, scalings, a, table=None):
    """`requant_channels` with one output zero point and clamp (`a`)."""
    bias = layer.arrays["bias"][ch0 : ch0 + chs, None, None]
    m = layer.arrays["multiplier"][ch0 : ch0 + chs, None, None]
    r = layer.arrays["shift"][ch0 : ch0 + chs, None, None]
    zp, qmin, qmax = a["y_zero_point"], a["qmin"], a["qmax"]
    key = (layer.name, ch0, chs)
    scaling = None if scalings is None else scalings.get(key)
    if scaling is None:
        scaling = float_scaling(bias, m, r, zp, qmin, qmax)
        if scalings is not None:
            scalings[key] = scaling
    y = requantize_float(acc, bias, m, r, zp, qmin, qmax, dtype, scaling, table)
    if y is not None:
        return y
    acc = exact_int(acc) if acc.dtype.kind == "f" else acc
    y = scale_in_place(acc, bias, m, r, zp, bound)
    if y is None:
        y = np.clip(requantize(acc + bias, m, r) + zp, qmin, qmax)
    else:
        y = np.clip(y, qmin, qmax, out=y)
    return y if table is None else lookup(table, y.astype(dtype))
