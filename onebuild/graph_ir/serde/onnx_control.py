"""ONNX control flow at import: an `If` whose condition is known once shapes are fixed (or once
inputs are pinned to constants) is replaced by the branch it takes.

Exporters emit such `If`s for shape checks (`if x.shape[-1] > 1024`), and for inputs that are
constant in practice (a sample rate); the condition folds like any shape-computing subgraph. A
condition that depends on run-time data is an error naming the inputs it depends on and how to
pin them. The branch's nodes are imported in place: they read outer-scope values by name, and
the `If`'s outputs become the branch's outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...errors import DynamicValueError, ModelError

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter


def fold_if(importer: _GraphImporter, node: onnx.NodeProto) -> None:
    """Import the branch `node` takes; its condition must be a compile-time constant."""
    name = node.name or (node.output[0] if node.output else "If")
    where = f"{importer.source}: node '{name}' (If)"
    condition = importer.values.get(node.input[0]) if node.input else None
    if condition is None:
        raise ModelError(f"{where}: reads '{node.input[0] if node.input else ''}', undefined")
    if not condition.is_const:
        from .onnx_import import _graph_input_roots

        roots = _graph_input_roots(condition)
        raise DynamicValueError(
            f"{where}: its condition depends on the value of input(s) {', '.join(roots) or '?'}; "
            "control flow that depends on data is not supported: pin those inputs to constants "
            f"(recipe: [import] constants = {{ {roots[0] if roots else 'name'} = ... }}) to "
            "fold it",
            roots,
        )
    value = np.asarray(condition.numpy())
    if value.size != 1:
        raise ModelError(f"{where}: its condition has {value.size} elements; If needs one")
    taken = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == taken), None)
    if branch is None:
        raise ModelError(f"{where}: has no {taken}")
    if len(branch.output) != len(node.output):
        raise ModelError(
            f"{where}: its {taken} has {len(branch.output)} outputs, the If {len(node.output)}"
        )
    for init in branch.initializer:
        importer.values[init.name] = importer.graph.add_constant(importer.tensor(init), init.name)
    for inner in importer._sorted_nodes(branch.node):
        importer._convert(inner)
    for output, info in zip(node.output, branch.output):
        if info.name not in importer.values:
            raise ModelError(f"{where}: its {taken} never produces '{info.name}'")
        if output:
            importer.values[output] = importer.values[info.name]
