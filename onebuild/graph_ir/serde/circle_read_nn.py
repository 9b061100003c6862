"""TFLite -> IR mappings of the spatial and matrix operators (convolutions, fully connected,
pooling, resizing, normalization), for `circle_read.Reader`. Explicit spatial PADs before them
fold into their pads; a grouped convolution written as SPLIT / CONV_2D per group /
CONCATENATION folds back into one (see `grouped_conv`)."""

import numpy as np

from ..quant.params import quantize_multiplier
from ..tensor import QuantParams
from .circle_read_ops import NHWC, Malformed, _activation_attrs, _emit, _float_only, _options
from .tflite_schema import SAME, VALID


def _same_pads(size, k, s, d) -> list[int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return [total // 2, total - total // 2]


def _pads(r, x_index, kernel, strides, dilations, padding) -> list[int]:
    shape = r.info(x_index).shape  # NHWC
    if padding != SAME:
        return [0, 0, 0, 0]
    h = _same_pads(shape[1], kernel[0], strides[0], dilations[0])
    w = _same_pads(shape[2], kernel[1], strides[1], dilations[1])
    return [h[0], w[0], h[1], w[1]]


def _folded_pad(x, padding: int, accept) -> tuple:
    """(input, spatial pads [t, l, b, r]) with a constant spatial Pad that produced `x` folded
    away when `accept(fill)` and the op pads VALID (a converter's explicit padding, or the
    writer's for pads TensorFlow's SAME cannot express); else (x, zeros)."""
    node = x.producer
    if padding == SAME or node is None or node.op != "Pad":
        return x, [0, 0, 0, 0]
    pads, attrs = node.attrs["pads"], node.attrs
    if attrs.get("mode", "constant") != "constant" or any(pads[i] for i in (0, 1, 4, 5)):
        return x, [0, 0, 0, 0]
    if not accept(float(attrs.get("value", 0.0))):
        return x, [0, 0, 0, 0]
    return node.inputs[0], [pads[2], pads[3], pads[6], pads[7]]


def _add(a: list[int], b: list[int]) -> list[int]:
    return [int(i + j) for i, j in zip(a, b)]


def _symmetric_weights(r, index: int, data: np.ndarray, axis: int | None):
    """Weights centered on their zero points (the IR's integer kernels take symmetric ones)."""
    t = r.info(index)
    q = t.quant
    zero = np.asarray(q.zero_point, np.int64)
    if q.axis is not None:
        shape = [1] * data.ndim
        shape[axis] = -1
        zero = zero.reshape(shape)
    centered = data.astype(np.int64) - zero
    dtype = (
        np.int8 if centered.min(initial=0) >= -128 and centered.max(initial=0) <= 127 else np.int16
    )
    value = r.graph.add_constant(centered.astype(dtype), t.name)
    value.quant = QuantParams(q.scale, (0,) * len(q.scale), axis if q.axis is not None else None)
    return value


def _quantized_matmul_attrs(r, x_index, w_index, out_index, act) -> dict:
    x, w, out = r.info(x_index), r.info(w_index), r.info(out_index)
    s_x, s_y = x.quant.scale[0], out.quant.scale[0]
    multipliers = [quantize_multiplier(s_x * s / s_y) for s in w.quant.scale]
    return {
        "x_zero_point": x.quant.zero_point[0],
        **_activation_attrs(r, out_index, act),
        "multiplier": [m for m, _ in multipliers],
        "shift": [s for _, s in multipliers],
    }


def _bias(r, index: int, channels: int, quantized: bool):
    if index < 0:
        dtype = np.int32 if quantized else np.float32
        return r.graph.add_constant(np.zeros(channels, dtype), "bias")
    return r.value(index)


def _ones_window(r, w_i: int, b_i: int, dilations, o: dict) -> bool:
    """A quantized DEPTHWISE_CONV_2D summing each window once (every weight one step above a
    per-tensor zero point, no bias, no dilation, one output per channel): the writer's form of
    a QAveragePool that changes parameters, read back as it."""
    q, data = r.info(w_i).quant, r.const(w_i)
    bias = None if b_i < 0 else r.const(b_i)
    return (
        q is not None
        and len(q.scale) == 1
        and bool((data.astype(np.int64) - q.zero_point[0] == 1).all())
        and (b_i < 0 or (bias is not None and not bias.any()))
        and list(dilations) == [1, 1]
        and o["depth_multiplier"] == 1
    )


def conv(r, inputs, outputs, options, depthwise=False):
    code = "DEPTHWISE_CONV_2D" if depthwise else "CONV_2D"
    o = _options(code, options)
    x_i, w_i, b_i = [*inputs, -1][:3]
    weights = r.const(w_i)
    if weights is None or weights.ndim != 4:
        raise Malformed("the filter must be a constant 4-D tensor")
    x = r.value(x_i, NHWC)
    strides, dilations = [o["stride_h"], o["stride_w"]], [o["dilation_h"], o["dilation_w"]]
    kernel = weights.shape[1:3]
    pads = _pads(r, x_i, kernel, strides, dilations, o["padding"])
    zero = 0.0 if r.info(x_i).quant is None else float(r.info(x_i).quant.zero_point[0])
    x, extra = _folded_pad(x, o["padding"], lambda fill: fill == zero)
    pads = _add(pads, extra)
    channels = x.shape[1]
    if depthwise:
        data, axis, group = weights.transpose(3, 0, 1, 2), 0, channels
    else:
        data, axis, group = weights.transpose(0, 3, 1, 2), 0, channels // weights.shape[3]
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "group": group}
    quantized = r.info(x_i).quant is not None and r.info(x_i).dtype != np.float32
    if quantized and depthwise and _ones_window(r, w_i, b_i, dilations, o):
        x_q, out_q = r.info(x_i).quant, r.info(outputs[0]).quant
        area = int(kernel[0] * kernel[1])
        attrs = {
            "kernel_shape": [int(k) for k in kernel],
            **attrs,
            "ceil_mode": 0,
            "count_include_pad": int(any(pads)),
            "x_zero_point": x_q.zero_point[0],
            **_activation_attrs(r, outputs[0], o["activation"]),
            "scale_ratio": x_q.scale[0] * r.info(w_i).quant.scale[0] * area / out_q.scale[0],
        }
        del attrs["group"]
        _emit(r, "QAveragePool", [x], attrs, outputs[0], NHWC)
        return
    if quantized:
        w_q = r.info(w_i).quant
        permuted = QuantParams(w_q.scale, w_q.zero_point, 0 if w_q.axis is not None else None)
        r.info(w_i).quant = permuted
        w = _symmetric_weights(r, w_i, np.ascontiguousarray(data), axis)
        attrs.update(_quantized_matmul_attrs(r, x_i, w_i, outputs[0], o["activation"]))
        b = _bias(r, b_i, data.shape[0], True)
        _emit(r, "QConv", [x, w, b], attrs, outputs[0], NHWC)
        return
    w = r.graph.add_constant(np.ascontiguousarray(data), r.info(w_i).name)
    attrs.update(_activation_attrs(r, outputs[0], o["activation"]))
    b = None if b_i < 0 else r.value(b_i)
    _emit(r, "Conv", [x, w, b], attrs, outputs[0], NHWC)


def conv_transpose(r, inputs, outputs, options):
    """TRANSPOSE_CONV (float, VALID, no fused activation) as ConvTranspose."""
    o = _options("TRANSPOSE_CONV", options)
    _, w_i, x_i, b_i = [*inputs, -1][:4]
    _float_only(r, x_i, "TRANSPOSE_CONV")
    weights = r.const(w_i)
    if weights is None or weights.ndim != 4:
        raise Malformed("the filter must be a constant 4-D tensor")
    if o["padding"] != VALID or o["activation"]:
        raise Malformed("only VALID padding without a fused activation is supported")
    x = r.value(x_i, NHWC)
    w = r.graph.add_constant(np.ascontiguousarray(weights.transpose(3, 0, 1, 2)), r.info(w_i).name)
    attrs = {
        "strides": [o["stride_h"], o["stride_w"]],
        "dilations": [1, 1],
        "pads": [0, 0, 0, 0],
        "output_padding": [0, 0],
        "group": 1,
    }
    b = None if b_i < 0 else r.value(b_i)
    _emit(r, "ConvTranspose", [x, w, b], attrs, outputs[0], NHWC)


def fully_connected(r, inputs, outputs, options):
    o = _options("FULLY_CONNECTED", options)
    x_i, w_i, b_i = [*inputs, -1][:3]
    weights = r.const(w_i)
    if weights is None or weights.ndim != 2:
        raise Malformed("the weights must be a constant 2-D tensor")
    order = r.column_order.get(x_i)
    if order is not None:  # the input is stored as the flattened channels-last data
        stored, weights = weights, np.empty_like(weights)
        weights[:, order] = stored
    x = r.value(x_i)
    quantized = r.info(x_i).quant is not None and r.info(x_i).dtype != np.float32
    if b_i < 0 and not quantized:  # the writer's MatMul
        _matmul(r, x, weights, o, outputs[0], w_i)
        return
    if len(x.shape) != 2:
        if o["keep_num_dims"]:
            which = "a quantized input" if quantized else "a bias"
            raise Malformed(
                f"keep_num_dims on an input of rank > 2 is read for float FULLY_CONNECTED "
                f"without bias only; this one has {which}"
            )
        rows = int(np.prod(x.shape)) // weights.shape[1]
        x = r.graph.make_node("Reshape", [x], {"shape": [rows, weights.shape[1]]}).output
    if quantized:
        w = _symmetric_weights(r, w_i, weights, 0)
        attrs = {"transB": 1, **_quantized_matmul_attrs(r, x_i, w_i, outputs[0], o["activation"])}
        _emit(r, "QGemm", [x, w, _bias(r, b_i, weights.shape[0], True)], attrs, outputs[0])
        return
    if order is None:
        w = r.value(w_i)
    else:
        w = r.graph.add_constant(weights, r.info(w_i).name)
        w.quant = r.info(w_i).quant
    attrs = {"transB": 1, **_activation_attrs(r, outputs[0], o["activation"])}
    b = None if b_i < 0 else r.value(b_i)
    _emit(r, "Gemm", [x, w, b], attrs, outputs[0])


def _matmul(r, x, weights: np.ndarray, options: dict, out_index: int, w_index: int):
    """A float FULLY_CONNECTED without bias as the MatMul by the transposed weights [K, N]
    (the same product, summed in the same order as the IR's MatMul: a Gemm by the [N, K]
    weights runs another BLAS path and may differ in the last bit)."""
    depth = weights.shape[1]
    if len(x.shape) != 2 and not options["keep_num_dims"]:
        rows = int(np.prod(x.shape)) // depth
        x = r.graph.make_node("Reshape", [x], {"shape": [rows, depth]}).output
    w = r.graph.add_constant(np.ascontiguousarray(weights.T), r.info(w_index).name)
    attrs = _activation_attrs(r, out_index, options["activation"])
    _emit(r, "MatMul", [x, w], attrs, out_index)


def batch_matmul(r, inputs, outputs, options):
    """BATCH_MATMUL (float) as MatMul; adj_x / adj_y as a Transpose of the last two axes."""
    o = _options("BATCH_MATMUL", options)
    if len(inputs) != 2:
        raise Malformed("BATCH_MATMUL takes two inputs")
    operands = []
    for index, adjoint in zip(inputs, (o["adj_x"], o["adj_y"])):
        _float_only(r, index, "BATCH_MATMUL")
        value = r.value(index)
        if adjoint:
            perm = [*range(len(value.shape) - 2), len(value.shape) - 1, len(value.shape) - 2]
            value = r.graph.make_node("Transpose", [value], {"perm": perm}).output
        operands.append(value)
    _emit(r, "MatMul", operands, {}, outputs[0])


def pool(r, inputs, outputs, options, code):
    o = _options(code, options)
    kernel, strides = [o["filter_h"], o["filter_w"]], [o["stride_h"], o["stride_w"]]
    pads = _pads(r, inputs[0], kernel, strides, [1, 1], o["padding"])
    x = r.value(inputs[0], NHWC)
    t, out = r.info(inputs[0]), r.info(outputs[0])
    floating = t.quant is None or t.dtype == np.float32
    lowest = float(np.finfo(np.float32).min) if floating else float(np.iinfo(t.dtype).min)
    if code == "MAX_POOL_2D":
        x, extra = _folded_pad(x, o["padding"], lambda fill: fill <= lowest)
    else:
        x, extra = _folded_pad(x, o["padding"], lambda fill: fill == 0.0 and floating)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": _add(pads, extra)}
    attrs["dilations"] = [1, 1]
    if any(extra) and code == "AVERAGE_POOL_2D":
        attrs["count_include_pad"] = 1  # the explicit zeros were averaged
    if code == "MAX_POOL_2D":
        attrs.update(_activation_attrs(r, outputs[0], o["activation"]) if t.quant is None else {})
        _emit(r, "MaxPool", [x], attrs, outputs[0], NHWC)
    elif t.quant is not None and t.dtype != np.float32:
        attrs.update(
            {
                "ceil_mode": 0,
                "count_include_pad": 0,
                "x_zero_point": t.quant.zero_point[0],
                **_activation_attrs(r, outputs[0], o["activation"]),
                "scale_ratio": t.quant.scale[0] / out.quant.scale[0],
            }
        )
        _emit(r, "QAveragePool", [x], attrs, outputs[0], NHWC)
    else:
        attrs.update(_activation_attrs(r, outputs[0], o["activation"]))
        _emit(r, "AveragePool", [x], attrs, outputs[0], NHWC)


def resize(r, inputs, outputs, options, code):
    """Float, or on the codes of a quantized tensor whose parameters it keeps."""
    if r.info(inputs[0]).quant != r.info(outputs[0]).quant:
        _float_only(r, inputs[0], code)
    o = _options(code, options)
    out = r.info(outputs[0]).shape
    x = r.value(inputs[0], NHWC)
    sizes = [out[0], out[3], out[1], out[2]]
    mode = (
        "align_corners"
        if o["align_corners"]
        else ("half_pixel" if o["half_pixel_centers"] else "asymmetric")
    )
    attrs = {
        "sizes": sizes,
        "scales": [s / d for s, d in zip(sizes, x.shape)],
        "coordinate_transformation_mode": mode,
    }
    if code == "RESIZE_BILINEAR":
        attrs["mode"] = "linear"
    else:
        if mode != "asymmetric":
            raise Malformed("nearest resizing with aligned or half-pixel centers")
        attrs.update({"mode": "nearest", "nearest_mode": "floor"})
    _emit(r, "Resize", [x], attrs, outputs[0], NHWC)


def lrn(r, inputs, outputs, options):
    o = _options("LOCAL_RESPONSE_NORMALIZATION", options)
    size = 2 * o["radius"] + 1
    attrs = {"size": size, "alpha": o["alpha"] * size, "beta": o["beta"], "bias": o["bias"]}
    _emit(r, "LRN", [r.value(inputs[0], NHWC)], attrs, outputs[0], NHWC)
