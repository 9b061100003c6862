"""Constant folding: evaluate nodes whose inputs are all constants."""

import numpy as np

from ..ir import Graph
from ..ops import OPS
from .rewrite import replace_node

# Outputs larger than this stay computed at run time rather than stored in the model.
MAX_FOLDED_ELEMENTS = 1 << 24


def fold_constants(graph: Graph) -> bool:
    modified = False
    for node in graph:
        inputs = [v for v in node.inputs if v is not None]
        if not inputs or not all(v.is_const for v in inputs):
            continue
        if sum(v.size for v in node.outputs) > MAX_FOLDED_ELEMENTS:
            continue
        arrays = [None if v is None else v.numpy() for v in node.inputs]
        results = OPS[node.op].kernel(node.attrs, *arrays)
        constants = [
            graph.add_constant(np.asarray(r).astype(v.dtype, copy=False), v.name)
            for r, v in zip(results, node.outputs)
        ]
        replace_node(graph, node, constants)
        modified = True
    return modified
