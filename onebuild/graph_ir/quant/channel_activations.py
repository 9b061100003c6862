"""Per-channel activation quantization on the edges into convolutions.

In BatchNorm-folded mobile networks the channels of a convolution's input can differ in range by
orders of magnitude (up to 350x in the PicoDet layout detector): with one scale per tensor, a
quarter to half of them span fewer than 4 uint8 codes. `quantize.activation_granularity =
"channel"` gives the values of each edge

    Conv (constant weights) -> [one lookup table: HardSwish, Relu, Clip, ...
                                [-> Mul / Add / Sub by scalar constants]] -> Conv(s)

one scale and zero point per channel (axis 1): the producing QConv requantizes each output
channel to its own parameters, the table becomes one table per channel ([C, codes]). A
depthwise reader (output channel c reads input channel c alone) centers each input channel by
its zero point, with the multiplier s_x[c] * s_w[c] / s_y; any other convolution (any group
count) has the input scales folded into its weights, W'[o, c] = W[o, c] * s_x[c], quantized
per output channel as usual, and centers each input channel by its zero point (padding holds
it: real 0), so it stays an integer convolution with multiplier s_w'[o] / s_y[o]. Scalar
Mul / Add / Sub after the table (PP-LCNetV3's learnable affine blocks) are absorbed into it:
one table of the composed function, the intermediate values never quantized. In int16 the
table is interpolated (`ops.quantized.q_lookup_interp`: 513 knots, bends and exact segments per
channel instead of 65536 codes). Only whole edges whose every reader is a convolution with
constant weights qualify (nothing else ever reads a per-channel value), so no other kernel
needs a per-channel form.
"""

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import OPS
from ..tensor import QuantParams
from .params import HEADROOM, QRANGE, activation_params, channel_params

log = logging.getLogger(__name__)
# int16 tables per channel are interpolated (QLookupInterp: about 2.5 KB per channel)
CHANNEL_DTYPES = frozenset({"uint8", "int8", "int16"})
# Edges with a reader that is not depthwise (its weights fold the input scales) in these only:
# in int16 the OCR detector lost with them (calibration images 45.2 -> 36.6 dB), not explained
FOLDED_DTYPES = frozenset({"uint8", "int8"})
# int16 edge values get a headroom of 3, not 2 (`params.HEADROOM`): each channel's range is the
# maximum of fewer values than a tensor's, and unseen data overshoots it (OCR detector: 8
# values past their int16 range on held-out tiles, by up to 2.1x; per channel 43.2 -> 56.8 dB
# held out, per tensor 48.1; docs/quantization.md, "int16 edges")
EDGE_HEADROOM = {"int16": 3.0}


@dataclass(frozen=True)
class Edge:
    """A Conv -> [table] -> Conv(s) chain of the float graph."""

    producer: Node
    table: Node | None
    readers: tuple[Node, ...]
    values: tuple[Value, ...]  # the producer's output, and the table's (chain's) if there is one
    affine: tuple[Node, ...] = ()  # scalar Mul / Add / Sub after the table, absorbed into it

    @property
    def nodes(self) -> tuple[Node, ...]:
        table = (self.table, *self.affine) if self.table else ()
        return (self.producer, *table, *self.readers)


def per_channel_value(value: Value | None) -> bool:
    """Whether a value computed at run time is quantized with a scale and zero point per
    channel (weights and other constants do not count)."""
    quant = None if value is None or value.is_const else value.quant
    return quant is not None and len(quant.scale) > 1


def folds_scales(node: Node, x: Value | None = None) -> bool:
    """Whether (Q)Conv `node` reads a per-channel value (`x`, else its input) with its scales
    folded into its weights (any convolution but a depthwise one)."""
    x = node.inputs[0] if x is None else x
    conv = node.op in ("Conv", "QConv")
    return conv and x.quant is not None and x.quant.axis is not None and not depthwise(node)


