"""The quantization rule "prelu": PRelu with a constant slope -> QPRelu (`ops/quantized_prelu.py`).

The slope is quantized in the activations' type over its own range (as TFLite's converter
does: PRELU's alpha has the input's type), one code per slope element; the input is per tensor.
"""

from typing import TYPE_CHECKING

from ..ir import Node
from .kernel_attrs import prelu_attrs

if TYPE_CHECKING:
    from .quantize_graph import _Quantizer


def prelu_ok(quantizer: "_Quantizer", node: Node) -> bool:
    """A constant slope that broadcasts to the input (it does not enlarge the output), on an
    input quantized per tensor."""
    x, slope = node.inputs
    return slope.is_const and node.output.shape == x.shape and id(x) not in quantizer.per_channel


def quantize_prelu(quantizer: "_Quantizer", node: Node, dtype: str) -> None:
    """Emit the QPRelu of `node` in `dtype`."""
    x = quantizer.as_quant(node.inputs[0], dtype)
    slope = quantizer.as_quant(node.inputs[1], dtype)
    out = quantizer.params(node.output, dtype)
    attrs = prelu_attrs(x.quant, slope.quant, out, dtype)
    quantizer._produce(node, "QPRelu", [x, slope], attrs, dtype, out)
