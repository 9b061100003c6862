"""ONNX converters of quantized models: QuantizeLinear / DequantizeLinear (opset 10-21, also in
the `com.microsoft` domain), the QOperator ops (QLinearConv, QLinearMatMul and onnxruntime's
`com.microsoft` QLinearAdd, QLinearMul, QLinearConcat, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QGemm) and the
dynamic ones
(DynamicQuantizeLinear, MatMulInteger, ConvInteger; kernels in `ops/quantized_dynamic.py`).

A QOperator node becomes its QDQ equivalent: DequantizeLinear on each quantized operand, the
float op (through its own converter), QuantizeLinear on the output. `quant/from_qdq.py` then
folds every DequantizeLinear -> op -> QuantizeLinear group into onebuild's integer kernels, so
both formats give one IR. Scales and zero points must be constants.
"""

import numpy as np

from .. import dtypes
from ..ops import normalize_axis
from ..quant.params import qdq_attrs
from ..tensor import QuantParams
from .onnx_checks import positive
from .onnx_ops import converter, converter_for
from .onnx_ops_nn import _kernel, _spatial

MS = "com.microsoft."
INTEGER_CODES = ("uint8", "int8", "uint16", "int16", "int32")
SUB_BYTE = {"int4": np.int8, "uint4": np.uint8}  # read as 8-bit codes (the same integers)


def _scalar_or_vector(ctx, index: int, what: str) -> np.ndarray | None:
    array = ctx.const(index, what)
    if array is None:
        return None
    if array.ndim > 1:
        raise ctx.fail(
            f"{what} has shape {list(array.shape)}: blocked quantization is not supported "
            "(quantize per tensor or per axis)"
        )
    return array


def _params(ctx, x_shape, s_index: int, zp_index: int, axis: int | None = None) -> QuantParams:
    """The scale and zero point operands at `s_index` / `zp_index` (zero point optional), per
    tensor or, for 1-D operands of more than one value, per axis (`axis`, else the node's
    attribute, default 1)."""
    if int(ctx.attr("block_size", 0) or 0):
        raise ctx.fail(
            "blocked quantization (block_size) is not supported; quantize per tensor or per axis"
        )
    scale = _scalar_or_vector(ctx, s_index, "scale")
    if scale is None:
        raise ctx.fail(f"input {s_index} (a scale) is missing")
    scale = scale.astype(np.float64).reshape(-1)
    zp = _scalar_or_vector(ctx, zp_index, "zero point")
    zero_point = np.zeros(scale.shape, np.int64) if zp is None else zp.astype(np.int64).ravel()
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ctx.fail(f"scales must be finite and positive, got {scale[:4].tolist()}")
    if zero_point.size != scale.size:
        raise ctx.fail(f"{scale.size} scales but {zero_point.size} zero points")
    if scale.size == 1:
        return QuantParams((float(scale[0]),), (int(zero_point[0]),), None)
    axis = normalize_axis(int(ctx.attr("axis", 1)) if axis is None else axis, len(x_shape))
    if x_shape[axis] != scale.size:
        raise ctx.fail(f"{scale.size} scales for axis {axis} of size {x_shape[axis]}")
    return QuantParams(tuple(scale.tolist()), tuple(zero_point.tolist()), axis)


def _code_type(ctx, name: str) -> str:
    if name in SUB_BYTE:
        raise ctx.fail(f"{name} activations are not supported (int4/uint4 weights are)")
    if name not in INTEGER_CODES:
        raise ctx.fail(f"{name} quantization is not supported (integer types only)")
    return name


def quantize(ctx, x, s_index: int, zp_index: int, dtype: str | None = None):
    """A QuantizeLinear IR node on `x` with the node's operands at s_index / zp_index."""
    if x is None:
        raise ctx.fail("the input to quantize is missing")
    zp = ctx.input(zp_index)
    if dtype is None:
        output_dtype = int(ctx.attr("output_dtype", 0) or 0)
        if zp is not None:
            dtype = dtypes.name_of(zp.dtype)
        elif output_dtype:
            dtype = dtypes.name_of(ctx.importer.dtype(output_dtype, "output_dtype"))
        else:
            dtype = "uint8"
    params = _params(ctx, x.shape, s_index, zp_index)
    (q,) = ctx.emit("QuantizeLinear", [x], {**qdq_attrs(params), "dtype": _code_type(ctx, dtype)})
    q.quant = params
    return q


