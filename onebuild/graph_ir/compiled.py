"""Compiled kernels of the interpreter, optional (extra `fast`: numba): one pass over the data
where numpy makes one per kernel tap (depthwise convolution) or per operation (HardSwish,
integer requantization). Each does the same operations in the same precision and order as the
numpy code it replaces (no fast-math, so no fused multiply-adds nor reordering; integer
arithmetic is exact), so results are bit-identical; tests compare both paths.
`ONEBUILD_NUMBA=0` keeps the numpy path.

Loaded on the first call large enough to pay for it (`LOAD_ELEMENTS`), or once the calls so far
add up to `LOAD_TOTAL` outputs (many small calls: the OCR recognizer's mixed-precision search
never made one call that large, and ran its depthwise layers and requantizations on numpy,
about a quarter of its CPU time): numba's import and the machine code it caches on disk
(`cache=True`) cost about half a second, the first compile on a machine a few seconds more.
The kernels release the GIL, so threads run them side by side.
"""

import os
import threading
from types import SimpleNamespace

import numpy as np

use = os.environ.get("ONEBUILD_NUMBA", "1") != "0"  # tests switch it to force either path
LOAD_ELEMENTS = 1 << 20  # outputs of one call from which loading numba pays
LOAD_TOTAL = 1 << 24  # or of all the calls so far
_seen = [0]  # outputs of the calls so far, until loaded (a lost update only loads later)
BLOCK = 4096  # depthwise outputs summed tap by tap at a time (16 KB of float32)
_loaded: list = []  # [the kernels, or None where numba is missing], once loaded
_lock = threading.Lock()


def compiled(elements: int) -> SimpleNamespace | None:
    """The kernels, loaded by the first call with LOAD_ELEMENTS outputs or more, or once the
    calls add up to LOAD_TOTAL; None where numba is missing, `use` is off, or before then."""
    if not use:
        return None
    if not _loaded:
        _seen[0] += elements
    if not _loaded and (elements >= LOAD_ELEMENTS or _seen[0] >= LOAD_TOTAL):
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0] if _loaded else None


def _load() -> SimpleNamespace | None:
    try:
        import numba
    except Exception:  # missing, or a numba that cannot load (its LLVM, its numpy range)
        return None
    jit = numba.njit(cache=True, nogil=True)
    return SimpleNamespace(
        depthwise2d=jit(_depthwise2d),
        hard_swish=jit(_hard_swish),
        requantize=jit(_requantize),
        lookup_interp=jit(_lookup_interp),
    )


