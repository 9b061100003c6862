"""Per-operator TFLite -> IR mappings used by `circle_read.Reader` (one function per builtin).

Each takes the reader, the operator's input and output tensor indices (-1: omitted) and its
options table. Quantized operators become the IR's integer ops with the file's parameters (the
requantization multipliers computed from them as the quantizer does).
"""

from collections.abc import Callable

import numpy as np

from ..dtypes import name_of
from ..quant.params import quantize_multiplier
from ..tensor import QuantParams
from .tflite_schema import ACTIVATION_BOUNDS, OPTIONS, SAME

NHWC = (0, 2, 3, 1)


class Malformed(Exception):
    """The operator's inputs or options do not make sense."""


def _options(code: str, table) -> dict:
    """The options table's fields by name (defaults where absent)."""
    _, spec = OPTIONS.get(code, (0, ()))
    fmt = {"byte": "b", "int": "i", "float": "f", "bool": "?"}
    values = {}
    for slot, (name, kind) in enumerate(spec):
        default = 1 if name.startswith("dilation") else 0
        values[name] = default if table is None else table.scalar(slot, fmt[kind], default)
    return values


def _activation_attrs(r, out_index: int, act: int) -> dict:
    """A fused activation: `clip` for float outputs, [qmin, qmax] for quantized ones."""
    if act not in ACTIVATION_BOUNDS:
        raise Malformed(f"fused activation {act} is not supported")
    lo, hi = ACTIVATION_BOUNDS[act]
    t = r.info(out_index)
    if t.quant is None:
        return {} if act == 0 else {"clip": (lo, hi)}
    info = np.iinfo(t.dtype)
    scale, zp = t.quant.scale[0], t.quant.zero_point[0]
    qmin = info.min if not np.isfinite(lo) else max(info.min, zp + round(lo / scale))
    qmax = info.max if not np.isfinite(hi) else min(info.max, zp + round(hi / scale))
    return {"dtype": name_of(t.dtype), "y_zero_point": zp, "qmin": int(qmin), "qmax": int(qmax)}


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


def _emit(r, op, inputs, attrs, out_index, perm=None):
    value = r.graph.make_node(op, inputs, attrs, r.info(out_index).name + "/op").output
    r.define(out_index, value, perm)


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
    channels = x.shape[1]
    if depthwise:
        data, axis, group = weights.transpose(3, 0, 1, 2), 0, channels
    else:
        data, axis, group = weights.transpose(0, 3, 1, 2), 0, channels // weights.shape[3]
    attrs = {"strides": strides, "dilations": dilations, "pads": pads, "group": group}
    quantized = r.info(x_i).quant is not None and r.info(x_i).dtype != np.float32
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


def fully_connected(r, inputs, outputs, options):
    o = _options("FULLY_CONNECTED", options)
    x_i, w_i, b_i = [*inputs, -1][:3]
    weights = r.const(w_i)
    if weights is None or weights.ndim != 2:
        raise Malformed("the weights must be a constant 2-D tensor")
    x = r.value(x_i)
    if len(x.shape) != 2:
        if o["keep_num_dims"]:
            raise Malformed("keep_num_dims on inputs of rank > 2 is not supported")
        rows = int(np.prod(x.shape)) // weights.shape[1]
        x = r.graph.make_node("Reshape", [x], {"shape": [rows, weights.shape[1]]}).output
    quantized = r.info(x_i).quant is not None and r.info(x_i).dtype != np.float32
    if quantized:
        w = _symmetric_weights(r, w_i, weights, 0)
        attrs = {"transB": 1, **_quantized_matmul_attrs(r, x_i, w_i, outputs[0], o["activation"])}
        _emit(r, "QGemm", [x, w, _bias(r, b_i, weights.shape[0], True)], attrs, outputs[0])
        return
    w = r.value(w_i)
    attrs = {"transB": 1, **_activation_attrs(r, outputs[0], o["activation"])}
    b = None if b_i < 0 else r.value(b_i)
    _emit(r, "Gemm", [x, w, b], attrs, outputs[0])


