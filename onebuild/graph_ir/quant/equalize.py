"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization", section 4.1).

In a chain Conv/Gemm -> (Relu, max or average pooling, or nothing) -> Conv/Gemm, scaling output
channel i of the first layer (its weights and bias) by 1 / s_i and input channel i of the second
layer's weights by s_i leaves the function unchanged, because Relu(x / s) = Relu(x) / s for s > 0
(and pooling commutes with a per-channel scale alike). Choosing s_i = sqrt(r1_i / r2_i), where
r1_i is the range of the first layer's output-channel weights and r2_i that of the second
layer's input-channel weights, gives both the same range: a channel whose BatchNorm-folded
weights (and so activations) were orders of magnitude apart from the others' is brought in line,
and per-tensor activation quantization no longer crushes it. Layers in longer chains belong to
two pairs, so the scaling is repeated until it converges.

Depthwise and grouped convolutions take part (an input channel of a grouped Conv is read by its
group's output channels only). A Relu6 or other Clip between the layers is not equalized: its
bounds would become per-channel, which the quantized kernels cannot express.
"""

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import weight_axes
from ..passes.fuse import scale_outputs

LAYERS = ("Conv", "Gemm")
HOMOGENEOUS = (None, [0.0, float("inf")])  # fused activations that commute with s > 0
# per-channel ops that commute with a positive per-channel scale, allowed between the layers
CHANNELWISE = ("Relu", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")


def _reader(value: Value) -> Node | None:
    """The single node reading `value` (once), when `value` is not a graph output."""
    graph = value.graph
    if len(value.uses) != 1 or (graph is not None and value in graph.outputs):
        return None
    return value.uses[0][0]


def _constant_weights(node: Node) -> bool:
    """A layer whose weights and bias are constants of their own (not shared with other nodes)."""
    if node.op not in LAYERS or (node.op == "Gemm" and node.attrs.get("transA", 0)):
        return False
    params = [v for v in node.inputs[1:3] if v is not None]
    return all(v.is_const and len(v.uses) == 1 for v in params)


def _next_layer(first: Node) -> Node | None:
    """The layer reading `first`'s output as its data input, through CHANNELWISE ops."""
    if first.attrs.get("clip") not in HOMOGENEOUS or len(first.outputs) != 1:
        return None
    value = first.output
    reader = _reader(value)
    while reader is not None and reader.op in CHANNELWISE and len(reader.outputs) == 1:
        value = reader.output
        reader = _reader(value)
    if reader is None or not _constant_weights(reader) or reader.inputs[0] is not value:
        return None
    return reader


def pairs(graph: Graph) -> list[tuple[Node, Node]]:
    """The (first, second) layer pairs of `graph` that equalization rescales."""
    found = []
    for node in graph.nodes:
        if not _constant_weights(node):
            continue
        second = _next_layer(node)
        if second is not None and _out_channels(node, node.inputs[1].numpy()) == _in_channels(
            second, second.inputs[1].numpy()
        ):
            found.append((node, second))
    return found


def _out_matrix(node: Node, weights: np.ndarray) -> np.ndarray:
    """The weights as [output channel, everything else] (a view, for ranges and scaling)."""
    out = weight_axes(node).out
    return np.moveaxis(weights, out, 0).reshape(weights.shape[out], -1)


def _out_channels(node: Node, weights: np.ndarray) -> int:
    return _out_matrix(node, weights).shape[0]


def _in_channels(node: Node, weights: np.ndarray) -> int:
    return weights.shape[weight_axes(node).into] * node.attrs.get("group", 1)


def _channels_first(node: Node, weights: np.ndarray) -> np.ndarray:
    """The weights as [out, in per group, ...] (a Gemm's without transB: transposed)."""
    axes = weight_axes(node)
    return np.moveaxis(weights, (axes.out, axes.into), (0, 1))


def _in_grouped(node: Node, weights: np.ndarray) -> np.ndarray:
    """A Conv's weights as [group, out per group, in per group, kernel] (Gemm: [1, N, K, 1])."""
    first = _channels_first(node, weights)
    groups = node.attrs.get("group", 1)
    return first.reshape(groups, first.shape[0] // groups, first.shape[1], -1)


def _in_ranges(node: Node, weights: np.ndarray) -> np.ndarray:
    grouped = np.abs(_in_grouped(node, weights))
    return grouped.max(axis=(1, 3)).reshape(-1)


def _scale_inputs(node: Node, weights: np.ndarray, factors: np.ndarray) -> np.ndarray:
    grouped = _in_grouped(node, weights)
    scaled = grouped * factors.reshape(grouped.shape[0], 1, grouped.shape[2], 1)
    axes = weight_axes(node)
    first = scaled.reshape(_channels_first(node, weights).shape)
    return np.moveaxis(first, (0, 1), (axes.out, axes.into))


def equalize(graph: Graph, max_rounds: int = 100, tolerance: float = 1e-4) -> int:
    """Equalize every Conv/Gemm pair of `graph` in place, repeating until no channel scale
    moves by more than `tolerance` (relative); returns how many pairs were rescaled."""
    found = pairs(graph)
    layers = {id(n): n for pair in found for n in pair}
    weights = {key: n.inputs[1].numpy().astype(np.float64) for key, n in layers.items()}
    biases = {
        key: n.inputs[2].numpy().astype(np.float64)
        for key, n in layers.items()
        if len(n.inputs) > 2 and n.inputs[2] is not None
    }
    for _ in range(max_rounds):
        largest = 0.0
        for first, second in found:
            a, b = id(first), id(second)
            r1 = np.abs(_out_matrix(first, weights[a])).max(axis=1)
            r2 = _in_ranges(second, weights[b])
            usable = (r1 > 0) & (r2 > 0)
            s = np.ones_like(r1)
            s[usable] = np.sqrt(r1[usable] / r2[usable])
            weights[a] = scale_outputs(first, weights[a], 1.0 / s)
            if a in biases:
                biases[a] = biases[a] / s
            weights[b] = _scale_inputs(second, weights[b], s)
            largest = max(largest, float(np.abs(np.log(s)).max(initial=0.0)))
        if largest < tolerance:
            break
    for key, node in layers.items():
        _store(graph, node, 1, weights[key])
        if key in biases:
            _store(graph, node, 2, biases[key])
    return len(found)


def _store(graph: Graph, node: Node, index: int, array: np.ndarray) -> None:
    """Replace a layer's constant input `index` with `array` (in its dtype)."""
    old = node.inputs[index]
    value = graph.add_constant(array.astype(old.dtype), f"{old.name}_cle")
    node.set_input(index, value)
    if not old.uses and old not in graph.outputs:
        graph.remove_constant(old)