def _depthwise2d(x, taps, kernel, strides, dilations, pads, out):
    """out[n, c] = the sum over kernel taps (kh, kw) in row-major order, from zero, of the
    window of x[n, c] zero-padded by `pads` (top, left, bottom, right) and shifted by the tap,
    times taps[c, kh * KW + kw]: `conv._depthwise` operation for operation, padding products
    included. Each channel is first copied, padded, into phases (phase (a, b) holds the padded
    rows a, a + sh, ... and columns b, b + sw, ...: the whole plane when unstrided), so every
    tap reads one phase at an offset: long passes over the channel's plane, in rows as wide as
    a phase (the columns past the output's are dropped at the end), a cache-sized block of it
    at a time."""
    n_count, channels, height, width = x.shape
    out_h, out_w = out.shape[2], out.shape[3]
    kh_count, kw_count = kernel
    sh, sw = strides
    dh, dw = dilations
    top, left = pads[0], pads[1]
    rows = -(-(height + top + pads[2]) // sh)
    cols = -(-(width + left + pads[3]) // sw)
    phases = np.empty((sh, sw, rows, cols), out.dtype)
    span = (out_h - 1) * cols + out_w  # the outputs as flat positions in rows of `cols`
    plane = np.empty(span, out.dtype)
    phase, offsets = (
        np.empty((kh_count * kw_count, 2), np.int64),
        np.empty(kh_count * kw_count, np.int64),
    )
    for t in range(kh_count * kw_count):  # tap t reads its phase at an offset
        down, across = t // kw_count * dh, t % kw_count * dw
        phase[t, 0], phase[t, 1] = down % sh, across % sw
        offsets[t] = down // sh * cols + across // sw

    def source(t, begin, end):
        flat = phases[phase[t, 0], phase[t, 1]].reshape(-1)
        return flat[offsets[t] + begin : offsets[t] + end]

    for n in range(n_count):
        for c in range(channels):
            phases[:] = 0
            for y in range(height):
                a, i = (y + top) % sh, (y + top) // sh
                for b in range(sw):
                    first = (b - left) % sw  # the first column of x in phase b
                    if first < width:
                        count = (width - 1 - first) // sw + 1
                        j = (first + left) // sw
                        phases[a, b, i, j : j + count] = x[n, c, y, first::sw]
            for begin in range(0, span, BLOCK):  # a block of outputs stays in L1 cache
                end = min(begin + BLOCK, span)
                block = plane[begin:end]
                block[:] = 0
                t = 0
                while t < len(offsets):  # up to four taps a pass, summed in order
                    group = min(4, len(offsets) - t)
                    s0, w0 = source(t, begin, end), taps[c, t]
                    if group == 4:
                        s1, s2, s3 = (
                            source(t + 1, begin, end),
                            source(t + 2, begin, end),
                            source(t + 3, begin, end),
                        )
                        w1, w2, w3 = taps[c, t + 1], taps[c, t + 2], taps[c, t + 3]
                        for p in range(end - begin):  # from 0: no negative indices, vectorized
                            block[p] = block[p] + s0[p] * w0 + s1[p] * w1 + s2[p] * w2 + s3[p] * w3
                    elif group == 3:
                        s1, s2 = source(t + 1, begin, end), source(t + 2, begin, end)
                        w1, w2 = taps[c, t + 1], taps[c, t + 2]
                        for p in range(end - begin):
                            block[p] = block[p] + s0[p] * w0 + s1[p] * w1 + s2[p] * w2
                    elif group == 2:
                        s1, w1 = source(t + 1, begin, end), taps[c, t + 1]
                        for p in range(end - begin):
                            block[p] = block[p] + s0[p] * w0 + s1[p] * w1
                    else:
                        for p in range(end - begin):
                            block[p] = block[p] + s0[p] * w0
                    t += group
            for i in range(out_h):
                out[n, c, i, :] = plane[i * cols : i * cols + out_w]


def _hard_swish(x, constants, out):
    """out = x * clip(x / 6 + 0.5, 0, 1) elementwise, `constants` = (6, 0.5, 0, 1) in x's
    precision (`elementwise.hard_swish`); NaN stays NaN, as np.clip keeps it."""
    flat, result = x.reshape(-1), out.reshape(-1)
    six, half, zero, one = constants[0], constants[1], constants[2], constants[3]
    for i in range(flat.size):
        v = flat[i]
        t = v / six + half
        if t < zero:
            t = zero
        elif t > one:
            t = one
        result[i] = v * t


def _requantize(acc, m, r, split, out):
    """out = round_half_even(acc * m / 2^r) per element of acc [outer, C, inner], m and r per
    channel C: `params.requantize`'s two exact formulas, chosen per element (the product in one
    part where |acc| <= 2^31, else acc split at bit min(r, split)); both give the same integer
    where both apply."""
    one = np.int64(1)
    for c in range(acc.shape[1]):
        mc, rc = m[c], r[c]
        k = min(rc, split)
        half, mask, tie = one << (rc - 1), (one << (rc + 1)) - 1, one << rc
        low_mask, high_mask, high_tie = (one << k) - 1, (one << (rc - k + 1)) - 1, one << (rc - k)
        for o in range(acc.shape[0]):
            for i in range(acc.shape[2]):
                a = acc[o, c, i]
                if -(one << 31) <= a <= one << 31:
                    total = a * mc + half
                    q = total >> rc
                    if total & mask == tie:
                        q -= 1
                else:
                    low = (a & low_mask) * mc + half
                    high = (a >> k) * mc + (low >> k)
                    q = high >> (rc - k)
                    if low & low_mask == 0 and high & high_mask == high_tie:
                        q -= 1
                out[o, c, i] = q


def _lookup_interp(q, knots, bends, slots, exact, out):
    """QLookupInterp of int16 codes q [outer, C, inner] into out (int16, same shape), one pass:
    per element, u = q + 32768, k = u >> 7, t = u & 127, the row r (its channel, or 0 for one
    row), a, b = knots[r, k], knots[r, k + 1], β = bends[r, k] (0 without bends: bends has no
    rows), a + (128·(b - a)·t - β·t·(128 - t) + 2^13) >> 14 saturated to int16, or
    exact[r, slots[r, k], t] where that slot is >= 0 (no rows: no exact segments). The integers
    of `quantized.q_lookup_interp`'s int32 passes (no term reaches 2^31; here in int64)."""
    rows = knots.shape[0]
    for o in range(q.shape[0]):
        for c in range(q.shape[1]):
            r = c if rows > 1 else 0
            for i in range(q.shape[2]):
                u = np.int64(q[o, c, i]) + 32768
                k, t = u >> 7, u & 127
                if slots.shape[0] and slots[r, k] >= 0:
                    out[o, c, i] = exact[r, slots[r, k], t]
                    continue
                a = np.int64(knots[r, k])
                value = (np.int64(knots[r, k + 1]) - a) * (t << 7)
                if bends.shape[0]:
                    value -= np.int64(bends[r, k]) * (t * (128 - t))
                value = ((value + 8192) >> 14) + a
                out[o, c, i] = min(max(value, -32768), 32767)
