"""Learned weight rounding (AdaRound) against nearest rounding, on the trained digits CNN and
real digit images, and the im2col moments it rests on against the Conv kernel itself."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.compile import QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.quant import adaround
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.params import dequantize, weight_params
from onebuild.graph_ir.serde import load_onnx

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}


@pytest.mark.parametrize(
    "group, stride, dilation, pads", [(1, 1, 1, 1), (2, 2, 1, 0), (4, 1, 2, 2), (1, 2, 2, 1)]
)
def test_input_moments_give_the_conv_output_energy(rng, group, stride, dilation, pads):
    """sum_o W_o H W_o^T over the patches equals the mean energy of the Conv's outputs."""
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 4, 9, 7))
    weight = rng.normal(0, 1, (6 if group != 4 else 8, 4 // group, 3, 3)).astype(np.float32)
    attrs = {
        "strides": [stride] * 2,
        "dilations": [dilation] * 2,
        "pads": [pads] * 4,
        "group": group,
    }
    w = graph.add_constant(weight, "w")
    graph.outputs = [graph.make_node("Conv", [x, w], attrs, name="conv").output]
    batch = {"x": rng.normal(0, 1, (5, 1, 4, 9, 7)).astype(np.float32)}
    moments = adaround.input_moments(graph, [batch]).sums["conv"]
    out = Interpreter(graph).run_batch(batch)["conv"].astype(np.float64)
    node = graph.nodes[0]
    w_rows = adaround._as_rows(node, weight.astype(np.float64), 0)
    energy = float(np.einsum("gok,gkl,gol->", w_rows, moments, w_rows))
    assert energy == pytest.approx(float(np.square(out).sum()), rel=1e-6)  # float32 conv


def _digits_layers():
    model = optimize(load_onnx(DIGITS / "digits.onnx", SHAPES))
    specs = [(v.name, v.shape) for v in model.main.inputs]
    return model, specs


def test_learned_rounding_lowers_the_layer_error_on_held_out_images():
    model, specs = _digits_layers()
    train = first_samples(DIGITS / "data/calib.npz", specs, 32)
    test = list(iter_batches(DIGITS / "data/test.npz", specs))
    moments = adaround.input_moments(model.main, train)
    held_out = adaround.input_moments(model.main, [b for _, b in test])
    conv2 = next(n for n in model.main.nodes if n.name == "conv2")
    weight = conv2.inputs[1].numpy().astype(np.float64)
    params = weight_params(weight, "int8", 0)
    learned = adaround.adaround(conv2, weight, params, "int8", moments.moments("conv2"))
    nearest = adaround.quantize(weight, params, "int8")
    assert np.abs(learned.astype(int) - nearest.astype(int)).max() == 1  # up or down, no more
    h = held_out.moments("conv2")

    def error(codes):
        delta = dequantize(codes, params).astype(np.float64) - weight
        rows = adaround._as_rows(conv2, delta, 0)
        return adaround._error(rows, h)

    assert 10 * np.log10(error(nearest) / error(learned)) > 3  # dB less output error


def test_adaround_quantization_is_no_worse_end_to_end():
    model, specs = _digits_layers()
    stats = calibrate(model.main, iter_batches(DIGITS / "data/calib.npz", specs))
    samples = first_samples(DIGITS / "data/calib.npz", specs, 32)
    test = list(iter_batches(DIGITS / "data/test.npz", specs))
    results = {}
    for rounding in ("nearest", "adaround"):
        fresh = optimize(load_onnx(DIGITS / "digits.onnx", SHAPES))
        options = QuantizeOptions(weight_rounding=rounding)
        quantized = quantize(fresh, options, stats, samples)
        results[rounding] = compare_graphs(model.main, quantized.main, test).outputs["logits"]
    assert results["adaround"]["sqnr_db"] > results["nearest"]["sqnr_db"] + 0.2
