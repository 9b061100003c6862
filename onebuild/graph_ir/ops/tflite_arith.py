"""TFLite's requantization (gemmlowp's two roundings), which onert's 8-bit CONV_2D,
DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB and MUL compute: the kernels QConv, QGemm, QAdd
and QMul use it when their attribute `rounding` is "tflite" (models read from circle/tflite:
`serde/circle_arith.py`), else onebuild's own `requantize` (one rounding, half to even)."""

import numpy as np

from ..quant.params import requantize

ROUNDING = "rounding"
TFLITE = "tflite"


def requantize_tflite(acc: np.ndarray, m, r) -> np.ndarray:
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
    """The requantization a kernel's attributes ask for: TFLite's, or onebuild's own."""
    return requantize_tflite if attrs.get(ROUNDING) == TFLITE else requantize
