"""What to quantize and how: the settings shared by full and weight-only quantization."""

import difflib
from dataclasses import dataclass

from ...errors import UserError
from ..ir import Graph, Node
from ..ops import OPS

FLOAT = "float32"


@dataclass(frozen=True)
class LayerOverride:
    """Mixed precision: nodes named (by node or output name) get another dtype/granularity."""

    names: tuple[str, ...]
    dtype: str | None = None  # a quantized dtype, or "float32" to keep the layer float
    granularity: str | None = None
    # Conv/Gemm/MatMul only: the output's dtype when it differs from the dtype the layer
    # computes in (uint8 inputs, int8 weights, int32 sums written as int16: activation-only
    # promotion, `mixed_precision`)
    output_dtype: str | None = None


@dataclass(frozen=True)
class QuantConfig:
    dtype: str = "uint8"  # activations (full) or weights (weight-only)
    granularity: str = "channel"  # weights: "channel" or "layer"
    input_type: str = FLOAT
    output_type: str = FLOAT
    layers: tuple[LayerOverride, ...] = ()
    bias_correction: bool = True  # full mode: correct biases for the mean weight-rounding error
    # full mode: "channel" quantizes the Conv -> [table] -> Conv edges per channel
    activation_granularity: str = "tensor"
    # the dtypes such an edge may take per channel (a target lowers some: the rest per tensor)
    channel_dtypes: tuple[str, ...] = ("uint8", "int8", "int16")
    # edges into convolutions that are not depthwise too (their weights fold the input scales);
    # off under mixed precision, whose units do not keep such edges whole
    fold_scales: bool = True

    @property
    def quantized_dtypes(self) -> set[str]:
        """Every dtype the default and the overrides ask for, float32 excluded."""
        named = (d for o in self.layers for d in (o.dtype, o.output_dtype) if d)
        return {self.dtype, *named} - {FLOAT}


@dataclass(frozen=True)
class LayerSetting:
    dtype: str
    granularity: str
    output_dtype: str | None = None  # None: `dtype`

    @property
    def writes(self) -> str:
        """The dtype of the layer's output."""
        return self.output_dtype or self.dtype


def layer_settings(graph: Graph, config: QuantConfig) -> dict[int, LayerSetting]:
    """The setting of every node (by id); unknown override names are one-line errors."""
    default = LayerSetting(config.dtype, config.granularity)
    by_name: dict[str, Node] = {}
    for node in graph.nodes:
        by_name[node.name] = node
        for value in node.outputs:
            by_name.setdefault(value.name, node)
    settings = {id(node): default for node in graph.nodes}
    for index, override in enumerate(config.layers):
        for name in override.names:
            node = by_name.get(name)
            if node is None:
                close = difflib.get_close_matches(name, list(by_name), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise UserError(f"quantize.layers[{index}]: no node or tensor named '{name}'{hint}")
            current = settings[id(node)]
            output_dtype = override.output_dtype or current.output_dtype
            if output_dtype == FLOAT:
                raise UserError(
                    f"quantize.layers[{index}]: output_dtype must be a quantized dtype, not "
                    f"'{FLOAT}' (use dtype = '{FLOAT}' to keep '{name}' float)"
                )
            if output_dtype is not None and OPS[node.op].quant != "matmul":
                raise UserError(
                    f"quantize.layers[{index}]: output_dtype applies to Conv, Gemm and MatMul "
                    f"layers; '{name}' is {node.op}"
                )
            settings[id(node)] = LayerSetting(
                override.dtype or current.dtype,
                override.granularity or current.granularity,
                output_dtype,
            )
    return settings
