"""What each layer's quantization costs at the model's outputs, measured one layer at a time.

The float graph runs with one node replaced by its quantized twin: the node's float inputs are
quantized with the twin's input parameters, the twin's integer kernel runs on them with its
quantized constants, and its outputs are dequantized back. Everything else stays float, so the
difference at the outputs is that layer's own contribution, carried through the real network
downstream of it (a noisy channel that the next layer scales up counts as much as it matters,
and a noisy layer whose error a later Sigmoid or Softmax flattens counts little). Noises of
different layers are nearly independent, so they add: the sum over the layers kept in the low
type predicts the output noise of a mixed-precision model. Each layer's run recomputes only the
nodes its outputs reach; the rest return the reference pass's results. The layers' runs are
independent, so `THREADS` threads run them side by side (numpy, BLAS and the compiled kernels
release the GIL): each layer's noise is computed as a lone thread would, bit for bit.
"""

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..interpreter import Interpreter
from ..ir import Graph, Node
from ..ops import OPS
from .evaluate import Batch
from .model_io import is_quantized
from .params import HEADROOM, dequantize, quantize

CHUNK = 8
CACHE_BYTES = 256 << 20  # reference results kept per chunk of samples (one sample at least)
THREADS = min(2, os.cpu_count() or 1)  # layer runs at once (each holds its own live arrays)


def _same_sizes(float_node: Node, twin: Node) -> bool:
    """Whether `twin` computes `float_node`'s outputs, maybe in another shape of the same
    values (a MatMul [1, T, K] @ [K, N] quantized as a QGemm on its [T, K] rows)."""
    return [v.size for v in twin.outputs] == [v.size for v in float_node.outputs]


def _as(array: np.ndarray, value) -> np.ndarray:
    """`array` in `value`'s shape, its first axis taking the samples of a batched run."""
    shape = tuple(value.shape)
    return array if array.shape == shape else array.reshape(-1, *shape[1:])


def _twin_kernel(float_node: Node, twin: Node):
    """A kernel for `float_node` that runs `twin` (its quantized form) on quantized inputs,
    reshaped to the twin's shapes and its results back to the float node's."""
    kernel = OPS[twin.op].kernel

    def run(attrs, *args):
        # the batch plan rewrites shape-like attributes for batched runs: carry those over
        changed = {k: v for k, v in attrs.items() if float_node.attrs.get(k) is not v}
        feeds = iter(a for a, v in zip(args, float_node.inputs) if v is not None and not v.is_const)
        inputs = []
        for value in twin.inputs:
            if value is None:
                inputs.append(None)
            elif value.is_const:
                inputs.append(value.numpy())
            else:
                array = _as(next(feeds), value)
                quantized = is_quantized(value)
                inputs.append(quantize(array, value.quant, value.dtype) if quantized else array)
        twin_attrs = {**twin.attrs, **{k: v for k, v in changed.items() if k in twin.attrs}}
        results = kernel(twin_attrs, *inputs)
        return tuple(
            _as(dequantize(r, v.quant) if is_quantized(v) else r, f).astype(f.dtype, copy=False)
            for r, v, f in zip(results, twin.outputs, float_node.outputs)
        )

    return run


def _leave_one_out(per_sample: np.ndarray, largest: bool) -> np.ndarray:
    """Per sample, the extreme of the other samples' extremes (its own when it is alone)."""
    if len(per_sample) < 2:
        return per_sample
    order = np.argsort(-per_sample if largest else per_sample, kind="stable")
    best, second = per_sample[order[0]], per_sample[order[1]]
    out = np.full(per_sample.shape, best)
    out[order[0]] = second
    return out


class _Bounds:
    """Each node output's range per sample as the other samples would have calibrated it."""

    def __init__(self):
        self.lo: dict[str, list[np.ndarray]] = {}
        self.hi: dict[str, list[np.ndarray]] = {}

    def observe(self, value, array: np.ndarray) -> None:
        flat = np.asarray(array, np.float64).reshape(len(array), -1)
        if flat.shape[1]:
            self.lo.setdefault(value.name, []).append(flat.min(axis=1))
            self.hi.setdefault(value.name, []).append(flat.max(axis=1))

    def clip(self, name: str, array: np.ndarray, samples: slice, room: float) -> np.ndarray:
        """`array` within the other samples' range times `room` (the type's headroom)."""
        if name not in self.hi:
            return array
        lo = room * _leave_one_out(np.concatenate(self.lo[name]), largest=False)[samples]
        hi = room * _leave_one_out(np.concatenate(self.hi[name]), largest=True)[samples]
        shape = (len(lo),) + (1,) * (array.ndim - 1)
        lo, hi = np.minimum(lo, 0).reshape(shape), np.maximum(hi, 0).reshape(shape)
        return np.clip(array, lo, hi).astype(array.dtype, copy=False)


