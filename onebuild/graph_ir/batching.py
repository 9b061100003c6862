"""Running N samples in one pass through a graph built for batch 1.

A graph is batch-separable when every activation has a leading dim of 1 and no op mixes data
across that axis (no Concat/Softmax/reduction over axis 0, no Transpose moving it, ...). Then the
same kernels run on [N, ...] arrays and give each sample's result; only ops that carry a static
output shape (Reshape, Expand, Resize) need the batch substituted into their attributes.
Calibration and `run_batch` use this to pay the per-node Python overhead once per chunk of
samples instead of once per sample. Ops not known to be separable make the graph fall back to
one sample at a time.
"""

from collections.abc import Callable

from .ir import Graph, Node

ALWAYS = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "BatchNormalization", "LRN", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu",
    "Equal", "Less", "Greater", "Where", "Relu", "LeakyRelu", "HardSigmoid", "HardSwish",
    "Clip", "Sigmoid", "Tanh", "Gelu", "Erf", "Sqrt", "Neg", "Abs", "Exp", "Log", "Floor",
    "Ceil", "Reciprocal", "Not", "Cast", "Identity", "Dropout", "DepthToSpace",
    "QuantizeLinear", "DequantizeLinear", "Requantize", "QLookup", "QConv", "QAdd", "QMul",
    "QAveragePool", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod", "Round", "Sign",
    "Softsign", "Softplus", "Mish", "IsNaN", "IsInf", "Sin", "Cos", "Tan", "Sinh", "Cosh", "Asin",
    "Acos", "Atan", "Asinh", "Acosh", "Atanh", "Elu", "Celu", "Selu", "ThresholdedRelu", "Shrink",
    "InstanceNormalization", "GroupNormalization", "SpaceToDepth",
}  # fmt: skip
AXIS_OPS = {
    "Concat", "Split", "Softmax", "LogSoftmax", "LayerNormalization", "QConcat", "LpNormalization",
}  # fmt: skip
REDUCTIONS = {
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ArgMax", "ArgMin",
    "MeanVarianceNormalization",
}  # fmt: skip
WITH_SHAPE = {"Reshape": "shape", "Expand": "shape", "Resize": "sizes"}

AttrsFor = Callable[[int], dict] | None  # batch size -> attributes, for ops that need it


def _separable(node: Node) -> bool:
    op, attrs = node.op, node.attrs
    rank = len(node.inputs[0].shape) if node.inputs and node.inputs[0] is not None else 0
    if op in ALWAYS:
        return True
    if op in AXIS_OPS:  # (a constant part of a Concat would not have the batch)
        constant = any(v is not None and v.is_const for v in node.inputs)
        return attrs.get("axis", -1) % max(rank, 1) != 0 and not constant
    if op in REDUCTIONS:
        return 0 not in [a % rank for a in attrs["axes"]]
    if op == "Transpose":
        return attrs["perm"][0] == 0
    if op in ("Gemm", "QGemm"):
        return not attrs.get("transA") and not node.inputs[0].is_const
    if op == "MatMul":
        return rank >= 2 and not node.inputs[0].is_const
    if op == "Slice":
        return attrs["starts"][0] == 0 and attrs["steps"][0] == 1 and attrs["ends"][0] == 1
    if op == "Pad":
        return attrs["pads"][0] == 0 and attrs["pads"][rank] == 0
    if op == "Gather":
        return attrs["axis"] % rank != 0 and not node.inputs[0].is_const
    if op == "Tile":
        return attrs["repeats"][0] == 1
    return op in WITH_SHAPE


def _with_batch(node: Node) -> AttrsFor:
    key = WITH_SHAPE.get(node.op)
    if key is None:
        return None
    attrs = node.attrs

    def attrs_for(batch: int) -> dict:
        return {**attrs, key: [batch, *attrs[key][1:]]}

    return attrs_for


def batch_plan(graph: Graph) -> list[AttrsFor] | None:
    """Per node, how to get its attributes for a batch (None: unchanged); None if the graph is
    not batch-separable."""
    values = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    if not all(v.shape and v.shape[0] == 1 for v in values):
        return None
    if not all(_separable(node) for node in graph.nodes):
        return None
    return [_with_batch(node) for node in graph.nodes]
