"""Empirical bias correction: each integer layer's bias absorbs the mean error of its inputs.

Plain bias correction (`bias_correction.py`) removes the mean output shift that rounding a
layer's weights causes on float inputs: bias - (W_q - W) E[x]. In the quantized model the layer
reads x^, the output of the quantized layers before it, whose channel means differ from the
float ones (table roundings, clipped ranges, channels crushed to a few codes): the output mean
is W_q E[x^] + b where the float model gives W E[x] + b. Here the bias becomes
b + W E[x] - W_q E[x^], with E[x^] measured on real samples in the quantized model itself.

The correction is sequential: one batched pass of the quantized model over the samples, each
layer's bias corrected from the input means it sees, after the layers before it were corrected
in the same pass. (Correcting every layer from one uncorrected pass counts each upstream shift
twice, once where it arises and again downstream: on the OCR detector 17.3 -> 6.4 dB.) Layers
whose quantized input is per channel or per tensor both work; graphs the interpreter cannot run
batched are left as they are (a per-sample pass could not correct a layer before its first
sample goes through).
"""

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from ..interpreter import Interpreter
from ..ir import Graph, Node
from ..ops import OPS, weight_axes
from .bias_correction import corrected_bias
from .channel_activations import folds_scales
from .params import BIAS_ROOM, dequantize
from .probes import node_keys

log = logging.getLogger(__name__)
LAYERS = ("QConv", "QGemm")
SAMPLES = 16  # taken at once: one batched pass (memory grows with them)
CACHE_BYTES = 256 << 20  # node results kept for later corrections


def _channel_means(real: np.ndarray, layer: Node) -> np.ndarray:
    """Per input channel means of `layer`'s input batch `real` (its `weight_axes` data axis)."""
    channel = weight_axes(layer).data % real.ndim
    return real.mean(axis=tuple(i for i in range(real.ndim) if i != channel))


def _input_means(node: Node, x: np.ndarray, layer: Node) -> np.ndarray:
    """`_channel_means` of the dequantized codes `x` that quantized `node` reads."""
    return _channel_means(dequantize(x, node.inputs[0].quant).astype(np.float64), layer)