def downstream(graph: Graph, *indices: int) -> set[int]:
    """The positions of the nodes that read, directly or not, the outputs of the nodes at
    `indices`."""
    position = {id(node): i for i, node in enumerate(graph.nodes)}  # cheap next to a run
    found: set[int] = set()
    frontier = [graph.nodes[index] for index in indices]
    while frontier:
        for value in frontier.pop().outputs:
            for reader in value.users:
                if position[id(reader)] not in found:
                    found.add(position[id(reader)])
                    frontier.append(reader)
    return found


def isolated_output_noise(
    float_graph: Graph, quantized: Graph | Mapping[str, Node], batch: Batch, names: Sequence[str]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(signal power per output, {node name: noise power per output}) on the samples of
    `batch`, each named node of `float_graph` quantized alone as it is in `quantized` (a node
    without a quantized twin of the same name and output sizes adds no noise). The node's
    outputs are also clipped, on each sample, to the range the other samples reach (times
    the headroom of the twin's output type): what calibration that had not seen the sample
    would have allowed, so a layer whose range unseen data overshoots (the logits, a
    squeeze-excitation gate) shows what that costs.
    `quantized` may be the twins by name instead (taken from several quantizations)."""
    twins = quantized if isinstance(quantized, Mapping) else {n.name: n for n in quantized.nodes}
    signal = {v.name: 0.0 for v in float_graph.outputs}
    noise = {name: dict.fromkeys(signal, 0.0) for name in names}
    measured = {
        index: _twin_kernel(node, twins[node.name])
        for index, node in enumerate(float_graph.nodes)
        if node.name in noise and node.name in twins and _same_sizes(node, twins[node.name])
    }
    room = {  # calibration widens a twin's int16 outputs by a headroom (`params.HEADROOM`)
        index: [HEADROOM.get(np.dtype(v.dtype).name, 1.0) for v in twins[node.name].outputs]
        for index, node in enumerate(float_graph.nodes)
        if index in measured
    }
    # running.at, per thread: the node running its twin; -1: a reference pass that fills the
    # cache. The nodes the twin's outputs do not reach return their cached reference results.
    state: dict = {"samples": slice(None), "observe": False}
    running = threading.local()
    cache: dict[int, tuple] = {}
    bounds = _Bounds()
    reached = {index: downstream(float_graph, index) for index in measured}

    def wrap(index: int, node: Node):
        exact, noisy = OPS[node.op].kernel, measured.get(index)

        def run(attrs, *args):
            at = running.at
            if at < 0:
                cache[index] = exact(attrs, *args)
                return cache[index]
            if index != at:
                return exact(attrs, *args) if index in reached[at] else cache[index]
            rooms = room[index]
            return tuple(
                bounds.clip(v.name, r, state["samples"], h)
                for r, v, h in zip(noisy(attrs, *args), node.outputs, rooms)
            )

        return run

    outputs = {v.name for i in measured for v in float_graph.nodes[i].outputs}

    def record(value, array) -> None:
        if state["observe"] and value.name in outputs:  # one sample per call when unbatched
            bounds.observe(value, array if run.batchable else array[None])

    kernels = {n.name: wrap(i, n) for i, n in enumerate(float_graph.nodes)}
    run = Interpreter(float_graph, observer=record, kernels=kernels)
    count = len(next(iter(batch.values())))
    per_sample = sum(v.size * v.dtype.itemsize for n in float_graph.nodes for v in n.outputs)
    chunk = max(1, min(CHUNK, CACHE_BYTES // max(per_sample, 1))) if run.batchable else 1
    parts = [slice(start, min(start + chunk, count)) for start in range(0, count, chunk)]
    if len(parts) > 1:  # every sample's range first: the clipping bounds need them all
        observing = Interpreter(float_graph, observer=record)
        state["observe"] = True
        for part in parts:
            observing.run_batch({name: array[part] for name, array in batch.items()}, chunk)

    def layer_noise(index: int, feeds: dict, reference: dict) -> dict[str, float]:
        running.at = index
        got = run.run_batch(feeds, chunk)
        return {o: float(np.square(want - got[o]).sum()) for o, want in reference.items()}

    with ThreadPoolExecutor(THREADS) as pool:
        for part in parts:
            feeds = {name: array[part] for name, array in batch.items()}
            # one part: its reference pass records the ranges
            running.at = -1
            state.update(samples=part, observe=len(parts) == 1)
            reference = {k: v.astype(np.float64) for k, v in run.run_batch(feeds, chunk).items()}
            state["observe"] = False
            for name, array in reference.items():
                signal[name] += float(np.vdot(array, array))
            layers = list(measured)
            noises = pool.map(layer_noise, layers, [feeds] * len(layers), [reference] * len(layers))
            for index, added in zip(layers, noises):
                for output, value in added.items():
                    noise[float_graph.nodes[index].name][output] += value
            cache.clear()
    return signal, noise
