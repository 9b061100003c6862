"""Per-op IR -> TFLite operator mappings used by `circle_write.Writer` (one function per IR op).

A mapping raises `Unsupported` when the node has no exact TFLite form; the writer collects every
such node and reports them all at once.
"""

from collections.abc import Callable

import numpy as np

from ..ops import OPS
from ..quant.params import dequantize, qdq_params, quantize
from ..tensor import QuantParams
from .tflite_schema import ACT_NONE, ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1, SAME, VALID

NHWC = (0, 2, 3, 1)
FLOAT_ACTIVATIONS = {(0.0, np.inf): ACT_RELU, (0.0, 6.0): ACT_RELU6, (-1.0, 1.0): ACT_RELU_N1_TO_1}


class Unsupported(Exception):
    """The node has no exact TFLite form."""


# -- helpers -------------------------------------------------------------------------------------
def _require(condition: bool) -> None:
    if not condition:
        raise Unsupported


def _finish(w, node, code: str, inputs: list[int], perm, **options) -> None:
    """Emit `code` writing the node's output in `perm`, with its fused activation."""
    out = node.output
    attrs = node.attrs
    if "qmin" in attrs:
        options["activation"] = _quantized_activation(out, attrs)
        w.op(code, inputs, [w.define(out, perm)], **options)
        return
    lo, hi = attrs.get("clip", (-np.inf, np.inf))
    act = FLOAT_ACTIVATIONS.get((float(lo), float(hi)))
    if act is not None or (lo, hi) == (-np.inf, np.inf):
        w.op(code, inputs, [w.define(out, perm)], activation=act or ACT_NONE, **options)
        return
    shape = out.shape if perm is None else tuple(out.shape[p] for p in perm)
    pre = w.new_tensor(f"{out.name}_preact", out.dtype, shape)
    w.op(code, inputs, [pre], **options)
    _clamp(w, pre, out, perm, lo, hi)


def _clamp(w, source: int, out, perm, lo: float, hi: float) -> None:
    """MAXIMUM / MINIMUM with constant bounds (the ones that are finite)."""
    steps = [(op, b) for op, b in (("MAXIMUM", lo), ("MINIMUM", hi)) if np.isfinite(b)]
    for i, (op, bound) in enumerate(steps):
        const = w.constant(np.asarray(bound, out.dtype), f"{out.name}_{op.lower()}")
        if i == len(steps) - 1:
            target = w.define(out, perm)
        else:
            shape = out.shape if perm is None else tuple(out.shape[p] for p in perm)
            target = w.new_tensor(f"{out.name}_{op.lower()}", out.dtype, shape)
        w.op(op, [source, const], [target])
        source = target


def _quantized_activation(out, attrs) -> int:
    """The fused activation whose TFLite integer range matches the node's [qmin, qmax]."""
    info = np.iinfo(out.dtype)
    scale, zp = out.quant.scale[0], out.quant.zero_point[0]
    best, best_gap = None, 3
    for act, (lo, hi) in (
        (ACT_NONE, (-np.inf, np.inf)),
        (ACT_RELU, (0.0, np.inf)),
        (ACT_RELU6, (0.0, 6.0)),
        (ACT_RELU_N1_TO_1, (-1.0, 1.0)),
    ):
        qlo = info.min if not np.isfinite(lo) else max(info.min, zp + round(lo / scale))
        qhi = info.max if not np.isfinite(hi) else min(info.max, zp + round(hi / scale))
        gap = abs(qlo - attrs["qmin"]) + abs(qhi - attrs["qmax"])
        if gap < best_gap:
            best, best_gap = act, gap
    _require(best is not None)
    return best


def _stored(shape, perm):
    return tuple(shape) if perm is None else tuple(shape[p] for p in perm)


