"""Dynamic quantization operators of ONNX (what `onnxruntime.quantization.quantize_dynamic`
writes): DynamicQuantizeLinear picks uint8 parameters from each tensor's own range at run time;
MatMulInteger and ConvInteger multiply zero-point-centered codes into exact int32 sums. They run
on the CPU in the integer reference; the float rescaling around them (Cast, Mul) stays float.
"""

import numpy as np

from .conv import _MATMUL_BATCH, _matmul_type, conv, conv_type
from .registry import PER_SAMPLE, Attrs, TensorType, register


def _dynamic_types(attrs: Attrs, types) -> list[TensorType]:
    uint8, scalar = np.dtype(np.uint8), ()
    return [
        TensorType(uint8, types[0].shape),
        TensorType(np.dtype(np.float32), scalar),
        TensorType(uint8, scalar),
    ]


# The parameters come from the whole tensor, so samples run together would share them.
@register("DynamicQuantizeLinear", _dynamic_types, batch=None)
def dynamic_quantize_linear(attrs, x):
    """uint8 codes over [min(x, 0), max(x, 0)], computed in float32 as onnxruntime does:
    scale = (hi - lo) / 255, zero point = round(-lo / scale), q = round(x / scale) + zp
    (rounding half to even, saturated)."""
    x = np.asarray(x, np.float32)
    lo = np.float32(min(float(x.min(initial=0.0)), 0.0))
    hi = np.float32(max(float(x.max(initial=0.0)), 0.0))
    scale = np.float32((hi - lo) / np.float32(255))
    if scale == 0:
        return np.zeros(x.shape, np.uint8), scale, np.uint8(0)
    zero_point = np.float32(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(x / scale) + zero_point, 0, 255).astype(np.uint8)
    return q, scale, np.uint8(zero_point)


def _centered(q: np.ndarray, zero_point: np.ndarray | None, axis: int) -> np.ndarray:
    """q - zero_point as int64; a 1-D zero point applies along `axis` (rows of A, columns of
    B)."""
    q = q.astype(np.int64)
    if zero_point is None:
        return q
    zp = np.asarray(zero_point, np.int64)
    if zp.ndim == 1 and zp.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        zp = zp.reshape(shape)
    return q - zp


def _int32(types) -> TensorType:
    return TensorType(np.dtype(np.int32), types.shape)


@register(
    "MatMulInteger",
    lambda attrs, types: [_int32(_matmul_type(attrs, types[:2])[0])],
    batch=_MATMUL_BATCH,
)
def mat_mul_integer(attrs, a, b, a_zero_point=None, b_zero_point=None):
    """(a - a_zero_point) @ (b - b_zero_point), exact in int64, returned as int32."""
    a = _centered(a, a_zero_point, -2)
    b = _centered(b, b_zero_point, -1)
    return np.matmul(a, b).astype(np.int32)


@register(
    "ConvInteger",
    lambda attrs, types: [_int32(conv_type(attrs, types[:2])[0])],
    batch=PER_SAMPLE,
)
def conv_integer(attrs, x, w, x_zero_point=None, w_zero_point=None):
    """Conv of (x - x_zero_point) and (w - w_zero_point, per output channel if 1-D), summed
    exactly (float64 BLAS on integers below 2^53), returned as int32."""
    xc = _centered(x, x_zero_point, 0).astype(np.float64)
    wc = _centered(w, w_zero_point, 0).astype(np.float64)
    return np.rint(conv(attrs, xc, wc)).astype(np.int32)
