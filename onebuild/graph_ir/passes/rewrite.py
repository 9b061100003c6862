"""Small graph rewrites shared by passes."""

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
