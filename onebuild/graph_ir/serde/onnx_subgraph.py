"""ONNX subgraphs (If branches, Loop bodies) imported as IR graphs of their own.

An ONNX subgraph reads values of the scopes around it by name; an IR subgraph reads nothing
but its inputs. The values a subgraph reads from outside become graph inputs (after the
subgraph's own ONNX inputs, if any), and outer constants are copied in, so they fold there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..ir import Graph, Value

if TYPE_CHECKING:
    from .onnx_import import _GraphImporter


def import_subgraph(
    importer: _GraphImporter,
    proto: onnx.GraphProto,
    name: str,
    outer: dict[str, Value],
    own_inputs: tuple[tuple[str, np.dtype, tuple[int, ...]], ...] = (),
) -> Graph:
    """`proto` as a graph whose inputs are `own_inputs` (name, dtype, shape), then one per
    non-constant value of `outer`; each outer constant it reads is copied in."""
    from .onnx_import import _GraphImporter

    child = _GraphImporter(proto, importer.opset, importer.source, importer.base_dir)
    child.graph = Graph(name)
    for input_name, dtype, shape in own_inputs:
        child.values[input_name] = child.graph.add_input(input_name, dtype, shape)
    reads = free_names(proto)
    for read, value in outer.items():
        if value.is_const:
            if read in reads:
                child.values[read] = child.graph.add_constant(value.const, read)
        else:
            child.values[read] = child.graph.add_input(read, value.dtype, value.shape)
    child._check_text()
    nodes = child._sorted_nodes()
    child._check_definitions(nodes)
    for init in proto.initializer:
        child.values[init.name] = child.graph.add_constant(importer.tensor(init), init.name)
    child.graph.reserve([o for n in nodes for o in n.output if o])
    child.graph.reserve(o.name for o in proto.output)
    for inner in nodes:
        child._convert(inner)
    child._set_outputs()
    return child.graph


def free_names(graph: onnx.GraphProto) -> set[str]:
    """Names `graph` (or any subgraph in it) reads but does not define: its outer-scope reads."""
    defined = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    defined |= {o for n in graph.node for o in n.output if o}
    read = {i for n in graph.node for i in n.input if i} | {o.name for o in graph.output}
    for n in graph.node:
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                read |= free_names(sub)
    return read - defined
