"""What per-channel activation scales would buy: a float simulation of uint8 (or int16)
quantization.

Every float value of the O1 graph is rounded to uint8 codes of its calibrated (MinMax) range
and weights to per-channel int8, in float (fake quantization; no integer kernels); with
`--dtype int16`, to symmetric int16 codes of the range with onebuild's int16 headroom and
weights to per-channel int16. Then the
same with per-channel activation ranges on the inputs of depthwise convolutions and on the
table inputs feeding them (pointwise conv -> HardSwish -> depthwise), where BatchNorm-folded
channels whose ranges differ by orders of magnitude share one scale. Prints the SQNR (dB) of
each output and of all together, against the float model on the bench's evaluation samples.

    python bench/quant_oracle.py layout_cdla [--dtype int16] [--samples N]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
from real_models import MODELS, fixed_export, samples

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.params import HEADROOM, dequantize, quantize, weight_params
from onebuild.graph_ir.serde import load_onnx


def fake_quantize(array: np.ndarray, lo, hi, dtype: str = "uint8") -> np.ndarray:
    """uint8 asymmetric (or int16 symmetric, with headroom) rounding of `array` over [lo, hi]
    (scalars or per-channel arrays)."""
    if dtype == "int16":
        bound = HEADROOM["int16"] * np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(bound > 0, bound / 32767, 1.0)
        return (np.clip(np.round(array / scale), -32767, 32767) * scale).astype(np.float32)
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = np.where(hi > lo, (hi - lo) / 255, 1.0)
    zero = np.clip(np.round(-lo / scale), 0, 255)
    return ((np.clip(np.round(array / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)


def depthwise_inputs(graph) -> set[str]:
    """The inputs of depthwise convs and, through a lookup table, the table's input."""
    names = set()
    for node in graph.nodes:
        if node.op == "Conv" and node.attrs["group"] > 1:
            names.add(node.inputs[0].name)
            producer = node.inputs[0].producer
            if producer is not None and OPS[producer.op].quant == "lookup":
                names.add(producer.inputs[0].name)
    return names


def channel_ranges(graph, x: str, calib, names: set[str]) -> dict:
    found = {}

    def observe(value, array):
        if value.name in names:
            rows = array.reshape(array.shape[0], array.shape[1], -1)
            lo, hi = rows.min(axis=(0, 2)), rows.max(axis=(0, 2))
            if value.name in found:
                lo, hi = np.minimum(lo, found[value.name][0]), np.maximum(hi, found[value.name][1])
            found[value.name] = (lo, hi)

    interpreter = Interpreter(graph, observe)
    for sample in calib:
        interpreter.run({x: sample})
    return found


def quantize_weights(graph, dtype: str = "int8") -> None:
    for node in graph.nodes:
        if node.op in ("Conv", "Gemm") and node.inputs[1].is_const:
            weight = node.inputs[1].numpy()
            axis = 0 if node.op == "Conv" or node.attrs.get("transB") else 1
            params = weight_params(weight.astype(np.float64), dtype, axis)
            rounded = dequantize(quantize(weight, params, dtype), params)
            node.set_input(1, graph.add_constant(rounded, node.inputs[1].name + "_fq"))


def simulate(graph, x: str, evaluation, ranges, channels, dtype: str = "uint8") -> list[dict]:
    """Outputs with every float value fake-quantized (per channel where `channels` says)."""

    def kernel(node):
        def run(attrs, *inputs):
            results = []
            for value, array in zip(node.outputs, OPS[node.op].kernel(attrs, *inputs)):
                if value.name in channels:
                    lo, hi = channels[value.name]
                    shape = (1, -1) + (1,) * (array.ndim - 2)
                    array = fake_quantize(array, lo.reshape(shape), hi.reshape(shape), dtype)
                elif value.name in ranges and array.dtype == np.float32:
                    array = fake_quantize(array, *ranges[value.name], dtype)
                results.append(array)
            return tuple(results)

        return run

    interpreter = Interpreter(graph, None, {n.name: kernel(n) for n in graph.nodes})
    return [interpreter.run({x: fake_quantize(s, *ranges[x], dtype)}) for s in evaluation]


def report(want, got, outputs) -> dict[str, float]:
    result = {}
    for name in [*outputs, None]:
        names = outputs if name is None else [name]
        ref = np.concatenate([w[n].ravel() for w in want for n in names]).astype(np.float64)
        out = np.concatenate([g[n].ravel() for g in got for n in names]).astype(np.float64)
        result[name or "all"] = round(sqnr_db(ref @ ref, (ref - out) @ (ref - out)), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=[m.name for m in MODELS])
    parser.add_argument("--dtype", choices=["uint8", "int16"], default="uint8")
    parser.add_argument("--samples", type=int, default=16, help="evaluation samples (at most)")
    args = parser.parse_args()
    spec = next(m for m in MODELS if m.name == args.model)
    calib, evaluation = samples(spec, 16)
    evaluation = evaluation[: args.samples]
    with tempfile.TemporaryDirectory() as folder:
        model = load_onnx(fixed_export(spec, Path(folder)), None)
    run_preset(model)
    graph = model.main
    x, outputs = graph.inputs[0].name, [v.name for v in graph.outputs]
    reference = Interpreter(graph)
    want = [reference.run({x: s}) for s in evaluation]
    ranges = calibrate(graph, {x: calib}).ranges
    channels = channel_ranges(graph, x, calib, depthwise_inputs(graph))
    dtype = args.dtype
    quantize_weights(graph, "int16" if dtype == "int16" else "int8")
    per_tensor = report(want, simulate(graph, x, evaluation, ranges, {}, dtype), outputs)
    per_channel = report(want, simulate(graph, x, evaluation, ranges, channels, dtype), outputs)
    print(f"{spec.name} {dtype} per-tensor activations: {per_tensor}")
    print(f"{spec.name} {dtype} per-channel at {len(channels)} depthwise inputs: {per_channel}")


if __name__ == "__main__":
    main()
