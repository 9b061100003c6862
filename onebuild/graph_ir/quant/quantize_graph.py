"""Full quantization of a float graph into the integer reference form.

Conv and Gemm with constant weights become QConv / QGemm (symmetric int8 weights per channel or
per tensor, int32 bias with scale s_x * s_w, fixed-point requantization). Value-preserving data
movement (MaxPool, Reshape, Transpose) runs on the quantized values with unchanged parameters.
Every other op runs in float between DequantizeLinear and QuantizeLinear nodes. Model inputs and
outputs stay float32 (quantized and dequantized at the boundary).
"""

from collections.abc import Mapping

import numpy as np

from ...errors import UserError
from ..ir import Graph, Node, Value
from ..tensor import QuantParams
from .params import activation_params, quantize, quantize_multiplier, weight_params

PASSTHROUGH = {"MaxPool", "Reshape", "Transpose", "Identity", "Dropout"}
ACTIVATION_TYPES = ("uint8", "int8")


class _Quantizer:
    def __init__(self, source: Graph, ranges, dtype: str, granularity: str):
        if dtype not in ACTIVATION_TYPES:
            raise UserError(f"integer reference: activation type {dtype} is not supported yet")
        self.source, self.ranges, self.dtype = source, ranges, dtype
        self.per_channel = granularity == "channel"
        self.graph = Graph(source.name)
        self.float_of: dict[int, Value] = {}  # source value -> float value in the new graph
        self.quant_of: dict[int, Value] = {}  # source value -> quantized value in the new graph

    def params(self, value: Value) -> QuantParams:
        if value.name not in self.ranges:
            raise UserError(f"no calibration range for '{value.name}'; recalibrate the model")
        lo, hi = self.ranges[value.name]
        return activation_params(lo, hi, self.dtype)

    def as_float(self, value: Value) -> Value:
        if id(value) in self.float_of:
            return self.float_of[id(value)]
        if value.is_const:
            new = self.graph.add_constant(value.const, value.name)
        else:
            q = self.quant_of[id(value)]
            attrs = {"scale": q.quant.scale[0], "zero_point": q.quant.zero_point[0]}
            node = self.graph.make_node(
                "DequantizeLinear", [q], attrs, f"{value.name}_dq", output_names=[value.name]
            )
            new = node.output
        self.float_of[id(value)] = new
        return new

    def as_quant(self, value: Value) -> Value:
        if id(value) in self.quant_of:
            return self.quant_of[id(value)]
        params = self.params(value)
        attrs = {"scale": params.scale[0], "zero_point": params.zero_point[0], "dtype": self.dtype}
        new = self.graph.make_node(
            "QuantizeLinear",
            [self.as_float(value)],
            attrs,
            f"{value.name}_q",
            output_names=[f"{value.name}_q"],
        ).output
        new.quant = params
        self.quant_of[id(value)] = new
        return new

    def run(self) -> Graph:
        for value in self.source.inputs:
            self.float_of[id(value)] = self.graph.add_input(value.name, value.dtype, value.shape)
        for node in self.source.nodes:
            if node.op in ("Conv", "Gemm") and self._quantizable(node):
                self._matmul_like(node)
            elif node.op in PASSTHROUGH and id(node.inputs[0]) in self.quant_of:
                self._passthrough(node)
            else:
                self._float_island(node)
        outputs = []
        for value in self.source.outputs:
            result = self.as_float(value)
            if result.name != value.name:
                node = self.graph.make_node(
                    "Identity", [result], name=value.name, output_names=[value.name]
                )
                result = node.output
            outputs.append(result)
        self.graph.outputs = outputs
        return self.graph

    def _quantizable(self, node: Node) -> bool:
        weight = node.inputs[1]
        if not weight.is_const or (node.op == "Gemm" and node.attrs.get("transA")):
            return False
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        return bias is None or bias.is_const

    def _matmul_like(self, node: Node) -> None:
        x = self.as_quant(node.inputs[0])
        out = node.output
        out_params = self.params(out)
        w = node.inputs[1].numpy().astype(np.float64)
        if node.op == "Gemm":
            alpha = node.attrs.get("alpha", 1.0)
            w = w * alpha
            w_channels = w if node.attrs.get("transB") else w.T  # [N, K]
        else:
            w_channels = w
        w_params = weight_params(w_channels, "int8", 0 if self.per_channel else None)
        scales = np.broadcast_to(np.asarray(w_params.scale), (w_channels.shape[0],))
        wq = quantize(w_channels, QuantParams(tuple(scales), (0,) * len(scales), 0), "int8")
        if node.op == "Gemm":
            wq = wq if node.attrs.get("transB") else wq.T
        s_x = x.quant.scale[0]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None else None
        b = np.zeros(w_channels.shape[0]) if bias is None else bias.numpy().astype(np.float64)
        if node.op == "Gemm":
            b = b * node.attrs.get("beta", 1.0)
        bq = np.rint(np.broadcast_to(b, scales.shape) / (s_x * scales)).astype(np.int32)
        multipliers = [quantize_multiplier(s_x * s / out_params.scale[0]) for s in scales]
        # Output saturation uses the full type range; QRANGE is the symmetric range scales use.
        info = np.iinfo(self.dtype)
        qmin, qmax = int(info.min), int(info.max)
        zp = out_params.zero_point[0]
        if "clip" in node.attrs:
            lo, hi = node.attrs["clip"]
            qmin = max(
                qmin, int(np.ceil(lo / out_params.scale[0] + zp)) if np.isfinite(lo) else qmin
            )
            qmax = min(
                qmax, int(np.floor(hi / out_params.scale[0] + zp)) if np.isfinite(hi) else qmax
            )
        keep = ("strides", "dilations", "pads", "group") if node.op == "Conv" else ("transB",)
        attrs = {k: node.attrs[k] for k in keep if k in node.attrs}
        attrs.update(
            {
                "dtype": self.dtype,
                "x_zero_point": x.quant.zero_point[0],
                "y_zero_point": zp,
                "multiplier": [m for m, _ in multipliers],
                "shift": [r for _, r in multipliers],
                "qmin": qmin,
                "qmax": qmax,
            }
        )
        w_value = self.graph.add_constant(wq, node.inputs[1].name + "_q")
        w_value.quant = w_params
        b_value = self.graph.add_constant(bq, (bias.name if bias else node.name + "_bias") + "_q")
        new = self.graph.make_node(
            "Q" + node.op, [x, w_value, b_value], attrs, node.name, output_names=[f"{out.name}_q"]
        ).output
        new.quant = out_params
        self.quant_of[id(out)] = new

    def _passthrough(self, node: Node) -> None:
        x = self.quant_of[id(node.inputs[0])]
        new = self.graph.make_node(
            node.op, [x], node.attrs, node.name, output_names=[f"{node.outputs[0].name}_q"]
        )
        new.outputs[0].quant = x.quant
        self.quant_of[id(node.outputs[0])] = new.outputs[0]

    def _float_island(self, node: Node) -> None:
        inputs = [None if v is None else self.as_float(v) for v in node.inputs]
        new = self.graph.make_node(
            node.op, inputs, node.attrs, node.name, output_names=[v.name for v in node.outputs]
        )
        for old, value in zip(node.outputs, new.outputs):
            self.float_of[id(old)] = value


def quantize_graph(
    graph: Graph,
    ranges: Mapping[str, tuple[float, float]],
    dtype: str = "uint8",
    granularity: str = "channel",
) -> Graph:
    """The integer-reference form of `graph` given calibration ranges per value name."""
    return _Quantizer(graph, ranges, dtype, granularity).run()
