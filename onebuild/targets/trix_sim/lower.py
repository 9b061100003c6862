"""Quantized IR -> plain op descriptions: the common input of the encoder and the perf model.

A `Program` holds tensor descriptions (shape as (C, H, W), dtype, scale, zero point) and one
`Layer` per NPU operation, with static integer parameters and constant arrays (weights, bias,
per-channel multipliers and shifts, lookup tables). Nothing here knows instructions or cycles.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...errors import ModelError
from ...graph_ir.ir import Graph, Node, Value
from ...graph_ir.ops import OPS
from ...graph_ir.quant.float_reason import float_reason
from ...graph_ir.tensor import QuantParams
from .constraints import (
    GENERIC,
    Constraint,
    batch_axis_kept,
    batch_one,
    broadcast_operands,
    channel_activations,
    channel_concat,
    channel_limit,
    channel_softmax,
    column_transpose,
    forward_slice,
    gemm_rows_layout,
    kernel_size,
    move_fits_sram,
    pass_through_dtype,
    per_channel,
    per_tensor_activations,
    pool_without_ceil,
    quantized_io,
    reason,
    resize_on_grid,
    resize_taps,
    rows_view,
    spatial_pad,
    spatial_resize,
    stride_limit,
    tile_fits_sram,
)
from .gemm_tiles import channel_parts
from .hardware import Hardware


@dataclass(frozen=True)
class TensorDesc:
    name: str
    shape: tuple[int, int, int]  # (channels, height, width) of the single batch
    dims: tuple[int, ...]  # the IR shape
    dtype: str
    scale: float  # a tensor quantized per channel (never a program input or output) keeps
    zero_point: int  # its first channel's here; the layers that touch it hold every channel's

    @property
    def params(self) -> QuantParams:
        return QuantParams((self.scale,), (self.zero_point,), None)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass
class Layer:
    kind: str  # conv | gemm | add | mul | avgpool | maxpool | lookup | requant | softmax | concat
    # | reshape, or a data move (moves.MOVES); tvn_layers.REQUIRED lists them all
    name: str
    inputs: list[str]
    output: str
    attrs: dict[str, int | list[int]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def macs(self, tensors: dict[str, TensorDesc]) -> int:
        out = tensors[self.output].shape
        if self.kind == "conv":
            w = self.arrays["weights"].shape
            return int(np.prod(out)) * int(np.prod(w[1:]))
        if self.kind == "gemm":  # over the rows of its output [M, N]
            return int(self.arrays["weights"].size) * math.prod(tensors[self.output].dims[:-1])
        return 0


@dataclass
class Program:
    tensors: dict[str, TensorDesc]
    layers: list[Layer]
    inputs: list[str]
    outputs: list[str]


WINDOWED = ("conv", "maxpool", "avgpool")  # layers reading windows: they run on row tiles


def window_span(layer: Layer, rows: int) -> int:
    """Input rows that `rows` consecutive output rows read (before clipping to the tensor)."""
    if layer.kind not in WINDOWED:
        return rows
    a = layer.attrs
    return (rows - 1) * a["strides"][0] + (a["kernel"][0] - 1) * a["dilations"][0] + 1


def input_rows(layer: Layer, r0: int, r1: int, height: int) -> tuple[int, int]:
    """The input rows [i0, i1) that output rows [r0, r1) read, clipped to the tensor."""
    if layer.kind not in WINDOWED:
        return r0, r1
    a = layer.attrs
    lo = r0 * a["strides"][0] - a["pads"][0]
    return max(lo, 0), min(lo + window_span(layer, r1 - r0), height)


def tile_input_rows(layer: Layer, r0: int, r1: int, height: int, out_height: int):
    """The input rows an EXEC tile's operand holds, packed per channel: all of them for a
    whole-height tile (so an SRAM-resident tensor is used in place), else `input_rows`."""
    if r0 == 0 and r1 == out_height:
        return 0, height
    return input_rows(layer, r0, r1, height)


def chw(dims: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of a batch-1 tensor of rank 1 to 4 (missing trailing dims are 1); a Gemm's
    rows [M, K] (M > 1, no batch axis) are one channel of M rows of K."""
    if len(dims) == 2 and dims[0] != 1:
        return 1, int(dims[0]), int(dims[1])
    rest = list(dims[1:]) if len(dims) > 1 else list(dims)
    rest += [1] * (3 - len(rest))
    return int(rest[0]), int(rest[1]), int(rest[2])


