"""Multiply-accumulates: the measure of work that cost models and mixed precision share."""

import numpy as np

from .ir import Graph, Node
from .ops import OPS
from .ops.registry import rule_of

RECURRENT = tuple(name for name in OPS if rule_of(name) == "recurrent")  # LSTM, QLSTM, ...
MATMUL_LIKE = (*(name for name, op in OPS.items() if op.weights), *RECURRENT)


def macs(node: Node) -> int:
    """Multiply-accumulates of a convolution, matrix product or recurrent layer (its input and
    recurrent matrix products over every step and direction); 0 for any other op."""
    if node.op not in MATMUL_LIKE:
        return 0
    out = node.outputs[0]
    weight = node.inputs[1]
    if node.op in RECURRENT:  # Y holds one hidden vector per step, direction and sample
        rows, columns = weight.shape[1], weight.shape[2] + node.inputs[2].shape[2]
        return out.size // node.attrs["hidden_size"] * rows * columns
    if node.op in ("Conv", "QConv"):
        return out.size * int(np.prod(weight.shape[1:]))
    if node.op == "ConvTranspose":
        return node.inputs[0].size * int(np.prod(weight.shape[1:]))
    return out.size * int(node.inputs[0].shape[-1])


def graph_macs(graph: Graph) -> int:
    return sum(macs(node) for node in graph.nodes)
