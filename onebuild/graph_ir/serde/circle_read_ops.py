"""TFLite -> IR mappings of the elementwise, reduction and (de)quantize operators, for
`circle_read.Reader` (one function per builtin; convolutions, pools and the other spatial and
matrix operators are in `circle_read_nn`, data movement in `circle_read_shape`).

Each takes the reader, the operator's input and output tensor indices (-1: omitted) and its
options table. Quantized operators become the IR's integer ops with the file's parameters (the
requantization multipliers computed from them as the quantizer does).
"""

import numpy as np

from ..dtypes import name_of
from ..ops import OPS
from ..ops.quantized_softmax import exp_table
from ..ops.tflite_rounding import requantize_gemmlowp
from ..quant.kernel_attrs import average_pool_attrs, binary_attrs, output_attrs, softmax_attrs
from ..quant.params import dequantize, quantize, quantize_multiplier
from . import circle_read_fuse as fuse
from .tflite_schema import ACTIVATION_BOUNDS, OPTIONS

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


def _emit(r, op, inputs, attrs, out_index, perm=None):
    value = r.graph.make_node(op, inputs, attrs, r.info(out_index).name + "/op").output
    r.define(out_index, value, perm)


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
    fused = None
    if code == "MUL" and not act:
        fused = fuse.exclusive_average(r.graph, a, b) or fuse.local_response_norm(r.graph, a, b)
    if code == "ADD" and not act and out.dtype == np.float32:
        fused = fuse.prelu(r.graph, a, b)
    if fused is not None:
        r.define(outputs[0], fused, perm)
        return
    if out.quant is None or out.dtype == np.float32:
        op = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div", "POW": "Pow"}[code]
        attrs = _activation_attrs(r, outputs[0], act)
        node = r.graph.make_node(op, [a, b], attrs, out.name + "/op")
        value = node.output
        if code == "MUL" and not act:
            value = fuse.activation(r.graph, node) or value
        if value is node.output and not act:
            value = fuse.layer_norm(r.graph, node) or value
        r.define(outputs[0], value, perm)
        return
    if code in ("DIV", "POW"):
        raise Malformed(f"quantized {code} is not supported")
    qa, qb, qy = r.info(inputs[0]).quant, r.info(inputs[1]).quant, out.quant
    op, attrs = binary_attrs(code.capitalize(), qa, qb, qy, name_of(out.dtype))
    attrs.update(_activation_attrs(r, outputs[0], act))  # TFLite rounds the bounds
    _emit(r, op, [a, b], attrs, outputs[0], perm)


def prelu(r, inputs, outputs, options):
    """PRELU: x where x >= 0, else alpha * x (alpha broadcast as a binary operand); a quantized
    one in float between DequantizeLinear and QuantizeLinear (`_in_float`: the IR has no
    integer PRelu yet), its constant alpha dequantized."""
    rank = len(r.info(outputs[0]).shape)
    perm = _layout(r, inputs, rank)
    t = r.info(inputs[0])
    if t.quant is None or t.dtype == np.float32:
        x, slope = (_operand(r, i, perm, rank) for i in inputs[:2])
        _emit(r, "PRelu", [x, slope], {}, outputs[0], perm)
        return
    alpha = r.info(inputs[1])
    if alpha.data is None:
        raise Malformed("a quantized PRELU needs a constant alpha")
    real = alpha.data if alpha.quant is None else dequantize(alpha.data, alpha.quant)
    if perm is not None and real.ndim < rank:
        real = real.reshape((1,) * (rank - real.ndim) + real.shape)
    if perm is not None:
        real = real.transpose(np.argsort(perm))
    slope = r.graph.add_constant(np.ascontiguousarray(real, np.float32), alpha.name)
    _in_float(r, "PRelu", {}, [r.value(inputs[0], perm), slope], outputs[0], perm)


