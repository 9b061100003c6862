"""Resize as separable interpolation: each resized axis is one (out x in) weight matrix.

Nearest, linear and cubic (with antialias and exclude_outside) are all per-axis linear maps, so
one matrix per axis covers every mode; tf_crop_and_resize marks out-of-range output coordinates,
which take `extrapolation_value`. Canonical attributes: `sizes` and `scales` (full rank), `roi`
(2 x rank or None), `mode`, `coordinate_transformation_mode`, `nearest_mode`, `cubic_coeff_a`,
`exclude_outside`, `extrapolation_value`, `antialias`.
"""

import math

import numpy as np

from .registry import Attrs, BatchRule, TensorType, register
from .tflite_rounding import FLOAT32_TRUNCATE, ROUNDING, resize_bilinear_float32


def source_coordinates(
    mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float]
) -> np.ndarray:
    """Input coordinate of each output index under a coordinate transformation mode.

    Computed as onnxruntime does, in float32 on the integer output length (onnx.reference uses
    the fractional in_len * scale for align_corners and pytorch_half_pixel; we follow
    onnxruntime, as PyTorch and TFLite do), so nearest ties fall where onnxruntime puts them.
    """
    f32 = np.float32
    o = np.arange(out_len, dtype=f32)
    s, n, out = f32(scale), f32(in_len), f32(out_len)
    if mode == "align_corners":
        return o * (n - 1) / (out - 1) if out_len != 1 else np.zeros(out_len, f32)
    if mode == "asymmetric":  # out / in exactly when the scale is that ratio (onnxruntime's
        if out / n == s:  # result: 7 -> 2 samples 3.5, where float32 o / scale is 3.4999998)
            return (np.arange(out_len) * in_len / out_len).astype(f32)
        return o / s
    if mode == "tf_crop_and_resize":
        start, end = f32(roi[0]), f32(roi[1])
        if out_len != 1:
            return start * (n - 1) + o * (end - start) * (n - 1) / (out - 1)
        return np.full(out_len, 0.5 * (float(start) + float(end)) * (in_len - 1), f32)
    if mode == "pytorch_half_pixel":
        return (o + f32(0.5)) / s - f32(0.5) if out_len != 1 else np.zeros(out_len, f32)
    if mode == "half_pixel":
        return (o + f32(0.5)) / s - f32(0.5)
    if mode == "half_pixel_symmetric":  # onnxruntime mixes float32 and float64 here
        offset = float(n / f32(2) * (f32(1) - out / (s * n)))
        return (offset + (o.astype(np.float64) + 0.5) / float(s) - 0.5).astype(f32)
    raise ValueError(f"unknown coordinate_transformation_mode '{mode}'")


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _taps(attrs: Attrs, ratio: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from floor, weights[out, taps]) for the interpolation mode."""
    mode = attrs.get("mode", "nearest")
    if mode == "nearest":
        rule = attrs.get("nearest_mode", "round_prefer_floor")
        upper = {
            "round_prefer_floor": ratio > 0.5,
            "round_prefer_ceil": ratio >= 0.5,
            "floor": np.zeros_like(ratio, dtype=bool),
            "ceil": np.ones_like(ratio, dtype=bool),
        }[rule] | (ratio == 1.0)
        return np.array([0, 1]), np.stack([~upper, upper], axis=1).astype(np.float64)
    antialias = attrs.get("antialias") and scale < 1
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1 if mode == "linear" else 2
    start = int(math.floor(-reach / s) + 1)
    offsets = np.arange(start, 2 - start)
    distance = (offsets[None, :] - ratio[:, None]) * s
    if mode == "linear":
        weights = np.clip(1 - np.abs(distance), 0, 1)
    else:
        weights = _cubic(distance, attrs.get("cubic_coeff_a", -0.75))
    if antialias:
        weights /= weights.sum(axis=1, keepdims=True)
    return offsets, weights


def interpolation_matrix(attrs: Attrs, axis: int, in_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights [out, in], out-of-range mask [out]) for one axis."""
    out_len, scale = attrs["sizes"][axis], attrs["scales"][axis]
    roi = attrs.get("roi")
    rank = len(attrs["sizes"])
    bounds = (roi[axis], roi[axis + rank]) if roi else (0.0, 1.0)
    coord_mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    x = source_coordinates(coord_mode, out_len, in_len, scale, bounds).astype(np.float64)
    base = np.floor(x)
    ratio = x - base
    integral = ratio == 0
    base[integral] -= 1  # the reference prefers the left neighbour: ratio in (0, 1]
    ratio[integral] = 1.0
    offsets, weights = _taps(attrs, ratio, scale)
    index = base[:, None].astype(np.int64) + offsets[None, :]
    if attrs.get("exclude_outside"):
        weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
        weights /= weights.sum(axis=1, keepdims=True)
    matrix = np.zeros((out_len, in_len))
    rows = np.broadcast_to(np.arange(out_len)[:, None], index.shape)
    np.add.at(matrix, (rows, np.clip(index, 0, in_len - 1)), weights)
    outside = (x < 0) | (x > in_len - 1) if coord_mode == "tf_crop_and_resize" else None
    return matrix, outside


def _one_source(matrix: np.ndarray) -> np.ndarray | None:
    """Per output row, the one input it copies (weight 1, all others 0); None otherwise."""
    source = matrix.argmax(axis=1)
    rows = np.arange(len(matrix))
    if (matrix[rows, source] == 1).all() and np.count_nonzero(matrix) == len(matrix):
        return source
    return None


def _resize_type(attrs: Attrs, types) -> list[TensorType]:
    return [TensorType(types[0].dtype, tuple(attrs["sizes"]))]


# Per sample when axis 0 is not interpolated; N samples need N output rows.
_RESIZE_BATCH = BatchRule(
    (0,),
    condition=lambda node: node.attrs["scales"][0] == 1.0 and not node.attrs.get("roi"),
    rewrite=lambda attrs, n: {**attrs, "sizes": [n, *attrs["sizes"][1:]]},
)


@register("Resize", _resize_type, batch=_RESIZE_BATCH, quant="resize")
def resize(attrs, x):
    if attrs.get(ROUNDING) == FLOAT32_TRUNCATE:  # onert's uint8 bilinear (`tflite_rounding`)
        mode = attrs.get("coordinate_transformation_mode", "half_pixel")
        return resize_bilinear_float32(x, *attrs["sizes"][-2:], mode)
    y = x.astype(np.float64)
    outside = np.zeros(attrs["sizes"], dtype=bool)
    for axis, in_len in enumerate(x.shape):
        if attrs["sizes"][axis] == in_len and attrs["scales"][axis] == 1.0 and not attrs.get("roi"):
            continue
        matrix, out_mask = interpolation_matrix(attrs, axis, in_len)
        source = _one_source(matrix)
        if source is not None:  # each output copies one input (nearest): a gather, exact
            y = np.take(y, source, axis=axis)
        else:
            y = np.moveaxis(np.tensordot(matrix, y, axes=([1], [axis])), 0, axis)
        if out_mask is not None:
            shape = [1] * x.ndim
            shape[axis] = -1
            outside |= out_mask.reshape(shape)
    if outside.any():
        y[outside] = attrs.get("extrapolation_value", 0.0)
    if np.issubdtype(x.dtype, np.integer):  # cubic and antialias overshoot: saturate
        # onnx.reference clamps int8 to its own range; onnxruntime clamps it to [0, 255] (a bug)
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(x.dtype)
