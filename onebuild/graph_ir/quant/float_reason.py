"""Why a node of a quantized graph computes in float, for the places that refuse float nodes
(the NPU's CPU fallback reasons in the partition table)."""

from ..ir import Node
from ..ops import OPS


def float_reason(node: Node) -> str:
    """One phrase: the op has no integer kernel, its weights are computed, or the settings
    (or a requantization out of range) kept it in float."""
    if node.op == "DequantizeLinear":
        return "it hands codes to float readers or outputs"
    rule = OPS[node.op].quant if node.op in OPS else None
    if rule is None:
        return f"onebuild has no integer kernel for {node.op}"
    if rule == "matmul" and not node.inputs[1].is_const:
        return "its weights are computed: a product of two activations"
    return "a float32 layer, or a requantization out of range"
