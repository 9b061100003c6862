"""The graph IR: `Value`, `Node`, `Graph` and `Model`.

Use-def links are maintained by the IR itself: a `Node` records itself in the `uses` of each of
its inputs when it is created or an input is replaced, and removes itself when it is removed.
Passes never edit use lists by hand.
"""

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import IRError
from .ops import OPS, TensorType
from .tensor import QuantParams, Tensor


class Value:
    """A tensor in the graph: a graph input, a constant, or the output of one node."""

    __slots__ = ("const", "dtype", "graph", "name", "producer", "quant", "shape", "uses")

    def __init__(
        self,
        name: str,
        dtype: np.dtype,
        shape: tuple[int, ...],
        const: Tensor | None = None,
        quant: QuantParams | None = None,
    ):
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.const = const
        self.quant = quant
        self.producer: Node | None = None
        self.uses: list[tuple[Node, int]] = []
        self.graph: Graph | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def users(self) -> list["Node"]:
        """Nodes that read this value, each once, in use order."""
        return list(dict.fromkeys(node for node, _ in self.uses))

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """The data of a constant value."""
        if self.const is None:
            raise IRError(f"value '{self.name}' is not a constant")
        return self.const.numpy()

    def replace_all_uses_with(self, other: "Value") -> None:
        """Make every reader of this value read `other` instead (graph outputs included)."""
        for node, index in list(self.uses):
            node.set_input(index, other)
        if self.graph is not None:
            self.graph.outputs = [other if v is self else v for v in self.graph.outputs]

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"%{self.name}: {kind}{self.dtype}{list(self.shape)}"


class Node:
    """One operation. Inputs may be None for omitted optional inputs."""

    __slots__ = ("_inputs", "attrs", "graph", "name", "op", "outputs")

    def __init__(
        self,
        op: str,
        inputs: Sequence[Value | None],
        outputs: Sequence[Value],
        attrs: dict[str, Any] | None = None,
        name: str = "",
    ):
        self.op = op
        self.name = name
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.graph: Graph | None = None
        self._inputs: list[Value | None] = list(inputs)
        for index, value in enumerate(self._inputs):
            if value is not None:
                value.uses.append((self, index))
        self.outputs: list[Value] = list(outputs)
        for value in self.outputs:
            if value.producer is not None:
                raise IRError(f"value '{value.name}' already has producer '{value.producer.name}'")
            value.producer = self

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def output(self) -> Value:
        """The single output of a one-output node."""
        if len(self.outputs) != 1:
            raise IRError(f"node '{self.name}' ({self.op}) has {len(self.outputs)} outputs")
        return self.outputs[0]

    @property
    def subgraphs(self) -> list["Graph"]:
        """The IR graphs held in this node's attributes (control flow), else empty."""
        opdef = OPS.get(self.op)
        return [self.attrs[key] for key in (opdef.subgraphs if opdef else ()) if key in self.attrs]

    def set_input(self, index: int, value: Value | None) -> None:
        old = self._inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        self._inputs[index] = value
        if value is not None:
            value.uses.append((self, index))

    def detach(self) -> None:
        """Drop this node's uses of its inputs (before removal)."""
        for index, value in enumerate(self._inputs):
            if value is not None:
                value.uses.remove((self, index))
        self._inputs = [None] * len(self._inputs)

    def input_types(self) -> list[TensorType | None]:
        return [None if v is None else v.type for v in self._inputs]

    def __repr__(self) -> str:
        ins = ", ".join("None" if v is None else f"%{v.name}" for v in self._inputs)
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        return f"{outs} = {self.op}[{self.name}]({ins}) {self.attrs or ''}".rstrip()


def _fresh(base: str, taken: set[str]) -> str:
    name, counter = base, 0
    while name in taken:
        counter += 1
        name = f"{base}_{counter}"
    return name


