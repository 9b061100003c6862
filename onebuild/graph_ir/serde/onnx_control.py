"""ONNX control flow at import.

An `If` whose condition is known once shapes are fixed (or once inputs are pinned to
constants) is replaced by the branch it takes: exporters emit such `If`s for shape checks
(`if x.shape[-1] > 1024`), and for inputs that are constant in practice (a sample rate). The
branch's nodes are imported in place: they read outer-scope values by name, and the `If`'s
outputs become the branch's outputs.

An `If` whose condition depends on run-time data becomes an IR `If` node (`ops/control.py`):
each branch is imported into a graph of its own whose inputs are the outer values the branches
read (the node's inputs after the condition; outer constants are copied in and fold there).

`Loop` and `Scan` are unrolled (`onnx_loop`). `NonZero`'s output shape is the number of
nonzero elements: it is evaluated when its input is a constant and refused otherwise (onebuild
compiles static shapes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...errors import ModelError
from ..ir import Value
from ..ops.control import BRANCHES
from .onnx_context import pin_inputs_error
from .onnx_loop import unroll_loop, unroll_scan
from .onnx_ops import converter
from .onnx_subgraph import free_names, import_subgraph

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter


def import_if(importer: _GraphImporter, node: onnx.NodeProto) -> None:
    """Import the branch `node` takes if its condition is a compile-time constant, else the
    `If` as control flow."""
    name = node.name or (node.output[0] if node.output else "If")
    where = f"{importer.source}: node '{name}' (If)"
    condition = importer.values.get(node.input[0]) if node.input else None
    if condition is None:
        raise ModelError(f"{where}: reads '{node.input[0] if node.input else ''}', undefined")
    branches = {}
    for key in BRANCHES:
        branch = next((a.g for a in node.attribute if a.name == key), None)
        if branch is None:
            raise ModelError(f"{where}: has no {key}")
        if len(branch.output) != len(node.output):
            raise ModelError(
                f"{where}: its {key} has {len(branch.output)} outputs, the If {len(node.output)}"
            )
        branches[key] = branch
    if not condition.is_const:
        return _control_flow(importer, node, name, where, condition, branches)
    value = np.asarray(condition.numpy())
    if value.size != 1:
        raise ModelError(f"{where}: its condition has {value.size} elements; If needs one")
    taken = BRANCHES[0] if bool(value.reshape(-1)[0]) else BRANCHES[1]
    branch = branches[taken]
    for init in branch.initializer:
        importer.values[init.name] = importer.graph.add_constant(importer.tensor(init), init.name)
    for inner in importer._sorted_nodes(branch.node):
        importer._convert(inner)
    for output, info in zip(node.output, branch.output):
        if info.name not in importer.values:
            raise ModelError(f"{where}: its {taken} never produces '{info.name}'")
        if output:
            importer.values[output] = importer.values[info.name]


def _control_flow(
    importer: _GraphImporter,
    node: onnx.NodeProto,
    name: str,
    where: str,
    condition: Value,
    branches: dict[str, onnx.GraphProto],
) -> None:
    """An IR `If` node whose branches are imported as graphs of their own."""
    outer: dict[str, Value] = {}
    for read in sorted(set().union(*(free_names(b) for b in branches.values()))):
        if read not in importer.values:
            raise ModelError(f"{where}: its branches read '{read}', which nothing defines")
        outer[read] = importer.values[read]
    graphs = {
        key: import_subgraph(importer, branch, f"{name}.{key}", outer)
        for key, branch in branches.items()
    }
    captured = [v for v in outer.values() if not v.is_const]
    try:
        ir_node = importer.graph.make_node(
            "If", [condition, *captured], {k: graphs[k] for k in BRANCHES}, name=name
        )
    except ValueError as error:
        raise ModelError(f"{where}: {error}") from None
    for output, value in zip(node.output, ir_node.outputs):
        if output:
            importer.graph.rename(value, output)
            importer.values[output] = value


# ONNX ops with subgraphs, imported by the importer's own functions rather than by converters
WITH_SUBGRAPHS = {"If": import_if, "Loop": unroll_loop, "Scan": unroll_scan}


@converter("NonZero")
def non_zero(ctx):
    """Indices of the nonzero elements, [rank, count] int64: evaluated from a constant input."""
    value = ctx.input(0)
    if not value.is_const:
        subject = f"{ctx.importer.source}: node '{ctx.name}' (NonZero): its output shape (the "
        raise pin_inputs_error(
            value, subject + "number of nonzero elements)", "onebuild compiles static shapes"
        )
    return [ctx.constant(np.array(np.nonzero(value.numpy()), dtype=np.int64))]
