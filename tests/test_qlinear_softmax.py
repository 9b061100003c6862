"""onnxruntime's com.microsoft QLinearSoftmax (its QOperator output for Softmax) imports as
onebuild's QSoftmax and agrees with onnxruntime within one output step."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_model

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"


def softmax_layer(path: Path, dtype, x_params, y_params, axis=-1, opset=13, shape=(1, 10)):
    """x (codes) -> QLinearSoftmax -> y (codes), alone."""
    kind = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    (xs, xz), (ys, yz) = x_params, y_params
    inits = [
        numpy_helper.from_array(np.array(xs, np.float32), "xs"),
        numpy_helper.from_array(np.array(xz, dtype), "xz"),
        numpy_helper.from_array(np.array(ys, np.float32), "ys"),
        numpy_helper.from_array(np.array(yz, dtype), "yz"),
    ]
    node = helper.make_node(
        "QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"],
        domain="com.microsoft", axis=axis, opset=opset,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", kind, list(shape))],
        [helper.make_tensor_value_info("y", kind, list(shape))],
        inits,
    )  # fmt: skip
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=imports, ir_version=8), path)
    return path


def codes_differ(path: Path, codes: np.ndarray) -> np.ndarray:
    model = load_model(path).main
    assert [n.op for n in model.nodes] == ["QSoftmax"]
    ours = Interpreter(model).run_batch({"x": codes})["y"].astype(np.int64)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = np.stack([session.run(None, {"x": c})[0] for c in codes]).astype(np.int64)
    return np.abs(ours.reshape(theirs.shape) - theirs)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("x_scale", [0.02, 0.1, 0.25])
def test_layer_within_one_step_of_onnxruntime(tmp_path, dtype, x_scale):
    """2000 rows of 10 codes drawn over the whole range, at TFLite's output scale 1/256:
    measured 0 steps for uint8, 1 step on at most 0.01 % of int8 elements."""
    info = np.iinfo(dtype)
    zero = {np.uint8: (128, 0), np.int8: (0, -128)}[dtype]
    path = softmax_layer(tmp_path / "l.onnx", dtype, (x_scale, zero[0]), (1 / 256, zero[1]))
    codes = np.random.default_rng(0).integers(info.min, info.max + 1, (2000, 1, 10))
    differ = codes_differ(path, codes.astype(dtype))
    assert differ.max() <= 1
    assert np.mean(differ > 0) <= 2e-4


@pytest.mark.parametrize(
    ("axis", "opset", "shape", "y_scale"),
    [(-1, 11, (1, 10), 0.01), (1, 13, (1, 4, 3, 3), 1 / 256)],
)
def test_other_axes_opsets_and_output_scales(tmp_path, axis, opset, shape, y_scale):
    path = softmax_layer(
        tmp_path / "l.onnx", np.uint8, (0.1, 128), (y_scale, 0), axis, opset, shape
    )
    codes = np.random.default_rng(1).integers(0, 256, (500, *shape)).astype(np.uint8)
    differ = codes_differ(path, codes)
    assert differ.max() <= 1 and np.mean(differ > 0) <= 1e-3


@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_onnxruntime_qoperator_digits_with_softmax(tmp_path, activation):
    """The trained digits CNN with a Softmax head, quantized by onnxruntime's quantize_static
    in the QOperator format (QLinearConv, QGemm, QLinearSoftmax): imported as integer kernels,
    the probabilities equal onnxruntime's on the 360 test images."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    cnn = onnx.load(DIGITS / "digits.onnx")
    logits = cnn.graph.output[0].name
    cnn.graph.node.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    del cnn.graph.output[:]
    cnn.graph.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, None))
    onnx.save(cnn, tmp_path / "float.onnx")
    name = cnn.graph.input[0].name
    calib = np.load(DIGITS / "data" / "calib.npz")["input"].astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter({name: x.reshape(1, 1, 8, 8)} for x in calib)

        def get_next(self):
            return next(self.samples, None)

    quantized = tmp_path / "qop.onnx"
    quantize_static(
        str(tmp_path / "float.onnx"), str(quantized), Reader(),
        quant_format=QuantFormat.QOperator, activation_type=getattr(QuantType, activation),
    )  # fmt: skip
    assert "QLinearSoftmax" in [n.op_type for n in onnx.load(quantized).graph.node]
    model = load_model(quantized, {name: [1, 1, 8, 8]}).main
    assert "QSoftmax" in [n.op for n in model.nodes]
    x = np.load(DIGITS / "data" / "test.npz")["input"].astype(np.float32).reshape(-1, 1, 1, 8, 8)
    ours = Interpreter(model).run_batch({name: x})["probs"]
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    theirs = np.concatenate([session.run(None, {name: s})[0] for s in x])
    np.testing.assert_array_equal(ours.reshape(theirs.shape), theirs)
