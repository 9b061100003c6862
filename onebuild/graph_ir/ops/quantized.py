"""Quantized operators of the integer reference (rules in docs/quantization.md).

Every kernel computes in integers: inputs are centered by their zero points, accumulated exactly,
rescaled by `requantize` (integer multiplier and shift), offset by the output zero point and
clamped to [qmin, qmax]. Sums of products run through float64 BLAS, which is exact because every
partial sum is an integer far below 2^53; the result is then converted to int64.
"""

from dataclasses import replace

import numpy as np

from ..compiled import compiled
from ..quant.params import (
    ADD_SHIFT,
    count_multipliers,
    dequantize,
    qdq_params,
    quantize,
    requantize,
)
from .conv import (
    conv,
    conv_by_taps,
    conv_type,
    conv_weights,
    gemm,
    gemm_type,
    gemm_weights,
)
from .pool import _pool_type, window_sums
from .registry import (
    BROADCASTING,
    OPS,
    PER_SAMPLE,
    Attrs,
    TensorType,
    broadcast,
    register,
)
from .tensor_ops import CONCAT_BATCH, _concat_type
from .tflite_rounding import (
    FLOAT32,
    GEMMLOWP,
    ROUNDING,
    dequantize_float32,
    quantize_float32,
    requantize_gemmlowp,
    requantizer,
)

FLOAT_OP = "float_op"  # the float op a kernel standing for several replaced (partition keys)


def recording_float_op(op: str, attrs: Attrs, float_op: str) -> Attrs:
    """`attrs` of a new `op` node replacing a `float_op` node, with `float_op` recorded when
    `op` stands for several float ops (its registry entry's `quantizes`)."""
    return {**attrs, FLOAT_OP: float_op} if len(OPS[op].quantizes) > 1 else attrs


def stands_for(op: str, attrs: Attrs, input_shape: tuple[int, ...]) -> tuple[str, ...]:
    """The float ops a node of quantized `op` stands for: the one its `float_op` records, else
    those its attributes allow (QAdd: Sub or Add by `subtract`; QAveragePool: the global pools
    when its window is the whole unpadded input, AveragePool otherwise), else `quantizes`."""
    recorded = attrs.get(FLOAT_OP)
    if isinstance(recorded, str):
        return (recorded,)
    if op == "QAdd":
        return ("Sub",) if attrs.get("subtract") else ("Add",)
    if op == "QAveragePool":
        whole = list(attrs["kernel_shape"]) == list(input_shape[2:]) and not any(attrs["pads"])
        return ("GlobalAveragePool", "ReduceMean") if whole else ("AveragePool",)
    return OPS[op].quantizes if op in OPS else ()


def _typed(shape_of):
    """Type inference: the shape rule of a float op, the dtype from the `dtype` attribute."""

    def infer(attrs: Attrs, types) -> list[TensorType]:
        return [TensorType(np.dtype(attrs["dtype"]), shape_of(attrs, types)[0].shape)]

    return infer


def _same_shape(attrs: Attrs, types) -> list[TensorType]:
    return [types[0]]


def _channels(number, ndim: int):
    """An attribute that is one number, or one per channel (a list: along axis 1 of a rank
    `ndim` array, the per-channel activation parameters of `docs/quantization.md`)."""
    if isinstance(number, (list, tuple)):
        return np.asarray(number, np.int64).reshape((1, -1) + (1,) * (ndim - 2))
    return number


def _centered(q: np.ndarray, zero_point) -> np.ndarray:
    centered = q.astype(np.int64)
    centered -= _channels(zero_point, q.ndim)
    return centered


def _output(attrs: Attrs, scaled: np.ndarray) -> np.ndarray:
    """Add the output zero point and saturate to [qmin, qmax] (fused activations included);
    each may be one per channel."""
    ndim = scaled.ndim
    y = scaled + _channels(attrs["y_zero_point"], ndim)
    low, high = _channels(attrs["qmin"], ndim), _channels(attrs["qmax"], ndim)
    return np.clip(y, low, high, out=y).astype(attrs["dtype"])


