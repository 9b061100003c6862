"""Float versions of CPU parts: the same computation taken from the float graph, dequantizing
its quantized inputs and quantizing its quantized outputs, so the part's interface (names,
dtypes, quantization) and so the package's connections stay the same.

Quantized values are named after the float value they encode (`x_q`, `x/to_int16_q`); a part
whose boundary cannot be traced back to float values this way is left quantized.
"""

import re

from ..ir import Graph, Value
from ..quant.params import qdq_attrs

_SUFFIX = re.compile(r"(/to_[a-z0-9]+)?_q$")


def float_name(name: str) -> str:
    return _SUFFIX.sub("", name)


def float_part(part: Graph, source: Graph) -> Graph | None:
    """`part` recomputed in float from `source` (the float graph), or None if it cannot be."""
    values = {v.name: v for v in source.inputs}
    values.update({v.name: v for n in source.nodes for v in n.outputs})
    starts = {}
    for value in part.inputs:
        found = values.get(float_name(value.name))
        if found is None:
            return None
        starts[id(found)] = value
    ends = [values.get(float_name(v.name)) for v in part.outputs]
    if any(v is None for v in ends):
        return None
    needed = _slice(ends, set(starts))
    if needed is None:
        return None
    graph = Graph(part.name)
    copies: dict[int, Value] = {}
    for found_id, value in starts.items():
        boundary = graph.add_input(value.name, value.dtype, value.shape)
        boundary.quant = value.quant
        if value.quant is not None and value.dtype.kind in "iu":
            attrs = qdq_attrs(value.quant)
            name = f"{value.name}/dequantize"
            boundary = graph.make_node("DequantizeLinear", [boundary], attrs, name).output
        copies[found_id] = boundary
    for node in source.nodes:
        if id(node) not in needed:
            continue
        inputs = []
        for v in node.inputs:
            if v is not None and v.is_const and id(v) not in copies:
                copies[id(v)] = graph.add_constant(v.const, v.name)
                copies[id(v)].quant = v.quant
            inputs.append(None if v is None else copies[id(v)])
        names = [v.name for v in node.outputs]
        new = graph.make_node(node.op, inputs, node.attrs, node.name, output_names=names)
        copies.update({id(old): v for old, v in zip(node.outputs, new.outputs)})
    outputs = []
    for value, end in zip(part.outputs, ends):
        result = copies[id(end)]
        if value.quant is not None and value.dtype.kind in "iu":
            attrs = {**qdq_attrs(value.quant), "dtype": value.dtype.name}
            node = graph.make_node("QuantizeLinear", [result], attrs, f"{value.name}/quantize")
            result = node.output
            result.quant = value.quant
        graph.rename(result, value.name)
        if result.name != value.name or result.type != value.type:
            return None
        outputs.append(result)
    graph.outputs = outputs
    return graph


def _slice(ends: list[Value], starts: set[int]) -> set[int] | None:
    """Ids of the nodes computing `ends` from `starts` (None if a graph input is reached)."""
    needed: set[int] = set()
    stack = [v for v in ends if id(v) not in starts]
    seen = {id(v) for v in stack}
    while stack:
        value = stack.pop()
        if value.producer is None:
            return None
        needed.add(id(value.producer))
        for v in value.producer.inputs:
            if v is None or v.is_const or id(v) in starts or id(v) in seen:
                continue
            seen.add(id(v))
            stack.append(v)
    return needed
