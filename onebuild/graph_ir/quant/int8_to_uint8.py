"""A pre-quantized model's int8 activations as uint8, exactly: each keeps its scale, its zero
point and every code move up by 128 (an asymmetric int8 code q means what the uint8 code
q + 128 means at zero point + 128), so a target that runs uint8 but not int8 activations (the
TRIX NPU) can take a model the TFLite converter quantized to int8. Weights and biases stay as
they are (the integer kernels center activations on their zero points and take symmetric
weights, as under onebuild's own uint8). The graph's inputs and outputs keep their int8 codes:
a Requantize by 1 converts at each edge.

Only graphs whose every node is an op of `ACTIVATION_INPUTS` (or an op the quantizer passes
codes through) convert; `convertible` says which op stops one.
"""

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import OPS
from ..tensor import QuantParams
from .params import quantize_multiplier

SHIFT = 128
# the integer ops converted: the inputs holding activation codes (the others are weights,
# biases and tables of another kind); every zero point, bound and dtype attribute moves along
ACTIVATION_INPUTS: dict[str, tuple[int, ...] | None] = {
    "QConv": (0,),
    "QGemm": (0,),
    "QAdd": (0, 1),
    "QMul": (0, 1),
    "QConcat": None,  # every input
    "QAveragePool": (0,),
    "QSoftmax": (0,),  # its table depends on differences of codes only
    "QLookup": (0,),  # its table (input 1) holds output codes: moved with them
    "Requantize": (0,),
    "DequantizeLinear": (0,),
    "QuantizeLinear": (),
    "Pad": (0,),  # its constant `value` is the zero point's code
}
ZERO_POINTS = ("x_zero_point", "a_zero_point", "b_zero_point", "y_zero_point", "qmin", "qmax")


def _moves(value: Value | None) -> bool:
    return (
        value is not None
        and value.dtype == np.int8
        and value.quant is not None
        and value.quant.axis is None
    )


def convertible(graph: Graph) -> str | None:
    """None when every node converts; else the first op that does not (why the model stays
    int8)."""
    for node in graph.nodes:
        values = [v for v in (*node.inputs, *node.outputs) if v is not None and not v.is_const]
        if any(v.dtype == np.int8 and v.quant and v.quant.axis is not None for v in values):
            return f"{node.op} (int8 activations quantized per channel)"
        if node.op in ACTIVATION_INPUTS or OPS[node.op].quant == "passthrough":
            continue
        if any(_moves(v) for v in values):
            return node.op
    return None


def int8_to_uint8(graph: Graph) -> int:
    """Convert `graph` in place (call `convertible` first); returns the number of activation
    values moved to uint8."""
    outputs = [v for v in graph.outputs if _moves(v) and v.producer is not None]
    nodes = list(graph.nodes)
    moved = [v for node in nodes for v in node.outputs if _moves(v)]
    shifted = {id(v) for v in moved}  # the values read as uint8 codes once converted
    for value in [v for v in graph.inputs if _moves(v)]:
        shifted.add(id(_input_edge(graph, value)))
    for node in nodes:
        _shift_node(graph, node, shifted)
    for value in moved:
        value.dtype = np.dtype(np.uint8)
        value.quant = _shifted(value.quant)
    for value in outputs:
        _output_edge(graph, value)
    return len(moved)


def _shifted(quant: QuantParams) -> QuantParams:
    return QuantParams(quant.scale, tuple(z + SHIFT for z in quant.zero_point), quant.axis)


def _shift_node(graph: Graph, node: Node, shifted: set[int]) -> None:
    """Zero points, bounds and dtype of an integer op whose activations move; its constant
    operands in activation slots (an ADD of a quantized constant) moved with them."""
    slots = ACTIVATION_INPUTS.get(node.op, ())
    positions = range(len(node.inputs)) if slots is None else slots
    for index in positions:
        value = node.inputs[index]
        if value is not None and value.is_const and _moves(value):
            node.set_input(index, _moved_constant(graph, value))
            shifted.add(id(node.inputs[index]))
    attrs = node.attrs
    read = [v is not None and id(v) in shifted for v in node.inputs]
    moves_out = bool(node.outputs) and id(node.outputs[0]) in shifted
    for key in ZERO_POINTS:
        if key in attrs:
            attrs[key] = _key_shifted(key, attrs[key], read, moves_out)
    if "x_zero_points" in attrs:
        attrs["x_zero_points"] = [z + SHIFT * r for z, r in zip(attrs["x_zero_points"], read)]
    if node.op in ("QuantizeLinear", "DequantizeLinear"):
        moved = moves_out if node.op == "QuantizeLinear" else read[0]
        attrs["zero_point"] = [z + SHIFT * moved for z in attrs["zero_point"]]
    if node.op == "Pad" and read[0] and "value" in attrs:
        attrs["value"] = attrs["value"] + SHIFT
    if node.op == "QLookup" and moves_out:
        table = node.inputs[1]
        codes = (table.numpy().astype(np.int16) + SHIFT).astype(np.uint8)
        node.set_input(1, graph.add_constant(codes, f"{table.name}_uint8"))
    if attrs.get("dtype") == "int8" and moves_out:
        attrs["dtype"] = "uint8"


def _key_shifted(key: str, number, read: list[bool], moves_out: bool):
    """An attribute moved by 128 when the value it belongs to moves: output zero point and
    bounds with the output, an input's zero point with that input."""
    if key in ("y_zero_point", "qmin", "qmax"):
        moved = moves_out
    else:
        moved = read[{"x_zero_point": 0, "a_zero_point": 0, "b_zero_point": 1}[key]]
    if not moved:
        return number
    if isinstance(number, list):
        return [n + SHIFT for n in number]
    return number + SHIFT


def _moved_constant(graph: Graph, value: Value) -> Value:
    codes = (value.numpy().astype(np.int16) + SHIFT).astype(np.uint8)
    moved = graph.add_constant(codes, f"{value.name}_uint8")
    moved.quant = _shifted(value.quant)
    return moved


def _input_edge(graph: Graph, value: Value) -> Value:
    """The graph's int8 input `value` requantized by 1 to the uint8 codes its readers read
    (returned)."""
    zp = value.quant.zero_point[0]
    first = next((n for n in graph.nodes if value in n.inputs), None)
    attrs = _by_one(zp, zp + SHIFT, 0, 255, "uint8")
    node = graph.make_node("Requantize", [value], attrs, f"{value.name}_uint8", before=first)
    node.output.quant = _shifted(value.quant)
    for user, index in list(value.uses):
        if user is not node:
            user.set_input(index, node.output)
    return node.output


def _output_edge(graph: Graph, value: Value) -> None:
    """The graph's output `value` (moved to uint8) requantized by 1 back to its int8 codes,
    under its name."""
    zp = value.quant.zero_point[0] - SHIFT
    name = value.name
    graph.rename(value, f"{name}_uint8")
    attrs = _by_one(zp + SHIFT, zp, -128, 127, "int8")
    node = graph.make_node("Requantize", [value], attrs, name, output_names=[name])
    node.output.quant = QuantParams(value.quant.scale, (zp,), None)
    graph.outputs = [node.output if v is value else v for v in graph.outputs]


def _by_one(x_zero_point: int, y_zero_point: int, qmin: int, qmax: int, dtype: str) -> dict:
    m, s = quantize_multiplier(1.0)
    return {
        "x_zero_point": x_zero_point,
        "y_zero_point": y_zero_point,
        "multiplier": m,
        "shift": s,
        "qmin": qmin,
        "qmax": qmax,
        "dtype": dtype,
    }