def _per_code(q: np.ndarray, function, *parameters) -> np.ndarray | None:
    """`function` (elementwise on int64 codes) applied to `q` through a table over every code
    of q's 8- or 16-bit type: the same integers, one gather instead of a pass per step of the
    arithmetic. None when a parameter is one per channel or q is smaller than the table."""
    if (
        q.dtype.kind not in "iu"
        or q.dtype.itemsize > 2
        or any(np.ndim(p) for p in parameters)
        or q.size < 1 << 8 * q.dtype.itemsize
    ):
        return None
    unsigned = np.dtype(f"uint{8 * q.dtype.itemsize}")
    codes = np.arange(1 << 8 * q.dtype.itemsize, dtype=unsigned).view(q.dtype)  # by bit pattern
    return function(codes.astype(np.int64))[q.view(unsigned)]


@register("QuantizeLinear", _typed(_same_shape), batch=PER_SAMPLE)
def quantize_linear(attrs, x):
    if attrs.get(ROUNDING) == FLOAT32:  # per tensor (`tflite_rounding`)
        return quantize_float32(x, attrs["scale"][0], attrs["zero_point"][0], attrs["dtype"])
    return quantize(x, qdq_params(attrs), attrs["dtype"])


@register(
    "DequantizeLinear",
    lambda attrs, types: [TensorType(np.dtype(np.float32), types[0].shape)],
    batch=PER_SAMPLE,
)
def dequantize_linear(attrs, q):
    if attrs.get(ROUNDING) == FLOAT32:  # per tensor (`tflite_rounding`)
        return dequantize_float32(q, attrs["scale"][0], attrs["zero_point"][0])
    return dequantize(q, qdq_params(attrs))


@register("Requantize", _typed(_same_shape), batch=PER_SAMPLE)
def requantize_op(attrs, q):
    """Change quantization parameters (or type): y = requantize(q - zp_x) + zp_y."""

    def convert(codes):
        centered = _centered(codes, attrs["x_zero_point"])
        return _output(attrs, requantize(centered, attrs["multiplier"], attrs["shift"]))

    keys = ("x_zero_point", "multiplier", "shift", "y_zero_point", "qmin", "qmax")
    table = _per_code(q, convert, *(attrs[key] for key in keys))
    return convert(q) if table is None else table


def _table_type(entries: int | None, dtypes: tuple[str, ...] = ("int8", "uint8", "int16")):
    """A lookup's output type: the table's, in the input's shape; the table holds `entries`
    (else one per input code) in one row, or one row per channel (axis 1) as [1 or C, ...]."""

    def infer(attrs: Attrs, types) -> list[TensorType]:
        x, table = types
        wanted = entries or 1 << (8 * x.dtype.itemsize)
        rows = table.shape[0] if len(table.shape) == 2 else 1
        channels = x.shape[1] if len(x.shape) > 1 else 1
        if (
            x.dtype.name not in dtypes
            or len(table.shape) not in (1, 2)
            or table.shape[-1] != wanted
            or rows not in (1, channels)
        ):
            raise ValueError(
                f"table {table.dtype}{list(table.shape)} does not fit input "
                f"{x.dtype}{list(x.shape)}: {wanted} entries in one row or one per channel, "
                f"input {' or '.join(dtypes)}"
            )
        return [TensorType(table.dtype, x.shape)]

    return infer


@register("QLookup", _table_type(None), batch=PER_SAMPLE)
def q_lookup(attrs, q, table):
    """Any unary elementwise function as a table over every input code: y = table[q - min];
    a table of shape [C, codes] holds one row per channel (axis 1): y = table[c, q - min].
    Attribute `function` (optional) names the float op the table holds, for partition maps."""
    index = q.astype(np.int64) - np.iinfo(q.dtype).min
    if table.ndim == 1:
        return table[index]
    channel = np.arange(table.shape[0]).reshape((1, -1) + (1,) * (q.ndim - 2))
    return table[channel, index]


SEGMENT_BITS = 7  # an interpolated table's segments are 2^7 = 128 input codes wide
SEGMENT = 1 << SEGMENT_BITS
KNOTS = (1 << 16 >> SEGMENT_BITS) + 1  # 513: every int16 code lies in one of 512 segments