def dequantize(ctx, q, s_index: int, zp_index: int, axis: int | None = None):
    """A DequantizeLinear IR node on codes `q` (kept even on constants: the folding pass needs
    the integer weights); per-axis operands of QOperator nodes along `axis`."""
    if q is None:
        raise ctx.fail("a quantized input is missing")
    name = dtypes.name_of(q.dtype)
    if name in SUB_BYTE:
        if not q.is_const:
            raise ctx.fail(f"{name} activations are not supported (int4/uint4 weights are)")
        q = ctx.graph.add_constant(q.numpy().astype(SUB_BYTE[name]), f"{q.name}_8bit")
    elif name not in INTEGER_CODES:
        raise ctx.fail(f"{name} quantization is not supported (integer types only)")
    params = _params(ctx, q.shape, s_index, zp_index, axis)
    (x,) = ctx.emit("DequantizeLinear", [q], qdq_attrs(params), fold=False)
    scale = ctx.input(s_index)
    if scale is not None and scale.dtype != x.dtype:  # the output takes the scale's type
        (x,) = ctx.emit("Cast", [x], {"to": dtypes.name_of(scale.dtype), "saturate": 1})
    return x


@converter("QuantizeLinear", MS + "QuantizeLinear")
def quantize_linear(ctx):
    _check_inputs(ctx)
    return [quantize(ctx, ctx.inputs[0], 1, 2)]


@converter("DequantizeLinear", MS + "DequantizeLinear")
def dequantize_linear(ctx):
    _check_inputs(ctx)
    return [dequantize(ctx, ctx.inputs[0], 1, 2)]


class _FloatNode:
    """What a float op's converter sees of a QOperator node: the node's attributes, the
    dequantized operands as inputs."""

    def __init__(self, ctx, op_type: str, inputs):
        self._ctx, self.op_type, self.inputs = ctx, op_type, list(inputs)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def input(self, index: int):
        return self.inputs[index] if index < len(self.inputs) else None


# Input counts of the com.microsoft operators (ONNX's own are checked against their schema).
MS_INPUTS = {
    "QGemm": (6, 9),
    "QLinearAdd": (7, 8),
    "QLinearMul": (7, 8),
    "QLinearConcat": (5, None),
    "QLinearAveragePool": (4, 5),
    "QLinearGlobalAveragePool": (4, 5),
    "QLinearSigmoid": (4, 5),
    "QLinearLeakyRelu": (4, 5),
    "QLinearSoftmax": (4, 5),
    "QuantizeLinear": (2, 3),
    "DequantizeLinear": (2, 3),
}


def _check_inputs(ctx) -> None:
    """A com.microsoft node's input count; every input but the optional zero points present."""
    if ctx.node.domain != MS[:-1]:
        return
    least, most = MS_INPUTS[ctx.op_type]
    count = len(ctx.inputs)
    if count < least or (most is not None and count > most):
        takes = f"{least} or more" if most is None else f"{least} to {most}"
        raise ctx.fail(f"has {count} inputs, the operator takes {takes}")


def _float_op(ctx, op_type: str, inputs):
    return converter_for(op_type)(_FloatNode(ctx, op_type, inputs))


def _bias(ctx, index: int, x_scale_index: int, w_scale_index: int):
    """The int32 bias operand, dequantized with scale x_scale * w_scale (per output channel)."""
    bias = ctx.input(index)
    if bias is None:
        return None
    x_scale = ctx.const(x_scale_index, "x scale").astype(np.float64).reshape(-1)
    w_scale = ctx.const(w_scale_index, "w scale").astype(np.float64).reshape(-1)
    scale = (x_scale * w_scale).astype(np.float32).astype(np.float64)
    axis = None if scale.size == 1 else 0
    params = QuantParams(tuple(scale.tolist()), (0,) * scale.size, axis)
    return ctx.emit("DequantizeLinear", [bias], qdq_attrs(params), fold=False)[0]


@converter("QLinearConv")
def q_linear_conv(ctx):
    x = dequantize(ctx, ctx.inputs[0], 1, 2)
    w = dequantize(ctx, ctx.inputs[3], 4, 5, axis=0)  # per output channel
    b = _bias(ctx, 8, 1, 4)
    (y,) = _float_op(ctx, "Conv", [x, w, b])
    return [quantize(ctx, y, 6, 7)]


