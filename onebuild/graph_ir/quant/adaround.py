"""Learned weight rounding (AdaRound, Nagel et al. 2020): per layer, each weight rounds up or
down so that the layer's output on real inputs moves least, rather than to the nearest code.

For a layer with weights W (one row per output channel, over its K inputs) and scales s, the
rounded weights are s * (floor(W / s) + h) with h in {0, 1}. The output error on inputs x is
(W_q - W) x, so its mean square over the calibration inputs is sum_o d_o H d_o^T with
d = W_q - W and H = E[x x^T] (K x K, per group of a grouped convolution), accumulated once from
im2col patches. h is relaxed to a rectified sigmoid of a free variable V (zeta 1.1, gamma -0.1),
optimized with Adam on that error (relative to nearest rounding's) plus a regularizer
lambda * mean(1 - |2h - 1|^beta), beta annealed from 20 to 2 after a warm start, so every h ends
at 0 or 1; the result is rounded, and kept only if it beats nearest rounding. Everything is
numpy; the work per iteration is Cout * K^2, so layers with K above MAX_INPUTS keep nearest
rounding (bounded time), as do layers with fewer than MIN_ROWS_PER_INPUT input rows seen per
input (H would be poorly known).
"""

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..interpreter import Interpreter
from ..ir import Graph, Node, Value
from ..ops import OPS, weight_axes
from ..tensor import QuantParams
from .params import QRANGE, quantize

MAX_INPUTS = 1024
MAX_ROWS = 4096  # patches taken per observed batch (evenly spaced)
ITERATIONS = 400
ZETA, GAMMA = 1.1, -0.1
REGULARIZATION = 30.0  # on the mean over weights, against nearest rounding's error (= 1)
MIN_ROWS_PER_INPUT = 4  # input rows seen per input of the layer, else H is too poorly known
LEARNING_RATE = 0.01


def _patches(node: Node, x: np.ndarray) -> np.ndarray:
    """The layer's input rows, [groups, rows, K] (im2col for a Conv)."""
    if node.op != "Conv":
        return x.reshape(1, -1, x.shape[-1])
    spatial = x.ndim - 2
    pads = node.attrs["pads"]
    padding = [(0, 0), (0, 0), *zip(pads[:spatial], pads[spatial:])]
    x = np.pad(x, padding)
    weight = node.inputs[1].shape
    dilations, strides = node.attrs["dilations"], node.attrs["strides"]
    extent = [(k - 1) * d + 1 for k, d in zip(weight[2:], dilations)]
    windows = sliding_window_view(x, extent, axis=tuple(range(2, x.ndim)))
    index = (slice(None), slice(None), *(slice(None, None, s) for s in strides))
    index += tuple(slice(None, None, d) for d in dilations)
    windows = windows[index]  # [n, C, out..., k...]
    groups = node.attrs["group"]
    n, channels = windows.shape[:2]
    out = windows.shape[2 : 2 + spatial]
    windows = windows.reshape(n, groups, channels // groups, *out, -1)
    windows = np.moveaxis(windows, 2, -2)  # [n, G, out..., C/G, k]
    return np.moveaxis(windows, 1, 0).reshape(groups, -1, weight[1] * int(np.prod(weight[2:])))


def eligible(node: Node) -> bool:
    if OPS[node.op].quant != "matmul" or not node.inputs[1].is_const:
        return False
    if node.attrs.get("transA") or (node.op == "MatMul" and len(node.inputs[1].shape) != 2):
        return False
    weight = node.inputs[1].shape
    if node.op == "Conv":
        return int(np.prod(weight[1:])) <= MAX_INPUTS
    return weight[weight_axes(node).into] <= MAX_INPUTS


class InputMoments:
    """H = E[x xᵀ] of every eligible layer's inputs, accumulated over batches of samples."""

    def __init__(self, graph: Graph):
        self.layers = {}
        for node in graph.nodes:
            if eligible(node):
                self.layers.setdefault(node.inputs[0].name, []).append(node)
        self.sums: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}

    def observe(self, value: Value, array: np.ndarray) -> None:
        for node in self.layers.get(value.name, ()):
            patches = _patches(node, np.asarray(array, np.float64))
            step = max(1, patches.shape[1] // MAX_ROWS)
            patches = patches[:, ::step]
            gram = np.einsum("grk,grl->gkl", patches, patches)
            self.sums[node.name] = self.sums.get(node.name, 0) + gram
            self.rows[node.name] = self.rows.get(node.name, 0) + patches.shape[1]

    def moments(self, name: str) -> np.ndarray | None:
        if (
            name not in self.sums
            or self.rows[name] < MIN_ROWS_PER_INPUT * self.sums[name].shape[-1]
        ):
            return None
        return self.sums[name] / self.rows[name]


def input_moments(graph: Graph, batches: Iterable[Mapping[str, np.ndarray]]) -> InputMoments:
    moments = InputMoments(graph)
    interpreter = Interpreter(graph, observer=moments.observe)
    for batch in batches:
        interpreter.run_batch(dict(batch))
    return moments


def _as_rows(node: Node, weight: np.ndarray, axis: int) -> np.ndarray:
    """Weights (or codes) as [groups, out per group, K] (the layout of the patches)."""
    rows = np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)
    groups = node.attrs.get("group", 1) if node.op == "Conv" else 1
    return rows.reshape(groups, -1, rows.shape[1])


