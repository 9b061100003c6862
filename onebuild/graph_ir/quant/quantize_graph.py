"""Full quantization of a float graph into the integer reference form.

Each node runs in its layer's dtype (the default, or a `layers` override), by the rule its op's
registry entry names (`OPS[op].quant`, stated next to the kernel in `ops/`; `RULES` below):
- Conv, Gemm and MatMul with constant 2-D weights -> QConv / QGemm (`matmul_rule.py`: a MatMul
  [..., K] @ [K, N] on its rows, between Reshapes; symmetric weights per channel or per tensor,
  int8 for 8-bit activations and int16 for int16; integer bias with scale s_x*s_w; with the
  calibration means of the layer's input channels, the bias is corrected by the mean output
  shift the weight rounding causes, (w_q - w) @ mean, as in Nagel et al. 2019);
- Add, Sub, Mul, Concat, AveragePool, GlobalAveragePool (and ReduceMean over H, W) -> integer
  kernels;
- unary elementwise functions (Sigmoid, Tanh, HardSwish, Relu, ...) -> a lookup table over every
  input code; Softmax -> QSoftmax (an exponential table, integer sums and reciprocals);
- data movement (MaxPool, Reshape, Transpose, Slice, Split, Pad, nearest or linear Resize, ...)
  runs on the quantized codes with the input's parameters;
- LSTM, GRU, RNN -> QLSTM / QGRU / QRNN (`recurrent_rule.py`: int16 gates and cell state);
- a value read only by lookup tables is quantized over the inputs where a table's output code
  still changes (`table_ranges.py`), the rest from its calibrated range;
- with `activation_granularity = "channel"`, the values on Conv -> [table] -> depthwise Conv
  edges get one scale and zero point per channel (`channel_activations.py`);
- a node whose requantization multiplier is out of range stays float (logged at info level);
- everything else (and every node of a `float32` layer) runs in float between DequantizeLinear
  and QuantizeLinear. Values crossing between dtypes are converted by integer Requantize nodes.
Float model inputs and outputs are float32 unless `input_type` / `output_type` name a quantized
dtype; integer inputs and outputs (indices) keep their type.
"""

import logging
from collections.abc import Callable, Mapping

import numpy as np

from ...errors import UserError
from ..ir import Graph, Node, Value
from ..ops import OPS
from ..ops.quantized import recording_float_op
from ..ops.quantized_softmax import exp_table
from ..passes.cleanup import eliminate_dead_code
from ..tensor import QuantParams
from .channel_activations import chosen_edges, edge_params
from .config import FLOAT, QuantConfig, layer_settings
from .interpolated_table import interpolated_table
from .kernel_attrs import (
    average_pool_attrs,
    binary_attrs,
    concat_attrs,
    constant_operands,
    lookup_table,
    requantize_attrs,
    softmax_attrs,
)
from .matmul_rule import WeightRounder, matmul_ok, nearest, quantize_matmul
from .params import (
    HEADROOM,
    MultiplierRangeError,
    activation_params,
    channel_of,
    qdq_attrs,
    quantize,
)
from .recurrent_rule import quantize_recurrent, recurrent_ok
from .table_ranges import live_range

ACTIVATION_TYPES = ("uint8", "int8", "int16")

log = logging.getLogger(__name__)


def weight_dtype(activation_dtype: str) -> str:
    """Weights are int16 with int16 activations (ONE's I16_SYM), int8 otherwise."""
    return "int16" if activation_dtype == "int16" else "int8"


