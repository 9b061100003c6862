"""QuantizeLinear as ONNX defines it: x / scale in float32 (x's type), rounded half to even,
plus the zero point, saturated. onebuild divided in float64, so float32 ties fell the other
way: 40 of the 256 codes of the usual image preprocessing k/127.5 - 1 were one step off
onnxruntime and onnx.reference (which agree)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx_builders import make_model
from sklearn.datasets import load_sample_image

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx


def quantize_model(tmp_path, scale: np.ndarray, zero_point: np.ndarray, axis: int):
    """x -> QuantizeLinear -> DequantizeLinear (the codes, seen through their real values)."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis),
    ]
    proto = make_model(nodes, [("x", [1, 3, 256])], ["y"], [("s", scale), ("z", zero_point)], 21)
    proto.ir_version = 10  # int16 codes need opset 21
    path = tmp_path / "q.onnx"
    path.write_bytes(proto.SerializeToString())
    return path, proto


def inputs() -> np.ndarray:
    """Three rows of float32 data with ties: k/127.5 - 1 (images scaled to [-1, 1]), k/255
    (to [0, 1]) and a real photo row's pixels scaled to [-1, 1]."""
    k = np.arange(256, dtype=np.float32)
    photo = load_sample_image("china.jpg")[200, :256, 1].astype(np.float32)
    rows = [k / np.float32(127.5) - np.float32(1), k / np.float32(255), photo / 127.5 - 1]
    return np.stack(rows).astype(np.float32)[None]


CASES = {  # name: (scale, zero point, axis)
    "uint8 [-1, 1]": (np.float32(1 / 127.5), np.uint8(128), 1),
    "uint8 [0, 1]": (np.float32(1 / 255), np.uint8(0), 1),
    "int8 per channel": (np.float32([1 / 127.5, 1 / 255, 2 / 255]), np.int8([0, -128, 3]), 1),
    "int16": (np.float32(1 / 32767), np.int16(0), 1),
}


@pytest.mark.parametrize("case", CASES)
def test_quantize_linear_matches_onnxruntime_and_onnx_reference(tmp_path, case):
    scale, zero_point, axis = CASES[case]
    path, proto = quantize_model(tmp_path, scale, zero_point, axis)
    x = inputs()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    np.testing.assert_array_equal(ReferenceEvaluator(proto).run(None, {"x": x})[0], want)
    got = Interpreter(load_onnx(path).main).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
