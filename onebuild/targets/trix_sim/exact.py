"""Exact integer arithmetic of the TRIX simulator on float BLAS and numpy: GEMMs whose
float32 partial sums provably stay integers below 2^24, requantization in float64 or in place
in int64 where a bound proves it exact, saturation, tables of every
code, and fast operand comparison."""

from functools import cache
from itertools import pairwise

import numpy as np

from ...graph_ir.quant.params import ADD_SHIFT, requantize
from . import kernels
from .lower import Layer


def exact_int(array: np.ndarray) -> np.ndarray:
    """Integer-valued floats as int64."""
    return np.rint(array).astype(np.int64)


FLOAT32_EXACT = 1 << 24


def exact_dot(
    a: np.ndarray, b: np.ndarray, bound: int, keep_float: bool = False, a_norm=None, reach=None
) -> np.ndarray:
    """a @ b of integer-valued arrays, exactly, where every |a_ik * b_kj| <= bound: float32
    BLAS over reduction chunks in which every partial sum provably stays below 2^24 (any
    summation order is then exact), chunks summed in int64; float64 when products are too
    large. Chunks are as long as the data allows (`reduction_chunks`; `a_norm`: `row_norm(a)`
    if known); one chunk without looking at the data where `reach`, a bound on every sum of
    |a_ik b_kj| over k (`row_l1(a)` times the largest |b|), is below 2^24. `keep_float`
    returns the float product itself (exact integers) where one GEMM makes it, else int64."""
    worst = FLOAT32_EXACT // max(bound, 1)
    if worst < 64:
        return exact_int(a.astype(np.float64) @ b.astype(np.float64))
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if reach is not None and reach < FLOAT32_EXACT:
        edges = [0, a.shape[1]]
    else:
        edges = reduction_chunks(a32, b32, worst, a_norm)
    if len(edges) == 2:
        return a32 @ b32 if keep_float else (a32 @ b32).astype(np.int64)
    total = np.zeros((a.shape[0], b.shape[1]), np.int64)
    for k0, k1 in pairwise(edges):
        total += (a32[:, k0:k1] @ b32[k0:k1]).astype(np.int64)
    return total


def row_norm(a: np.ndarray) -> float:
    """The largest sum of squares of a row of `a` (float32 sums: within 7 % for rows of at
    most 2^20)."""
    return float(np.einsum("mk,mk->m", a, a).max(initial=0))


def row_l1(a: np.ndarray) -> float:
    """The largest sum of |a_ik| over a row of `a` (exact for integers below 2^53 in all)."""
    return float(np.abs(a).sum(axis=1, dtype=np.float64).max(initial=0))


