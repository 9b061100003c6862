"""Convolution and matrix products, BLAS-backed.

Conv lowers to one batched GEMM over an im2col matrix built from a strided window view (one copy);
depthwise convolution accumulates shifted slices instead, which beats many tiny GEMMs.
Canonical attributes: `strides`, `dilations`, `pads` (all begins, then all ends), `group`, and
optionally a fused activation `clip`.
"""

import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..compiled import compiled
from .elementwise import apply_clip
from .registry import ANY, PER_SAMPLE, Attrs, BatchRule, TensorType, WeightAxes, register


def window_view(
    x: np.ndarray, kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]
) -> np.ndarray:
    """A zero-copy view [N, C, *out, *kernel] of the windows of a padded [N, C, *spatial]."""
    spatial = x.shape[2:]
    out = tuple(
        (size - d * (k - 1) - 1) // s + 1
        for size, k, s, d in zip(spatial, kernel, strides, dilations)
    )
    st = x.strides
    return as_strided(
        x,
        shape=x.shape[:2] + out + tuple(kernel),
        strides=st[:2]
        + tuple(st[2 + i] * s for i, s in enumerate(strides))
        + tuple(st[2 + i] * d for i, d in enumerate(dilations)),
        writeable=False,
    )


def pad_spatial(x: np.ndarray, pads: list[int], value: float = 0.0) -> np.ndarray:
    nd = len(pads) // 2
    if not any(pads):
        return x
    shape = x.shape[:2] + tuple(d + pads[i] + pads[i + nd] for i, d in enumerate(x.shape[2:]))
    out = np.full(shape, value, dtype=x.dtype)  # faster than np.pad for this simple case
    out[(Ellipsis, *(slice(pads[i], pads[i] + d) for i, d in enumerate(x.shape[2:])))] = x
    return out


def conv_output_size(size: int, k: int, stride: int, dilation: int, pad_total: int) -> int:
    return (size + pad_total - dilation * (k - 1) - 1) // stride + 1


def conv_type(attrs: Attrs, types) -> list[TensorType]:
    x, w = types[0], types[1]
    nd = len(x.shape) - 2
    pads = attrs["pads"]
    if w.shape[1] * attrs["group"] != x.shape[1]:
        raise ValueError(
            f"input has {x.shape[1]} channels but weight expects {w.shape[1]} x group "
            f"{attrs['group']}"
        )
    spatial = tuple(
        conv_output_size(
            x.shape[2 + i],
            w.shape[2 + i],
            attrs["strides"][i],
            attrs["dilations"][i],
            pads[i] + pads[i + nd],
        )
        for i in range(nd)
    )
    if min(spatial, default=1) < 1:
        raise ValueError(f"output spatial size {list(spatial)} is empty")
    bias = types[2] if len(types) > 2 else None
    if bias is not None and bias.shape != (w.shape[0],):
        raise ValueError(f"bias is {list(bias.shape)}, the weight needs [{w.shape[0]}]")
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], *spatial))]


def conv_weights(attrs: Attrs, rank: int) -> WeightAxes:
    """Conv: weight [O, C / group, k...] over data [N, C, ...]."""
    return WeightAxes(0, 1, 1)


@register("Conv", conv_type, batch=PER_SAMPLE, quant="matmul", weights=conv_weights)
def conv(attrs, x, w, b=None):
    group, nd = attrs["group"], x.ndim - 2
    strides, dilations = tuple(attrs["strides"]), tuple(attrs["dilations"])
    n = x.shape[0]
    m, cg = w.shape[:2]
    mg = m // group
    kernel = w.shape[2:]
    if cg == 1 and mg == 1 and group > 1:
        y = _depthwise_compiled(x, w, attrs["pads"], strides, dilations)
        if y is None:
            y = _depthwise(pad_spatial(x, attrs["pads"]), w, kernel, strides, dilations)
    else:
        if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(attrs["pads"]):
            out = x.shape[2:]
            cols = x.reshape(n, group, cg, -1)
        else:
            cols, out = im2col(x, kernel, strides, dilations, attrs["pads"], scratch=True)
            cols = cols.reshape(n, group, -1, cols.shape[-1])
        weights = w.reshape(group, mg, -1)
        if n == 1 and group == 1:  # one plain GEMM; skips the batched-matmul machinery
            y = np.dot(weights[0], cols[0, 0]).reshape(n, m, *out)
        else:
            y = np.matmul(weights, cols).reshape(n, m, *out)
    y = y.astype(x.dtype, copy=False)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return apply_clip(attrs, y)


SCRATCH_BYTES = 1 << 28  # the largest window matrix whose memory a thread keeps for the next
_scratch = threading.local()


