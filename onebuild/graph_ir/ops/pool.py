"""Pooling. Windows are reduced one spatial axis at a time, a strided slice per kernel tap.

Canonical attributes: `kernel_shape`, `strides`, `dilations`, `pads` (begins, then ends),
`ceil_mode`, and for AveragePool `count_include_pad`.
"""

import math

import numpy as np

from .conv import pad_spatial
from .registry import PER_SAMPLE, Attrs, TensorType, register


def pool_output_shape(attrs: Attrs, spatial: tuple[int, ...]) -> tuple[int, ...]:
    nd, pads = len(spatial), attrs["pads"]
    out = []
    for i, size in enumerate(spatial):
        k, s, d = attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i]
        span = size + pads[i] + pads[i + nd] - d * (k - 1) - 1
        if attrs.get("ceil_mode"):
            length = math.ceil(span / s) + 1
            if (length - 1) * s >= size + pads[i]:  # last window would start in the end padding
                length -= 1
        else:
            length = span // s + 1
        if length < 1:
            raise ValueError(f"pooling window {k} does not fit the input size {size}")
        out.append(length)
    return tuple(out)


def _pool_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    return [TensorType(x.dtype, (*x.shape[:2], *pool_output_shape(attrs, x.shape[2:])))]


def _padded(attrs: Attrs, x: np.ndarray, value) -> tuple[np.ndarray, tuple[int, ...]]:
    """x padded explicitly and for ceil mode with `value`, and the pads used."""
    nd = x.ndim - 2
    out = pool_output_shape(attrs, x.shape[2:])
    pads = list(attrs["pads"])
    for i in range(nd):
        needed = (
            (out[i] - 1) * attrs["strides"][i]
            + attrs["dilations"][i] * (attrs["kernel_shape"][i] - 1)
            + 1
        )
        pads[i + nd] += max(0, needed - (x.shape[2 + i] + pads[i] + pads[i + nd]))
    return pad_spatial(x, pads, value), tuple(pads)


def _reduce_windows(attrs: Attrs, xp: np.ndarray, out: tuple[int, ...], combine) -> np.ndarray:
    """Combine each window of the padded xp, one spatial axis at a time.

    A box's max (or sum) is the max over one axis of the maxima over the others, so this takes
    k1 + k2 + ... passes over shrinking arrays instead of k1 * k2 * ... over the output.
    """
    y = xp
    for i, size in enumerate(out):
        k, s, d = attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i]
        before = (slice(None),) * (2 + i)
        taps = [y[(*before, slice(j * d, j * d + (size - 1) * s + 1, s))] for j in range(k)]
        reduced = taps[0].copy()
        for tap in taps[1:]:
            combine(reduced, tap, out=reduced)
        y = reduced
    return y


@register("MaxPool", _pool_type, batch=PER_SAMPLE, quant="passthrough")
def max_pool(attrs, x):
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    xp, _ = _padded(attrs, x, lowest)
    return _reduce_windows(attrs, xp, pool_output_shape(attrs, x.shape[2:]), np.maximum)


def window_sums(attrs: Attrs, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-window sums of x (padding adds 0) and the divisor of each window.

    The divisor counts explicit pads only with `count_include_pad`, never ceil-mode overhang.
    """
    nd = x.ndim - 2
    out = pool_output_shape(attrs, x.shape[2:])
    xp, pads = _padded(attrs, x, 0)
    counted = np.zeros((1, 1, *xp.shape[2:]), dtype=np.int64)
    if attrs.get("count_include_pad"):
        region = tuple(
            slice(0, x.shape[2 + i] + attrs["pads"][i] + attrs["pads"][i + nd]) for i in range(nd)
        )
    else:
        region = tuple(slice(pads[i], pads[i] + x.shape[2 + i]) for i in range(nd))
    counted[(0, 0, *region)] = 1
    return (
        _reduce_windows(attrs, xp, out, np.add),
        _reduce_windows(attrs, counted, out, np.add),
    )


@register("AveragePool", _pool_type, batch=PER_SAMPLE, quant="average_pool")
def average_pool(attrs, x):
    """Mean over each window (divisor as in `window_sums`)."""
    total, counts = window_sums(attrs, x)
    return (total / counts.astype(x.dtype)).astype(x.dtype, copy=False)


def _global_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (len(x.shape) - 2))))]


@register("GlobalAveragePool", _global_type, batch=PER_SAMPLE, quant="average_pool")
def global_average_pool(attrs, x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@register("GlobalMaxPool", _global_type, batch=PER_SAMPLE, quant="passthrough")
def global_max_pool(attrs, x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)
