"""Validation of what an ONNX model states, before it is converted.

Two kinds of knowledge, one helper each:

- the node's signature, from the ONNX operator schema of the model's opset: how many inputs,
  which must be present, which attributes are required and what type each has (`signature`);
- value rules of attributes and operands the converters apply (`positive`, `non_negative`,
  `axis_in`, `indices_in`): a stride of 0, a negative pad or an index past the end.

Each raises ValueError with a one-line message; the importer prefixes it with the file and the
node (`<file>: node '<name>' (<op>): ...`), so every bad input names where it is.
"""

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import defs, helper

_TYPE_NAMES = {
    int(value): name.lower()
    for name, value in onnx.AttributeProto.AttributeType.items()
    if name != "UNDEFINED"
}
_SINGLE = defs.OpSchema.FormalParameterOption.Single
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic


def _schema(node: onnx.NodeProto, opset: int) -> defs.OpSchema | None:
    if node.domain not in ("", "ai.onnx"):  # onnxruntime's contrib ops: their converters check
        return None
    try:
        return defs.get_schema(node.op_type, opset, "")
    except defs.SchemaError:
        return None


def signature(node: onnx.NodeProto, opset: int) -> None:
    """Inputs and attributes as the operator schema of `opset` defines them."""
    schema = _schema(node, opset)
    if schema is None:
        return
    count = len(node.input)
    if count < schema.min_input or count > schema.max_input:
        bounds = (
            f"{schema.min_input}"
            if schema.min_input == schema.max_input
            else f"{schema.min_input} to {schema.max_input}"
        )
        raise ValueError(f"has {count} inputs, the operator takes {bounds}")
    for index, formal in enumerate(schema.inputs):
        if formal.option == _VARIADIC:
            if any(not name for name in node.input[index:]):
                raise ValueError(f"input {index} ('{formal.name}') must not be empty")
        elif formal.option == _SINGLE and index < count and not node.input[index]:
            raise ValueError(f"input {index} ('{formal.name}') is required but empty")
    given = {a.name: a for a in node.attribute}
    for attr in node.attribute:
        if attr.type not in _TYPE_NAMES:
            raise ValueError(f"attribute '{attr.name}' has no valid type")
    for name, formal in schema.attributes.items():
        attr = given.get(name)
        if attr is None:
            if formal.required:
                raise ValueError(f"attribute '{name}' is required")
            continue
        want = int(formal.type)
        if attr.type != want:
            got = _TYPE_NAMES.get(attr.type, "untyped")
            want_name = _TYPE_NAMES[want]
            raise ValueError(f"attribute '{name}' is {got}, the operator expects {want_name}")


def _type_string(dtype: np.dtype) -> str | None:
    """ONNX's name of an element type ("float", "int64", ...), None if it has none."""
    try:
        return onnx.TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(dtype)).lower()
    except (KeyError, TypeError, ValueError):
        return None


def input_types(node: onnx.NodeProto, opset: int, dtypes: Sequence[np.dtype | None]) -> None:
    """Element types of the inputs as the schema's type constraints allow: each in its allowed
    set, and inputs sharing a type parameter of one type (Add(float, int64) is not an Add)."""
    schema = _schema(node, opset)
    if schema is None or not schema.inputs:
        return
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[str, int]] = {}
    for index, dtype in enumerate(dtypes):
        formal = schema.inputs[min(index, len(schema.inputs) - 1)]
        if index >= len(schema.inputs) and formal.option != _VARIADIC:
            break
        name = None if dtype is None else _type_string(dtype)
        types = allowed.get(formal.type_str, {formal.type_str})
        if name is None or not all(t.startswith("tensor(") for t in types):
            continue
        if f"tensor({name})" not in types:
            names = sorted(t[7:-1] for t in types)
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            where = f"input {index} ('{formal.name}')"
            raise ValueError(f"{where} is {name}; the operator takes {shown}")
        if formal.type_str in allowed and (formal.option != _VARIADIC or formal.is_homogeneous):
            first, at = bound.setdefault(formal.type_str, (name, index))
            if first != name:
                raise ValueError(
                    f"inputs {at} and {index} must have one type ({formal.type_str}), "
                    f"not {first} and {name}"
                )


def positive(name: str, values: Iterable[int], count: int | None = None) -> list[int]:
    """Values that must all be at least 1 (strides, dilations, kernel sizes, block sizes)."""
    values = _length(name, values, count)
    if any(v < 1 for v in values):
        raise ValueError(f"{name} {values} must be positive")
    return values


def non_negative(name: str, values: Iterable[int], count: int | None = None) -> list[int]:
    values = _length(name, values, count)
    if any(v < 0 for v in values):
        raise ValueError(f"{name} {values} must not be negative")
    return values


def _length(name: str, values: Iterable[int], count: int | None) -> list[int]:
    values = [int(v) for v in values]
    if count is not None and len(values) != count:
        raise ValueError(f"{name} {values} has {len(values)} values, expected {count}")
    return values


def axis_in(axis: int, rank: int, name: str = "axis", inclusive: bool = False) -> int:
    """`axis` in [-rank, rank) (or [-rank, rank] with `inclusive`), made non-negative."""
    top = rank + 1 if inclusive else rank
    if not -rank <= axis < top:
        span = f"[{-rank}, {top - 1}]"
        raise ValueError(f"{name} {axis} is out of range {span} for rank {rank}")
    return axis + rank if axis < 0 else axis


def indices_in(indices: np.ndarray, size: int, what: str) -> None:
    """Constant indices into an axis of `size` (negative ones count from the end)."""
    if indices.size and (indices.min() < -size or indices.max() >= size):
        bad = indices[(indices < -size) | (indices >= size)].reshape(-1)[0]
        raise ValueError(f"{what} {int(bad)} is out of range [{-size}, {size - 1}]")


MAX_ELEMENTS = 1 << 40  # more elements than any model's tensor can have


def dims(proto_dims: Iterable[int], what: str) -> tuple[int, ...]:
    """The dims of a stored or computed tensor: none negative, a plausible element count."""
    shape = tuple(int(d) for d in proto_dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"{what} has negative dims {list(shape)}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"{what} has absurd dims {list(shape)}")
    return shape


def external_data(info: Mapping[str, str], what: str) -> tuple[str, int, int | None]:
    """(location, offset, length or None) of an external-data reference."""
    location = info.get("location", "")
    if "\0" in location:
        raise ValueError(f"{what} has an invalid external data location {location!r}")
    numbers = []
    for key in ("offset", "length"):
        text = info.get(key)
        if text is None:
            numbers.append(None)
            continue
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"{what} has external data {key} {text!r}, not a byte count")
        numbers.append(int(text))
    return location, numbers[0] or 0, numbers[1]
