"""Constraints of the TRIX NPU. Each is a small function whose docstring is the user-facing
reason when it fails; which ops the NPU runs, and which constraints each must meet besides the
GENERIC ones, is said once per op where it is lowered (`lower.py`, `LOWERINGS`).
"""

from collections.abc import Callable

import numpy as np

from ...graph_ir.ir import Node
from ...graph_ir.ops.resize import interpolation_matrix
from ...graph_ir.quant.channel_activations import per_channel_value as per_channel
from .hardware import Hardware
from .opcodes import align

Constraint = Callable[[Node, Hardware], bool]


def quantized_io(node: Node, hw: Hardware) -> bool:
    """inputs and output must be quantized tensors of a supported dtype (uint8 or int16)"""
    values = [v for v in node.inputs if v is not None and not v.is_const] + node.outputs[:1]
    return all(v.quant is not None and v.dtype.name in hw.dtypes for v in values)


def per_tensor_activations(node: Node, hw: Hardware) -> bool:
    """activations must be quantized per tensor (values quantized per channel, by
    quantize.activation_granularity = "channel", are read and written on the NPU only by
    convolutions and lookup tables)"""
    values = [v for v in node.inputs if v is not None and not v.is_const] + node.outputs[:1]
    return not any(map(per_channel, values))


def channel_activations(node: Node, hw: Hardware) -> bool:
    """values quantized per channel (quantize.activation_granularity = "channel") must be
    8-bit and on the channel axis; int16 ones run on the CPU"""
    values = [v for v in node.inputs if v is not None and not v.is_const] + node.outputs[:1]
    for v in filter(per_channel, values):
        if v.quant.axis != 1 or v.dtype.itemsize != 1 or len(v.quant.scale) != v.shape[1]:
            return False
    return True


def batch_one(node: Node, hw: Hardware) -> bool:
    """the batch dimension must be 1 and the rank at most 4"""
    values = [v for v in node.inputs if v is not None and not v.is_const] + node.outputs[:1]
    return all(len(v.shape) <= hw.max_rank and v.shape[0] == 1 for v in values)


def kernel_size(node: Node, hw: Hardware) -> bool:
    """kernel height and width must be at most max_kernel (11), except global pooling, and the
    kernel 1-D or 2-D"""
    kernel = node.attrs.get("kernel_shape")
    if node.op == "QConv":
        kernel = node.inputs[1].shape[2:]
    if kernel is None:
        return True
    if node.op != "QConv" and tuple(kernel) == tuple(node.inputs[0].shape[2:]):
        return len(kernel) <= 2  # global pooling runs on the vector unit at any size
    return len(kernel) <= 2 and max(kernel) <= hw.max_kernel


def stride_limit(node: Node, hw: Hardware) -> bool:
    """strides must be at most max_stride (4)"""
    return max(node.attrs.get("strides", [1]), default=1) <= hw.max_stride


def channel_limit(node: Node, hw: Hardware) -> bool:
    """channel counts must be at most max_channels"""
    out = node.outputs[0].shape
    return len(out) < 2 or out[1] <= hw.max_channels


def per_channel_shape(value, other) -> bool:
    """Whether `value` holds one number per channel of `other` (or a single number)."""
    channels = other.shape[1] if len(other.shape) > 1 else 1
    per_channel = (1, channels, *([1] * (len(other.shape) - 2)))
    return value.size == 1 or tuple(value.shape) in (per_channel, per_channel[1:])


def row_constant(value, other) -> bool:
    """Whether `value` is a constant over the last axis of a sequence `other` [1, T, N] (a
    Linear's bias; one code per row of the NPU's (T, N, 1) layout)."""
    n = other.shape[-1]
    shapes = ((n,), (1, n), (1, 1, n))
    return value.is_const and len(other.shape) == 3 and tuple(value.shape) in shapes


def broadcast_operands(node: Node, hw: Hardware) -> bool:
    """elementwise operands must have the same shape, or one must be a per-channel [N, C, 1, 1]
    or scalar tensor (constant or computed), or a constant over the last axis of a [1, T, N]
    sequence"""
    a, b = node.inputs
    if a.is_const and b.is_const:
        return False
    if a.shape == b.shape and not a.is_const and not b.is_const:
        return True
    out = node.outputs[0]
    return (a.shape == out.shape and (per_channel_shape(b, out) or row_constant(b, out))) or (
        b.shape == out.shape and (per_channel_shape(a, out) or row_constant(a, out))
    )


def channel_concat(node: Node, hw: Hardware) -> bool:
    """Concat must join along the channel axis of non-constant tensors"""
    rank = len(node.outputs[0].shape)
    constant = any(v.is_const for v in node.inputs)
    return rank >= 2 and node.attrs["axis"] % rank == 1 and not constant


def channel_softmax(node: Node, hw: Hardware) -> bool:
    """Softmax must run over axis 1 (the channels of each position)"""
    return node.attrs.get("axis", -1) % len(node.inputs[0].shape) == 1


def pool_without_ceil(node: Node, hw: Hardware) -> bool:
    """average pooling must not use ceil_mode"""
    return not node.attrs.get("ceil_mode", 0)


