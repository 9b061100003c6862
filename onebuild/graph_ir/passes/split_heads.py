"""Slices of a Transpose that moves the batch axis, taken before it (attention's q/k/v split).

Exporters split a fused q/k/v projection [1, T, 3, H, D] by a Transpose that brings the "3"
axis first ([3, 1, H, T, D]) and Slices of one index along it. Slicing the Transpose's input
on that axis instead, then transposing, gives the same values; the two moved axes then both
have size 1, so the Transpose may keep the batch axis first (moving a size-1 axis moves no
element): the graph keeps samples apart on axis 0, so it runs batches and the NPU takes the
Transposes.
"""

from ..ir import Graph, Node
from .rewrite import replace_node


def _one_index_on_axis_0(node: Node, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, stop) of a Slice taking one index of axis 0 and every other axis whole."""
    if node.op != "Slice":
        return None
    ranges = [
        slice(s, e, st).indices(d)
        for s, e, st, d in zip(node.attrs["starts"], node.attrs["ends"], node.attrs["steps"], shape)
    ]
    (start, stop, step), rest = ranges[0], ranges[1:]
    whole = all(r == (0, d, 1) for r, d in zip(rest, shape[1:]))
    return (start, stop) if step == 1 and stop == start + 1 and whole else None


def slice_before_transpose(graph: Graph) -> bool:
    """Rewrite Slice(Transpose(x, perm)) with perm[0] != 0, x [1, ...], and every reader of the
    Transpose such a one-index Slice, as Transpose(Slice(x on axis perm[0]), perm') with
    perm' keeping axis 0 first."""
    modified = False
    for transpose in list(graph.nodes):
        if transpose.op != "Transpose" or transpose.graph is None:
            continue
        perm, x, y = transpose.attrs["perm"], transpose.inputs[0], transpose.output
        if perm[0] == 0 or not x.shape or x.shape[0] != 1 or y in graph.outputs:
            continue
        slices = [(s, _one_index_on_axis_0(s, y.shape)) for s in y.users]
        if not slices or any(r is None or len(s.inputs) != 1 for s, r in slices):
            continue
        axis, moved = perm[0], perm.index(0)
        kept = [0 if i == 0 else axis if i == moved else p for i, p in enumerate(perm)]
        for node, (start, stop) in slices:
            starts = [start if i == axis else 0 for i in range(len(x.shape))]
            ends = [stop if i == axis else d for i, d in enumerate(x.shape)]
            attrs = {"starts": starts, "ends": ends, "steps": [1] * len(x.shape)}
            part = graph.make_node("Slice", [x], attrs, f"{node.name}/first", before=node)
            moved_node = graph.make_node(
                "Transpose", [part.output], {"perm": kept}, f"{node.name}/then", before=node
            )
            part.output.quant, moved_node.output.quant = x.quant, node.output.quant  # imported
            replace_node(graph, node, [moved_node.output])
        graph.remove(transpose)
        modified = True
    return modified