def folded_weights(weight: np.ndarray, scales, group: int) -> np.ndarray:
    """Conv weights [O, C / group, ...] times the scale of the input channel each reads:
    W'[o, i] = W[o, i] * s[g(o) * C / group + i]."""
    out_channels, per_group = weight.shape[:2]
    s = np.asarray(scales, np.float64).reshape(group, 1, per_group)
    s = np.repeat(s, out_channels // group, axis=1).reshape(out_channels, per_group)
    return weight * s.reshape(s.shape + (1,) * (weight.ndim - 2))


def _constant_conv(node: Node | None) -> bool:
    if node is None or node.op != "Conv" or not node.inputs[1].is_const:
        return False
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return bias is None or bias.is_const


def _reader(node: Node, value: Value, ops: tuple[str, ...] = ("Conv",)) -> bool:
    """A Conv (an op of `ops`) with constant weights reading `value` as its input (and
    nowhere else)."""
    if node.op not in ops or node.inputs[0] is not value or len(value.shape) < 3:
        return False
    constant = all(v is None or v.is_const for v in node.inputs[1:])  # weights and bias
    return constant and sum(v is value for v in node.inputs) == 1


def _recorded_reader(node: Node, value: Value) -> bool:
    """A reader whose input calibration records per channel: a Conv, or a ConvTranspose that
    quantization may rewrite as a 1x1 Conv (`pixel_shuffle.split_pixel_shuffles`)."""
    return _reader(node, value, ("Conv", "ConvTranspose"))


def depthwise(node: Node) -> bool:
    """Whether Conv `node`'s output channel c reads its input channel c alone (else a reader
    of a per-channel value has the input scales folded into its weights)."""
    weight, channels = node.inputs[1], node.inputs[0].shape[1]
    return weight.shape[1] == 1 and node.attrs["group"] == channels == weight.shape[0] > 1


def _table(node: Node | None) -> bool:
    """A lookup-table op with one computed input and constant operands (Clip's bounds)."""
    if node is None or OPS[node.op].quant != "lookup" or len(node.outputs) != 1:
        return False
    return not node.inputs[0].is_const and all(v is None or v.is_const for v in node.inputs[1:])


def _scalar_affine(node: Node, value: Value) -> bool:
    """A Mul, Add or Sub of `value` and a one-element constant."""
    if node.op not in ("Mul", "Add", "Sub") or len(node.inputs) != 2 or "clip" in node.attrs:
        return False
    other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
    return other is not value and other.is_const and other.size == 1


def _affine_chain(node: Node, outputs: set[int]) -> tuple[Node, ...]:
    """The scalar affine ops that follow table `node` alone (each the only reader)."""
    chain: list[Node] = []
    value = node.outputs[0]
    while id(value) not in outputs and len(value.users) == 1:
        (user,) = value.users
        if not _scalar_affine(user, value) or user.outputs[0].shape != value.shape:
            break
        chain.append(user)
        value = user.outputs[0]
    return tuple(chain)


def channel_edges(graph: Graph, reader: Callable[[Node, Value], bool] = _reader) -> list[Edge]:
    """Every edge of `graph` that per-channel activation quantization may use, in node order
    (each of its readers a `reader`)."""
    outputs = {id(v) for v in graph.outputs}
    found = []
    for node in graph.nodes:
        if not _table(node) and not _constant_conv(node):
            continue
        affine = _affine_chain(node, outputs) if _table(node) else ()
        end = (affine[-1] if affine else node).outputs[0]
        users = end.users
        if id(end) in outputs or not users or not all(reader(u, end) for u in users):
            continue
        if _constant_conv(node):
            found.append(Edge(node, None, tuple(users), (end,)))
            continue
        start = node.inputs[0]
        if id(start) in outputs or start.users != [node] or not _constant_conv(start.producer):
            continue
        found.append(Edge(start.producer, node, tuple(users), (start, end), affine))
    return found


def depthwise_edges(graph: Graph) -> list[Edge]:
    """The edges whose every reader is depthwise (mixed precision promotes each whole)."""
    return [e for e in channel_edges(graph) if all(map(depthwise, e.readers))]


def edge_values(graph: Graph) -> list[str]:
    """The names of the values on those edges: calibration observes each channel's range
    (also where a reader is a ConvTranspose that quantization may turn into a Conv)."""
    edges = channel_edges(graph, _recorded_reader)
    return [value.name for edge in edges for value in edge.values]


def chosen_edges(
    graph: Graph,
    dtype_of: Callable[[Node], str | None],
    channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]],
    allowed: Iterable[str] = CHANNEL_DTYPES,
    fold: bool = True,
    writes: Callable[[Node], str | None] | None = None,
) -> list[tuple[Edge, str]]:
    """The edges quantized per channel, each with its dtype: those whose values are all of one
    quantized dtype of `allowed` (the producer's output type `writes`, the other nodes'
    `dtype_of`, default both `dtype_of`: None for float) and whose per-channel ranges
    calibration recorded (older statistics lack them: that edge stays per tensor); an edge
    with a reader that is not depthwise only with `fold`, in FOLDED_DTYPES, where it pays."""
    chosen = []
    for edge in channel_edges(graph):
        dtypes = {(writes or dtype_of)(edge.producer)}
        dtypes |= {dtype_of(node) for node in edge.nodes if node is not edge.producer}
        if len(dtypes) != 1 or not dtypes <= CHANNEL_DTYPES & set(allowed):
            continue
        missing = [v.name for v in edge.values if v.name not in channel_ranges]
        if missing:
            log.warning(
                "no per-channel ranges for '%s' in the calibration statistics; it stays "
                "quantized per tensor (recalibrate)",
                missing[0],
            )
            continue
        (dtype,) = dtypes
        folded = not all(map(depthwise, edge.readers))
        if folded and not (fold and dtype in FOLDED_DTYPES and _pays(edge, channel_ranges, dtype)):
            continue
        chosen.append((edge, dtype))
    return chosen


