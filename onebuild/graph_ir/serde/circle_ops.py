"""IR -> TFLite mappings of the elementwise and data-movement ops, for `circle_write.Writer`
(one function per IR op; the spatial and matrix ones are in `circle_ops_nn`).

A mapping raises `Unsupported` when the node has no exact TFLite form; the writer collects every
such node and reports them all at once.
"""

import numpy as np

from ..ops import OPS
from ..ops.quantized_softmax import exp_table
from ..quant.kernel_attrs import softmax_attrs
from ..quant.params import dequantize, qdq_params, quantize
from ..tensor import QuantParams
from .circle_names import circle_code, written_as
from .tflite_schema import ACT_NONE, ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1, channels_last_columns

NHWC = (0, 2, 3, 1)
FLOAT_ACTIVATIONS = {(0.0, np.inf): ACT_RELU, (0.0, 6.0): ACT_RELU6, (-1.0, 1.0): ACT_RELU_N1_TO_1}


def _stored(shape, perm):
    """A shape as written in layout `perm`."""
    return tuple(shape) if perm is None else tuple(shape[p] for p in perm)


class Unsupported(Exception):
    """The node has no exact TFLite form."""


# -- helpers -------------------------------------------------------------------------------------
def _require(condition: bool) -> None:
    if not condition:
        raise Unsupported


def fused_activation(node) -> int:
    """The TFLite fused activation of a node's `clip` (float) or [qmin, qmax] (quantized);
    `Unsupported` for a float clip no fused activation expresses."""
    attrs = node.attrs
    if "qmin" in attrs:
        return _quantized_activation(node.output, attrs)
    lo, hi = attrs.get("clip", (-np.inf, np.inf))
    if (lo, hi) == (-np.inf, np.inf):
        return ACT_NONE
    act = FLOAT_ACTIVATIONS.get((float(lo), float(hi)))
    _require(act is not None)
    return act


def _finish(w, node, code: str, inputs: list[int], perm, **options) -> None:
    """Emit `code` writing the node's output in `perm`, with its fused activation (or, for a
    float clip without one, MAXIMUM/MINIMUM after it)."""
    out = node.output
    try:
        activation = fused_activation(node)
    except Unsupported:
        lo, hi = node.attrs["clip"]
        pre = w.new_tensor(f"{out.name}_preact", out.dtype, _stored(out.shape, perm))
        w.op(code, inputs, [pre], **options)
        _clamp(w, pre, out, perm, lo, hi)
        return
    w.op(code, inputs, [w.define(out, perm)], activation=activation, **options)


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
    code = BINARY.get(node.op) or written_as(node)
    perm = _common_layout(w, node, node.inputs)
    rank = len(node.output.shape)
    inputs = [_operand(w, v, perm, rank) for v in node.inputs]
    _finish(w, node, code, inputs, perm)


def prelu(w, node):
    """Float PRelu as PRELU, the slope broadcast like a binary operand; in circle as
    relu(x) + slope * (x - relu(x)) (the same bits: one term is 0; onert 0.1.0 has no PReLU
    kernel), which the reader folds back."""
    x, out = node.inputs[0], node.output
    _require(x.dtype == np.float32)
    perm = _common_layout(w, node, node.inputs)
    rank = len(out.shape)
    xi, slope = (_operand(w, v, perm, rank) for v in node.inputs)
    if w.fmt != "circle":
        w.op("PRELU", [xi, slope], [w.define(out, perm)])
        return
    shape = _stored(x.shape, perm)
    relu, negative, scaled = (
        w.new_tensor(f"{out.name}_{part}", out.dtype, shape)
        for part in ("relu", "negative", "scaled")
    )
    w.op("RELU", [xi], [relu])
    w.op("SUB", [xi, relu], [negative], activation=ACT_NONE)
    w.op("MUL", [negative, slope], [scaled], activation=ACT_NONE)
    w.op("ADD", [relu, scaled], [w.define(out, perm)], activation=ACT_NONE)


