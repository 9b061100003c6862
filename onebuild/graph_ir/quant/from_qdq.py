"""Pre-quantized graphs: fold QDQ groups into the integer kernels `quantize_graph` produces.

Importing a quantized ONNX model (QDQ or QOperator format, see `serde/onnx_qdq.py`) gives
QuantizeLinear / DequantizeLinear nodes around float ops. Each group
DequantizeLinear(s) -> op -> QuantizeLinear whose op has an integer rule (`OPS[op].quant`) becomes
that rule's kernel, with the model's own scales and zero points (nothing is recalibrated; a Relu
or Clip between a Conv/Gemm/MatMul/Add and its QuantizeLinear becomes the kernel's clamp):
- Conv, Gemm, MatMul with constant weights of zero point 0 (per tensor, or per output channel)
  -> QConv / QGemm; an int32 bias at scale s_x * s_w is taken as is, any other is requantized;
- Add, Sub, Mul -> QAdd / QMul; Concat -> QConcat; AveragePool, GlobalAveragePool (and
  ReduceMean over H, W) -> QAveragePool; unary functions -> QLookup (a table over every input
  code); Softmax -> QSoftmax;
- data movement (MaxPool, Reshape, Transpose, Pad, nearest or linear Resize, ...) on the codes,
  followed by a Requantize when its QuantizeLinear changes the parameters; DequantizeLinear ->
  QuantizeLinear likewise.
Everything else keeps its QuantizeLinear / DequantizeLinear and runs in float (as in a model
onebuild quantized itself); a multiplier outside the fixed-point range also leaves its op float.
Requantization is onebuild's (31-bit multiplier and shift, one rounding, ties to even):
onnxruntime rescales in float32, so results may differ by one code where the exact value is a
rounding tie (docs/quantization.md).
"""

import logging

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import OPS, weight_axes
from ..ops.quantized import recording_float_op
from ..ops.quantized_softmax import exp_table
from ..ops.registry import KEEPS_PARAMETERS
from ..passes.cleanup import eliminate_dead_code
from ..passes.fuse import fuse_activations
from ..tensor import QuantParams
from .kernel_attrs import (
    average_pool_attrs,
    binary_attrs,
    channel_bias,
    concat_attrs,
    constant_operands,
    lookup_table,
    matmul_attrs,
    requantize_attrs,
    softmax_attrs,
)
from .params import (
    QRANGE,
    MultiplierRangeError,
    activation_params,
    dequantize,
    qdq_attrs,
    qdq_params,
    quantize,
)
from .quantize_graph import resizes_codes, spatial_mean

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
log = logging.getLogger(__name__)


def graph_is_quantized(graph: Graph) -> bool:
    """Whether `graph` already holds quantized values (a pre-quantized or quantized model)."""
    return any(v.quant is not None for n in graph.nodes for v in n.outputs) or any(
        v.quant is not None for v in graph.inputs
    )


def fold_qdq(graph: Graph) -> Graph:
    """`graph` with its QDQ groups folded into integer kernels (unchanged without any)."""
    if not any(node.op in QDQ_OPS for node in graph.nodes):
        return graph
    fuse_activations(graph)  # DQ -> Conv -> Relu -> Q: the Relu becomes the kernel's clamp
    return _Folder(graph).run()


