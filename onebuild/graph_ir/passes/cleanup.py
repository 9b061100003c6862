"""Identity/Dropout removal and dead-code elimination."""

from ..ir import Graph
from .rewrite import can_replace, replace_node


def remove_identities(graph: Graph) -> bool:
    """Remove Identity and inference-mode Dropout nodes (reads go to their input)."""
    modified = False
    for node in graph:
        if node.op not in ("Identity", "Dropout") or len(node.outputs) != 1:
            continue
        source = node.inputs[0]
        if can_replace(graph, node.output, source):
            replace_node(graph, node, [source])
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