UNARY = {
    "Relu": "RELU",
    "Sigmoid": "LOGISTIC",
    "Tanh": "TANH",
    "HardSwish": "HARD_SWISH",
    "LeakyRelu": "LEAKY_RELU",
    "Exp": "EXP",
    "Sqrt": "SQRT",
}


def function(w, op: str, attrs: dict, source: int, target: int, shape, dtype) -> None:
    """The float TFLite form of the unary function `op` from tensor `source` to `target`:
    its builtin; Swish as LOGISTIC * x; in circle, HardSwish as x * RELU6(x + 3) * 1/6 (onert
    0.1.0 has no HARD_SWISH kernel; the reader folds the spelling back)."""
    if op == "Swish":
        _require(attrs.get("alpha", 1.0) == 1.0)
        gate = w.new_tensor(f"{w.tensors[target].name}_gate", dtype, shape)
        w.op("LOGISTIC", [source], [gate])
        w.op("MUL", [source, gate], [target], activation=ACT_NONE)
    elif op == "Gelu":
        approximate = attrs.get("approximate", "none") == "tanh"
        w.op("GELU", [source], [target], approximate=approximate)
    elif op == "HardSwish" and w.fmt == "circle":
        name = w.tensors[target].name
        gate = w.new_tensor(f"{name}_relu6", dtype, shape)
        three = w.constant(np.asarray([3.0], dtype), f"{name}_three")
        w.op("ADD", [source, three], [gate], activation=ACT_RELU6)
        product = w.new_tensor(f"{name}_product", dtype, shape)
        w.op("MUL", [source, gate], [product], activation=ACT_NONE)
        sixth = w.constant(np.asarray([1 / 6], dtype), f"{name}_sixth")
        w.op("MUL", [product, sixth], [target], activation=ACT_NONE)
    else:
        _require(op in UNARY)
        options = {"alpha": attrs.get("alpha", 0.01)} if op == "LeakyRelu" else {}
        w.op(UNARY[op], [source], [target], **options)


def unary(w, node):
    """Relu, Sigmoid, ..., HardSwish, Swish, Gelu (float) by `function`."""
    x = node.inputs[0]
    _require(x.dtype == np.float32 or node.op in UNARY)
    perm = w.home_of(x)
    source = w.get(x, perm)
    target = w.define(node.output, perm)
    function(w, node.op, node.attrs, source, target, _stored(x.shape, perm), x.dtype)


def clip(w, node):
    """The operator `circle_code` chooses: RELU, RELU6, RELU_N1_TO_1, or a clamp by MAXIMUM /
    MINIMUM with the constant bounds."""
    code = circle_code(node)
    _require(code is not None)  # computed bounds, or none
    x = node.inputs[0]
    perm = w.home_of(x)
    if code in ("MAXIMUM", "MINIMUM"):
        bounds = [
            v.numpy().item() if v is not None else inf
            for v, inf in zip((*node.inputs[1:], None, None)[:2], (-np.inf, np.inf))
        ]
        _clamp(w, w.get(x, perm), node.output, perm, *bounds)
    else:
        w.op(code, [w.get(x, perm)], [w.define(node.output, perm)])


