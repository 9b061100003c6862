"""Integer LSTM, GRU and RNN (QLSTM, QGRU, QRNN): the integer reference of `recurrent.py`.

Exact semantics in docs/quantization.md, "Recurrent layers". In short: input and hidden state are
8-bit (or int16) codes with per-tensor parameters, weights symmetric per gate row, int32/int64
accumulators; each accumulator is requantized to an int16 gate pre-activation with the fixed
scale 2^-12 (Q3.12); gate functions are int16 tables over every pre-activation code with output
scale 2^-15 (Q0.15); the LSTM cell state is int16 with scale 2^-cell_shift. Every rescale of an
accumulator is `requantize` (integer multiplier and shift); products of fixed-point values are
shifted back with `shift_round`. All arithmetic is in int64 numpy arrays, exact.

Inputs: x, W, R (integer weights [dirs, gates * hidden, .]), Bx, Bh (integer biases of the input
and recurrent sums), the function tables, then ONNX's optional sequence_lens, initial_h,
initial_c.
"""

import numpy as np

from ..quant.params import requantize
from .recurrent import directions, recurrent_type, time_major
from .registry import Attrs, TensorType, register

GATE_BITS = 12  # gate pre-activations: int16, scale 2^-12
FUNCTION_BITS = 15  # gate function outputs: int16, scale 2^-15
INT16 = (-32768, 32767)
ONE = 1 << FUNCTION_BITS  # 1.0 in Q0.15 (only in int64 intermediates: 1 - z, 1 - i)
RESCALE = ("multiplier", "shift")  # per gate row: attributes x_multiplier, x_shift, h_...


def shift_round(value: np.ndarray, shift: int) -> np.ndarray:
    """floor((value + 2^(shift-1)) / 2^shift): a power-of-two rescale, ties toward +infinity."""
    return (value + (1 << (shift - 1))) >> shift if shift > 0 else value


def _sat16(value: np.ndarray) -> np.ndarray:
    return np.clip(value, *INT16)


def _quantized_type(op: str):
    """The float layer's shapes; Y and Y_h in the `dtype` attribute, Y_c int16."""
    float_type = recurrent_type(op)

    def infer(attrs: Attrs, types) -> list[TensorType]:
        y, h, *cell = float_type(attrs, types)
        dtype = np.dtype(attrs["dtype"])
        return [TensorType(dtype, y.shape), TensorType(dtype, h.shape),
                *(TensorType(np.dtype(np.int16), c.shape) for c in cell)]  # fmt: skip

    return infer


class _Layer:
    """One direction's integer parameters and the shared step arithmetic."""

    def __init__(self, attrs: Attrs, d: int, w, r, bx, bh, tables):
        rows = w.shape[1]
        per_row = slice(d * rows, (d + 1) * rows)
        self.attrs = attrs
        self.w, self.r = w[d].astype(np.int64), r[d].astype(np.int64)
        self.bx, self.bh = bx[d].astype(np.int64), bh[d].astype(np.int64)
        self.x_rescale = [np.asarray(attrs[f"x_{k}"][per_row], np.int64) for k in RESCALE]
        self.h_rescale = [np.asarray(attrs[f"h_{k}"][per_row], np.int64) for k in RESCALE]
        self.tables = [tables[i].astype(np.int64) for i in attrs["functions"]]
        zp = attrs["y_zero_point"]
        self.bounds = (attrs["qmin"] - zp, attrs["qmax"] - zp)  # of centered hidden codes
        self.clip = attrs["gate_clip"]

    def input_terms(self, xc: np.ndarray) -> np.ndarray:
        """Q3.12 input contributions of every step: requantize(x W^T + Bx)."""
        return _sat16(requantize(xc @ self.w.T + self.bx, *self.x_rescale))

    def recurrent_terms(self, hc: np.ndarray, rows: slice) -> np.ndarray:
        """Q3.12 recurrent contributions of gate rows `rows`: requantize(h R^T + Bh)."""
        acc = hc @ self.r[rows].T + self.bh[rows]
        return _sat16(requantize(acc, self.h_rescale[0][rows], self.h_rescale[1][rows]))

    def gate(self, pre: np.ndarray, function: int) -> np.ndarray:
        """Saturate to int16, apply the cell clip, look the function up (Q0.15)."""
        pre = _sat16(pre)
        if self.clip is not None:
            pre = np.clip(pre, -self.clip, self.clip)
        return self.tables[function][pre - INT16[0]]

    def to_hidden(self, value: np.ndarray) -> np.ndarray:
        """Requantize a fixed-point value to centered hidden codes (not yet saturated)."""
        return requantize(value, *self.attrs["out_rescale"])

    def saturate(self, hidden: np.ndarray) -> np.ndarray:
        """Saturate centered hidden codes to the hidden type's range."""
        return np.clip(hidden, *self.bounds)


