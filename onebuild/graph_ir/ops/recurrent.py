"""LSTM, GRU and RNN with ONNX semantics: forward, reverse and bidirectional, initial states,
per-sample sequence lengths (steps past a sample's length output zeros and leave its state),
peepholes, input-forget coupling, `linear_before_reset`, cell clipping, any activation, both
layouts. Accumulation in float64, rounded once per output. Their integer form (quantization
rule "recurrent") is `quantized_recurrent.py`.

Attributes are canonical: `activations` is one (name, alpha, beta) triple per gate function and
direction (lowercase names), `cell_clip` (ONNX `clip`) None when absent.
"""

from collections.abc import Callable

import numpy as np

from ...errors import InputValueError
from .registry import Attrs, Kernel, TensorType, register


def activation(name: str, alpha: float | None, beta: float | None):
    """The float function of an ONNX recurrent activation (canonical lowercase name)."""
    functions = {
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0.0),
        "hardsigmoid": lambda x: np.clip(
            (0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta), 0.0, 1.0
        ),
        "leakyrelu": lambda x: np.where(x >= 0, x, (0.01 if alpha is None else alpha) * x),
        "thresholdedrelu": lambda x: np.where(x > (1.0 if alpha is None else alpha), x, 0.0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "affine": lambda x: alpha * x + beta,
        "elu": lambda x: np.where(x >= 0, x, (1.0 if alpha is None else alpha) * np.expm1(x)),
        "softsign": lambda x: x / (1.0 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0.0, x),
    }
    if name not in functions:
        raise ValueError(f"unknown activation '{name}'")
    return functions[name]


ACTIVATIONS = ("sigmoid", "tanh", "relu", "hardsigmoid", "leakyrelu", "thresholdedrelu",
               "scaledtanh", "affine", "elu", "softsign", "softplus")  # fmt: skip
GATE_FUNCTIONS = {"LSTM": 3, "GRU": 2, "RNN": 1}  # activations per direction
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}  # blocks of hidden_size rows in W and R


def directions(attrs: Attrs) -> int:
    return 2 if attrs["direction"] == "bidirectional" else 1


def recurrent_type(op: str):
    def infer(attrs: Attrs, types) -> list[TensorType]:
        x = types[0]
        seq, batch = x.shape[:2] if not attrs["layout"] else x.shape[1::-1]
        hidden, dirs = attrs["hidden_size"], directions(attrs)
        y = (seq, dirs, batch, hidden) if not attrs["layout"] else (batch, seq, dirs, hidden)
        state = (dirs, batch, hidden) if not attrs["layout"] else (batch, dirs, hidden)
        count = 3 if op == "LSTM" else 2
        return [TensorType(x.dtype, y)] + [TensorType(x.dtype, state)] * (count - 1)

    return infer


def time_major(attrs: Attrs, x: np.ndarray, states, lengths):
    """x [seq, batch, in] and states [dirs, batch, hidden] whatever the `layout`, and every
    sample's length checked (the full sequence when none are given)."""
    if attrs["layout"]:
        x = x.transpose(1, 0, 2)
        states = [None if s is None else s.transpose(1, 0, 2) for s in states]
    seq, batch = x.shape[:2]
    lengths = np.full(batch, seq) if lengths is None else lengths.astype(np.int64)
    if np.any((lengths < 0) | (lengths > seq)):
        raise InputValueError(f"sequence_lens {lengths.tolist()} outside [0, {seq}]")
    return x, states, lengths


def _run(op: str, attrs: Attrs, x, w, r, b, lengths, states, peepholes=None, report=None):
    """Every direction over every step; returns Y and the final states. `report`, if given,
    gets the LSTM's cell states once per run, laid out as Y (zeros past a sample's length)."""
    hidden, dirs = attrs["hidden_size"], directions(attrs)
    dtype, x = x.dtype, x.astype(np.float64)
    x, states, lengths = time_major(attrs, x, states, lengths)
    seq, batch = x.shape[:2]
    per = GATE_FUNCTIONS[op]
    y = np.zeros((seq, dirs, batch, hidden))
    cells = np.zeros_like(y) if report is not None else None
    finals = [np.zeros((dirs, batch, hidden)) for _ in states]
    for d in range(dirs):
        reverse = attrs["direction"] == "reverse" or d == 1
        functions = [activation(*a) for a in attrs["activations"][d * per : (d + 1) * per]]
        bias = np.zeros(2 * GATES[op] * hidden) if b is None else b[d].astype(np.float64)
        wx, rh = bias[: GATES[op] * hidden], bias[GATES[op] * hidden :]
        state = [
            np.zeros((batch, hidden)) if s is None else s[d].astype(np.float64) for s in states
        ]
        peep = None if peepholes is None else peepholes[d].astype(np.float64)
        rows = np.arange(batch)
        for step in range(seq):
            active = step < lengths
            t = np.where(active, lengths - 1 - step if reverse else step, 0)
            xw = x[t, rows] @ w[d].astype(np.float64).T + wx
            new = _CELLS[op](attrs, xw, state, r[d].astype(np.float64), rh, functions, peep)
            for s, n in zip(state, new):
                s[active] = n[active]
            y[t[active], d, rows[active]] = state[0][active]
            if cells is not None:
                cells[t[active], d, rows[active]] = state[1][active]
        for final, s in zip(finals, state):
            final[d] = s
    if report is not None:
        report((cells.transpose(2, 0, 1, 3) if attrs["layout"] else cells).astype(dtype))
    if attrs["layout"]:
        return (y.transpose(2, 0, 1, 3).astype(dtype),
                *(f.transpose(1, 0, 2).astype(dtype) for f in finals))  # fmt: skip
    return (y.astype(dtype), *(f.astype(dtype) for f in finals))


