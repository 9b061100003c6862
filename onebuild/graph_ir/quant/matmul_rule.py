"""The quantization rule "matmul": Conv, Gemm and MatMul with constant weights -> QConv / QGemm.

Weights symmetric per channel or per tensor (int8, int16 with int16 activations), the integer
bias with scale s_x*s_w, corrected with the calibration means of the layer's input channels by
the mean output shift the weight rounding causes; per-channel input scales folded into the
weights on edges `channel_activations` chose; a MatMul [..., K] @ [K, N] as a QGemm on its rows.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..ir import Node, Value
from ..ops import weight_axes
from ..ops.quantized import recording_float_op
from ..tensor import QuantParams
from .bias_correction import corrected_bias
from .channel_activations import folded_weights, folds_scales
from .kernel_attrs import channel_bias, matmul_attrs
from .params import BIAS_ROOM, bias_fitting, quantize, weight_params

if TYPE_CHECKING:
    from .quantize_graph import _Quantizer


def matmul_ok(quantizer: "_Quantizer", node: Node) -> bool:
    """Conv, Gemm and MatMul qualify with constant weights (MatMul: [..., K] @ [K, N]) and a
    constant bias of one value per output channel (`channel_bias`)."""
    weight = node.inputs[1]
    if not weight.is_const or node.attrs.get("transA"):
        return False
    if node.op == "MatMul" and (len(weight.shape) != 2 or len(node.inputs[0].shape) < 2):
        return False
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is None:
        return True
    channels = weight.shape[weight_axes(node).out]
    return bias.is_const and channel_bias(bias.numpy(), channels) is not None


def nearest(node: Node, weight: np.ndarray, params: QuantParams, dtype: str) -> np.ndarray:
    """Weight codes rounded to nearest (the default `WeightRounder`)."""
    return quantize(weight, params, dtype)


WeightRounder = Callable[[Node, np.ndarray, QuantParams, str], np.ndarray]


def quantize_matmul(quantizer: "_Quantizer", node: Node, dtype: str, w_dtype: str) -> None:
    """Emit the QConv / QGemm of `node` computing in `dtype` with `w_dtype` weights."""
    x = quantizer.as_quant(node.inputs[0], dtype)
    out_dtype = quantizer.settings[id(node)].writes  # uint8 sums may be written as int16
    out_params = quantizer.params(node.output, out_dtype)
    w = node.inputs[1].numpy().astype(np.float64)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    b = None if bias is None else bias.numpy().astype(np.float64)
    if node.op == "Gemm":
        w = w * node.attrs.get("alpha", 1.0)
        b = None if b is None else b * node.attrs.get("beta", 1.0)
    channel_axis = weight_axes(node).out
    per_channel = quantizer.settings[id(node)].granularity == "channel"
    channels = w.shape[channel_axis]
    fold = folds_scales(node, x)  # W'[o, c] = W[o, c] s_x[c]; x in units of its steps
    if fold:
        w = folded_weights(w, x.quant.scale, node.attrs["group"])
    s_x = np.ones(channels) if fold else np.asarray(x.quant.scale, np.float64)
    s_x = np.broadcast_to(s_x, (channels,))
    b_type = np.int64 if dtype == "int16" else np.int32
    limit = np.iinfo(b_type)
    b_real = np.zeros(channels) if b is None else channel_bias(b, channels)
    w_params = weight_params(w, w_dtype, channel_axis if per_channel else None)
    s_y = np.broadcast_to(np.asarray(out_params.scale, np.float64), (channels,))
    w_params = bias_fitting(w_params, b_real, s_x, s_y, b_type)
    scales = np.broadcast_to(np.asarray(w_params.scale), (channels,))
    rounder = nearest if fold else quantizer.round_weights  # its moments are of x, not of x / s_x
    wq = rounder(node, w, w_params, w_dtype)
    mean = quantizer.means.get(node.inputs[0].name)
    if mean is not None:
        mean = mean / np.asarray(x.quant.scale) if fold else mean
        b_real = corrected_bias(node, w, wq, w_params.scale, b_real, mean, channel_axis)
    top = float(min(limit.max, BIAS_ROOM))  # exact in float64 (2^63 - 1 is not)
    bq = np.clip(np.rint(b_real / (s_x * scales)), -top, top).astype(b_type)
    attrs = matmul_attrs(node.op, node.attrs, x.quant, scales, out_params, out_dtype, fold)
    w_value = quantizer.graph.add_constant(wq, node.inputs[1].name + "_q")
    w_value.quant = w_params
    b_name = (bias.name if bias is not None else node.name + "_bias") + "_q"
    b_value = quantizer.graph.add_constant(bq, b_name)
    by_channel = per_channel or x.quant.axis is not None
    b_scales = tuple(float(a * s) for a, s in zip(s_x, scales))[: channels if by_channel else 1]
    b_value.quant = QuantParams(b_scales, (0,) * len(b_scales), 0 if by_channel else None)
    if len(x.shape) > 2 and node.op == "MatMul":  # [..., K] @ [K, N]: a QGemm on the rows
        _rows_gemm(quantizer, node, x, [w_value, b_value], attrs, out_dtype, out_params)
        return
    op = "QConv" if node.op == "Conv" else "QGemm"
    quantizer._produce(node, op, [x, w_value, b_value], attrs, out_dtype, out_params)


def _rows_gemm(
    quantizer: "_Quantizer", node: Node, x: Value, weights, attrs, dtype: str, params
) -> None:
    """MatMul [..., K] @ [K, N] as Reshape [rows, K] -> QGemm -> Reshape [..., N] (the
    integer kernels, the NPU and circle's FULLY_CONNECTED take matrices)."""
    k, shape = x.shape[-1], node.output.shape
    rows = quantizer.graph.make_node(
        "Reshape", [x], {"shape": [x.size // k, k]}, f"{node.name}/rows", [f"{x.name}/rows"]
    ).output
    rows.quant = x.quant
    attrs = recording_float_op("QGemm", attrs, node.op)
    out = f"{node.output.name}/rows_q"
    gemm = quantizer.graph.make_node("QGemm", [rows, *weights], attrs, node.name, [out]).output
    gemm.quant = params
    back = [f"{node.output.name}_q"]
    new = quantizer.graph.make_node(
        "Reshape", [gemm], {"shape": list(shape)}, f"{node.name}/back", back
    )
    new.output.quant = params
    quantizer.quant_of[(id(node.output), dtype)] = new.output
    quantizer.home[id(node.output)] = dtype