class _Quantizer:
    def __init__(
        self,
        source: Graph,
        ranges: Mapping[str, tuple[float, float]],
        config,
        means,
        round_weights: "WeightRounder",
        channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]],
        memo: dict,
    ):
        for dtype in config.quantized_dtypes:
            if dtype not in ACTIVATION_TYPES:
                raise UserError(f"full quantization does not support dtype '{dtype}'")
        self.source, self.ranges, self.config = source, ranges, config
        self.means = means if config.bias_correction else {}
        self.round_weights = round_weights
        self.memo = memo  # tables and their live ranges, shared by quantizations of `source`
        self.settings = layer_settings(source, config)
        self.graph = Graph(source.name)
        self.float_of: dict[int, Value] = {}  # source value -> float value in the new graph
        self.quant_of: dict[tuple[int, str], Value] = {}  # (source value, dtype) -> quantized
        self.home: dict[int, str] = {}  # dtype in which a source value was produced
        self.param_cache: dict[tuple[int, str], QuantParams] = {}
        self.channel_ranges = channel_ranges
        self.per_channel: dict[int, str] = {}  # value id -> the dtype it is per-channel in
        self.affine: dict[int, tuple[Node, ...]] = {}  # table node id -> the ops it absorbs
        self.absorbed: set[int] = set()  # node ids emitted as part of a table
        if config.activation_granularity == "channel":
            chosen = chosen_edges(
                source,
                self._dtype_of,
                channel_ranges,
                config.channel_dtypes,
                config.fold_scales,
                self._writes,
            )
            for edge, dtype in chosen:
                self.per_channel.update({id(v): dtype for v in edge.values})
                if edge.affine:
                    self.affine[id(edge.table)] = edge.affine

    # -- parameters and conversions ----------------------------------------------------------
    def params(self, value: Value, dtype: str) -> QuantParams:
        if value.is_const:
            array = value.numpy()
            return activation_params(float(array.min()), float(array.max()), dtype)
        if (id(value), dtype) in self.param_cache:
            return self.param_cache[(id(value), dtype)]
        if value.name not in self.ranges:
            raise UserError(f"no calibration range for '{value.name}'; recalibrate the model")
        lo, hi = self.ranges[value.name]
        headroom = HEADROOM.get(dtype, 1.0)
        if self.per_channel.get(id(value)) == dtype:
            params = self.param_cache[(id(value), dtype)] = self._channel_params(value)
            return params
        live = (self._dtype_of, self.params, self._is_output, self.memo)
        lo, hi = live_range(value, lo * headroom, hi * headroom, *live)
        params = self.param_cache[(id(value), dtype)] = activation_params(lo, hi, dtype)
        return params

    def _channel_params(self, value: Value) -> QuantParams:
        """Each channel's calibrated min/max, narrowed per channel where a table reads the
        value (`channel_activations.edge_params`)."""
        dtype = self.per_channel[id(value)]
        absorbing = [user for user in value.users if id(user) in self.affine]
        narrow = None
        if not absorbing:  # the table is the end of the edge: where its code changes

            def narrow(lo: float, hi: float, c: int) -> tuple[float, float]:
                out = lambda v, kind: channel_of(self.params(v, kind), c)  # noqa: E731
                live = (self._dtype_of, out, self._is_output, self.memo)
                return live_range(value, lo, hi, *live)

        return edge_params(self.channel_ranges[value.name], dtype, narrow)

    def _dtype_of(self, node: Node) -> str | None:
        dtype = self.settings[id(node)].dtype
        return None if dtype == FLOAT else dtype

    def _writes(self, node: Node) -> str | None:
        """The dtype of `node`'s output (its layer's, or an `output_dtype` override's)."""
        dtype = self.settings[id(node)].writes
        return None if dtype == FLOAT else dtype

    def _is_output(self, value: Value) -> bool:
        return any(value is v for v in self.source.outputs)

    def as_float(self, value: Value) -> Value:
        if id(value) in self.float_of:
            return self.float_of[id(value)]
        if value.is_const:
            new = self.graph.add_constant(value.const, value.name)
        else:
            q = self.quant_of[(id(value), self.home[id(value)])]
            new = self.graph.make_node(
                "DequantizeLinear",
                [q],
                qdq_attrs(q.quant),
                f"{value.name}/dequantize",
                output_names=[value.name],
            ).output
        self.float_of[id(value)] = new
        return new

    def as_quant(self, value: Value, dtype: str) -> Value:
        key = (id(value), dtype)
        if key in self.quant_of:
            return self.quant_of[key]
        params = self.params(value, dtype)
        if value.is_const:
            new = self.graph.add_constant(
                quantize(value.numpy(), params, dtype), f"{value.name}_{dtype}"
            )
        elif id(value) in self.home:
            source = self.quant_of[(id(value), self.home[id(value)])]
            attrs = requantize_attrs(source.quant, params, dtype)
            new = self._node("Requantize", [source], attrs, f"{value.name}/to_{dtype}")
        else:
            attrs = {**qdq_attrs(params), "dtype": dtype}
            new = self._node("QuantizeLinear", [self.as_float(value)], attrs, value.name)
        new.quant = params
        self.quant_of[key] = new
        return new

    def _node(self, op: str, inputs, attrs, name: str) -> Value:
        return self.graph.make_node(op, inputs, attrs, name, output_names=[f"{name}_q"]).output

    def _produce(self, node: Node, op: str, inputs, attrs, dtype: str, params, out=None) -> None:
        """Emit the quantized node that replaces `node` (same name) with output `params`,
        producing `out` (default: the node's output)."""
        out = node.outputs[0] if out is None else out
        attrs = recording_float_op(op, attrs, node.op)  # partition keys match on it
        new = self.graph.make_node(op, inputs, attrs, node.name, output_names=[f"{out.name}_q"])
        new.output.quant = params
        self.quant_of[(id(out), dtype)] = new.output
        self.home[id(out)] = dtype

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> Graph:
        for value in self.source.inputs:  # input_type applies to float inputs (not indices)
            if self.config.input_type == FLOAT or value.dtype.kind != "f":
                self.float_of[id(value)] = self.graph.add_input(
                    value.name, value.dtype, value.shape
                )
            else:
                dtype = self.config.input_type
                new = self.graph.add_input(value.name, np.dtype(dtype), value.shape)
                new.quant = self.params(value, dtype)
                self.quant_of[(id(value), dtype)] = new
                self.home[id(value)] = dtype
        for node in self.source.nodes:
            if id(node) in self.absorbed:
                continue
            dtype = self.settings[id(node)].dtype
            if dtype == FLOAT or not self._quantized(node, dtype):
                self._float_island(node)
        self.graph.outputs = [self._output(v) for v in self.source.outputs]
        eliminate_dead_code(self.graph)
        return self.graph

    def _output(self, value: Value) -> Value:
        dtype = self.config.output_type if value.dtype.kind == "f" else FLOAT
        result = self.as_float(value) if dtype == FLOAT else self.as_quant(value, dtype)
        inner = self.float_of.get(id(value))  # a float node's output has the output's name:
        named = inner is not None and inner.name == value.name and inner not in self.graph.inputs
        if named and result is not inner:  # it gives the name up to the quantized output
            self.graph.rename(inner, f"{value.name}_float")
        if result.name != value.name:
            node = self.graph.make_node("Identity", [result], name=value.name)
            node.output.quant = result.quant
            result = node.output
        return result

    def _quantized(self, node: Node, dtype: str) -> bool:
        """Emit the integer form of `node` if its op has a quantization rule (`OPS[op].quant`)
        and the node meets the rule's conditions; False leaves it to a float island."""
        rule = OPS[node.op].quant
        if rule is None:
            return False
        applies, emit = RULES[rule]
        if not applies(self, node):
            return False
        try:
            emit(self, node, dtype)
        except MultiplierRangeError as error:
            # Scales too far apart for the fixed-point requantization (a near-constant tensor
            # next to a wide one, say): this node runs in float.
            log.info("node '%s' (%s) stays float: %s", node.name, node.op, error)
            return False
        return True

    # -- the rules: whether a node qualifies, and its integer form ----------------------------
    def _matmul_like(self, node: Node, dtype: str) -> None:
        _has_integer_form(node, "QConv", "QGemm")
        quantize_matmul(self, node, dtype, weight_dtype(dtype))

    def _binary_ok(self, node: Node) -> bool:
        return len(node.inputs) == 2

    def _binary(self, node: Node, dtype: str) -> None:
        _has_integer_form(node, "QAdd", "QMul")
        a, b = (self.as_quant(v, dtype) for v in node.inputs)
        out_params = self.params(node.output, dtype)
        clip = node.attrs.get("clip")
        op, attrs = binary_attrs(node.op, a.quant, b.quant, out_params, dtype, clip)
        self._produce(node, op, [a, b], attrs, dtype, out_params)

    def _concat(self, node: Node, dtype: str) -> None:
        inputs = [self.as_quant(v, dtype) for v in node.inputs]
        out_params = self.params(node.output, dtype)
        params = [v.quant for v in inputs]
        attrs = concat_attrs(node.attrs["axis"], params, out_params, dtype)
        self._produce(node, "QConcat", inputs, attrs, dtype, out_params)

    def _average_pool_ok(self, node: Node) -> bool:
        if node.op == "ReduceMean":
            return spatial_mean(node, dropped=True)
        return len(node.inputs[0].shape) > 2

    def _average_pool(self, node: Node, dtype: str) -> None:
        _has_integer_form(node, "QAveragePool")
        x = self.as_quant(node.inputs[0], dtype)
        out_params = self.params(node.output, dtype)
        attrs = average_pool_attrs(node.op, node.attrs, x.shape[2:], x.quant, out_params, dtype)
        out = node.output
        if node.op != "ReduceMean" or node.attrs.get("keepdims", 1):
            self._produce(node, "QAveragePool", [x], attrs, dtype, out_params)
            return
        # a spatial mean without kept dims (torch's x.mean((2, 3))): the pool, then a Reshape
        # of its codes dropping H and W
        names = [f"{out.name}_pooled_q"]
        attrs = recording_float_op("QAveragePool", attrs, node.op)
        pooled = self.graph.make_node("QAveragePool", [x], attrs, node.name, output_names=names)
        pooled.output.quant = out_params
        shape = {"shape": list(out.shape)}
        flat = self.graph.make_node(
            "Reshape", [pooled.output], shape, f"{node.name}/reshape", [f"{out.name}_q"]
        )
        flat.output.quant = out_params
        self.quant_of[(id(out), dtype)] = flat.output
        self.home[id(out)] = dtype

    def _lookup_ok(self, node: Node) -> bool:
        return constant_operands(node) is not None

    def _lookup(self, node: Node, dtype: str) -> None:
        """One table over every input code; on a per-channel edge it absorbs the scalar affine
        ops after it (`channel_activations`) and produces the last one's output."""
        x = self.as_quant(node.inputs[0], dtype)
        affine = self.affine.get(id(node), ())
        out = (affine[-1] if affine else node).output
        out_params = self.params(out, dtype)
        op = "QLookupInterp" if dtype == "int16" and out_params.axis is not None else "QLookup"
        key = ("table", id(node), op, x.quant, out_params, dtype, tuple(map(id, affine)))
        if key not in self.memo:  # the table's constant inputs
            if op == "QLookupInterp":  # knots, bends [, exact segments, their codes]
                tables = interpolated_table(node, x.quant, out_params, affine)
                tables = tables if tables.segments.size else tables[:2]
            else:
                tables = (lookup_table(node, x.quant, dtype, out_params, dtype, affine),)
            for array in tables:
                array.flags.writeable = False  # shared by every graph quantized with this memo
            self.memo[key] = tables
        names = ("table", "bends", "segments", "exact")
        inputs = [
            self.graph.add_constant(t, f"{node.name}_{n}") for t, n in zip(self.memo[key], names)
        ]
        self._produce(node, op, [x, *inputs], {"function": node.op}, dtype, out_params, out)
        self.absorbed.update(id(n) for n in affine)

    def _passthrough_ok(self, node: Node) -> bool:
        """Data movement runs on the codes of a quantized input when every output is a tensor
        of the input's type (not Dropout's boolean mask, say)."""
        x = node.inputs[0]
        return id(x) in self.home and all(v.dtype == x.dtype for v in node.outputs)

    def _passthrough(self, node: Node, dtype: str, attrs: dict | None = None) -> None:
        """The node on its input's codes, in the input's dtype (not the layer's `dtype`)."""
        dtype = self.home[id(node.inputs[0])]
        x = self.quant_of[(id(node.inputs[0]), dtype)]
        attrs = dict(node.attrs if attrs is None else attrs)
        inputs = [x, *node.inputs[1:]]
        names = [f"{v.name}_q" for v in node.outputs]
        new = self.graph.make_node(node.op, inputs, attrs, node.name, output_names=names)
        for old, value in zip(node.outputs, new.outputs):
            value.quant = x.quant
            self.quant_of[(id(old), dtype)] = value
            self.home[id(old)] = dtype

    def _pad_ok(self, node: Node) -> bool:
        """Padding passes through unless it fills with a constant other than real 0.0."""
        constant = node.attrs.get("mode", "constant") == "constant"
        return self._passthrough_ok(node) and (
            not constant or float(node.attrs.get("value", 0.0)) == 0.0
        )

    def _pad(self, node: Node, dtype: str) -> None:
        attrs = dict(node.attrs)
        if attrs.get("mode", "constant") == "constant":
            x = self.quant_of[(id(node.inputs[0]), self.home[id(node.inputs[0])])]
            attrs["value"] = x.quant.zero_point[0]  # real 0.0 is exactly the zero point
        self._passthrough(node, dtype, attrs)

    def _resize_ok(self, node: Node) -> bool:
        return self._passthrough_ok(node) and resizes_codes(node)

    def _softmax(self, node: Node, dtype: str) -> None:
        """QSoftmax: the exponential table of the input scale, the output multiplier."""
        x = self.as_quant(node.inputs[0], dtype)
        out_params = self.params(node.output, dtype)
        table = self.graph.add_constant(exp_table(x.quant.scale[0]), f"{node.name}_exp")
        attrs = softmax_attrs(node.attrs.get("axis", -1), out_params, dtype)
        self._produce(node, "QSoftmax", [x, table], attrs, dtype, out_params)

    def _recurrent(self, node: Node, dtype: str) -> None:
        quantize_recurrent(self, node, dtype, weight_dtype(dtype))

    def _float_island(self, node: Node) -> None:
        inputs = [None if v is None else self.as_float(v) for v in node.inputs]
        new = self.graph.make_node(
            node.op, inputs, node.attrs, node.name, output_names=[v.name for v in node.outputs]
        )
        for old, value in zip(node.outputs, new.outputs):
            self.float_of[id(old)] = value