def _in_float(r, op: str, attrs: dict, inputs: list, target: int, perm) -> None:
    """Float `op` of quantized input 0 between DequantizeLinear and QuantizeLinear to tensor
    `target`'s parameters: how the IR holds an operator it has no integer kernel for."""
    x, out = inputs[0], r.info(target)
    if x.quant is None or out.quant is None or out.dtype == np.float32:
        raise Malformed("a quantized input needs a quantized output")
    if out.quant.axis is not None:
        raise Malformed("the output must be quantized per tensor")
    q = x.quant
    attrs_in = {"scale": list(q.scale), "zero_point": list(q.zero_point), "axis": q.axis}
    name = out.name + "/op"
    real = r.graph.make_node("DequantizeLinear", [x], attrs_in, f"{name}_dequantize").output
    y = r.graph.make_node(op, [real, *inputs[1:]], attrs, name).output
    attrs_out = {
        "scale": list(out.quant.scale),
        "zero_point": list(out.quant.zero_point),
        "axis": None,
        "dtype": name_of(out.dtype),
    }
    value = r.graph.make_node("QuantizeLinear", [y], attrs_out, f"{name}_quantize").output
    r.define(target, value, perm)


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
    perm = r.perm_of(inputs[0])
    attrs = {"alpha": _options(code, options)["alpha"]} if code == "LEAKY_RELU" else {}
    x = r.value(inputs[0], perm)
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if t.quant is None or t.dtype == np.float32:
        _emit(r, UNARY[code], [x], attrs, outputs[0], perm)
        return
    if out.quant is None or out.dtype != t.dtype:
        raise Malformed("a quantized input needs a quantized output of its type")
    value = _lookup(r, x, (UNARY[code], attrs), out.quant, out.dtype)
    r.define(outputs[0], value, perm)


def _lookup(r, x, function, params, dtype):
    """A QLookup: the table of `function` over every input code, quantized with `params` (as
    the quantizer builds it)."""
    op, attrs = function
    info = np.iinfo(x.dtype)
    real = dequantize(np.arange(info.min, info.max + 1).astype(x.dtype), x.quant)
    (y,) = OPS[op].kernel(attrs, real)
    y = np.nan_to_num(np.asarray(y, np.float64), posinf=np.finfo(np.float32).max)
    table = r.graph.add_constant(quantize(y, params, dtype.name), f"{op.lower()}_table")
    value = r.graph.make_node("QLookup", [x, table], {"function": op}, f"{op.lower()}").output
    value.quant = params
    r.functions[id(value)] = (x, function)
    return value


