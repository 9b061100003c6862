"""PRelu in circle and tflite: tflite PRELU imports (it was refused as "builtin 54"); circle
spells it relu(x) + slope * (x - relu(x)), which onert runs (it has no PReLU kernel) and the
reader folds back."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import operator_list, run_litert, run_onert

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle
from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent


def prelu_model(tmp_path) -> Path:
    """Conv (4 channels) -> PRelu with a slope per channel, on 8x8 digits."""
    rng = np.random.default_rng(0)
    inits = [
        ("w", rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)),
        ("b", rng.normal(0, 0.1, 4).astype(np.float32)),
        ("slope", rng.uniform(0.05, 0.3, (4, 1, 1)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("PRelu", ["c", "slope"], ["y"], name="prelu"),
    ]
    path = tmp_path / "prelu.onnx"
    path.write_bytes(make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], inits).SerializeToString())
    return path


@pytest.mark.parametrize("fmt", ["tflite", "circle"])
def test_prelu_reads_back_and_runs_like_onnxruntime(tmp_path, fmt):
    path = prelu_model(tmp_path)
    model = load_onnx(path)
    data = write_circle(model, fmt)
    assert ("PRELU" in operator_list(data)) == (fmt == "tflite")
    assert [n.op for n in read_circle(data).main.nodes] == ["Conv", "PRelu"]
    if fmt == "circle":
        assert exact_circle(model)[1] is None
    x = read_npz(ROOT / "examples" / "digits" / "data" / "test.npz")["input"][:32]
    x = x.astype(np.float32).reshape(32, 1, 1, 8, 8)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"x": s})[0] for s in x])
    run = run_litert if fmt == "tflite" else lambda d, s: run_onert(d, tmp_path, s)
    got = np.concatenate([r[0] for r in run(data, [[s] for s in x])])
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-6
    assert (want < 0).mean() > 0.2  # the slopes are exercised


def test_a_slope_that_enlarges_the_output_is_not_folded(tmp_path):
    """relu(x) + (x - relu(x)) * slope with a slope [3, 1] over x [1, 8] is a [3, 8] result,
    not a PRelu (which broadcasts its slope to x): read back, it stays the four operators and
    matches onnxruntime."""
    slope = np.asarray([[0.1], [0.2], [0.3]], np.float32)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Sub", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["n", "s"], ["m"]),
        helper.make_node("Add", ["r", "m"], ["y"]),
    ]
    path = tmp_path / "spelled.onnx"
    path.write_bytes(make_model(nodes, [("x", [1, 8])], ["y"], [("s", slope)]).SerializeToString())
    back = read_circle(write_circle(load_onnx(path))).main
    assert [n.op for n in back.nodes] == ["Relu", "Sub", "Mul", "Add"]
    assert back.outputs[0].shape == (3, 8)
    digits = read_npz(ROOT / "examples" / "digits" / "data" / "test.npz")["input"][:4]
    x = (digits[:, 0, 0, 3] - 0.5) * 4  # a row of pixels, signs mixed
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for row in x:
        feed = {"x": row.reshape(1, 8)}
        want = session.run(None, feed)[0]
        np.testing.assert_array_equal(Interpreter(back).run(feed)["y"], want)
    assert (x < 0).any() and (x > 0).any()