def _lstm_step(layer: _Layer, tx, state):
    hc, c = state
    size = layer.attrs["hidden_size"]
    pre = tx + layer.recurrent_terms(hc, slice(None))
    pi, po, pf, pc = (pre[:, k * size : (k + 1) * size] for k in range(4))
    i, o, g = layer.gate(pi, 0), layer.gate(po, 0), layer.gate(pc, 1)
    f = ONE - i if layer.attrs["input_forget"] else layer.gate(pf, 0)
    k = layer.attrs["cell_shift"]
    c = _sat16(shift_round((f * c << (FUNCTION_BITS - k)) + i * g, 2 * FUNCTION_BITS - k))
    cell_in = shift_round(c, k - GATE_BITS) if k >= GATE_BITS else _sat16(c << GATE_BITS - k)
    h = layer.tables[2][cell_in - INT16[0]]  # the cell function, unclipped (as ONNX)
    return [layer.saturate(layer.to_hidden(o * h)), c]


def _gru_step(layer: _Layer, tx, state):
    (hc,) = state
    size = layer.attrs["hidden_size"]
    z_rows, r_rows, h_rows = (slice(k * size, (k + 1) * size) for k in range(3))
    zr = tx[:, : 2 * size] + layer.recurrent_terms(hc, slice(0, 2 * size))
    z, reset = layer.gate(zr[:, z_rows], 0), layer.gate(zr[:, r_rows], 0)
    if layer.attrs["linear_before_reset"]:
        recurrent = shift_round(reset * layer.recurrent_terms(hc, h_rows), FUNCTION_BITS)
    else:
        recurrent = layer.recurrent_terms(shift_round(reset * hc, FUNCTION_BITS), h_rows)
    n = layer.gate(tx[:, h_rows] + recurrent, 1)
    mixed = layer.to_hidden((ONE - z) * n) + z * hc  # hidden codes with 15 more fraction bits
    return [layer.saturate(shift_round(mixed, FUNCTION_BITS))]


def _rnn_step(layer: _Layer, tx, state):
    pre = tx + layer.recurrent_terms(state[0], slice(None))
    return [layer.saturate(layer.to_hidden(layer.gate(pre, 0)))]


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}


def _initial(attrs: Attrs, key: str, codes, d: int, batch: int, bounds) -> np.ndarray:
    """A direction's initial state rescaled to the state's parameters (zeros when absent)."""
    if codes is None:
        return np.zeros((batch, attrs["hidden_size"]), np.int64)
    zero_point, multiplier, shift = attrs[key]
    centered = codes[d].astype(np.int64) - zero_point
    return np.clip(requantize(centered, multiplier, shift), *bounds)


def _run(op: str, attrs: Attrs, x, w, r, bx, bh, tables, lengths, states):
    layout, dirs = attrs["layout"], directions(attrs)
    x, states, lengths = time_major(attrs, x, states, lengths)
    seq, batch = x.shape[:2]
    hidden, zp = attrs["hidden_size"], attrs["y_zero_point"]
    y = np.zeros((seq, dirs, batch, hidden), np.int64)
    finals = [np.zeros((dirs, batch, hidden), np.int64) for _ in states]
    xc = x.astype(np.int64) - attrs["x_zero_point"]
    rows = np.arange(batch)
    for d in range(dirs):
        layer = _Layer(attrs, d, w, r, bx, bh, tables)
        reverse = attrs["direction"] == "reverse" or d == 1
        tx = layer.input_terms(xc)
        state = [_initial(attrs, "h0_rescale", states[0], d, batch, layer.bounds)]
        if op == "LSTM":
            state.append(_initial(attrs, "c0_rescale", states[1], d, batch, INT16))
        for step in range(seq):
            active = step < lengths
            t = np.where(active, lengths - 1 - step if reverse else step, 0)
            new = _STEPS[op](layer, tx[t, rows], state)
            for s, n in zip(state, new):
                s[active] = n[active]
            y[t[active], d, rows[active]] = state[0][active]
        for final, s in zip(finals, state):
            final[d] = s
    outputs = [y + zp, finals[0] + zp] + [f.astype(np.int16) for f in finals[1:]]
    outputs[:2] = [o.astype(attrs["dtype"]) for o in outputs[:2]]
    if layout:
        return (outputs[0].transpose(2, 0, 1, 3), *(o.transpose(1, 0, 2) for o in outputs[1:]))
    return tuple(outputs)


@register("QLSTM", _quantized_type("LSTM"), batch=None, quantizes=("LSTM",))
def q_lstm(attrs, x, w, r, bx, bh, tables, lengths=None, initial_h=None, initial_c=None):
    return _run("LSTM", attrs, x, w, r, bx, bh, tables, lengths, [initial_h, initial_c])


@register("QGRU", _quantized_type("GRU"), batch=None, quantizes=("GRU",))
def q_gru(attrs, x, w, r, bx, bh, tables, lengths=None, initial_h=None):
    return _run("GRU", attrs, x, w, r, bx, bh, tables, lengths, [initial_h])


@register("QRNN", _quantized_type("RNN"), batch=None, quantizes=("RNN",))
def q_rnn(attrs, x, w, r, bx, bh, tables, lengths=None, initial_h=None):
    return _run("RNN", attrs, x, w, r, bx, bh, tables, lengths, [initial_h])
