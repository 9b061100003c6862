"""IR -> TFLite mappings of the spatial and matrix operators (convolution, fully connected,
pooling), with TFLite's SAME/VALID padding or an explicit PAD (resizing and normalizations are
in `circle_ops_norm`)."""

import math

import numpy as np

from ..ops.conv import pixel_shuffle_block, pixel_shuffle_weights
from ..tensor import QuantParams
from .circle_names import depthwise as is_depthwise
from .circle_names import pointwise_gemm, rescaling_mean
from .circle_ops import (
    NHWC,
    _finish,
    _quantized_activation,
    _require,
    _stored,
    fused_activation,
)
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
        # TFLite's quantized PADV2 takes a fill with the output's parameters
        operands.append(w.constant(np.asarray([fill], x.dtype), f"{x.name}_fill", x.quant))
        w.op("PADV2", operands, [out])
    return out


def _window(w, node, x, kernel, strides, dilations, fill, exclusive=False, same_ok=True):
    """(NHWC input, TFLite padding, kernel, explicit pads or None) of a 2-D window op with the
    IR's pads: VALID, SAME when the pads are TensorFlow's, else an explicit PAD (filled with
    `fill`, zero by default) and VALID. `same_ok` is False for an average counting the padding
    (TFLite's SAME average leaves it out)."""
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
        return xi, VALID, whole, None  # one window over all of the input, padding not counted
    if not any(pads) and all(
        o == (x.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
        for i, o in enumerate(out)
    ):
        return xi, VALID, kernel, None
    if (
        same_ok
        and same is not None
        and [same[0], same[2], same[1], same[3]] == pads
        and all(o == -(-x.shape[2 + i] // strides[i]) for i, o in enumerate(out))
    ):
        return xi, SAME, kernel, None
    # past the last window's end: no padding (VALID drops the rows no window reaches)
    ends = [
        max(
            (out[i] - 1) * strides[i]
            + (kernel[i] - 1) * dilations[i]
            + 1
            - x.shape[2 + i]
            - pads[i],
            0,
        )
        for i in range(2)
    ]
    explicit = [pads[0], pads[1], *ends]
    return _pad(w, xi, x, NHWC, explicit, fill), VALID, kernel, explicit


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
    out_channels = weight.shape[0]
    group, channels = attrs["group"], x.shape[1]
    depthwise = is_depthwise(node)
    strides, dilations = attrs["strides"], attrs["dilations"]
    fill = None
    xi, padding, _, _ = _window(w, node, x, weight.shape[2:], strides, dilations, fill)
    data = weight.numpy()
    if depthwise:
        data, params = _weights_for(x, weight, data.transpose(1, 2, 3, 0), 3)
    else:
        data, params = _weights_for(x, weight, data.transpose(0, 2, 3, 1), 0)
    options = dict(
        padding=padding,
        stride_h=strides[0],
        stride_w=strides[1],
        dilation_h=dilations[0],
        dilation_w=dilations[1],
    )
    if group > 1 and not depthwise:
        _grouped(w, node, xi, data, params, options)
        return
    wi = w.constant(data, weight.name, params)
    if depthwise:
        options["depth_multiplier"] = out_channels // channels
    code = "DEPTHWISE_CONV_2D" if depthwise else "CONV_2D"
    _finish(w, node, code, [xi, wi, _bias(w, node, out_channels)], NHWC, **options)


def conv_transpose(w, node):
    """A float 2-D ConvTranspose without groups, dilation, padding or output padding:
    TRANSPOSE_CONV (VALID; weights [I, O, kh, kw] -> [O, kh, kw, I]), then ADD of the bias
    (onert's loader takes TRANSPOSE_CONV with three inputs only). In circle, a square kernel
    as large as its stride (windows that do not overlap) is written as a 1x1 CONV_2D and
    DEPTH_TO_SPACE, which onert's cpu backend runs (it has no TRANSPOSE_CONV kernel)."""
    x, weight = node.inputs[:2]
    attrs = node.attrs
    _require(weight.is_const and len(x.shape) == 4 and x.dtype == np.float32)
    _require(attrs["group"] == 1 and list(attrs["dilations"]) == [1, 1])
    _require(not any(attrs["pads"]) and not any(attrs["output_padding"]))
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    _require(bias is None or bias.is_const)
    block = pixel_shuffle_block(attrs, weight.shape)
    if w.fmt == "circle" and block is not None:
        _pixel_shuffle(w, node, block)
        return
    out = node.output
    stored = _stored(out.shape, NHWC)
    shape = w.constant(np.asarray(stored, np.int32), f"{node.name}_output_shape")
    filt = w.constant(weight.numpy().transpose(1, 2, 3, 0), weight.name)
    operands = [shape, filt, w.get(x, NHWC)]
    strides = attrs["strides"]
    options = dict(padding=VALID, stride_h=strides[0], stride_w=strides[1])
    if bias is None:
        w.op("TRANSPOSE_CONV", operands, [w.define(out, NHWC)], **options)
        return
    raw = w.new_tensor(f"{out.name}_nobias", out.dtype, stored)
    w.op("TRANSPOSE_CONV", operands, [raw], **options)
    b = w.constant(bias.numpy().reshape(-1), bias.name)
    w.op("ADD", [raw, b], [w.define(out, NHWC)], activation=0)


def _pixel_shuffle(w, node, block: int) -> None:
    """ConvTranspose with kernel = stride = `block`: each input pixel's b x b output window is
    a 1x1 CONV_2D to b * b * O channels, laid out by DEPTH_TO_SPACE (channel (i b + j) O + o
    goes to row offset i, column offset j, channel o)."""
    x, weight = node.inputs[:2]
    out = node.output
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    data, offsets = pixel_shuffle_weights(weight.numpy(), None if bias is None else bias.numpy())
    n, _, h, wd = x.shape
    windows = w.new_tensor(f"{out.name}_windows", out.dtype, (n, h, wd, data.shape[0]))
    operands = [
        w.get(x, NHWC),
        w.constant(np.ascontiguousarray(data.transpose(0, 2, 3, 1)), weight.name),
        w.constant(offsets.astype(np.float32), f"{node.name}_bias"),
    ]
    options = dict(padding=VALID, stride_h=1, stride_w=1, dilation_h=1, dilation_w=1)
    w.op("CONV_2D", operands, [windows], **options)
    w.op("DEPTH_TO_SPACE", [windows], [w.define(out, NHWC)], block_size=block)


def depth_to_space(w, node):
    """DepthToSpace in DCR order (TFLite's: channel (i b + j) C + c goes to row offset i,
    column offset j, channel c). CRD order has no TFLite spelling without a transpose."""
    x = node.inputs[0]
    _require(len(x.shape) == 4 and node.attrs.get("mode", "DCR") == "DCR")
    operands = [w.get(x, NHWC)]
    w.op(
        "DEPTH_TO_SPACE",
        operands,
        [w.define(node.output, NHWC)],
        block_size=node.attrs["blocksize"],
    )


def _grouped(w, node, xi: int, data: np.ndarray, params, options: dict) -> None:
    """A grouped convolution as SPLIT, one CONV_2D per group, CONCATENATION (onert's CONV_2D
    takes no groups; LiteRT's float one does, its quantized ones do not)."""
    x, out = node.inputs[0], node.output
    group = node.attrs["group"]
    n, h, wd, _ = w.tensors[xi].shape
    per_in, per_out = x.shape[1] // group, out.shape[1] // group
    parts = [
        w.new_tensor(f"{x.name}_g{i}", x.dtype, (n, h, wd, per_in), quant=x.quant)
        for i in range(group)
    ]
    axis = w.constant(np.asarray(3, np.int32), f"{node.name}_axis")
    w.op("SPLIT", [axis, xi], parts, num_splits=group)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    bias_data = np.zeros(out.shape[1], np.float32) if bias is None else bias.numpy().reshape(-1)
    results = []
    for i, part in enumerate(parts):
        cut = slice(i * per_out, (i + 1) * per_out)
        filt = w.constant(data[cut], f"{node.inputs[1].name}_g{i}", _sliced(params, cut))
        b = w.constant(bias_data[cut], f"{node.name}_bias_g{i}", _sliced(bias and bias.quant, cut))
        result = w.new_tensor(
            f"{out.name}_g{i}", out.dtype, (*_stored(out.shape, NHWC)[:3], per_out), quant=out.quant
        )
        w.op("CONV_2D", [part, filt, b], [result], activation=fused_activation(node), **options)
        results.append(result)
    w.op("CONCATENATION", results, [w.define(out, NHWC)], axis=3)


def _sliced(params, cut: slice):
    if params is None or params.axis is None:
        return params
    return QuantParams(params.scale[cut], params.zero_point[cut], params.axis)


def gemm(w, node):
    a, b = node.inputs[:2]
    attrs = node.attrs
    _require(b.is_const and len(a.shape) == 2 and not attrs.get("transA"))
    data = _columns_in_stored_order(w, a, b.numpy() if attrs.get("transB", 0) else b.numpy().T)
    if node.op == "Gemm":
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        weight = data * np.float32(alpha)
        wi = w.constant(weight.astype(np.float32), b.name)
        c = node.inputs[2] if len(node.inputs) > 2 else None
        _require(c is None or (c.is_const and math.prod(c.shape[:-1]) == 1))  # no per-row bias
        bias = np.zeros(weight.shape[0], np.float32)
        if c is not None:  # a [N], [1, N], [1] or [1, 1] row
            row = c.numpy().reshape(c.shape[-1:]).astype(np.float32)
            bias = np.broadcast_to(row * np.float32(beta), bias.shape)
        bi = w.constant(np.ascontiguousarray(bias), f"{node.name}_bias")
    else:
        weight, params = _weights_for(a, b, data, 0)
        if pointwise_gemm(node):
            _pointwise_conv(w, node, weight, params)
            return
        wi = w.constant(weight, b.name, params)
        bi = _bias(w, node, weight.shape[0])
    _finish(w, node, "FULLY_CONNECTED", [w.get(a, None), wi, bi], None)


def _pointwise_conv(w, node, weight: np.ndarray, params: QuantParams) -> None:
    """A uint8 fully connected layer with per-channel weights as a 1x1 CONV_2D on [rows, 1, 1,
    K] (onert's uint8 FULLY_CONNECTED applies the first weight scale to every channel; its
    CONV_2D applies each; docs/circle-tflite.md)."""
    a, out = node.inputs[0], node.output
    rows, depth = a.shape
    channels = weight.shape[0]
    image = w.new_tensor(f"{a.name}_image", a.dtype, (rows, 1, 1, depth), quant=a.quant)
    shape = w.constant(np.asarray([rows, 1, 1, depth], np.int32), f"{node.name}_image_shape")
    w.op("RESHAPE", [w.get(a, None), shape], [image])
    filt = w.constant(weight.reshape(channels, 1, 1, depth), node.inputs[1].name, params)
    result = w.new_tensor(f"{out.name}_image", out.dtype, (rows, 1, 1, channels), quant=out.quant)
    conv_options = dict(padding=VALID, stride_h=1, stride_w=1, dilation_h=1, dilation_w=1)
    activation = _quantized_activation(out, node.attrs)
    inputs = [image, filt, _bias(w, node, channels)]
    w.op("CONV_2D", inputs, [result], activation=activation, **conv_options)
    flat = w.constant(np.asarray(out.shape, np.int32), f"{node.name}_shape")
    w.op("RESHAPE", [result, flat], [w.define(out, None)])


def _columns_in_stored_order(w, a, weight: np.ndarray) -> np.ndarray:
    """Weights [O, K] with their columns in the order input `a` is stored in."""
    order = w.flat_order.get(id(a))
    return weight if order is None else np.ascontiguousarray(weight[:, order])


def matmul(w, node):
    """FULLY_CONNECTED without bias by constant 2-D weights; an input of rank > 2 is reshaped
    to rows and back (onert 0.1.0 drops `keep_num_dims`: its output comes out 2-D, and the next
    operator fails shape inference), which the reader folds back into one MatMul; a vector is
    reshaped to one row and back (FULLY_CONNECTED gives [1, N])."""
    a, b = node.inputs
    if b.is_const and len(b.shape) == 2:
        data = _columns_in_stored_order(w, a, b.numpy().T)
        weight = w.constant(np.ascontiguousarray(data), b.name)
        if len(a.shape) == 2:
            _finish(w, node, "FULLY_CONNECTED", [w.get(a, None), weight, -1], None)
            return
        out, depth = node.output, a.shape[-1]
        rows = (int(np.prod(a.shape[:-1])), depth)
        flat = w.new_tensor(f"{a.name}_rows", a.dtype, rows)
        shape = w.constant(np.asarray(rows, np.int32), f"{node.name}_rows_shape")
        w.op("RESHAPE", [w.get(a, None), shape], [flat])
        product = w.new_tensor(f"{out.name}_rows", out.dtype, (rows[0], out.shape[-1]))
        activation = fused_activation(node)
        w.op("FULLY_CONNECTED", [flat, weight, -1], [product], activation=activation)
        shape = w.constant(np.asarray(out.shape, np.int32), f"{node.name}_shape")
        w.op("RESHAPE", [product, shape], [w.define(out, None)])
        return
    _require(len(a.shape) >= 2 and len(b.shape) >= 2)
    _finish(w, node, "BATCH_MATMUL", [w.get(a, None), w.get(b, None)], None)


# -- elementwise -----------------------------------------------------------------------------------
def global_pool(w, node):
    """MEAN / REDUCE_MAX over the spatial axes of NHWC (read back as the global pool)."""
    x = node.inputs[0]
    _require(len(x.shape) == 4)
    code = "MEAN" if node.op == "GlobalAveragePool" else "REDUCE_MAX"
    axes = w.constant(np.asarray([1, 2], np.int32), f"{node.name}_axes")
    w.op(code, [w.get(x, NHWC), axes], [w.define(node.output, NHWC)], keep_dims=True)


def pool(w, node):
    x, attrs = node.inputs[0], node.attrs
    out = node.output
    _require(len(x.shape) == 4 and set(attrs.get("dilations", [1, 1])) == {1})
    kernel, strides = attrs["kernel_shape"], attrs["strides"]
    maximum = "Max" in node.op
    if maximum:
        fill = float(np.finfo(np.float32).min) if x.dtype == np.float32 else np.iinfo(x.dtype).min
    else:
        fill = None
    exclusive = not maximum and not attrs.get("count_include_pad")
    node_view = _Shim(node, attrs)
    xi, padding, kernel, explicit = _window(
        w, node_view, x, kernel, strides, (1, 1), fill, exclusive, same_ok=maximum or exclusive
    )
    options = dict(
        padding=padding,
        stride_h=strides[0],
        stride_w=strides[1],
        filter_h=kernel[0],
        filter_w=kernel[1],
    )
    code = "MAX_POOL_2D" if maximum else "AVERAGE_POOL_2D"
    pads = list(attrs.get("pads", [0] * 4))
    # ceil_mode windows reaching past the end padding: ONNX leaves that overhang out of the
    # divisor even when it counts the padding, while TFLite averages over the zeros written
    overhang = explicit is not None and any(explicit[2 + i] > pads[2 + i] for i in range(2))
    if not maximum and explicit is not None and ((exclusive and any(explicit)) or overhang):
        _require(x.dtype == np.float32 and "clip" not in attrs)
        pre = w.new_tensor(f"{out.name}_avg", x.dtype, _stored(out.shape, NHWC))
        w.op(code, [xi], [pre], **options)
        counted = [0, 0, 0, 0] if exclusive else pads
        ratio = _count_ratio(x.shape[2:], out.shape[2:], kernel, strides, explicit, counted)
        w.op("MUL", [pre, w.constant(ratio, f"{node.name}_counts")], [w.define(out, NHWC)])
        return
    if node.op == "QAveragePool" and rescaling_mean(node):
        # MEAN rescales to new parameters in one rounding (read back as this QAveragePool)
        axes = w.constant(np.asarray([1, 2], np.int32), f"{node.name}_axes")
        w.op("MEAN", [w.get(x, NHWC), axes], [w.define(out, NHWC)], keep_dims=True)
        return
    if node.op == "QAveragePool" and x.quant != out.quant:
        _window_sums(w, node, xi, padding, kernel, strides)
        return
    _finish(w, node_view, code, [xi], NHWC, **options)


def _window_sums(w, node, xi: int, padding: int, kernel, strides) -> None:
    """A QAveragePool that changes parameters, every window counting its whole kernel (VALID
    on the input or on its explicit padding): a DEPTHWISE_CONV_2D of ones of scale 1 / area,
    which rescales in one rounding (TFLite's AVERAGE_POOL_2D keeps the input's parameters: an
    average rounded there, then requantized, was 2 LSB off). 8-bit only (TFLite's 16-bit
    convolutions take int8 weights)."""
    x = node.inputs[0]
    _require(padding == VALID and x.dtype in (np.uint8, np.int8))
    channels, area = x.shape[1], kernel[0] * kernel[1]
    ones = np.ones((1, *kernel, channels), x.dtype)
    weight = w.constant(ones, f"{node.name}_window", QuantParams((1 / area,), (0,)))
    bias_params = QuantParams((x.quant.scale[0] / area,), (0,))
    bias = w.constant(np.zeros(channels, np.int32), f"{node.name}_bias", bias_params)
    options = dict(
        padding=VALID,
        stride_h=strides[0],
        stride_w=strides[1],
        dilation_h=1,
        dilation_w=1,
        depth_multiplier=1,
    )
    _finish(w, node, "DEPTHWISE_CONV_2D", [xi, weight, bias], NHWC, **options)


def _count_ratio(size, out, kernel, strides, pads, counted) -> np.ndarray:
    """[1, H, W, 1]: window size over the number of cells each window covers in the input
    grown by the `counted` pads (an average that leaves the rest of the padding out, from
    TFLite's average over the zero-padded input)."""
    counts = []
    for i in range(2):
        start = np.arange(out[i]) * strides[i] - pads[i]
        lo, hi = -counted[i], size[i] + counted[2 + i]
        counts.append(np.minimum(start + kernel[i], hi) - np.maximum(start, lo))
    ratio = kernel[0] * kernel[1] / np.outer(counts[0], counts[1])
    return ratio.astype(np.float32).reshape(1, out[0], out[1], 1)


class _Shim:
    """A node seen with other attributes (global pooling as a full-window pool)."""

    def __init__(self, node, attrs):
        self.output, self.outputs, self.attrs, self.name = (
            node.output,
            node.outputs,
            attrs,
            node.name,
        )
