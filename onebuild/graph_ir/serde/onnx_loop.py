"""ONNX `Loop` and `Scan` at import: unrolled when their iterations are known at compile time,
else (a Loop whose trip count or condition depends on data) an IR `Loop` (`ops/control.py`).

Unrolling imports the body once per iteration in place, binding its inputs to values of the
outer graph (Loop: iteration number, condition and loop-carried values; Scan: state values and
one slice of each scanned input); the body's nodes read outer-scope values by name as in the
main graph, and scan outputs are stacked along their axis. A Scan's length is a static dim, so
it always unrolls. A data-dependent Loop with scan outputs would give outputs of data-dependent
length: an error naming the inputs to pin (`[import] constants`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...errors import ModelError
from ..ir import Value
from .onnx_context import pin_inputs_error
from .onnx_subgraph import free_names, import_subgraph

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter

MAX_ITERATIONS = 1024  # unrolled copies of one Loop's body

# why a Loop's data-dependent operands must be pinned (a Loop without scan outputs runs as
# control flow; scan outputs are stacked per iteration, so their length must be known)
UNROLLED = "a Loop with scan outputs is unrolled at import (their length is its trip count)"


def unroll_loop(importer: _GraphImporter, node: onnx.NodeProto) -> None:
    """Import `node` as its body repeated once per iteration."""
    from .onnx_context import NodeContext

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
    scan_outputs = len(body.output) - 1 - len(carried)
    known = all(v is None or v.is_const for v in ctx.inputs[:2])
    if not scan_outputs and not (known and _condition_folds(importer, body)):
        return _control_flow(importer, ctx, node, body, carried, where)
    trips = _known(ctx, 0, "trip count", where)
    limit = MAX_ITERATIONS if trips is None else int(trips.reshape(-1)[0])
    if limit > MAX_ITERATIONS:
        raise ModelError(f"{where}: runs {limit} iterations; onebuild unrolls {MAX_ITERATIONS}")
    condition = _known(ctx, 1, "condition", where)
    going = True if condition is None else bool(condition.reshape(-1)[0])
    scans: list[list[Value]] = [[] for _ in body.output[1 + len(carried) :]]
    iteration = 0
    while going and iteration < limit:
        bound = [_scalar(importer, iteration, np.int64, body.input[0].name)]
        bound += [_scalar(importer, going, np.bool_, body.input[1].name), *carried]
        results = _import_body(importer, body, bound, where)
        going = _condition(results[0], where)
        carried = results[1 : 1 + len(carried)]
        for stack, value in zip(scans, results[1 + len(carried) :]):
            stack.append(value)
        iteration += 1
    if going and trips is None:
        raise ModelError(
            f"{where}: its condition still holds after {MAX_ITERATIONS} iterations; onebuild "
            "unrolls at most that many"
        )
    if scans and not iteration:
        raise ModelError(f"{where}: runs no iteration, its scan outputs have no known shape")
    outputs = list(carried) + [_stack(ctx, values, 0) for values in scans]
    for name, value in zip(node.output, outputs):
        if name:
            importer.values[name] = value


def _condition_folds(importer: _GraphImporter, body: onnx.GraphProto) -> bool:
    """Whether the body's condition output is computed from nothing but the iteration number,
    the incoming condition and constants (so it folds while unrolling)."""
    producers = {o: n for n in body.node for o in n.output if o}
    carried = {i.name for i in body.input[2:]}
    fixed = {i.name for i in body.input[:2]} | {t.name for t in body.initializer}
    stack, seen = [body.output[0].name], set()
    while stack:
        name = stack.pop()
        if name in seen or name in fixed:
            continue
        seen.add(name)
        node, outer = producers.get(name), importer.values.get(name)
        if name in carried or (node is None and outer is not None and not outer.is_const):
            return False
        if node is not None:
            stack.extend(i for i in node.input if i)
            graphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack.extend(n for g in graphs for n in free_names(g))
    return True


def _control_flow(
    importer: _GraphImporter, ctx, node: onnx.NodeProto, body, carried: list, where: str
) -> None:
    """An IR `Loop` node whose body is imported as a graph of its own."""
    outer: dict[str, Value] = {}
    for read in sorted(free_names(body)):
        if read not in importer.values:
            raise ModelError(f"{where}: its body reads '{read}', which nothing defines")
        outer[read] = importer.values[read]
    own = [(body.input[0].name, np.dtype(np.int64), ()), (body.input[1].name, np.dtype(bool), ())]
    own += [(info.name, v.dtype, v.shape) for info, v in zip(body.input[2:], carried)]
    graph = import_subgraph(importer, body, f"{ctx.name}.body", outer, tuple(own))
    trips = ctx.input(0) or _scalar(importer, np.iinfo(np.int64).max, np.int64, "no_trip_count")
    condition = ctx.input(1) or _scalar(importer, True, np.bool_, "no_condition")
    captured = [v for v in outer.values() if not v.is_const]
    try:
        loop = importer.graph.make_node(
            "Loop",
            [trips, condition, *carried, *captured],
            {"body": graph, "carried": len(carried)},
            name=ctx.name,
        )
    except ValueError as error:
        raise ModelError(f"{where}: {error}") from None
    for output, value in zip(node.output, loop.outputs):
        if output:
            importer.graph.rename(value, output)
            importer.values[output] = value


def unroll_scan(importer: _GraphImporter, node: onnx.NodeProto) -> None:
    """Import `node` as its body repeated once per slice of its scanned inputs."""
    from .onnx_context import NodeContext

    ctx = NodeContext(importer, node)
    where = f"{importer.source}: node '{ctx.name}' (Scan)"
    if importer.opset < 9:
        raise ModelError(f"{where}: Scan before opset 9 (batched, sequence_lens) is not supported")
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    count = int(ctx.attr("num_scan_inputs", 0))
    if body is None or not 0 < count <= len(ctx.inputs) or None in ctx.inputs:
        raise ModelError(f"{where}: needs a body, num_scan_inputs and every input")
    states, scanned = ctx.inputs[: len(ctx.inputs) - count], ctx.inputs[len(ctx.inputs) - count :]
    outs = len(body.output) - len(states)
    if len(body.input) != len(ctx.inputs) or outs < 0:
        raise ModelError(f"{where}: its body's inputs and outputs do not fit its inputs")
    axes = ctx.attr("scan_input_axes", [0] * count)
    in_axes = [int(a) % max(len(x.shape), 1) for a, x in zip(axes, scanned)]
    in_reverse = ctx.attr("scan_input_directions", [0] * count)
    lengths = {x.shape[axis] if x.shape else 0 for x, axis in zip(scanned, in_axes)}
    steps = lengths.pop()
    if lengths or not 0 < steps <= MAX_ITERATIONS:
        raise ModelError(
            f"{where}: scans {sorted({steps, *lengths})} steps; onebuild unrolls 1 to "
            f"{MAX_ITERATIONS} steps, the same for every scanned input"
        )
    stacks: list[list[Value]] = [[] for _ in range(outs)]
    for step in range(steps):
        slices = []
        for x, axis, back in zip(scanned, in_axes, in_reverse):
            index = _scalar(importer, steps - 1 - step if back else step, np.int64, "scan_index")
            slices.append(ctx.emit("Gather", [x, index], {"axis": axis})[0])
        results = _import_body(importer, body, [*states, *slices], where)
        states = results[: len(states)]
        for stack, value in zip(stacks, results[len(states) :]):
            stack.append(value)
    axes = ctx.attr("scan_output_axes", [0] * outs)
    reverse = ctx.attr("scan_output_directions", [0] * outs)
    outputs = list(states) + [
        _stack(ctx, stack[::-1] if back else stack, int(axis))
        for stack, axis, back in zip(stacks, axes, reverse)
    ]
    for name, value in zip(node.output, outputs):
        if name:
            importer.values[name] = value


def _scalar(importer: _GraphImporter, value, dtype, name: str) -> Value:
    return importer.graph.add_constant(np.array(value, dtype), name)


def _stack(ctx, values: list[Value], axis: int) -> Value:
    """`values` (of one type) stacked along a new `axis`."""
    axis %= len(values[0].shape) + 1
    shape = list(values[0].shape)
    rows = [
        ctx.emit("Reshape", [v], {"shape": [*shape[:axis], 1, *shape[axis:]]})[0] for v in values
    ]
    return ctx.emit("Concat", rows, {"axis": axis})[0] if len(rows) > 1 else rows[0]


def _known(ctx, index: int, what: str, where: str) -> np.ndarray | None:
    """A Loop operand that must be a compile-time constant (None if omitted)."""
    value = ctx.input(index)
    if value is None:
        return None
    if not value.is_const:
        raise pin_inputs_error(value, f"{where}: its {what}", UNROLLED)
    return np.asarray(value.numpy())


def _condition(value: Value, where: str) -> bool:
    if not value.is_const:
        raise pin_inputs_error(value, f"{where}: whether it continues", UNROLLED)
    return bool(np.asarray(value.numpy()).reshape(-1)[0])


def _import_body(
    importer: _GraphImporter, body: onnx.GraphProto, bound: list[Value], where: str
) -> list[Value]:
    """Import one copy of `body` whose inputs are `bound`; returns its outputs' values."""
    outer = importer.values
    importer.values = dict(outer)  # the body's names are bound for this iteration only
    try:
        importer.values.update({info.name: v for info, v in zip(body.input, bound)})
        for init in body.initializer:
            tensor = importer.tensor(init)
            importer.values[init.name] = importer.graph.add_constant(tensor, init.name)
        for inner in importer._sorted_nodes(body.node):
            importer._convert(inner)
        missing = [o.name for o in body.output if o.name not in importer.values]
        if missing:
            raise ModelError(f"{where}: its body never produces '{missing[0]}'")
        return [importer.values[o.name] for o in body.output]
    finally:
        importer.values = outer
