"""Data movement: Reshape, Transpose, Concat, Split, Slice, Pad, Gather, Expand, Tile, Cast,
Identity, Dropout, DepthToSpace, SpaceToDepth. Shape operands are canonical attributes (static
shapes)."""

import math

import ml_dtypes
import numpy as np

from ...errors import InputValueError
from .. import dtypes
from .registry import (
    ANY,
    NOT_ALONG_AXIS_0,
    PER_SAMPLE,
    Attrs,
    BatchRule,
    TensorType,
    not_along_axis_0,
    register,
    same_as_input,
)


def _with_batch_shape(attrs: Attrs, n: int) -> Attrs:
    return {**attrs, "shape": [n * attrs["shape"][0], *attrs["shape"][1:]]}


# Output shape [1, ...] or rows [M, ...] from an input [1, ...] or rows: each sample's block
# stays contiguous (N samples: [N, ...] or [N M, ...]).
_RESHAPE_BATCH = BatchRule((0,), rewrite=_with_batch_shape, rows=True)


def _reshape_type(attrs: Attrs, types) -> list[TensorType]:
    shape, source = tuple(attrs["shape"]), types[0].shape
    if any(d < 0 for d in shape) or math.prod(shape) != math.prod(source):
        raise ValueError(
            f"shape {list(shape)} holds {math.prod(shape)} elements, its input {list(source)} "
            f"holds {math.prod(source)}"
        )
    return [TensorType(types[0].dtype, shape)]


@register(
    "Reshape",
    _reshape_type,
    batch=_RESHAPE_BATCH,
    quant="passthrough",
    view=True,
)
def reshape(attrs, x):
    return x.reshape(attrs["shape"])


def _transpose_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    return [TensorType(x.dtype, tuple(x.shape[p] for p in attrs["perm"]))]


_TRANSPOSE_BATCH = PER_SAMPLE.where(lambda node: node.attrs["perm"][0] == 0)


@register("Transpose", _transpose_type, batch=_TRANSPOSE_BATCH, quant="passthrough")
def transpose(attrs, x):
    return np.ascontiguousarray(x.transpose(attrs["perm"]))


def _concat_type(attrs: Attrs, types) -> list[TensorType]:
    axis = attrs["axis"]
    first = types[0].shape
    for t in types[1:]:
        if len(t.shape) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, first)) if i != axis
        ):
            raise ValueError(f"cannot concatenate {list(first)} and {list(t.shape)} on axis {axis}")
    total = sum(t.shape[axis] for t in types)
    return [TensorType(types[0].dtype, (*first[:axis], total, *first[axis + 1 :]))]


# Every part must carry the batch: a constant part would not grow with N.
CONCAT_BATCH = not_along_axis_0(ANY).where(lambda node: not any(v.is_const for v in node.inputs))


@register("Concat", _concat_type, batch=CONCAT_BATCH, quant="concat")
def concat(attrs, *xs):
    return np.concatenate(xs, axis=attrs["axis"])


def _split_type(attrs: Attrs, types) -> list[TensorType]:
    x, axis = types[0], attrs["axis"]
    if sum(attrs["split"]) != x.shape[axis]:
        raise ValueError(f"split sizes {attrs['split']} do not add up to {x.shape[axis]}")
    return [TensorType(x.dtype, (*x.shape[:axis], n, *x.shape[axis + 1 :])) for n in attrs["split"]]


@register("Split", _split_type, batch=NOT_ALONG_AXIS_0, quant="passthrough")
def split(attrs, x):
    cuts = np.cumsum(attrs["split"])[:-1]
    return tuple(np.ascontiguousarray(p) for p in np.split(x, cuts, axis=attrs["axis"]))


def _slices(attrs: Attrs) -> tuple[slice, ...]:
    return tuple(
        slice(s, e, st) for s, e, st in zip(attrs["starts"], attrs["ends"], attrs["steps"])
    )


