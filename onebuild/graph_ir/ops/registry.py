"""The closed set of IR operators: one `OpDef` per op holds everything graph_ir knows about it.

- kernel: takes the node's attributes and its input arrays (None for an omitted optional input)
  and returns a tuple of output arrays;
- infer: takes the attributes and the input types and returns the output types;
- batch: how the op keeps samples apart along axis 0 (a `BatchRule`, read by `batching`), or None
  when it never runs several samples per pass. Every op states it: the default is `UNSTATED`,
  which `tests/test_op_registry.py` refuses;
- quant: the name of the quantizer's rule for it (`QUANT_RULES`, dispatched on by
  `quant/quantize_graph.py`), or None: the op runs in float between DequantizeLinear and
  QuantizeLinear;
- onnx: when the op is the ONNX operator of the same name (same inputs, same semantics), the
  ONNX attributes it reads, each with the type it takes (absent ones keep the kernel's default);
  the ONNX importer then converts it without a converter of its own. None: the importer has a
  converter for it (opset differences to resolve, operands to canonicalize) or it is IR-only;
- subgraphs: the attributes that hold an IR `Graph` (control flow: If's branches), empty for
  ordinary ops;
- quantizes: for an integer op the quantizer makes, the float ops it stands for (QGemm: Gemm
  and MatMul), so a partition map naming a float op names its quantized form too;
- weights: for an op with a weight (input 1: Conv, Gemm, ...), where its channels are (a
  `WeightLayout`; `weight_axes(node)` applies it), else None;
- view: the output is the input's bytes, at most under another shape (Reshape, Identity):
  no target computes or moves anything for it.

Kernels and `infer` see canonical attributes: the ONNX importer resolves opset differences,
auto_pad, negative axes and shape operands before a node is created.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ..ir import Node


class TensorType(NamedTuple):
    dtype: np.dtype
    shape: tuple[int, ...]


Attrs = dict[str, Any]
Kernel = Callable[..., tuple[np.ndarray, ...]]
Infer = Callable[[Attrs, Sequence[TensorType | None]], list[TensorType]]


ANY = None  # BatchRule.inputs: every input may carry the batch


@dataclass(frozen=True)
class BatchRule:
    """When a node of the op, run on [N, ...] activations, gives each sample its single-run result.

    - inputs: the inputs that may carry the batch (the others must be constants: a Conv weight
      computed from the input would mix samples), or ANY;
    - broadcasting: numpy broadcasting applies, so every input carrying the batch must have the
      output's rank (a lower-rank input would line its axis 0 up with a later output axis);
    - condition: a further check on the node (attributes that look across axis 0, ...);
    - rewrite: (attributes, N) -> the attributes for N samples, for ops whose attributes spell
      out axis 0 (a static output shape, say);
    - rows: the op also keeps the rows of a value whose leading dim M is not 1 apart (a
      quantized sequence MatMul's [M, K] rows): N samples' rows stacked on axis 0, [N M, ...],
      give each sample's rows their single-run result.

    A node none of whose inputs carries the batch is never separable (its output would not grow
    with N); `batching.separable` applies the rule.
    """

    inputs: tuple[int, ...] | None = (0,)
    broadcasting: bool = False
    condition: "Callable[[Node], bool] | None" = None
    rewrite: Callable[[Attrs, int], Attrs] | None = None
    rows: bool = False

    def where(self, condition: "Callable[[Node], bool]") -> "BatchRule":
        """This rule with `condition` added (both must hold)."""
        if self.condition is None:
            return replace(self, condition=condition)
        first = self.condition
        return replace(self, condition=lambda node: first(node) and condition(node))


def _axis(node: "Node") -> int:
    rank = len(node.inputs[0].shape)
    return node.attrs.get("axis", -1) % max(rank, 1)


# Each input's axis 0 is the op's sample axis and the op never looks across it; only input 0
# may carry the batch.
PER_SAMPLE = BatchRule((0,))
# Numpy broadcasting of any inputs of the output's rank.
BROADCASTING = BatchRule(ANY, broadcasting=True)


def not_along_axis_0(inputs: tuple[int, ...] | None = (0,)) -> BatchRule:
    """Per sample unless the op's `axis` attribute (default -1) is axis 0 (Softmax, Split,
    Concat, ...)."""
    return BatchRule(inputs, condition=lambda node: _axis(node) != 0)


NOT_ALONG_AXIS_0 = not_along_axis_0()
# Per sample unless the op's `axes` attribute (reductions) includes axis 0.
NOT_OVER_AXIS_0 = PER_SAMPLE.where(lambda node: 0 not in node.attrs["axes"])

# The quantizer's rules (methods of `quant.quantize_graph._Quantizer`, which checks that it has
# one for each name): integer kernels for conv/gemm/matmul with constant weights, two-input
# add/sub/mul, concat and average pooling; a lookup table over every input code for unary
# functions; data movement on the quantized codes with the input's parameters; passthrough of a
# constant-mode pad whose fill becomes the zero point; nearest or linear resizing on the codes;
# softmax by its integer algorithm (ops/quantized_softmax.py); integer LSTM/GRU/RNN layers.
QUANT_RULES = (
    "matmul", "binary", "concat", "average_pool", "lookup", "passthrough", "pad", "resize",
    "softmax", "recurrent",
)  # fmt: skip
KEEPS_PARAMETERS = ("passthrough", "pad", "resize")  # rules whose output has the input's params


class WeightAxes(NamedTuple):
    """Where a weighted op's channels lie: `out` (output channels) and `into` (the input
    channels it contracts over, per group in a grouped op) are axes of its weight, input 1;
    `data` is the input-channel axis of its data, input 0 (negative: from the end)."""

    out: int
    into: int
    data: int


# (attributes, the weight's rank) -> its WeightAxes, or None when the node has no channels
WeightLayout = Callable[[Attrs, int], WeightAxes | None]


def weight_axes(node: "Node") -> WeightAxes | None:
    """The WeightAxes of `node`, or None for an op without a weight (or a node without one)."""
    layout = OPS[node.op].weights if node.op in OPS else None
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    return None if layout is None or weight is None else layout(node.attrs, len(weight.shape))


def rule_of(op: str) -> str | None:
    """The quantization rule of `op`, or for an integer op the rule of the float op it stands
    for (QLSTM: "recurrent")."""
    opdef = OPS[op]
    return OPS[opdef.quantizes[0]].quant if opdef.quantizes else opdef.quant


class _Unstated:
    def __repr__(self) -> str:
        return "UNSTATED"


UNSTATED: Any = _Unstated()  # `register` without `batch=`: an omission, not a decision


@dataclass(frozen=True)
class OpDef:
    name: str
    kernel: Kernel
    infer: Infer
    batch: BatchRule | None = UNSTATED
    quant: str | None = None
    onnx: Mapping[str, type] | None = None
    subgraphs: tuple[str, ...] = ()
    quantizes: tuple[str, ...] = ()
    weights: WeightLayout | None = None
    view: bool = False


OPS: dict[str, OpDef] = {}


def register(
    name: str,
    infer: Infer,
    *,
    batch: BatchRule | None = UNSTATED,
    quant: str | None = None,
    onnx: Mapping[str, type] | None = None,
    subgraphs: tuple[str, ...] = (),
    quantizes: tuple[str, ...] = (),
    weights: WeightLayout | None = None,
    view: bool = False,
) -> Callable[[Callable], Callable]:
    """Register the decorated function as the kernel of op `name`; it may return one array.

    `batch` is the op's BatchRule, or None if it is deliberately never batch-separable; `quant`
    one of QUANT_RULES, or None to keep the op in float; `onnx` the attributes of the ONNX
    operator it is, by type (`{}`: one without attributes), or None; `subgraphs` the attributes
    holding IR graphs; `quantizes` the float ops an integer op stands for; `weights` where a
    weighted op's channels are; `view` whether its output is its input's bytes.
    """
    if quant is not None and quant not in QUANT_RULES:
        raise ValueError(f"op {name}: unknown quantization rule {quant!r}")
    if batch is not None and batch is not UNSTATED and not isinstance(batch, BatchRule):
        raise TypeError(f"op {name}: batch must be a BatchRule or None, not {batch!r}")

    def wrap(fn: Callable) -> Callable:
        def kernel(attrs: Attrs, *inputs: np.ndarray | None) -> tuple[np.ndarray, ...]:
            result = fn(attrs, *inputs)
            return result if isinstance(result, tuple) else (result,)

        kernel.__name__ = kernel.__qualname__ = fn.__name__
        kernel.__doc__ = fn.__doc__
        kernel.__wrapped__ = fn  # the signature says how many inputs the op takes
        if name in OPS:
            raise ValueError(f"op {name} is registered twice")
        OPS[name] = OpDef(
            name, kernel, infer, batch, quant, onnx, subgraphs, quantizes, weights, view
        )
        return fn

    return wrap


def unregister(name: str) -> None:
    """Remove op `name` (for tests that register an op of their own)."""
    del OPS[name]


def same_as_input(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Output type equals the first input's type (unary elementwise ops)."""
    return [types[0]]


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            "shapes " + " and ".join(str(list(s)) for s in shapes) + " do not broadcast"
        ) from None


def broadcast(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Numpy broadcasting of all inputs; the dtype of the first input."""
    shapes = [t.shape for t in types if t is not None]
    return [TensorType(types[0].dtype, broadcast_shape(*shapes))]


def with_dtype(dtype: np.dtype | str) -> Infer:
    """Broadcast shape, fixed output dtype (comparisons)."""

    def infer(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
        return [TensorType(np.dtype(dtype), broadcast(attrs, types)[0].shape)]

    return infer


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0
