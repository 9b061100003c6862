"""Running N samples in one pass through a graph built for batch 1.

A graph is batch-separable when every activation (every non-constant value) has a leading dim
of 1 and every node keeps samples apart along that axis: the same kernels then run on [N, ...]
arrays and give each sample exactly its single-run result. Per op this module knows

- which inputs may carry the batch (the others must be constants: a Conv weight computed from
  the input, or a Concat with a constant part, would mix or mismatch samples),
- under which attributes the op is separable (no Softmax/Concat/reduction over axis 0, no
  Transpose moving it, no Gather or Pad along it, ...), and
- how attributes that spell out axis 0 are rewritten for N samples (the static output shape of
  Reshape and Expand, Resize's sizes, Slice's range on axis 0).

Ops not listed, or listed but not separable with their attributes, make the graph fall back to
one sample at a time, as does a node none of whose inputs carry the batch (its output would
not grow with N). Calibration and `run_batch` use this to pay the per-node Python overhead once
per chunk of samples instead of once per sample.
"""

from collections.abc import Callable

from .ir import Graph, Node

AttrsFor = Callable[[int], dict] | None  # batch size -> attributes, for ops that need it

ANY = None  # every input may carry the batch

# Each input's axis 0 is the op's sample axis and the op never looks across it; only the
# listed inputs may carry the batch.
PER_SAMPLE: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        "Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool "
        "BatchNormalization LRN InstanceNormalization GroupNormalization DepthToSpace "
        "SpaceToDepth QConv QAveragePool QuantizeLinear DequantizeLinear Requantize QLookup "
        "Relu LeakyRelu HardSigmoid HardSwish Sigmoid Tanh Gelu Erf Sqrt Neg Abs Exp Log Floor "
        "Ceil Reciprocal Not Cast Identity Dropout Round Sign Softsign Softplus Mish IsNaN IsInf "
        "Sin Cos Tan Sinh Cosh Asin Acos Atan Asinh Acosh Atanh Elu Celu Selu ThresholdedRelu "
        "Shrink".split(),
        (0,),
    ),
}
# Numpy broadcasting: any input may carry the batch if its rank is the output's (a lower-rank
# input would line its axis 0 up with a later output axis).
BROADCASTING = set(
    "Add Sub Mul Div Pow Max Min PRelu Equal Less Greater GreaterOrEqual LessOrEqual And Or Xor "
    "Mod Where Clip QAdd QMul".split()
)


def _axis(node: Node) -> int:
    rank = len(node.inputs[0].shape)
    return node.attrs.get("axis", -1) % max(rank, 1)


def _matmul(node: Node) -> bool:
    """[1, M, K] @ [K, N] and stacks of matrices; a batched matrix must be the left operand."""
    rank = len(node.outputs[0].shape)
    for index, value in enumerate(node.inputs):
        if value is None or value.is_const:
            continue
        if len(value.shape) != rank or len(value.shape) < (2 if index == 0 else 3):
            return False
    return True


def _gemm_bias(node: Node) -> bool:
    """A bias computed from the input must be a [1, N] row, not a broadcast [N] vector."""
    c = node.inputs[2] if len(node.inputs) > 2 else None
    return c is None or c.is_const or len(c.shape) == 2


def _resize(node: Node) -> bool:
    return node.attrs["scales"][0] == 1.0 and not node.attrs.get("roi")


# op -> (inputs that may carry the batch, condition on the node) for ops with conditions.
CONDITIONAL: dict[str, tuple[tuple[int, ...] | None, Callable[[Node], bool]]] = {
    **dict.fromkeys(
        ("Softmax", "LogSoftmax", "LpNormalization", "Split"), ((0,), lambda n: _axis(n) != 0)
    ),
    "LayerNormalization": ((0,), lambda n: _axis(n) != 0),
    # Every part of a Concat must carry the batch: a constant part would not grow with N.
    "Concat": (ANY, lambda n: _axis(n) != 0 and not any(v.is_const for v in n.inputs)),
    "QConcat": (ANY, lambda n: _axis(n) != 0 and not any(v.is_const for v in n.inputs)),
    **dict.fromkeys(
        "ReduceMean ReduceMax ReduceMin ReduceSum ReduceProd ArgMax ArgMin "
        "MeanVarianceNormalization".split(),
        ((0,), lambda n: 0 not in n.attrs["axes"]),
    ),
    "Transpose": ((0,), lambda n: n.attrs["perm"][0] == 0),
    "Gemm": ((0, 2), lambda n: not n.attrs.get("transA") and _gemm_bias(n)),
    "QGemm": ((0,), lambda n: not n.attrs.get("transA")),
    "MatMul": (ANY, _matmul),
    "Pad": ((0,), lambda n: n.attrs["pads"][0] == 0 == n.attrs["pads"][len(n.inputs[0].shape)]),
    "Tile": ((0,), lambda n: n.attrs["repeats"][0] == 1),
    # Data gathered along a later axis, or a constant table indexed by the samples' indices.
    "Gather": (
        ANY,
        lambda n: (
            (n.attrs["axis"] != 0 and n.inputs[1].is_const)
            or (n.attrs["axis"] == 0 and n.inputs[0].is_const)
        ),
    ),
    # Output shape [1, ...] from an input [1, ...]: each sample's block stays contiguous.
    "Reshape": ((0,), lambda n: True),
    "Expand": ((0,), lambda n: len(n.inputs[0].shape) == len(n.outputs[0].shape)),
    "Slice": ((0,), lambda n: True),  # a slice of a length-1 axis that keeps 1 is all of it
    "Resize": ((0,), _resize),
}


def _with_batch(node: Node) -> AttrsFor:
    """Attributes for N samples, for ops whose attributes spell out axis 0."""
    attrs = node.attrs
    if node.op in ("Reshape", "Expand"):
        return lambda batch: {**attrs, "shape": [batch, *attrs["shape"][1:]]}
    if node.op == "Resize":
        return lambda batch: {**attrs, "sizes": [batch, *attrs["sizes"][1:]]}
    if node.op == "Slice":
        return lambda batch: {
            **attrs,
            "starts": [0, *attrs["starts"][1:]],
            "ends": [None, *attrs["ends"][1:]],
            "steps": [1, *attrs["steps"][1:]],
        }
    return None


def _carriers_ok(node: Node, allowed: tuple[int, ...] | None) -> bool:
    """At least one input carries the batch, and only allowed ones do."""
    batched = [i for i, v in enumerate(node.inputs) if v is not None and not v.is_const]
    return bool(batched) and (allowed is ANY or all(i in allowed for i in batched))


def separable(node: Node) -> bool:
    """Whether `node` run on [N, ...] activations gives each sample its single-run result."""
    op = node.op
    if op in BROADCASTING:
        rank = len(node.outputs[0].shape)
        batched = [v for v in node.inputs if v is not None and not v.is_const]
        return bool(batched) and all(len(v.shape) == rank for v in batched)
    if op in PER_SAMPLE:
        return _carriers_ok(node, PER_SAMPLE[op])
    if op in CONDITIONAL:
        allowed, condition = CONDITIONAL[op]
        return _carriers_ok(node, allowed) and condition(node)
    return False


def batch_plan(graph: Graph) -> list[AttrsFor] | None:
    """Per node, how to get its attributes for a batch (None: unchanged); None if the graph is
    not batch-separable."""
    values = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    if not all(v.shape and v.shape[0] == 1 for v in values):
        return None
    if any(v.is_const for v in graph.outputs):
        return None
    if not all(separable(node) for node in graph.nodes):
        return None
    return [_with_batch(node) for node in graph.nodes]
