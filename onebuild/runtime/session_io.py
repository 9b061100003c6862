"""The Session's I/O rules: tensors by index or name, feeds of the model's shapes and types
(float32 for float and quantized inputs, the model's own integer type for integer inputs such as
indices), and outputs copied into the app's buffers."""

from collections.abc import Iterable

import numpy as np

from ..errors import UserError
from ..graph_ir.interpreter import check_feeds
from ..graph_ir.ir import Graph
from ..npz import refuse_codes

Shapes = dict[str, tuple[int, ...]]
QUANTIZED = "quantized"  # an input of integer codes the session quantizes float values into


def tensor_name(key: int | str, io: Shapes) -> str:
    """The name of input or output `key` (an index or a name)."""
    names = list(io)
    if isinstance(key, int):
        if not 0 <= key < len(names):
            raise UserError(f"index {key} is out of range: the model has {len(names)}")
        return names[key]
    if key not in io:
        raise UserError(f"no tensor '{key}' (the model has {', '.join(names)})")
    return key


def app_types(tensors: Iterable) -> dict[str, str]:
    """What the app exchanges per tensor (graph values or package/binary specs): "float32" for
    float tensors, QUANTIZED for integer codes with quantization parameters (float32 values
    for the app), else the tensor's own dtype (integer indices stay integers)."""
    types = {}
    for t in tensors:
        dtype = np.dtype(t.dtype)
        quantized = t.quant is not None and dtype.kind in "iu"
        types[t.name] = QUANTIZED if quantized else "float32" if dtype.kind == "f" else dtype.name
    return types


def checked_feeds(
    inputs: Shapes, types: dict[str, str], given, float_graph: Graph | None
) -> dict[str, np.ndarray]:
    """Every input, of its shape and app type (`app_types`): float32 for float and quantized
    inputs, integer inputs in their own dtype (values checked against the float model)."""
    if not isinstance(given, dict):
        raise UserError(
            f"inputs are a dict of arrays by input name ({', '.join(inputs)}), not "
            f"{type(given).__name__}"
        )
    feeds = dict(given)
    extra = [str(name) for name in feeds if name not in inputs]
    if extra:
        raise UserError(
            f"no model input named {', '.join(repr(n) for n in extra)} (the model's inputs: "
            f"{', '.join(inputs)})"
        )
    for name, shape in inputs.items():
        if name not in feeds:
            raise UserError(f"missing input '{name}' {list(shape)}; set_input or pass it")
        array = np.asarray(feeds[name])
        if array.shape != shape:
            raise UserError(f"input '{name}' has shape {list(array.shape)}, expected {list(shape)}")
        feeds[name] = _typed(name, array, types[name])
    if float_graph is not None:
        check_feeds(float_graph, feeds, batched=False)
    return {name: feeds[name] for name in inputs}


def _typed(name: str, array: np.ndarray, want: str) -> np.ndarray:
    """`array` as the app type `want` of input `name`, or a one-line UserError."""
    if want == QUANTIZED:
        refuse_codes(name, array, "run", "feed float values: the session quantizes them")
        want = "float32"
    if want == "float32":
        if array.dtype.kind not in "fiub":
            raise UserError(f"input '{name}' has dtype {array.dtype}; expected float32")
        return array.astype(np.float32, copy=False)
    return integer_input(name, array, want)


def integer_input(name: str, array: np.ndarray, want: str) -> np.ndarray:
    """Integer data for the integer input `name` of dtype `want`: cast when the cast is
    same-kind (int32 indices for an int64 input) and keeps every value, else a UserError."""
    dtype = np.dtype(want)
    if array.dtype.kind not in "iub" or not np.can_cast(array.dtype, dtype, "same_kind"):
        raise UserError(f"input '{name}' has dtype {array.dtype}, expected {want}")
    cast = array.astype(dtype, copy=False)
    if not np.array_equal(cast, array):
        raise UserError(f"input '{name}' holds values that {want} cannot represent")
    return cast


def delivered(
    outputs: Shapes, types: dict[str, str], computed: dict, buffers: dict
) -> dict[str, np.ndarray]:
    """The outputs in their app types (float32, or an integer output's own dtype), also
    copied into the buffers the app set."""
    result = {}
    for name in outputs:
        want = "float32" if types[name] == QUANTIZED else types[name]
        result[name] = np.asarray(computed[name], want)
    for name, buffer in buffers.items():
        np.copyto(buffer, result[name], casting="same_kind")
    return result