def gemm_rows_layout(node: Node, hw: Hardware) -> bool:
    """Gemm input must be rows [M, K] (a vector, or a MatMul over the rows of a sequence), not
    transposed (transA = 0)"""
    return len(node.inputs[0].shape) == 2 and not node.attrs.get("transA")


def rows_view(node: Node, hw: Hardware) -> bool:
    """the batch dimension must be 1 and the rank at most 4 (a view may also give a Gemm
    the rows of a sequence, [1, T, K] -> [T, K], or take them back)"""
    values = [v for v in node.inputs if v is not None and not v.is_const] + node.outputs[:1]
    return all(
        len(v.shape) <= hw.max_rank and (v.shape[0] == 1 or len(v.shape) == 2) for v in values
    )


def pass_through_dtype(node: Node, hw: Hardware) -> bool:
    """Reshape/MaxPool and data movement must keep the quantization of their input"""
    return all(node.inputs[0].quant == v.quant for v in node.outputs)


def batch_axis_kept(node: Node, hw: Hardware) -> bool:
    """Transpose must keep the batch axis first"""
    return node.attrs["perm"][0] == 0


def column_transpose(node: Node, hw: Hardware) -> bool:
    """a Transpose whose output channels come from input columns needs channels x height of
    the input at most 65536 (the blocks of one DMA)"""
    shape = [*node.inputs[0].shape, 1, 1, 1][:4]
    return node.attrs["perm"][1] != 3 or shape[1] * shape[2] <= 1 << 16


def forward_slice(node: Node, hw: Hardware) -> bool:
    """Slice steps must be positive"""
    return all(step > 0 for step in node.attrs["steps"])


def spatial_pad(node: Node, hw: Hardware) -> bool:
    """Pad must pad only height and width of a 4-D tensor, by 0 to 255, in mode constant,
    edge, reflect or wrap"""
    pads = node.attrs["pads"]
    return (
        len(node.inputs[0].shape) == 4
        and not any(pads[:2] + pads[4:6])
        and all(0 <= p <= 255 for p in pads)
        and node.attrs.get("mode", "constant") in ("constant", "edge", "reflect", "wrap")
    )


def spatial_resize(node: Node, hw: Hardware) -> bool:
    """Resize must scale only height and width of a 4-D tensor"""
    scales = node.attrs["scales"]
    return len(scales) == 4 and scales[0] == scales[1] == 1.0 and not node.attrs.get("roi")


def move_fits_sram(node: Node, hw: Hardware) -> bool:
    """a data-movement op must fit one output channel and the input it reads for it in half
    the SRAM"""
    x = node.inputs[0]
    out = max(node.outputs, key=lambda v: v.size)
    reads = x.size // x.shape[1] if len(x.shape) > 1 else x.size
    if node.op == "Transpose":
        reads = x.size // x.shape[node.attrs["perm"][1]]
    elif node.op == "DepthToSpace":
        b2 = node.attrs["blocksize"] ** 2
        reads = x.size if node.attrs.get("mode", "DCR") == "DCR" else reads * b2
    per_channel = out.size // out.shape[1] if len(out.shape) > 1 else out.size
    return (reads + per_channel) * x.dtype.itemsize <= hw.sram_bytes // 2


def resize_taps(node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """The integer interpolation matrices (units of 2^-8) over rows and columns, or None when
    a weight is not on that grid."""
    taps = []
    for axis in (2, 3):
        matrix, outside = interpolation_matrix(node.attrs, axis, node.inputs[0].shape[axis])
        scaled = matrix * (1 << 8)
        if outside is not None or not np.array_equal(scaled, np.rint(scaled)):
            return None
        taps.append(scaled.astype(np.int16))
    return taps[0], taps[1]


def resize_on_grid(node: Node, hw: Hardware) -> bool:
    """Resize must be nearest or linear with every tap a multiple of 1/256 (power-of-two
    scales)"""
    return node.attrs.get("mode", "nearest") in ("nearest", "linear") and bool(resize_taps(node))


GENERIC: tuple[Constraint, ...] = (  # every op
    quantized_io,
    per_tensor_activations,
    batch_one,
    channel_limit,
)


def reason(constraint: Constraint) -> str:
    return " ".join((constraint.__doc__ or constraint.__name__).split())


def tile_fits_sram(node: Node, hw: Hardware) -> bool:
    """the layer's smallest tile must fit the SRAM, double-buffered (a convolution's: one
    output row, reading every input channel over the kernel's rows; a Gemm's: one input row
    and one row of weights)"""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    per_channel = align(w.size // w.shape[0] * w.dtype.itemsize)
    if node.op == "QGemm":
        row = align(x.shape[-1] * w.dtype.itemsize) + align(y.dtype.itemsize)
        return align(x.shape[-1] * x.dtype.itemsize) + 2 * row <= hw.sram_bytes
    c, h, width = (*x.shape[1:], 1, 1)[:3]  # (C, H, W) as lowered
    out_width = (*y.shape[1:], 1, 1)[2]
    kh = w.shape[2] if len(w.shape) > 2 else 1
    span = min(h, (kh - 1) * node.attrs["dilations"][0] + 1)
    rows = align(c * span * width * x.dtype.itemsize)
    return 2 * (rows + align(out_width * y.dtype.itemsize) + per_channel) <= hw.sram_bytes
