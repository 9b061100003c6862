"""Circle operator names as ONE's tools spell them (`[OPCODE] CONV_2D=cpu` in a `.part` file),
and which IR nodes each names: `circle_code`, the operator the circle writer writes a node as.
The writer asks the same functions (`depthwise`, `pointwise_gemm`, `rescaling_mean`,
`written_as`, `circle_code`) where it chooses between operators; other quantized ops answer
through the float op they replaced.
"""

from collections.abc import Callable

import numpy as np

from ..ir import Node


def depthwise(node: Node) -> bool:
    """A Conv / QConv with one filter channel per group and a group per input channel: the
    writer's DEPTHWISE_CONV_2D (other grouped convolutions are split into CONV_2Ds)."""
    x, weight = node.inputs[:2]
    group = node.attrs.get("group", 1)
    return group > 1 and len(weight.shape) > 1 and weight.shape[1] == 1 and group == x.shape[1]


def rescaling_mean(node: Node) -> bool:
    """A QAveragePool the writer writes as MEAN: a global pool (one window over the whole
    input, attributes as the quantizer gives GlobalAveragePool, no clamp) that changes the
    quantization parameters (MEAN rescales in one rounding; it reads back as the same node)."""
    x, attrs = node.inputs[0], node.attrs
    info = np.iinfo(x.dtype)
    return (
        x.quant != node.output.quant
        and list(attrs["kernel_shape"]) == list(x.shape[2:])
        and set(attrs["strides"]) == {1}
        and set(attrs.get("dilations", [1])) == {1}
        and not any(attrs["pads"])
        and not attrs.get("ceil_mode")
        and not attrs.get("count_include_pad")
        and (attrs["qmin"], attrs["qmax"]) == (info.min, info.max)
    )


def pointwise_gemm(node: Node) -> bool:
    """A uint8 QGemm with per-channel weights, which the writer writes as a 1x1 CONV_2D
    (onert's uint8 FULLY_CONNECTED applies the first weight scale to every channel)."""
    x, weight = node.inputs[:2]
    return x.dtype == np.uint8 and weight.quant is not None and weight.quant.axis is not None


def written_as(node: Node) -> str | None:
    """The circle operator the writer writes a quantized node as, where it depends on the
    node's attributes rather than its float op (None for other nodes)."""
    if node.op == "QAdd":
        return "SUB" if node.attrs.get("subtract") else "ADD"
    if node.op == "QAveragePool":  # rescaling windows: sums by a depthwise convolution
        if rescaling_mean(node):
            return "MEAN"
        rescales = node.inputs[0].quant != node.output.quant
        return "DEPTHWISE_CONV_2D" if rescales else "AVERAGE_POOL_2D"
    if node.op == "QGemm":
        return "CONV_2D" if pointwise_gemm(node) else "FULLY_CONNECTED"
    return None


def clip_code(node: Node) -> str | None:
    """A Clip with constant bounds: RELU, RELU6 or RELU_N1_TO_1 for their bounds, else the
    MAXIMUM (a lower bound; MINIMUM when only the upper is finite) clamping it; None for other
    nodes (a lookup table holding a Clip has no bounds to choose by)."""
    bounds = (*node.inputs[1:], None, None)[:2]
    if node.op != "Clip" or any(v is not None and not v.is_const for v in bounds):
        return None
    lo, hi = (
        default if v is None else float(v.numpy().item())
        for v, default in zip(bounds, (-np.inf, np.inf))
    )
    named = CLIP_CODES.get((lo, hi))
    if named is not None or not (np.isfinite(lo) or np.isfinite(hi)):
        return named
    return "MAXIMUM" if np.isfinite(lo) else "MINIMUM"


