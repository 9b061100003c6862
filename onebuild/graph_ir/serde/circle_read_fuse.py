"""Patterns the circle/tflite writer (and converters) spell with several TFLite operators,
folded back into the one IR op they stand for while reading, so round trips give identical
graphs and numbers:

- SPLIT along channels, one CONV_2D per part, CONCATENATION along channels -> a grouped Conv;
- an average counting padding, times each window's size over its count of real cells -> the
  average that leaves padding out;
- x * (bias + 1x1 Conv(x * x, a band of alpha / size)) ^ -beta -> LRN (circle's form of it);
- x * relu6(x + 3) * 1/6 -> HardSwish (circle's form of it), x * sigmoid(x) -> Swish (the
  spellings `passes.patterns` knows);
- a 1x1 Conv to b * b * O channels, then DepthToSpace(b) -> ConvTranspose with kernel = stride =
  b (circle's form of it);
- an input of rank > 2 reshaped to rows, MatMul by constant weights, reshaped back -> the MatMul
  of the input (the writer's form for onert, which drops FULLY_CONNECTED's keep_num_dims);
- a float mean or maximum keeping its reduced axes, reshaped to drop them -> the reduction
  without kept dims (the writer's form for onert, which refuses keep_dims = false);
- NHWC rows reshaped, concatenated with copies of themselves along the width, then the height
  -> nearest Resize by whole factors (circle's form: onert has no RESIZE_NEAREST_NEIGHBOR);
- relu(x) + slope * (x - relu(x)) -> PRelu (circle's form: onert has no PReLU kernel);
- (x - mean) / sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta] -> LayerNormalization (no
  TFLite operator; the writer's spelling, as `passes.patterns` matches exporters').

Each function returns the replacement value, or None when the pattern does not hold exactly;
the nodes it bypasses stay (a later operator may still read their outputs) and are removed by
dead-code elimination when nothing does.
"""

import numpy as np

from ..ir import Graph, Node, Value
from ..passes.patterns import activation_ending_at, layer_norm_ending_at
from ..tensor import QuantParams

CONV_KEYS = (
    "strides",
    "dilations",
    "pads",
    "clip",
    "x_zero_point",
    "y_zero_point",
    "qmin",
    "qmax",
    "dtype",
)


def grouped_conv(graph: Graph, values: list[Value], axis: int) -> Value | None:
    """One grouped Conv/QConv for a channel concatenation of per-group convolutions of the
    parts of one channel split, in order."""
    convs = [v.producer for v in values]
    if axis != 1 or len(values) < 2 or any(c is None for c in convs):
        return None
    op = convs[0].op
    split = convs[0].inputs[0].producer
    if op not in ("Conv", "QConv") or split is None or split.op != "Split":
        return None
    if split.attrs["axis"] != 1 or len(split.outputs) != len(convs):
        return None
    for conv, part, value in zip(convs, split.outputs, values):
        if conv.op != op or conv.inputs[0] is not part or conv.attrs.get("group") != 1:
            return None
        if value.uses or value in graph.outputs or len(part.uses) != 1:
            return None
        if any(conv.attrs.get(k) != convs[0].attrs.get(k) for k in CONV_KEYS):
            return None
        if not all(v is not None and v.is_const for v in conv.inputs[1:3]):
            return None
        if value.quant != values[0].quant:
            return None
    weight = graph.add_constant(
        np.concatenate([c.inputs[1].numpy() for c in convs]), convs[0].inputs[1].name
    )
    bias = graph.add_constant(
        np.concatenate([c.inputs[2].numpy().reshape(-1) for c in convs]), convs[0].inputs[2].name
    )
    attrs = {**convs[0].attrs, "group": len(convs)}
    if op == "QConv":
        counts = [c.output.shape[1] for c in convs]
        for key in ("multiplier", "shift"):
            attrs[key] = [
                int(m) for c, n in zip(convs, counts) for m in np.broadcast_to(c.attrs[key], (n,))
            ]
        weight.quant = _channels([c.inputs[1].quant for c in convs], counts)
        bias.quant = _channels([c.inputs[2].quant for c in convs], counts)
    node = graph.make_node(op, [split.inputs[0], weight, bias], attrs, convs[0].name)
    node.output.quant = values[0].quant
    return node.output


