"""Integer PRelu (QPRelu: two requantizations chosen by the input's sign, as TFLite's and
onert's quantized PRELU) on the stem of MediaPipe's face landmark model (trained; three PRelu
with a slope per channel), fed crops of scikit-learn's photos. Before, every PRelu stayed
float between DequantizeLinear and QuantizeLinear, silently, and split NPU builds around it."""

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.datasets import load_sample_image
from test_circle import run_litert, run_onert
from test_trix_sim import assert_bit_exact, integer_graph

from onebuild import compile as api
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.quant.params import dequantize, quantize
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.circle_write import write_flatbuffer
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import unsupported

STEM = Path(__file__).parent / "data" / "tflite" / "face_landmark_stem.onnx"


def photos(count: int) -> np.ndarray:
    """[2 * count, 1, 192, 192, 3] crops of the two photos in [0, 1], as the model takes."""
    crops = []
    for name in ("china.jpg", "flower.jpg"):
        image = load_sample_image(name).astype(np.float32) / 255.0
        for k in range(count):
            crops.append(image[50 * k : 50 * k + 192, 70 * k : 70 * k + 192])
    return np.stack(crops)[:, None]


def quantized_stem(dtype: str, **options) -> Model:
    model = load_onnx(STEM)
    stats = api.calibrate(model.main, {"input_1": photos(3)})
    return api.quantize(model, api.QuantizeOptions(dtype=dtype, **options), stats)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_every_prelu_is_integer_and_the_build_is_silent(dtype, caplog):
    with caplog.at_level(logging.WARNING, "onebuild"):
        model = quantized_stem(dtype)
    ops = [n.op for n in model.main.nodes]
    assert ops.count("QPRelu") == 3 and "PRelu" not in ops
    assert ops.count("DequantizeLinear") == 1  # the output's only
    assert not [r for r in caplog.records if "stay float" in r.message]


def single_prelu(model: Model, index: int) -> Graph:
    """The `index`-th QPRelu of `model` alone, its input a graph input."""
    node = [n for n in model.main.nodes if n.op == "QPRelu"][index]
    graph = Graph("prelu")
    x = graph.add_input("x", node.inputs[0].dtype, node.inputs[0].shape)
    x.quant = node.inputs[0].quant
    slope = graph.add_constant(node.inputs[1].numpy(), "slope")
    slope.quant = node.inputs[1].quant
    out = graph.make_node("QPRelu", [x, slope], dict(node.attrs), "prelu", ["y"]).output
    out.quant = node.output.quant
    graph.outputs = [out]
    return graph


def codes_before(model: Model, index: int, count: int = 2) -> list[np.ndarray]:
    """The codes the `index`-th QPRelu reads, on `count` photo crops."""
    node = [n for n in model.main.nodes if n.op == "QPRelu"][index]
    seen = {}

    def keep(value, array):
        if value is node.inputs[0]:
            seen.setdefault("x", []).append(array)

    interpreter = Interpreter(model.main, observer=keep)
    for sample in photos(count):
        interpreter.run({"input_1": sample})
    return seen["x"]