def reader_noise(weight: np.ndarray, group: int, steps: np.ndarray, power: np.ndarray) -> float:
    """A Conv's estimated rounding noise relative to its output, summed over output channels,
    when its input channels have steps `steps` and mean squares `power` and the steps are
    folded into its weights (quantized per output channel, int8): each output channel's
    input rounding noise, sum_i |W[o, i]|^2 s_i^2 / 12, plus its weight rounding noise,
    t_o^2 / 12 * sum_i taps * power_i / s_i^2 (t_o = max_i |W[o, i] s_i| / 127), over its
    signal, sum_i |W[o, i]|^2 power_i. A per-tensor input is equal steps."""
    out_channels, per_group = weight.shape[:2]
    index = np.arange(out_channels)[:, None] // (out_channels // group) * per_group
    index = index + np.arange(per_group)[None, :]  # [O, C / group]: the input channel read
    w2 = np.square(weight.astype(np.float64)).reshape(out_channels, per_group, -1)
    s, e, taps = steps[index], power[index], w2.shape[2]
    peak = np.sqrt(w2.max(axis=2)) * s
    t = peak.max(axis=1) / QRANGE["int8"][1]
    noise = (w2.sum(axis=2) * s**2).sum(axis=1) / 12 + t**2 / 12 * taps * (e / s**2).sum(axis=1)
    signal = (w2.sum(axis=2) * e).sum(axis=1)
    return float((noise / np.maximum(signal, np.finfo(float).tiny)).sum())


# Per channel where it at least halves the readers' estimated noise (3 dB): the estimate is
# rough, and edges it gave 0.6-0.97 lost on the OCR classifier (jittered runs: 21.6 -> 19.5 dB);
# the OCR detector's stem and neck edges estimate 0.06-0.43.
GAIN = 0.5


def _pays(edge: Edge, channel_ranges, dtype: str) -> bool:
    """Whether the edge's readers, by `reader_noise`, lose less (by `GAIN`) with its end value
    per channel than per tensor: folding the input steps into the weights moves the channels'
    spread into them, a gain only where the weights weigh the small channels as much as the
    wide ones (the next BatchNorm-folded layer undoing the spread, say). Each channel's mean
    square is taken as that of a uniform spread over its calibrated range."""
    lo, hi = (np.asarray(a, np.float64) for a in channel_ranges[edge.values[-1].name])
    low, high = np.minimum(lo, 0), np.maximum(hi, 0)
    power = np.maximum((low**2 + low * high + high**2) / 3, np.finfo(float).tiny)
    channel = np.asarray(channel_params(low, high, dtype).scale, np.float64)
    whole = activation_params(low.min(), high.max(), dtype).scale[0]
    tensor = np.full_like(channel, whole)
    per_tensor = per_channel = 0.0
    for reader in edge.readers:
        weight, group = reader.inputs[1].numpy(), reader.attrs["group"]
        per_tensor += reader_noise(weight, group, tensor, power)
        per_channel += reader_noise(weight, group, channel, power)
    return per_channel < GAIN * per_tensor


Narrow = Callable[[float, float, int], tuple[float, float]]
# An int16 channel's range is at least this share of the widest channel's. BatchNorm-folded
# exports carry dead channels (weights ~1e-26, values ~1e-11): on their own range, their
# producer's multiplier s_x·s_w/s_y falls below 2^-31 and is flushed to zero while the bias,
# in accumulator units, is ~1e17, so the integer kernel gives 0 where the real output is
# hundreds of that channel's steps (onnxruntime's QDQ: 16384 codes apart on the layout
# detector). On 2^-20 of the widest range such values round to 0 either way.
INT16_MIN_RANGE = 2.0**-20


def edge_params(
    ranges: tuple[np.ndarray, np.ndarray], dtype: str, narrow: Narrow | None
) -> QuantParams:
    """Per-channel parameters from each channel's calibrated min/max (the calibration
    method's per-tensor clipping, set by the widest channels, is not applied), widened to
    contain 0, then times the edge headroom (EDGE_HEADROOM, else the type's; scaling a range of
    one sign first would move it past the data), each narrowed by `narrow(lo, hi, channel)`
    when given (where a table still changes code)."""
    headroom = EDGE_HEADROOM.get(dtype, HEADROOM.get(dtype, 1.0))
    low = np.minimum(np.asarray(ranges[0], np.float64), 0.0) * headroom
    high = np.maximum(np.asarray(ranges[1], np.float64), 0.0) * headroom
    if narrow is not None:
        pairs = [narrow(float(a), float(b), c) for c, (a, b) in enumerate(zip(low, high))]
        low, high = np.array(pairs, np.float64).reshape(-1, 2).T
    if dtype == "int16":  # dead channels: see INT16_MIN_RANGE
        high = np.maximum(high, np.abs(np.concatenate([low, high])).max() * INT16_MIN_RANGE)
    return channel_params(low, high, dtype)
