"""Compare a candidate graph (quantized) with its float reference on evaluation data.

Reports error metrics per output (see `..metrics`), label accuracy when labels are given, and a
per-layer SQNR table: every node present in both graphs under the same name with the same output
shape is compared (quantized values dequantized), so the layers that lose the most stand out.
Layer errors are propagated errors: each graph runs on its own activations, as deployed.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from ..interpreter import Interpreter
from ..ir import Graph, Value
from ..metrics import OutputMetrics, SignalNoise
from .model_io import dequantize_outputs, is_quantized, quantize_inputs
from .params import dequantize

Batch = dict[str, np.ndarray]
CHUNK = 32


@dataclass
class Comparison:
    samples: int = 0
    outputs: dict[str, dict] = field(default_factory=dict)
    layers: list[dict] = field(default_factory=list)  # worst SQNR first
    accuracy: dict | None = None  # top-1 accuracy of both graphs against labels
    complete: bool = True  # False: stopped early, each sqnr_db an upper bound (`probes`)
    unseen: dict[str, dict] | None = None  # outputs on the samples from `unseen_from` on


def _comparable_nodes(reference: Graph, candidate: Graph) -> dict[str, str]:
    """Node name -> op for nodes whose first output exists in both graphs with one shape."""
    ref = {n.name: n for n in reference.nodes}
    common = {}
    for node in candidate.nodes:
        twin = ref.get(node.name)
        if (
            twin is not None
            and twin.outputs[0].shape == node.outputs[0].shape
            and np.issubdtype(twin.outputs[0].dtype, np.floating)
        ):
            common[node.name] = twin.op
    return common


def _as_float(value: Value, array: np.ndarray) -> np.ndarray:
    return dequantize(array, value.quant) if is_quantized(value) else array


def compare_graphs(
    reference: Graph,
    candidate: Graph,
    batches: Iterable[tuple[str, Batch]],
    labels: np.ndarray | None = None,
    progress: Callable[[int], None] | None = None,
    unseen_from: int | None = None,
) -> Comparison:
    """Compare `candidate` with `reference` on `batches`; with `unseen_from`, the outputs'
    metrics on the samples from that index on are also summarized alone (`unseen`)."""
    common = _comparable_nodes(reference, candidate)
    layers = {name: SignalNoise() for name in common}
    outputs = {v.name: OutputMetrics() for v in reference.outputs}
    unseen = {v.name: OutputMetrics() for v in reference.outputs}
    trace: dict[str, np.ndarray] = {}

    def record(value: Value, array: np.ndarray) -> None:
        node = value.producer
        if node is not None and node.name in common and value is node.outputs[0]:
            trace[node.name] = array

    def compare(value: Value, array: np.ndarray) -> None:
        node = value.producer
        if node is not None and node.name in trace and value is node.outputs[0]:
            layers[node.name].update(trace.pop(node.name), _as_float(value, array))

    float_run = Interpreter(reference, observer=record)
    test_run = Interpreter(candidate, observer=compare)
    # both graphs must see the same slices, so chunks only when both run batches in one pass
    chunk = CHUNK if float_run.batchable and test_run.batchable else 1
    first = reference.outputs[0].name
    hits = {"reference": 0, "candidate": 0}
    result = Comparison()
    for _, batch in batches:
        count = len(next(iter(batch.values())))
        for start in range(0, count, chunk):
            part = {v.name: batch[v.name][start : start + chunk] for v in reference.inputs}
            want = float_run.run_batch(part, chunk)
            got = test_run.run_batch(quantize_inputs(candidate, part), chunk)
            got = dequantize_outputs(candidate, got)
            trace.clear()
            for index in range(len(want[first])):
                for name, metrics in outputs.items():
                    metrics.update(want[name][index], got[name][index])
                    if unseen_from is not None and result.samples >= unseen_from:
                        unseen[name].update(want[name][index], got[name][index])
                if labels is not None:
                    label = int(labels[result.samples])
                    hits["reference"] += int(np.argmax(want[first][index]) == label)
                    hits["candidate"] += int(np.argmax(got[first][index]) == label)
                result.samples += 1
            if progress:
                progress(result.samples)
    result.outputs = {name: m.summary() for name, m in outputs.items()}
    if unseen_from is not None and result.samples > unseen_from:
        result.unseen = {name: m.summary() for name, m in unseen.items()}
    ranked = sorted(layers.items(), key=lambda item: item[1].db)
    result.layers = [
        {"node": n, "op": common[n], "sqnr_db": s.db, "channel_noise_ratio": s.channel_noise_ratio}
        for n, s in ranked
    ]
    if labels is not None:
        n = max(result.samples, 1)
        result.accuracy = {
            "output": first,
            "reference": hits["reference"] / n,
            "candidate": hits["candidate"] / n,
        }
    return result