def reduction_chunks(a: np.ndarray, b: np.ndarray, worst: int, a_norm=None) -> list[int]:
    """Edges of the fewest equal reduction chunks (halving) in which every partial sum of row
    i of `a` times column j of `b` is below 2^24: by Cauchy-Schwarz it is at most
    |a_i| |b_j| over the chunk; the float32 sums of squares are within 7 % for chunks of at most
    2^20, so |a_i|^2 |b_j|^2 <= 2^46 suffices. Chunks of `worst` (the product bound) always do.
    `a_norm`: `row_norm(a)`, if known (a program's constant weights)."""
    k = a.shape[1]
    least = -(-k // worst)
    pieces = 1
    while pieces < least and k <= 1 << 20:
        edges = [k * i // pieces for i in range(pieces + 1)]
        if all(
            (row_norm(a[:, k0:k1]) if a_norm is None or pieces > 1 else a_norm)
            * float(np.einsum("kn,kn->n", b[k0:k1], b[k0:k1]).max(initial=0))
            <= float(1 << 46)
            for k0, k1 in pairwise(edges)
        ):
            return edges
        pieces *= 2
    return [*range(0, k, worst), k]


@cache
def product_bound(codes: np.dtype, weights: np.dtype) -> int:
    """The largest |(x - zero point) * w| of these code and weight dtypes."""
    x, w = np.iinfo(codes), np.iinfo(weights)
    return (int(x.max) - int(x.min)) * (int(w.max) + 1)


INT64_LIMIT = 1 << 63


def scale_in_place(v: np.ndarray, offset, m, r, add: int, v_bound: int) -> np.ndarray | None:
    """v <- requantize(v + offset, m, r) + add (params.requantize: round half to even of
    x m / 2^r), in place on an int64 array v with |v| <= v_bound; None (v untouched) when int64
    could overflow. `offset`, `m` and `r` are integers or arrays broadcasting against v.

    Folded as t = v m + (offset m + 2^(r-1) + add 2^r), then t >> r, less one where t's low r
    bits are zero (x m / 2^r lay half-way) and t >> r - add (the rounded value) is odd: add
    2^r is a multiple of 2^r, so adding it before the floor division adds `add` after it and
    leaves the low bits alone. int64 arithmetic wraps modulo 2^64, so the result is exact when
    the true sum before the shift is below 2^63 in magnitude: (v_bound + |offset|) m +
    2^(r-1) + |add| 2^r < 2^63, checked here with Python integers for the largest offset,
    multiplier and shift (which also bounds the constant)."""
    m, r, offset = (np.asarray(a, np.int64) for a in (m, r, offset))
    largest_r = int(r.max())
    worst = (v_bound + int(np.abs(offset).max())) * int(m.max())
    if worst + (1 << (largest_r - 1)) + (abs(add) << largest_r) >= INT64_LIMIT:
        return None
    one = np.int64(1)
    constant = offset * m + (one << (r - 1)) + (np.int64(add) << r)
    v *= m
    v += constant
    tie = (v & ((one << r) - 1)) == 0
    v >>= r
    v -= tie & ((v - add) & 1).astype(bool)
    return v


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """np.array_equal, 8 bytes at a time where both arrays have one dtype and shape and
    contiguous rows along the first axis (SRAM tiles, row ranges of a tensor) and are large
    enough for that to pay."""
    if a.dtype != b.dtype or a.shape != b.shape or a.nbytes < 1 << 16:
        return bool(np.array_equal(a, b))
    if a.flags.c_contiguous and b.flags.c_contiguous and a.nbytes % 8 == 0:
        words = a.reshape(-1).view(np.uint64), b.reshape(-1).view(np.uint64)
        return bool((words[0] == words[1]).all())
    x, y = _byte_rows(a), _byte_rows(b)
    if x is None or y is None or x.shape != y.shape:
        return bool(np.array_equal(a, b))
    n = x.shape[1] // 8 * 8
    if not (x[:, :n].view(np.uint64) == y[:, :n].view(np.uint64)).all():
        return False
    return n == x.shape[1] or bool((x[:, n:] == y[:, n:]).all())


def _byte_rows(a: np.ndarray) -> np.ndarray | None:
    """`a` as a 2-D uint8 view with contiguous rows (one row if it is all contiguous), or
    None."""
    if a.size == 0:
        return None
    if a.flags.c_contiguous:
        return a.reshape(1, -1).view(np.uint8)
    if a.ndim >= 2 and a[0].flags.c_contiguous:
        return a.reshape(len(a), -1).view(np.uint8)
    return None


FLOAT64_EXACT = 1 << 53


def requantize_float(
    acc: np.ndarray, bias, m, r, zp: int, qmin: int, qmax: int, dtype, scaling=None, table=None
):
    """clip(requantize(acc + bias, m, r) + zp, qmin, qmax) as `dtype`, per channel (bias, m, r
    int64 arrays broadcasting against acc), in float64: t = acc s + bias s with s = m 2^-r,
    rounded half to even (np.rint, as `params.requantize`), plus zp, clipped; in four or five
    numpy passes, or one compiled pass (kernels.py). `acc` holds integers in float32 (below
    2^24, as `exact_dot` makes them; it may be updated in place) or float64 (or int64 below
    2^53). None where the proof below does not hold for every channel (the caller then takes
    the int64 path). `scaling`: `float_scaling` of the same arguments, if known (a layer's
    constants). `table`: codes of `dtype` to look the results up in (`lookup`), if any.

    Exact: requantize is round_half_even(w) for w = (acc + bias) s. Every quantity is a
    multiple of 2^-r, exact in float64 while below 2^(53 - r). Where round(w) + zp is in
    [qmin - 1, qmax + 1] (the results the clip does not decide alone), |acc m| <= (L + |zp| +
    1) 2^r + |bias| m with L = max(|qmin|, |qmax|) + 1, so if that is below 2^53 (checked)
    acc s, bias s and their sum w are all exact and rint(t) = round_half_even(w), ties
    included. Elsewhere two roundings leave |t - w| <= 2^-51 (|w| + |bias s|) and |bias s| <
    2^(53 - r) <= 2^49 (r >= 4, checked), so t stays beyond the same clip bound.

    A float32 `acc` takes its bias in float32 instead (one narrower pass) where |bias| < 2^24
    and R 2^r < 2^24 m for every channel (R = L + |zp| + 1, checked): then every v = acc + bias
    with |v m| <= R 2^r (all the results the clip does not decide alone) is below 2^24, so
    v' = fl32(v) = v and t = fl64(v s) = w exactly (v m < 2^53 as above). Beyond, on the high
    side (the low one is alike): the integer V = ceil(u / s) for u = qmax - zp + 1 lies in that
    range, so it is exact in float32; rounding is monotonic, so v >= V gives v' >= V and
    t >= fl64(V s) >= u: clipped to qmax, as w >= u is."""
    if scaling is None:
        scaling = float_scaling(bias, m, r, zp, qmin, qmax)
    if scaling is False:
        return None
    scale, offset, bias32 = scaling
    narrow = acc.dtype == np.float32 and bias32 is not None
    fused = kernels.compiled()
    rows = per_row(acc, scaling, narrow)
    if fused is not None and rows is not None and acc.flags.c_contiguous:
        return requantize_rows(fused, acc, rows, narrow, zp, qmin, qmax, dtype, table)
    if narrow:
        t = np.multiply(np.add(acc, bias32, out=acc), scale, dtype=np.float64)
    else:
        t = np.multiply(acc, scale, dtype=np.float64)
        t += offset
    np.rint(t, out=t)
    if zp:
        t += zp
    y = np.clip(t, qmin, qmax, out=np.empty(t.shape, dtype), casting="unsafe")
    return y if table is None else lookup(table, y)


def per_row(acc: np.ndarray, scaling: tuple, narrow: bool) -> list[np.ndarray] | None:
    """`float_scaling`'s arrays as one value per row of `acc` (the bias in float32 where
    `narrow`), as `requantize_rows` takes them; None where they vary along another axis."""
    scale, offset, bias32 = scaling
    return _per_row(acc, scale, offset, bias32 if narrow else scale)


def requantize_rows(fused, acc, rows, narrow: bool, zp: int, qmin: int, qmax: int, dtype, table):
    """`requantize_float` by the compiled kernel (`fused`), for a C-contiguous `acc` and its
    scaling `per_row`."""
    out = np.empty(acc.shape, dtype)
    scale, offset, bias32 = rows
    flat = (len(acc), -1)
    bias32 = bias32 if narrow else bias32[:0].astype(np.float32)  # empty: t = acc s + o
    codes = out[:0].reshape(-1) if table is None else table  # empty: no lookup
    fused.requantize(
        acc.reshape(flat), bias32, scale, offset, zp, qmin, qmax, codes, out.reshape(flat)
    )
    return out


def _per_row(acc: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray] | None:
    """`arrays` as one value per row of `acc` (its first axis) each, or None if one of them
    varies along another axis (or acc has no rows)."""
    if acc.ndim == 0 or not len(acc) or any(a.ndim > acc.ndim for a in arrays):
        return None
    shape = (len(acc),) + (1,) * (acc.ndim - 1)
    if all(a.shape == shape for a in arrays):  # as requant_channels passes them
        return [a.reshape(-1) for a in arrays]
    try:
        if np.broadcast_shapes(shape, *(a.shape for a in arrays)) != shape:
            return None
    except ValueError:
        return None
    return [np.ascontiguousarray(np.broadcast_to(a, shape).reshape(-1)) for a in arrays]


def float_scaling(bias, m, r, zp: int, qmin: int, qmax: int):
    """(s, bias s) in float64 and the bias in float32 (None where a float32 accumulator may
    not take it: see `requantize_float`) for `requantize_float`, or False where its proof does
    not hold."""
    m, r, bias = (np.asarray(v, np.int64) for v in (m, r, bias))
    reach = max(abs(qmin), abs(qmax)) + 1 + abs(zp) + 1
    if (
        int(r.min()) < 4
        or int(r.max()) > 62 - reach.bit_length()
        or (int(np.abs(bias).max()) * int(m.max()) >= FLOAT64_EXACT)
    ):
        return False
    if int(((np.int64(reach) << r) + np.abs(bias) * m).max()) >= FLOAT64_EXACT:
        return False
    # bias s 2^r is below 2^53 by the checks: both are exact
    scale, offset = np.ldexp(m.astype(np.float64), -r), np.ldexp((bias * m).astype(np.float64), -r)
    narrow = int(np.abs(bias).max()) < FLOAT32_EXACT and bool(
        ((np.int64(reach) << r) < (m << 24)).all()
    )
    return scale, offset, bias.astype(np.float32) if narrow else None


def all_codes(dtype: str | np.dtype) -> np.ndarray:
    """Every value of an 8- or 16-bit integer dtype, in the order of its bits: the rows of a
    table that `lookup` indexes with codes of that dtype."""
    bits = np.dtype(dtype).itemsize * 8
    return np.arange(1 << bits, dtype=f"uint{bits}").view(dtype)


def lookup(table: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """table[bits of x] or, for a table over pairs of 8-bit codes (x major), table[bits of x,
    bits of b] (b broadcasting against x, or x against b)."""
    bits = x.view(f"uint{8 * x.itemsize}")
    if b is None:
        return np.take(table, bits)
    index = bits.astype(np.uint16)
    index <<= 8
    low = b.view(np.uint8)
    full = index.shape == np.broadcast_shapes(index.shape, low.shape)
    return np.take(table, np.bitwise_or(index, low, out=index if full else None))


def saturate(layer: Layer, scaled: np.ndarray) -> np.ndarray:
    """scaled + the output zero point, clipped to [qmin, qmax] (in place where it may)."""
    a = layer.attrs
    shifted = np.asarray(scaled + a["y_zero_point"])
    return np.clip(shifted, a["qmin"], a["qmax"], out=shifted)


def elementwise(layer: Layer, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An add/sub or mul layer's saturated output codes from its operands' codes (the rules of
    the integer reference's QAdd and QMul)."""
    a = layer.attrs
    xa = x.astype(np.int64) - a["a_zero_point"]
    xb = b.astype(np.int64) - a["b_zero_point"]
    if layer.kind == "mul":
        return saturate(layer, requantize(xa * xb, a["multiplier"], a["shift"]))
    left = requantize(xa << ADD_SHIFT, *a["a_rescale"])
    right = requantize(xb << ADD_SHIFT, *a["b_rescale"])
    total = left - right if a["subtract"] else left + right
    return saturate(layer, requantize(total, a["multiplier"], a["shift"]))
