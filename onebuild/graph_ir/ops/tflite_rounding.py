"""TFLite's roundings, as onert's kernels compute them, for the kernels of a circle
(`serde/circle_arith.py` sets their attribute `rounding`; without it, onebuild's own):
- "gemmlowp" (QConv, QGemm, QAdd, QMul: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB,
  MUL): two roundings, half away from zero, where `requantize` rounds once, half to even;
- "float32" (QuantizeLinear, DequantizeLinear: QUANTIZE, DEQUANTIZE): x / scale and
  (q - zero point) * scale in float32, quantized codes rounded half away from zero, where
  onebuild computes in float64 and rounds half to even."""

import numpy as np

from ..quant.params import requantize

ROUNDING = "rounding"
GEMMLOWP = "gemmlowp"
FLOAT32 = "float32"


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
