"""The attributes of the integer kernels (`ops/quantized.py`) from the quantization parameters
of their operands and output: built here for onebuild's own quantizer (`quantize_graph`) and for
models quantized elsewhere (`from_qdq`), so both give the same kernels the same numbers."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir import Node
from ..ops import OPS
from ..ops.quantized_softmax import output_multiplier_real
from ..tensor import QuantParams
from .params import ADD_SHIFT, channel_of, dequantize, quantize, quantize_multiplier


def output_attrs(dtype: str, params: QuantParams, clip=None) -> dict:
    """Output type, zero point and saturation bounds (narrowed by a fused activation clip);
    with per-channel `params`, one zero point and one pair of bounds per channel (lists)."""
    bounds = [_bounds(dtype, s, zp, clip) for s, zp in zip(params.scale, params.zero_point)]
    zero_points = list(params.zero_point)
    if params.axis is None:
        (qmin, qmax), zp = bounds[0], zero_points[0]
        return {"dtype": dtype, "y_zero_point": zp, "qmin": qmin, "qmax": qmax}
    qmin, qmax = ([b[i] for b in bounds] for i in (0, 1))
    return {"dtype": dtype, "y_zero_point": zero_points, "qmin": qmin, "qmax": qmax}


def _bounds(dtype: str, scale: float, zp: int, clip) -> tuple[int, int]:
    info = np.iinfo(dtype)
    qmin, qmax = int(info.min), int(info.max)
    if clip is not None:
        lo, hi = clip
        if np.isfinite(lo):
            qmin = max(qmin, min(qmax, int(np.ceil(lo / scale + zp))))
        if np.isfinite(hi):
            qmax = min(qmax, max(qmin, int(np.floor(hi / scale + zp))))
    return qmin, qmax


def requantize_attrs(x: QuantParams, y: QuantParams, dtype: str) -> dict:
    """Requantize from `x`'s parameters to `y`'s (raises MultiplierRangeError if impossible)."""
    m, r = quantize_multiplier(x.scale[0] / y.scale[0])
    return {"x_zero_point": x.zero_point[0], **output_attrs(dtype, y), "multiplier": m, "shift": r}


def channel_bias(bias: np.ndarray, channels: int) -> np.ndarray | None:
    """A Conv/Gemm bias as one value per output channel ([channels], float64 or the codes'
    type): a scalar, [1], [channels], or a Gemm's C of [1, channels] or [1, 1]; None for a C
    that varies along the rows ([M, N] or [M, 1] with M > 1), which QConv/QGemm cannot hold."""
    shape = bias.shape
    if any(d != 1 for d in shape[:-1]) or (shape and shape[-1] not in (1, channels)):
        return None
    return np.broadcast_to(bias.reshape(-1), (channels,)).copy()


def matmul_attrs(
    op: str,
    attrs: Mapping[str, Any],
    x: QuantParams,
    weight_scales: Sequence[float],
    y: QuantParams,
    dtype: str,
    folded: bool = False,
) -> dict:
    """QConv (op "Conv") or QGemm: one requantization multiplier per output channel,
    s_x * s_w[c] / s_y[c]; a per-channel input has its own zero point per channel and, read
    by a depthwise convolution (output channel c reads input channel c alone), its own scale;
    `folded`: the input scales are in the weights (`channel_activations.folded_weights`)."""
    channels = len(weight_scales)
    s_x = np.broadcast_to(np.asarray(1.0 if folded else x.scale, np.float64), (channels,))
    s_y = np.broadcast_to(np.asarray(y.scale, np.float64), (channels,))
    multipliers = [
        quantize_multiplier(float(a * s / b)) for a, s, b in zip(s_x, weight_scales, s_y)
    ]
    if op == "Conv":
        kernel = {k: attrs[k] for k in ("strides", "dilations", "pads", "group")}
    else:
        kernel = {"transB": int(attrs.get("transB", 0))}
    x_zero_point = x.zero_point[0] if x.axis is None else list(x.zero_point)
    return {
        **kernel,
        "x_zero_point": x_zero_point,
        **output_attrs(dtype, y, attrs.get("clip")),
        "multiplier": [m for m, _ in multipliers],
        "shift": [r for _, r in multipliers],
    }


def binary_attrs(
    op: str, a: QuantParams, b: QuantParams, y: QuantParams, dtype: str, clip=None
) -> tuple[str, dict]:
    """(QMul or QAdd, its attributes) for Mul, Add or Sub."""
    s_a, s_b, s_y = a.scale[0], b.scale[0], y.scale[0]
    attrs = {
        "a_zero_point": a.zero_point[0],
        "b_zero_point": b.zero_point[0],
        **output_attrs(dtype, y, clip),
    }
    if op == "Mul":
        m, r = quantize_multiplier(s_a * s_b / s_y)
        kernel = "QMul"
    else:
        largest = 2 * max(s_a, s_b)
        attrs["a_rescale"] = list(quantize_multiplier(s_a / largest))
        attrs["b_rescale"] = list(quantize_multiplier(s_b / largest))
        attrs["subtract"] = int(op == "Sub")
        m, r = quantize_multiplier(largest / (2**ADD_SHIFT * s_y))
        kernel = "QAdd"
    attrs.update({"multiplier": m, "shift": r})
    return kernel, attrs


def concat_attrs(axis: int, inputs: Sequence[QuantParams], y: QuantParams, dtype: str) -> dict:
    multipliers = [quantize_multiplier(x.scale[0] / y.scale[0]) for x in inputs]
    return {
        "axis": axis,
        "x_zero_points": [x.zero_point[0] for x in inputs],
        **output_attrs(dtype, y),
        "multiplier": [m for m, _ in multipliers],
        "shift": [r for _, r in multipliers],
    }


def average_pool_attrs(
    op: str, attrs: Mapping[str, Any], spatial: Sequence[int], x: QuantParams, y, dtype: str
) -> dict:
    """QAveragePool for AveragePool, or GlobalAveragePool and ReduceMean over H, W (a window
    over all of `spatial`)."""
    if op in ("GlobalAveragePool", "ReduceMean"):
        pool = {
            "kernel_shape": list(spatial),
            "strides": [1] * len(spatial),
            "pads": [0] * (2 * len(spatial)),
        }
    else:
        pool = {k: attrs[k] for k in ("kernel_shape", "strides", "pads")}
    pool["dilations"] = attrs.get("dilations", [1] * len(spatial))
    pool["ceil_mode"] = attrs.get("ceil_mode", 0)
    pool["count_include_pad"] = attrs.get("count_include_pad", 0)
    return {
        **pool,
        "x_zero_point": x.zero_point[0],
        **output_attrs(dtype, y),
        "scale_ratio": x.scale[0] / y.scale[0],
    }


def softmax_attrs(axis: int, y: QuantParams, dtype: str) -> dict:
    """QSoftmax: the multiplier from its Q30 fractions to the output codes."""
    m, r = quantize_multiplier(output_multiplier_real(y.scale[0]))
    return {"axis": axis, **output_attrs(dtype, y), "multiplier": m, "shift": r}


def constant_operands(node: Node) -> list[np.ndarray | None] | None:
    """The extra operands of a table op (Clip's bounds) as arrays, or None if one is computed."""
    extra = node.inputs[1:]
    if any(v is not None and not v.is_const for v in extra):
        return None
    return [None if v is None else v.numpy() for v in extra]


def function_codes(
    node: Node, real: np.ndarray, y: QuantParams, dtype: str, then: Sequence[Node] = ()
) -> np.ndarray:
    """The codes (`dtype`, output parameters `y`) of table op `node` (constant operands) on
    the real inputs `real`, followed by the one-input ops `then` (their other operands
    constant); +inf saturates as float32's largest value."""
    (out,) = OPS[node.op].kernel(node.attrs, real, *constant_operands(node))
    for step in then:
        operands = [v.numpy() if v.is_const else out for v in step.inputs]
        (out,) = OPS[step.op].kernel(step.attrs, *operands)
    out = np.asarray(out)
    if not np.isfinite(out).all():  # (checked first: nan_to_num takes five passes)
        out = np.nan_to_num(np.asarray(out, np.float64), posinf=np.finfo(np.float32).max)
    return quantize(out, y, dtype)


def lookup_table(
    node: Node, x: QuantParams, x_dtype: str, y: QuantParams, dtype: str, then: Sequence[Node] = ()
):
    """The QLookup table of table op `node` (then the ops `then`): its output code for every
    input code; with per-channel `x` or `y`, one row per channel ([C, codes])."""
    info = np.iinfo(x_dtype)
    codes = np.arange(info.min, info.max + 1).astype(x_dtype)
    if x.axis is None and y.axis is None:
        return function_codes(node, dequantize(codes, x), y, dtype, then)
    channels = max(len(x.scale), len(y.scale))
    rows = [
        function_codes(node, dequantize(codes, channel_of(x, c)), channel_of(y, c), dtype, then)
        for c in range(channels)
    ]
    return np.stack(rows)