class Graph:
    """An ordered list of nodes (always topologically sorted), with inputs, outputs, constants."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, Value] = {}
        self._names: set[str] = set()
        self._reserved: set[str] = set()
        self._node_names: set[str] = set()

    # -- names -------------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """`base` if no value of the graph has that name yet, else `base_1`, `base_2`, ..."""
        return _fresh(base, self._names)

    def _unique_node_name(self, base: str) -> str:
        return _fresh(base, self._node_names)

    def _own(self, value: Value) -> Value:
        if value.graph is not None and value.graph is not self:
            raise IRError(f"value '{value.name}' belongs to graph '{value.graph.name}'")
        if value.graph is None:
            value.name = self.unique_name(value.name)
            self._names.add(value.name)
            value.graph = self
        return value

    def rename_node(self, node: "Node", name: str) -> None:
        """Give `node` a new name (made unique among the graph's node names)."""
        self._node_names.discard(node.name)
        node.name = self._unique_node_name(name)
        self._node_names.add(node.name)

    def reserve(self, names: Iterable[str]) -> None:
        """Keep `names` free: values created meanwhile get `name_1`, ... instead, until `rename`
        gives a reserved name to its value. An importer reserves the tensor names of its source
        model, so values made while decomposing one node never take another tensor's name."""
        fresh = set(names) - self._names
        self._reserved |= fresh
        self._names |= fresh

    def rename(self, value: Value, name: str) -> None:
        """Give `value` a new name (made unique within the graph; a reserved name exactly)."""
        self._names.discard(value.name)
        if name in self._reserved:
            self._reserved.discard(name)
            self._names.discard(name)
        value.name = self.unique_name(name)
        self._names.add(value.name)
        if value.is_const:
            self.constants = {v.name: v for v in self.constants.values()}

    # -- construction ------------------------------------------------------------------------
    def add_input(self, name: str, dtype: np.dtype, shape: Sequence[int]) -> Value:
        value = self._own(Value(name, dtype, tuple(shape)))
        self.inputs.append(value)
        return value

    def add_constant(self, array: np.ndarray | Tensor, name: str = "const") -> Value:
        tensor = array if isinstance(array, Tensor) else Tensor(np.asarray(array))
        value = self._own(Value(name, tensor.dtype, tensor.shape, const=tensor))
        self.constants[value.name] = value
        return value

    def make_node(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
        output_names: Sequence[str] | None = None,
        before: Node | None = None,
    ) -> Node:
        """Create a node, infer its output types, and insert it (at the end, or before `before`)."""
        attrs = dict(attrs or {})
        opdef = OPS.get(op)
        if opdef is None:
            raise IRError(f"unknown IR op '{op}'")
        for value in inputs:
            if value is not None and value.graph is not self:
                raise IRError(
                    f"input '{value.name}' of new {op} node is not in graph '{self.name}'"
                )
        types = opdef.infer(attrs, [None if v is None else v.type for v in inputs])
        base = name or op.lower()
        names = list(output_names or [f"{base}_out{i}" if i else base for i in range(len(types))])
        outputs = [self._own(Value(n, t.dtype, t.shape)) for n, t in zip(names, types)]
        node = Node(op, inputs, outputs, attrs, self._unique_node_name(base))
        node.graph = self
        self._node_names.add(node.name)
        if before is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(before), node)
        return node

    # -- mutation ----------------------------------------------------------------------------
    def remove(self, node: Node, safe: bool = True) -> None:
        """Remove a node; with `safe`, refuse while its outputs are still read or are outputs."""
        if safe:
            for value in node.outputs:
                readers = [n.name for n in value.users]
                if readers:
                    raise IRError(
                        f"cannot remove node '{node.name}': output '{value.name}' is read by "
                        f"{', '.join(readers)}"
                    )
                if value in self.outputs:
                    raise IRError(
                        f"cannot remove node '{node.name}': '{value.name}' is a graph output"
                    )
        node.detach()
        self.nodes.remove(node)
        self._node_names.discard(node.name)
        for value in node.outputs:
            self._names.discard(value.name)
            value.graph = None
        node.graph = None

    def remove_constant(self, value: Value) -> None:
        if value.uses or value in self.outputs:
            raise IRError(f"constant '{value.name}' is still in use")
        del self.constants[value.name]
        self._names.discard(value.name)
        value.graph = None

    def sort(self) -> None:
        """Stable topological sort; raises IRError naming a node on a cycle."""
        position = {id(node): i for i, node in enumerate(self.nodes)}
        pending = {
            id(node): len({id(v.producer) for v in node.inputs if v is not None and v.producer})
            for node in self.nodes
        }
        ready = [(position[id(n)], n) for n in self.nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, node = heapq.heappop(ready)
            order.append(node)
            for user in {id(u): u for v in node.outputs for u in v.users}.values():
                pending[id(user)] -= 1
                if pending[id(user)] == 0:
                    heapq.heappush(ready, (position[id(user)], user))
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if pending[id(n)] > 0)
            raise IRError(
                f"graph '{self.name}' has a cycle through node '{stuck.name}' ({stuck.op})"
            )
        self.nodes = order

    # -- queries -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"<Graph '{self.name}': {len(self.nodes)} nodes>"

    def __iter__(self) -> Iterator[Node]:
        """Iterate over a snapshot of the nodes, so passes may remove nodes while iterating."""
        return iter(list(self.nodes))


def node_alone(node: Node) -> Graph:
    """A graph of `node` alone: its computed inputs become graph inputs, its constants are
    copied, and every value keeps its dtype, name and quantization parameters."""
    graph = Graph(node.name)
    inputs = []
    for value in node.inputs:
        if value.is_const:
            new = graph.add_constant(value.const, value.name)
        else:
            new = graph.add_input(value.name, value.dtype, value.shape)
        new.quant = value.quant
        inputs.append(new)
    copy = graph.make_node(node.op, inputs, node.attrs, node.name, [node.output.name])
    copy.output.quant = node.output.quant
    graph.outputs = [copy.output]
    return graph


@dataclass
class Model:
    """Subgraphs (0 is the main one, as in circle/tflite) plus model-level metadata."""

    graphs: list[Graph]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def main(self) -> Graph:
        return self.graphs[0]
