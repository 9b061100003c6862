"""The quantization rule "recurrent": LSTM / GRU / RNN -> QLSTM / QGRU / QRNN.

A layer qualifies when its weights and biases are constant, it has no peepholes, both directions
use the same gate functions, and those functions fit the fixed-point gates: the gate function
(sigmoid-like, used as a mix factor) within [0, 1] and the others within [-1, 1] over the
pre-activation range [-8, 8). The LSTM also needs its cell-state range from calibration
(`calibrate` records it); otherwise the layer stays float. Semantics: docs/quantization.md.
"""

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ir import Node, Value
from ..ops.quantized_recurrent import FUNCTION_BITS, GATE_BITS, INT16
from ..ops.recurrent import GATE_FUNCTIONS, activation, cell_state_name
from ..tensor import QuantParams
from .params import (
    HEADROOM,
    activation_params,
    quantize,
    quantize_multiplier,
    weight_params,
)

if TYPE_CHECKING:
    from .quantize_graph import _Quantizer

QUANTIZED = {"LSTM": "QLSTM", "GRU": "QGRU", "RNN": "QRNN"}
CODES = np.arange(INT16[0], INT16[1] + 1)


def _function_values(spec) -> np.ndarray:
    """A gate function, (name, alpha, beta), over every Q3.12 pre-activation code, in float64."""
    with np.errstate(over="ignore"):
        return np.asarray(activation(*spec)(CODES * 2.0**-GATE_BITS), np.float64)


def function_table(spec) -> np.ndarray:
    """The int16 table of a gate function: round_half_even(f(code · 2^-12) · 2^15), saturated."""
    scaled = np.rint(_function_values(spec) * 2.0**FUNCTION_BITS)
    return np.clip(scaled, *INT16).astype(np.int16)


def _tables(graph, functions: list) -> Value:
    """The stacked int16 tables of `functions`, one constant per graph and function list: every
    layer with the same gate functions reads the same 128 KB per function."""
    name = "gate_tables_" + "_".join("_".join(map(str, f)) for f in functions)
    shared = graph.constants.get(name)
    if shared is not None:
        return shared
    return graph.add_constant(np.stack([function_table(f) for f in functions]), name)