@converter("QLinearMatMul")
def q_linear_mat_mul(ctx):
    a = dequantize(ctx, ctx.inputs[0], 1, 2)
    b = dequantize(ctx, ctx.inputs[3], 4, 5, axis=-1)  # per column
    (y,) = _float_op(ctx, "MatMul", [a, b])
    return [quantize(ctx, y, 6, 7)]


@converter(MS + "QGemm")
def q_gemm(ctx):
    """A, B, C quantized (C int32 at scale s_a * s_b); y quantized, or float without y_scale."""
    _check_inputs(ctx)
    a = dequantize(ctx, ctx.inputs[0], 1, 2)
    b = dequantize(ctx, ctx.inputs[3], 4, 5, axis=0 if ctx.attr("transB", 0) else 1)
    c = _bias(ctx, 6, 1, 4)
    (y,) = _float_op(ctx, "Gemm", [a, b, c])
    return [y if ctx.input(7) is None else quantize(ctx, y, 7, 8)]


@converter(MS + "QLinearAdd", MS + "QLinearMul")
def q_linear_binary(ctx):
    _check_inputs(ctx)
    a = dequantize(ctx, ctx.inputs[0], 1, 2)
    b = dequantize(ctx, ctx.inputs[3], 4, 5)
    (y,) = _float_op(ctx, ctx.op_type[len("QLinear") :], [a, b])
    return [quantize(ctx, y, 6, 7)]


@converter(MS + "QLinearConcat")
def q_linear_concat(ctx):
    """Inputs: y_scale, y_zero_point, then (x, x_scale, x_zero_point) per operand."""
    _check_inputs(ctx)
    count = len(ctx.inputs) - 2
    if count < 3 or count % 3:
        raise ctx.fail(f"has {len(ctx.inputs)} inputs; expected 2 + 3 per concatenated tensor")
    parts = [dequantize(ctx, ctx.inputs[i], i + 1, i + 2) for i in range(2, len(ctx.inputs), 3)]
    (y,) = _float_op(ctx, "Concat", parts)
    return [quantize(ctx, y, 0, 1)]


@converter(
    MS + "QLinearAveragePool",
    MS + "QLinearGlobalAveragePool",
    MS + "QLinearSigmoid",
    MS + "QLinearLeakyRelu",
)
def q_linear_unary(ctx):
    """Inputs: x, x_scale, x_zero_point, y_scale, y_zero_point (NCHW only)."""
    _check_inputs(ctx)
    if int(ctx.attr("channels_last", 0)):
        raise ctx.fail("channels_last = 1 is not supported (NCHW only)")
    x = dequantize(ctx, ctx.inputs[0], 1, 2)
    (y,) = _float_op(ctx, ctx.op_type[len("QLinear") :], [x])
    return [quantize(ctx, y, 3, 4)]


@converter(MS + "QLinearSoftmax")
def q_linear_softmax(ctx):
    """Inputs: x, x_scale, x_zero_point, y_scale, y_zero_point; the `opset` attribute names
    the Softmax it computes (before 13: over the input coerced to 2-D at `axis`). It folds
    into QSoftmax, within one step of onnxruntime's table-based kernel."""
    _check_inputs(ctx)
    x = dequantize(ctx, ctx.inputs[0], 1, 2)
    softmax = _FloatNode(ctx, "Softmax", [x])
    softmax.opset = int(ctx.attr("opset", ctx.opset))
    (y,) = converter_for("Softmax")(softmax)
    return [quantize(ctx, y, 3, 4)]


@converter("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx):
    return ctx.emit("DynamicQuantizeLinear", ctx.inputs)


@converter("MatMulInteger")
def mat_mul_integer(ctx):
    return ctx.emit("MatMulInteger", [ctx.inputs[0], ctx.inputs[1], ctx.input(2), ctx.input(3)])


@converter("ConvInteger")
def conv_integer(ctx):
    x, w = ctx.inputs[0], ctx.inputs[1]
    strides, dilations, pads = _spatial(ctx, x.shape[2:], _kernel(ctx, x, w))
    group = positive("group", [ctx.attr("group", 1)])[0]
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "group": group}
    return ctx.emit("ConvInteger", [x, w, ctx.input(2), ctx.input(3)], attrs)