def _tensor(value: Value) -> TensorDesc:
    q = value.quant
    return TensorDesc(
        value.name, chw(value.shape), value.shape, value.dtype.name, q.scale[0], q.zero_point[0]
    )


def _codes(number) -> int | list[int]:
    """A zero point or clamp: one integer, or one per channel (a list)."""
    if isinstance(number, (list, tuple, np.ndarray)):
        return [int(n) for n in number]
    return int(number)


def _output_attrs(node: Node) -> dict:
    return {k: _codes(node.attrs[k]) for k in ("y_zero_point", "qmin", "qmax")}


def _per_channel(node: Node, channels: int) -> dict[str, np.ndarray]:
    m = np.broadcast_to(np.asarray(node.attrs["multiplier"], np.int64), (channels,))
    r = np.broadcast_to(np.asarray(node.attrs["shift"], np.int64), (channels,))
    return {"multiplier": m.copy(), "shift": r.copy()}


@dataclass(frozen=True)
class OpLowering:
    """What the NPU does with one IR op: the constraints a node must meet (besides every op's
    GENERIC ones) and the layer it becomes."""

    constraints: tuple[Constraint, ...]
    build: Callable[[Node, list[str], str], "Layer | list[Layer]"]


LOWERINGS: dict[str, OpLowering] = {}


def _lowers(*ops: str, constraints: tuple[Constraint, ...] = (), generic=GENERIC):
    """Register the decorated function as the layer builder of `ops` on the NPU, with the
    `generic` constraints (every op's, unless said otherwise) and its own."""

    def wrap(build):
        for op in ops:
            LOWERINGS[op] = OpLowering((*generic, *constraints), build)
        return build

    return wrap


def channel_region(node: Node, hw: Hardware) -> bool:
    """every layer that writes or reads a value quantized per channel must run on the NPU,
    and no such value may be a model input or output (NPU program inputs and outputs are
    quantized per tensor)"""
    seen, todo = {node}, [v for v in (*node.inputs, *node.outputs) if per_channel(v)]
    while todo:
        value = todo.pop()
        if value.producer is None or (value.graph and value in value.graph.outputs):
            return False
        for other in (value.producer, *value.users):
            if other in seen:
                continue
            seen.add(other)
            if _failed(other, hw, skip=channel_region):
                return False
            todo += [v for v in (*other.inputs, *other.outputs) if per_channel(v)]
    return True


# the generic constraints of the layers that may touch values quantized per channel: GENERIC
# with per_tensor_activations replaced by what such layers need
CHANNEL_ONES = {per_tensor_activations: (channel_activations, channel_region)}
CHANNEL_GENERIC = tuple(c for g in GENERIC for c in CHANNEL_ONES.get(g, (g,)))


@_lowers("QConv", constraints=(kernel_size, stride_limit, tile_fits_sram), generic=CHANNEL_GENERIC)
def _conv(node: Node, ins: list[str], out: str) -> Layer:
    a, w, b = node.attrs, node.inputs[1].numpy(), node.inputs[2].numpy()
    attrs = {
        "kernel": list(w.shape[2:]) + [1] * (4 - w.ndim),
        "strides": list(a["strides"]) + [1] * (2 - len(a["strides"])),
        "dilations": list(a["dilations"]) + [1] * (2 - len(a["dilations"])),
        "pads": _pads_2d(a["pads"]),
        "group": int(a["group"]),
        "x_zero_point": _codes(a["x_zero_point"]),
        **_output_attrs(node),
    }
    weights = w.reshape(w.shape[0], w.shape[1], *attrs["kernel"])
    arrays = {"weights": weights, "bias": b.astype(np.int64), **_per_channel(node, len(w))}
    return Layer("conv", node.name, ins, out, attrs, arrays)


