"""IR -> ONNX (opset 21), so any build stage opens in Netron and runs in onnxruntime.

Float ops map back to their ONNX form (canonical attributes that ONNX takes as inputs, such as
Reshape's shape, become initializers; a fused `clip` becomes a Relu or Clip node). Quantized ops
export in QDQ form: DequantizeLinear on each quantized input, the float op, the fused activation,
QuantizeLinear with the output's parameters. Lookup tables export exactly, as a Gather from the
table. Data movement on quantized values is wrapped the same way (DQ -> op -> Q), which is exact.
"""

import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import UserError
from ...fileio import atomic_write_bytes
from ..ir import Graph, Model, Node, Value
from ..ops import OPS
from ..ops.control import BRANCHES
from ..ops.registry import rule_of
from ..quant.channel_activations import folds_scales
from ..quant.model_io import is_quantized
from ..quant.params import qdq_params
from ..tensor import QuantParams
from .naming import fresh_name
from .onnx_export_forms import dilated_average, resize
from .onnx_lookups import interpolated_lookup, lookup
from .onnx_ops_index import ONNX_ACTIVATIONS

OPSET = 21
IR_VERSION = 10
INT64_MAX = np.iinfo(np.int64).max

# quantized op -> the float op its QDQ form uses (QAdd: Sub when it subtracts); the recurrent
# ones have none (int16 gates and cell state: no ONNX operator computes them)
QUANTIZED = {
    name: op.quantizes[0]
    for name, op in OPS.items()
    if op.quantizes and rule_of(name) != "recurrent"
}
NO_QDQ_FORM = {name for name, op in OPS.items() if op.quantizes} - set(QUANTIZED)
FLOAT_ATTRS = {  # attributes the float form keeps
    "Conv": ("strides", "dilations", "pads", "group"),
    "Gemm": ("transB",),
    "Mul": (),
    "Add": (),
    "Sub": (),
    "Concat": ("axis",),
    "Softmax": ("axis",),
    "AveragePool": (
        "kernel_shape",
        "strides",
        "dilations",
        "pads",
        "ceil_mode",
        "count_include_pad",
    ),
}
INTERNAL_ATTRS = {"clip", "mask", "round_mode"}


