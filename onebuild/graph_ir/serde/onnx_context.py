"""What a converter sees of one ONNX node (`NodeContext`), and where a value comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from ...errors import DynamicValueError, ModelError
from ..ir import Graph, Value
from ..ops import OPS
from ..tensor import Tensor

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter


class NodeContext:
    """What a converter sees of one ONNX node: its inputs, attributes and an `emit` function."""

    def __init__(self, importer: _GraphImporter, node: onnx.NodeProto):
        self.importer = importer
        self.node = node
        self.op_type = node.op_type
        self.opset = importer.opset
        self.name = node.name or (node.output[0] if node.output else node.op_type)
        self.attrs = {a.name: a for a in node.attribute}
        self._created: set[int] = set()
        graph_values = importer.values
        self.inputs: list[Value | None] = []
        for name in node.input:
            if not name:
                self.inputs.append(None)
            elif name not in graph_values:
                raise ModelError(
                    f"{importer.source}: node '{self.name}' ({node.op_type}) reads '{name}', "
                    "which no node, input or initializer defines"
                )
            else:
                self.inputs.append(graph_values[name])

    @property
    def graph(self) -> Graph:
        return self.importer.graph

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def wants_output(self, index: int) -> bool:
        return index < len(self.node.output) and bool(self.node.output[index])

    def created(self, value: Value) -> bool:
        return id(value) in self._created

    def input(self, index: int) -> Value | None:
        return self.inputs[index] if index < len(self.inputs) else None

    def attr(self, name: str, default=None):
        proto = self.attrs.get(name)
        if proto is None:
            return default
        value = helper.get_attribute_value(proto)
        if isinstance(value, onnx.TensorProto):
            return self.importer.tensor(value).numpy()
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return [v.decode() for v in value]
        return value

    def const(self, index: int, what: str) -> np.ndarray | None:
        """The data of a constant input (None if omitted); shape operands must be constants."""
        value = self.input(index)
        if value is None:
            return None
        if not value.is_const:
            roots = graph_input_roots(value)
            raise DynamicValueError(
                f"{self.importer.source}: node '{self.name}' ({self.op_type}): {what} "
                f"'{value.name}' must be known at compile time, but it depends on graph "
                f"input(s) {', '.join(roots) or '?'}; fix them with input_shapes or freeze them",
                roots,
            )
        return value.numpy()

    def fail(self, message: str) -> ModelError:
        return ModelError(f"{self.importer.source}: node '{self.name}' ({self.op_type}): {message}")

    def constant(self, array: np.ndarray | Tensor) -> Value:
        value = self.graph.add_constant(array, self.node.output[0] if self.node.output else "c")
        self._created.add(id(value))
        return value

    def emit(
        self, op: str, inputs: Sequence[Value | None], attrs: dict | None = None, fold: bool = True
    ) -> list[Value]:
        """Add an IR node, or evaluate it at once when all its inputs are constants (unless
        `fold` is False)."""
        attrs = dict(attrs or {})
        present = [v for v in inputs if v is not None]
        if fold and present and all(v.is_const for v in present):
            arrays = [None if v is None else v.numpy() for v in inputs]
            results = OPS[op].kernel(attrs, *arrays)
            return [self.constant(np.asarray(r)) for r in results]
        try:
            node = self.graph.make_node(op, inputs, attrs, name=self.name)
        except ValueError as error:
            raise self.fail(str(error)) from None
        for value in node.outputs:
            self._created.add(id(value))
        return node.outputs


def graph_input_roots(value: Value) -> list[str]:
    """Names of the graph inputs a value is computed from."""
    seen, stack, roots = set(), [value], []
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.producer is None:
            if not v.is_const:
                roots.append(v.name)
        else:
            stack.extend(i for i in v.producer.inputs if i is not None)
    return sorted(roots)


def pin_inputs_error(value: Value, subject: str, because: str) -> DynamicValueError:
    """ "<subject> depends on the value of input(s) ...; <because>: pin those inputs to
    constants", naming the graph inputs `value` is computed from."""
    roots = graph_input_roots(value)
    return DynamicValueError(
        f"{subject} depends on the value of input(s) {', '.join(roots) or '?'}; {because}: pin "
        f"those inputs to constants (recipe: [import] constants = "
        f"{{ {roots[0] if roots else 'name'} = ... }})",
        roots,
    )
