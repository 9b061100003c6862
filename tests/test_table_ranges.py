"""Values read only by lookup tables are quantized over the inputs the tables can tell apart."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant import quantize_graph as quantizer
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.params import activation_params
from onebuild.graph_ir.serde import load_model
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def _logits(name: str) -> np.ndarray:
    """The float digits CNN's logits on one of its data sets."""
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    data = read_npz(DIGITS / "data" / f"{name}.npz")
    return Interpreter(model.main).run_batch(data)[model.main.outputs[-1].name]


def _scores(keep_logits: bool = False):
    """Sigmoid on the digits CNN's real logits (one-vs-rest scores); calibration and held-out
    logits; `keep_logits`: the logits are an output too (read by something else)."""
    graph = Graph("scores")
    logits = graph.add_input("logits", np.float32, (1, 10))
    scores = graph.make_node("Sigmoid", [logits], name="scores").output
    graph.outputs = [logits, scores] if keep_logits else [scores]
    return graph, {"logits": _logits("calib")}, {"logits": _logits("test")}


def _sqnr(graph, quantized, data) -> float:
    want = Interpreter(graph).run_batch(data)["scores"].astype(np.float64)
    got = Interpreter(quantized).run_batch(data)["scores"].astype(np.float64)
    return sqnr_db(float((want**2).sum()), float(((want - got) ** 2).sum()))


def _logit_params(quantized):
    (node,) = [n for n in quantized.nodes if n.op == "QLookup"]
    return node.inputs[0].quant


def test_sigmoid_input_range_is_narrowed_and_gains_resolution(monkeypatch):
    graph, calib, test = _scores()
    stats = calibrate(graph, calib)
    lo, hi = stats.ranges["logits"]
    narrowed = quantizer.quantize_graph(graph, stats.ranges, QuantConfig())
    params = _logit_params(narrowed)
    lo_q = (0 - params.zero_point[0]) * params.scale[0]
    hi_q = (255 - params.zero_point[0]) * params.scale[0]
    # uint8 Sigmoid outputs are 0 below about -6.2 and 255 above 6.2: the codes go there
    assert -7.5 < lo_q < -6 and 6 < hi_q < 7.5 and lo < -15 and hi > 15
    monkeypatch.setattr(quantizer, "live_range", lambda value, lo, hi, *rest: (lo, hi))
    full = quantizer.quantize_graph(graph, stats.ranges, QuantConfig())
    assert _logit_params(full) == activation_params(lo, hi, "uint8")
    gain = _sqnr(graph, narrowed, test) - _sqnr(graph, full, test)
    # input codes 4.1x finer (logits in [-33.1, 18.7]): 38.8 -> 49.3 dB
    assert gain > 8, gain


def test_outside_the_narrowed_range_the_scores_saturate_as_before():
    """Beyond the narrowed range every input gives the table's end codes, as the float
    function quantized does."""
    graph, calib, _ = _scores()
    stats = calibrate(graph, calib)
    quantized = quantizer.quantize_graph(graph, stats.ranges, QuantConfig())
    (node,) = [n for n in quantized.nodes if n.op == "QLookup"]
    out = node.output.quant
    table = node.inputs[1].numpy()
    assert table[0] == np.clip(round(0 / out.scale[0]) + out.zero_point[0], 0, 255) == 0
    assert table[-1] == 255


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_a_value_read_by_anything_else_keeps_its_range(dtype):
    graph, calib, _ = _scores(keep_logits=True)
    stats = calibrate(graph, calib)
    quantized = quantizer.quantize_graph(graph, stats.ranges, QuantConfig(dtype))
    lo, hi = stats.ranges["logits"]
    headroom = quantizer.HEADROOM.get(dtype, 1.0)
    assert _logit_params(quantized) == activation_params(lo * headroom, hi * headroom, dtype)


def test_a_table_constant_over_the_whole_range_still_quantizes():
    """Relu of logits shifted below zero: the output's range is [0, 0], every code gives 0."""
    graph = Graph("relu")
    logits = graph.add_input("logits", np.float32, (1, 10))
    graph.outputs = [graph.make_node("Relu", [logits], name="scores").output]
    calib, test = _logits("calib"), _logits("test")
    shift = float(max(calib.max(), test.max())) + 1
    calib, test = {"logits": calib - shift}, {"logits": test - shift}
    quantized = quantizer.quantize_graph(graph, calibrate(graph, calib).ranges, QuantConfig())
    assert _logit_params(quantized) == activation_params(0.0, 0.0, "uint8")
    scores = Interpreter(quantized).run_batch(test)["scores"]
    np.testing.assert_array_equal(scores, 0.0)


def test_a_table_promoted_to_int16_keeps_its_uint8_producers_range_narrowed():
    """A uint8 layer read only by a table that mixed precision (or a layer override) puts in
    int16: the int16 table is as constant beyond its span as the uint8 one, so the producer's
    codes go where the table changes, as when both are uint8 (its range was widened to the
    full calibrated one: the PP-OCR classifier's first HardSwish input [-3.05, 9.5] became
    [-7.7, 9.5], and promoting the table lost 2-3 dB)."""
    graph = Graph("scaled_scores")
    logits = graph.add_input("logits", np.float32, (1, 10))
    weight = graph.add_constant(np.diag(np.linspace(0.5, 2.0, 10)).astype(np.float32), "w")
    scaled = graph.make_node("MatMul", [logits, weight], name="scaled").output
    graph.outputs = [graph.make_node("Sigmoid", [scaled], name="scores").output]
    stats = calibrate(graph, {"logits": _logits("calib")})
    lo, hi = stats.ranges[scaled.name]
    promoted = QuantConfig(layers=(LayerOverride(names=("scores",), dtype="int16"),))
    quantized = quantizer.quantize_graph(graph, stats.ranges, promoted)
    (producer,) = [n for n in quantized.nodes if n.op == "QGemm"]
    params = producer.output.quant
    assert producer.output.dtype == np.uint8
    lo_q = (0 - params.zero_point[0]) * params.scale[0]
    hi_q = (255 - params.zero_point[0]) * params.scale[0]
    # calibrated [-55.2, 25.6]; int16 Sigmoid codes are 0 below about -10.5 and stop changing
    # where float32's sigmoid reaches 1.0 (about 17)
    assert lo < -50 and hi > 25 and -11 < lo_q < -10 and 16 < hi_q < 18, (lo_q, hi_q)