class _Folder:
    def __init__(self, source: Graph):
        self.source = source
        self.graph = Graph(source.name)
        self.new: dict[int, Value] = {}  # source value -> its value in the new graph
        self.dq: dict[int, Node] = {}  # source DequantizeLinear output -> the node
        self.folded: set[int] = set()  # QuantizeLinear nodes folded into their producer
        self.relabeled: dict[int, Value] = {}  # DequantizeLinear node -> its relabeled codes

    def run(self) -> Graph:
        for value in self.source.inputs:
            self.new[id(value)] = self.graph.add_input(value.name, value.dtype, value.shape)
        for node in self.source.nodes:
            if node.op == "DequantizeLinear":
                self.dq[id(node.output)] = node
            elif node.op == "QuantizeLinear":
                if id(node) not in self.folded:
                    self._quantize(node)
            elif not self._fold(node):
                self._copy(node)
        self.graph.outputs = [self._output(v) for v in self.source.outputs]
        eliminate_dead_code(self.graph)
        return self.graph

    # -- values ------------------------------------------------------------------------------
    def value(self, source: Value) -> Value:
        """The new graph's value for `source` (constants and dequantized values made on first
        use)."""
        if id(source) in self.new:
            return self.new[id(source)]
        if id(source) in self.dq:
            q = self.codes(source)
            if q.is_const:
                new = self.graph.add_constant(dequantize(q.numpy(), q.quant), source.name)
            else:
                node = self.dq[id(source)]
                new = self.graph.make_node(
                    "DequantizeLinear", [q], qdq_attrs(q.quant), node.name, [source.name]
                ).output
        else:
            new = self.graph.add_constant(source.const, source.name)
            new.quant = source.quant
        self.new[id(source)] = new
        return new

    def codes(self, source: Value | None) -> Value | None:
        """The quantized codes a DequantizeLinear output `source` reads, carrying that node's
        parameters (None if `source` is not dequantized codes)."""
        node = self.dq.get(id(source))
        if node is None:
            return None
        q = self.value(node.inputs[0])
        params = qdq_params(node.attrs)
        if q.quant is None:
            q.quant = params
        elif q.quant != params:  # the codes read with other parameters: relabel them (once)
            if id(node) not in self.relabeled:
                copy = self.graph.make_node("Identity", [q], name=f"{node.name}/relabel").output
                copy.quant = params
                self.relabeled[id(node)] = copy
            q = self.relabeled[id(node)]
        return q

    def activation(self, source: Value | None) -> Value | None:
        """Per-tensor codes of a non-constant dequantized value, else None."""
        q = self.codes(source)
        return q if q is not None and not q.is_const and q.quant.axis is None else None

    def operand(self, source: Value, dtype: str) -> Value | None:
        """Per-tensor codes of a dequantized value, or a float constant quantized as the
        quantizer would (in the output's dtype)."""
        q = self.codes(source)
        if q is not None:
            return q if q.quant.axis is None else None
        if not source.is_const or dtype not in QRANGE or source.dtype.kind != "f":
            return None
        array = source.numpy()
        params = activation_params(float(array.min()), float(array.max()), dtype)
        new = self.graph.add_constant(quantize(array, params, dtype), f"{source.name}_{dtype}")
        new.quant = params
        return new

    def _output(self, source: Value) -> Value:
        result = self.value(source)
        if result.name != source.name or result.is_const:
            node = self.graph.make_node("Identity", [result], name=source.name)
            node.output.quant = result.quant
            result = node.output
        return result

    # -- nodes -------------------------------------------------------------------------------
    def _copy(self, node: Node) -> None:
        """The node as it is; data movement on codes keeps their parameters."""
        inputs = [None if v is None else self.value(v) for v in node.inputs]
        names = [v.name for v in node.outputs]
        new = self.graph.make_node(node.op, inputs, node.attrs, node.name, names)
        x = inputs[0] if inputs else None
        moves = OPS[node.op].quant in KEEPS_PARAMETERS
        for old, value in zip(node.outputs, new.outputs):
            if moves and x is not None and x.quant is not None and value.dtype == x.dtype:
                value.quant = x.quant
            self.new[id(old)] = value

    def _quantize(self, node: Node) -> None:
        """A QuantizeLinear no op was folded into: of dequantized codes, a Requantize."""
        params = qdq_params(node.attrs)
        x = self.activation(node.inputs[0])
        new = None if x is None else self._requantize(x, params, node.attrs["dtype"], node)
        if new is None:
            source = self.value(node.inputs[0])
            new = self.graph.make_node(
                "QuantizeLinear", [source], node.attrs, node.name, [node.output.name]
            ).output
            new.quant = params
        self.new[id(node.output)] = new

    def _requantize(self, x: Value, params: QuantParams, dtype: str, q_node: Node):
        """`x` with `params` (itself when they agree, else a Requantize node), or None."""
        if x.quant == params and x.dtype == np.dtype(dtype):
            return x
        if params.axis is not None:
            return None
        try:
            attrs = requantize_attrs(x.quant, params, dtype)
        except MultiplierRangeError:
            return None
        out = self.graph.make_node("Requantize", [x], attrs, q_node.name, [q_node.output.name])
        out.output.quant = params
        return out.output

    def _fold(self, node: Node) -> bool:
        """Emit the integer form of `node` and its QuantizeLinear if they qualify."""
        rule = OPS[node.op].quant
        if rule is None or len(node.outputs) != 1 or node.output in self.source.outputs:
            return False
        users = node.output.users
        if len(users) != 1 or users[0].op != "QuantizeLinear":
            return False
        q_node = users[0]
        params = qdq_params(q_node.attrs)
        dtype = q_node.attrs["dtype"]
        if params.axis is not None:
            return False
        try:
            new = EMIT[rule](self, node, params, dtype, q_node)
        except MultiplierRangeError as error:
            log.info("node '%s' (%s) stays float: %s", node.name, node.op, error)
            return False
        if new is None:
            return False
        new.quant = params
        self.new[id(q_node.output)] = new
        self.folded.add(id(q_node))
        return True

    def _node(self, op: str, inputs, attrs: dict, node: Node, q_node: Node) -> Value:
        attrs = recording_float_op(op, attrs, node.op)  # partition keys match on it
        return self.graph.make_node(op, inputs, attrs, node.name, [q_node.output.name]).output

    # -- the integer forms (None: the group stays float) -------------------------------------
    def _matmul(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        x, w = self.activation(node.inputs[0]), self.codes(node.inputs[1])
        attrs = node.attrs
        if x is None or w is None or not w.is_const or any(w.quant.zero_point):
            return None
        if attrs.get("transA"):
            return None
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            return None
        if node.op == "MatMul" and (len(w.shape) != 2 or len(x.shape) != 2):
            return None
        channel_axis = weight_axes(node).out
        if w.quant.axis not in (None, channel_axis):
            return None
        channels = w.shape[channel_axis]
        s_x = x.quant.scale[0]
        scales = np.broadcast_to(np.asarray(w.quant.scale, np.float64), (channels,))
        bias = self._bias(node.inputs[2] if len(node.inputs) > 2 else None, s_x * scales, dtype)
        if bias is None:
            return None
        kernel = matmul_attrs(node.op, attrs, x.quant, scales, y, dtype)
        per_channel = w.quant.axis is not None
        b_scales = tuple(float(s_x * s) for s in scales[: channels if per_channel else 1])
        bias.quant = QuantParams(b_scales, (0,) * len(b_scales), 0 if per_channel else None)
        op = "QConv" if node.op == "Conv" else "QGemm"
        return self._node(op, [x, w, bias], kernel, node, q_node)

    def _bias(self, source: Value | None, scales: np.ndarray, dtype: str) -> Value | None:
        """The integer bias at `scales` (s_x * s_w per channel): the model's own codes when
        they have that scale, else its real values rounded to it; None when it is computed or
        not one value per channel (`channel_bias`)."""
        b_type = np.int64 if dtype in ("int16", "uint16") else np.int32
        name = "bias" if source is None else source.name
        if source is None:
            codes = np.zeros(scales.shape, np.int64)
        else:
            q = self.codes(source)
            if not (source if q is None else q).is_const:
                return None
            own = (
                q is not None
                and not any(q.quant.zero_point)
                and np.allclose(np.broadcast_to(q.quant.scale, scales.shape), scales, rtol=1e-6)
            )
            if own:
                values = q.numpy().astype(np.int64)
                name = q.name
            else:
                values = dequantize(q.numpy(), q.quant) if q is not None else source.numpy()
            values = channel_bias(np.asarray(values), len(scales))
            if values is None:  # a Gemm's C of [M, N]: the group stays float
                return None
            codes = values if own else np.rint(values.astype(np.float64) / scales)
        limit = np.iinfo(b_type)
        codes = np.clip(codes, limit.min, limit.max)
        return self.graph.add_constant(codes.astype(b_type), f"{name}_{np.dtype(b_type)}")

    def _binary(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        if node.op not in ("Add", "Sub", "Mul") or len(node.inputs) != 2:
            return None
        a, b = (self.operand(v, dtype) for v in node.inputs)
        if a is None or b is None or (a.is_const and b.is_const):
            return None
        op, attrs = binary_attrs(node.op, a.quant, b.quant, y, dtype, node.attrs.get("clip"))
        return self._node(op, [a, b], attrs, node, q_node)

    def _concat(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        inputs = [self.operand(v, dtype) for v in node.inputs]
        if any(v is None for v in inputs):
            return None
        attrs = concat_attrs(node.attrs["axis"], [v.quant for v in inputs], y, dtype)
        return self._node("QConcat", inputs, attrs, node, q_node)

    def _average_pool(self, node: Node, y: QuantParams, dtype: str, q_node: Node):
        x = self.activation(node.inputs[0])
        if x is None or len(x.shape) < 3 or (node.op == "ReduceMean" and not spatial_mean(node)):
            return None
        attrs = average_pool_attrs(node.op, node.attrs, x.shape[2:], x.quant, y, dtype)
        return self._node("QAveragePool", [x], attrs, node, q_node)

    def _lookup(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        x = self.activation(node.inputs[0])
        if x is None or constant_operands(node) is None:
            return None
        codes = lookup_table(node, x.quant, x.dtype, y, dtype)
        table = self.graph.add_constant(codes, f"{node.name}_table")
        return self._node("QLookup", [x, table], {"function": node.op}, node, q_node)

    def _move(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        """Data movement on the codes, then a Requantize if the output parameters differ."""
        x = self.activation(node.inputs[0])
        if x is None or any(v.dtype != node.inputs[0].dtype for v in node.outputs):
            return None
        attrs = dict(node.attrs)
        if node.op == "Pad" and attrs.get("mode", "constant") == "constant":
            if float(attrs.get("value", 0.0)) != 0.0:
                return None
            attrs["value"] = x.quant.zero_point[0]
        inputs = [x, *(None if v is None else self.value(v) for v in node.inputs[1:])]
        same = x.quant == y and x.dtype == np.dtype(dtype)
        name = q_node.output.name if same else f"{node.output.name}_q"
        moved = self.graph.make_node(node.op, inputs, attrs, node.name, [name])
        moved.output.quant = x.quant
        return self._requantize(moved.output, y, dtype, q_node)

    def _resize(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        return self._move(node, y, dtype, q_node) if resizes_codes(node) else None

    def _softmax(self, node: Node, y: QuantParams, dtype: str, q_node: Node) -> Value | None:
        x = self.activation(node.inputs[0])
        if x is None:
            return None
        table = self.graph.add_constant(exp_table(x.quant.scale[0]), f"{node.name}_exp")
        attrs = softmax_attrs(node.attrs.get("axis", -1), y, dtype)
        return self._node("QSoftmax", [x, table], attrs, node, q_node)


EMIT = {
    "matmul": _Folder._matmul,
    "binary": _Folder._binary,
    "concat": _Folder._concat,
    "average_pool": _Folder._average_pool,
    "lookup": _Folder._lookup,
    "passthrough": _Folder._move,
    "pad": _Folder._move,
    "resize": _Folder._resize,
    "softmax": _Folder._softmax,
}
