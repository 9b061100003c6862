"""The integer Softmax of the reference (ops/quantized_softmax.py) against float softmax on the
trained digits model's logits (real data): within half an output step for uint8 (the rounding
of the output itself) and 0.6 of a step for int16 (whose step, ~2^-15, meets the 2^-20
exponential table); rows sum to 1 within the rounding and the predicted class is kept."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import dequantize, quantize
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def _logits(split: str) -> np.ndarray:
    graph = load_model(DIGITS / "digits.onnx", {"input": (1, 1, 8, 8)}).main
    images = read_npz(DIGITS / "data" / f"{split}.npz")["input"]
    return Interpreter(graph).run_batch({"input": images})[graph.outputs[0].name]


@pytest.mark.parametrize("dtype, steps", [("uint8", 0.5), ("int16", 0.6)])
def test_integer_softmax_follows_float_softmax(dtype, steps):
    calibration, test = _logits("calib"), _logits("test")
    graph = Graph("softmax")
    x = graph.add_input("x", np.float32, (1, calibration.shape[-1]))
    graph.outputs = [graph.make_node("Softmax", [x], {"axis": 1}).output]
    config = QuantConfig(dtype, input_type=dtype, output_type=dtype)
    quantized = quantize_graph(graph, calibrate(graph, {"x": calibration}).ranges, config)
    assert quantized.nodes[0].op == "QSoftmax"
    x_q, y_q = quantized.inputs[0], quantized.outputs[0]
    codes = quantize(test, x_q.quant, dtype)
    got = dequantize(Interpreter(quantized).run_batch({"x": codes})[y_q.name], y_q.quant)
    real = dequantize(codes, x_q.quant).astype(np.float64)  # the codes' own values
    e = np.exp(real - real.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    step = y_q.quant.scale[0]
    error = np.abs(got - want).max() / step
    assert error <= steps, error
    assert np.abs(got.sum(axis=-1) - 1).max() <= x.shape[1] * step
    assert (got.argmax(axis=-1) == want.argmax(axis=-1)).mean() > 0.99


def test_qdq_export_runs_in_onnxruntime_within_a_step():
    """QSoftmax exports as DequantizeLinear -> Softmax -> QuantizeLinear; onnxruntime's float
    softmax of the same codes lands within one output step of the integer algorithm."""
    import onnxruntime as ort

    from onebuild.graph_ir.ir import Model
    from onebuild.graph_ir.serde.onnx_export import export_onnx

    calibration, test = _logits("calib"), _logits("test")
    graph = Graph("softmax")
    x = graph.add_input("x", np.float32, (1, calibration.shape[-1]))
    graph.outputs = [graph.make_node("Softmax", [x], {"axis": 1}).output]
    ranges = calibrate(graph, {"x": calibration}).ranges
    quantized = quantize_graph(graph, ranges, QuantConfig("uint8"))
    session = ort.InferenceSession(export_onnx(Model([quantized])).SerializeToString())
    name = quantized.outputs[0].name
    theirs = np.concatenate([session.run(None, {"x": sample})[0] for sample in test])
    ours = Interpreter(quantized).run_batch({"x": test})[name].reshape(theirs.shape)
    step = next(n for n in quantized.nodes if n.op == "QSoftmax").output.quant.scale[0]
    assert np.abs(ours - theirs).max() <= step * 1.001
