"""Cross-layer equalization (quant/equalize.py): float outputs unchanged, the pairs it rescales,
convergence, and the accuracy it recovers on a network whose BatchNorm-folded channels span
1000x in range (scikit-learn's digits as inputs)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from sklearn.datasets import load_digits

from onebuild.compile import QuantizeOptions
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.equalize import _in_ranges, _out_matrix, equalize, pairs
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model

CHANNELS = 16


def _bn(name: str, gamma: np.ndarray, rng) -> tuple[helper.NodeProto, list]:
    c = len(gamma)
    params = [
        (f"{name}_g", gamma.astype(np.float32)),
        (f"{name}_b", rng.normal(0, 0.1, c).astype(np.float32) * gamma),
        (f"{name}_m", rng.normal(0, 0.1, c).astype(np.float32)),
        (f"{name}_v", rng.uniform(0.5, 1.5, c).astype(np.float32)),
    ]
    node = helper.make_node("BatchNormalization", [f"{name}_in", *(p[0] for p in params)], [name])
    return node, params


def spread_model(tmp_path, activation: str = "Relu"):
    """Conv 3x3 -> BN -> act -> depthwise 3x3 -> BN -> act -> Conv 1x1 -> Relu: each BN's scale
    spans 1000x across channels and the next layer undoes it (as training leaves
    BatchNorm-folded networks: the function is balanced, the channel ranges are not)."""
    rng = np.random.default_rng(11)
    g1 = rng.permutation(np.logspace(-1.5, 1.5, CHANNELS))
    g2 = rng.permutation(np.logspace(-1.5, 1.5, CHANNELS))
    w1 = rng.normal(0, 0.5, (CHANNELS, 1, 3, 3))
    w2 = rng.normal(0, 0.5, (CHANNELS, 1, 3, 3)) / g1[:, None, None, None]
    w3 = rng.normal(0, 0.5, (8, CHANNELS, 1, 1)) / g2[None, :, None, None]
    bn1, p1 = _bn("bn1", g1, rng)
    bn2, p2 = _bn("bn2", g2, rng)
    act = (
        (lambda i, o: helper.make_node("Relu", [i], [o]))
        if activation == "Relu"
        else (lambda i, o: helper.make_node("Clip", [i, "zero", "six"], [o]))
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["bn1_in"], pads=[1, 1, 1, 1]),
        bn1,
        act("bn1", "a1"),
        helper.make_node("Conv", ["a1", "w2"], ["bn2_in"], pads=[1, 1, 1, 1], group=CHANNELS),
        bn2,
        act("bn2", "a2"),
        helper.make_node("Conv", ["a2", "w3"], ["c3"]),
        helper.make_node("Relu", ["c3"], ["y"]),
    ]
    inits = [("w1", w1), ("w2", w2), ("w3", w3), *p1, *p2]
    inits += [("zero", np.float32(0)), ("six", np.float32(6))]
    inits = [(n, np.asarray(a, np.float32)) for n, a in inits]
    model = make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], inits, opset=13)
    path = tmp_path / f"spread_{activation}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _digits():
    images = (load_digits().images / 16.0).astype(np.float32)[:, None, None]
    return images[:64], images[1000:1064]  # calibration, evaluation: [N, 1, 1, 8, 8]


def _load(path):
    model = load_model(path)
    run_preset(model)
    return model.main


def _outputs(graph, samples) -> np.ndarray:
    interpreter = Interpreter(graph)
    return np.stack([interpreter.run({"x": s})["y"] for s in samples]).astype(np.float64)


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    diff = (reference - test).ravel()
    return sqnr_db(float(reference.ravel() @ reference.ravel()), float(diff @ diff))


def test_float_outputs_unchanged_and_matches_onnxruntime(tmp_path):
    path = spread_model(tmp_path)
    _, evaluation = _digits()
    graph = _load(path)
    assert equalize(graph) == 2  # conv1 -> depthwise, depthwise -> pointwise
    session = ort.InferenceSession(str(path))
    expected = np.stack([session.run(None, {"x": s})[0] for s in evaluation])
    got = _outputs(graph, evaluation)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_equalization_lifts_uint8_sqnr_by_10_db(tmp_path):
    path = spread_model(tmp_path)
    calib, evaluation = _digits()
    results = {}
    for on in (False, True):
        graph = _load(path)
        reference = _outputs(graph, evaluation)
        if on:
            equalize(graph)
        stats = calibrate(graph, {"x": calib})
        config = QuantizeOptions(bias_correction=False).quant_config()
        quantized = quantize_graph(graph, stats.ranges, config)
        results[on] = _sqnr(reference, _outputs(quantized, evaluation))
    assert results[True] >= results[False] + 10, results


def test_converges_to_equal_ranges(tmp_path):
    graph = _load(spread_model(tmp_path))
    equalize(graph)
    for first, second in pairs(graph):
        r1 = np.abs(_out_matrix(first, first.inputs[1].numpy())).max(axis=1)
        r2 = _in_ranges(second, second.inputs[1].numpy())
        np.testing.assert_allclose(r1, r2, rtol=1e-3)


def test_relu6_chain_is_left_alone(tmp_path):
    """Clip(0, 6) does not commute with a per-channel scale: no pair, weights untouched."""
    graph = _load(spread_model(tmp_path, "Clip"))
    before = [n.inputs[1].numpy().copy() for n in graph.nodes if n.op == "Conv"]
    assert pairs(graph) == [] and equalize(graph) == 0
    after = [n.inputs[1].numpy() for n in graph.nodes if n.op == "Conv"]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_chain(tmp_path, trans_b):
    rng = np.random.default_rng(2)
    scale = np.logspace(-1.5, 1.5, 12)
    w1 = rng.normal(0, 1, (12, 6)) * scale[:, None]  # [N, K] for transB = 1
    w2 = rng.normal(0, 1, (4, 12)) / scale[None, :]
    if not trans_b:
        w1, w2 = w1.T, w2.T
    b1 = rng.normal(0, 1, 12) * scale
    arrays = [("w1", w1), ("b1", b1), ("w2", w2), ("b2", np.zeros(4))]
    inits = [(n, np.asarray(a, np.float32)) for n, a in arrays]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=trans_b),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=trans_b),
    ]
    path = tmp_path / "gemm.onnx"
    path.write_bytes(make_model(nodes, [("x", [1, 6])], ["y"], inits, opset=13).SerializeToString())
    graph = _load(path)
    samples = rng.normal(0, 1, (8, 1, 6)).astype(np.float32)
    before = _outputs(graph, samples)
    assert equalize(graph) == 1
    np.testing.assert_allclose(_outputs(graph, samples), before, rtol=1e-5, atol=1e-5)
    first = graph.nodes[0]
    ranges = np.abs(_out_matrix(first, first.inputs[1].numpy())).max(axis=1)
    assert ranges.max() / ranges.min() < 10  # was 1000x


def test_shared_activation_is_not_equalized(tmp_path):
    """conv1's output is read by two layers: rescaling it would change the second reader."""
    rng = np.random.default_rng(4)
    inits = [(n, rng.normal(0, 1, s).astype(np.float32)) for n, s in
             [("w1", (4, 1, 3, 3)), ("w2", (4, 4, 1, 1)), ("w3", (4, 4, 1, 1))]]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"]),
        helper.make_node("Conv", ["c1", "w2"], ["y"]),
        helper.make_node("Conv", ["c1", "w3"], ["z"]),
    ]
    model = make_model(nodes, [("x", [1, 1, 6, 6])], ["y", "z"], inits, opset=13)
    path = tmp_path / "shared.onnx"
    path.write_bytes(model.SerializeToString())
    assert pairs(_load(path)) == []
