"""Elementwise operators: arithmetic, activations, comparisons.

Add, Conv, Gemm and MatMul may carry a fused activation, the attribute `clip = [lo, hi]`
(Relu is [0, inf], Relu6 is [0, 6]); `apply_clip` applies it.
"""

import numpy as np

from ..compiled import compiled
from .registry import (
    BROADCASTING,
    PER_SAMPLE,
    Attrs,
    TensorType,
    broadcast,
    register,
    same_as_input,
    with_dtype,
)


def apply_clip(attrs: Attrs, y: np.ndarray) -> np.ndarray:
    """Apply a fused `clip` activation in place where the node has one."""
    bounds = attrs.get("clip")
    if bounds is None:
        return y
    lo, hi = bounds
    out = y if y.flags.writeable else None
    if hi == float("inf"):  # Relu: one pass instead of clip's two comparisons
        return np.maximum(y, np.asarray(lo, y.dtype), out=out)
    return np.clip(y, lo, hi, out=out)


def _same_dtype(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    return x if x.dtype == like.dtype else x.astype(like.dtype)


@register("Add", broadcast, batch=BROADCASTING, quant="binary", onnx={})
def add(attrs, a, b):
    return apply_clip(attrs, _same_dtype(np.add(a, b), a))


@register("Sub", broadcast, batch=BROADCASTING, quant="binary", onnx={})
def sub(attrs, a, b):
    return _same_dtype(np.subtract(a, b), a)


@register("Mul", broadcast, batch=BROADCASTING, quant="binary", onnx={})
def mul(attrs, a, b):
    return _same_dtype(np.multiply(a, b), a)


@register("Div", broadcast, batch=BROADCASTING, onnx={})
def div(attrs, a, b):
    """Float division; integer division truncates toward zero (as C and onnxruntime do)."""
    if np.issubdtype(a.dtype, np.integer):
        q = np.floor_divide(a, b)
        inexact = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return _same_dtype(q + inexact, a)
    return _same_dtype(np.divide(a, b), a)


@register("Pow", broadcast, batch=BROADCASTING, onnx={})
def pow_(attrs, a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
    return _same_dtype(np.power(a, b.astype(a.dtype)), a)


@register("Max", broadcast, batch=BROADCASTING)
def maximum(attrs, *xs):
    return _same_dtype(np.maximum.reduce(np.broadcast_arrays(*xs)), xs[0])


@register("Min", broadcast, batch=BROADCASTING)
def minimum(attrs, *xs):
    return _same_dtype(np.minimum.reduce(np.broadcast_arrays(*xs)), xs[0])


@register("PRelu", broadcast, batch=BROADCASTING, onnx={})
def prelu(attrs, x, slope):
    return _same_dtype(np.where(x < 0, x * slope, x), x)


@register("Equal", with_dtype(np.bool_), batch=BROADCASTING, onnx={})
def equal(attrs, a, b):
    return np.equal(a, b)


@register("Less", with_dtype(np.bool_), batch=BROADCASTING, onnx={})
def less(attrs, a, b):
    return np.less(a, b)


@register("Greater", with_dtype(np.bool_), batch=BROADCASTING, onnx={})
def greater(attrs, a, b):
    return np.greater(a, b)


BOOLEAN = with_dtype(np.bool_)


def _elementwise(name: str, fn, infer=broadcast):
    """The ONNX binary elementwise operator `name`: `fn` of its broadcast operands."""

    @register(name, infer, batch=BROADCASTING, onnx={})
    def kernel(attrs, a, b):
        return fn(a, b)

    kernel.__name__ = name.lower()
    return kernel


_elementwise("GreaterOrEqual", np.greater_equal, BOOLEAN)
_elementwise("LessOrEqual", np.less_equal, BOOLEAN)
_elementwise("And", np.logical_and, BOOLEAN)
_elementwise("Or", np.logical_or, BOOLEAN)
_elementwise("Xor", np.logical_xor, BOOLEAN)
_elementwise("BitwiseAnd", np.bitwise_and)
_elementwise("BitwiseOr", np.bitwise_or)
_elementwise("BitwiseXor", np.bitwise_xor)


def _shift_type(attrs, types):
    if attrs.get("direction") not in ("LEFT", "RIGHT"):
        raise ValueError(f"direction must be LEFT or RIGHT, got {attrs.get('direction')!r}")
    return broadcast(attrs, types)


@register("BitShift", _shift_type, batch=BROADCASTING, onnx={"direction": str})
def bit_shift(attrs, x, shift):
    """x shifted LEFT or RIGHT (`direction`) by `shift` bits, wrapping within the type; a shift
    outside [0, width) gives the full-width result: 0, or the sign for a right shift of a signed
    value (numpy's, and ONNX's, not C's masking of the count)."""
    width = x.dtype.itemsize * 8
    outside = (shift < 0) | (shift >= width)
    count = np.where(outside, 0, shift).astype(x.dtype)
    if attrs["direction"] == "LEFT":
        return np.where(outside, np.zeros((), x.dtype), np.left_shift(x, count))
    fill = np.right_shift(x, width - 1) if x.dtype.kind == "i" else np.zeros((), x.dtype)
    return np.where(outside, fill, np.right_shift(x, count))


@register("Mod", broadcast, batch=BROADCASTING, onnx={"fmod": int})
def mod(attrs, a, b):
    """Integer `Mod` takes the divisor's sign (Python's %); `fmod` the dividend's (C's fmod)."""
    if attrs.get("fmod"):
        return _same_dtype(np.fmod(a, b), a)
    return _same_dtype(np.mod(a, b), a)


def _where_type(attrs, types):
    return [TensorType(types[1].dtype, broadcast(attrs, types)[0].shape)]


@register("Where", _where_type, batch=BROADCASTING, onnx={})
def where(attrs, cond, a, b):
    return np.where(cond, a, b)


def _unary(name: str, fn, quant: str | None = None):
    """The ONNX unary elementwise operator `name`, per sample; `quant="lookup"` quantizes it as
    a table over every input code, None keeps it in float. float16 is computed in float32 and
    rounded once, as onnxruntime does (rounding each step lost Sigmoid's tail)."""

    @register(name, same_as_input, batch=PER_SAMPLE, quant=quant, onnx={})
    def kernel(attrs, x):
        return _same_dtype(fn(x.astype(np.float32) if x.dtype == np.float16 else x), x)

    kernel.__name__ = name.lower()
    return kernel


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without cancellation: e^x / (1 + e^x) below 0 keeps the tail (the tanh
    form rounded to 0 below -17 in float32)."""
    tail = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + tail), tail / (1 + tail)).astype(np.result_type(x, 0.5))


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) without overflow."""
    return np.logaddexp(np.zeros((), x.dtype), x)


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 in float64: absolute error below 1.5e-7 (float32 resolution)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


_unary("Erf", _erf, quant="lookup")
_unary("Sqrt", np.sqrt)
_unary("Neg", np.negative, quant="lookup")
_unary("Abs", np.abs, quant="lookup")
_unary("Exp", np.exp, quant="lookup")
_unary("Log", np.log)
_unary("Floor", np.floor)
_unary("Ceil", np.ceil)
_unary("Reciprocal", np.reciprocal)
_unary("Tanh", np.tanh, quant="lookup")
_unary("Sigmoid", _sigmoid, quant="lookup")
_unary("Not", np.logical_not)
_unary("BitwiseNot", np.invert)
_unary("Round", np.rint, quant="lookup")  # half to even, as ONNX specifies
_unary("Sign", np.sign, quant="lookup")
_unary("Softsign", lambda x: x / (1 + np.abs(x)), quant="lookup")
_unary("Softplus", _softplus, quant="lookup")
_unary("Mish", lambda x: x * np.tanh(_softplus(x)), quant="lookup")
_unary("Sin", np.sin, quant="lookup")
_unary("Cos", np.cos, quant="lookup")
_unary("Atan", np.arctan, quant="lookup")
for _name in "Tan Sinh Cosh".split():
    _unary(_name, getattr(np, _name.lower()))
for _name in "Asin Acos Asinh Acosh Atanh".split():
    _unary(_name, getattr(np, "arc" + _name[1:].lower()))


@register("IsNaN", with_dtype(np.bool_), batch=PER_SAMPLE, onnx={})
def is_nan(attrs, x):
    return np.isnan(x)


@register(
    "IsInf",
    with_dtype(np.bool_),
    batch=PER_SAMPLE,
    onnx={"detect_positive": int, "detect_negative": int},
)
def is_inf(attrs, x):
    positive, negative = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    return np.isinf(x) & (((x > 0) & bool(positive)) | ((x < 0) & bool(negative)))


@register("Gelu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"approximate": str})
def gelu(attrs, x):
    """0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation when `approximate` is "tanh"."""
    if attrs.get("approximate", "none") == "tanh":
        inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)
        return _same_dtype(0.5 * x * (1 + np.tanh(inner)), x)
    return _same_dtype(0.5 * x * (1 + _erf(x / np.sqrt(2))), x)


@register("Relu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={})
def relu(attrs, x):
    return np.maximum(x, np.zeros((), x.dtype))


@register("LeakyRelu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"alpha": float})
def leaky_relu(attrs, x):
    return _same_dtype(np.where(x < 0, x * attrs.get("alpha", 0.01), x), x)


@register("Elu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"alpha": float})
def elu(attrs, x):
    return _same_dtype(np.where(x > 0, x, attrs.get("alpha", 1.0) * np.expm1(x)), x)


@register("Celu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"alpha": float})
def celu(attrs, x):
    alpha = attrs.get("alpha", 1.0)
    return _same_dtype(np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha)), x)


@register(
    "Selu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"alpha": float, "gamma": float}
)
def selu(attrs, x):
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    return _same_dtype(gamma * np.where(x > 0, x, alpha * np.expm1(x)), x)


@register("ThresholdedRelu", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"alpha": float})
def thresholded_relu(attrs, x):
    return np.where(x > attrs.get("alpha", 1.0), x, np.zeros((), x.dtype))


@register(
    "Shrink", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={"bias": float, "lambd": float}
)
def shrink(attrs, x):
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return _same_dtype(y, x)


@register(
    "HardSigmoid",
    same_as_input,
    batch=PER_SAMPLE,
    quant="lookup",
    onnx={"alpha": float, "beta": float},
)
def hard_sigmoid(attrs, x):
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    return _same_dtype(np.clip(wide * attrs.get("alpha", 0.2) + attrs.get("beta", 0.5), 0, 1), x)


@register("HardSwish", same_as_input, batch=PER_SAMPLE, quant="lookup", onnx={})
def hard_swish(attrs, x):
    kernels = compiled(x.size) if x.dtype in (np.float32, np.float64) else None
    if kernels is not None:  # one pass instead of five, the same bits
        out = np.empty(x.shape, x.dtype)
        kernels.hard_swish(np.ascontiguousarray(x), np.array([6.0, 0.5, 0.0, 1.0], x.dtype), out)
        return out
    return _same_dtype(x * np.clip(x / 6.0 + 0.5, 0, 1), x)


@register("Swish", same_as_input, batch=PER_SAMPLE, quant="lookup")
def swish(attrs, x):
    """x * sigmoid(alpha x) (SiLU when alpha is 1), as ONNX opset 24 defines it."""
    return _same_dtype(x * _sigmoid(attrs.get("alpha", 1.0) * x), x)


@register("Clip", same_as_input, batch=BROADCASTING, quant="lookup")
def clip(attrs, x, lo=None, hi=None):
    """Clip to [lo, hi]; an omitted bound is unbounded."""
    if lo is not None:
        x = np.maximum(x, lo.astype(x.dtype))
    if hi is not None:
        x = np.minimum(x, hi.astype(x.dtype))
    return x
