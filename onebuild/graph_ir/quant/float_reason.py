"""Why a node of a quantized graph computes in float, for the places that refuse float nodes
(the NPU's CPU fallback reasons in the partition table)."""

from ..ir import Node
from ..ops import OPS, weight_axes
from .kernel_attrs import channel_bias


def float_reason(node: Node) -> str:
    """One phrase: the op has no integer kernel, its weights are computed, its bias varies
    along the rows, or the settings (or a requantization out of range) kept it in float."""
    if node.op == "DequantizeLinear":
        return "it hands codes to float readers or outputs"
    rule = OPS[node.op].quant if node.op in OPS else None
    if rule is None:
        return f"onebuild has no integer kernel for {node.op}"
    if rule == "matmul" and not node.inputs[1].is_const:
        return "its weights are computed: a product of two activations"
    if rule == "matmul" and _row_bias(node):
        return f"its bias is {list(node.inputs[2].shape)}, not one value per output channel"
    return "a float32 layer, or a requantization out of range"


def _row_bias(node: Node) -> bool:
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is None or not bias.is_const:
        return False
    channels = node.inputs[1].shape[weight_axes(node).out]
    return channel_bias(bias.numpy(), channels) is None
