"""Fake quantization in the float interpreter: the float graph run with chosen values rounded
to their quantized grids (quantize, then dequantize) and chosen weights replaced by their
quantized-and-dequantized form. The grids are those onebuild's quantizer chose (read from two
quantized graphs of the same float graph, one all uint8 and one all int16), so a run estimates
an integer model without building its kernels: the integer requantization, table and pooling
arithmetic are left out. `bench/activation_promotion.py` uses it to estimate what promoting a
value (an edge) rather than a layer would buy.

A configuration (`Rounding`) says, per value, to which grid its producer rounds it (8 or 16
bits, or none) and, per (reader, input position), whether the reader rounds its input again to
8 bits (a reader in the base type reading a value produced in int16), and per weighted layer
its weights' bits (8, 16 or float). `way_rounding` makes the configuration of a set of
promoted nodes, as onebuild builds it ("layer") or with activation-only promotion ("value");
`alone_rounding` one unit's alone.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Node
from onebuild.graph_ir.macs import macs
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.ops.registry import KEEPS_PARAMETERS
from onebuild.graph_ir.quant.model_io import is_quantized
from onebuild.graph_ir.quant.params import dequantize

BITS = {8: 0, 16: 1}  # index into the (8-bit, 16-bit) pairs of `Grids`
WEIGHTED = ("Conv", "Gemm", "MatMul")  # their weights are replaced when quantized (QConv/QGemm)


@dataclass
class Grids:
    """Per value name: (8-bit, 16-bit) (scale, zero point, lo, hi) as float32 arrays shaped to
    broadcast over the value; per weighted node name: ((weight, bias) 8-bit, 16-bit)."""

    values: dict[str, list] = field(default_factory=dict)
    weights: dict[str, list] = field(default_factory=dict)


def _shaped(params, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    scale = np.asarray(params.scale, np.float32)
    zero = np.asarray(params.zero_point, np.float32)
    if params.axis is not None and scale.size > 1:
        shape = [1] * ndim
        shape[params.axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return scale, zero


def _value_grid(value) -> tuple:
    info = np.iinfo(value.dtype)
    scale, zero = _shaped(value.quant, len(value.shape))
    return scale, zero, np.float32(info.min), np.float32(info.max)


def grids(float_graph: Graph, low: Graph, high: Graph) -> Grids:
    """The grids of every quantized value and weight of `float_graph`, from its quantization
    `low` (all in the 8-bit base type) and `high` (all int16)."""
    inputs = {v.name for v in float_graph.inputs}
    producers = {n.name: n for n in float_graph.nodes}
    found = Grids()
    for index, graph in enumerate((low, high)):
        for node in graph.nodes:
            if node.op == "QuantizeLinear" and node.name in inputs | _float_outputs(float_graph):
                names = [node.name]  # an input, or a float island's output quantized for readers
            elif node.name in producers:
                names = [v.name for v in producers[node.name].outputs]
            else:
                continue
            for name, value in zip(names, node.outputs):
                if is_quantized(value):
                    found.values.setdefault(name, [None, None])[index] = _value_grid(value)
            if node.op in ("QConv", "QGemm") and node.name in producers:
                found.weights.setdefault(node.name, [None, None])[index] = _weights(
                    producers[node.name], node
                )
    return found


def _float_outputs(graph: Graph) -> set[str]:
    return {v.name for n in graph.nodes for v in n.outputs}


def _weights(float_node: Node, twin: Node) -> tuple:
    """The twin's weight and bias dequantized, in the float node's terms (Gemm's alpha and
    beta taken back out)."""
    weight = dequantize(twin.inputs[1].numpy(), twin.inputs[1].quant)
    bias = None
    if len(float_node.inputs) > 2 and float_node.inputs[2] is not None:
        bias = dequantize(twin.inputs[2].numpy(), twin.inputs[2].quant).reshape(-1)
    if float_node.op == "Gemm":
        weight = weight / float_node.attrs.get("alpha", 1.0)
        bias = None if bias is None else bias / float_node.attrs.get("beta", 1.0)
    dtype = float_node.inputs[1].dtype
    weight = weight.astype(dtype).reshape(float_node.inputs[1].shape)
    if bias is not None:
        bias = bias.astype(dtype).reshape(float_node.inputs[2].shape)
    return weight, bias


def round_to(array: np.ndarray, grid: tuple) -> np.ndarray:
    """`array` on the grid: round half to even, saturate, back to real values."""
    scale, zero, lo, hi = grid
    q = np.clip(np.rint(array / scale) + zero, lo, hi)
    return ((q - zero) * scale).astype(array.dtype, copy=False)


@dataclass
class Rounding:
    """Which roundings a fake-quantized run applies (see the module docstring)."""

    values: dict[str, int] = field(default_factory=dict)  # value name -> producer's bits
    reread: set[tuple[str, int]] = field(default_factory=set)  # (node, input) rounded to 8 bits
    weights: dict[str, int] = field(default_factory=dict)  # node name -> weight bits


class FakeQuant:
    """Runs `float_graph` under a `Rounding`. With `cache` set (node index -> float results of
    the current samples), nodes outside `live` return them instead of running."""

    def __init__(self, float_graph: Graph, found: Grids):
        self.graph, self.grids = float_graph, found
        self.rounding = Rounding()
        self.cache: dict[int, tuple] | None = None
        self.live: set[int] = set()
        self.recording = False
        kernels = {n.name: self._kernel(i, n) for i, n in enumerate(float_graph.nodes)}
        self.run = Interpreter(float_graph, kernels=kernels)

    def _grid(self, name: str, bits: int):
        pair = self.grids.values.get(name)
        return None if pair is None else pair[BITS[bits]]

    def _kernel(self, index: int, node: Node):
        exact = OPS[node.op].kernel
        inputs = [
            (i, v.name) for i, v in enumerate(node.inputs) if v is not None and not v.is_const
        ]

        def run(attrs, *args):
            if self.cache is not None and not self.recording and index not in self.live:
                return self.cache[index]
            rounding, args = self.rounding, list(args)
            for position, name in inputs:
                if (node.name, position) in rounding.reread and self._grid(name, 8) is not None:
                    args[position] = round_to(args[position], self._grid(name, 8))
            bits = rounding.weights.get(node.name)
            if bits is not None and node.name in self.grids.weights:
                weight, bias = self.grids.weights[node.name][BITS[bits]]
                args[1] = weight
                if bias is not None:
                    args[2] = bias
            results = exact(attrs, *args)
            if self.cache is not None and self.recording:
                self.cache[index] = results
                return results
            rounded = []
            for value, result in zip(node.outputs, results):
                bits = rounding.values.get(value.name)
                grid = None if bits is None else self._grid(value.name, bits)
                rounded.append(result if grid is None else round_to(np.asarray(result), grid))
            return tuple(rounded)

        return run

    def outputs(self, feeds: Mapping[str, np.ndarray], rounding: Rounding, chunk: int = 8) -> dict:
        """The graph's outputs on `feeds` ([N, ...] arrays) under `rounding`."""
        self.rounding = rounding
        rounded = {}
        for value in self.graph.inputs:
            bits = rounding.values.get(value.name)
            grid = None if bits is None else self._grid(value.name, bits)
            array = feeds[value.name]
            rounded[value.name] = array if grid is None else round_to(array, grid)
        return self.run.run_batch(rounded, chunk)


