"""Small graph rewrites shared by passes."""

import numpy as np

from ..ir import Graph, Node, Value


def replace_node(graph: Graph, node: Node, replacements: list[Value]) -> None:
    """Remove `node`, redirecting each output to its replacement.

    Graph outputs keep their names: a replacement that is a fresh node output or a constant takes
    over the old name. Callers check `can_replace` first where the replacement could be a graph
    input or already another graph output.
    """
    names = [v.name for v in node.outputs]
    for old, new in zip(node.outputs, replacements):
        old.replace_all_uses_with(new)
    graph.remove(node)
    for name, new in zip(names, replacements):
        if new in graph.outputs and new.name != name and _renamable(graph, new):
            graph.rename(new, name)


def _renamable(graph: Graph, value: Value) -> bool:
    return value not in graph.inputs


def can_replace(graph: Graph, old: Value, new: Value) -> bool:
    """Whether `old` can be replaced by `new` without losing a graph output's identity."""
    if old not in graph.outputs:
        return True
    return new not in graph.inputs and new not in graph.outputs


def single_reader(value: Value) -> Node | None:
    """The only node reading `value` (once), if `value` is not also a graph output."""
    graph = value.graph
    if len(value.uses) != 1 or (graph is not None and value in graph.outputs):
        return None
    return value.uses[0][0]


def scalar(value: Value | None) -> float | None:
    """The number held by a one-element floating-point constant."""
    if value is None or not value.is_const or value.size != 1:
        return None
    if not np.issubdtype(value.dtype, np.floating):
        return None
    return float(value.numpy().reshape(-1)[0])


def single(value: Value) -> bool:
    """Whether `value` is read by one node only and is not a graph output."""
    graph = value.graph
    return len(value.users) == 1 and (graph is None or value not in graph.outputs)


def made_by(value: Value, ops: str | tuple[str, ...]) -> Node | None:
    """The node producing `value` when its op is one of `ops` and it carries no fused clip."""
    node = value.producer
    ops = (ops,) if isinstance(ops, str) else ops
    if node is None or node.op not in ops or "clip" in node.attrs or len(node.outputs) != 1:
        return None
    return node


def replace_with(graph: Graph, nodes, last: Node, op: str, inputs, attrs) -> Node:
    """A new `op` node computing `last`'s output (named after it); `nodes` go when unread."""
    name = last.output.name
    fused = graph.make_node(op, inputs, attrs, name=name, before=last)
    replace_node(graph, last, [fused.output])
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for node in sorted(nodes, key=lambda n: -position.get(id(n), -1)):
        if node.graph is not None and not any(v.uses for v in node.outputs):
            graph.remove(node)
    if fused.output.name != name and fused.output not in graph.outputs:
        graph.rename(fused.output, name)
    return fused