def _onnx_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class _Exporter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.names = {v.name for v in graph.inputs} | set(graph.constants)
        self.names |= {v.name for n in graph.nodes for v in n.outputs}
        self.node_names: set[str] = set()  # onnxruntime refuses a model naming two nodes alike

    def fresh(self, base: str) -> str:
        return fresh_name(self.names, base)

    def constant(self, array: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def emit(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> None:
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if op == "AveragePool" and set(attrs.get("dilations", [1])) == {1}:
            attrs.pop("dilations", None)  # the default; onnxruntime's QDQ fusion rejects it
        name = fresh_name(self.node_names, name)
        self.nodes.append(helper.make_node(op, inputs, outputs, name, **attrs))

    # -- QDQ helpers -------------------------------------------------------------------------
    def qdq_operands(self, params: QuantParams, dtype: np.dtype, base: str) -> list[str]:
        scale = np.asarray(params.scale, np.float32)
        zero = np.asarray(params.zero_point).astype(dtype)
        if params.axis is None:
            scale, zero = scale.reshape(()), zero.reshape(())
        return [self.constant(scale, f"{base}_scale"), self.constant(zero, f"{base}_zero_point")]

    def dequantize(self, value: Value, base: str, params: QuantParams | None = None) -> str:
        """A float view of a quantized value (its own parameters, unless `params`)."""
        out = self.fresh(f"{base}_dq")
        params = value.quant if params is None else params
        name = value.name if params is value.quant else f"{base}_steps"
        operands = self.qdq_operands(params, value.dtype, name)
        self.emit("DequantizeLinear", [value.name, *operands], [out], out, axis=params.axis)
        return out

    def quantize(self, source: str, value: Value, node_name: str) -> None:
        operands = self.qdq_operands(value.quant, value.dtype, value.name)
        self.emit(
            "QuantizeLinear",
            [source, *operands],
            [value.name],
            f"{node_name}/quantize",
            axis=value.quant.axis,
        )

    def activation(self, source: str, attrs: dict, out: Value, base: str) -> str:
        """The fused activation of a quantized node, from its saturation bounds, in float."""
        info = np.iinfo(out.dtype)
        if out.quant.axis is not None:
            return self.channel_bounds(source, attrs, out, base)
        if attrs["qmin"] <= info.min and attrs["qmax"] >= info.max:
            return source
        scale, zp = out.quant.scale[0], out.quant.zero_point[0]
        result = self.fresh(f"{base}_act")
        if attrs["qmin"] == zp and attrs["qmax"] >= info.max:
            self.emit("Relu", [source], [result], f"{base}/relu")
        else:
            lo = np.float32((attrs["qmin"] - zp) * scale)
            hi = np.float32((attrs["qmax"] - zp) * scale)
            bounds = [self.constant(lo, f"{base}_min"), self.constant(hi, f"{base}_max")]
            self.emit("Clip", [source, *bounds], [result], f"{base}/clip")
        return result

    def channel_bounds(self, source: str, attrs: dict, out: Value, base: str) -> str:
        """Per-channel saturation bounds as Max / Min with [1, C, 1, ...] constants (the ones
        that narrow the type's range)."""
        info = np.iinfo(out.dtype)
        scale, zp = (np.asarray(a, np.float64) for a in (out.quant.scale, out.quant.zero_point))
        shape = (1, -1) + (1,) * (len(out.shape) - 2)
        for op, key, limit in (("Max", "qmin", info.min), ("Min", "qmax", info.max)):
            codes = np.asarray(attrs[key], np.float64)
            if (codes == limit).all():
                continue
            bound = ((codes - zp) * scale).astype(np.float32).reshape(shape)
            result = self.fresh(f"{base}_{op.lower()}")
            operand = self.constant(bound, f"{base}_{key}")
            self.emit(op, [source, operand], [result], f"{base}/{op.lower()}")
            source = result
        return source

    def fused_clip(self, node: Node, source: str, target: str) -> None:
        """A float node's fused `clip` as a Relu or Clip writing `target`."""
        lo, hi = node.attrs["clip"]
        if lo == 0 and hi == float("inf"):
            self.emit("Relu", [source], [target], f"{node.name}/relu")
            return
        bounds = [
            "" if not np.isfinite(b) else self.constant(np.float32(b), f"{node.name}_{k}")
            for b, k in ((lo, "min"), (hi, "max"))
        ]
        self.emit("Clip", [source, *bounds], [target], f"{node.name}/clip")

    # -- nodes -------------------------------------------------------------------------------
    def node(self, node: Node) -> None:
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            self.qdq_node(node)
        elif node.op in QUANTIZED:
            self.quantized_node(node)
        elif node.op == "QLookup":
            lookup(self, node)
        elif node.op == "QLookupInterp":
            interpolated_lookup(self, node)
        elif node.op in NO_QDQ_FORM:
            raise UserError(
                f"node '{node.name}' ({node.op}) has no QDQ form; to export, keep it float: "
                f'[[quantize.layers]] names = ["{node.name}"], dtype = "float32"'
            )
        elif node.op == "Requantize":
            x = node.inputs[0]
            self.quantize(self.dequantize(x, node.name), node.output, node.name)
        elif any(is_quantized(v) for v in node.inputs if v is not None):
            self.wrapped(node)
        else:
            self.float_node(node, [v.name for v in node.outputs])

    def qdq_node(self, node: Node) -> None:
        params = qdq_params(node.attrs)
        quantized = node.output if node.op == "QuantizeLinear" else node.inputs[0]
        operands = self.qdq_operands(params, quantized.dtype, node.name)
        self.emit(
            node.op,
            [node.inputs[0].name, *operands],
            [node.output.name],
            node.name,
            axis=params.axis,
        )

    def quantized_node(self, node: Node) -> None:
        attrs, out = node.attrs, node.output
        if node.op == "QAdd":
            op = "Sub" if attrs.get("subtract") else "Add"
        else:
            op = QUANTIZED[node.op]
        operands = node.inputs[:2] if node.op in ("QConv", "QGemm") else node.inputs
        operands = operands[:1] if node.op == "QSoftmax" else operands  # not the exp table
        views: list[QuantParams | None] = [None] * len(operands)
        if folds_scales(node):  # its input in steps (scale 1 per channel): s_x is in the weights
            x = node.inputs[0].quant
            views[0] = QuantParams((1.0,) * len(x.scale), x.zero_point, x.axis)
        inputs = [
            self.dequantize(v, f"{node.name}_in{i}", view)
            for i, (v, view) in enumerate(zip(operands, views))
        ]
        # onnxruntime fuses DQ -> Conv -> Q into QLinearConv, whose activations must be per
        # tensor: with per-channel ones the bias is added after the Conv, out of that pattern
        by_channel = any(v.quant.axis is not None for v in (node.inputs[0], out))
        if node.op in ("QConv", "QGemm") and not by_channel:
            inputs.append(self.bias(node.inputs[2], node.name))
        y = self.fresh(f"{node.name}_float")
        keep = {k: attrs[k] for k in FLOAT_ATTRS[op] if k in attrs}
        if op == "AveragePool" and set(attrs.get("dilations", [1])) != {1}:
            dilated_average(self, node, inputs[0], y)
        else:
            self.emit(op, inputs, [y], node.name, **keep)
        if node.op in ("QConv", "QGemm") and by_channel:
            y = self.bias_after(y, node.inputs[2], len(out.shape), node.name)
        self.quantize(self.activation(y, attrs, out, node.name), out, node.name)

    def bias_after(self, source: str, bias: Value, rank: int, base: str) -> str:
        """`source` + the real bias, broadcast along axis 1."""
        scale = np.asarray(bias.quant.scale, np.float64)
        real = (bias.numpy().astype(np.float64) * scale).astype(np.float32)
        operand = self.constant(real.reshape((1, -1) + (1,) * (rank - 2)), f"{base}_bias_float")
        result = self.fresh(f"{base}_biased")
        self.emit("Add", [source, operand], [result], f"{base}/bias")
        return result

    def bias(self, bias: Value, base: str) -> str:
        """int32 biases dequantize in ONNX; int64 ones (int16 models) become float constants."""
        if bias.dtype == np.int32:
            return self.dequantize(bias, f"{base}_bias")
        scale = np.asarray(bias.quant.scale, np.float64)
        real = (bias.numpy().astype(np.float64) * scale).astype(np.float32)
        return self.constant(real, f"{base}_bias_float")

    def wrapped(self, node: Node) -> None:
        """Data movement on quantized values: DQ -> float op -> Q with the same parameters."""
        inputs = [
            "" if v is None else (self.dequantize(v, node.name) if is_quantized(v) else v.name)
            for v in node.inputs
        ]
        outputs = [self.fresh(f"{v.name}_float") for v in node.outputs]
        attrs = dict(node.attrs)
        if node.op == "Pad" and "value" in attrs:
            x = node.inputs[0]
            attrs["value"] = (attrs["value"] - x.quant.zero_point[0]) * x.quant.scale[0]
        self.float_node(node, outputs, inputs, attrs)
        for index, (value, source) in enumerate(zip(node.outputs, outputs)):
            self.quantize(source, value, node.name if index == 0 else f"{node.name}_{index}")

    def float_node(self, node: Node, outputs: list[str], inputs=None, attrs=None) -> None:
        attrs = dict(node.attrs if attrs is None else attrs)
        inputs = [("" if v is None else v.name) for v in node.inputs] if inputs is None else inputs
        target = outputs
        if "clip" in attrs:
            target = [self.fresh(f"{outputs[0]}_preact")]
        attrs = {k: v for k, v in attrs.items() if k not in INTERNAL_ATTRS}
        convert = SPECIAL.get(node.op)
        if convert is not None:  # its attributes are ONNX's ("clip": a recurrent cell's)
            op, inputs, attrs = convert(self, node, inputs, attrs)
        else:
            op = node.op
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if node.op == "Dropout" and op == "Identity":
            target = target[:1]
        self.emit(op, inputs, target, node.name, **attrs)
        if "clip" in node.attrs:
            self.fused_clip(node, target[0], outputs[0])

    def run(self) -> onnx.GraphProto:
        for value in self.graph.constants.values():
            self.initializers.append(numpy_helper.from_array(value.numpy(), value.name))
        for node in self.graph.nodes:
            self.node(node)
        used = {name for node in self.nodes for name in node.input}
        self.initializers = [t for t in self.initializers if t.name in used]
        return helper.make_graph(
            self.nodes,
            self.graph.name,
            [_value_info(v) for v in self.graph.inputs],
            [_value_info(v) for v in self.graph.outputs],
            self.initializers,
        )


def _value_info(value: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, _onnx_type(value.dtype), list(value.shape))


# -- float ops whose canonical attributes are ONNX inputs ---------------------------------------
def _int64(ex: _Exporter, values, base: str) -> str:
    return ex.constant(np.asarray(values, np.int64), base)


def _reshape(ex, node, inputs, attrs):
    shape = _int64(ex, attrs.pop("shape"), f"{node.name}_shape")
    return node.op, [inputs[0], shape], attrs


def _tile(ex, node, inputs, attrs):
    return "Tile", [inputs[0], _int64(ex, attrs.pop("repeats"), f"{node.name}_repeats")], attrs


def _slice(ex, node, inputs, attrs):
    # a canonical end of None means "past the start" of a negative-step slice
    ends = [-INT64_MAX if e is None else e for e in attrs["ends"]]
    operands = [
        _int64(ex, attrs["starts"], f"{node.name}_starts"),
        _int64(ex, ends, f"{node.name}_ends"),
        _int64(ex, list(range(len(ends))), f"{node.name}_axes"),
        _int64(ex, attrs["steps"], f"{node.name}_steps"),
    ]
    return "Slice", [inputs[0], *operands], {}


def _split(ex, node, inputs, attrs):
    sizes = _int64(ex, attrs["split"], f"{node.name}_split")
    return "Split", [inputs[0], sizes], {"axis": attrs["axis"]}


def _pad(ex, node, inputs, attrs):
    x = node.inputs[0]
    pads = _int64(ex, attrs["pads"], f"{node.name}_pads")
    dtype = np.float32 if is_quantized(x) else x.dtype
    value = ex.constant(np.asarray(attrs.get("value", 0), dtype), f"{node.name}_value")
    return "Pad", [inputs[0], pads, value], {"mode": attrs.get("mode", "constant")}


def _reduce(ex, node, inputs, attrs):
    axes = _int64(ex, attrs.pop("axes"), f"{node.name}_axes")
    return node.op, [inputs[0], axes], attrs


def _arg_max(ex, node, inputs, attrs):
    (axis,) = attrs.pop("axes")
    return "ArgMax", inputs, {**attrs, "axis": axis}


def _cast(ex, node, inputs, attrs):
    return "Cast", inputs, {"to": _onnx_type(node.output.dtype)}


def _if(ex, node, inputs, attrs):
    """Branches become ONNX subgraphs without inputs that read the If's inputs by name."""
    branches = {
        key: _branch(node.attrs[key], inputs[1:], f"{node.name}.{key}/") for key in BRANCHES
    }
    return "If", inputs[:1], branches


def _loop(ex, node, inputs, attrs):
    """The body keeps its inputs up to the carried values and reads the rest by name."""
    own = 2 + node.attrs["carried"]
    body = _branch(node.attrs["body"], inputs[own:], f"{node.name}.body/", own)
    return "Loop", inputs[:own], {"body": body}


def _branch(graph: Graph, outer: list[str], prefix: str, own: int = 0) -> onnx.GraphProto:
    """`graph` exported, its inputs after the first `own` renamed to the `outer` values they
    stand for and its own names prefixed (ONNX subgraphs share the names of the scopes around
    them)."""
    proto = _Exporter(graph).run()
    names = {n: prefix + n for node in proto.node for n in node.output if n}
    names.update({t.name: prefix + t.name for t in proto.initializer})
    names.update({v.name: prefix + v.name for v in graph.inputs[:own]})
    names.update({v.name: name for v, name in zip(graph.inputs[own:], outer)})
    _rename(proto, names)
    given = {*outer, *(names[v.name] for v in graph.inputs[:own])}
    for output in proto.output:
        if output.name in given:  # a subgraph giving one of its inputs as it is
            copy = f"{prefix}{output.name}/output"
            proto.node.append(helper.make_node("Identity", [output.name], [copy]))
            output.name = copy
    del proto.input[own:]
    return proto


def _rename(proto: onnx.GraphProto, names: dict[str, str]) -> None:
    """Apply `names` to every reference in `proto` and the subgraphs it holds."""
    for node in proto.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename(attr.g, names)
    for item in (*proto.initializer, *proto.input, *proto.output, *proto.value_info):
        item.name = names.get(item.name, item.name)


def _dropout(ex, node, inputs, attrs):
    """Inference-mode Dropout is the identity, unless its mask output is read."""
    return ("Dropout" if node.attrs.get("mask") else "Identity"), inputs[:1], {}


def _swish(ex, node, inputs, attrs):
    """Swish is ONNX opset 24: x * Sigmoid(alpha x) at opset 21."""
    x = inputs[0]
    if attrs.get("alpha", 1.0) != 1.0:
        scaled = ex.fresh(f"{node.name}_scaled")
        alpha = ex.constant(np.asarray(attrs["alpha"], node.inputs[0].dtype), f"{node.name}_alpha")
        ex.emit("Mul", [x, alpha], [scaled], f"{node.name}_scale")
        x = scaled
    gate = ex.fresh(f"{node.name}_gate")
    ex.emit("Sigmoid", [x], [gate], f"{node.name}_sigmoid")
    return "Mul", [inputs[0], gate], {}


def _recurrent(ex, node, inputs, attrs):
    """LSTM/GRU/RNN: the IR's [name, alpha, beta] per function back to ONNX's activations and
    the alpha/beta lists that hold values only for the functions taking them."""
    functions = attrs.pop("activations")
    attrs["activations"] = [ONNX_ACTIVATIONS[name] for name, _, _ in functions]
    for key, index in (("activation_alpha", 1), ("activation_beta", 2)):
        values = [float(f[index]) for f in functions if f[index] is not None]
        if values:
            attrs[key] = values
    attrs["clip"] = attrs.pop("cell_clip")
    if node.op != "LSTM":
        attrs.pop("input_forget")
    if node.op != "GRU":
        attrs.pop("linear_before_reset")
    return node.op, inputs, attrs


SPECIAL: dict[str, Callable] = {
    "LSTM": _recurrent,
    "GRU": _recurrent,
    "RNN": _recurrent,
    "Swish": _swish,
    "Reshape": _reshape,
    "Expand": _reshape,
    "Tile": _tile,
    "Slice": _slice,
    "Split": _split,
    "Pad": _pad,
    "ReduceMean": _reduce,
    "ReduceMax": _reduce,
    "ReduceMin": _reduce,
    "ReduceSum": _reduce,
    "ReduceProd": _reduce,
    "Resize": resize,
    "ArgMax": _arg_max,
    "Cast": _cast,
    "Dropout": _dropout,
    "If": _if,
    "Loop": _loop,
}


def export_onnx(model: Model) -> onnx.ModelProto:
    """The main graph of `model` as an ONNX model (opset 21)."""
    graph = _Exporter(model.main).run()
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="onebuild",
        ir_version=IR_VERSION,
    )
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0]
        raise UserError(f"the exported ONNX model does not validate: {first}") from None
    return proto


def save_onnx(model: Model, path: str | os.PathLike) -> None:
    atomic_write_bytes(path, export_onnx(model).SerializeToString())
