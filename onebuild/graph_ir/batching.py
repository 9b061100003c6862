"""Running N samples in one pass through a graph built for batch 1.

A graph is batch-separable when every activation (every non-constant value) has a leading dim
of 1 and every node keeps samples apart along that axis: the same kernels then run on [N, ...]
arrays and give each sample exactly its single-run result. Inside the graph a value may instead
hold rows [M, ...] (a quantized sequence MatMul: Reshape [1, T, K] -> [T, K] -> QGemm ->
Reshape back) where every node that reads or writes it keeps rows apart: N samples' rows then
run stacked, [N M, ...]. Each op states how it does in its
registry entry (`OPS[op].batch`, a `BatchRule` next to the op's kernel in `ops/`):

- which inputs may carry the batch (the others must be constants: a Conv weight computed from
  the input, or a Concat with a constant part, would mix or mismatch samples), and whether numpy
  broadcasting applies (then a batched input must have the output's rank),
- under which attributes the op is separable (no Softmax/Concat/reduction over axis 0, no
  Transpose moving it, no Gather or Pad along it, ...), and
- how attributes that spell out axis 0 are rewritten for N samples (the static output shape of
  Reshape and Expand, Resize's sizes, Slice's range on axis 0).

Ops without a rule, or not separable with their attributes, make the graph fall back to one
sample at a time, as does a node none of whose inputs carry the batch (its output would not
grow with N). Calibration and `run_batch` use this to pay the per-node Python overhead once per
chunk of samples instead of once per sample.
"""

from collections.abc import Callable
from functools import partial

from .ir import Graph, Node
from .ops import OPS
from .ops.registry import ANY, BatchRule

AttrsFor = Callable[[int], dict] | None  # batch size -> attributes, for ops that need it


def _rule(node: Node) -> BatchRule | None:
    opdef = OPS.get(node.op)
    rule = None if opdef is None else opdef.batch
    return rule if isinstance(rule, BatchRule) else None


def separable(node: Node) -> bool:
    """Whether `node` run on [N, ...] activations gives each sample its single-run result."""
    rule = _rule(node)
    if rule is None:
        return False
    batched = [i for i, v in enumerate(node.inputs) if v is not None and not v.is_const]
    if not batched:
        return False
    if rule.inputs is not ANY and not all(i in rule.inputs for i in batched):
        return False
    if rule.broadcasting:
        rank = len(node.outputs[0].shape)
        if not all(len(node.inputs[i].shape) == rank for i in batched):
            return False
    return rule.condition is None or rule.condition(node)


def _attrs_for(node: Node) -> AttrsFor:
    """Attributes for N samples, for ops whose attributes spell out axis 0."""
    rewrite = _rule(node).rewrite
    return None if rewrite is None else partial(rewrite, node.attrs)


def keeps_rows(node: Node) -> bool:
    """Whether `node` reads and writes only values with a leading dim of 1, or keeps the rows
    of values whose leading dim is not (a sequence's [M, K] rows, stacked for N samples as
    [N M, K]) apart (`BatchRule.rows`)."""
    values = [v for v in (*node.inputs, *node.outputs) if v is not None and not v.is_const]
    if all(v.shape and v.shape[0] == 1 for v in values):
        return True
    return all(v.shape for v in values) and _rule(node).rows


def batch_plan(graph: Graph) -> list[AttrsFor] | None:
    """Per node, how to get its attributes for a batch (None: unchanged); None if the graph is
    not batch-separable."""
    if not all(v.shape and v.shape[0] == 1 for v in [*graph.inputs, *graph.outputs]):
        return None
    if any(v.is_const for v in graph.outputs):
        return None
    if not all(separable(node) and keeps_rows(node) for node in graph.nodes):
        return None
    return [_attrs_for(node) for node in graph.nodes]
