"""Identity/Dropout removal and dead-code elimination."""

from ..ir import Graph
from .rewrite import can_replace, replace_node


def remove_identities(graph: Graph) -> bool:
    """Remove Identity and inference-mode Dropout nodes (reads go to their input).

    A Dropout whose mask output is read stays.
    """
    modified = False
    for node in graph:
        if node.op not in ("Identity", "Dropout"):
            continue
        result, *mask = node.outputs
        if mask and (mask[0].uses or mask[0] in graph.outputs):
            continue
        source = node.inputs[0]
        if can_replace(graph, result, source):
            replace_node(graph, node, [source] * len(node.outputs))
            modified = True
    return modified


def eliminate_dead_code(graph: Graph) -> bool:
    """Remove nodes whose outputs nobody reads, then constants nobody reads."""
    modified = False
    outputs = {id(v) for v in graph.outputs}
    for node in reversed(graph.nodes):
        if all(not v.uses and id(v) not in outputs for v in node.outputs):
            graph.remove(node)
            modified = True
    for value in list(graph.constants.values()):
        if not value.uses and id(value) not in outputs:
            graph.remove_constant(value)
            modified = True
    return modified
