"""QDQ export: onnxruntime running the exported model agrees with the integer reference.

End to end on digits; layer by layer on light architectures (each layer gets the same quantized
input in both, since 1-LSB rounding differences compound through deep nets)."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild.errors import UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model, node_alone
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def session(model: Model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    proto = export_onnx(model)
    return ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])


def within_one_lsb(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.abs(a.astype(np.int64) - b.astype(np.int64)) <= 1))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_digits_end_to_end_matches_onnxruntime(dtype):
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    quantized = quantize_graph(model.main, ranges, QuantConfig(dtype, output_type=dtype))
    test = read_npz(DIGITS / "data" / "test.npz")["input"]
    ours = Interpreter(quantized).run_batch({"input": test})["logits"]
    runtime = session(Model([quantized]))
    theirs = np.stack([runtime.run(None, {"input": x})[0] for x in test])
    assert ours.dtype == theirs.dtype == np.dtype(dtype)
    assert within_one_lsb(ours, theirs) >= 0.99


def test_exported_float_model_matches_onnxruntime(rng):
    model = import_onnx(light_model("squeezenet", seed=3))
    run_preset(model)
    x = rng.random(model.main.inputs[0].shape, dtype=np.float32)
    name = model.main.inputs[0].name
    want = Interpreter(model.main).run({name: x})
    got = session(model).run(None, {name: x})
    for value, array in zip(model.main.outputs, got):
        np.testing.assert_allclose(array, want[value.name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v2", "resnet50"])
def test_light_models_layer_by_layer_match_onnxruntime(rng, name):
    model = import_onnx(light_model(name, seed=1))
    run_preset(model)
    graph = model.main
    x = graph.inputs[0]
    calibration = {x.name: rng.random((2, *x.shape), dtype=np.float32)}
    quantized = quantize_graph(graph, calibrate(graph, calibration).ranges)
    trace = {}
    Interpreter(quantized, observer=lambda v, a: trace.__setitem__(v.name, a)).run(
        {x.name: calibration[x.name][0]}
    )
    agree = total = 0
    layers = [n for n in quantized.nodes if n.op.startswith("Q") and n.op != "QuantizeLinear"]
    assert {"QConv", "QAveragePool"} <= {n.op for n in layers}
    for node in layers:
        single = node_alone(node)
        feeds = {v.name: trace[v.name] for v in single.inputs}
        (theirs,) = session(Model([single])).run(None, feeds)
        ours = trace[node.output.name]
        assert within_one_lsb(ours, theirs) >= 0.97, node.name
        agree += np.sum(np.abs(ours.astype(np.int64) - theirs.astype(np.int64)) <= 1)
        total += ours.size
    assert agree / total >= 0.99


def test_export_is_valid_onnx_and_deterministic(tmp_path):
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    quantized = Model([quantize_graph(model.main, ranges)])
    first = export_onnx(quantized).SerializeToString()
    assert export_onnx(quantized).SerializeToString() == first
    proto = onnx.load_from_string(first)
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= ops


def test_split_into_several_quantized_outputs_runs_in_onnxruntime(rng):
    """Each output of a quantized Split gets its own QuantizeLinear (node names unique, as
    onnxruntime requires; the layout detector's heads split one conv's output)."""
    graph = Graph("split")
    x = graph.add_input("x", np.float32, (1, 6, 4, 4))
    y = graph.make_node("Add", [x, x]).output
    parts = graph.make_node("Split", [y], {"axis": 1, "split": [2, 4]}, "split", ["a", "b"])
    moved = graph.make_node("Transpose", [parts.outputs[1]], {"perm": [0, 2, 3, 1]}).output
    graph.outputs = [graph.make_node("Sigmoid", [parts.outputs[0]]).output, moved]
    data = rng.normal(0, 2, (3, 1, 6, 4, 4)).astype(np.float32)
    quantized = quantize_graph(graph, calibrate(graph, {"x": data}).ranges)
    want = Interpreter(quantized).run({"x": data[0]})
    got = session(Model([quantized])).run(None, {"x": data[0]})
    for value, array in zip(quantized.outputs, got):
        np.testing.assert_allclose(array, want[value.name], atol=1e-6)


def resize_model(inputs: list[str], initializers, shape, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Resize", ["x", *inputs], ["y"], name="resize", **attrs)
    return make_model([node], [("x", shape)], ["y"], initializers, opset=19)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_resize_by_scales_exports_its_scales(rng, mode):
    """Scales 0.6 x 0.5 on 5 x 7: onnxruntime samples the exported model where it samples the
    source (sizes [3, 3] alone would resize by 3/5 and 3/7), float and QDQ."""
    scales = np.asarray([1, 1, 0.6, 0.5], np.float32)
    source = resize_model(["", "scales"], [("scales", scales)], (1, 2, 5, 7), mode=mode)
    model = import_onnx(source)
    x = rng.normal(0, 1, (8, 1, 2, 5, 7)).astype(np.float32)
    want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
    exported = session(model)
    for sample in x:
        (got,) = exported.run(None, {"x": sample})
        np.testing.assert_allclose(got, want.run(None, {"x": sample})[0], rtol=1e-6, atol=1e-6)
    config = QuantConfig("uint8", input_type="uint8", output_type="uint8")
    quantized = quantize_graph(model.main, calibrate(model.main, {"x": x}).ranges, config)
    codes = rng.integers(0, 256, (8, 1, 2, 5, 7), dtype=np.uint8)
    ours = Interpreter(quantized).run_batch({"x": codes})[quantized.outputs[0].name]
    runtime = session(Model([quantized]))
    theirs = np.stack([runtime.run(None, {"x": c})[0] for c in codes])
    assert np.abs(ours.astype(np.int64) - theirs).max() <= 1


@pytest.mark.parametrize("shape", [(1, 1, 2, 7), (1, 1, 6, 4)])
def test_resize_keeping_the_aspect_ratio_exports_it(rng, shape):
    """keep_aspect_ratio_policy fitting 10 x 10: one scale and rounded sizes, which neither
    sizes nor scales alone give (2 x 7: scale 10/7, 3 rows, truncated from scales 2)."""
    sizes = ("sizes", np.asarray([10, 10], np.int64))
    for policy in ("not_larger", "not_smaller"):
        source = resize_model(
            ["", "", "sizes"], [sizes], shape, axes=[2, 3], keep_aspect_ratio_policy=policy
        )
        model = import_onnx(source)
        want = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
        x = rng.normal(0, 1, shape).astype(np.float32)
        (got,) = session(model).run(None, {"x": x})
        np.testing.assert_allclose(got, want.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_resize_no_onnx_resize_reproduces_is_refused():
    """Three axes fitting 10 x 10 x 10 from 2 x 3 x 7: scale 10/7 and sizes 3 (rounded up),
    4 (down), 10; scales truncate 2.86 to 2, and given sizes either policy picks another
    scale: one line naming the node."""
    sizes = ("sizes", np.asarray([10, 10, 10], np.int64))
    source = resize_model(
        ["", "", "sizes"],
        [sizes],
        (1, 1, 2, 3, 7),
        keep_aspect_ratio_policy="not_larger",
        axes=[2, 3, 4],
    )
    model = import_onnx(source)
    assert model.main.outputs[0].shape == (1, 1, 3, 4, 10)
    with pytest.raises(UserError, match=r"^node 'resize' \(Resize\): no ONNX Resize [^\n]*$"):
        export_onnx(model)