def _scratch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialized array in the calling thread's kept buffer (grown to fit, up to
    SCRATCH_BYTES; larger: a new array). The system maps and zeroes a new array of tens of MB
    page by page on every call: on the OCR detector's 3x3 head convolutions at 80x80 that was
    60 % of im2col's time."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    if size > SCRATCH_BYTES:
        return np.empty(shape, dtype)
    held = getattr(_scratch, "buffer", None)
    if held is None or held.nbytes < size:
        held = _scratch.buffer = np.empty(size, np.uint8)
    return held[:size].view(dtype).reshape(shape)


def im2col(
    x: np.ndarray,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    pads: list[int],
    scratch: bool = False,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """The [N, C*K, P] window matrix of x under zero padding, and the output spatial shape;
    with `scratch`, in the thread's kept buffer (`_scratch_array`), valid until its next call.

    Copied straight from the unpadded input, one kernel offset at a time (no padded copy): each
    offset's block gets the in-range input and zeros where its windows reach into the padding.
    """
    n, c, nd = x.shape[0], x.shape[1], x.ndim - 2
    spatial = x.shape[2:]
    out = tuple(
        conv_output_size(spatial[i], kernel[i], strides[i], dilations[i], pads[i] + pads[i + nd])
        for i in range(nd)
    )
    shape = (n, c, *kernel, *out)
    cols = _scratch_array(shape, x.dtype) if scratch else np.empty(shape, dtype=x.dtype)
    for offset in np.ndindex(*kernel):
        block = cols[(slice(None), slice(None), *offset)]  # [N, C, *out]
        inside, source = [], []
        for i in range(nd):
            stride = strides[i]
            shift = offset[i] * dilations[i] - pads[i]  # input index read by output 0
            first = max(0, (stride - 1 - shift) // stride)
            last = max(first, min(out[i], (spatial[i] - 1 - shift) // stride + 1))
            before = (slice(None),) * (2 + i)
            block[(*before, slice(0, first))] = 0
            block[(*before, slice(last, None))] = 0
            inside.append(slice(first, last))
            start = shift + first * stride
            source.append(slice(start, start + (last - first - 1) * stride + 1, stride))
        if all(r.stop > r.start for r in inside):
            block[(slice(None), slice(None), *inside)] = x[(slice(None), slice(None), *source)]
    return cols.reshape(n, c * int(np.prod(kernel)), -1), out


def conv_by_taps(x: np.ndarray, w: np.ndarray, pads: list[int], dilations) -> np.ndarray:
    """A stride-1 2-D convolution of one group as one GEMM per kernel tap, summed: the tap's
    [O, C] weights times the zero-padded input flattened and shifted by the tap (rows as wide
    as the padded input; the columns past the output's are dropped at the end). No window
    matrix: im2col writes C·K values per output position, this reads the input K times, the
    faster where O <= C. Its sums run in another order than `conv`'s, so it is exact only
    where every partial sum is: integer operands within the float type's integers (q_conv)."""
    n, c = x.shape[:2]
    padded = pad_spatial(x, pads)
    height, width = padded.shape[2:]
    (kh, kw), (dh, dw) = w.shape[2:], dilations
    out_h, out_w = height - dh * (kh - 1), width - dw * (kw - 1)
    flat = padded.reshape(n, c, height * width)
    span = (out_h - 1) * width + out_w  # the output positions as flat input positions
    taps = np.ascontiguousarray(w.transpose(2, 3, 0, 1))  # [kh, kw, O, C]
    y = np.zeros((n, w.shape[0], out_h * width), x.dtype)
    product = np.empty((n, w.shape[0], span), x.dtype)
    for i in range(kh):
        for j in range(kw):
            start = i * dh * width + j * dw
            np.matmul(taps[i, j], flat[:, :, start : start + span], out=product)
            y[:, :, :span] += product
    return y.reshape(n, w.shape[0], out_h, width)[..., :out_w]


DEPTHWISE_BLOCK_BYTES = 1 << 19  # a block of output channels stays in cache across the taps


def _depthwise(xp, w, kernel, strides, dilations):
    """Sum over kernel taps of the shifted input times the channel's tap, tap by tap in kernel
    order from zero (so the float result does not depend on the blocking), one sample and one
    block of channels at a time with one scratch buffer: the block's partial sums stay in cache
    instead of streaming the whole output through memory once per tap."""
    nd = len(kernel)
    view = window_view(xp, kernel, strides, dilations)
    y = np.zeros(view.shape[: 2 + nd], dtype=np.result_type(xp, w))
    taps = w.reshape(w.shape[0], -1).astype(y.dtype, copy=False)
    samples, channels = y.shape[:2]
    step = max(1, DEPTHWISE_BLOCK_BYTES // max(y[0, 0].nbytes, 1))
    scratch = np.empty((min(step, channels), *y.shape[2:]), y.dtype)
    offsets = list(np.ndindex(*kernel))
    for n in range(samples):
        for start in range(0, channels, step):
            block = slice(start, min(start + step, channels))
            out, product = y[n, block], scratch[: block.stop - block.start]
            for index, offset in enumerate(offsets):
                tap = taps[block, index].reshape((-1,) + (1,) * nd)
                np.multiply(view[(n, block, Ellipsis, *offset)], tap, out=product)
                out += product
    return y


def _depthwise_compiled(x, w, pads, strides, dilations) -> np.ndarray | None:
    """`_depthwise` of x zero-padded by `pads`, by the compiled kernel, bit for bit
    (`compiled`), or None where it does not apply: numba missing or off, not 2-D, not float,
    or too small a call to load numba for."""
    dtype = np.result_type(x, w)
    if x.ndim != 4 or dtype not in (np.float32, np.float64):
        return None
    kernel = w.shape[2:]
    out = [
        conv_output_size(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i] + pads[i + 2])
        for i in (0, 1)
    ]
    y = np.empty((*x.shape[:2], *out), dtype)
    kernels = compiled(y.size)
    if kernels is None:
        return None
    taps = np.ascontiguousarray(w.reshape(w.shape[0], -1), dtype)
    source = np.ascontiguousarray(x, dtype)
    kernels.depthwise2d(source, taps, *(tuple(v) for v in (kernel, strides, dilations, pads)), y)
    return y


def _conv_transpose_type(attrs: Attrs, types) -> list[TensorType]:
    x, w = types[0], types[1]
    nd = len(x.shape) - 2
    pads, strides, dil = attrs["pads"], attrs["strides"], attrs["dilations"]
    spatial = tuple(
        strides[i] * (x.shape[2 + i] - 1)
        + attrs["output_padding"][i]
        + (w.shape[2 + i] - 1) * dil[i]
        + 1
        - pads[i]
        - pads[i + nd]
        for i in range(nd)
    )
    return [TensorType(x.dtype, (x.shape[0], w.shape[1] * attrs["group"], *spatial))]


def _conv_transpose_weights(attrs: Attrs, rank: int) -> WeightAxes:
    """ConvTranspose: weight [C, O / group, k...] over data [N, C, ...]."""
    return WeightAxes(1, 0, 1)


@register("ConvTranspose", _conv_transpose_type, batch=PER_SAMPLE, weights=_conv_transpose_weights)
def conv_transpose(attrs, x, w, b=None):
    group, nd = attrs["group"], x.ndim - 2
    strides, dil, pads = attrs["strides"], attrs["dilations"], attrs["pads"]
    n, c = x.shape[:2]
    mg, kernel = w.shape[1], w.shape[2:]
    cg = c // group
    k_total = int(np.prod(kernel))
    # cols[n, g, mg*K, P] = W[g]^T @ x[n, g]
    weights = w.reshape(group, cg, mg * k_total).transpose(0, 2, 1)
    cols = np.matmul(weights, x.reshape(n, group, cg, -1))
    cols = cols.reshape(n, group * mg, *kernel, *x.shape[2:])
    full = [
        strides[i] * (x.shape[2 + i] - 1)
        + (kernel[i] - 1) * dil[i]
        + 1
        + attrs["output_padding"][i]
        for i in range(nd)
    ]
    y = np.zeros((n, group * mg, *full), dtype=cols.dtype)
    for offset in np.ndindex(*kernel):
        target = tuple(
            slice(o * d, o * d + s * (size - 1) + 1, s)
            for o, d, s, size in zip(offset, dil, strides, x.shape[2:])
        )
        y[(slice(None), slice(None), *target)] += cols[(slice(None), slice(None), *offset)]
    crop = tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(y.astype(x.dtype, copy=False))


def pixel_shuffle_block(attrs: Attrs, weight_shape: tuple[int, ...]) -> int | None:
    """The block size b of a 2-D ConvTranspose whose windows do not overlap (square kernel b =
    stride b, no groups, dilation, padding or output padding), else None. Such a layer is a
    1x1 Conv to b * b * O channels followed by DepthToSpace(b, DCR): `pixel_shuffle_weights`."""
    kernel = list(weight_shape[2:])
    if len(kernel) != 2 or kernel[0] != kernel[1] or list(attrs["strides"]) != kernel:
        return None
    if attrs["group"] != 1 or set(attrs["dilations"]) != {1}:
        return None
    if any(attrs["pads"]) or any(attrs.get("output_padding", [0, 0])):
        return None
    return kernel[0]


def pixel_shuffle_weights(
    weight: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """ConvTranspose weights [I, O, b, b] and bias [O] (or None) as the 1x1 Conv's [b b O, I,
    1, 1] and [b b O]: output channel (i b + j) O + o computes offset (i, j) of channel o."""
    inputs, outputs, block = weight.shape[:3]
    conv = weight.transpose(2, 3, 1, 0).reshape(block * block * outputs, inputs, 1, 1)
    offsets = np.zeros(outputs, weight.dtype) if bias is None else bias.reshape(-1)
    return np.ascontiguousarray(conv), np.tile(offsets, block * block)


def gemm_type(attrs: Attrs, types) -> list[TensorType]:
    a, b = types[0].shape, types[1].shape
    m, ka = (a[1], a[0]) if attrs.get("transA") else a
    kb, n = (b[1], b[0]) if attrs.get("transB") else b
    if ka != kb:
        raise ValueError(f"inner dimensions differ: A is {list(a)}, B is {list(b)}")
    c = types[2].shape if len(types) > 2 and types[2] is not None else ()
    if len(c) > 2 or any(d not in (1, full) for d, full in zip(c[::-1], (n, m))):
        raise ValueError(f"bias C is {list(c)}, which does not broadcast to the output {[m, n]}")
    return [TensorType(types[0].dtype, (m, n))]


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a @ b`, computed row by row when `a` is a matrix: BLAS sums in an order that depends on
    the number of rows, and each row must not depend on how many samples share the call
    (batched calibration and single on-device runs see the same bits)."""
    if a.ndim != 2 or b.ndim != 2:
        return np.matmul(a, b)
    return np.matmul(a[:, None, :], b)[:, 0, :]


def _gemm_bias(node) -> bool:
    """A bias computed from the input must be a [1, N] row, not a broadcast [N] vector."""
    c = node.inputs[2] if len(node.inputs) > 2 else None
    return c is None or c.is_const or len(c.shape) == 2


# Samples are rows of A (and of a bias computed from the input).
_GEMM_BATCH = BatchRule(
    (0, 2), condition=lambda node: not node.attrs.get("transA") and _gemm_bias(node)
)


def gemm_weights(attrs: Attrs, rank: int) -> WeightAxes:
    """Gemm: B is [N, K] with transB, else [K, N], over A [M, K] (transA: [K, M])."""
    return WeightAxes(0, 1, -1) if attrs.get("transB") else WeightAxes(1, 0, -1)


@register("Gemm", gemm_type, batch=_GEMM_BATCH, quant="matmul", weights=gemm_weights)
def gemm(attrs, a, b, c=None):
    a = a.T if attrs.get("transA") else a
    b = b.T if attrs.get("transB") else b
    y = _matmul(a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    if c is not None:
        y = y + (c * np.asarray(beta, c.dtype) if beta != 1.0 else c)
    return apply_clip(attrs, y.astype(a.dtype, copy=False))


def _matmul_type(attrs: Attrs, types) -> list[TensorType]:
    a, b = types[0].shape, types[1].shape
    a2 = a if len(a) > 1 else (1, *a)
    b2 = b if len(b) > 1 else (*b, 1)
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner dimensions differ: {list(a)} @ {list(b)}")
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    shape = (*batch, *a[-2:-1], *(b[-1:] if len(b) > 1 else ()))
    return [TensorType(types[0].dtype, shape)]


def _matmul_separable(node) -> bool:
    """[1, M, K] @ [K, N] and stacks of matrices; a batched matrix must be the left operand."""
    rank = len(node.outputs[0].shape)
    for index, value in enumerate(node.inputs):
        if value is None or value.is_const:
            continue
        if len(value.shape) != rank or len(value.shape) < (2 if index == 0 else 3):
            return False
    return True


_MATMUL_BATCH = BatchRule(ANY, condition=_matmul_separable)


def _matmul_weights(attrs: Attrs, rank: int) -> WeightAxes | None:
    """MatMul: B [..., K, N] over A [..., K]; a vector B [K] has no output channels."""
    return WeightAxes(rank - 1, rank - 2, -1) if rank >= 2 else None


@register(
    "MatMul", _matmul_type, batch=_MATMUL_BATCH, quant="matmul", onnx={}, weights=_matmul_weights
)
def matmul(attrs, a, b):
    return apply_clip(attrs, _matmul(a, b).astype(a.dtype, copy=False))
