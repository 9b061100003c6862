"""The constant inputs of QLookupInterp (`ops.quantized.q_lookup_interp`), the int16 table of
one channel's function on a per-channel edge: knots every 128 input codes, a bend per segment
and exact codes in the segments that still interpolate more than 1 LSB off."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..ir import Node
from ..ops.quantized import SEGMENT, interpolate
from ..tensor import QuantParams
from .kernel_attrs import function_codes
from .params import dequantize

# Exact codes where a segment interpolates more than EXACT_ABOVE output steps off, in at most
# EXACT_SEGMENTS segments per channel (the worst)
EXACT_ABOVE = 1
EXACT_SEGMENTS = 16
BLOCK = 16  # channels built at once (16 x 65536 codes)
CODES = np.arange(-32768.0, 32769.0)  # every int16 code, then the last knot's (float64: exact)
_OFFSETS = np.arange(SEGMENT, dtype=np.int32)
_T = _OFFSETS.astype(np.float64)
_BEND = _T * (SEGMENT - _T) / SEGMENT**2  # the bend's weight: t·(128 - t) / 2^14
_NEARNESS = np.abs(CODES[:-1].reshape(-1, SEGMENT).mean(axis=1))  # a segment's distance from 0


class InterpolatedTable(NamedTuple):
    """QLookupInterp's constant inputs: knots [C, 513], bends [C, 512], exact segments [C, E]
    (segment index or -1) and their codes [C, E, 128]; E = 0 when every segment interpolates
    within EXACT_ABOVE."""

    knots: np.ndarray
    bends: np.ndarray
    segments: np.ndarray
    exact: np.ndarray


def _errors(knots: np.ndarray, bends: np.ndarray | None, exact: np.ndarray) -> np.ndarray:
    """Each segment's largest difference [S] between the table (no exact segments) and the
    exact codes [S, 128] of S segments, given their knots [S, 2] (a, b) and bends [S]."""
    a, b = (knots[:, i, None].astype(np.int32) for i in (0, 1))
    bend = None if bends is None else bends[:, None].astype(np.int32)
    got = interpolate(a, b, bend, _OFFSETS)
    got -= exact
    return np.abs(got, out=got).max(axis=1)


def _bends(knots: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per segment the bend β fitted by least squares to the exact codes [S, 128], where the
    chord between its knots [S, 2] is off by r(t): β = round(Σ r·w / Σ w²) with
    w = t·(128 - t) / 2^14, saturated to int16 (Σ r·w = a·Σ w + (b - a)·Σ t·w / 128 - Σ e·w,
    e the exact codes: every sum exact in float64, w being multiples of 2^-14)."""
    a = knots[:, 0].astype(np.float64)
    b = knots[:, 1].astype(np.float64)
    codes = exact.astype(np.float64)
    off = a * _BEND.sum() + (b - a) * (_T * _BEND).sum() / SEGMENT - codes @ _BEND
    fitted = np.rint(off / np.square(_BEND).sum())
    return np.clip(fitted, -32768, 32767).astype(np.int16)


def _channels(params: QuantParams, start: int, stop: int) -> QuantParams:
    """Channels start..stop of per-channel `params` (on axis 1), per-tensor ones as they are."""
    if params.axis is None:
        return params
    return QuantParams(params.scale[start:stop], params.zero_point[start:stop], 1)


def _worst(error: np.ndarray) -> np.ndarray:
    """A channel's exact segments from its segments' largest differences [512]: those above
    EXACT_ABOVE, the EXACT_SEGMENTS worst (largest first, then nearest code 0), in order."""
    over = np.flatnonzero(error > EXACT_ABOVE)
    if len(over) <= EXACT_SEGMENTS:
        return over
    order = np.lexsort((_NEARNESS[over], -error[over]))[:EXACT_SEGMENTS]
    return np.sort(over[order])


def _rows(node: Node, x: QuantParams, y: QuantParams, then: Sequence[Node], count: int):
    """Knots, bends, exact segments (a list of index arrays) and the exact codes [B, 512, 128]
    of `count` channels with parameters `x` and `y`: the bends fitted on every segment, their
    differences measured with the chord on every segment, bent only where a bend was fitted
    and the chord is not exact already."""
    every = np.broadcast_to(CODES, (1, count, CODES.size))
    codes = function_codes(node, dequantize(every, x), y, "int16", then)[0]
    knots = np.ascontiguousarray(codes[:, ::SEGMENT])  # the last one past int16's end
    exact = codes[:, :-1].reshape(-1, SEGMENT)  # [B·512, 128]
    ends = np.stack([knots[:, :-1].ravel(), knots[:, 1:].ravel()], axis=1)  # a, b per segment
    chord = _errors(ends, None, exact)
    bends = _bends(ends, exact)
    fitted = np.flatnonzero((bends != 0) & (chord > 0))  # (where the chord is exact, it stays)
    bent = chord.copy()
    bent[fitted] = _errors(ends[fitted], bends[fitted], exact[fitted])
    bends[bent >= chord] = 0
    error = np.minimum(bent, chord).reshape(count, -1)
    worst = [_worst(row) for row in error]
    return knots, bends.reshape(count, -1), worst, exact.reshape(count, -1, SEGMENT)


def interpolated_table(
    node: Node, x: QuantParams, y: QuantParams, then: Sequence[Node] = ()
) -> InterpolatedTable:
    """The QLookupInterp table of table op `node` (then the ops `then`) between per-channel
    int16 `x` and `y`, row c from channel c's exact codes (`function_codes`, rounded half to
    even, as the 65536-entry table holds them):

    - knots: the exact codes at the input codes -32768 + 128·k, k = 0..512 (the last one past
      int16's end, where only the slope of the last segment reads it);
    - bends: per segment the least-squares bend (`_bends`: curvature), kept where it lowers
      the segment's largest difference from the exact codes, else 0;
    - exact segments: where the table still differs from the exact codes by more than
      EXACT_ABOVE somewhere (a corner of HardSwish, Relu6, HardSigmoid inside the segment),
      the segment's exact codes: per channel the EXACT_SEGMENTS worst (largest difference
      first, then nearest code 0, where the calibrated values lie)."""
    channels = max(len(x.scale), len(y.scale))
    knots, bends, worst, codes = [], [], [], []
    for start in range(0, channels, BLOCK):
        stop = min(start + BLOCK, channels)
        xs, ys = _channels(x, start, stop), _channels(y, start, stop)
        k, b, w, exact = _rows(node, xs, ys, then, stop - start)
        knots.append(k)
        bends.append(b)
        worst += w
        codes += [e[i] for e, i in zip(exact, w)]
    count = max(len(w) for w in worst)
    segments = np.full((channels, count), -1, np.int16)
    exact_codes = np.zeros((channels, count, SEGMENT), np.int16)
    for c, (w, e) in enumerate(zip(worst, codes)):
        segments[c, : len(w)] = w
        exact_codes[c, : len(w)] = e
    return InterpolatedTable(np.concatenate(knots), np.concatenate(bends), segments, exact_codes)