# OpDef.quant (ops.registry.QUANT_RULES) -> (whether a node qualifies, the method emitting its
# integer form). The conditions a rule checks are generic (constant weights, two inputs, rank,
# constant lookup operands, a quantized input); which ops use a rule is stated in ops/.
Applies = Callable[[_Quantizer, Node], bool]
Emit = Callable[[_Quantizer, Node, str], None]
RULES: dict[str, tuple[Applies, Emit]] = {
    "matmul": (matmul_ok, _Quantizer._matmul_like),
    "binary": (_Quantizer._binary_ok, _Quantizer._binary),
    "concat": (lambda quantizer, node: True, _Quantizer._concat),
    "average_pool": (_Quantizer._average_pool_ok, _Quantizer._average_pool),
    "lookup": (_Quantizer._lookup_ok, _Quantizer._lookup),
    "passthrough": (_Quantizer._passthrough_ok, _Quantizer._passthrough),
    "pad": (_Quantizer._pad_ok, _Quantizer._pad),
    "resize": (_Quantizer._resize_ok, _Quantizer._passthrough),
    "softmax": (lambda quantizer, node: True, _Quantizer._softmax),
    "recurrent": (recurrent_ok, _Quantizer._recurrent),
}
# The ops quantized as lookup tables (a snapshot of the registry when this module loads).
LOOKUP = frozenset(name for name, op in OPS.items() if op.quant == "lookup")


