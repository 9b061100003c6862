"""`interpolated_table` (the int16 per-channel QLookupInterp tables, built in blocks of
channels, the bent differences measured only where a bend was fitted) against a slow,
straightforward reference of its definition in docs/quantization.md: one channel at a time,
one segment at a time, in Python integers and exact fractions. The functions are the table ops
of real models (HardSwish, Sigmoid, SiLU, Tanh) and Round (more segments off than
EXACT_SEGMENTS), with per-channel input and output parameters
and, for two of them, a scalar affine absorbed after them (`then`)."""

from fractions import Fraction

import numpy as np
import pytest

from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops.quantized import KNOTS, SEGMENT
from onebuild.graph_ir.quant.interpolated_table import (
    BLOCK,
    EXACT_ABOVE,
    EXACT_SEGMENTS,
    interpolated_table,
)
from onebuild.graph_ir.quant.kernel_attrs import function_codes
from onebuild.graph_ir.quant.params import channel_of, dequantize
from onebuild.graph_ir.tensor import QuantParams

CHANNELS = BLOCK + 4  # two blocks, the second one partial
CHECKED = (0, 9, BLOCK + 3)  # the reference is slow: these channels, in both blocks
AFFINE = (0.63, -0.55)


def _interpolated(a: int, b: int, bend: int, t: int) -> int:
    """QLookupInterp's code at offset t of a segment (docs/quantization.md), saturated."""
    y = a + ((SEGMENT * (b - a) * t - bend * t * (SEGMENT - t) + (1 << 13)) >> 14)
    return min(max(y, -32768), 32767)


def _reference(node, x: QuantParams, y: QuantParams, then, c: int):
    """Channel c's knots, bends, exact segments, their codes, and how many segments were more
    than EXACT_ABOVE off before the cap."""
    codes = np.arange(-32768, 32769)
    real = dequantize(codes, channel_of(x, c))
    full = function_codes(node, real, channel_of(y, c), "int16", then)
    exact = [int(v) for v in full]
    knots = exact[::SEGMENT]
    weights = [t * (SEGMENT - t) for t in range(SEGMENT)]  # w·2^14
    squares = Fraction(sum(w * w for w in weights), 1 << 28)  # Σ w²
    bends, errors = [], []
    for k in range(KNOTS - 1):
        a, b, e = knots[k], knots[k + 1], exact[SEGMENT * k : SEGMENT * (k + 1)]
        # Σ r·w, r the chord a + (b - a)·t/128 minus the exact code: exact, then one rounding
        misses = [(SEGMENT * (a - e[t]) + (b - a) * t) * weights[t] for t in range(SEGMENT)]
        off = Fraction(sum(misses), 1 << 21)
        bend = min(max(int(np.rint(float(off / squares))), -32768), 32767)
        chord = max(abs(_interpolated(a, b, 0, t) - e[t]) for t in range(SEGMENT))
        bent = max(abs(_interpolated(a, b, bend, t) - e[t]) for t in range(SEGMENT))
        bends.append(bend if bent < chord else 0)
        errors.append(min(chord, bent))
    nearness = [abs(-32768 + SEGMENT * k + (SEGMENT - 1) / 2) for k in range(KNOTS - 1)]
    over = [k for k in range(KNOTS - 1) if errors[k] > EXACT_ABOVE]
    worst = sorted(sorted(over, key=lambda k: (-errors[k], nearness[k]))[:EXACT_SEGMENTS])
    held = [exact[SEGMENT * k : SEGMENT * (k + 1)] for k in worst]
    return knots, bends, worst, held, len(over)


def _params(scales, offset: int) -> QuantParams:
    zero_points = tuple(int(z) for z in (np.arange(CHANNELS) * 977 + offset) % 6001 - 3000)
    return QuantParams(tuple(float(s) for s in scales), zero_points, 1)


@pytest.mark.parametrize(
    "op, attrs, affine, bounded",
    [
        ("HardSwish", {}, False, False),
        ("Sigmoid", {}, False, True),
        ("Swish", {"alpha": 1.0}, True, False),  # SiLU
        ("Tanh", {}, True, True),
        ("Round", {}, False, False),  # a step in every segment: the cap, ties at it
    ],
)
def test_tables_match_the_slow_reference(op, attrs, affine, bounded):
    graph = Graph("t")
    x = graph.add_input("x", np.float32, (1, CHANNELS, 2, 2))
    node = graph.make_node(op, [x], attrs)
    then = []
    if affine:
        mul = graph.make_node("Mul", [node.output, graph.add_constant(np.float32(AFFINE[0]))])
        add = graph.make_node("Add", [mul.output, graph.add_constant(np.float32(AFFINE[1]))])
        then = [mul, add]
    x_scales = np.geomspace(2e-4, 0.02, CHANNELS)
    if op == "Round":  # one step at the same offset of every segment: ties for the cap
        x_scales = np.full(CHANNELS, 1 / SEGMENT)
    # output steps finer than the input's (as where a table absorbs a scale): curves and
    # corners the chord misses by many LSBs, so bends and exact segments are needed
    y_scales = np.geomspace(1 / 32767, 1 / 2000, CHANNELS) if bounded else x_scales / 9
    x_params, y_params = _params(x_scales, 11), _params(y_scales[::-1], 5)
    table = interpolated_table(node, x_params, y_params, then)
    assert table.knots.shape == (CHANNELS, KNOTS) and table.bends.shape == (CHANNELS, KNOTS - 1)
    capped = 0
    for c in CHECKED:
        knots, bends, worst, held, over = _reference(node, x_params, y_params, then, c)
        assert table.knots[c].tolist() == knots, c
        assert table.bends[c].tolist() == bends, c
        listed = table.segments[c]
        assert listed[listed >= 0].tolist() == worst, c
        assert (listed[len(worst) :] == -1).all(), c
        assert table.exact[c, : len(worst)].tolist() == held, c
        assert not table.exact[c, len(worst) :].any(), c
        assert any(bends) or op == "Round", c  # the reference exercises the bends ...
        capped += over > EXACT_SEGMENTS
    assert table.segments.shape[1] > 0  # ... and exact segments
    assert bool(capped) == (op == "Round"), capped