CLIP_CODES = {(0.0, np.inf): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1"}


def pad_code(node: Node) -> str | None:
    """SLICE (negative pads only: a crop), MIRROR_PAD (reflect), PADV2 (a float fill other
    than 0), else PAD; None for the modes TFLite lacks (edge, wrap)."""
    pads, mode = node.attrs["pads"], node.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect"):
        return None
    if min(pads) < 0 and max(pads) <= 0:
        return "SLICE"
    if mode == "reflect":
        return "MIRROR_PAD"
    fill = float(node.attrs.get("value", 0.0))
    return "PADV2" if node.inputs[0].quant is None and fill != 0.0 else "PAD"


def split_code(node: Node) -> str:
    """SPLIT into equal parts, else SPLIT_V."""
    return "SPLIT" if len(set(node.attrs["split"])) == 1 else "SPLIT_V"


def _dense_code(node: Node) -> str:
    if node.op != "MatMul" or (node.inputs[1].is_const and len(node.inputs[1].shape) == 2):
        return "FULLY_CONNECTED"
    return "BATCH_MATMUL"


def resize_code(node: Node) -> str:
    return "RESIZE_BILINEAR" if node.attrs.get("mode") == "linear" else "RESIZE_NEAREST_NEIGHBOR"


# float op -> (the circle operators it may be written as, the writer's choice for a node)
CHOICES: dict[str, tuple[tuple[str, ...], Callable[[Node], str | None]]] = {
    "Conv": (
        ("CONV_2D", "DEPTHWISE_CONV_2D"),
        lambda node: "DEPTHWISE_CONV_2D" if depthwise(node) else "CONV_2D",
    ),
    "Gemm": (("FULLY_CONNECTED",), _dense_code),
    "MatMul": (("FULLY_CONNECTED", "BATCH_MATMUL"), _dense_code),
    "Clip": (("RELU", "RELU6", "RELU_N1_TO_1", "MAXIMUM", "MINIMUM"), clip_code),
    "Pad": (("PAD", "PADV2", "MIRROR_PAD", "SLICE"), pad_code),
    "Split": (("SPLIT", "SPLIT_V"), split_code),
    "Resize": (("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"), resize_code),
}
# float op -> the one circle operator it is written as
FIXED = {
    "ConvTranspose": "TRANSPOSE_CONV",
    "MaxPool": "MAX_POOL_2D",
    "AveragePool": "AVERAGE_POOL_2D",
    "ReduceMean": "MEAN",
    "GlobalAveragePool": "MEAN",
    "ReduceMax": "REDUCE_MAX",
    "GlobalMaxPool": "REDUCE_MAX",
    "Add": "ADD",
    "Sub": "SUB",
    "Mul": "MUL",
    "Div": "DIV",
    "Pow": "POW",
    "Max": "MAXIMUM",
    "Min": "MINIMUM",
    "Relu": "RELU",
    "PRelu": "PRELU",
    "LeakyRelu": "LEAKY_RELU",
    "Sigmoid": "LOGISTIC",
    "Tanh": "TANH",
    "HardSwish": "HARD_SWISH",
    "Gelu": "GELU",
    "Exp": "EXP",
    "Sqrt": "SQRT",
    "Softmax": "SOFTMAX",
    "LRN": "LOCAL_RESPONSE_NORMALIZATION",
    "Concat": "CONCATENATION",
    "Reshape": "RESHAPE",
    "Transpose": "TRANSPOSE",
    "Slice": "SLICE",
    "DepthToSpace": "DEPTH_TO_SPACE",
    "QuantizeLinear": "QUANTIZE",
    "Requantize": "QUANTIZE",
    "DequantizeLinear": "DEQUANTIZE",
}


def circle_code(node: Node, op: str | None = None) -> str | None:
    """The circle operator the writer writes `node` as, `node` standing for float op `op`
    (default its own): `written_as` for the quantized nodes it decides, the writer's choice
    for the ops of CHOICES, else the op's one operator (None: no circle operator)."""
    written = written_as(node)
    if written is not None:
        return written
    op = op or node.op
    return CHOICES[op][1](node) if op in CHOICES else FIXED.get(op)


# the circle operator names a partition key may use
CIRCLE_NAMES = frozenset(FIXED.values()).union(*(codes for codes, _ in CHOICES.values()))
# those naming part of their IR ops' nodes: more specific partition keys than IR op names
NARROW = frozenset(code for codes, _ in CHOICES.values() for code in codes)
NARROW |= {"ADD", "SUB", "MEAN", "AVERAGE_POOL_2D"}


def names_circle_op(code: str, node: Node, float_ops: set[str]) -> bool:
    """Whether circle operator `code` names `node`, whose float ops are `float_ops`: the
    operator the writer writes it as (`circle_code`)."""
    return any(circle_code(node, op) == code for op in float_ops)
