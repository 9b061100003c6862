"""TFLite's roundings, as onert's kernels compute them, for the kernels of a circle
(`serde/circle_arith.py` sets their attribute `rounding`; without it, onebuild's own):
- "gemmlowp" (QConv, QGemm, QAdd, QMul, a rescaling QAveragePool: CONV_2D, DEPTHWISE_CONV_2D,
  FULLY_CONNECTED, ADD, SUB, MUL): two roundings, half away from zero, where `requantize`
  rounds once, half to even;
- "float32" (QuantizeLinear, DequantizeLinear: QUANTIZE, DEQUANTIZE): x / scale and
  (q - zero point) * scale in float32, quantized codes rounded half away from zero, where
  onebuild computes in float64 and rounds half to even;
- "float32_truncate" (Resize, linear, of uint8 codes: RESIZE_BILINEAR): weights and sum in
  float32, truncated toward zero, where onebuild (as onnxruntime) rounds the exact sum half to
  even: never higher, up to 1 step lower."""

import numpy as np

from ..quant.params import requantize

ROUNDING = "rounding"
GEMMLOWP = "gemmlowp"
FLOAT32 = "float32"
FLOAT32_TRUNCATE = "float32_truncate"


def requantize_gemmlowp(acc: np.ndarray, m, r) -> np.ndarray:
    """RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc << left, m), right) with
    TFLite's shift 31 - r split into left (>= 0) and right (>= 0); acc within int32."""
    acc = np.asarray(acc, np.int64)
    m = np.asarray(m, np.int64)
    exponent = 31 - np.asarray(r, np.int64)
    right = np.maximum(-exponent, 0)
    product = (acc << np.maximum(exponent, 0)) * m  # below 2^62 for int32 operands
    product += np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    high = np.abs(product) >> 31  # the C division truncates toward zero
    high = np.where(product < 0, -high, high)
    mask = (np.int64(1) << right) - 1
    threshold = (mask >> 1) + (high < 0)
    return (high >> right) + ((high & mask) > threshold)


def requantizer(attrs):
    """The requantization a kernel's attributes ask for: gemmlowp's, or onebuild's own."""
    return requantize_gemmlowp if attrs.get(ROUNDING) == GEMMLOWP else requantize


def quantize_float32(x: np.ndarray, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    """clamp(round(x / scale) + zero_point): the division in float32, C's round (half away from
    zero; exact in float64: a float32 plus 0.5 needs at most 25 bits)."""
    ratio = np.asarray(x, np.float32) / np.float32(scale)
    rounded = np.copysign(np.floor(np.abs(ratio.astype(np.float64)) + 0.5), ratio)
    info = np.iinfo(dtype)
    return np.clip(rounded + zero_point, info.min, info.max).astype(dtype)


def dequantize_float32(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """(q - zero_point) * scale in float32."""
    return (np.asarray(q, np.int64) - zero_point).astype(np.float32) * np.float32(scale)


def _bilinear_taps(in_len: int, out_len: int, mode: str):
    """onert's source rows (low, high) and fraction for each output index, in float32."""
    f32 = np.float32
    if mode == "align_corners" and out_len > 1:
        scale = f32(in_len - 1) / f32(out_len - 1)
    else:
        scale = f32(in_len) / f32(out_len)
    index = np.arange(out_len, dtype=f32)
    position = (index + f32(0.5)) * scale - f32(0.5) if mode == "half_pixel" else index * scale
    low = np.maximum(np.floor(position).astype(np.int64), 0)
    high = np.minimum(np.ceil(position).astype(np.int64), in_len - 1)
    return low, high, position - low.astype(f32)


def resize_bilinear_float32(x: np.ndarray, height: int, width: int, mode: str) -> np.ndarray:
    """onert's uint8 RESIZE_BILINEAR of NCHW codes to [height, width] (`mode`: half_pixel,
    align_corners or asymmetric): the four taps' weights and their weighted sum in float32, in
    onert's order, then truncated (cast to the integer type), where onebuild rounds the exact
    sum half to even."""
    f32, one = np.float32, np.float32(1)
    y0, y1, fy = _bilinear_taps(x.shape[-2], height, mode)
    x0, x1, fx = _bilinear_taps(x.shape[-1], width, mode)
    rows = [(y0, one - fy), (y1, fy)]
    columns = [(x0, one - fx), (x1, fx)]
    total = None
    for row, row_weight in rows:
        for column, column_weight in columns:
            weight = row_weight[:, None] * column_weight[None, :]
            term = x[..., row[:, None], column[None, :]].astype(f32) * weight
            total = term if total is None else total + term
    return np.trunc(total).astype(x.dtype)
