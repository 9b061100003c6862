"""The kernels of a circle as onert computes them: what a circle's 8-bit CONV_2D,
DEPTHWISE_CONV_2D (a rescaling average pool's too), FULLY_CONNECTED, ADD, SUB, MUL,
RESIZE_BILINEAR, QUANTIZE and DEQUANTIZE ask of it (`docs/circle-tflite.md`).

onert differs from onebuild's own arithmetic in four ways, each worth at most 1 step on rare
elements (`ops/tflite_rounding.py`):
- requantization rounds twice (gemmlowp), half away from zero, where onebuild rounds
  acc * m / 2^r once, exactly, half to even;
- multipliers come from the file's float32 scales, by onert's formulas (a per-tensor
  convolution and a Mul multiply their scales in float32), not from the float64 ones;
- QUANTIZE and DEQUANTIZE compute in float32 and round half away from zero;
- a uint8 RESIZE_BILINEAR computes in float32 and truncates.
Chained through a deep network they add up (PP-OCR's classifier: up to 17 steps at uint8), so
the reader gives a circle's kernels onert's arithmetic, and a package's circle is checked
against it. A tflite file keeps onebuild's own: LiteRT (its default XNNPACK kernels round once)
gives exactly onebuild's codes on every tensor of the int8 classifier.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ..ir import Graph
from ..ops.tflite_rounding import FLOAT32, FLOAT32_TRUNCATE, GEMMLOWP, ROUNDING
from ..quant.params import quantize_multiplier
from .circle_names import rescaling_mean

KERNELS = ("QConv", "QGemm", "QMul", "QAdd")  # what onert requantizes with gemmlowp
_EIGHT_BITS = ("uint8", "int8")


def _f32(scales) -> list[float]:
    return [float(s) for s in np.asarray(scales, np.float32).ravel()]


def onert_attrs(node) -> dict | None:
    """`node`'s attributes as onert computes it from a circle of its values' parameters (the
    four ways above); None where onert computes as onebuild does (other ops, 16-bit kernels,
    per-channel activations, which circle does not hold)."""
    if node.op in ("QuantizeLinear", "DequantizeLinear"):  # QUANTIZE, DEQUANTIZE in float32
        per_tensor = node.attrs.get("axis") is None and len(node.attrs["scale"]) == 1
        return {**node.attrs, ROUNDING: FLOAT32} if per_tensor else None
    if node.op == "Resize" and node.attrs.get("mode") == "linear":  # RESIZE_BILINEAR
        uint8 = node.inputs[0].dtype == np.uint8
        return {**node.attrs, ROUNDING: FLOAT32_TRUNCATE} if uint8 else None
    if node.op == "QAveragePool":
        return _window_sums_attrs(node)
    if node.op not in KERNELS or node.attrs.get("dtype") not in _EIGHT_BITS:
        return None
    params = [v.quant if v is not None else None for v in (*node.inputs[:2], node.output)]
    if any(p is None for p in params):
        return None
    (s_x, s_w, s_y) = (_f32(p.scale) for p in params)
    if len(s_x) != 1 or len(s_y) != 1:
        return None
    attrs = {**node.attrs, ROUNDING: GEMMLOWP}
    if node.op == "QAdd":  # 2 max(s_a, s_b) and the divisions in float64, as onebuild does
        largest = 2 * max(s_x[0], s_w[0])
        attrs["a_rescale"] = list(quantize_multiplier(s_x[0] / largest))
        attrs["b_rescale"] = list(quantize_multiplier(s_w[0] / largest))
        attrs["multiplier"], attrs["shift"] = quantize_multiplier(largest / (2**20 * s_y[0]))
        return attrs
    if node.op == "QMul":  # lhs * rhs / output in float32
        real = float(np.float32(np.float32(s_x[0]) * np.float32(s_w[0])) / np.float32(s_y[0]))
        attrs["multiplier"], attrs["shift"] = quantize_multiplier(real)
        return attrs
    channels = len(np.atleast_1d(node.attrs["multiplier"]))
    if len(s_w) == 1 and node.attrs["dtype"] == "uint8":  # the scales' product in float32
        reals = [float(np.float32(np.float32(s_x[0]) * np.float32(s_w[0]))) / s_y[0]] * channels
    else:  # per channel (and int8): s_x * s_w[c] / s_y in float64
        reals = [s_x[0] * s / s_y[0] for s in np.broadcast_to(s_w, (channels,))]
    multipliers = [quantize_multiplier(real) for real in reals]
    attrs["multiplier"] = [m for m, _ in multipliers]
    attrs["shift"] = [r for _, r in multipliers]
    return attrs


def _window_sums_attrs(node) -> dict | None:
    """A rescaling 8-bit QAveragePool but a global one (MEAN, which onert rounds as onebuild
    does): the writer's DEPTHWISE_CONV_2D of ones of scale 1 / area, requantized per tensor."""
    x, y = node.inputs[0].quant, node.output.quant
    if node.attrs.get("dtype") not in _EIGHT_BITS or x == y or rescaling_mean(node):
        return None
    s_x, s_y = _f32(x.scale)[0], _f32(y.scale)[0]
    s_w = np.float32(1 / int(np.prod(node.attrs["kernel_shape"])))
    if node.attrs["dtype"] == "uint8":  # the scales' product in float32
        real = float(np.float32(np.float32(s_x) * s_w)) / s_y
    else:
        real = s_x * float(s_w) / s_y
    multiplier, shift = quantize_multiplier(real)
    return {**node.attrs, ROUNDING: GEMMLOWP, "multiplier": multiplier, "shift": shift}


def use_onert_arithmetic(nodes) -> None:
    """Give each node of `nodes` that onert computes otherwise its `onert_attrs`."""
    for node in nodes:
        attrs = onert_attrs(node)
        if attrs is not None:
            node.attrs = attrs


@contextmanager
def onert_arithmetic(graph: Graph) -> Iterator[Graph]:
    """`graph` with its kernels as onert computes them from its circle, for the `with` block
    (then its own attributes again): what the circle reads back as."""
    kept = {node: node.attrs for node in graph.nodes}
    try:
        use_onert_arithmetic(graph.nodes)
        yield graph
    finally:
        for node, attrs in kept.items():
            node.attrs = attrs