def _slice_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    shape = tuple(len(range(*sl.indices(d))) for sl, d in zip(_slices(attrs), x.shape))
    return [TensorType(x.dtype, shape)]


# A slice of a length-1 axis that keeps 1 is all of it: for N samples, take all N.
_SLICE_BATCH = BatchRule(
    (0,),
    rewrite=lambda attrs, n: {
        **attrs,
        "starts": [0, *attrs["starts"][1:]],
        "ends": [None, *attrs["ends"][1:]],
        "steps": [1, *attrs["steps"][1:]],
    },
)


@register("Slice", _slice_type, batch=_SLICE_BATCH, quant="passthrough")
def slice_(attrs, x):
    """Per-axis Python slices: `starts`, `ends` (None = to the end) and `steps` for every axis."""
    return np.ascontiguousarray(x[_slices(attrs)])


def _pad_type(attrs: Attrs, types) -> list[TensorType]:
    x, pads = types[0], attrs["pads"]
    rank = len(x.shape)
    return [TensorType(x.dtype, tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape)))]


_PAD_BATCH = PER_SAMPLE.where(
    lambda node: node.attrs["pads"][0] == 0 == node.attrs["pads"][len(node.inputs[0].shape)]
)


@register("Pad", _pad_type, batch=_PAD_BATCH, quant="pad")
def pad(attrs, x):
    """Pad by `pads` (begins, then ends; negative crops) in mode constant/reflect/edge/wrap.

    Negative pads crop first, then the rest pads the cropped tensor (as onnxruntime: wrap
    repeats the cropped tensor)."""
    rank, pads = x.ndim, attrs["pads"]
    crop = tuple(slice(-min(pads[i], 0), x.shape[i] + min(pads[i + rank], 0)) for i in range(rank))
    x = x[crop]
    grow = [(max(pads[i], 0), max(pads[i + rank], 0)) for i in range(rank)]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return np.pad(x, grow, constant_values=np.asarray(attrs.get("value", 0)).astype(x.dtype))
    return np.pad(x, grow, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])


def _gather_type(attrs: Attrs, types) -> list[TensorType]:
    x, idx, axis = types[0], types[1], attrs["axis"]
    return [TensorType(x.dtype, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]))]


# Data gathered along a later axis, or a constant table indexed by the samples' indices.
_GATHER_BATCH = BatchRule(
    ANY,
    condition=lambda node: (
        (node.attrs["axis"] != 0 and node.inputs[1].is_const)
        or (node.attrs["axis"] == 0 and node.inputs[0].is_const)
    ),
)


@register("Gather", _gather_type, batch=_GATHER_BATCH)
def gather(attrs, x, indices):
    axis = attrs["axis"]
    size = x.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise InputValueError(f"Gather index out of range [-{size}, {size - 1}]")
    return np.take(x, indices.astype(np.int64), axis=axis)


_EXPAND_BATCH = BatchRule(
    (0,),
    condition=lambda node: len(node.inputs[0].shape) == len(node.outputs[0].shape),
    rewrite=_with_batch_shape,
)


@register(
    "Expand",
    lambda attrs, types: [TensorType(types[0].dtype, tuple(attrs["shape"]))],
    batch=_EXPAND_BATCH,
)
def expand(attrs, x):
    return np.ascontiguousarray(np.broadcast_to(x, attrs["shape"]))


def _tile_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    return [TensorType(x.dtype, tuple(d * r for d, r in zip(x.shape, attrs["repeats"])))]


_TILE_BATCH = PER_SAMPLE.where(lambda node: node.attrs["repeats"][0] == 1)


@register("Tile", _tile_type, batch=_TILE_BATCH)
def tile(attrs, x):
    return np.tile(x, attrs["repeats"])