def _channels(params: list[QuantParams], counts: list[int]) -> QuantParams:
    """Per-channel parameters (axis 0) of concatenated per-group weights or biases."""
    scale, zero = [], []
    for p, n in zip(params, counts):
        scale += list(np.broadcast_to(p.scale, (n,)))
        zero += list(np.broadcast_to(p.zero_point, (n,)))
    return QuantParams(tuple(float(s) for s in scale), tuple(int(z) for z in zero), 0)


def exclusive_average(graph: Graph, a: Value, b: Value) -> Value | None:
    """An AveragePool counting its padding (`a`) times the constant `b` that rescales each
    window to its real cells: the AveragePool that leaves padding out."""
    pool = a.producer
    if pool is None or pool.op != "AveragePool" or not b.is_const or a.uses:
        return None
    attrs = pool.attrs
    if not attrs.get("count_include_pad") or not any(attrs["pads"]) or a in graph.outputs:
        return None
    size, out = pool.inputs[0].shape[2:], a.shape[2:]
    counts = []
    for i in range(len(size)):
        start = np.arange(out[i]) * attrs["strides"][i] - attrs["pads"][i]
        counts.append(np.minimum(start + attrs["kernel_shape"][i], size[i]) - np.maximum(start, 0))
    window = float(np.prod(attrs["kernel_shape"]))
    ratio = (window / np.outer(counts[0], counts[1])).astype(np.float32)
    if len(size) != 2 or b.shape != (1, 1, *out) or not np.array_equal(b.numpy()[0, 0], ratio):
        return None
    exclusive = {**attrs, "count_include_pad": 0}
    return graph.make_node("AveragePool", [pool.inputs[0]], exclusive, pool.name).output