def _pad(w, x_index: int, x, perm, pads: list[int], fill: float | None = None) -> int:
    """An explicit PAD (or PADV2 with `fill`) of the spatial dims given in IR order."""
    nd = len(pads) // 2
    rank = len(x.shape)
    ir_pads = [[0, 0] for _ in range(rank)]
    for i in range(nd):
        ir_pads[2 + i] = [pads[i], pads[i + nd]]
    order = range(rank) if perm is None else perm
    paddings = np.asarray([ir_pads[p] for p in order], np.int32)
    shape = tuple(d + a + b for d, (a, b) in zip(_stored(x.shape, perm), paddings))
    out = w.new_tensor(f"{x.name}_padded", x.dtype, shape, quant=x.quant)
    operands = [x_index, w.constant(paddings, f"{x.name}_paddings")]
    if fill is None:
        w.op("PAD", operands, [out])
    else:
        operands.append(w.constant(np.asarray([fill], x.dtype), f"{x.name}_fill"))
        w.op("PADV2", operands, [out])
    return out


def _window(w, node, x, kernel, strides, dilations, fill, exclusive=False):
    """The NHWC input and TFLite padding for a 2-D window op with the IR's explicit pads."""
    _require(len(x.shape) == 4)
    xi = w.get(x, NHWC)
    pads = list(node.attrs.get("pads", [0] * 4))
    out = node.output.shape[2:]
    same = []
    for i in range(2):
        size, k, s, d = x.shape[2 + i], kernel[i], strides[i], dilations[i]
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        same += [total // 2, total - total // 2]
        valid = (size - (k - 1) * d - 1) // s + 1
        if out[i] not in (valid, -(-size // s)):
            same = None
            break
    whole = [x.shape[2 + i] for i in range(2)]
    if (
        exclusive
        and out == (1, 1)
        and all(kernel[i] >= whole[i] and pads[i] + whole[i] <= kernel[i] for i in range(2))
    ):
        return xi, VALID, whole  # one window over all of the input, padding not counted
    if not any(pads) and all(
        o == (x.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
        for i, o in enumerate(out)
    ):
        return xi, VALID, kernel
    if (
        same is not None
        and [same[0], same[2], same[1], same[3]] == pads
        and all(o == -(-x.shape[2 + i] // strides[i]) for i, o in enumerate(out))
    ):
        return xi, SAME, kernel
    _require(not exclusive)
    ends = [
        (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - x.shape[2 + i] - pads[i]
        for i in range(2)
    ]
    _require(min(ends) >= 0)
    return _pad(w, xi, x, NHWC, [pads[0], pads[1], *ends], fill), VALID, kernel


# -- convolution and matrix products ---------------------------------------------------------------
def _weights_for(x, weight, data: np.ndarray, axis: int | None):
    """Weight data and parameters: int8 symmetric weights under uint8 activations become uint8
    with zero point 128 (the TFLite/circle uint8 kernels take weights of the input's type)."""
    quant = weight.quant
    if quant is None:
        return data, None
    params = QuantParams(quant.scale, quant.zero_point, axis if quant.axis is not None else None)
    if x.dtype == np.uint8 and data.dtype == np.int8:
        data = (data.astype(np.int16) + 128).astype(np.uint8)
        params = QuantParams(params.scale, (128,) * len(params.scale), params.axis)
    return data, params


def _bias(w, node, channels: int) -> int:
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is None:
        return w.constant(np.zeros(channels, np.float32), f"{node.name}_bias")
    _require(bias.is_const)
    return w.constant(bias.numpy().reshape(-1), bias.name, bias.quant)


def conv(w, node):
    x, weight = node.inputs[:2]
    _require(weight.is_const and len(x.shape) == 4)
    attrs = node.attrs
    out_channels, per_group = weight.shape[:2]
    group, channels = attrs["group"], x.shape[1]
    depthwise = group > 1 and per_group == 1 and group == channels
    strides, dilations = attrs["strides"], attrs["dilations"]
    fill = None
    xi, padding, _ = _window(w, node, x, weight.shape[2:], strides, dilations, fill)
    data = weight.numpy()
    if depthwise:
        data, params = _weights_for(x, weight, data.transpose(1, 2, 3, 0), 3)
    else:
        data, params = _weights_for(x, weight, data.transpose(0, 2, 3, 1), 0)
    wi = w.constant(data, weight.name, params)
    options = dict(
        padding=padding,
        stride_h=strides[0],
        stride_w=strides[1],
        dilation_h=dilations[0],
        dilation_w=dilations[1],
    )
    if depthwise:
        options["depth_multiplier"] = out_channels // channels
    code = "DEPTHWISE_CONV_2D" if depthwise else "CONV_2D"
    _finish(w, node, code, [xi, wi, _bias(w, node, out_channels)], NHWC, **options)


def gemm(w, node):
    a, b = node.inputs[:2]
    attrs = node.attrs
    _require(b.is_const and len(a.shape) == 2 and not attrs.get("transA"))
    data = b.numpy()
    trans_b = attrs.get("transB", 0)
    if node.op == "Gemm":
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        weight = (data if trans_b else data.T) * np.float32(alpha)
        wi = w.constant(weight.astype(np.float32), b.name)
        c = node.inputs[2] if len(node.inputs) > 2 else None
        _require(c is None or c.is_const)
        bias = np.zeros(weight.shape[0], np.float32)
        if c is not None:
            bias = np.broadcast_to(c.numpy().astype(np.float32) * np.float32(beta), bias.shape)
        bi = w.constant(np.ascontiguousarray(bias), f"{node.name}_bias")
    else:
        weight, params = _weights_for(a, b, data if trans_b else data.T, 0)
        wi = w.constant(weight, b.name, params)
        bi = _bias(w, node, weight.shape[0])
    _finish(w, node, "FULLY_CONNECTED", [w.get(a, None), wi, bi], None)


def matmul(w, node):
    a, b = node.inputs
    if b.is_const and len(b.shape) == 2:
        weight = w.constant(np.ascontiguousarray(b.numpy().T), b.name)
        keep = len(a.shape) > 2
        _finish(w, node, "FULLY_CONNECTED", [w.get(a, None), weight, -1], None, keep_num_dims=keep)
        return
    _require(len(a.shape) >= 2 and len(b.shape) >= 2)
    _finish(w, node, "BATCH_MATMUL", [w.get(a, None), w.get(b, None)], None)


# -- elementwise -----------------------------------------------------------------------------------
def _common_layout(w, node, inputs):
    """The layout of the node's output: that of its first activation input when every input
    can be read in it (same rank as the output), else the IR's."""
    rank = len(node.outputs[0].shape)
    active = [v for v in inputs if v is not None and not v.is_const]
    perm = w.home_of(active[0]) if active else None
    if perm is not None and all(len(v.shape) == rank for v in active):
        return perm
    return None


def _operand(w, value, perm, rank: int) -> int:
    if value.is_const and perm is not None:
        data = value.numpy()
        data = data.reshape((1,) * (rank - data.ndim) + data.shape).transpose(perm)
        return w.constant(np.ascontiguousarray(data), value.name, value.quant)
    if perm is not None and len(value.shape) != rank:
        raise Unsupported
    return w.get(value, perm)


BINARY = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "QMul": "MUL"}


def binary(w, node):
    code = BINARY.get(node.op) or ("SUB" if node.attrs.get("subtract") else "ADD")
    perm = _common_layout(w, node, node.inputs)
    rank = len(node.output.shape)
    inputs = [_operand(w, v, perm, rank) for v in node.inputs]
    _finish(w, node, code, inputs, perm)


UNARY = {
    "Relu": "RELU",
    "Sigmoid": "LOGISTIC",
    "Tanh": "TANH",
    "HardSwish": "HARD_SWISH",
    "LeakyRelu": "LEAKY_RELU",
    "Exp": "EXP",
    "Sqrt": "SQRT",
}


def unary(w, node):
    x = node.inputs[0]
    perm = w.home_of(x)
    options = {"alpha": node.attrs.get("alpha", 0.01)} if node.op == "LeakyRelu" else {}
    w.op(UNARY[node.op], [w.get(x, perm)], [w.define(node.output, perm)], **options)


def clip(w, node):
    x = node.inputs[0]
    bounds = [
        v.numpy().item() if v is not None else inf
        for v, inf in zip((*node.inputs[1:], None, None)[:2], (-np.inf, np.inf))
    ]
    _require(all(v is None or v.is_const for v in node.inputs[1:]))
    perm = w.home_of(x)
    act = {ACT_RELU: "RELU", ACT_RELU6: "RELU6", ACT_RELU_N1_TO_1: "RELU_N1_TO_1"}.get(
        FLOAT_ACTIVATIONS.get(tuple(float(b) for b in bounds))
    )
    if act:
        w.op(act, [w.get(x, perm)], [w.define(node.output, perm)])
    else:
        _clamp(w, w.get(x, perm), node.output, perm, *bounds)


LOOKUP_FUNCTIONS = (  # (IR op, attributes, TFLite op) a quantized lookup table may stand for
    ("Relu", {}, "RELU"),
    ("Sigmoid", {}, "LOGISTIC"),
    ("Tanh", {}, "TANH"),
    ("HardSwish", {}, "HARD_SWISH"),
)


def lookup(w, node):
    """A QLookup becomes the TFLite op whose function, quantized like the quantizer does it,
    gives exactly its table."""
    x, table = node.inputs
    out = node.output
    info = np.iinfo(x.dtype)
    real = dequantize(np.arange(info.min, info.max + 1).astype(x.dtype), x.quant)
    for op, attrs, code in LOOKUP_FUNCTIONS:
        (y,) = OPS[op].kernel(attrs, real)
        if np.array_equal(quantize(np.asarray(y, np.float64), out.quant, out.dtype), table.numpy()):
            perm = w.home_of(x)
            w.op(code, [w.get(x, perm)], [w.define(out, perm)])
            return
    raise Unsupported


def softmax(w, node):
    x = node.inputs[0]
    rank = len(x.shape)
    axis = node.attrs.get("axis", -1) % rank
    perm = w.home_of(x)
    if perm is not None and perm.index(axis) != rank - 1:
        perm = None
    _require((axis if perm is None else perm.index(axis)) == rank - 1)
    w.op("SOFTMAX", [w.get(x, perm)], [w.define(node.output, perm)], beta=1.0)


# -- pooling ---------------------------------------------------------------------------------------
def pool(w, node):
    x, attrs = node.inputs[0], node.attrs
    out = node.output
    _require(len(x.shape) == 4)
    if node.op.startswith("Global"):
        kernel, strides, attrs = x.shape[2:], (1, 1), {**attrs, "pads": [0] * 4}
    else:
        kernel, strides = attrs["kernel_shape"], attrs["strides"]
        _require(set(attrs.get("dilations", [1, 1])) == {1})
    maximum = "Max" in node.op
    if maximum:
        fill = float(np.finfo(np.float32).min) if x.dtype == np.float32 else np.iinfo(x.dtype).min
    else:
        fill = None
    exclusive = not maximum and not attrs.get("count_include_pad")
    node_view = _Shim(node, attrs)
    xi, padding, kernel = _window(w, node_view, x, kernel, strides, (1, 1), fill, exclusive)
    options = dict(
        padding=padding,
        stride_h=strides[0],
        stride_w=strides[1],
        filter_h=kernel[0],
        filter_w=kernel[1],
    )
    code = "MAX_POOL_2D" if maximum else "AVERAGE_POOL_2D"
    if node.op == "QAveragePool" and (x.quant != out.quant):
        # TFLite averages in the input's parameters; requantize to the output's after
        pre = w.new_tensor(f"{out.name}_avg", x.dtype, _stored(out.shape, NHWC), quant=x.quant)
        w.op(code, [xi], [pre], **options)
        w.op("QUANTIZE", [pre], [w.define(out, NHWC)])
        return
    _finish(w, node_view, code, [xi], NHWC, **options)


class _Shim:
    """A node seen with other attributes (global pooling as a full-window pool)."""

    def __init__(self, node, attrs):
        self.output, self.outputs, self.attrs, self.name = (
            node.output,
            node.outputs,
            attrs,
            node.name,
        )


def reduce(w, node):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    keep = bool(node.attrs.get("keepdims", 1))
    perm = w.home_of(x) if keep else None
    stored = sorted(axes if perm is None else [perm.index(a) for a in axes])
    code = "MEAN" if node.op == "ReduceMean" else "REDUCE_MAX"
    operands = [w.get(x, perm), w.constant(np.asarray(stored, np.int32), f"{node.name}_axes")]
    w.op(code, operands, [w.define(node.output, perm)], keep_dims=keep)


# -- data movement ---------------------------------------------------------------------------------
def concat(w, node):
    inputs = node.inputs
    perm = _common_layout(w, node, inputs)
    rank = len(node.output.shape)
    axis = node.attrs["axis"] % rank
    out = node.output
    operands = []
    for v in inputs:
        index = _operand(w, v, perm, rank)
        if node.op == "QConcat" and v.quant != out.quant:
            requantized = w.new_tensor(
                f"{v.name}_rq", out.dtype, _stored(v.shape, perm), quant=out.quant
            )
            w.op("QUANTIZE", [index], [requantized])
            index = requantized
        operands.append(index)
    _finish(
        w, node, "CONCATENATION", operands, perm, axis=axis if perm is None else perm.index(axis)
    )


def reshape(w, node):
    shape = w.constant(np.asarray(node.output.shape, np.int32), f"{node.name}_shape")
    w.op("RESHAPE", [w.get(node.inputs[0], None), shape], [w.define(node.output, None)])


def transpose(w, node):
    x = node.inputs[0]
    home = w.home_of(x)
    inner = tuple(range(len(x.shape))) if home is None else tuple(np.argsort(home))
    order = np.asarray([inner[p] for p in node.attrs["perm"]], np.int32)
    operands = [w.get(x, home), w.constant(order, f"{node.name}_perm")]
    w.op("TRANSPOSE", operands, [w.define(node.output, None)])


def pad(w, node):
    x, attrs = node.inputs[0], node.attrs
    mode = attrs.get("mode", "constant")
    perm = w.home_of(x)
    rank = len(x.shape)
    pads = attrs["pads"]
    pairs = [[pads[i], pads[i + rank]] for i in range(rank)]
    order = range(rank) if perm is None else perm
    paddings = w.constant(np.asarray([pairs[p] for p in order], np.int32), f"{node.name}_pads")
    operands = [w.get(x, perm), paddings]
    value = float(attrs.get("value", 0.0))
    if mode == "reflect":
        w.op("MIRROR_PAD", operands, [w.define(node.output, perm)], mode=0)
        return
    _require(mode == "constant")
    if x.quant is not None:
        _require(value == x.quant.zero_point[0])  # TFLite pads quantized tensors with it
        code = "PAD"
    elif value == 0.0:
        code = "PAD"
    else:
        operands.append(w.constant(np.asarray([value], x.dtype), f"{node.name}_value"))
        code = "PADV2"
    w.op(code, operands, [w.define(node.output, perm)])


def resize(w, node):
    x, attrs = node.inputs[0], node.attrs
    sizes = attrs["sizes"]
    _require(len(x.shape) == 4 and list(sizes[:2]) == list(x.shape[:2]) and not attrs.get("roi"))
    mode = attrs.get("mode", "nearest")
    coords = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode == "linear":
        _require(
            coords in ("half_pixel", "align_corners", "asymmetric") and not attrs.get("antialias")
        )
        code = "RESIZE_BILINEAR"
    else:
        _require(
            mode == "nearest"
            and coords == "asymmetric"
            and attrs.get("nearest_mode", "round_prefer_floor") == "floor"
        )
        code = "RESIZE_NEAREST_NEIGHBOR"
    size = w.constant(np.asarray(sizes[2:], np.int32), f"{node.name}_size")
    w.op(
        code,
        [w.get(x, NHWC), size],
        [w.define(node.output, NHWC)],
        align_corners=coords == "align_corners",
        half_pixel_centers=coords == "half_pixel",
    )


def batch_norm(w, node):
    x, scale, bias, mean, var = node.inputs
    _require(all(v.is_const for v in (scale, bias, mean, var)) and len(x.shape) >= 2)
    eps = node.attrs.get("epsilon", 1e-5)
    factor = scale.numpy() / np.sqrt(var.numpy() + eps)
    shift = bias.numpy() - mean.numpy() * factor
    perm = w.home_of(x)
    rank = len(x.shape)
    shape = [1] * rank
    shape[1] = -1
    operands = []
    for data, name in ((factor, "scale"), (shift, "shift")):
        data = data.astype(x.dtype).reshape(shape)
        if perm is not None:
            data = data.transpose(perm)
        operands.append(w.constant(np.ascontiguousarray(data), f"{node.name}_{name}"))
    scaled = w.new_tensor(f"{node.output.name}_scaled", x.dtype, _stored(x.shape, perm))
    w.op("MUL", [w.get(x, perm), operands[0]], [scaled])
    w.op("ADD", [scaled, operands[1]], [w.define(node.output, perm)])


def lrn(w, node):
    x, attrs = node.inputs[0], node.attrs
    size = attrs["size"]
    _require(len(x.shape) == 4 and size % 2 == 1)
    w.op(
        "LOCAL_RESPONSE_NORMALIZATION",
        [w.get(x, NHWC)],
        [w.define(node.output, NHWC)],
        radius=(size - 1) // 2,
        bias=attrs.get("bias", 1.0),
        alpha=attrs.get("alpha", 1e-4) / size,
        beta=attrs.get("beta", 0.75),
    )


def identity(w, node):
    _require(all(not v.uses and v not in w.graph.outputs for v in node.outputs[1:]))
    w.alias(node.outputs[0], node.inputs[0])


def quantize_op(w, node):
    x, out = node.inputs[0], node.output
    params = out.quant or qdq_params(node.attrs)
    _require(params.axis is None)
    perm = w.home_of(x)
    code = "DEQUANTIZE" if node.op == "DequantizeLinear" else "QUANTIZE"
    w.op(code, [w.get(x, perm)], [w.define(out, perm, None if code == "DEQUANTIZE" else params)])


WRITERS: dict[str, Callable] = {
    "Conv": conv,
    "QConv": conv,
    "Gemm": gemm,
    "QGemm": gemm,
    "MatMul": matmul,
    **{op: binary for op in ("Add", "Sub", "Mul", "Div", "QAdd", "QMul")},
    **{op: unary for op in UNARY},
    "Clip": clip,
    "QLookup": lookup,
    "Softmax": softmax,
    **{
        op: pool
        for op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "QAveragePool")
    },
    "ReduceMean": reduce,
    "ReduceMax": reduce,
    "Concat": concat,
    "QConcat": concat,
    "Reshape": reshape,
    "Transpose": transpose,
    "Pad": pad,
    "Resize": resize,
    "BatchNormalization": batch_norm,
    "LRN": lrn,
    "Identity": identity,
    "Dropout": identity,
    "QuantizeLinear": quantize_op,
    "DequantizeLinear": quantize_op,
    "Requantize": quantize_op,
}
