"""Float arrays in and out of models with quantized inputs or outputs.

A model whose input carries quantization parameters takes quantized codes; callers holding float
data quantize it with the input's own parameters, and dequantize quantized outputs likewise.
"""

from collections.abc import Mapping

import numpy as np

from ...npz import check_finite, source_of
from ..ir import Graph
from ..passes.cleanup import eliminate_dead_code
from .params import dequantize, quantize


def is_quantized(value) -> bool:
    """Whether a value holds integer codes with quantization parameters."""
    return value.quant is not None and np.issubdtype(value.dtype, np.integer)


def quantize_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float feeds converted for the graph's quantized inputs (others pass through). In a model
    that quantizes activations, NaN or Inf in a float feed (they have no quantized code) is a
    one-line UserError naming the input and the sample (axis 0)."""
    converted = dict(feeds)
    quantizes = any(node.op == "QuantizeLinear" for node in graph.nodes)
    for value in graph.inputs:
        if value.name not in feeds:
            continue
        array = np.asarray(feeds[value.name])
        floating = np.issubdtype(array.dtype, np.floating)
        if floating and (quantizes or is_quantized(value)):
            check_finite({value.name: array}, source_of(feeds))
        if is_quantized(value) and floating:
            converted[value.name] = quantize(array, value.quant, value.dtype.name)
    return converted


def dequantize_outputs(graph: Graph, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the graph as float arrays (quantized ones dequantized with their parameters)."""
    converted = dict(outputs)
    for value in graph.outputs:
        if is_quantized(value) and value.name in outputs:
            converted[value.name] = dequantize(outputs[value.name], value.quant)
    return converted


def with_quantized_io(graph: Graph) -> Graph:
    """Move the float boundary out of `graph` (in place): an input read only by a per-tensor
    QuantizeLinear becomes a quantized input, an output made by a DequantizeLinear (and read by
    nothing else) becomes the quantized value; names are kept. Callers convert data with the
    I/O parameters, as an NPU runtime does."""
    inputs = []
    for value in graph.inputs:
        users = value.users
        also_output = any(value is output for output in graph.outputs)  # stays float then
        if (
            len(users) != 1
            or users[0].op != "QuantizeLinear"
            or len(value.uses) != 1
            or also_output
        ):
            inputs.append(value)
            continue
        quantized = users[0].output
        name = value.name
        graph.rename(value, f"{name}__float")
        new = graph.add_input(name, quantized.dtype, quantized.shape)
        graph.inputs.pop()  # re-added below, in the original position
        new.quant = quantized.quant
        quantized.replace_all_uses_with(new)
        graph.remove(users[0])
        inputs.append(new)
    graph.inputs = inputs
    renames = []
    outputs = []
    for value in graph.outputs:
        node = value.producer
        if (
            node is None
            or node.op != "DequantizeLinear"
            or node.inputs[0].quant is None
            or value.uses  # other nodes read the float value
        ):
            outputs.append(value)
            continue
        outputs.append(node.inputs[0])
        renames.append((node.inputs[0], value.name))
    graph.outputs = outputs
    eliminate_dead_code(graph)
    for value, name in renames:
        graph.rename(value, name)
    return graph
