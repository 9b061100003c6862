"""The attributes of the integer kernels (`ops/quantized.py`) from the quantization parameters
of their operands and output: built here for onebuild's own quantizer (`quantize_graph`) and for
models quantized elsewhere (`from_qdq`), so both give the same kernels the same numbers."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..tensor import QuantParams
from .params import ADD_SHIFT, quantize_multiplier


def output_attrs(dtype: str, params: QuantParams, clip=None) -> dict:
    """Output type, zero point and saturation bounds (narrowed by a fused activation clip)."""
    info = np.iinfo(dtype)
    qmin, qmax = int(info.min), int(info.max)
    zp, scale = params.zero_point[0], params.scale[0]
    if clip is not None:
        lo, hi = clip
        if np.isfinite(lo):
            qmin = max(qmin, min(qmax, int(np.ceil(lo / scale + zp))))
        if np.isfinite(hi):
            qmax = min(qmax, max(qmin, int(np.floor(hi / scale + zp))))
    return {"dtype": dtype, "y_zero_point": zp, "qmin": qmin, "qmax": qmax}


def requantize_attrs(x: QuantParams, y: QuantParams, dtype: str) -> dict:
    """Requantize from `x`'s parameters to `y`'s (raises MultiplierRangeError if impossible)."""
    m, r = quantize_multiplier(x.scale[0] / y.scale[0])
    return {"x_zero_point": x.zero_point[0], **output_attrs(dtype, y), "multiplier": m, "shift": r}


def matmul_attrs(
    op: str,
    attrs: Mapping[str, Any],
    x: QuantParams,
    weight_scales: Sequence[float],
    y: QuantParams,
    dtype: str,
) -> dict:
    """QConv (op "Conv") or QGemm: one requantization multiplier per output channel."""
    multipliers = [quantize_multiplier(x.scale[0] * s / y.scale[0]) for s in weight_scales]
    if op == "Conv":
        kernel = {k: attrs[k] for k in ("strides", "dilations", "pads", "group")}
    else:
        kernel = {"transB": int(attrs.get("transB", 0))}
    return {
        **kernel,
        "x_zero_point": x.zero_point[0],
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
    """QAveragePool for AveragePool or GlobalAveragePool (a window over all of `spatial`)."""
    if op == "GlobalAveragePool":
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