def _interp_type(attrs: Attrs, types) -> list[TensorType]:
    """QLookupInterp's output type: the knots' [1 or C, 513] as `_table_type` checks them; the
    optional bends int16 [rows, 512], then exact segments: indices int16 [rows, E] and codes
    [rows, E, 128] of the knots' type, with the knots' rows."""
    out = _table_type(KNOTS, ("int16",))(attrs, types[:2])
    table = types[1]
    rows = table.shape[0] if len(table.shape) == 2 else 1
    count = types[3].shape[-1] if len(types) == 5 and len(types[3].shape) == 2 else -1
    wanted = [(np.int16, (rows, KNOTS - 1)), (np.int16, (rows, count))]
    wanted += [(table.dtype, (rows, count, SEGMENT))]
    fits = [t.dtype == d and tuple(t.shape) == shape for t, (d, shape) in zip(types[2:], wanted)]
    if len(types) not in (2, 3, 5) or not all(fits):
        got = ", ".join(f"{t.dtype}{list(t.shape)}" for t in types[2:])
        raise ValueError(
            f"bends and exact segments {got} do not fit knots {table.dtype}{list(table.shape)}: "
            f"int16 [rows, {KNOTS - 1}], then int16 [rows, E] and [rows, E, {SEGMENT}]"
        )
    return out


def segment_slots(segments: np.ndarray) -> np.ndarray:
    """[rows, 512] int32: for each segment of each row, the index e of its exact codes in
    `segments` [rows, E] (each entry a segment 0..511, or -1 for none), else -1."""
    rows = segments.shape[0]
    valid = (segments >= -1) & (segments < KNOTS - 1)
    listed = np.sort(segments, axis=1)
    repeated = (listed[:, 1:] == listed[:, :-1]) & (listed[:, 1:] >= 0)
    if not valid.all() or repeated.any():
        raise ValueError(
            f"exact segments must be distinct segment indices 0..{KNOTS - 2} (or -1) per row"
        )
    slots = np.full((rows, KNOTS - 1), -1, np.int32)
    row, e = np.nonzero(segments >= 0)
    slots[row, segments[row, e]] = e
    return slots


def interpolate(a: np.ndarray, b: np.ndarray, bend: np.ndarray | None, t: np.ndarray):
    """QLookupInterp's code between knots `a` and `b` at offset `t` in the segment, bent by
    `bend` (int32 arrays, broadcast; int32 is exact: every term < 2^31):
    a + (128·(b - a)·t - β·t·(128 - t) + 2^13) >> 14, saturated to int16."""
    fraction = (b - a) * (t << SEGMENT_BITS)
    if bend is not None:
        fraction -= bend * (t * (SEGMENT - t))
    fraction += 1 << (2 * SEGMENT_BITS - 1)
    fraction >>= 2 * SEGMENT_BITS
    fraction += a
    return np.clip(fraction, -32768, 32767, out=fraction)


@register("QLookupInterp", _interp_type, batch=PER_SAMPLE)
def q_lookup_interp(attrs, q, table, bends=None, segments=None, exact=None):
    """An int16 function of one value per channel (axis 1), TFLite's int16 LUT with a bend per
    segment: table [C, 513] holds the output codes at input codes -32768 + 128·k (k = 0..512);
    with u = q + 32768, k = u >> 7, t = u & 127, a = table[c, k], b = table[c, k + 1] and the
    bend β = bends[c, k] (0 without bends):
    y = a + (128·(b - a)·t - β·t·(128 - t) + 2^13) >> 14, saturated to int16 (with β = 0,
    a + ((b - a)·t + 64) >> 7: the chord, rounded half up). With exact segments (`segments`
    [C, E]: segment indices or -1; `exact` [C, E, 128]): where segments[c, e] = k,
    y = exact[c, e, t] instead. Attribute `function` as QLookup's."""
    fast = _lookup_interp_compiled(q, table, bends, segments, exact)
    if fast is not None:
        return fast
    u = q.astype(np.int32) - np.iinfo(np.int16).min
    rows, width = table.shape
    row = np.arange(rows, dtype=np.int32).reshape((1, -1) + (1,) * (q.ndim - 2))
    k = u >> SEGMENT_BITS
    t = u & (SEGMENT - 1)
    knots = table.astype(np.int32).ravel()
    at = k + row * width  # knot a's position in the rows laid end to end
    segment = k + row * (KNOTS - 1)
    bend = None if bends is None else bends.astype(np.int32).ravel().take(segment)
    base = interpolate(knots.take(at), knots.take(at + 1), bend, t)
    if segments is not None and segments.size:
        slot = segment_slots(segments).ravel().take(segment)
        count = segments.shape[1]
        index = ((row * count + np.maximum(slot, 0)) << SEGMENT_BITS) + t
        base = np.where(slot >= 0, exact.astype(np.int32).ravel().take(index), base)
    return base.astype(table.dtype)


