"""Softmax of the integer reference (uint8 and int16; rules in docs/quantization.md, "Softmax").

Integers only: each code's distance below the maximum along the axis, n = max - q, indexes a
fixed-point exponential table (two 256-entry tables, exp(a + b) = exp(a) exp(b), so int16's
65536 distances need 512 entries); the exponentials are summed exactly, one reciprocal per
softmax row turns each into a Q30 fraction, and `requantize` scales that to the output.
"""

import math

import numpy as np

from ..quant.params import requantize
from .registry import TensorType, not_along_axis_0, register

EXP_BITS = 20  # table entries are exp(-s_x * n) in units of 2^-20: exp(0) = 2^20
RECIPROCAL_BITS = 52  # one reciprocal per row: round(2^52 / sum) <= 2^32
FRACTION_BITS = 30  # e / sum as a Q30 fraction, (e * reciprocal) >> 22
TABLE = 256


def exp_table(scale: float) -> np.ndarray:
    """[low; high] int32 tables: low[j] = round(2^20 exp(-scale j)) and high[k] =
    round(2^20 exp(-scale 256 k)) for j, k in [0, 256)."""
    steps = np.arange(TABLE, dtype=np.float64)
    low = np.rint(np.exp(-scale * steps) * (1 << EXP_BITS))
    high = np.rint(np.exp(-scale * TABLE * steps) * (1 << EXP_BITS))
    return np.concatenate([low, high]).astype(np.int32)


def output_multiplier_real(output_scale: float) -> float:
    """The real multiplier from a Q30 fraction to output codes (2^-30 / s_y)."""
    return math.ldexp(1.0, -FRACTION_BITS) / output_scale


def integer_softmax(q: np.ndarray, table: np.ndarray, axis: int, attrs) -> np.ndarray:
    """The integer algorithm on codes `q` along `axis` (attrs: multiplier, shift, y_zero_point,
    qmin, qmax)."""
    n = q.max(axis=axis, keepdims=True).astype(np.int64) - q.astype(np.int64)
    table = table.astype(np.int64)
    low, high = table[n & (TABLE - 1)], table[TABLE + (n >> 8)]
    e = (high * low + (1 << (EXP_BITS - 1))) >> EXP_BITS
    total = e.sum(axis=axis, keepdims=True)  # >= 2^20: the maximum contributes exp(0)
    reciprocal = ((1 << RECIPROCAL_BITS) + total // 2) // total
    shift = RECIPROCAL_BITS - FRACTION_BITS
    fraction = (e * reciprocal + (1 << (shift - 1))) >> shift
    y = requantize(fraction, attrs["multiplier"], attrs["shift"]) + attrs["y_zero_point"]
    return np.clip(y, attrs["qmin"], attrs["qmax"])


def _type(attrs, types) -> list[TensorType]:
    return [TensorType(np.dtype(attrs["dtype"]), types[0].shape)]


@register("QSoftmax", _type, batch=not_along_axis_0(), quantizes=("Softmax",))
def q_softmax(attrs, q, table):
    """Softmax of codes along `axis` by `integer_softmax`, in the output dtype."""
    axis = attrs.get("axis", -1) % q.ndim
    return integer_softmax(q, table, axis, attrs).astype(attrs["dtype"])