def local_response_norm(graph: Graph, x: Value, power: Value) -> Value | None:
    """LRN for x * Pow(Conv(x * x, band, bias), -beta), the band of width `size` centered as
    ONNX centers it and holding alpha / size."""
    node = power.producer
    if node is None or node.op != "Pow" or power.uses or not node.inputs[1].is_const:
        return None
    exponent = node.inputs[1].numpy()
    conv = node.inputs[0].producer
    if exponent.size != 1 or conv is None or conv.op != "Conv" or len(conv.inputs) < 3:
        return None
    squares, band, bias = conv.inputs
    square = squares.producer
    if square is None or square.op != "Mul" or list(square.inputs) != [x, x]:
        return None
    if not (band.is_const and bias is not None and bias.is_const) or len(band.shape) != 4:
        return None
    if conv.attrs.get("group") != 1 or any(conv.attrs["pads"]) or "clip" in conv.attrs:
        return None
    if set(conv.attrs["strides"]) != {1} or band.shape[2:] != (1, 1):
        return None
    weights, offsets = band.numpy()[:, :, 0, 0], bias.numpy()
    value = weights[0, 0]
    size = int(np.count_nonzero(weights[weights.shape[0] // 2]))
    expected = np.zeros_like(weights)
    before, after = (size - 1) // 2, size // 2
    for c in range(weights.shape[0]):
        expected[c, max(0, c - before) : c + after + 1] = value
    if size < 1 or not np.array_equal(weights, expected) or len(set(offsets.tolist())) != 1:
        return None
    attrs = {
        "size": size,
        "alpha": float(value) * size,
        "beta": -float(exponent.reshape(())),
        "bias": float(offsets[0]),
    }
    return graph.make_node("LRN", [x], attrs, conv.name).output


FOLDED_ACTIVATIONS = ("HardSwish", "Swish")


def activation(graph: Graph, node: Node) -> Value | None:
    """HardSwish or Swish for the product `node` that ends one of their spellings."""
    found = activation_ending_at(node)
    if found is None or found[0] not in FOLDED_ACTIVATIONS:
        return None
    op, x, attrs = found
    return graph.make_node(op, [x], attrs, node.name).output


def pixel_shuffle(graph: Graph, windows: Value, block: int) -> Value | None:
    """ConvTranspose (kernel = stride = `block`) for DepthToSpace(block) of a float 1x1 Conv
    whose channel (i b + j) O + o holds weights [:, o, i, j] and the same bias for every (i, j)."""
    conv = windows.producer
    if conv is None or conv.op != "Conv" or len(conv.inputs) < 3 or "clip" in conv.attrs:
        return None
    x, weight, bias = conv.inputs
    attrs = conv.attrs
    if not (weight.is_const and bias is not None and bias.is_const) or weight.shape[2:] != (1, 1):
        return None
    if attrs["group"] != 1 or any(attrs["pads"]) or set(attrs["strides"]) != {1}:
        return None
    if set(attrs["dilations"]) != {1} or weight.shape[0] % (block * block):
        return None
    channels = weight.shape[0] // (block * block)
    offsets = bias.numpy().reshape(block * block, channels)
    if np.any(offsets != offsets[0]):
        return None
    data = weight.numpy()[:, :, 0, 0].reshape(block, block, channels, -1).transpose(3, 2, 0, 1)
    inputs = [x, graph.add_constant(np.ascontiguousarray(data), weight.name)]
    if np.any(offsets[0]):
        inputs.append(graph.add_constant(offsets[0].copy(), bias.name))
    transposed = {
        "strides": [block, block],
        "dilations": [1, 1],
        "pads": [0, 0, 0, 0],
        "output_padding": [0, 0],
        "group": 1,
    }
    return graph.make_node("ConvTranspose", inputs, transposed, conv.name).output


def matmul_rows(graph: Graph, value: Value, shape: list[int], name: str) -> Value | None:
    """MatMul(z) for `value` = MatMul(Reshape(z) to rows, constant weights) reshaped to `shape`
    = z's leading axes and the weights' columns."""
    node = value.producer
    if node is None or node.op != "MatMul" or not node.inputs[1].is_const:
        return None
    flat = node.inputs[0].producer
    if flat is None or flat.op != "Reshape":
        return None
    z, weights = flat.inputs[0], node.inputs[1]
    rows = int(np.prod(z.shape[:-1]))
    if len(z.shape) <= 2 or tuple(flat.output.shape) != (rows, z.shape[-1]):
        return None
    if tuple(shape) != (*z.shape[:-1], weights.shape[1]):
        return None
    return graph.make_node("MatMul", [z, weights], dict(node.attrs), name).output


def dropped_axes(graph: Graph, value: Value, shape: list[int], name: str) -> Value | None:
    """ReduceMean / ReduceMax without kept dims for `value` = such a reduction keeping them,
    reshaped to `shape` = its shape without the reduced axes. (A spatial one reads as the
    global pool and stays so: a global pool and a flatten are the same MEAN and RESHAPE, and
    give the same bits.)"""
    node = value.producer
    if node is None or node.op not in ("ReduceMean", "ReduceMax") or value.dtype != np.float32:
        return None
    axes = node.attrs["axes"]
    if not node.attrs.get("keepdims", 1) or not axes:
        return None
    if tuple(shape) != tuple(d for i, d in enumerate(value.shape) if i not in axes):
        return None
    attrs = {"axes": list(axes), "keepdims": 0}
    return graph.make_node(node.op, [node.inputs[0]], attrs, name).output


NHWC_ORDER = [0, 2, 3, 1]


def repeated_pixels(graph: Graph, value: Value, shape: list[int], name: str) -> Value | None:
    """Resize(x) (nearest, asymmetric, floor; whole factors sh, sw) for `value` = NHWC(x)'s
    rows [n h, w, 1, c] concatenated sw times along axis 2, reshaped to [n, h, 1, w sw c],
    concatenated sh times, reshaped to `shape` = [n, h sh, w sw, c] (the writer's `_repeat`)."""
    factors, stages = [], []
    for _ in range(2):
        concat = value.producer
        if concat is None or concat.op not in ("Concat", "QConcat") or concat.attrs["axis"] != 2:
            return None
        rows = concat.inputs[0]
        if any(v is not rows for v in concat.inputs) or concat.output.quant != rows.quant:
            return None
        if rows.producer is None or rows.producer.op != "Reshape":
            return None
        factors.append(len(concat.inputs))
        stages.append(tuple(rows.shape))
        value = rows.producer.inputs[0]
    transpose = value.producer
    if transpose is None or transpose.op != "Transpose" or transpose.attrs["perm"] != NHWC_ORDER:
        return None
    x = transpose.inputs[0]
    sh, sw = factors
    n, c, h, w = x.shape
    if stages != [(n, h, 1, w * sw * c), (n * h, w, 1, c)]:
        return None
    if tuple(shape) != (n, h * sh, w * sw, c):
        return None
    sizes = [n, c, h * sh, w * sw]
    attrs = {
        "sizes": sizes,
        "scales": [s / d for s, d in zip(sizes, x.shape)],
        "coordinate_transformation_mode": "asymmetric",
        "mode": "nearest",
        "nearest_mode": "floor",
    }
    return graph.make_node("Resize", [x], attrs, name).output


def prelu(graph: Graph, a: Value, b: Value) -> Value | None:
    """PRelu(x, slope) for a + b = relu(x) + (x - relu(x)) * slope, slope constant."""
    relu, scaled = a.producer, b.producer
    if relu is None or relu.op != "Relu" or relu.attrs or scaled is None or scaled.op != "Mul":
        return None
    x = relu.inputs[0]
    negative, slope = scaled.inputs
    difference = negative.producer
    if not slope.is_const or scaled.attrs or difference is None or difference.op != "Sub":
        return None
    if difference.attrs or list(difference.inputs) != [x, a]:
        return None
    if np.broadcast_shapes(tuple(x.shape), tuple(slope.shape)) != tuple(x.shape):
        return None  # a slope that enlarges the output: PRelu broadcasts it to x only
    return graph.make_node("PRelu", [x, slope], {}, f"{a.name}/prelu").output


def layer_norm(graph: Graph, node: Node) -> Value | None:
    """LayerNormalization for the Div `node` ending its spelling (scale 1), or one taking in a
    Mul by a constant gamma or an Add of a constant beta that follows it."""
    if node.op == "Div":
        found = layer_norm_ending_at(node)
        if found is None:
            return None
        _, x, attrs = found
        ones = graph.add_constant(np.ones(x.shape[attrs["axis"] :], x.dtype), f"{x.name}_ones")
        return graph.make_node("LayerNormalization", [x, ones], attrs, node.name).output
    a, b = node.inputs
    norm = a.producer
    if node.op not in ("Mul", "Add") or node.attrs or norm is None or not b.is_const:
        return None
    if norm.op != "LayerNormalization" or len(norm.inputs) > 2 or len(a.users) != 1:
        return None
    x, scale = norm.inputs
    shape = x.shape[norm.attrs["axis"] :]
    if len(b.shape) > len(shape) or np.broadcast_shapes(b.shape, shape) != shape:
        return None
    constant = graph.add_constant(np.broadcast_to(b.numpy(), shape).astype(x.dtype), b.name)
    if node.op == "Mul":
        if not np.all(scale.numpy() == 1):
            return None
        inputs = [x, constant]
    else:
        inputs = [x, scale, constant]
    return graph.make_node("LayerNormalization", inputs, dict(norm.attrs), node.name).output
