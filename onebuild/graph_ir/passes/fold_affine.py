"""Constant scales and shifts folded into the Conv or Gemm next to them (one rounding less each
once quantized):

- Conv/ConvTranspose/Gemm -> Add(per-channel constant): the constant joins the layer's bias
  (Paddle writes a conv's bias this way);
- Conv -> Mul(per-channel constant): the weights and bias are scaled;
- Mul(x, scalar) -> Conv/Gemm: the weights are scaled (a zero-padded Conv sees 0 * c = 0 alike);
- Add(x, scalar) -> unpadded Conv or Gemm: the bias grows by the scalar times each output's
  weight sum (a padded Conv would see zeros where the shift should be, so it is left alone).

PP-LCNetV3's learnable affine blocks (scalar Mul and Add around each activation) mostly vanish.
"""

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import weight_axes
from .rewrite import made_by, replace_node, replace_with, scalar, single


def _fold_bias_add(graph: Graph, node: Node) -> bool:
    """Add(Conv/ConvTranspose/Gemm output, per-channel constant) -> the constant joins the
    producer's bias."""
    if sum(v.is_const for v in node.inputs) != 1:
        return False
    source, constant = sorted(node.inputs, key=lambda v: v.is_const)
    producer = made_by(source, ("Conv", "ConvTranspose", "Gemm"))
    if producer is None or not single(source) or node.output.shape != source.shape:
        return False
    if producer.op == "Gemm" and producer.attrs.get("beta", 1.0) != 1.0:
        return False
    bias = producer.inputs[2] if len(producer.inputs) > 2 else None
    if not producer.inputs[1].is_const or (bias is not None and not bias.is_const):
        return False
    rank, shape = len(source.shape), constant.shape
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    if len(shape) > rank or any(d != 1 for i, d in enumerate(aligned) if i != 1):
        return False
    channels = source.shape[1]
    values = np.broadcast_to(constant.numpy().reshape(-1), (channels,)).astype(np.float64)
    old = bias.numpy().astype(np.float64) if bias is not None else 0.0
    new_bias = graph.add_constant((old + values).astype(source.dtype), f"{producer.name}_bias")
    if len(producer.inputs) > 2:
        producer.set_input(2, new_bias)
    else:
        inputs = [*producer.inputs, new_bias]
        producer = replace_with(graph, [], producer, producer.op, inputs, producer.attrs)
    replace_node(graph, node, [producer.output])
    return True


def _per_channel(value: Value, constant: Value) -> np.ndarray | None:
    """A constant operand of an elementwise op on `value` ([N, C, ...]) as one number per channel
    C, or None when it varies along another axis."""
    rank, shape = len(value.shape), constant.shape
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    if rank < 2 or len(shape) > rank or any(d != 1 for i, d in enumerate(aligned) if i != 1):
        return None
    flat = constant.numpy().reshape(-1).astype(np.float64)
    return np.broadcast_to(flat, (value.shape[1],))


def _operands(node: Node) -> tuple[Value, Value] | None:
    """(the variable operand, the constant one) of a binary node with exactly one constant."""
    a, b = node.inputs[:2]
    if a.is_const == b.is_const:
        return None
    return (b, a) if a.is_const else (a, b)


def _set_constant(graph: Graph, node: Node, index: int, array: np.ndarray, suffix: str) -> Node:
    """`node` with constant input `index` replaced by `array` (recreated to add a bias slot)."""
    like = node.inputs[1]
    value = graph.add_constant(array.astype(like.dtype), f"{like.name}_{suffix}")
    if index < len(node.inputs):
        node.set_input(index, value)
        return node
    return replace_with(graph, [], node, node.op, [*node.inputs, value], node.attrs)


def _fold_scale_into_conv(graph: Graph, node: Node) -> bool:
    """Mul(Conv output, per-channel constant) -> the Conv's weights and bias scaled."""
    pair = _operands(node)
    conv = made_by(pair[0], "Conv") if pair else None
    if conv is None or not single(pair[0]) or node.output.shape != pair[0].shape:
        return False
    factors = _per_channel(pair[0], pair[1])
    params = [v for v in conv.inputs[1:3] if v is not None]
    if factors is None or not all(v.is_const for v in params):
        return False
    weights = conv.inputs[1].numpy().astype(np.float64)
    shape = (-1,) + (1,) * (weights.ndim - 1)
    _set_constant(graph, conv, 1, weights * factors.reshape(shape), "scaled")
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        _set_constant(graph, conv, 2, conv.inputs[2].numpy() * factors, "scaled")
    replace_node(graph, node, [conv.output])
    return True


def _consumer(node: Node) -> Node | None:
    """The Conv or Gemm (constant weights, no alpha/beta) reading `node`'s output as its data
    input and nothing else reading it."""
    value = node.output
    if not single(value):
        return None
    user = value.users[0]
    if user.op not in ("Conv", "Gemm") or user.inputs[0] is not value:
        return None
    if user.op == "Gemm" and (user.attrs.get("transA") or user.attrs.get("alpha", 1.0) != 1.0
                              or user.attrs.get("beta", 1.0) != 1.0):  # fmt: skip
        return None
    params = [v for v in user.inputs[1:3] if v is not None]
    return user if all(v.is_const for v in params) else None


def _fold_into_consumer(graph: Graph, node: Node) -> bool:
    """x * c or x + d (c, d scalars) read only by a Conv/Gemm: c joins its weights; d its bias
    (sum of each output's weights times d), when the Conv has no padding to see zeros."""
    pair = _operands(node)
    number = scalar(pair[1]) if pair else None
    user = _consumer(node) if number is not None else None
    if user is None or node.output.shape != pair[0].shape:
        return False
    weights = user.inputs[1].numpy().astype(np.float64)
    if node.op == "Mul":
        _set_constant(graph, user, 1, weights * number, "scaled")
    else:
        if user.op == "Conv" and any(user.attrs.get("pads", [])):
            return False
        out = weight_axes(user).out
        shift = number * weights.sum(axis=tuple(i for i in range(weights.ndim) if i != out))
        bias = user.inputs[2] if len(user.inputs) > 2 else None
        if bias is not None and bias.shape != shift.shape:
            return False
        old = bias.numpy().astype(np.float64) if bias is not None else 0.0
        _set_constant(graph, user, 2, old + shift, "shifted")
    replace_node(graph, node, [pair[0]])
    return True


def fold_affine(graph: Graph) -> bool:
    """Fold the constant scales and shifts listed in this module's docstring."""
    modified = False
    for node in graph:
        if node.graph is None or node.op not in ("Add", "Mul") or "clip" in node.attrs:
            continue
        if len(node.outputs) != 1 or not np.issubdtype(node.output.dtype, np.floating):
            continue
        if node.op == "Add":
            modified |= _fold_bias_add(graph, node) or _fold_into_consumer(graph, node)
        else:
            modified |= _fold_scale_into_conv(graph, node) or _fold_into_consumer(graph, node)
    return modified
