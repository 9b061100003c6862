"""Circle operator names as ONE's tools spell them (`[OPCODE] CONV_2D=cpu` in a `.part` file),
and which IR nodes each names: the nodes the circle writer writes as that operator (float ops
by a condition on the node; QAdd, QAveragePool and QGemm as `written_as` says, by the same
predicates the writer uses; other quantized ops through the float op they replaced).
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


def _resize_mode(mode: str) -> Callable[[Node], bool]:
    return lambda node: node.attrs.get("mode", "nearest") == mode


def _constant_weights(node: Node) -> bool:
    return node.op != "MatMul" or (node.inputs[1].is_const and len(node.inputs[1].shape) == 2)


# circle operator -> the float IR ops it names, and a further condition on the node
CIRCLE_OPS: dict[str, tuple[tuple[str, ...], Callable[[Node], bool] | None]] = {
    "CONV_2D": (("Conv",), lambda node: not depthwise(node)),
    "DEPTHWISE_CONV_2D": (("Conv",), depthwise),
    "FULLY_CONNECTED": (("Gemm", "MatMul"), _constant_weights),
    "BATCH_MATMUL": (("MatMul",), lambda node: not _constant_weights(node)),
    "TRANSPOSE_CONV": (("ConvTranspose",), None),
    "MAX_POOL_2D": (("MaxPool",), None),
    "AVERAGE_POOL_2D": (("AveragePool",), None),
    "MEAN": (("ReduceMean", "GlobalAveragePool"), None),
    "REDUCE_MAX": (("ReduceMax", "GlobalMaxPool"), None),
    "ADD": (("Add",), None),
    "SUB": (("Sub",), None),
    "MUL": (("Mul",), None),
    "DIV": (("Div",), None),
    "POW": (("Pow",), None),
    "MAXIMUM": (("Max",), None),
    "MINIMUM": (("Min",), None),
    "RELU": (("Relu",), None),
    "RELU6": (("Clip",), None),
    "RELU_N1_TO_1": (("Clip",), None),
    "PRELU": (("PRelu",), None),
    "LEAKY_RELU": (("LeakyRelu",), None),
    "LOGISTIC": (("Sigmoid",), None),
    "TANH": (("Tanh",), None),
    "HARD_SWISH": (("HardSwish",), None),
    "GELU": (("Gelu",), None),
    "EXP": (("Exp",), None),
    "SQRT": (("Sqrt",), None),
    "SOFTMAX": (("Softmax",), None),
    "LOCAL_RESPONSE_NORMALIZATION": (("LRN",), None),
    "CONCATENATION": (("Concat",), None),
    "RESHAPE": (("Reshape",), None),
    "TRANSPOSE": (("Transpose",), None),
    "SPLIT": (("Split",), None),
    "SPLIT_V": (("Split",), None),
    "PAD": (("Pad",), None),
    "PADV2": (("Pad",), None),
    "MIRROR_PAD": (("Pad",), None),
    "DEPTH_TO_SPACE": (("DepthToSpace",), None),
    "RESIZE_BILINEAR": (("Resize",), _resize_mode("linear")),
    "RESIZE_NEAREST_NEIGHBOR": (("Resize",), _resize_mode("nearest")),
    "QUANTIZE": (("QuantizeLinear", "Requantize"), None),
    "DEQUANTIZE": (("DequantizeLinear",), None),
}


# circle operators that name part of their IR ops' nodes (by a condition, or as the writer
# chooses for a quantized node): more specific partition keys than IR op names
NARROW = {code for code, (_, condition) in CIRCLE_OPS.items() if condition is not None}
NARROW |= {"ADD", "SUB", "MEAN", "AVERAGE_POOL_2D"}


def names_circle_op(code: str, node: Node, float_ops: set[str]) -> bool:
    """Whether circle operator `code` names `node`, whose float ops are `float_ops`: the
    operator the writer writes it as."""
    written = written_as(node)
    if written is not None:
        return code == written
    ops, condition = CIRCLE_OPS[code]
    return bool(float_ops.intersection(ops)) and (condition is None or condition(node))