def _lookup_interp_compiled(q, table, bends, segments, exact) -> np.ndarray | None:
    """`q_lookup_interp` in one compiled pass (`compiled._lookup_interp`: the same integers),
    or None where numba is missing or off, q is not int16 of rank 2 or more, or the call is too
    small to load numba for."""
    kernels = compiled(q.size)
    if kernels is None or q.dtype != np.int16 or q.ndim < 2 or table.dtype != np.int16:
        return None
    none = np.zeros((0, 0), np.int32)
    slots = none if segments is None or not segments.size else segment_slots(segments)
    source = np.ascontiguousarray(q).reshape(q.shape[0], q.shape[1], -1)
    out = np.empty(source.shape, np.int16)
    kernels.lookup_interp(
        source,
        np.ascontiguousarray(table),
        none if bends is None else np.ascontiguousarray(bends),
        slots,
        np.zeros((0, 0, 0), np.int16) if exact is None or not slots.size else exact,
        out,
    )
    return out.reshape(q.shape)


def _per_channel(attrs: Attrs, acc: np.ndarray, channel_axis: int) -> np.ndarray:
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    m = np.asarray(attrs["multiplier"], np.int64).reshape(shape)
    r = np.asarray(attrs["shift"], np.int64).reshape(shape)
    return _output(attrs, requantizer(attrs)(acc, m, r))


def _exact_int(array: np.ndarray) -> np.ndarray:
    return np.rint(array).astype(np.int64)


FLOAT32_EXACT = 1 << 24  # integers of smaller magnitude, and their sums below it, are exact


def _float32_exact(centered: np.ndarray, w: np.ndarray) -> bool:
    """Whether every partial sum of a conv of these integers stays below 2^24 in magnitude
    (then float32 arithmetic, in any order and with fused multiply-adds, is exact)."""
    if not centered.size:
        return True
    largest = max(-int(centered.min()), int(centered.max()))
    per_output = np.abs(w.astype(np.int64)).reshape(len(w), -1).sum(axis=1).max()
    return largest * int(per_output) < FLOAT32_EXACT


@register(
    "QConv",
    _typed(lambda attrs, types: conv_type(attrs, types[:2])),
    batch=PER_SAMPLE,
    quantizes=("Conv",),
    weights=conv_weights,
)
def q_conv(attrs, x, w, b):
    """Integer conv of (x - x_zero_point) and symmetric weights, integer bias, requantized
    (on float32 BLAS when that is exact: 8-bit layers, mostly; float64 otherwise; a stride-1
    2-D kernel with no more outputs than inputs by taps, `conv_by_taps`: the same integers)."""
    centered = _centered(x, attrs["x_zero_point"])
    dtype = np.float32 if _float32_exact(centered, w) else np.float64
    centered, weights = centered.astype(dtype), w.astype(dtype)
    if _by_taps(attrs, x, w):
        acc = conv_by_taps(centered, weights, attrs["pads"], attrs["dilations"])
    else:
        acc = conv(attrs, centered, weights)
    bias = b.astype(np.int64).reshape((1, -1) + (1,) * (x.ndim - 2))
    return _per_channel(attrs, _exact_int(acc) + bias, 1)


def _by_taps(attrs: Attrs, x: np.ndarray, w: np.ndarray) -> bool:
    """Whether `conv_by_taps` computes this QConv (faster than im2col and a GEMM)."""
    return (
        x.ndim == 4
        and attrs["group"] == 1
        and w.shape[2:] != (1, 1)
        and all(s == 1 for s in attrs["strides"])
        and w.shape[0] <= w.shape[1]
    )


_QGEMM_BATCH = replace(PER_SAMPLE, rows=True).where(lambda node: not node.attrs.get("transA"))


