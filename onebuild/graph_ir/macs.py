"""Multiply-accumulates: the measure of work that cost models and mixed precision share."""

import numpy as np

from .ir import Graph, Node

MATMUL_LIKE = ("Conv", "QConv", "ConvTranspose", "Gemm", "QGemm", "MatMul")


def macs(node: Node) -> int:
    """Multiply-accumulates of a convolution or matrix product; 0 for any other op."""
    if node.op not in MATMUL_LIKE:
        return 0
    out = node.outputs[0]
    weight = node.inputs[1]
    if node.op in ("Conv", "QConv"):
        return out.size * int(np.prod(weight.shape[1:]))
    if node.op == "ConvTranspose":
        return node.inputs[0].size * int(np.prod(weight.shape[1:]))
    return out.size * int(node.inputs[0].shape[-1])


def graph_macs(graph: Graph) -> int:
    return sum(macs(node) for node in graph.nodes)