def _error(delta: np.ndarray, moments: np.ndarray) -> float:
    """Mean square output error of weight error `delta` on inputs with moments H."""
    return float(np.einsum("gok,gkl,gol->", delta, moments, delta))


def adaround(
    node: Node, weight: np.ndarray, params: QuantParams, dtype: str, moments: np.ndarray
) -> np.ndarray:
    """The layer's weight codes (`weight`'s layout, `dtype`) with learned rounding; never worse
    than nearest rounding on the moments' inputs."""
    axis = weight_axes(node).out
    nearest = quantize(weight, params, dtype)
    w = _as_rows(node, np.asarray(weight, np.float64), axis)
    channels = weight.shape[axis]
    scales = np.broadcast_to(np.asarray(params.scale, np.float64), (channels,))
    s = scales.reshape(w.shape[0], w.shape[1], 1)
    lo, hi = QRANGE[dtype]
    floor = np.floor(w / s)
    baseline = _error(s * _as_rows(node, nearest.astype(np.float64), axis) - w, moments)
    if baseline <= 0:
        return nearest
    rest = w / s - floor
    v = -np.log((ZETA - GAMMA) / (np.clip(rest, 1e-4, 1 - 1e-4) - GAMMA) - 1)
    first, second = np.zeros_like(v), np.zeros_like(v)
    warm = ITERATIONS // 5  # reconstruction alone first, then the push to 0 or 1
    for step in range(ITERATIONS):
        sigmoid = 1 / (1 + np.exp(-v))
        stretched = sigmoid * (ZETA - GAMMA) + GAMMA
        h = np.clip(stretched, 0, 1)
        grad = 2 * s * np.einsum("gok,gkl->gol", s * (floor + h) - w, moments) / baseline
        if step >= warm:
            beta = 20 + (2 - 20) * (step - warm) / (ITERATIONS - warm - 1)
            centered = 2 * h - 1
            push = np.abs(centered) ** (beta - 1) * np.sign(centered)
            grad = grad - REGULARIZATION * 2 * beta * push / v.size
        grad = grad * ((stretched > 0) & (stretched < 1)) * (ZETA - GAMMA) * sigmoid * (1 - sigmoid)
        first = 0.9 * first + 0.1 * grad
        second = 0.999 * second + 0.001 * grad * grad
        step_size = LEARNING_RATE * np.sqrt(1 - 0.999 ** (step + 1)) / (1 - 0.9 ** (step + 1))
        v -= step_size * first / (np.sqrt(second) + 1e-12)
    up = (1 / (1 + np.exp(-v))) * (ZETA - GAMMA) + GAMMA >= 0.5
    codes = np.clip(floor + up, lo, hi)
    if _error(s * codes - w, moments) >= baseline:
        return nearest
    shape = np.moveaxis(np.empty(weight.shape), axis, 0).shape
    return np.moveaxis(codes.reshape(shape), 0, axis).astype(dtype)


class LearnedRounding:
    """The weight rounder `quantize_graph` calls: AdaRound where the layer's input moments are
    known, nearest otherwise; results cached (mixed precision quantizes many times)."""

    def __init__(self, moments: InputMoments):
        self.moments = moments
        self.cache: dict[tuple, np.ndarray] = {}

    def __call__(self, node: Node, weight: np.ndarray, params: QuantParams, dtype: str):
        gram = self.moments.moments(node.name)
        if gram is None:
            return quantize(weight, params, dtype)
        key = (node.name, dtype, params)
        if key not in self.cache:
            self.cache[key] = adaround(node, weight, params, dtype, gram)
        return self.cache[key]
