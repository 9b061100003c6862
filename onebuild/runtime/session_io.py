"""The Session's I/O rules: tensors by index or name, float32 feeds of the model's shapes, and
outputs copied into the app's buffers."""

import numpy as np

from ..errors import UserError
from ..graph_ir.interpreter import check_feeds
from ..graph_ir.ir import Graph

Shapes = dict[str, tuple[int, ...]]


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


def checked_feeds(inputs: Shapes, given: dict, float_graph: Graph | None) -> dict[str, np.ndarray]:
    """Every input, of its shape, as float32 (values checked against the float model)."""
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
        if array.dtype.kind not in "fiub":
            raise UserError(f"input '{name}' has dtype {array.dtype}; expected float32")
        feeds[name] = array.astype(np.float32, copy=False)
    if float_graph is not None:
        check_feeds(float_graph, feeds, batched=False)
    return {name: feeds[name] for name in inputs}


def delivered(outputs: Shapes, computed: dict, buffers: dict) -> dict[str, np.ndarray]:
    """The outputs as float32, also copied into the buffers the app set."""
    result = {name: np.asarray(computed[name], np.float32) for name in outputs}
    for name, buffer in buffers.items():
        np.copyto(buffer, result[name], casting="same_kind")
    return result