# a Gemm's input [M, K] and output [M, N] hold M rows (of a sequence), not a batch axis; one
# wider than max_channels runs as several layers (`gemm_tiles.channel_parts`)
ROWS_GENERIC = tuple(c for c in GENERIC if c not in (batch_one, channel_limit))


@_lowers("QGemm", constraints=(gemm_rows_layout, tile_fits_sram), generic=ROWS_GENERIC)
def _gemm(node: Node, ins: list[str], out: str) -> Layer:
    """A vector [1, K] or the rows [M, K] of a sequence times [K, N] (the layer's output
    tiles are rows x output channels)."""
    a, w = node.attrs, node.inputs[1].numpy()
    w = w if a.get("transB") else w.T  # [N, K]
    arrays = {
        "weights": np.ascontiguousarray(w),
        "bias": node.inputs[2].numpy().astype(np.int64),
        **_per_channel(node, w.shape[0]),
    }
    attrs = {"x_zero_point": int(a["x_zero_point"]), **_output_attrs(node)}
    return Layer("gemm", node.name, ins, out, attrs, arrays)


@_lowers("QAdd", "QMul", constraints=(broadcast_operands,))
def _elementwise(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    attrs = {
        "a_zero_point": int(a["a_zero_point"]),
        "b_zero_point": int(a["b_zero_point"]),
        "multiplier": int(a["multiplier"]),
        "shift": int(a["shift"]),
        **_output_attrs(node),
    }
    arrays = {}
    const = [i for i, v in enumerate(node.inputs) if v.is_const]
    if const:  # a constant operand: one code per channel (or a scalar), or per row
        value, out_shape = node.inputs[const[0]], node.outputs[0].shape
        codes = np.broadcast_to(value.numpy().astype(np.int64), out_shape).reshape(chw(out_shape))
        per_channel = (codes == codes[:, :1, :1]).all()
        attrs["const_index"] = const[0]
        if not per_channel:  # over the last axis of a sequence [1, T, N]: (T, N, 1)'s rows
            attrs["const_axis"] = 1
        operand = codes[:, 0, 0] if per_channel else codes[0, :, 0]
        arrays["operand"] = np.ascontiguousarray(operand)
    elif node.inputs[0].shape != node.inputs[1].shape:
        # a computed per-channel vector (squeeze-excitation): the full tensor goes first
        vector = 0 if node.inputs[0].shape != node.outputs[0].shape else 1
        attrs["vector_index"] = vector
        ins = [ins[1 - vector], ins[vector]]
    if node.op == "QAdd":
        attrs.update(
            {
                "a_rescale": list(a["a_rescale"]),
                "b_rescale": list(a["b_rescale"]),
                "subtract": int(a.get("subtract", 0)),
            }
        )
    return Layer("add" if node.op == "QAdd" else "mul", node.name, ins, out, attrs, arrays)


def _window(node: Node) -> dict:
    a = node.attrs
    return {
        "kernel": list(a["kernel_shape"]) + [1] * (2 - len(a["kernel_shape"])),
        "strides": list(a["strides"]) + [1] * (2 - len(a["strides"])),
        "dilations": list(a["dilations"]) + [1] * (2 - len(a["dilations"])),
        "pads": _pads_2d(a["pads"]),
        "ceil_mode": int(a.get("ceil_mode", 0)),
    }


_POOL = (kernel_size, stride_limit, pool_without_ceil)


@_lowers("MaxPool", constraints=(kernel_size, stride_limit, pass_through_dtype))
def _max_pool(node: Node, ins: list[str], out: str) -> Layer:
    """ceil_mode becomes extra bottom/right padding (with the lowest code, which no window's
    maximum takes: every window holds an input element)."""
    attrs = _window(node)
    if attrs["ceil_mode"]:
        x, y = node.inputs[0].shape[2:], node.outputs[0].shape[2:]
        x, y = [*x, 1][:2], [*y, 1][:2]
        for axis in (0, 1):
            reach = (attrs["kernel"][axis] - 1) * attrs["dilations"][axis] + 1
            last = (y[axis] - 1) * attrs["strides"][axis] + reach  # padded length needed
            extra = last - x[axis] - attrs["pads"][axis]
            attrs["pads"][axis + 2] = max(attrs["pads"][axis + 2], extra)
        attrs["ceil_mode"] = 0
    return Layer("maxpool", node.name, ins, out, attrs)


@_lowers("QAveragePool", constraints=_POOL)
def _average_pool(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    attrs = {
        **_window(node),
        "count_include_pad": int(a.get("count_include_pad", 0)),
        "x_zero_point": int(a["x_zero_point"]),
        **_output_attrs(node),
    }
    return Layer("avgpool", node.name, ins, out, attrs, {"ratio": np.float64(a["scale_ratio"])})


@_lowers("QLookup", generic=CHANNEL_GENERIC)
def _lookup(node: Node, ins: list[str], out: str) -> Layer:
    """A table of every input code, or one per channel ([C, codes]) where the input or
    output is quantized per channel."""
    return Layer("lookup", node.name, ins, out, {}, {"table": node.inputs[1].numpy()})


@_lowers("QSoftmax", constraints=(channel_softmax,))
def _softmax(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    attrs = {"multiplier": int(a["multiplier"]), "shift": int(a["shift"]), **_output_attrs(node)}
    return Layer("softmax", node.name, ins, out, attrs, {"table": node.inputs[1].numpy()})


@_lowers("Requantize")
def _requantize(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    attrs = {
        "x_zero_point": int(a["x_zero_point"]),
        "multiplier": int(a["multiplier"]),
        "shift": int(a["shift"]),
        **_output_attrs(node),
    }
    return Layer("requant", node.name, ins, out, attrs)


@_lowers("QConcat", constraints=(channel_concat,))
def _concat(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    attrs = {
        "x_zero_points": [int(z) for z in a["x_zero_points"]],
        "multiplier": [int(m) for m in a["multiplier"]],
        "shift": [int(r) for r in a["shift"]],
        **_output_attrs(node),
    }
    return Layer("concat", node.name, ins, out, attrs)


_MOVE = (pass_through_dtype, move_fits_sram)
# no per-channel parameters: any number of channels
MOVING = (quantized_io, per_tensor_activations, batch_one)
VIEWING = (quantized_io, per_tensor_activations, rows_view)  # a view may hold a Gemm's rows
PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _chw_ranges(ranges: list[tuple[int, int, int]]) -> dict:
    """starts/ends/steps over (C, H, W) from per-IR-axis (start, stop, step) (batch dropped,
    missing trailing axes whole)."""
    ranges = list(ranges[1:]) + [(0, 1, 1)] * (4 - len(ranges))
    return {key: [r[i] for r in ranges] for i, key in enumerate(("starts", "ends", "steps"))}


@_lowers("Slice", constraints=(*_MOVE, forward_slice), generic=MOVING)
def _slice(node: Node, ins: list[str], out: str) -> Layer:
    a, shape = node.attrs, node.inputs[0].shape
    ranges = [
        slice(start, end, step).indices(size)
        for start, end, step, size in zip(a["starts"], a["ends"], a["steps"], shape)
    ]
    return Layer("slice", node.name, ins, out, _chw_ranges(ranges))


@_lowers("Split", constraints=_MOVE, generic=MOVING)
def _split(node: Node, ins: list[str], out: str) -> list[Layer]:
    """One slice layer per output."""
    shape, axis = node.inputs[0].shape, node.attrs["axis"] % len(node.inputs[0].shape)
    layers, start = [], 0
    for index, (value, size) in enumerate(zip(node.outputs, node.attrs["split"])):
        ranges = [(0, n, 1) for n in shape]
        ranges[axis] = (start, start + size, 1)
        name = f"{node.name}:{index}"
        layers.append(Layer("slice", name, ins, value.name, _chw_ranges(ranges)))
        start += size
    return layers


@_lowers("Transpose", constraints=(*_MOVE, batch_axis_kept, column_transpose), generic=MOVING)
def _transpose(node: Node, ins: list[str], out: str) -> Layer:
    perm = [p - 1 for p in node.attrs["perm"][1:]]
    perm += list(range(len(perm), 3))  # missing trailing axes (size 1) stay in place
    return Layer("transpose", node.name, ins, out, {"perm": perm})


@_lowers("Pad", constraints=(*_MOVE, spatial_pad), generic=MOVING)
def _pad(node: Node, ins: list[str], out: str) -> Layer:
    a = node.attrs
    pads = [a["pads"][2], a["pads"][3], a["pads"][6], a["pads"][7]]
    mode = PAD_MODES.index(a.get("mode", "constant"))
    attrs = {"pads": pads, "mode": mode, "value": int(a.get("value", 0))}
    return Layer("pad", node.name, ins, out, attrs)


@_lowers("DepthToSpace", constraints=_MOVE, generic=MOVING)
def _depth_to_space(node: Node, ins: list[str], out: str) -> Layer:
    attrs = {"blocksize": int(node.attrs["blocksize"]), "crd": int(node.attrs["mode"] == "CRD")}
    return Layer("depth_to_space", node.name, ins, out, attrs)


@_lowers("Resize", constraints=(*_MOVE, spatial_resize, resize_on_grid), generic=MOVING)
def _resize(node: Node, ins: list[str], out: str) -> Layer:
    rows, cols = resize_taps(node)
    return Layer("resize", node.name, ins, out, {}, {"rows": rows, "cols": cols})


VIEWS = tuple(name for name, op in OPS.items() if op.view)  # the registry's: Reshape, ...


@_lowers(*VIEWS, constraints=(pass_through_dtype,), generic=VIEWING)
def _view(node: Node, ins: list[str], out: str) -> Layer:
    return Layer("reshape", node.name, ins, out)  # the same bytes, another shape


def unsupported(node: Node, hw: Hardware) -> list[str]:
    """The reasons `node` cannot run on the NPU (empty when it can)."""
    return _failed(node, hw)


def _failed(node: Node, hw: Hardware, skip: Constraint | None = None) -> list[str]:
    lowering = LOWERINGS.get(node.op)
    if lowering is None and any(v.dtype.kind == "f" for v in node.outputs):
        why = float_reason(node)
        return [f"{node.op} computes in float ({why}); the NPU runs quantized ops only"]
    if lowering is None:
        return [f"{node.op} is not an NPU operation"]
    failed = []
    for constraint in lowering.constraints:
        if constraint is skip:
            continue
        try:
            ok = constraint(node, hw)
        except (KeyError, IndexError, AttributeError, ValueError):
            ok = False
        if not ok:
            failed.append(reason(constraint))
    return failed


def _layers(node: Node, hw: Hardware) -> list[Layer]:
    ins = [v.name for v in node.inputs if v is not None and not v.is_const]
    built = LOWERINGS[node.op].build(node, ins, node.outputs[0].name)
    layers = built if isinstance(built, list) else [built]
    return [part for layer in layers for part in channel_parts(layer, hw.max_channels)]


def _pads_2d(pads: list[int]) -> list[int]:
    """(top, left, bottom, right) from ONNX begin/end pads of 1 or 2 spatial dims."""
    if len(pads) == 2:
        return [pads[0], 0, pads[1], 0]
    return [pads[0], pads[1], pads[2], pads[3]]


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def lower(graph: Graph, hw: Hardware) -> Program:
    """The NPU program of a quantized graph whose inputs and outputs are all quantized."""
    failures: dict[str, list[str]] = {}
    for node in graph.nodes:
        for why in unsupported(node, hw):
            failures.setdefault(why, []).append(f"{node.name} ({node.op})")
    for value in [*graph.inputs, *graph.outputs]:
        if value.quant is None or not np.issubdtype(value.dtype, np.integer):
            failures.setdefault("NPU model inputs and outputs must be quantized", []).append(
                f"'{value.name}'"
            )
        elif per_channel(value):
            failures.setdefault(reason(channel_region), []).append(f"'{value.name}'")
    if failures:
        problems = [f"{why}: {_some(nodes)}" for why, nodes in failures.items()]
        raise ModelError(f"graph '{graph.name}' cannot run on {hw.name}: " + "; ".join(problems))
    tensors = {v.name: _tensor(v) for v in graph.inputs}
    layers = []
    for node in graph.nodes:
        tensors.update({v.name: _tensor(v) for v in node.outputs})
        layers += _layers(node, hw)
    return Program(tensors, layers, [v.name for v in graph.inputs], [v.name for v in graph.outputs])
