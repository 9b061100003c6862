"""The closed set of IR operators: for each, a type-inference rule and a numpy kernel.

A kernel takes the node's attributes and its input arrays (None for an omitted optional input)
and returns a tuple of output arrays. `infer` takes the attributes and the input types and returns
the output types. Both see canonical attributes: the ONNX importer resolves opset differences,
auto_pad, negative axes and shape operands before a node is created.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class TensorType(NamedTuple):
    dtype: np.dtype
    shape: tuple[int, ...]


Attrs = dict[str, Any]
Kernel = Callable[..., tuple[np.ndarray, ...]]
Infer = Callable[[Attrs, Sequence[TensorType | None]], list[TensorType]]


@dataclass(frozen=True)
class OpDef:
    name: str
    kernel: Kernel
    infer: Infer


OPS: dict[str, OpDef] = {}


def register(name: str, infer: Infer) -> Callable[[Callable], Callable]:
    """Register the decorated function as the kernel of op `name`; it may return one array."""

    def wrap(fn: Callable) -> Callable:
        def kernel(attrs: Attrs, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
            result = fn(attrs, *inputs)
            return result if isinstance(result, tuple) else (result,)

        kernel.__name__ = kernel.__qualname__ = fn.__name__
        kernel.__doc__ = fn.__doc__
        OPS[name] = OpDef(name, kernel, infer)
        return fn

    return wrap


def same_as_input(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Output type equals the first input's type (unary elementwise ops)."""
    return [types[0]]


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            "shapes " + " and ".join(str(list(s)) for s in shapes) + " do not broadcast"
        ) from None


def broadcast(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Numpy broadcasting of all inputs; the dtype of the first input."""
    shapes = [t.shape for t in types if t is not None]
    return [TensorType(types[0].dtype, broadcast_shape(*shapes))]


def with_dtype(dtype: np.dtype | str) -> Infer:
    """Broadcast shape, fixed output dtype (comparisons)."""

    def infer(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
        return [TensorType(np.dtype(dtype), broadcast(attrs, types)[0].shape)]

    return infer


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0
