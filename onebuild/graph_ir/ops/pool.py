"""Pooling. Windows are reduced by looping over kernel offsets with vectorized slices.

Canonical attributes: `kernel_shape`, `strides`, `dilations`, `pads` (begins, then ends),
`ceil_mode`, and for AveragePool `count_include_pad`.
"""

import math

import numpy as np

from .conv import pad_spatial, window_view
from .registry import Attrs, TensorType, register


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


def _padded_windows(attrs: Attrs, x: np.ndarray, value) -> tuple[np.ndarray, tuple[int, ...]]:
    """Pad explicitly and for ceil mode, and return the [N, C, *out, *k] window view."""
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
    xp = pad_spatial(x, pads, value)
    view = window_view(xp, tuple(attrs["kernel_shape"]), attrs["strides"], attrs["dilations"])
    slices = tuple(slice(0, o) for o in out)
    return view[(slice(None), slice(None), *slices)], tuple(pads)


def _reduce_windows(view: np.ndarray, nd: int, combine) -> np.ndarray:
    kernel = view.shape[2 + nd :]
    offsets = list(np.ndindex(*kernel))
    y = np.array(view[(Ellipsis, *offsets[0])], copy=True)
    for offset in offsets[1:]:
        combine(y, view[(Ellipsis, *offset)], out=y)
    return y


@register("MaxPool", _pool_type)
def max_pool(attrs, x):
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    view, _ = _padded_windows(attrs, x, lowest)
    return _reduce_windows(view, x.ndim - 2, np.maximum)


def window_sums(attrs: Attrs, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-window sums of x (padding adds 0) and the divisor of each window.

    The divisor counts explicit pads only with `count_include_pad`, never ceil-mode overhang.
    """
    nd = x.ndim - 2
    view, pads = _padded_windows(attrs, x, 0)
    total = _reduce_windows(view, nd, np.add)
    counted = np.zeros((1, 1, *(np.array(x.shape[2:]) + pads[:nd] + pads[nd:])), dtype=np.int64)
    if attrs.get("count_include_pad"):
        region = tuple(
            slice(0, x.shape[2 + i] + attrs["pads"][i] + attrs["pads"][i + nd]) for i in range(nd)
        )
    else:
        region = tuple(slice(pads[i], pads[i] + x.shape[2 + i]) for i in range(nd))
    counted[(0, 0, *region)] = 1
    count_view = window_view(
        counted, tuple(attrs["kernel_shape"]), attrs["strides"], attrs["dilations"]
    )
    count_view = count_view[(slice(None), slice(None), *(slice(0, s) for s in total.shape[2:]))]
    return total, _reduce_windows(count_view, nd, np.add)


@register("AveragePool", _pool_type)
def average_pool(attrs, x):
    """Mean over each window (divisor as in `window_sums`)."""
    total, counts = window_sums(attrs, x)
    return (total / counts.astype(x.dtype)).astype(x.dtype, copy=False)


def _global_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    return [TensorType(x.dtype, (*x.shape[:2], *([1] * (len(x.shape) - 2))))]


@register("GlobalAveragePool", _global_type)
def global_average_pool(attrs, x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


@register("GlobalMaxPool", _global_type)
def global_max_pool(attrs, x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)
