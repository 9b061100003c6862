"""ONNX operator converters: each turns one ONNX node (any opset from 7) into canonical IR ops.

Opset differences, auto_pad, negative axes and shape operands (Reshape's shape, Slice's starts,
...) are resolved here, so IR kernels see one canonical form per op.
"""

import math
from collections.abc import Callable

import numpy as np

from ...errors import UserError
from .. import dtypes
from ..ops import OPS, broadcast_shape, normalize_axis
from ..tensor import Tensor
from .onnx_checks import axis_in, dims, indices_in, non_negative

CONVERTERS: dict[str, Callable] = {}  # beside these, `declared` converts ops registered with onnx=


def converter(*names: str):
    def wrap(fn):
        for name in names:
            CONVERTERS[name] = fn
        return fn

    return wrap


def canonical_axes(values, rank: int) -> list[int]:
    return sorted({normalize_axis(int(a), rank) for a in values})


def _onnx_type_name(ctx, elem_type: int) -> str:
    try:
        return dtypes.name_of(ctx.importer.dtype(elem_type, "the target"))
    except UserError as error:  # without the file name, which the node's message gives
        raise ValueError(str(error).split(": ", 1)[-1]) from None


def per_channel(ctx, indices, channels: int) -> None:
    """Operands with one value per channel (BatchNormalization's, a Conv bias, ...)."""
    for index in indices:
        value = ctx.input(index)
        if value is not None and tuple(value.shape) != (channels,):
            raise ValueError(
                f"input {index} '{value.name}' has shape {list(value.shape)}, expected "
                f"[{channels}] (one value per channel)"
            )


# -- pass-through and elementwise --------------------------------------------------------------
def declared(ctx):
    """An op registered as the ONNX operator of the same name (`OpDef.onnx`): its inputs as
    they are, the attributes it reads by their declared types."""
    kinds = OPS[ctx.op_type].onnx
    given = {name: ctx.attr(name) for name in kinds}
    attrs = {name: kinds[name](value) for name, value in given.items() if value is not None}
    return ctx.emit(ctx.op_type, ctx.inputs, attrs)


@converter("Mod")
def mod(ctx):
    """Mod; before opset 28 floats need fmod=1 (fmod=0, the floor modulo, was for integers)."""
    floats = np.issubdtype(ctx.inputs[0].dtype, np.floating)
    if ctx.opset < 28 and floats and not ctx.attr("fmod", 0):
        raise ctx.fail(
            "Mod of floating-point values needs fmod=1 before opset 28 (onnxruntime refuses fmod=0)"
        )
    return declared(ctx)


@converter("Max", "Min")
def max_min(ctx):
    if len(ctx.inputs) == 1:
        return ctx.emit("Identity", ctx.inputs)
    return ctx.emit(ctx.op_type, ctx.inputs)


@converter("Sum")
def sum_(ctx):
    """Sum of n inputs becomes a chain of binary Adds."""
    total = ctx.inputs[0]
    if len(ctx.inputs) == 1:
        return ctx.emit("Identity", [total])
    for value in ctx.inputs[1:]:
        (total,) = ctx.emit("Add", [total, value])
    return [total]


@converter("Mean")
def mean(ctx):
    """Mean of n inputs: their sum divided by n."""
    (total,) = sum_(ctx)
    count = ctx.constant(np.asarray(len(ctx.inputs), total.dtype))
    return ctx.emit("Div", [total, count])


@converter("Clip")
def clip(ctx):
    x = ctx.inputs[0]
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
        bounds = [
            None if b is None else ctx.graph.add_constant(np.asarray(b, x.dtype), "clip_bound")
            for b in (lo, hi)
        ]
        return ctx.emit("Clip", [x, *bounds])
    return ctx.emit("Clip", [x, ctx.input(1), ctx.input(2)])