def test_prelu_kernel_is_the_float_prelu_of_its_codes_within_one_step():
    """Against the definition: the float PRelu of the dequantized input and slope, quantized
    (its two multipliers are 31-bit: ties may round either way)."""
    model = quantized_stem("uint8")
    for index in range(3):
        graph = single_prelu(model, index)
        x, slope = graph.inputs[0], graph.nodes[0].inputs[1]
        for codes in codes_before(model, index):
            got = Interpreter(graph).run({"x": codes})["y"]
            real_x = dequantize(codes, x.quant).astype(np.float64)
            real_slope = dequantize(slope.numpy(), slope.quant).astype(np.float64)
            want = quantize(
                np.where(real_x < 0, real_x * real_slope, real_x), graph.outputs[0].quant, "uint8"
            )
            step = np.abs(got.astype(int) - want.astype(int))
            assert step.max() <= 1 and (step > 0).mean() < 0.01
            assert (codes < x.quant.zero_point[0]).mean() > 0.1  # the slopes are exercised


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_qdq_export_runs_in_onnxruntime_within_one_step(dtype):
    """The QDQ form (DequantizeLinear -> PRelu -> QuantizeLinear) in onnxruntime against the
    integer reference: each PRelu alone on the codes it reads from photo crops, and (uint8)
    the whole stem's output codes."""
    model = quantized_stem(dtype, output_type=dtype)
    for index in range(3):
        graph = single_prelu(model, index)
        session = ort.InferenceSession(
            export_onnx(Model([graph])).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        for codes in codes_before(model, index):
            want = Interpreter(graph).run({"x": codes})["y"]
            got = session.run(None, {"x": codes})[0]
            assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1
    if dtype != "uint8":
        return
    session = ort.InferenceSession(
        export_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    name = model.main.outputs[0].name
    for sample in photos(2):
        want = Interpreter(model.main).run({"input_1": sample})[name]
        got = session.run(None, {"input_1": sample})[0]
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_tflite_prelu_runs_in_litert_within_one_step(dtype):
    """PRELU with its slope codes in the input's type, each of the three alone in LiteRT
    (TFLite rounds half away from zero: ties differ by one step)."""
    model = quantized_stem(dtype)
    for index in range(3):
        graph = single_prelu(model, index)
        data = write_flatbuffer(Model([graph]), "tflite")
        samples = [[c] for c in codes_before(model, index)]
        for (got,), (codes,) in zip(run_litert(data, samples), samples):
            want = Interpreter(graph).run({"x": codes})["y"]
            step = np.abs(got.astype(np.int64) - want.astype(np.int64))
            assert step.max() <= 1 and (step > 0).mean() < 0.01


def test_circle_prelu_runs_in_onert_within_one_step(tmp_path):
    """onert 0.1.0 has no PReLU kernel: circle spells it DEQUANTIZE, relu(x) + slope *
    (x - relu(x)) in float, QUANTIZE."""
    model = quantized_stem("uint8")
    for index in range(3):
        graph = single_prelu(model, index)
        data = write_flatbuffer(Model([graph]), "circle")
        samples = [[c] for c in codes_before(model, index)]
        for (got,), (codes,) in zip(run_onert(data, tmp_path, samples), samples):
            want = Interpreter(graph).run({"x": codes})["y"]
            step = np.abs(got.astype(np.int64) - want.astype(np.int64))
            assert step.max() <= 1 and (step > 0).mean() < 0.01


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_npu_runs_the_stem_whole_and_bit_exact(dtype):
    """One NPU program from the first convolution to the output (a PRelu is a table per
    channel), bit-exact with the integer reference."""
    calibration = {"input_1": photos(3)}
    graph = integer_graph(load_onnx(STEM).main, calibration, dtype)
    hw = load_hardware("trix-m")
    refused = {n.name: unsupported(n, hw) for n in graph.nodes if unsupported(n, hw)}
    prelus = {n.name for n in graph.nodes if n.op == "QPRelu"}
    if dtype == "int16":  # a table per channel of 65536 codes: the PRelus stay on the CPU
        assert set(refused) == prelus
        return
    assert not refused and len(prelus) == 3
    assert_bit_exact(graph, hw, "performance", np.random.default_rng(0))


def test_quantize_warns_naming_the_nodes_that_stay_float(tmp_path, caplog):
    """A PRelu whose slope is computed (and a product of two activations) cannot be integer:
    one warning names the op kinds, counts and reasons (the build said nothing before)."""
    from onnx import helper
    from onnx_builders import make_model

    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("PRelu", ["x", "s"], ["p"]),
        helper.make_node("Transpose", ["p"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["p", "t"], ["y"]),
    ]
    path = tmp_path / "float.onnx"
    path.write_bytes(make_model(nodes, [("x", [1, 16, 16])], ["y"], []).SerializeToString())
    model = load_onnx(path)
    x = photos(1)[:, :, :16, :16, 0] * 2 - 1  # [2, 1, 16, 16]
    stats = api.calibrate(model.main, {"x": x})
    with caplog.at_level(logging.WARNING, "onebuild"):
        api.quantize(model, api.QuantizeOptions(), stats)
    (line,) = [r.getMessage() for r in caplog.records if "stay float" in r.getMessage()]
    assert "2 node(s) stay float" in line
    assert "MatMul x1 (its weights are computed" in line and "PRelu x1 (its slope" in line
    assert 'dtype = "float32"' in line


def test_qdq_export_imports_back_as_the_same_integer_prelu(tmp_path):
    """DequantizeLinear -> PRelu -> QuantizeLinear, as onebuild writes it (and onnxruntime's
    quantizer would), imports as QPRelu with the same parameters: bit for bit."""
    model = quantized_stem("uint8", output_type="uint8")
    path = tmp_path / "stem_qdq.onnx"
    path.write_bytes(export_onnx(model).SerializeToString())
    back = load_onnx(path)
    assert [n.op for n in back.main.nodes].count("QPRelu") == 3
    name = model.main.outputs[0].name
    for sample in photos(1):
        np.testing.assert_array_equal(
            Interpreter(back.main).run({"input_1": sample})[name],
            Interpreter(model.main).run({"input_1": sample})[name],
        )