def pool(r, inputs, outputs, options, code):
    o = _options(code, options)
    kernel, strides = [o["filter_h"], o["filter_w"]], [o["stride_h"], o["stride_w"]]
    pads = _pads(r, inputs[0], kernel, strides, [1, 1], o["padding"])
    x = r.value(inputs[0], NHWC)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": [1, 1]}
    t, out = r.info(inputs[0]), r.info(outputs[0])
    whole = list(x.shape[2:]) == kernel and out.shape[1:3] == (1, 1) and not any(pads)
    if whole and o["activation"] == 0 and (t.quant is None or t.dtype == np.float32):
        op = "GlobalMaxPool" if code == "MAX_POOL_2D" else "GlobalAveragePool"
        _emit(r, op, [x], {}, outputs[0], NHWC)  # the same kernel as the IR's global pools
        return
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


def _layout(r, indices, rank):
    """The perm of the first non-constant input when all of them have the output's rank."""
    active = [i for i in indices if r.const(i) is None]
    perm = r.perm_of(active[0]) if active else None
    if perm is not None and all(len(r.info(i).shape) == rank for i in active):
        return perm
    return None


def _operand(r, index, perm, rank):
    data = r.const(index)
    if data is not None and perm is not None and data.ndim < rank:
        data = data.reshape((1,) * (rank - data.ndim) + data.shape)
        value = r.graph.add_constant(
            np.ascontiguousarray(data.transpose(np.argsort(perm))), r.info(index).name
        )
        value.quant = r.info(index).quant
        return value
    return r.value(index, perm)


def binary(r, inputs, outputs, options, code):
    out = r.info(outputs[0])
    rank = len(out.shape)
    perm = _layout(r, inputs, rank)
    a, b = (_operand(r, i, perm, rank) for i in inputs[:2])
    act = _options(code, options).get("activation", 0)
    if out.quant is None or out.dtype == np.float32:
        op = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div"}[code]
        _emit(r, op, [a, b], _activation_attrs(r, outputs[0], act), outputs[0], perm)
        return
    if code == "DIV":
        raise Malformed("quantized DIV is not supported")
    qa, qb, qy = r.info(inputs[0]).quant, r.info(inputs[1]).quant, out.quant
    s_a, s_b, s_y = qa.scale[0], qb.scale[0], qy.scale[0]
    attrs = {
        "a_zero_point": qa.zero_point[0],
        "b_zero_point": qb.zero_point[0],
        **_activation_attrs(r, outputs[0], act),
    }
    if code == "MUL":
        m, s = quantize_multiplier(s_a * s_b / s_y)
        op = "QMul"
    else:
        largest = 2 * max(s_a, s_b)
        attrs["a_rescale"] = list(quantize_multiplier(s_a / largest))
        attrs["b_rescale"] = list(quantize_multiplier(s_b / largest))
        attrs["subtract"] = int(code == "SUB")
        m, s = quantize_multiplier(largest / (2**20 * s_y))
        op = "QAdd"
    attrs.update({"multiplier": m, "shift": s})
    _emit(r, op, [a, b], attrs, outputs[0], perm)


UNARY = {
    "RELU": "Relu",
    "LOGISTIC": "Sigmoid",
    "TANH": "Tanh",
    "HARD_SWISH": "HardSwish",
    "LEAKY_RELU": "LeakyRelu",
    "EXP": "Exp",
    "SQRT": "Sqrt",
}


def unary(r, inputs, outputs, options, code):
    _float_only(r, inputs[0], code)
    perm = r.perm_of(inputs[0])
    attrs = {"alpha": _options(code, options)["alpha"]} if code == "LEAKY_RELU" else {}
    _emit(r, UNARY[code], [r.value(inputs[0], perm)], attrs, outputs[0], perm)