def _float_means(float_graph: Graph, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per layer name, its float input's channel means on `batch` (the same samples as the
    quantized model's: a difference of data would pass for a quantization error)."""
    layers = {}
    for node in float_graph.nodes:
        if OPS[node.op].quant == "matmul" and weight_axes(node) is not None:
            layers.setdefault(node.inputs[0].name, []).append(node)
    means: dict[str, np.ndarray] = {}

    def observe(value, array) -> None:
        for layer in layers.get(value.name, ()):
            means[layer.name] = _channel_means(np.asarray(array, np.float64), layer)

    count = len(next(iter(batch.values())))
    Interpreter(float_graph, observer=observe).run_batch(dict(batch), chunk=count)
    return means


def correct_biases(
    float_graph: Graph, quantized: Graph, batches: Sequence[Mapping[str, np.ndarray]]
) -> int:
    """Correct the int biases of `quantized`'s QConv/QGemm layers in place (module docstring)
    on the first SAMPLES samples of `batches` ([N, *input shape] per input), against
    `float_graph` on the same samples. Returns the number of layers changed."""
    return BiasCorrector(float_graph, batches)(quantized)


class BiasCorrector:
    """`correct_biases` for many quantizations of one float graph (mixed precision's probes):
    the samples and the float means are taken once, and each node's results in the corrected
    pass (with its corrected bias) are kept under its content key in the uncorrected graph
    (`probes.node_keys`), up to `cache_bytes`: the uncorrected subgraph computing a node
    decides both, so a candidate that changed a few layers reruns only the nodes downstream
    of them. One correction needs no cache (`cache_bytes = 0`, the default)."""

    def __init__(
        self,
        float_graph: Graph,
        batches: Sequence[Mapping[str, np.ndarray]],
        cache_bytes: int = 0,
    ):
        self.float_graph, self.cache_bytes = float_graph, cache_bytes
        self.floats = {node.name: node for node in float_graph.nodes}
        self.batch = {k: np.concatenate([b[k] for b in batches])[:SAMPLES] for k in batches[0]}
        self.means: dict[str, np.ndarray] | None = None  # on first use
        self.stored: dict[tuple, tuple] = {}  # key -> (results, corrected bias or None, pass)
        self.passes = 0
        self.outputs: dict[str, np.ndarray] | None = None
        self.bytes = 0
        self.computed = self.reused = 0  # node runs

    def __call__(self, quantized: Graph) -> int:
        """Correct `quantized` in place; returns the number of layers changed. `outputs` then
        holds the corrected model's outputs on `batch` (None if it was left as it is)."""
        self.outputs = None
        name = quantized.name
        if any(v.quant is not None for v in quantized.inputs):  # takes codes, batch is float
            log.info("empirical bias correction: '%s' takes quantized inputs; skipped", name)
            return 0
        if not Interpreter(quantized).batchable:
            log.info("empirical bias correction: '%s' does not run batched; skipped", name)
            return 0
        if self.means is None:
            self.means = _float_means(self.float_graph, self.batch)
        corrected: dict[str, np.ndarray] = {}
        self.passes += 1
        keys = node_keys(quantized)
        # the name too: a layer's float input means are found by its name
        kernels = {
            n.name: self._kernel(n, (n.name, keys[n.name]), corrected) for n in quantized.nodes
        }
        count = len(next(iter(self.batch.values())))
        run = Interpreter(quantized, kernels=kernels)
        self.outputs = run.run_batch(dict(self.batch), chunk=count)
        for node in quantized.nodes:
            if node.name in corrected:
                old = node.inputs[2]
                value = quantized.add_constant(corrected[node.name], old.name + "_ebc")
                value.quant = old.quant
                node.set_input(2, value)
                if not old.uses and old not in quantized.outputs:
                    quantized.remove_constant(old)
        return len(corrected)

    def _kernel(self, node: Node, key: tuple, corrected: dict):
        """`node`'s kernel in the corrected pass: its stored results (and corrected bias) when
        its key was seen, else computed (its bias corrected first) and stored."""
        run = _corrected_kernel(node, self.floats, self.means)

        def cached(attrs, *args):
            if key in self.stored:
                self.reused += 1
                results, bias, _ = self.stored.pop(key)
                self.stored[key] = (results, bias, self.passes)  # used by this pass: newest
            else:
                self.computed += 1
                results, bias = run(attrs, *args)
                self._remember(key, results, bias)
            if bias is not None:
                corrected[node.name] = bias
            return results

        return cached

    def _remember(self, key: tuple, results: tuple, bias) -> None:
        """Keep `results`, dropping what earlier passes stored and this one has not used
        (oldest first); once only this pass's remain, keep those: later candidates share a
        pass's beginning (upstream of what they change), which dropping the oldest of one
        pass larger than the cache would lose."""
        results = tuple(np.asarray(r) for r in results)
        size = sum(r.nbytes for r in results)
        while self.bytes + size > self.cache_bytes:
            oldest = next(iter(self.stored), None)
            if oldest is None or self.stored[oldest][2] == self.passes:
                return
            dropped = self.stored.pop(oldest)[0]
            self.bytes -= sum(r.nbytes for r in dropped)
        for array in results:
            array.flags.writeable = False  # shared by later passes: a write fails loudly
        self.stored[key] = (results, bias, self.passes)
        self.bytes += size


def _corrected_kernel(node: Node, floats: Mapping[str, Node], means: Mapping[str, np.ndarray]):
    """A kernel returning (`node`'s results, its corrected int bias or None): a QConv/QGemm
    whose float twin's input means are known has its bias corrected from the means of the
    quantized input it reads (module docstring)."""
    kernel = OPS[node.op].kernel
    layer = floats.get(node.name) if node.op in LAYERS else None
    mean = means.get(node.name) if layer is not None else None
    if mean is None or node.inputs[2] is None:
        return lambda attrs, *args: (kernel(attrs, *args), None)

    def run(attrs, x, codes, bias):
        shift = mean - _input_means(node, x, layer)
        if shift.shape != mean.shape:
            return kernel(attrs, x, codes, bias), None
        if folds_scales(node):  # W_q holds the input scales: the shift in input steps
            shift = shift / np.asarray(node.inputs[0].quant.scale, np.float64)
        axis = weight_axes(layer).out
        scale = node.inputs[1].quant.scale
        # W_q (E[x] - E[x^]) in real units: corrected_bias's shift of weights 0 -> W_q
        delta = -corrected_bias(layer, 0 * codes, codes, scale, 0.0, shift, axis)
        steps = np.asarray(node.inputs[2].quant.scale, np.float64)
        top = float(min(np.iinfo(bias.dtype).max, BIAS_ROOM))  # the quantizer's bound
        total = bias.astype(np.float64) + np.rint(delta / steps)
        new = np.clip(total, -top, top).astype(bias.dtype)
        return kernel(attrs, x, codes, new), new

    return run
