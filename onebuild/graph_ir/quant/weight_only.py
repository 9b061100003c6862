"""Weight-only quantization: smaller weights, float activations.

The constant weights of Conv, ConvTranspose, Gemm and MatMul are stored as symmetric int8 / int16
(per output channel or per tensor) and dequantized on the fly by a DequantizeLinear node, so the
model runs in the float interpreter unchanged otherwise.
"""

from ...errors import UserError
from ..ir import Graph, Node
from ..ops import weight_axes
from ..passes.cleanup import eliminate_dead_code
from .config import FLOAT, QuantConfig, layer_settings
from .params import qdq_attrs, quantize, weight_params

WEIGHT_TYPES = ("int8", "int16")


def _channel_axis(node: Node) -> int | None:
    """The output-channel axis of the node's weight, or None if it has no constant weight."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is None or not weight.is_const or weight.dtype.kind != "f":
        return None
    axes = weight_axes(node)
    if axes is None or (node.op == "ConvTranspose" and node.attrs.get("group", 1) != 1):
        return None  # a grouped ConvTranspose's axis 1 holds one group's output channels
    return axes.out


def weight_only_quantize(graph: Graph, config: QuantConfig) -> int:
    """Quantize the weights of `graph` in place; returns how many weights were quantized."""
    for dtype in config.quantized_dtypes:
        if dtype not in WEIGHT_TYPES:
            raise UserError(f"weight-only quantization supports int8 or int16, not '{dtype}'")
    settings = layer_settings(graph, config)
    count = 0
    for node in graph:
        setting = settings[id(node)]
        axis = _channel_axis(node)
        if axis is None or setting.dtype == FLOAT:
            continue
        weight = node.inputs[1]
        array = weight.numpy()
        params = weight_params(
            array, setting.dtype, axis if setting.granularity == "channel" else None
        )
        stored = graph.add_constant(quantize(array, params, setting.dtype), f"{weight.name}_q")
        stored.quant = params
        name = f"{weight.name}/dequantize"
        dequantized = graph.make_node(
            "DequantizeLinear", [stored], qdq_attrs(params), name, before=node
        )
        node.set_input(1, dequantized.output)
        count += 1
    eliminate_dead_code(graph)
    return count