def clamp(r, inputs, outputs, options, code):
    _float_only(r, inputs[0], code)
    lo, hi = {"RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}[code]
    perm = r.perm_of(inputs[0])
    bounds = [
        r.graph.add_constant(np.float32(b), f"{code.lower()}_{k}")
        for b, k in ((lo, "min"), (hi, "max"))
    ]
    _emit(r, "Clip", [r.value(inputs[0], perm), *bounds], {}, outputs[0], perm)


def _float_only(r, index, code):
    t = r.info(index)
    if t.quant is not None and t.dtype != np.float32:
        raise Malformed(f"quantized {code} is not supported")


def softmax(r, inputs, outputs, options):
    _float_only(r, inputs[0], "SOFTMAX")
    if _options("SOFTMAX", options)["beta"] != 1.0:
        raise Malformed("beta other than 1 is not supported")
    perm = r.perm_of(inputs[0])
    rank = len(r.info(inputs[0]).shape)
    axis = rank - 1 if perm is None else perm[rank - 1]
    _emit(r, "Softmax", [r.value(inputs[0], perm)], {"axis": axis}, outputs[0], perm)


def concatenation(r, inputs, outputs, options):
    o = _options("CONCATENATION", options)
    out = r.info(outputs[0])
    rank = len(out.shape)
    perm = _layout(r, inputs, rank)
    axis = o["axis"] % rank
    ir_axis = axis if perm is None else perm[axis]
    values = [_operand(r, i, perm, rank) for i in inputs]
    if out.quant is None or out.dtype == np.float32:
        attrs = {"axis": ir_axis, **_activation_attrs(r, outputs[0], o["activation"])}
        _emit(r, "Concat", values, attrs, outputs[0], perm)
        return
    params = [r.info(i).quant for i in inputs]
    multipliers = [quantize_multiplier(p.scale[0] / out.quant.scale[0]) for p in params]
    attrs = {
        "axis": ir_axis,
        "x_zero_points": [p.zero_point[0] for p in params],
        **_activation_attrs(r, outputs[0], o["activation"]),
        "multiplier": [m for m, _ in multipliers],
        "shift": [s for _, s in multipliers],
    }
    _emit(r, "QConcat", values, attrs, outputs[0], perm)


def reshape(r, inputs, outputs, options):
    shape = list(r.info(outputs[0]).shape)
    _emit(r, "Reshape", [r.value(inputs[0])], {"shape": shape}, outputs[0])


def transpose(r, inputs, outputs, options):
    """No IR node: the output is the input's value seen through one more permutation (a
    reader needing another layout transposes once; an inverse pair cancels)."""
    order = r.const(inputs[1])
    t = r.info(inputs[0])
    rank = len(t.shape)
    if order is None or sorted(int(p) for p in np.ravel(order)) != list(range(rank)):
        raise Malformed("the permutation must be a constant permutation of the axes")
    known = r.perm_of(inputs[0])
    value = r.value(inputs[0], known)
    have = tuple(range(rank)) if known is None else known
    composed = tuple(have[int(p)] for p in np.ravel(order))
    perm = None if composed == tuple(range(rank)) else composed
    r.alias(outputs[0], value, perm)


def reduce(r, inputs, outputs, options, code):
    _float_only(r, inputs[0], code)
    axes = r.const(inputs[1])
    if axes is None:
        raise Malformed("the axes must be constant")
    keep = bool(_options(code, options)["keep_dims"])
    rank = len(r.info(inputs[0]).shape)
    perm = r.perm_of(inputs[0]) if keep else None
    axes = sorted({int(a) % rank for a in np.ravel(axes)})
    ir_axes = sorted(axes if perm is None else [perm[a] for a in axes])
    op = "ReduceMean" if code == "MEAN" else "ReduceMax"
    _emit(
        r,
        op,
        [r.value(inputs[0], perm)],
        {"axes": ir_axes, "keepdims": int(keep)},
        outputs[0],
        perm,
    )


def pad(r, inputs, outputs, options, code):
    paddings = r.const(inputs[1])
    if paddings is None:
        raise Malformed("the paddings must be constant")
    t = r.info(inputs[0])
    rank = len(t.shape)
    perm = r.perm_of(inputs[0])
    order = range(rank) if perm is None else np.argsort(perm)
    pairs = [paddings[int(i)] for i in order]
    attrs = {"pads": [int(p[0]) for p in pairs] + [int(p[1]) for p in pairs], "mode": "constant"}
    if code == "MIRROR_PAD":
        if _options(code, options)["mode"] != 0:
            raise Malformed("SYMMETRIC mirror padding is not supported")
        attrs["mode"] = "reflect"
    elif code == "PADV2" and len(inputs) > 2:
        attrs["value"] = float(np.ravel(r.const(inputs[2]))[0])
    elif t.quant is not None and t.dtype != np.float32:
        attrs["value"] = t.quant.zero_point[0]
    _emit(r, "Pad", [r.value(inputs[0], perm)], attrs, outputs[0], perm)


def resize(r, inputs, outputs, options, code):
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


def quantize_op(r, inputs, outputs, options, code):
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if code == "DEQUANTIZE" and t.dtype == np.float16:  # float16 weights of a float model
        if t.data is None or out.dtype != np.float32 or out.shape != t.shape:
            raise Malformed("only constant float16 tensors dequantize to float32")
        out.data = t.data.astype(np.float32)
        return
    if t.quant is None and (code == "DEQUANTIZE" or out.quant is None):
        raise Malformed("the quantized side has no quantization parameters")
    perm = r.perm_of(inputs[0])
    x = r.value(inputs[0], perm)
    if code == "DEQUANTIZE":
        q = t.quant
        attrs = {"scale": list(q.scale), "zero_point": list(q.zero_point), "axis": q.axis}
        _emit(r, "DequantizeLinear", [x], attrs, outputs[0], perm)
    elif t.quant is None or t.dtype == np.float32:
        q = out.quant
        attrs = {
            "scale": list(q.scale),
            "zero_point": list(q.zero_point),
            "axis": None,
            "dtype": name_of(out.dtype),
        }
        _emit(r, "QuantizeLinear", [x], attrs, outputs[0], perm)
    else:
        m, s = quantize_multiplier(t.quant.scale[0] / out.quant.scale[0])
        info = np.iinfo(out.dtype)
        attrs = {
            "x_zero_point": t.quant.zero_point[0],
            "y_zero_point": out.quant.zero_point[0],
            "multiplier": m,
            "shift": s,
            "qmin": int(info.min),
            "qmax": int(info.max),
            "dtype": name_of(out.dtype),
        }
        _emit(r, "Requantize", [x], attrs, outputs[0], perm)


def _with(fn, **kw) -> Callable:
    return lambda r, i, o, opts: fn(r, i, o, opts, **kw)


READERS: dict[str, Callable] = {
    "CONV_2D": conv,
    "DEPTHWISE_CONV_2D": _with(conv, depthwise=True),
    "FULLY_CONNECTED": fully_connected,
    "MAX_POOL_2D": _with(pool, code="MAX_POOL_2D"),
    "AVERAGE_POOL_2D": _with(pool, code="AVERAGE_POOL_2D"),
    **{c: _with(binary, code=c) for c in ("ADD", "SUB", "MUL", "DIV")},
    **{c: _with(unary, code=c) for c in UNARY},
    "RELU6": _with(clamp, code="RELU6"),
    "RELU_N1_TO_1": _with(clamp, code="RELU_N1_TO_1"),
    "SOFTMAX": softmax,
    "CONCATENATION": concatenation,
    "RESHAPE": reshape,
    "TRANSPOSE": transpose,
    "MEAN": _with(reduce, code="MEAN"),
    "REDUCE_MAX": _with(reduce, code="REDUCE_MAX"),
    **{c: _with(pad, code=c) for c in ("PAD", "PADV2", "MIRROR_PAD")},
    "RESIZE_BILINEAR": _with(resize, code="RESIZE_BILINEAR"),
    "RESIZE_NEAREST_NEIGHBOR": _with(resize, code="RESIZE_NEAREST_NEIGHBOR"),
    "LOCAL_RESPONSE_NORMALIZATION": lrn,
    "QUANTIZE": _with(quantize_op, code="QUANTIZE"),
    "DEQUANTIZE": _with(quantize_op, code="DEQUANTIZE"),
}
