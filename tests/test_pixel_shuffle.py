"""ConvTransposes whose windows do not overlap quantize as a 1x1 QConv and DepthToSpace."""

import numpy as np
from onnx import helper
from onnx_builders import make_model
from sklearn.datasets import load_digits

from onebuild import compile as C
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.pixel_shuffle import split_pixel_shuffles
from onebuild.graph_ir.serde import load_onnx


def upsampling_model(tmp_path):
    """Conv 3x3 -> Relu -> ConvTranspose (k = s = 2, bias) -> Relu -> ConvTranspose (k 3, s 2:
    overlapping windows) on 8x8 digit images."""
    rng = np.random.default_rng(3)
    inits = [
        ("w0", rng.normal(0, 0.4, (6, 1, 3, 3)).astype(np.float32)),
        ("b0", rng.normal(0, 0.1, 6).astype(np.float32)),
        ("w1", rng.normal(0, 0.4, (6, 4, 2, 2)).astype(np.float32)),
        ("b1", rng.normal(0, 0.1, 4).astype(np.float32)),
        ("w2", rng.normal(0, 0.4, (4, 2, 3, 3)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ConvTranspose", ["r", "w1", "b1"], ["u"], strides=[2, 2], name="up"),
        helper.make_node("Relu", ["u"], ["v"], name="relu2"),
        helper.make_node("ConvTranspose", ["v", "w2"], ["y"], strides=[2, 2], name="overlap"),
    ]
    path = tmp_path / "up.onnx"
    path.write_bytes(make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], inits).SerializeToString())
    model = load_onnx(path)
    C.optimize(model)
    return model


def digits(count: int) -> np.ndarray:
    images = load_digits().images[:count].astype(np.float32) / 16
    return images.reshape(count, 1, 1, 8, 8)


def test_rewrite_keeps_the_float_function_and_the_names(tmp_path):
    model = upsampling_model(tmp_path)
    feeds = {"x": digits(32)}
    want = Interpreter(model.main).run_batch(feeds)["y"]
    windows = split_pixel_shuffles(model.main)
    graph = model.main
    ops = [n.op for n in graph.nodes]
    assert ops == ["Conv", "Conv", "DepthToSpace", "ConvTranspose"]  # the Relu fused
    up = graph.nodes[1]
    assert up.attrs["clip"] == [0.0, float("inf")]
    assert up.name == "up" and graph.nodes[2].output.name == "v"  # overrides still find them
    assert windows == {up.output.name: "v"}
    assert not any(v.name in ("w1", "b1") for v in graph.constants.values())
    got = Interpreter(graph).run_batch(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_upsampling_runs_in_integers(tmp_path):
    """Quantized, the k = s layer is a QConv and a DepthToSpace of codes (no float island
    around it), within the SQNR of the float island it replaces."""
    model = upsampling_model(tmp_path)
    calib, test = digits(200)[:100], digits(200)[100:]
    stats = C.calibrate(model.main, [("calib", {"x": calib})])
    want = Interpreter(model.main).run_batch({"x": test})["y"].astype(np.float64)
    quantized = C.quantize(model, C.QuantizeOptions(), stats).main
    ops = [n.op for n in quantized.nodes]
    assert ops[:4] == ["QuantizeLinear", "QConv", "QConv", "DepthToSpace"]
    assert ops.count("ConvTranspose") == 1  # the overlapping one stays float
    got = Interpreter(quantized).run_batch({"x": test})["y"]
    noise = want - got
    assert sqnr_db(float((want * want).sum()), float((noise * noise).sum())) > 30
