"""IR -> TFLite mappings of the spatial and matrix operators (convolution, fully connected,
pooling, resizing, normalization), with TFLite's SAME/VALID padding or an explicit PAD."""

import numpy as np

from ..tensor import QuantParams
from .circle_ops import NHWC, _finish, _require, _stored
from .tflite_schema import SAME, VALID


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