def resizes_codes(node: Node) -> bool:
    """Nearest and linear interpolation run on the codes (weights sum to one, so the zero point
    maps to itself and nothing leaves the range); cubic and crops with an extrapolation value
    stay float."""
    modes = node.attrs.get("mode", "nearest") in ("nearest", "linear")
    crop = node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"
    return modes and not crop


def spatial_mean(node: Node, dropped: bool = False) -> bool:
    """A ReduceMean over height and width with kept dims: a global average pool (with
    `dropped`, also one without them: the pool, then a Reshape to [N, C])."""
    kept = bool(node.attrs.get("keepdims", 1)) or dropped
    return len(node.inputs[0].shape) == 4 and node.attrs["axes"] == [2, 3] and kept


def _has_integer_form(node: Node, *integer_ops: str) -> None:
    """The rules that emit an op-specific integer kernel know which ops they can (those the
    `integer_ops` they emit stand for): another op registered with such a rule is a programming
    error, not a float layer."""
    ops = [op for integer in integer_ops for op in OPS[integer].quantizes]
    if node.op not in ops:
        raise NotImplementedError(
            f"node '{node.name}': quantization rule '{OPS[node.op].quant}' has no integer form "
            f"for {node.op} (it knows {', '.join(ops)})"
        )


def quantize_graph(
    graph: Graph,
    ranges: Mapping[str, tuple[float, float]],
    config: QuantConfig | None = None,
    channel_means: Mapping[str, np.ndarray] | None = None,
    round_weights: WeightRounder = nearest,
    channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    memo: dict | None = None,
) -> Graph:
    """The integer-reference form of `graph` given calibration ranges per value name and, for
    bias correction, the mean of each channel of the layers' inputs (`CalibrationStats`);
    `round_weights` turns a layer's float weights into codes (`adaround.LearnedRounding`);
    `channel_ranges` (per-channel min/max) serve `activation_granularity = "channel"`. A `memo`
    (a dict) shared by quantizations of the same `graph` with the same ranges computes each
    lookup table and live range once (mixed precision's probes)."""
    quantizer = _Quantizer(
        graph,
        ranges,
        config or QuantConfig(),
        channel_means or {},
        round_weights,
        channel_ranges or {},
        {} if memo is None else memo,
    )
    return quantizer.run()
