"""A convolution computed whole, run after run (`wholes.py`): `convolve`'s own steps for the
whole output, with its constants prepared once, where those steps are one centered operand, one
float32 GEMM and one float64 requantization (bit-identical to `convolve`, which takes the same
steps for these layers with more Python around them)."""

from collections.abc import Callable

import numpy as np

from . import kernels
from .convolve import centered_codes
from .exact import (
    FLOAT32_EXACT,
    float_scaling,
    per_row,
    product_bound,
    requantize_float,
    requantize_rows,
)
from .lower import Layer
from .windows import padded_rows, window_view


def whole_convolution(
    layer: Layer, weights: np.ndarray, l1: float | None, codes: np.dtype, out_shape, dtype, table
) -> Callable[[np.ndarray], np.ndarray] | None:
    """A function of a convolution's whole input rows (those its output reads) that returns
    its whole output codes as `convolve` does, given its weights as float32, `exact.row_l1` of
    them (None if unknown), the input codes' dtype, the output's shape and dtype and a fused
    consumer's table (or None); None where `convolve` takes other steps: groups, per-channel
    zero points, sums that may leave float32's integers, requantization in int64."""
    a = layer.attrs
    zp = a["x_zero_point"]
    m, oh, ow = out_shape
    if (
        l1 is None
        or a["group"] != 1
        or isinstance(zp, list)
        or isinstance(a["y_zero_point"], list)
        or weights.shape[:2] == (1, 1)  # one input and output channel: the depthwise steps
    ):
        return None
    bound = product_bound(codes, layer.arrays["weights"].dtype)
    info = np.iinfo(codes)
    reach = l1 * max(zp - int(info.min), int(info.max) - zp)  # exact.exact_dot's one chunk
    if FLOAT32_EXACT // bound < 64 or reach >= FLOAT32_EXACT:
        return None
    bias, multiplier, shift = (
        layer.arrays[k][:, None, None] for k in ("bias", "multiplier", "shift")
    )
    params = (a["y_zero_point"], a["qmin"], a["qmax"])
    scaling = float_scaling(bias, multiplier, shift, *params)
    if scaling is False:
        return None
    narrow = scaling[2] is not None  # the accumulators are float32
    rows = per_row(np.empty((m, 1, 1), np.float32), scaling, narrow)
    kernel = weights.reshape(m, -1)
    pointwise = a["kernel"] == [1, 1] and a["strides"] == [1, 1] and not any(a["pads"])

    def run(x: np.ndarray) -> np.ndarray:
        if pointwise:
            cols = centered_codes(x, zp)
        else:
            windows = window_view(
                layer, padded_rows(layer, x, 0, oh, 0, x.shape[2], zp, x.dtype), oh, ow
            )
            patch = windows.transpose(0, 3, 4, 1, 2)  # [C, kh, kw, rows, ow]
            cols = np.empty((kernel.shape[1], oh * ow), np.float32)
            np.subtract(patch, np.float32(zp), out=cols.reshape(patch.shape), dtype=np.float32)
        acc = (kernel @ cols).reshape(m, oh, ow)
        fused = kernels.compiled()
        if fused is not None and rows is not None:
            return requantize_rows(fused, acc, rows, narrow, *params, dtype, table)
        return requantize_float(acc, bias, multiplier, shift, *params, dtype, scaling, table)

    return run
