"""Quantized operators of the integer reference (rules in docs/quantization.md).

Integer accumulations run through float64 BLAS: every product and partial sum of 8-bit operands
is an integer far below 2^53, so the float64 result is exact, then converted to int64.
"""

import numpy as np

from ..quant.params import dequantize, quantize, requantize
from ..tensor import QuantParams
from .conv import conv, conv_type, gemm, gemm_type
from .registry import Attrs, TensorType, register


def _with_dtype(name_attr: str):
    def infer(attrs: Attrs, types) -> list[TensorType]:
        return [TensorType(np.dtype(attrs[name_attr]), types[0].shape)]

    return infer


def _params(attrs: Attrs) -> QuantParams:
    return QuantParams((attrs["scale"],), (attrs["zero_point"],), None)


@register("QuantizeLinear", _with_dtype("dtype"))
def quantize_linear(attrs, x):
    return quantize(x, _params(attrs), attrs["dtype"])


@register(
    "DequantizeLinear", lambda attrs, types: [TensorType(np.dtype(np.float32), types[0].shape)]
)
def dequantize_linear(attrs, q):
    return dequantize(q, _params(attrs))


def _requantize_channels(attrs: Attrs, acc: np.ndarray, channel_axis: int) -> np.ndarray:
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    m = np.asarray(attrs["multiplier"], np.int64).reshape(shape)
    r = np.asarray(attrs["shift"], np.int64).reshape(shape)
    y = requantize(acc, m, r) + attrs["y_zero_point"]
    return np.clip(y, attrs["qmin"], attrs["qmax"]).astype(attrs["dtype"])


def _float_attrs(attrs: Attrs, keys: tuple[str, ...]) -> Attrs:
    return {k: attrs[k] for k in keys if k in attrs}


def _q_conv_type(attrs: Attrs, types) -> list[TensorType]:
    shape = conv_type(attrs, types[:2])[0].shape
    return [TensorType(np.dtype(attrs["dtype"]), shape)]


@register("QConv", _q_conv_type)
def q_conv(attrs, x, w, b):
    """int conv of (x - x_zero_point) and symmetric weights, int32 bias, requantized."""
    centered = x.astype(np.float64) - attrs["x_zero_point"]
    float_attrs = _float_attrs(attrs, ("strides", "dilations", "pads", "group"))
    acc = conv(float_attrs, centered, w.astype(np.float64), b.astype(np.float64))
    return _requantize_channels(attrs, acc.astype(np.int64), 1)


def _q_gemm_type(attrs: Attrs, types) -> list[TensorType]:
    return [TensorType(np.dtype(attrs["dtype"]), gemm_type(attrs, types[:2])[0].shape)]


@register("QGemm", _q_gemm_type)
def q_gemm(attrs, a, w, b):
    centered = a.astype(np.float64) - attrs["x_zero_point"]
    float_attrs = _float_attrs(attrs, ("transA", "transB"))
    acc = gemm(float_attrs, centered, w.astype(np.float64), b.astype(np.float64))
    return _requantize_channels(attrs, acc.astype(np.int64), 1)
