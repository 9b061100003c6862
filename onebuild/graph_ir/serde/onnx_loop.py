"""ONNX `Loop` at import, unrolled: its trip count and its condition must be known at compile
time (constants, shapes, or inputs pinned with `[import] constants`).

Each iteration imports the body in place, binding its inputs (iteration number, condition,
loop-carried values) to the values of the previous iteration; the body's nodes read outer-scope
values by name as in the main graph. Scan outputs are stacked along a new axis 0. A condition
that depends on run-time data (a `while` loop over data) is an error naming the inputs it
depends on; `Loop` is not run as control flow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...errors import DynamicValueError, ModelError
from ..ir import Value

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter

MAX_ITERATIONS = 1024  # unrolled copies of one Loop's body


def unroll_loop(importer: _GraphImporter, node: onnx.NodeProto) -> None:
    """Import `node` as its body repeated once per iteration."""
    from .onnx_import import NodeContext

    ctx = NodeContext(importer, node)
    where = f"{importer.source}: node '{ctx.name}' (Loop)"
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        raise ModelError(f"{where}: has no body")
    carried = ctx.inputs[2:]
    if len(body.input) != 2 + len(carried) or len(body.output) < 1 + len(carried):
        raise ModelError(
            f"{where}: its body takes {len(body.input)} inputs and gives {len(body.output)} "
            f"outputs; a Loop with {len(carried)} carried values needs {2 + len(carried)} and "
            f"at least {1 + len(carried)}"
        )
    trips = _known(ctx, 0, "trip count", where)
    limit = MAX_ITERATIONS if trips is None else int(trips.reshape(-1)[0])
    if limit > MAX_ITERATIONS:
        raise ModelError(f"{where}: runs {limit} iterations; onebuild unrolls at most "
                         f"{MAX_ITERATIONS}")  # fmt: skip
    condition = _known(ctx, 1, "condition", where)
    going = True if condition is None else bool(condition.reshape(-1)[0])
    scans: list[list[Value]] = [[] for _ in body.output[1 + len(carried) :]]
    iteration = 0
    while going and iteration < limit:
        results = _iterate(importer, body, iteration, going, carried, where)
        going = _condition(results[0], where)
        carried = results[1 : 1 + len(carried)]
        for stack, value in zip(scans, results[1 + len(carried) :]):
            stack.append(value)
        iteration += 1
    if going and trips is None:
        raise ModelError(f"{where}: its condition still holds after {MAX_ITERATIONS} "
                         "iterations; onebuild unrolls at most that many")  # fmt: skip
    outputs = list(carried)
    for stack in scans:
        if not stack:
            raise ModelError(f"{where}: runs no iteration, its scan outputs have no known shape")
        rows = [ctx.emit("Reshape", [v], {"shape": [1, *v.shape]})[0] for v in stack]
        outputs.append(ctx.emit("Concat", rows, {"axis": 0})[0] if len(rows) > 1 else rows[0])
    for name, value in zip(node.output, outputs):
        if name:
            importer.values[name] = value


def _known(ctx, index: int, what: str, where: str) -> np.ndarray | None:
    """A Loop operand that must be a compile-time constant (None if omitted)."""
    value = ctx.input(index)
    if value is None:
        return None
    if not value.is_const:
        from .onnx_import import _graph_input_roots

        roots = _graph_input_roots(value)
        raise DynamicValueError(
            f"{where}: its {what} depends on the value of input(s) {', '.join(roots) or '?'}; "
            "Loop is unrolled at import: pin those inputs to constants (recipe: [import] "
            f"constants = {{ {roots[0] if roots else 'name'} = ... }})",
            roots,
        )
    return np.asarray(value.numpy())


def _condition(value: Value, where: str) -> bool:
    if not value.is_const:
        from .onnx_import import _graph_input_roots

        roots = _graph_input_roots(value)
        raise DynamicValueError(
            f"{where}: whether it continues depends on the value of input(s) "
            f"{', '.join(roots) or '?'}; Loop is unrolled at import: pin those inputs to "
            f"constants (recipe: [import] constants = {{ {roots[0] if roots else 'name'} = ... }})",
            roots,
        )
    return bool(np.asarray(value.numpy()).reshape(-1)[0])


def _iterate(
    importer: _GraphImporter,
    body: onnx.GraphProto,
    iteration: int,
    going: bool,
    carried: list[Value],
    where: str,
) -> list[Value]:
    """Import one copy of `body`; returns the values of its outputs."""
    outer = importer.values
    importer.values = dict(outer)  # the body's names are bound for this iteration only
    try:
        graph = importer.graph
        first, second, *rest = body.input
        importer.values[first.name] = graph.add_constant(np.array(iteration, np.int64), first.name)
        importer.values[second.name] = graph.add_constant(np.array(going), second.name)
        importer.values.update({info.name: v for info, v in zip(rest, carried)})
        for init in body.initializer:
            importer.values[init.name] = graph.add_constant(importer.tensor(init), init.name)
        for inner in importer._sorted_nodes(body.node):
            importer._convert(inner)
        missing = [o.name for o in body.output if o.name not in importer.values]
        if missing:
            raise ModelError(f"{where}: its body never produces '{missing[0]}'")
        return [importer.values[o.name] for o in body.output]
    finally:
        importer.values = outer