def _functions(node: Node) -> list | None:
    """The gate functions of one direction, or None if the directions differ or a function does
    not fit its fixed-point range ([0, 1] for the first, [-1, 1] for the others)."""
    per = GATE_FUNCTIONS[node.op]
    activations = [tuple(a) for a in node.attrs["activations"]]
    first = activations[:per]
    if activations != first * (len(activations) // per):
        return None
    for index, spec in enumerate(first):
        values = _function_values(spec)
        low = 0.0 if index == 0 and node.op != "RNN" else -1.0
        if not np.all(np.isfinite(values)) or values.min() < low or values.max() > 1.0:
            return None
    return first


def recurrent_ok(quantizer: "_Quantizer", node: Node) -> bool:
    weights = [node.inputs[i] for i in (1, 2, 3) if i < len(node.inputs)]
    peepholes = node.inputs[7] if len(node.inputs) > 7 else None
    if any(v is not None and not v.is_const for v in weights) or peepholes is not None:
        return False
    if node.op == "LSTM" and cell_state_name(node.name) not in quantizer.ranges:
        return False  # statistics recorded without the cell states (an on-device session)
    return _functions(node) is not None


def _union(quantizer: "_Quantizer", values) -> tuple[float, float]:
    """The calibration range covering every value given (constants by their contents)."""
    ranges = []
    for value in values:
        if value is None:
            continue
        array = value.numpy() if value.is_const else None
        ranges.append(
            (float(array.min()), float(array.max()))
            if array is not None
            else quantizer.ranges[value.name]
        )
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def _per_row(weight: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row codes of [dirs, rows, columns] weights and the scales [dirs * rows]."""
    flat = weight.reshape(-1, weight.shape[-1]).astype(np.float64)
    params = weight_params(flat, dtype, 0)
    return quantize(flat, params, dtype).reshape(weight.shape), np.asarray(params.scale)


def _rescales(real: np.ndarray) -> tuple[list[int], list[int]]:
    pairs = [quantize_multiplier(float(m)) for m in real]
    return [m for m, _ in pairs], [r for _, r in pairs]


def _bias(real: np.ndarray, scales: np.ndarray, b_type) -> np.ndarray:
    limit = np.iinfo(b_type)
    return np.clip(np.rint(real.astype(np.float64) / scales), limit.min, limit.max).astype(b_type)


def cell_shift(bound: float) -> int:
    """k of the cell scale 2^-k: the finest power of two whose int16 range holds ±bound."""
    if bound <= 0:
        return FUNCTION_BITS
    return int(np.clip(FUNCTION_BITS - max(0, math.ceil(math.log2(bound))), 0, FUNCTION_BITS))


def quantize_recurrent(quantizer: "_Quantizer", node: Node, dtype: str, w_dtype: str) -> None:
    """Emit the integer layer replacing `node`: activations in `dtype`, weights in `w_dtype`."""
    op, inputs = node.op, list(node.inputs)
    inputs += [None] * (8 - len(inputs))
    x = quantizer.as_quant(inputs[0], dtype)
    lo, hi = _union(quantizer, [*node.outputs[:2], inputs[5]])
    headroom = HEADROOM.get(dtype, 1.0)  # as every other activation of the type
    h_params = activation_params(lo * headroom, hi * headroom, dtype)
    s_x, s_h = x.quant.scale[0], h_params.scale[0]
    wq, s_w = _per_row(inputs[1].numpy(), w_dtype)
    rq, s_r = _per_row(inputs[2].numpy(), w_dtype)
    dirs, rows = wq.shape[:2]
    bias = np.zeros((dirs, 2 * rows)) if inputs[3] is None else inputs[3].numpy()
    b_type = np.int64 if dtype == "int16" else np.int32
    bx = _bias(bias[:, :rows].reshape(-1), s_x * s_w, b_type).reshape(dirs, rows)
    bh = _bias(bias[:, rows:].reshape(-1), s_h * s_r, b_type).reshape(dirs, rows)
    x_multiplier, x_shift = _rescales(s_x * s_w * 2.0**GATE_BITS)
    h_multiplier, h_shift = _rescales(s_h * s_r * 2.0**GATE_BITS)
    # to hidden codes from: f(pre) Q0.15 (RNN), o·h(c) Q0.30 (LSTM); GRU: (1-z)·n Q0.30 to
    # hidden codes with 15 more fraction bits
    fraction = 2 * FUNCTION_BITS if op == "LSTM" else FUNCTION_BITS
    clip = node.attrs["cell_clip"]
    attrs = {
        **{k: node.attrs[k] for k in ("direction", "hidden_size", "layout")},
        "input_forget": node.attrs.get("input_forget", 0) if op == "LSTM" else 0,
        "linear_before_reset": node.attrs.get("linear_before_reset", 0) if op == "GRU" else 0,
        "gate_clip": None if clip is None else int(min(INT16[1], round(clip * 2**GATE_BITS))),
        "dtype": dtype,
        "x_zero_point": x.quant.zero_point[0],
        "y_zero_point": h_params.zero_point[0],
        "qmin": int(np.iinfo(dtype).min),
        "qmax": int(np.iinfo(dtype).max),
        "x_multiplier": x_multiplier,
        "x_shift": x_shift,
        "h_multiplier": h_multiplier,
        "h_shift": h_shift,
        "out_rescale": list(quantize_multiplier(2.0**-fraction / s_h)),
    }
    functions = _functions(node)
    distinct = list(dict.fromkeys(functions))
    attrs["functions"] = [distinct.index(f) for f in functions]
    states = [None] * (2 if op == "LSTM" else 1)  # initial_h, initial_c codes
    if inputs[5] is not None:
        states[0] = h0 = quantizer.as_quant(inputs[5], dtype)
        attrs["h0_rescale"] = [
            h0.quant.zero_point[0],
            *quantize_multiplier(h0.quant.scale[0] / s_h),
        ]
    cell_params = None
    if op == "LSTM":
        bound = max(map(abs, _union(quantizer, [inputs[6], node.outputs[2]])))
        cell_range = quantizer.ranges[cell_state_name(node.name)]
        attrs["cell_shift"] = k = cell_shift(max(bound, *map(abs, cell_range)))
        cell_params = QuantParams((2.0**-k,), (0,), None)
        if inputs[6] is not None:
            states[1] = c0 = quantizer.as_quant(inputs[6], "int16")
            attrs["c0_rescale"] = [0, *quantize_multiplier(c0.quant.scale[0] * 2.0**k)]
    graph = quantizer.graph
    constants = [
        graph.add_constant(wq, f"{inputs[1].name}_q"),
        graph.add_constant(rq, f"{inputs[2].name}_q"),
        graph.add_constant(bx, f"{node.name}_bias_x_q"),
        graph.add_constant(bh, f"{node.name}_bias_h_q"),
        _tables(graph, distinct),
    ]
    lengths = None if inputs[4] is None else quantizer.as_float(inputs[4])
    new = graph.make_node(
        QUANTIZED[op],
        [x, *constants, lengths, *states],
        attrs,
        node.name,
        output_names=[f"{v.name}_q" for v in node.outputs],
    )
    for index, (old, value) in enumerate(zip(node.outputs, new.outputs)):
        value.quant = h_params if index < 2 else cell_params
        home = dtype if index < 2 else "int16"
        quantizer.quant_of[(id(old), home)] = value
        quantizer.home[id(old)] = home