def node_kinds(graph: Graph, promoted: set[str]) -> dict[str, bool]:
    """Per node, whether it runs in int16: data movement runs in its input's type (as
    `quantize_graph` runs it), any other node if it is `promoted`."""
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    kind: dict[str, bool] = {}
    for node in graph.nodes:
        source = producer.get(id(node.inputs[0])) if node.inputs and node.inputs[0] else None
        follows = OPS[node.op].quant in KEEPS_PARAMETERS and source is not None
        kind[node.name] = kind[source.name] if follows else node.name in promoted
    return kind


def way_rounding(graph: Graph, way: str, promoted: set[str]) -> Rounding:
    """The roundings of `graph` quantized with `promoted` (node names) in int16. "layer": as
    onebuild builds it (a value on the int16 grid only from an int16 producer to an int16
    reader). "value": activation-only promotion allowed (every producer may write int16; a
    reader with MACs that is not promoted reads it requantized to uint8)."""
    kind = node_kinds(graph, promoted)
    bits = lambda flag: 16 if flag else 8  # noqa: E731
    rounding = Rounding()
    for value in graph.inputs:  # quantized in its readers' type
        rounding.values[value.name] = bits(any(kind[r.name] for r in value.users))
    for node in graph.nodes:
        if node.op in WEIGHTED:
            rounding.weights[node.name] = bits(kind[node.name])
        for value in node.outputs:
            rounding.values[value.name] = bits(way == "value" or kind[node.name])
    for node in graph.nodes:  # a uint8 reader of an int16 value reads it requantized
        if not kind[node.name] and (way == "layer" or macs(node) > 0):
            rounding.reread.update(_activation_inputs(node))
    return rounding


def alone_rounding(graph: Graph, way: str, unit: list[str]) -> Rounding:
    """Only the nodes named in `unit` rounded (to 8 bits), the rest float: the unit's own
    noise. "layer": their inputs, weights and outputs (the search's twins); "value": the
    inputs and weights of those with MACs (a value's rounding belongs to its readers)."""
    nodes = {n.name: n for n in graph.nodes}
    rounding = Rounding()
    for name in unit:
        node = nodes[name]
        if way == "value" and macs(node) == 0:
            continue
        if node.op in WEIGHTED:
            rounding.weights[name] = 8
        rounding.reread.update(_activation_inputs(node))
        if way == "layer":
            rounding.values.update({v.name: 8 for v in node.outputs})
    return rounding


def _activation_inputs(node: Node) -> set[tuple[str, int]]:
    return {(node.name, i) for i, v in enumerate(node.inputs) if v is not None and not v.is_const}
