"""Each layer quantized alone (quant/sensitivity.py) on the trained digits CNN and real digits."""

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.quant.sensitivity import _leave_one_out, isolated_output_noise
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx

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
    # the sum predicts the uint8 model within 2 dB (39.5 dB), erring on the safe side
    assert actual - 2 < summed <= actual


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


def _rows_projection(shape):
    """x [*shape] @ W: W the first 4 principal axes of the digits' pixel rows (a sequence
    linear layer trained on the calibration images), as a MatMul or a Gemm."""
    rows = np.load(DIGITS / "data/calib.npz")["input"].reshape(-1, 8).astype(np.float64)
    _, _, axes = np.linalg.svd(rows - rows.mean(0), full_matrices=False)
    w = axes[:4].T.astype(np.float32)
    op = "MatMul" if len(shape) == 3 else "Gemm"
    nodes = [helper.make_node(op, ["x", "w"], ["y"], name="linear")]
    return import_onnx(make_model(nodes, [("x", shape)], ["y"], [("w", w)])).main


def test_a_sequence_matmul_quantized_on_its_rows_is_measured():
    """A MatMul [1, 8, 8] @ [8, 4] is quantized as a QGemm on its [8, 8] rows (between two
    Reshapes): its twin has the output's values in another shape, and its noise alone is that
    of the same layer written as a Gemm on [8, 8] (before, it counted as no noise at all)."""
    images = np.load(DIGITS / "data/test.npz")["input"][:16, 0, 0]  # 16 digits, [8, 8] each
    noises = []
    for shape in ([1, 8, 8], [8, 8]):
        graph = _rows_projection(shape)
        batch = {"x": images.reshape(-1, *shape)}
        ranges = calibrate(graph, [("test", batch)]).ranges_for("uint8")
        quantized = quantize_graph(graph, ranges, QuantConfig(dtype="uint8"))
        signal, noise = isolated_output_noise(graph, quantized, batch, ["linear"])
        noises.append(noise["linear"]["y"] / signal["y"])
    sequence, rows = noises
    assert 1e-6 < rows < 1e-2  # 8-bit rounding: 20-60 dB
    assert sequence == pytest.approx(rows, rel=1e-4)  # float references summed in another order


def test_an_int16_output_is_bounded_with_its_headroom():
    """A layer computing in uint8 and writing int16 (activation-only promotion) gets its int16
    range widened by `params.HEADROOM` (2), so a sample 1.5x beyond the others is not clipped
    there: its noise alone is the rounding of its inputs, weights and output, what the
    quantized graph itself adds (clipped to the others' bare range: 20.8 instead of 49.1 dB)."""
    graph = _rows_projection([1, 8, 8])
    images = np.load(DIGITS / "data/test.npz")["input"][:4, 0].astype(np.float32)
    images[0] *= 1.5  # one digit with more ink than the others reach
    batch = {"x": images}
    ranges = calibrate(graph, [("test", batch)]).ranges_for("uint8")
    config = QuantConfig(dtype="uint8", layers=(LayerOverride(("linear",), output_dtype="int16"),))
    quantized = quantize_graph(graph, ranges, config)
    gemm = next(node for node in quantized.nodes if node.name == "linear")
    assert gemm.op == "QGemm" and gemm.output.dtype == np.dtype("int16")
    signal, noise = isolated_output_noise(graph, quantized, batch, ["linear"])
    whole = compare_graphs(graph, quantized, [("test", batch)]).outputs["y"]["sqnr_db"]
    alone = 10 * np.log10(signal["y"] / noise["linear"]["y"])
    assert 30 < whole < 60 and alone == pytest.approx(whole, abs=0.01)


def _pca_rows_network():
    """x [1, 8, 8] -> MatMul -> Relu -> MatMul: two sequence linear layers, each the principal
    axes of its inputs' rows on the digits' calibration images (8 -> 8 -> 4)."""
    rows = np.load(DIGITS / "data/calib.npz")["input"].reshape(-1, 8).astype(np.float64)
    _, _, axes = np.linalg.svd(rows - rows.mean(0), full_matrices=False)
    first = axes.T.astype(np.float32)
    features = np.maximum(rows @ first, 0)
    _, _, axes = np.linalg.svd(features - features.mean(0), full_matrices=False)
    second = axes[:4].T.astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="second"),
    ]
    weights = [("w1", first), ("w2", second)]
    return import_onnx(make_model(nodes, [("x", [1, 8, 8])], ["y"], weights))


def test_the_search_measures_sequence_matmuls():
    """Mixed precision on two sequence MatMuls (QGemms on rows): the search's sensitivity
    record has each one's noise alone (before, none: both were kept low as if free)."""
    model = _pca_rows_network()
    batch = {"x": np.load(DIGITS / "data/test.npz")["input"][:32, 0]}
    stats = calibrate(model.main, [("test", batch)])
    options = QuantizeOptions(mixed_precision=MixedPrecisionOptions(target_sqnr_db=45))
    record = json.loads(quantize(model, options, stats, [batch]).metadata["mixed_precision"])
    uint8 = record["steps"][0]
    assert record["target_met"] and uint8.get("sqnr_db", uint8.get("sqnr_db_at_most")) < 45
    alone = {entry["node"]: entry["sqnr_db_alone"] for entry in record["sensitivity"]}
    assert set(alone) == {"first", "second"}
    assert all(db is not None and 15 < db < 60 for db in alone.values()), alone
