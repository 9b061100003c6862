"""Float arrays in and out of models with quantized inputs or outputs.

A model whose input carries quantization parameters takes quantized codes; callers holding float
data quantize it with the input's own parameters, and dequantize quantized outputs likewise.
"""

from collections.abc import Mapping

import numpy as np

from ..ir import Graph
from .params import dequantize, quantize


def _is_quantized(value) -> bool:
    return value.quant is not None and np.issubdtype(value.dtype, np.integer)


def quantize_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float feeds converted for the graph's quantized inputs (others pass through)."""
    converted = dict(feeds)
    for value in graph.inputs:
        if _is_quantized(value) and value.name in feeds:
            array = np.asarray(feeds[value.name])
            if np.issubdtype(array.dtype, np.floating):
                converted[value.name] = quantize(array, value.quant, value.dtype.name)
    return converted


def dequantize_outputs(graph: Graph, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the graph as float arrays (quantized ones dequantized with their parameters)."""
    converted = dict(outputs)
    for value in graph.outputs:
        if _is_quantized(value) and value.name in outputs:
            converted[value.name] = dequantize(outputs[value.name], value.quant)
    return converted