LOOKUP_FUNCTIONS = (  # (IR op, attributes) a quantized lookup table may stand for
    ("Relu", {}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("HardSwish", {}),
    ("Swish", {"alpha": 1.0}),
    ("Gelu", {"approximate": "none"}),
    ("Gelu", {"approximate": "tanh"}),
)
NATIVE_LOOKUPS = ("Relu", "Sigmoid", "Tanh", "HardSwish", "Gelu")  # TFLite's quantized kernels


def named_function(node) -> tuple[str, dict] | None:
    """The (op, attributes) of LOOKUP_FUNCTIONS whose table, quantized like the quantizer does
    it, is exactly the QLookup's (None when none is)."""
    x, table = node.inputs
    out = node.output
    if x.quant is None or out.quant is None or x.quant.axis is not None:
        return None
    info = np.iinfo(x.dtype)
    real = dequantize(np.arange(info.min, info.max + 1).astype(x.dtype), x.quant)
    for op, attrs in LOOKUP_FUNCTIONS:
        (y,) = OPS[op].kernel(attrs, real)
        if np.array_equal(quantize(np.asarray(y, np.float64), out.quant, out.dtype), table.numpy()):
            return op, attrs
    return None


def lookup(w, node):
    """A QLookup as the function whose table, quantized like the quantizer does it, is exactly
    the node's: in tflite its quantized operator where TFLite has one (RELU, LOGISTIC, TANH,
    HARD_SWISH, GELU); in circle (and for Swish) DEQUANTIZE, the function in float, QUANTIZE,
    which the reader folds back into the table (onert 0.1.0 has no quantized RELU, HARD_SWISH
    or GELU: one form for every table)."""
    x, out = node.inputs[0], node.output
    found = named_function(node)
    _require(found is not None)
    op, attrs = found
    perm = w.home_of(x)
    source = w.get(x, perm)
    if w.fmt == "circle" or op not in NATIVE_LOOKUPS:
        _float_island(w, source, w.define(out, perm), _stored(x.shape, perm), op, attrs)
        return
    shape = _stored(out.shape, perm)
    fixed = FIXED_OUTPUT.get((UNARY.get(op), out.dtype.name))
    if fixed is None or fixed == out.quant:
        function(w, op, attrs, source, w.define(out, perm), shape, out.dtype)
        return
    # TFLite's kernel writes these parameters only; requantize to the node's after
    pre = w.new_tensor(f"{out.name}_fixed", out.dtype, shape, quant=fixed)
    function(w, op, attrs, source, pre, shape, out.dtype)
    w.requantize(pre, w.define(out, perm))


def _float_island(w, source: int, target: int, shape, op: str, attrs: dict) -> None:
    """DEQUANTIZE, `op` in float (`function`, or "Softmax" over the last axis), QUANTIZE."""
    name = w.tensors[target].name
    real = w.new_tensor(f"{name}_x_real", np.float32, shape)
    w.op("DEQUANTIZE", [source], [real])
    result = w.new_tensor(f"{name}_real", np.float32, shape)
    if op == "Softmax":
        w.op("SOFTMAX", [real], [result], beta=1.0)
    else:
        function(w, op, attrs, real, result, shape, np.float32)
    w.op("QUANTIZE", [result], [target])


FIXED_OUTPUT = {  # (op, dtype) -> the output parameters TFLite's quantized kernel requires
    ("LOGISTIC", "uint8"): QuantParams((1 / 256,), (0,)),
    ("LOGISTIC", "int8"): QuantParams((1 / 256,), (-128,)),
    ("LOGISTIC", "int16"): QuantParams((1 / 32768,), (0,)),
    ("TANH", "uint8"): QuantParams((1 / 128,), (128,)),
    ("TANH", "int8"): QuantParams((1 / 128,), (0,)),
    ("TANH", "int16"): QuantParams((1 / 32768,), (0,)),
}


def softmax(w, node):
    """SOFTMAX over the last stored axis; a QSoftmax as DEQUANTIZE, SOFTMAX, QUANTIZE (read
    back as the QSoftmax the quantizer makes for these parameters, which it must be)."""
    x = node.inputs[0]
    rank = len(x.shape)
    axis = node.attrs.get("axis", -1) % rank
    perm = w.home_of(x)
    if perm is not None and perm.index(axis) != rank - 1:
        perm = None
    _require((axis if perm is None else perm.index(axis)) == rank - 1)
    if node.op == "Softmax":
        w.op("SOFTMAX", [w.get(x, perm)], [w.define(node.output, perm)], beta=1.0)
        return
    out = node.output
    _require(x.quant.axis is None and out.dtype == x.dtype)
    table = exp_table(x.quant.scale[0])
    _require(np.array_equal(node.inputs[1].numpy(), table))
    _require({**node.attrs, "axis": axis} == softmax_attrs(axis, out.quant, out.dtype.name))
    source = w.get(x, perm)
    _float_island(w, source, w.define(out, perm), _stored(x.shape, perm), "Softmax", {})


# -- pooling ---------------------------------------------------------------------------------------
def reduce(w, node):
    """MEAN / REDUCE_MAX with keep_dims, in the input's layout; without kept dims, then a
    RESHAPE dropping the reduced axes (onert 0.1.0 refuses keep_dims = false at prepare:
    "ShapeValidator failed"; the reader folds the RESHAPE back)."""
    x, out = node.inputs[0], node.output
    axes = node.attrs["axes"]
    keep = bool(node.attrs.get("keepdims", 1))
    perm = w.home_of(x)
    if not keep and perm is not None:  # the kept axes must stay in the IR's order
        kept = [a for a in perm if a not in axes]
        perm = perm if kept == sorted(kept) else None
    stored = sorted(axes if perm is None else [perm.index(a) for a in axes])
    code = "MEAN" if node.op == "ReduceMean" else "REDUCE_MAX"
    operands = [w.get(x, perm), w.constant(np.asarray(stored, np.int32), f"{node.name}_axes")]
    if keep:
        w.op(code, operands, [w.define(out, perm)], keep_dims=True)
        return
    kept_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    reduced = w.new_tensor(
        f"{out.name}_kept", out.dtype, _stored(kept_shape, perm), quant=out.quant
    )
    w.op(code, operands, [reduced], keep_dims=True)
    shape = w.constant(np.asarray(out.shape, np.int32), f"{node.name}_shape")
    w.op("RESHAPE", [reduced, shape], [w.define(out, None)])


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
            w.requantize(index, requantized)
            index = requantized
        operands.append(index)
    _finish(
        w, node, "CONCATENATION", operands, perm, axis=axis if perm is None else perm.index(axis)
    )


def split(w, node):
    x = node.inputs[0]
    perm = w.home_of(x)
    axis = node.attrs["axis"] % len(x.shape)
    stored = np.asarray(axis if perm is None else perm.index(axis), np.int32)
    sizes = node.attrs["split"]
    source = w.get(x, perm)
    outputs = [w.define(v, perm) for v in node.outputs]
    if circle_code(node) == "SPLIT":
        operands = [w.constant(stored, f"{node.name}_axis"), source]
        w.op("SPLIT", operands, outputs, num_splits=len(sizes))
        return
    counts = w.constant(np.asarray(sizes, np.int32), f"{node.name}_sizes")
    operands = [source, counts, w.constant(stored, f"{node.name}_axis")]
    w.op("SPLIT_V", operands, outputs, num_splits=len(sizes))


def reshape(w, node):
    x, out = node.inputs[0], node.output
    shape = w.constant(np.asarray(out.shape, np.int32), f"{node.name}_shape")
    order = _flatten_order(w, node)
    if order is None:
        w.op("RESHAPE", [w.get(x, None), shape], [w.define(out, None)])
        return
    w.op("RESHAPE", [w.get(x, NHWC), shape], [w.define(out, None)])
    w.flat_order[id(out)] = order


DENSE = ("Gemm", "QGemm", "MatMul")


def _flatten_order(w, node) -> np.ndarray | None:
    """For a flatten of a channels-last tensor read only by FULLY_CONNECTED layers: the IR
    column each stored column holds when the NHWC data is flattened as is (their weights are
    permuted to match, so no TRANSPOSE is written; onert has no int8 TRANSPOSE). None
    otherwise."""
    x, out = node.inputs[0], node.output
    if x.is_const or w.home_of(x) != NHWC or out in w.graph.outputs:
        return None
    n, c, h, wd = x.shape
    if tuple(out.shape) != (n, c * h * wd) or not out.users:
        return None
    for user in out.users:
        weight = user.inputs[1] if len(user.inputs) > 1 else None
        if user.op not in DENSE or user.inputs[0] is not out or weight is None:
            return None
        if not weight.is_const or len(weight.shape) != 2 or user.attrs.get("transA"):
            return None
        per_channel = weight.quant is not None and weight.quant.axis is not None
        if user.op == "QGemm" and x.dtype == np.uint8 and per_channel:
            return None  # written as RESHAPE + CONV_2D (nn.gemm), which the reader keeps apart
    return channels_last_columns(c, h, wd)


def transpose(w, node):
    x = node.inputs[0]
    home = w.home_of(x)
    inner = tuple(range(len(x.shape))) if home is None else tuple(np.argsort(home))
    order = np.asarray([inner[p] for p in node.attrs["perm"]], np.int32)
    operands = [w.get(x, home), w.constant(order, f"{node.name}_perm")]
    w.op("TRANSPOSE", operands, [w.define(node.output, None)])


def pad(w, node):
    """PAD, PADV2 (a float fill) or MIRROR_PAD (reflect); negative pads crop first by a SLICE
    (TFLite's paddings are never negative: LiteRT refuses them)."""
    x, attrs = node.inputs[0], node.attrs
    mode = attrs.get("mode", "constant")
    perm = w.home_of(x)
    rank = len(x.shape)
    pads = attrs["pads"]
    pairs = [[pads[i], pads[i + rank]] for i in range(rank)]
    order = range(rank) if perm is None else perm
    value = float(attrs.get("value", 0.0))
    _require(mode in ("constant", "reflect"))
    if x.quant is not None and mode == "constant":
        _require(value == x.quant.zero_point[0])  # TFLite pads quantized tensors with it
    source = w.get(x, perm)
    code = circle_code(node)
    if min(pads) < 0:  # the IR reflects before it crops: the same unless one axis does both
        _require(mode == "constant" or not any(min(p) < 0 < max(p) for p in pairs))
        source = _crop(w, node, source, [pairs[p] for p in order], last=code == "SLICE")
        pairs = [[max(a, 0), max(b, 0)] for a, b in pairs]
        if code == "SLICE":
            return
    paddings = w.constant(np.asarray([pairs[p] for p in order], np.int32), f"{node.name}_pads")
    operands = [source, paddings]
    if code == "MIRROR_PAD":
        w.op(code, operands, [w.define(node.output, perm)], mode=0)
        return
    if code == "PADV2":
        operands.append(w.constant(np.asarray([value], x.dtype), f"{node.name}_value"))
    w.op(code, operands, [w.define(node.output, perm)])


def _crop(w, node, source: int, pairs: list[list[int]], last: bool) -> int:
    """SLICE of `source` (pairs of pads in its stored order) dropping what negative pads crop;
    the node's output when `last`."""
    x, out = node.inputs[0], node.output
    shape = w.tensors[source].shape
    begin = [-min(a, 0) for a, _ in pairs]
    size = [d + min(a, 0) + min(b, 0) for d, (a, b) in zip(shape, pairs)]
    if last:
        target = w.define(out, w.home_of(x))
    else:
        target = w.new_tensor(f"{out.name}_cropped", x.dtype, size, quant=x.quant)
    operands = [
        source,
        w.constant(np.asarray(begin, np.int32), f"{node.name}_begin"),
        w.constant(np.asarray(size, np.int32), f"{node.name}_size"),
    ]
    w.op("SLICE", operands, [target])
    return target


def identity(w, node):
    _require(all(not v.uses and v not in w.graph.outputs for v in node.outputs[1:]))
    w.alias(node.outputs[0], node.inputs[0])


def quantize_op(w, node):
    x, out = node.inputs[0], node.output
    params = out.quant or qdq_params(node.attrs)
    _require(params.axis is None)
    perm = w.home_of(x)
    if node.op == "Requantize":
        w.requantize(w.get(x, perm), w.define(out, perm, params))
        return
    code = "DEQUANTIZE" if node.op == "DequantizeLinear" else "QUANTIZE"
    w.op(code, [w.get(x, perm)], [w.define(out, perm, None if code == "DEQUANTIZE" else params)])
