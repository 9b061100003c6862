"""gemmlowp's requantization (two roundings), which TFLite's builtin 8-bit kernels and onert's
CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB and MUL compute. The kernels QConv, QGemm,
QAdd and QMul use it when their attribute `rounding` is "gemmlowp" (read from a circle:
`serde/circle_arith.py`), else onebuild's own `requantize` (one rounding, half to even)."""

import numpy as np

from ..quant.params import requantize

ROUNDING = "rounding"
GEMMLOWP = "gemmlowp"


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