def _depth_to_space_type(attrs: Attrs, types) -> list[TensorType]:
    n, c, h, w = types[0].shape
    b = attrs["blocksize"]
    return [TensorType(types[0].dtype, (n, c // (b * b), h * b, w * b))]


@register("DepthToSpace", _depth_to_space_type, batch=PER_SAMPLE, quant="passthrough")
def depth_to_space(attrs, x):
    n, c, h, w = x.shape
    b = attrs["blocksize"]
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(y.reshape(n, c // (b * b), h * b, w * b))


def _space_to_depth_type(attrs: Attrs, types) -> list[TensorType]:
    n, c, h, w = types[0].shape
    b = attrs["blocksize"]
    if h % b or w % b:
        raise ValueError(f"spatial size {h}x{w} is not a multiple of blocksize {b}")
    return [TensorType(types[0].dtype, (n, c * b * b, h // b, w // b))]


@register("SpaceToDepth", _space_to_depth_type, batch=PER_SAMPLE)
def space_to_depth(attrs, x):
    """Each b x b block becomes b*b channels: block offset major (DCR) or channel major (CRD)."""
    n, c, h, w = x.shape
    b = attrs["blocksize"]
    order = (0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(order)
    return np.ascontiguousarray(y.reshape(n, c * b * b, h // b, w // b))


@register(
    "Cast",
    lambda attrs, types: [TensorType(dtypes.dtype(attrs["to"]), types[0].shape)],
    batch=PER_SAMPLE,
)
def cast(attrs, x):
    """Convert element type as ONNX defines it: float8 saturates by default, sub-byte integers
    wrap around, and float8e8m0 rounds the exponent by `round_mode`."""
    name = attrs["to"]
    to = dtypes.dtype(name)
    if name == "float8e8m0" and not np.issubdtype(x.dtype, np.integer):
        return _to_e8m0(x.astype(np.float32), attrs.get("round_mode", "up"), to)
    if name.startswith("float8") and attrs.get("saturate", 1):
        limit = float(ml_dtypes.finfo(to).max)
        return np.clip(x.astype(np.float32), -limit, limit).astype(to)
    if name in ("int4", "uint4", "int2", "uint2") and x.dtype.itemsize * 8 > to.itemsize:
        bits = 4 if name.endswith("4") else 2
        wide = np.rint(x.astype(np.float64)) if not np.issubdtype(x.dtype, np.integer) else x
        wrapped = wide.astype(np.int64) & ((1 << bits) - 1)
        if name.startswith("int"):
            wrapped = np.where(wrapped >= 1 << (bits - 1), wrapped - (1 << bits), wrapped)
        return wrapped.astype(to)
    return x.astype(to)


def _to_e8m0(x: np.ndarray, round_mode: str, to: np.dtype) -> np.ndarray:
    """Powers of two only: round |x| to 2^e in the given direction, e in [-127, 127]."""
    magnitude = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.log2(np.where(magnitude > 0, magnitude, np.float32(2.0**-127)))
        low = np.floor(exponent)
        if round_mode == "up":
            chosen = np.ceil(exponent)
        elif round_mode == "down":
            chosen = low
        else:  # nearest, ties up
            chosen = np.where(magnitude - 2.0**low >= 2.0 ** (low + 1) - magnitude, low + 1, low)
    power = np.exp2(np.clip(chosen, -127, 127))
    return np.where(np.isnan(x), np.nan, power).astype(to)


@register("Identity", same_as_input, batch=PER_SAMPLE, quant="passthrough", onnx={}, view=True)
def identity(attrs, x):
    return x


def _dropout_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    outputs = [x]
    if attrs.get("mask"):
        outputs.append(TensorType(np.dtype(np.bool_), x.shape))
    return outputs


@register("Dropout", _dropout_type, batch=PER_SAMPLE, quant="passthrough", view=True)
def dropout(attrs, x):
    """Inference-mode dropout: the identity (and an all-true mask when asked for)."""
    if attrs.get("mask"):
        return x, np.ones(x.shape, dtype=np.bool_)
    return x
