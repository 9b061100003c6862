"""The part of a value's range that lookup tables can tell apart (saturating activations).

A value read only by lookup tables (Sigmoid, Tanh, HardSigmoid, HardSwish, Relu, ...), directly
or through data movement, wastes codes on inputs the tables map to the same output code: a
detector's logits in [-154, 101] before a Sigmoid whose uint8 output is 0 below -6.2 and 255
above 6.2 spend 95 % of their 256 codes where the output cannot change. The range is narrowed to
the inputs where some table's output code still changes (a margin of 1/128 of that range:
two codes in 8 bits); beyond it
every reader gives the same codes as before, so only resolution is gained (the producer's
requantization clamps there).
"""

from collections.abc import Callable

import numpy as np

from ..ir import Node, Value
from ..ops import OPS
from .kernel_attrs import constant_operands, function_codes
from .params import QuantParams

GRID = 1 << 14  # points at which each table's function is evaluated over the calibrated range
MARGIN = 1 / 128  # of the narrowed range, on each side: two 8-bit codes
# data movement whose output codes are input codes (a clamp before it equals a clamp after it);
# linear Resize is left out: it interpolates, and interpolating clamped values differs
MOVES = frozenset(n for n, op in OPS.items() if op.quant in ("passthrough", "pad"))

Setting = Callable[[Node], str | None]  # a node's quantized dtype, None if it stays float
OutputParams = Callable[[Value, str], QuantParams]


def live_range(
    value: Value,
    lo: float,
    hi: float,
    dtype_of: Setting,
    output_params: OutputParams,
    is_output: Callable[[Value], bool],
    memo: dict | None = None,
) -> tuple[float, float]:
    """[lo, hi] narrowed to the inputs where the tables reading `value` (each in its type
    `dtype_of(table)`, with its output's parameters `output_params(out, type)`) still change
    their output code; [lo, hi] itself when any reader is not such a table. `memo` keeps each
    table's changes for reuse by later quantizations of the same graph (keyed by the table
    node, range, type and output parameters: all they depend on)."""
    if not hi > lo:
        return lo, hi
    grid = np.linspace(lo, hi, GRID + 1)
    spans = _spans(value, grid, dtype_of, output_params, is_output, memo)
    if spans is None:
        return lo, hi
    return _within(grid, spans)


def _within(grid: np.ndarray, spans: list) -> tuple[float, float]:
    """The grid's range from the first to the last change of `spans`, plus the margin."""
    lo, hi = float(grid[0]), float(grid[-1])
    if not spans:  # every table is constant over the range: any one code will do
        return 0.0, 0.0
    first, last = grid[min(s[0] for s in spans)], grid[max(s[1] for s in spans)]
    margin = (last - first) * MARGIN  # the end codes stay beyond the last change after rounding
    return max(lo, float(first - margin)), min(hi, float(last + margin))


def _spans(value, grid, dtype_of, output_params, is_output, memo=None) -> list | None:
    """(first, last) grid indices where each table reading `value` changes code, each in its
    own type (a table promoted to int16 reads a uint8 producer's codes requantized: beyond
    the span it is as constant as in 8 bits); None when a reader is not a quantized table (or
    the value leaves the graph)."""
    if is_output(value) or not value.users:
        return None
    memo = {} if memo is None else memo
    spans = []
    for node in value.users:
        dtype = dtype_of(node)
        if dtype is None or node.inputs[0] is not value:
            return None
        if node.op in MOVES and _moves_codes(node):
            for out in node.outputs:
                inner = _spans(out, grid, dtype_of, output_params, is_output, memo)
                if inner is None:
                    return None
                spans += inner
        elif _constant_table(node):
            params = output_params(node.output, dtype)
            key = ("changes", id(node), float(grid[0]), float(grid[-1]), dtype, params)
            if key not in memo:
                codes = function_codes(node, grid.astype(np.float32), params, dtype)
                changes = np.flatnonzero(codes[1:] != codes[:-1])
                memo[key] = (int(changes[0]), int(changes[-1]) + 1) if changes.size else None
            if memo[key] is not None:
                spans.append(memo[key])
        else:
            return None
    return spans


def _constant_table(node: Node) -> bool:
    """A lookup op whose extra operands (Clip's bounds) are constant."""
    return OPS[node.op].quant == "lookup" and constant_operands(node) is not None


def _moves_codes(node: Node) -> bool:
    """Data movement that keeps every output element an input element (or real 0 padding)."""
    if node.op == "Pad":  # the quantizer pads with the zero point only for real 0.0
        constant = node.attrs.get("mode", "constant") == "constant"
        return constant and float(node.attrs.get("value", 0.0)) == 0.0
    return all(v.dtype == node.inputs[0].dtype for v in node.outputs)