@register(
    "QGemm",
    _typed(lambda attrs, types: gemm_type(attrs, types[:2])),
    batch=_QGEMM_BATCH,
    quantizes=("Gemm", "MatMul"),
    weights=gemm_weights,
)
def q_gemm(attrs, a, w, b):
    centered = _centered(a, attrs["x_zero_point"]).astype(np.float64)
    acc = gemm({"transB": attrs.get("transB", 0)}, centered, w.astype(np.float64))
    return _per_channel(attrs, _exact_int(acc) + b.astype(np.int64), 1)


def _rescaled(q: np.ndarray, zero_point, rescale, rescaling=requantize) -> np.ndarray:
    """An addend at the sum's resolution: rescaling((q - zp) << ADD_SHIFT, m, r)."""

    def scale(codes):
        return rescaling(_centered(codes, zero_point) << ADD_SHIFT, *rescale)

    table = _per_code(q, scale, zero_point, *rescale)
    return scale(q) if table is None else table


@register("QAdd", _typed(broadcast), batch=BROADCASTING, quantizes=("Add", "Sub"))
def q_add(attrs, a, b):
    """a ± b: each input rescaled to half the larger input scale at 2^20 resolution, summed,
    then requantized to the output (TFLite's scheme; `rounding` as in `tflite_rounding`)."""
    rescaling = requantizer(attrs)
    a_scaled = _rescaled(a, attrs["a_zero_point"], attrs["a_rescale"], rescaling)
    b_scaled = _rescaled(b, attrs["b_zero_point"], attrs["b_rescale"], rescaling)
    total = a_scaled - b_scaled if attrs.get("subtract") else a_scaled + b_scaled
    return _output(attrs, rescaling(total, attrs["multiplier"], attrs["shift"]))


@register("QMul", _typed(broadcast), batch=BROADCASTING, quantizes=("Mul",))
def q_mul(attrs, a, b):
    product = _centered(a, attrs["a_zero_point"]) * _centered(b, attrs["b_zero_point"])
    return _output(attrs, requantizer(attrs)(product, attrs["multiplier"], attrs["shift"]))


@register("QConcat", _typed(_concat_type), batch=CONCAT_BATCH, quantizes=("Concat",))
def q_concat(attrs, *inputs):
    """Each input requantized to the output parameters, then concatenated (with per-tensor
    output parameters, each input through a table over its codes where `_per_code` can)."""
    inputs_params = zip(inputs, attrs["x_zero_points"], attrs["multiplier"], attrs["shift"])
    output = [attrs[key] for key in ("y_zero_point", "qmin", "qmax")]
    if any(np.ndim(p) for p in output):  # one per channel of the whole: after concatenating
        parts = [requantize(_centered(x, zp), m, r) for x, zp, m, r in inputs_params]
        return _output(attrs, np.concatenate(parts, axis=attrs["axis"]))
    parts = []
    for x, zp, m, r in inputs_params:

        def convert(codes, zp=zp, m=m, r=r):
            return _output(attrs, requantize(_centered(codes, zp), m, r))

        part = _per_code(x, convert, zp, m, r)
        parts.append(convert(x) if part is None else part)
    return np.concatenate(parts, axis=attrs["axis"])


@register(
    "QAveragePool",
    _typed(_pool_type),
    batch=PER_SAMPLE,
    quantizes=("AveragePool", "GlobalAveragePool", "ReduceMean"),
)
def q_average_pool(attrs, x):
    """Window sums of (x - zp_x), each rescaled by s_x / (s_y * count) for its window's count.

    The multiplier of each count is `quantize_multiplier(scale_ratio / count)`; with `rounding`
    "gemmlowp" (read from a circle) every window counts its whole kernel and `multiplier`,
    `shift` are onert's (`tflite_rounding`).
    """
    total, counts = window_sums(attrs, _centered(x, attrs["x_zero_point"]).astype(np.float64))
    if attrs.get(ROUNDING) == GEMMLOWP:  # a circle's DEPTHWISE_CONV_2D of ones: whole windows
        m, r = attrs.get("multiplier"), attrs.get("shift")  # required then (`ir_attrs`)
        return _output(attrs, requantize_gemmlowp(_exact_int(total), m, r))
    m, r = count_multipliers(attrs["scale_ratio"], counts)
    return _output(attrs, requantize(_exact_int(total), m, r))
