"""BatchNormalization folding and activation fusion."""

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import weight_axes
from .rewrite import replace_node, single_reader


def _batchnorm_factors(bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-channel (factor, shift) of an inference BatchNormalization with constant parameters."""
    params = bn.inputs[1:5]
    if not all(v is not None and v.is_const for v in params):
        return None
    scale, bias, mean, var = (v.numpy().astype(np.float64) for v in params)
    factor = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
    return factor, bias - mean * factor


def scale_outputs(node: Node, weights: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """`node`'s weights with output channel o scaled by factors[o] (a grouped ConvTranspose's
    output g * O/g + j is axis 1's j in group g of axis 0)."""
    out = weight_axes(node).out
    groups = node.attrs.get("group", 1) if out else 1
    grouped = weights.reshape(groups, -1, *weights.shape[1:])
    shape = [1] * grouped.ndim
    shape[0], shape[out + 1] = groups, -1
    return (grouped * factors.reshape(shape)).reshape(weights.shape)


def _fold_into(graph: Graph, producer: Node, bn: Node, factor: np.ndarray, shift: np.ndarray):
    """Rewrite the producer's weight and bias so that it computes BN(producer(x))."""
    weight = producer.inputs[1]
    bias = producer.inputs[2] if len(producer.inputs) > 2 else None
    w = scale_outputs(producer, weight.numpy().astype(np.float64), factor)
    if producer.op != "Gemm":
        old_bias = bias.numpy().astype(np.float64) if bias is not None else 0.0
    else:
        beta = producer.attrs.get("beta", 1.0)
        old_bias = beta * bias.numpy().astype(np.float64) if bias is not None else 0.0
        producer.attrs["beta"] = 1.0
        if producer.attrs.get("alpha", 1.0) != 1.0:
            w = w * producer.attrs.pop("alpha")
    new_bias = old_bias * factor + shift  # a Gemm's C may be [M, N]: it stays that shape
    new_bias = np.broadcast_to(new_bias, np.broadcast_shapes(new_bias.shape, factor.shape))
    dtype = weight.dtype
    producer.set_input(1, graph.add_constant(w.astype(dtype), weight.name + "_bnfold"))
    bias_value = graph.add_constant(new_bias.astype(dtype), (bias or weight).name + "_bnfold_bias")
    producer.set_input(2, bias_value)
    replace_node(graph, bn, [producer.output])


def fold_batchnorm(graph: Graph) -> bool:
    """Fold BatchNormalization into the Conv, ConvTranspose or Gemm that feeds it (constant
    weights only)."""
    modified = False
    for bn in graph:
        if bn.op != "BatchNormalization":
            continue
        producer = bn.inputs[0].producer
        folds_into = ("Conv", "ConvTranspose", "Gemm")
        if producer is None or producer.op not in folds_into or "clip" in producer.attrs:
            continue
        if single_reader(producer.output) is not bn or not producer.inputs[1].is_const:
            continue
        bias = producer.inputs[2] if len(producer.inputs) > 2 else None
        if bias is not None and not bias.is_const:
            continue
        factors = _batchnorm_factors(bn)
        if factors is None:
            continue
        if len(producer.inputs) < 3:
            _add_bias_slot(graph, producer)
        _fold_into(graph, producer, bn, *factors)
        modified = True
    return modified


def batchnorm_to_conv(graph: Graph) -> bool:
    """Rewrite a BatchNormalization that cannot fold (e.g. after a Concat) on a 1-D or 2-D
    feature map as the equivalent depthwise 1x1 Conv, which quantizes and runs on an NPU."""
    modified = False
    for bn in graph:
        x = bn.inputs[0]
        factors = _batchnorm_factors(bn) if bn.op == "BatchNormalization" else None
        if factors is None or len(bn.outputs) != 1 or len(x.shape) not in (3, 4):
            continue
        factor, shift = factors
        spatial = len(x.shape) - 2
        weight = factor.reshape(-1, 1, *([1] * spatial)).astype(x.dtype)
        attrs = {
            "group": int(x.shape[1]),
            "strides": [1] * spatial,
            "dilations": [1] * spatial,
            "pads": [0] * (2 * spatial),
        }
        inputs = [
            x,
            graph.add_constant(weight, f"{bn.name}_weight"),
            graph.add_constant(shift.astype(x.dtype), f"{bn.name}_bias"),
        ]
        conv = graph.make_node("Conv", inputs, attrs, bn.name, before=bn)
        replace_node(graph, bn, [conv.output])
        modified = True
    return modified


def _add_bias_slot(graph: Graph, node: Node) -> None:
    """Recreate `node` with an explicit (zero) bias input so that a bias can be folded in."""
    channels = node.output.shape[1]
    zero = graph.add_constant(np.zeros(channels, node.output.dtype), node.name + "_bias")
    replacement = graph.make_node(
        node.op, [*node.inputs, zero], node.attrs, name=node.name, before=node
    )
    replace_node(graph, node, [replacement.output])


def clip_bounds(node: Node) -> tuple[float, float] | None:
    """The [lo, hi] range of a Relu or a Clip with constant scalar bounds."""
    if node.op == "Relu":
        return 0.0, float("inf")
    if node.op != "Clip":
        return None
    bounds = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None:
            bounds.append(float(default))
        elif value.is_const and value.size == 1:
            bounds.append(float(value.numpy().reshape(())))
        else:
            return None
    return bounds[0], bounds[1]


FUSABLE = ("Conv", "Gemm", "Add", "MatMul")


def fuse_activations(graph: Graph) -> bool:
    """Fuse Relu / Relu6 / Clip into the Conv, Gemm, Add or MatMul that produces their input."""
    modified = False
    for act in graph:
        bounds = clip_bounds(act)
        if bounds is None or act.graph is None:
            continue
        source: Value = act.inputs[0]
        producer = source.producer
        if producer is None or producer.op not in FUSABLE or single_reader(source) is not act:
            continue
        if not np.issubdtype(source.dtype, np.floating) or act.output.shape != source.shape:
            continue
        lo, hi = bounds
        if "clip" in producer.attrs:
            old_lo, old_hi = producer.attrs["clip"]
            lo, hi = max(lo, old_lo), min(hi, old_hi)
        producer.attrs["clip"] = [lo, hi]
        replace_node(graph, act, [source])
        modified = True
    return modified
