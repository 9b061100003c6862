"""Selection and index operators real exports use: TopK, CumSum, Trilu, GatherElements, GatherND,
ScatterElements, ScatterND, Einsum (ONNX semantics; attributes canonical: axes non-negative,
constant operands such as TopK's k folded into attributes by the importer).

Indices are validated (ONNX allows negative ones, counted from the end); duplicate indices in a
scatter without reduction take the last update, as onnxruntime does.
"""

import numpy as np

from ...errors import InputValueError
from .registry import PER_SAMPLE, Attrs, BatchRule, TensorType, not_along_axis_0, register

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _in_range(indices: np.ndarray, size: int, what: str) -> np.ndarray:
    """Indices with negative ones counted from the end; out of range is an
    InputValueError (the indices come from the data)."""
    indices = indices.astype(np.int64)
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise InputValueError(f"{what} index out of range [-{size}, {size - 1}]")
    return np.where(indices < 0, indices + size, indices)


def _top_k_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    shape = list(x.shape)
    shape[attrs["axis"]] = attrs["k"]
    return [TensorType(x.dtype, tuple(shape)), TensorType(np.dtype(np.int64), tuple(shape))]


@register("TopK", _top_k_type, batch=not_along_axis_0())
def top_k(attrs, x):
    """The k largest (or smallest) along `axis`; among equal values the lower index first."""
    axis, k = attrs["axis"], attrs["k"]
    if k > x.shape[axis]:
        raise ValueError(f"k = {k} is larger than axis {axis} ({x.shape[axis]})")
    key = x.astype(np.float64) if x.dtype.kind == "b" else x
    if attrs["largest"]:  # ~ reverses integer order without overflow (-INT_MIN wraps)
        key = ~key if key.dtype.kind in "iu" else -key
    order = np.argsort(key, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)


@register("CumSum", lambda attrs, types: [types[0]], batch=not_along_axis_0())
def cum_sum(attrs, x):
    axis = attrs["axis"]
    y = np.flip(x, axis) if attrs["reverse"] else x
    total = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs["exclusive"]:
        total = total - y
    return np.flip(total, axis) if attrs["reverse"] else total


@register("Trilu", lambda attrs, types: [types[0]], batch=PER_SAMPLE.where(
    lambda node: len(node.inputs[0].shape) > 2))  # fmt: skip
def trilu(attrs, x):
    """Upper (triu) or lower (tril) triangle of the last two axes, shifted by diagonal k."""
    keep = np.triu if attrs["upper"] else np.tril
    return keep(x, attrs["k"])


@register(
    "GatherElements",
    lambda attrs, types: [TensorType(types[0].dtype, types[1].shape)],
    batch=BatchRule(None, condition=lambda node: node.attrs["axis"] != 0),
)
def gather_elements(attrs, data, indices):
    """data[..., indices[i], ...] along `axis`; indices may be shorter than data on other axes."""
    axis = attrs["axis"]
    window = tuple(slice(0, n) if a != axis else slice(None) for a, n in enumerate(indices.shape))
    where = _in_range(indices, data.shape[axis], "GatherElements")
    return np.take_along_axis(data[window], where, axis)


def _gather_nd_type(attrs: Attrs, types) -> list[TensorType]:
    data, indices = types[0], types[1]
    b = attrs["batch_dims"]
    shape = indices.shape[:-1] + data.shape[b + indices.shape[-1] :]
    return [TensorType(data.dtype, tuple(shape))]


@register("GatherND", _gather_nd_type, batch=None)
def gather_nd(attrs, data, indices):
    b, depth = attrs["batch_dims"], indices.shape[-1]
    batch_shape = data.shape[:b]
    flat_data = data.reshape((-1, *data.shape[b:]))
    flat_index = indices.reshape((-1, *indices.shape[b:]))
    inner = data.shape[b : b + depth]
    rows = []
    for batch in range(flat_data.shape[0]):
        points = flat_index[batch].reshape(-1, depth)
        points = np.stack(
            [_in_range(points[:, i], inner[i], "GatherND") for i in range(depth)], axis=-1
        )
        rows.append(flat_data[batch][tuple(points.T)])
    out = np.stack(rows) if rows else np.zeros((0,), data.dtype)
    shape = batch_shape + indices.shape[b:-1] + data.shape[b + depth :]
    return out.reshape(shape)


@register("ScatterElements", lambda attrs, types: [types[0]], batch=None)
def scatter_elements(attrs, data, indices, updates):
    axis, reduction = attrs["axis"], attrs["reduction"]
    indices = _in_range(indices, data.shape[axis], "ScatterElements")
    out = data.copy()
    grid = list(np.indices(indices.shape, sparse=False))
    grid[axis] = indices
    where = tuple(grid)
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCE[reduction].at(out, where, updates)
    return out


@register("ScatterND", lambda attrs, types: [types[0]], batch=None)
def scatter_nd(attrs, data, indices, updates):
    depth, reduction = indices.shape[-1], attrs["reduction"]
    points = indices.reshape(-1, depth)
    points = np.stack(
        [_in_range(points[:, i], data.shape[i], "ScatterND") for i in range(depth)], axis=-1
    )
    values = updates.reshape((points.shape[0], *data.shape[depth:]))
    out = data.copy()
    for point, value in zip(points, values):  # in order: a later update of a point wins
        where = tuple(point)
        out[where] = value if reduction == "none" else _REDUCE[reduction](out[where], value)
    return out


def _einsum_type(attrs: Attrs, types) -> list[TensorType]:
    """The output shape from the equation: each letter's size, broadcast ellipsis dims, and the
    explicit output (or, without '->', the letters used once, in alphabetical order)."""
    equation = attrs["equation"].replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(types):
        raise ValueError(f"equation '{equation}' names {len(terms)} operands, got {len(types)}")
    sizes: dict[str, int] = {}
    ellipsis: tuple[int, ...] = ()
    for term, t in zip(terms, types):
        letters = term.replace("...", "")
        extra = len(t.shape) - len(letters)
        if extra < 0 or (extra and "..." not in term):
            raise ValueError(f"operand '{term}' does not match shape {list(t.shape)}")
        before = term.split("...")[0] if "..." in term else term
        dims = list(t.shape)
        ellipsis = tuple(
            np.broadcast_shapes(ellipsis, tuple(dims[len(before) : len(before) + extra]))
        )
        for letter, size in zip(letters, dims[: len(before)] + dims[len(before) + extra :]):
            if sizes.setdefault(letter, size) != size and 1 not in (size, sizes[letter]):
                raise ValueError(f"'{letter}' is {sizes[letter]} and {size} in '{equation}'")
            sizes[letter] = max(sizes[letter], size)
    if not arrow:
        counts = {c: inputs.count(c) for c in sizes}
        output = ("..." if ellipsis else "") + "".join(
            sorted(c for c, n in counts.items() if n == 1)
        )
    head, _, tail = output.partition("...")
    shape = (
        [sizes[c] for c in head]
        + (list(ellipsis) if "..." in output else [])
        + [sizes[c] for c in tail]
    )
    return [TensorType(types[0].dtype, tuple(int(d) for d in shape))]


@register("Einsum", _einsum_type, batch=None)
def einsum(attrs, *operands):
    """Products and contractions spelled as an Einstein summation (float inputs, float16 and
    bfloat16 included, accumulate in float64 and round once)."""
    dtype = operands[0].dtype
    if dtype.kind in "iub":
        return np.einsum(attrs["equation"], *operands).astype(dtype)
    wide = [o.astype(np.float64) for o in operands]
    return np.einsum(attrs["equation"], *wide).astype(dtype)