def _clip(attrs: Attrs, values: np.ndarray) -> np.ndarray:
    return (
        values
        if attrs["cell_clip"] is None
        else np.clip(values, -attrs["cell_clip"], attrs["cell_clip"])
    )


def _lstm_cell(attrs, xw, state, r, rh, functions, peep):
    f, g, h = functions
    hidden_prev, cell_prev = state
    gates = xw + hidden_prev @ r.T + rh
    i, o, forget, c = np.split(gates, 4, axis=1)
    if peep is not None:
        pi, po, pf = np.split(peep, 3)
        i, forget = i + pi * cell_prev, forget + pf * cell_prev
    i = f(_clip(attrs, i))
    forget = 1.0 - i if attrs["input_forget"] else f(_clip(attrs, forget))
    cell = forget * cell_prev + i * g(_clip(attrs, c))
    if peep is not None:
        o = o + po * cell
    return [f(_clip(attrs, o)) * h(cell), cell]


def _gru_cell(attrs, xw, state, r, rh, functions, peep):
    f, g = functions
    (hidden_prev,) = state
    xz, xr, xh = np.split(xw, 3, axis=1)
    rz, rr, rhh = np.split(r, 3, axis=0)
    bz, br, bh = np.split(rh, 3)
    z = f(_clip(attrs, xz + hidden_prev @ rz.T + bz))
    reset = f(_clip(attrs, xr + hidden_prev @ rr.T + br))
    if attrs["linear_before_reset"]:
        candidate = xh + reset * (hidden_prev @ rhh.T + bh)
    else:
        candidate = xh + (reset * hidden_prev) @ rhh.T + bh
    return [(1.0 - z) * g(_clip(attrs, candidate)) + z * hidden_prev]


def _rnn_cell(attrs, xw, state, r, rh, functions, peep):
    (f,) = functions
    return [f(_clip(attrs, xw + state[0] @ r.T + rh))]


_CELLS = {"LSTM": _lstm_cell, "GRU": _gru_cell, "RNN": _rnn_cell}


@register("LSTM", recurrent_type("LSTM"), batch=None, quant="recurrent")
def lstm(attrs, x, w, r, b=None, lengths=None, initial_h=None, initial_c=None, p=None):
    return _run("LSTM", attrs, x, w, r, b, lengths, [initial_h, initial_c], p)


def cell_state_name(node_name: str) -> str:
    """The name under which calibration records an LSTM node's cell states over all steps."""
    return f"{node_name}::cell_state"


def lstm_reporting_cells(report: Callable[[np.ndarray], None]) -> Kernel:
    """The LSTM kernel, also passing its cell states of every step (laid out as Y) to `report`
    once per run: the range calibration needs for the integer cell state, which no output
    holds (Y_c is the last step's only)."""

    def kernel(attrs, x, w, r, b=None, lengths=None, initial_h=None, initial_c=None, p=None):
        return _run("LSTM", attrs, x, w, r, b, lengths, [initial_h, initial_c], p, report)

    return kernel


@register("GRU", recurrent_type("GRU"), batch=None, quant="recurrent")
def gru(attrs, x, w, r, b=None, lengths=None, initial_h=None):
    return _run("GRU", attrs, x, w, r, b, lengths, [initial_h])


@register("RNN", recurrent_type("RNN"), batch=None, quant="recurrent")
def rnn(attrs, x, w, r, b=None, lengths=None, initial_h=None):
    return _run("RNN", attrs, x, w, r, b, lengths, [initial_h])