@converter("Softmax", "LogSoftmax")
def softmax(ctx):
    x = ctx.inputs[0]
    rank = len(x.shape)
    axis = normalize_axis(ctx.attr("axis", 1 if ctx.opset < 13 else -1), rank)
    if ctx.opset >= 13 or axis == rank - 1:
        return ctx.emit(ctx.op_type, [x], {"axis": axis})
    # Before opset 13 the input is coerced to 2-D at `axis`.
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    (flat,) = ctx.emit("Reshape", [x], {"shape": [rows, x.size // max(rows, 1)]})
    (y,) = ctx.emit(ctx.op_type, [flat], {"axis": 1})
    return ctx.emit("Reshape", [y], {"shape": list(x.shape)})


@converter("Cast")
def cast(ctx):
    attrs = {
        "to": _onnx_type_name(ctx, ctx.attr("to")),
        "saturate": int(ctx.attr("saturate", 1)),
        "round_mode": ctx.attr("round_mode", "up"),
    }
    return ctx.emit("Cast", ctx.inputs, attrs)


@converter("CastLike")
def cast_like(ctx):
    attrs = {
        "to": dtypes.name_of(ctx.inputs[1].dtype),
        "saturate": int(ctx.attr("saturate", 1)),
        "round_mode": ctx.attr("round_mode", "up"),
    }
    return ctx.emit("Cast", ctx.inputs[:1], attrs)


@converter("Dropout")
def dropout(ctx):
    training = ctx.const(2, "training_mode") if ctx.opset >= 12 else None
    if training is not None and bool(training):
        raise ctx.fail("training-mode Dropout is not supported; export the model for inference")
    return ctx.emit("Dropout", ctx.inputs[:1], {"mask": int(ctx.wants_output(1))})


# -- constants and shape queries --------------------------------------------------------------
@converter("Constant")
def constant(ctx):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        data = ctx.attr(key)
        if data is not None:
            if key.startswith("value_float"):
                data = np.asarray(data, np.float32)
            elif key.startswith("value_int"):
                data = np.asarray(data, np.int64)
            return [ctx.constant(np.asarray(data))]
    raise ctx.fail("only tensor, float and int constants are supported")


@converter("ConstantOfShape")
def constant_of_shape(ctx):
    shape = dims(ctx.const(0, "shape"), "shape")
    fill = ctx.attr("value")
    fill = np.zeros(1, np.float32) if fill is None else np.asarray(fill).reshape(-1)
    value = fill[0]
    tensor = Tensor.lazy(lambda: np.full(shape, value, fill.dtype), fill.dtype, shape)
    return [ctx.constant(tensor)]


@converter("Shape")
def shape(ctx):
    dims = np.asarray(ctx.inputs[0].shape, np.int64)
    rank = len(dims)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return [ctx.constant(dims[start:end])]


@converter("Size")
def size(ctx):
    return [ctx.constant(np.asarray(ctx.inputs[0].size, np.int64))]


@converter("Range")
def range_(ctx):
    start, limit, delta = (ctx.const(i, "range operand") for i in range(3))
    if any(operand.size != 1 for operand in (start, limit, delta)):
        raise ValueError("start, limit and delta must each have one element")
    # one-element vectors are accepted as scalars, as onnxruntime does (the expanded AffineGrid)
    start, limit, delta = (operand.reshape(()) for operand in (start, limit, delta))
    if delta == 0:
        raise ValueError("delta is 0")
    dims([max(math.ceil((float(limit) - float(start)) / float(delta)), 0)], "the range")
    return [ctx.constant(np.arange(start, limit, delta, dtype=start.dtype))]


# -- shape manipulation ------------------------------------------------------------------------
def _reshape(ctx, x, shape):
    return ctx.emit("Reshape", [x], {"shape": [int(d) for d in shape]})


@converter("Reshape")
def reshape(ctx):
    x = ctx.inputs[0]
    target = [int(d) for d in (ctx.const(1, "shape") if ctx.opset >= 5 else ctx.attr("shape"))]
    allow_zero = ctx.attr("allowzero", 0)
    shape = [x.shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target)]
    if shape.count(-1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or x.size % known:
            raise ctx.fail(f"cannot reshape {list(x.shape)} to {target}")
        shape[shape.index(-1)] = x.size // known
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ctx.fail(f"cannot reshape {list(x.shape)} to {target}")
    return _reshape(ctx, x, shape)


@converter("Flatten")
def flatten(ctx):
    x = ctx.inputs[0]
    axis = axis_in(ctx.attr("axis", 1), len(x.shape), inclusive=True)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return _reshape(ctx, x, [rows, int(np.prod(x.shape[axis:], dtype=np.int64))])


def _axes_operand(ctx, index: int):
    """Squeeze's/Unsqueeze's axes; a scalar operand is one axis, as in onnxruntime."""
    if ctx.opset < 13:
        return ctx.attr("axes")
    axes = ctx.const(index, "axes")
    return None if axes is None else np.atleast_1d(axes)


@converter("Squeeze")
def squeeze(ctx):
    x = ctx.inputs[0]
    axes = _axes_operand(ctx, 1)
    rank = len(x.shape)
    axes = (
        [i for i, d in enumerate(x.shape) if d == 1] if axes is None else canonical_axes(axes, rank)
    )
    if any(x.shape[a] != 1 for a in axes):
        raise ctx.fail(f"cannot squeeze axes {axes} of shape {list(x.shape)}")
    return _reshape(ctx, x, [d for i, d in enumerate(x.shape) if i not in axes])


@converter("Unsqueeze")
def unsqueeze(ctx):
    x = ctx.inputs[0]
    given = [int(a) for a in _axes_operand(ctx, 1)]
    axes = canonical_axes(given, len(x.shape) + len(given))
    if len(axes) != len(given):
        raise ValueError(f"axes {given} repeat an axis")
    shape, source = [], iter(x.shape)
    for i in range(len(x.shape) + len(axes)):
        shape.append(1 if i in axes else next(source))
    return _reshape(ctx, x, shape)


@converter("Transpose")
def transpose(ctx):
    x = ctx.inputs[0]
    perm = ctx.attr("perm")
    perm = list(range(len(x.shape)))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(len(x.shape))):
        raise ctx.fail(f"perm {perm} is not a permutation of rank {len(x.shape)}")
    return ctx.emit("Transpose", [x], {"perm": perm})


@converter("Concat")
def concat(ctx):
    inputs = [v for v in ctx.inputs if v is not None]
    axis = normalize_axis(ctx.attr("axis"), len(inputs[0].shape))
    return ctx.emit("Concat", inputs, {"axis": axis})


@converter("Split")
def split(ctx):
    x = ctx.inputs[0]
    axis = normalize_axis(ctx.attr("axis", 0), len(x.shape))
    sizes = ctx.attr("split") if ctx.opset < 13 else ctx.const(1, "split")
    length = x.shape[axis]
    if sizes is not None:
        sizes = non_negative("split", sizes)
    else:
        parts = ctx.attr("num_outputs", ctx.num_outputs)
        chunk = math.ceil(length / parts)
        sizes = [min(chunk, length - i * chunk) for i in range(parts)]
    return ctx.emit("Split", [x], {"axis": axis, "split": [int(s) for s in sizes]})


@converter("Slice")
def slice_(ctx):
    x = ctx.inputs[0]
    rank = len(x.shape)
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends = ctx.const(1, "starts"), ctx.const(2, "ends")
        axes, steps = ctx.const(3, "axes"), ctx.const(4, "steps")
    axes = (
        list(range(len(starts))) if axes is None else [normalize_axis(int(a), rank) for a in axes]
    )
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("starts, ends, axes and steps differ in length")
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes {axes} repeat an axis")
    canon_start, canon_end, canon_step = [0] * rank, list(x.shape), [1] * rank
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim, start, end = x.shape[axis], int(start), int(end)
        if step == 0:
            raise ctx.fail("slice step must not be 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        canon_start[axis], canon_step[axis] = start, step
        canon_end[axis] = None if end < 0 else end
    attrs = {"starts": canon_start, "ends": canon_end, "steps": canon_step}
    return ctx.emit("Slice", [x], attrs)


@converter("Pad")
def pad(ctx):
    x = ctx.inputs[0]
    rank = len(x.shape)
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads, value, axes = ctx.attr("pads", ctx.attr("paddings")), ctx.attr("value", 0.0), None
    else:
        pads = ctx.const(1, "pads")
        fill = ctx.const(2, "constant_value")
        value = 0 if fill is None or fill.size == 0 else fill.reshape(-1)[0].item()
        axes = ctx.const(3, "axes")
    pads = [int(p) for p in pads]
    if axes is not None:
        axes = [normalize_axis(int(a), rank) for a in axes]
        full = [0] * (2 * rank)
        for i, axis in enumerate(axes):
            full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
        pads = full
    if len(pads) != 2 * rank:
        raise ctx.fail(f"pads has {len(pads)} entries, expected {2 * rank}")
    if any(d + pads[i] + pads[i + rank] < 0 for i, d in enumerate(x.shape)):
        raise ValueError(f"pads {pads} crop more than the input {list(x.shape)} has")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.fail(f"unknown pad mode '{mode}'")
    if mode == "reflect":  # one reflection only, as onnxruntime (numpy's would fold again)
        for i, d in enumerate(x.shape):
            kept = d + min(pads[i], 0) + min(pads[i + rank], 0)
            if max(pads[i], pads[i + rank]) > kept - 1:
                raise ctx.fail(
                    f"reflect pads {pads} exceed axis {i}: its {kept} (cropped) elements reflect "
                    f"at most {kept - 1}; use mode 'edge' or smaller pads"
                )
    return ctx.emit("Pad", [x], {"pads": pads, "mode": mode, "value": value})


@converter("Gather")
def gather(ctx):
    x, indices = ctx.inputs[:2]
    axis = normalize_axis(ctx.attr("axis", 0), len(x.shape))
    if indices.is_const:
        indices_in(indices.numpy(), x.shape[axis], "index")
    return ctx.emit("Gather", ctx.inputs[:2], {"axis": axis})


@converter("Expand")
def expand(ctx):
    x = ctx.inputs[0]
    shape = broadcast_shape(x.shape, tuple(int(d) for d in ctx.const(1, "shape")))
    return ctx.emit("Expand", [x], {"shape": list(shape)})


@converter("Tile")
def tile(ctx):
    repeats = non_negative("repeats", ctx.const(1, "repeats"), len(ctx.inputs[0].shape))
    return ctx.emit("Tile", ctx.inputs[:1], {"repeats": repeats})


# -- reductions --------------------------------------------------------------------------------
def _reduce_attrs(ctx) -> dict | None:
    """Canonical axes and keepdims of a Reduce* node; None when it reduces nothing."""
    rank = len(ctx.inputs[0].shape)
    axes_as_input = ctx.opset >= (13 if ctx.op_type == "ReduceSum" else 18)
    axes = ctx.const(1, "axes") if axes_as_input else ctx.attr("axes")
    if axes is None or len(axes) == 0:
        if ctx.attr("noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return {"axes": canonical_axes(axes, rank), "keepdims": int(ctx.attr("keepdims", 1))}


@converter("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd")
def reduce(ctx):
    attrs = _reduce_attrs(ctx)
    if attrs is None:
        return ctx.emit("Identity", ctx.inputs[:1])
    return ctx.emit(ctx.op_type, ctx.inputs[:1], attrs)


@converter("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def reduce_composite(ctx):
    """Spelled out in elementwise ops and ReduceSum (ReduceLogSumExp shifted by the maximum)."""
    x = ctx.inputs[0]
    attrs = _reduce_attrs(ctx)
    op = ctx.op_type
    if op == "ReduceLogSumExp":
        if attrs is None:
            return ctx.emit("Identity", [x])
        kept = {**attrs, "keepdims": 1}
        (peak,) = ctx.emit("ReduceMax", [x], kept)
        if np.issubdtype(x.dtype, np.floating):  # an infinite peak would make inf - inf = NaN:
            finite = np.finfo(x.dtype)  # clamped, an all -inf row gives -inf as onnxruntime
            (peak,) = ctx.emit("Max", [peak, ctx.constant(np.asarray(finite.min, x.dtype))])
            (peak,) = ctx.emit("Min", [peak, ctx.constant(np.asarray(finite.max, x.dtype))])
        (shifted,) = ctx.emit("Sub", [x, peak])
        (terms,) = ctx.emit("Exp", [shifted])
        (total,) = ctx.emit("ReduceSum", [terms], kept)
        (log,) = ctx.emit("Log", [total])
        (result,) = ctx.emit("Add", [log, peak])
        if attrs["keepdims"]:
            return [result]
        shape = [d for i, d in enumerate(x.shape) if i not in attrs["axes"]]
        return _reshape(ctx, result, shape)
    if op == "ReduceL1":
        (terms,) = ctx.emit("Abs", [x])
    elif op in ("ReduceL2", "ReduceSumSquare"):
        (terms,) = ctx.emit("Mul", [x, x])
    else:
        terms = x
    (total,) = ctx.emit("ReduceSum", [terms], attrs) if attrs else ctx.emit("Identity", [terms])
    if op == "ReduceL2":
        return ctx.emit("Sqrt", [total])
    if op == "ReduceLogSum":
        return ctx.emit("Log", [total])
    return [total]


@converter("ArgMax", "ArgMin")
def arg_extreme(ctx):
    x = ctx.inputs[0]
    attrs = {
        "axes": [normalize_axis(ctx.attr("axis", 0), len(x.shape))],
        "keepdims": int(ctx.attr("keepdims", 1)),
        "select_last_index": int(ctx.attr("select_last_index", 0)),
    }
    return ctx.emit(ctx.op_type, [x], attrs)


def converter_for(op_type: str) -> Callable | None:
    """The converter of ONNX operator `op_type` (None: not supported)."""
    if op_type in CONVERTERS:
        return CONVERTERS[op_type]
    op = OPS.get(op_type)
    return declared if op is not None and op.onnx is not None else None
