"""Each layer quantized alone (quant/sensitivity.py) on the trained digits CNN and real digits."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.compile import QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.sensitivity import _leave_one_out, isolated_output_noise
from onebuild.graph_ir.serde import load_onnx

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
LAYERS = ["conv1", "conv2", "fc"]


@pytest.fixture(scope="module")
def digits():
    reference = optimize(load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})).main
    specs = [(v.name, v.shape) for v in reference.inputs]
    stats = calibrate(reference, iter_batches(DIGITS / "data/calib.npz", specs))
    model = optimize(load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}))
    quantized = quantize(model, QuantizeOptions(), stats).main
    test = first_samples(DIGITS / "data/test.npz", specs, 64)[0]
    return reference, quantized, test


def test_isolated_noises_add_up_to_the_quantized_models(digits):
    reference, quantized, test = digits
    signal, noise = isolated_output_noise(reference, quantized, test, LAYERS)
    actual = compare_graphs(reference, quantized, [("test", test)]).outputs["logits"]["sqnr_db"]
    alone = {n: 10 * np.log10(signal["logits"] / noise[n]["logits"]) for n in LAYERS}
    summed = 10 * np.log10(signal["logits"] / sum(noise[n]["logits"] for n in LAYERS))
    assert all(30 < db < 60 for db in alone.values())  # every layer adds noise, none dominates
    # the sum predicts the uint8 model within 2.5 dB, erring on the safe side (39.7 dB, summed
    # 37.7: the input's codes k/16 / (1/255) hit ties, which QuantizeLinear now rounds as ONNX
    # does, in float32; the model gained 0.2 dB there, the layers' sum did not move)
    assert actual - 2.5 < summed <= actual


def test_each_sample_is_bounded_by_what_the_others_reach():
    assert list(_leave_one_out(np.array([1.0, 5.0, 3.0]), largest=True)) == [5, 3, 5]
    assert list(_leave_one_out(np.array([-1.0, -5.0, 0.0]), largest=False)) == [-5, -1, -5]
    assert list(_leave_one_out(np.array([2.0]), largest=True)) == [2]


def test_a_graph_that_runs_one_sample_at_a_time_is_bounded_per_sample():
    """A [4, 8] x [8, 6] MatMul graph does not run batched, so each observed array is one
    sample (its first axis holds rows, not samples). A lone sample bounds itself (nothing is
    clipped), and identical samples bound each other alike: three copies add three times one
    copy's noise. Row 0 holds the largest values, so bounds taken per row would clip it."""
    from onnx import TensorProto, helper, numpy_helper

    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.config import QuantConfig
    from onebuild.graph_ir.quant.quantize_graph import quantize_graph
    from onebuild.graph_ir.serde.onnx_import import import_onnx

    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (8, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])
    onnx_model = helper.make_model(
        helper.make_graph(nodes, "rows", [x_info], [y_info], [weight]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    graph = import_onnx(onnx_model, "m.onnx").main
    assert not Interpreter(graph).batchable
    x = rng.normal(0, 1, (8, 4, 8)).astype(np.float32)
    x[:, 0] *= 20  # row 0 of every sample holds the extremes
    stats = calibrate(graph, [("samples", {"x": x})])
    quantized = quantize_graph(graph, stats.ranges_for("uint8"), QuantConfig(dtype="uint8"))
    _, one = isolated_output_noise(graph, quantized, {"x": x[:1]}, ["matmul"])
    _, three = isolated_output_noise(graph, quantized, {"x": np.repeat(x[:1], 3, 0)}, ["matmul"])
    signal, _ = isolated_output_noise(graph, quantized, {"x": x[:1]}, [])
    assert 0 < one["matmul"]["y"] < 1e-3 * signal["y"]  # quantization noise, nothing clipped
    assert three["matmul"]["y"] == pytest.approx(3 * one["matmul"]["y"], rel=1e-9)
