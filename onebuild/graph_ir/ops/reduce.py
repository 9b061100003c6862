"""Reductions over canonical `axes` (non-negative, sorted) with `keepdims`."""

import numpy as np

from .registry import NOT_OVER_AXIS_0, Attrs, TensorType, register


def _reduce_type(attrs: Attrs, types) -> list[TensorType]:
    x = types[0]
    axes = set(attrs["axes"])
    if len(axes) != len(attrs["axes"]):
        raise ValueError(f"axes {list(attrs['axes'])} name an axis twice")
    if attrs.get("keepdims", 1):
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(x.dtype, shape)]


def _reduction(name: str, fn, empty, quant: str | None = None):
    @register(name, _reduce_type, batch=NOT_OVER_AXIS_0, quant=quant)
    def kernel(attrs, x):
        axes, keep = tuple(attrs["axes"]), bool(attrs.get("keepdims", 1))
        if x.size == 0 or any(x.shape[a] == 0 for a in axes):
            shape = _reduce_type(attrs, [TensorType(x.dtype, x.shape)])[0].shape
            return np.full(shape, empty(x.dtype), dtype=x.dtype)
        return np.asarray(fn(x, axis=axes, keepdims=keep)).astype(x.dtype, copy=False)

    kernel.__name__ = name
    return kernel


def _lowest(dt):
    if dt == np.bool_:
        return False
    return -np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).min


def _highest(dt):
    if dt == np.bool_:
        return True
    return np.inf if np.issubdtype(dt, np.floating) else np.iinfo(dt).max


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Sums in float64, as GlobalAveragePool: a spatial mean gives the same bits either way
    (circle spells both MEAN, and a round trip must be exact)."""
    return np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float64)


# ReduceMean over height and width quantizes as a global average pool.
_reduction("ReduceMean", _mean, lambda dt: np.nan, quant="average_pool")
_reduction("ReduceMax", np.max, _lowest)
_reduction("ReduceMin", np.min, _highest)
_reduction("ReduceSum", np.sum, lambda dt: 0)
_reduction("ReduceProd", np.prod, lambda dt: 1)


def _arg_type(attrs: Attrs, types) -> list[TensorType]:
    return [TensorType(np.dtype(np.int64), _reduce_type(attrs, types)[0].shape)]


def _arg_kernel(name: str, fn):
    @register(name, _arg_type, batch=NOT_OVER_AXIS_0)
    def kernel(attrs, x):
        """Index of the first extreme value, or the last with `select_last_index`."""
        (axis,) = attrs["axes"]
        if attrs.get("select_last_index"):
            index = x.shape[axis] - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            index = fn(x, axis=axis)
        index = index.astype(np.int64)
        return np.expand_dims(index, axis) if attrs.get("keepdims", 1) else index

    kernel.__name__ = name
    return kernel


_arg_kernel("ArgMax", np.argmax)
_arg_kernel("ArgMin", np.argmin)