CLAMPS = {"RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}


def clamp(r, inputs, outputs, options, code):
    """RELU6, RELU_N1_TO_1: a Clip; quantized, TFLite's ReluX as a QLookup: each input code
    requantized to the output's parameters (gemmlowp's roundings) and clamped to the bounds'
    codes (float32 division, C's round). (A quantized RELU keeps the function's table, which
    onebuild's writer spells so.)"""
    lo, hi = CLAMPS[code]
    perm = r.perm_of(inputs[0])
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if t.quant is not None and t.dtype != np.float32:
        if out.quant is None or out.dtype != t.dtype or len(t.quant.scale) != 1:
            raise Malformed("a quantized input needs a quantized output of its type")
        info = np.iinfo(t.dtype)
        codes = np.arange(info.min, info.max + 1, dtype=np.int64) - t.quant.zero_point[0]
        scale, zp = out.quant.scale[0], out.quant.zero_point[0]
        y = zp + requantize_gemmlowp(codes, *quantize_multiplier(t.quant.scale[0] / scale))
        qmin, qmax = (zp + _c_round(np.float32(b) / np.float32(scale)) for b in (lo, hi))
        table = np.clip(y, max(qmin, info.min), min(qmax, info.max)).astype(t.dtype)
        constant = r.graph.add_constant(table, f"{code.lower()}_table")
        x = r.value(inputs[0], perm)
        _emit(r, "QLookup", [x, constant], {}, outputs[0], perm)
        return
    bounds = [
        r.graph.add_constant(np.float32(b), f"{code.lower()}_{k}")
        for b, k in ((lo, "min"), (hi, "max"))
    ]
    _emit(r, "Clip", [r.value(inputs[0], perm), *bounds], {}, outputs[0], perm)


def _c_round(x: np.float32) -> float:
    """C's round: half away from zero (inf stays inf)."""
    return float(np.copysign(np.floor(np.abs(x) + 0.5), x))


def gelu(r, inputs, outputs, options):
    """Gelu; a quantized GELU (TFLite's kernel is a table of the function) as its QLookup."""
    perm = r.perm_of(inputs[0])
    attrs = {"approximate": "tanh" if _options("GELU", options)["approximate"] else "none"}
    x = r.value(inputs[0], perm)
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if t.quant is None or t.dtype == np.float32:
        _emit(r, "Gelu", [x], attrs, outputs[0], perm)
        return
    if out.quant is None or out.dtype != t.dtype:
        raise Malformed("a quantized input needs a quantized output of its type")
    r.define(outputs[0], _lookup(r, x, ("Gelu", attrs), out.quant, out.dtype), perm)


def _float_only(r, index, code):
    t = r.info(index)
    if t.quant is not None and t.dtype != np.float32:
        raise Malformed(f"quantized {code} is not supported")


def softmax(r, inputs, outputs, options):
    """SOFTMAX over the last axis; quantized (the converter's int8 one: output scale 1/256,
    zero point -128), the IR's QSoftmax with its exponential table at beta times the input
    scale."""
    beta = _options("SOFTMAX", options)["beta"]
    perm = r.perm_of(inputs[0])
    t, out = r.info(inputs[0]), r.info(outputs[0])
    rank = len(t.shape)
    axis = rank - 1 if perm is None else perm[rank - 1]
    x = r.value(inputs[0], perm)
    if t.quant is None or t.dtype == np.float32:
        if beta != 1.0:
            raise Malformed("beta other than 1 is not supported")
        _emit(r, "Softmax", [x], {"axis": axis}, outputs[0], perm)
        return
    if out.quant is None or out.dtype != t.dtype or len(t.quant.scale) != 1 or beta <= 0:
        raise Malformed("a quantized SOFTMAX gives codes of its input's type (beta > 0)")
    table = r.graph.add_constant(exp_table(beta * t.quant.scale[0]), f"{out.name}_exp")
    attrs = softmax_attrs(axis, out.quant, name_of(out.dtype))
    _emit(r, "QSoftmax", [x, table], attrs, outputs[0], perm)


def reduce(r, inputs, outputs, options, code):
    axes = r.const(inputs[1])
    if axes is None:
        raise Malformed("the axes must be constant")
    keep = bool(_options(code, options)["keep_dims"])
    t = r.info(inputs[0])
    rank = len(t.shape)
    perm = r.perm_of(inputs[0]) if keep else None
    axes = sorted({int(a) % rank for a in np.ravel(axes)})
    spatial = keep and rank == 4 and perm == NHWC and axes == [1, 2]
    quantized = t.quant is not None and t.dtype != np.float32
    if spatial and code == "MEAN" and quantized:
        _quantized_mean(r, inputs[0], outputs[0])
        return
    ir_axes = sorted(axes if perm is None else [perm[a] for a in axes])
    op = "ReduceMean" if code == "MEAN" else "ReduceMax"
    if quantized:  # the max is exact so; the mean within a step of TFLite's integer one
        attrs = {"axes": ir_axes, "keepdims": int(keep)}
        _in_float(r, op, attrs, [r.value(inputs[0], perm)], outputs[0], perm)
        return
    if spatial:
        # the spatial mean of an NHWC tensor: the IR's global pool (float64 sums, as the
        # writer's source op)
        op = "GlobalAveragePool" if code == "MEAN" else "GlobalMaxPool"
        _emit(r, op, [r.value(inputs[0], perm)], {}, outputs[0], perm)
        return
    _emit(
        r,
        op,
        [r.value(inputs[0], perm)],
        {"axes": ir_axes, "keepdims": int(keep)},
        outputs[0],
        perm,
    )


def _quantized_mean(r, source: int, target: int) -> None:
    """MEAN of integer codes over H and W of NHWC: the QAveragePool over the whole window
    that the writer spells this way when the output parameters differ (TFLite's MEAN rescales
    in one rounding; AVERAGE_POOL_2D keeps the input's parameters)."""
    t, out = r.info(source), r.info(target)
    if out.quant is None or out.dtype != t.dtype or len(t.quant.scale) != 1:
        raise Malformed("a quantized MEAN gives codes of its input's type, one scale each")
    attrs = average_pool_attrs(
        "GlobalAveragePool", {}, t.shape[1:3], t.quant, out.quant, name_of(t.dtype)
    )
    _emit(r, "QAveragePool", [r.value(source, NHWC)], attrs, target, NHWC)


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
    elif (folded := _island(r, x, out) or _requantized_pool(r, x, out)) is not None:
        r.define(outputs[0], folded, perm)
    elif t.quant is None or t.dtype == np.float32:
        q = out.quant
        attrs = {
            "scale": list(q.scale),
            "zero_point": list(q.zero_point),
            "axis": None,
            "dtype": name_of(out.dtype),
        }
        _emit(r, "QuantizeLinear", [x], attrs, outputs[0], perm)
    elif id(x) in r.functions and not x.uses and out.dtype == t.dtype:
        # a function's table at the parameters TFLite's kernel fixes, requantized: one table
        source, function = r.functions[id(x)]
        r.define(outputs[0], _lookup(r, source, function, out.quant, out.dtype), perm)
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


def densify(r, inputs, outputs, options):
    """DENSIFY of a sparse constant (read dense, `tflite_sparse`): the same data."""
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if t.data is None or out.shape != t.shape or out.dtype != t.dtype:
        raise Malformed("only a constant densifies, to its own shape and type")
    out.data = t.data


def _island(r, x, out):
    """QUANTIZE(f(DEQUANTIZE(q))) for a function f with a lookup rule (`OPS[f].quant`), or
    Softmax, as the integer op the quantizer makes for it with these parameters: a QLookup
    (exact: the table is f quantized), a QSoftmax (its integer algorithm; as the ONNX QDQ
    importer reads DequantizeLinear -> Softmax -> QuantizeLinear)."""
    node = x.producer
    if node is None or len(node.inputs) != 1 or out.quant is None:
        return None
    dequantize_node = node.inputs[0].producer
    if dequantize_node is None or dequantize_node.op != "DequantizeLinear":
        return None
    source = dequantize_node.inputs[0]
    if source.quant is None or source.quant.axis is not None or source.dtype != out.dtype:
        return None
    if node.op == "Softmax":
        table = r.graph.add_constant(exp_table(source.quant.scale[0]), f"{node.name}_exp")
        attrs = softmax_attrs(node.attrs["axis"], out.quant, name_of(out.dtype))
        value = r.graph.make_node("QSoftmax", [source, table], attrs, node.name).output
        value.quant = out.quant
        return value
    if OPS[node.op].quant != "lookup":
        return None
    return _lookup(r, source, (node.op, node.attrs), out.quant, out.dtype)


def _requantized_pool(r, x, out):
    """An average pool (without a fused activation) requantized by QUANTIZE (tflite) or
    DEQUANTIZE, QUANTIZE (circle), as one QAveragePool to the new parameters: the form the
    writer gives a QAveragePool that changes parameters (one rounding, where TFLite's two can
    differ by one step)."""
    if x.producer is not None and x.producer.op == "DequantizeLinear":
        x = x.producer.inputs[0]
    pool = x.producer
    if pool is None or pool.op != "QAveragePool" or out.quant is None or out.dtype != x.dtype:
        return None
    info = np.iinfo(x.dtype)
    if (pool.attrs["qmin"], pool.attrs["qmax"]) != (info.min, info.max):
        return None
    source = pool.inputs[0]
    attrs = {
        **pool.attrs,
        **output_attrs(name_of(out.dtype), out.quant),
        "scale_ratio": source.quant.scale[0] / out.quant.scale[0],
    }
    value = r.graph.make_node("QAveragePool", [source], attrs, pool.name).output
    value.quant = out.quant
    return value
