"""Pad in circle/tflite with negative pads (crops): TFLite's paddings are never negative
(LiteRT refuses PADV2 and MIRROR_PAD given them), so the crop is a SLICE first; checked in
LiteRT and onert against onnxruntime on the source model, quantized on the same codes."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import run_litert, run_onert

from onebuild import compile as C
from onebuild.errors import UnsupportedOpsError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.quant.params import quantize
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle

SHAPE = (1, 2, 5, 6)


def pad_model(tmp_path, pads, mode="constant", value=None):
    inputs, inits = ["x", "pads"], [("pads", np.asarray(pads, np.int64))]
    if value is not None:
        inputs.append("value")
        inits.append(("value", np.asarray(value, np.float32)))
    node = helper.make_node("Pad", inputs, ["y"], mode=mode, name="pad")
    path = tmp_path / "pad.onnx"
    path.write_bytes(make_model([node], [("x", SHAPE)], ["y"], inits, opset=19).SerializeToString())
    return load_onnx(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "pads, mode, value",
    [
        ([0, 0, -1, 2, 0, 0, 1, -2], "constant", 1.5),  # crop and grow on one axis
        ([0, -1, 0, 0, 0, 0, 0, -2], "constant", None),  # crops only
        ([0, 0, -1, 0, 0, 0, 0, 2], "reflect", None),  # MIRROR_PAD: LiteRT only (not onert)
    ],
)
def test_negative_pads_crop_in_litert_and_onert(tmp_path, rng, pads, mode, value):
    model, source = pad_model(tmp_path, pads, mode, value)
    x = rng.normal(0, 1, SHAPE).astype(np.float32)
    (want,) = source.run(None, {"x": x})
    lite = run_litert(write_circle(model, "tflite"), [[x]])[0][0]
    np.testing.assert_array_equal(lite, want)
    data, reason = exact_circle(model)
    assert reason is None and "Slice" in [n.op for n in read_circle(data).main.nodes]
    if mode != "reflect":
        np.testing.assert_array_equal(run_onert(data, tmp_path, [[x]])[0][0], want)
    samples = rng.normal(0, 1, (8, *SHAPE)).astype(np.float32)
    stats = C.calibrate(model.main, [("x", {"x": samples})])
    options = C.QuantizeOptions(input_type="uint8", output_type="uint8")
    quantized = C.quantize(model, options, stats)
    codes = quantize(samples, quantized.main.inputs[0].quant, np.uint8)
    ours = Interpreter(quantized.main).run_batch({"x": codes})[quantized.main.outputs[0].name]
    theirs = run_litert(write_circle(quantized, "tflite"), [[c] for c in codes])
    np.testing.assert_array_equal(np.stack([t[0] for t in theirs]), ours)


def test_reflect_cropping_and_growing_one_axis_is_not_written(tmp_path):
    """Reflecting before or after the crop differs on that axis: named, not written."""
    model, _ = pad_model(tmp_path, [0, 0, -1, 0, 0, 0, 2, 0], "reflect")
    with pytest.raises(UnsupportedOpsError, match="Pad \\(node 'pad'\\)"):
        write_circle(model, "tflite")
