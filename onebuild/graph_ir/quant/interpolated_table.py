"""The constant inputs of QLookupInterp (`ops.quantized.q_lookup_interp`), the int16 table of
one channel's function on a per-channel edge: knots every 128 input codes, a bend per segment
and exact codes in the segments that still interpolate more than 1 LSB off."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..ir import Node
from ..ops import OPS
from ..ops.quantized import SEGMENT
from ..tensor import QuantParams
from .kernel_attrs import function_codes
from .params import channel_of, dequantize

# Exact codes where a segment interpolates more than EXACT_ABOVE output steps off, in at most
# EXACT_SEGMENTS segments per channel (the worst)
EXACT_ABOVE = 1
EXACT_SEGMENTS = 16
CODES = np.arange(-32768, 32768, dtype=np.int64)
_T = np.arange(SEGMENT, dtype=np.float64)
_BEND = _T * (SEGMENT - _T) / SEGMENT**2  # the bend's weight: t·(128 - t) / 2^14
_NEARNESS = np.abs(CODES.reshape(-1, SEGMENT).mean(axis=1))  # a segment's distance from 0


class InterpolatedTable(NamedTuple):
    """QLookupInterp's constant inputs: knots [C, 513], bends [C, 512], exact segments [C, E]
    (segment index or -1) and their codes [C, E, 128]; E = 0 when every segment interpolates
    within EXACT_ABOVE."""

    knots: np.ndarray
    bends: np.ndarray
    segments: np.ndarray
    exact: np.ndarray


def _errors(knots: np.ndarray, bends: np.ndarray | None, exact: np.ndarray) -> np.ndarray:
    """Each segment's largest difference [512] between the table (no exact segments) and the
    exact codes."""
    every = CODES.astype(np.int16)[None, None]
    (got,) = OPS["QLookupInterp"].kernel(
        {}, every, knots[None], *(() if bends is None else (bends[None],))
    )
    return np.abs(got.astype(np.int64).ravel() - exact).reshape(-1, SEGMENT).max(axis=1)


def _bends(knots: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per segment the bend β fitted by least squares to the exact codes, where the chord is
    off by r(t): β = round(Σ r·w / Σ w²) with w = t·(128 - t) / 2^14, saturated to int16."""
    a, b = knots[:-1, None].astype(np.float64), knots[1:, None].astype(np.float64)
    off = a + (b - a) * _T / SEGMENT - exact.reshape(-1, SEGMENT)
    fitted = np.rint((off * _BEND).sum(axis=1) / np.square(_BEND).sum())
    return np.clip(fitted, -32768, 32767).astype(np.int16)


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
    rows = []
    for c in range(channels):
        xc, yc = channel_of(x, c), channel_of(y, c)
        exact = function_codes(node, dequantize(CODES, xc), yc, "int16", then).astype(np.int64)
        past = dequantize(np.array([32768]), xc)  # the last knot, one past int16's end
        last = function_codes(node, past, yc, "int16", then)
        knots = np.concatenate([exact[::SEGMENT], last]).astype(np.int16)
        chord = _errors(knots, None, exact)
        bends = _bends(knots, exact)
        bent = _errors(knots, bends, exact)
        bends[bent >= chord] = 0
        error = np.minimum(bent, chord)
        order = np.lexsort((_NEARNESS, -error))[:EXACT_SEGMENTS]
        worst = np.sort(order[error[order] > EXACT_ABOVE])
        rows.append((knots, bends, worst, exact.reshape(-1, SEGMENT)[worst]))
    count = max(len(worst) for _, _, worst, _ in rows)
    segments = np.full((channels, count), -1, np.int16)
    exact_codes = np.zeros((channels, count, SEGMENT), np.int16)
    for c, (_, _, worst, codes) in enumerate(rows):
        segments[c, : len(worst)] = worst
        exact_codes[c, : len(worst)] = codes
    knots, bends = (np.stack([r[i] for r in rows]) for i in (0, 1))
    return InterpolatedTable(knots, bends, segments, exact_codes)
