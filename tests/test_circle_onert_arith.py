"""A circle read back computes what onert computes from it, bit for bit (`serde/circle_arith.py`):
onert's requantization rounds twice (gemmlowp) with multipliers from the file's float32 scales,
its QUANTIZE / DEQUANTIZE compute in float32 and its uint8 RESIZE_BILINEAR truncates, where the
IR's own kernels round once, half to even. A tflite keeps the IR's arithmetic: LiteRT gives it."""

import numpy as np
import pytest
from test_circle import (
    DIGITS,
    digits_images,
    digits_model,
    quantized_digits,
    run_litert,
    run_onert,
)
from test_package_circle import ROOT, mobilenet_images

from onebuild import compile as C
from onebuild.errors import FormatError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.quant.kernel_attrs import binary_attrs
from onebuild.graph_ir.quant.model_io import quantize_inputs
from onebuild.graph_ir.serde import load_ir, load_onnx, read_circle, save_ir, write_circle
from onebuild.graph_ir.tensor import QuantParams
from onebuild.npz import read_npz


def every_tensor(model: Model) -> Model:
    """`model` with every node's output a graph output too (onert shows intermediate tensors
    only as outputs)."""
    graph = model.main
    graph.outputs.extend(
        n.output for n in graph.nodes if n.output not in graph.outputs and n.op != "Identity"
    )
    return model


def differences(graph: Graph, results, want: dict) -> dict[str, int]:
    """Largest |runtime - onebuild| per output (in codes for integer outputs)."""
    worst = {}
    for index, value in enumerate(graph.outputs):
        got = np.stack([r[index] for r in results]).reshape(want[value.name].shape)
        worst[value.name] = float(np.abs(got.astype(np.float64) - want[value.name]).max())
    return worst


def test_tiny_mobilenet_every_tensor_bit_for_bit_in_onert(tmp_path):
    """uint8 (per-channel weights): convolutions, depthwise, residual ADDs, tables, a bilinear
    RESIZE, a FULLY_CONNECTED, softmax, QUANTIZE and DEQUANTIZE. Read back, the circle gives
    onert's codes on every one of its tensors for 64 images (photographs and the calibration
    crops); the IR's own arithmetic is up to a few steps away from them (each kernel within 1
    step given the same inputs; the differences add up through the layers)."""
    models = ROOT / "examples" / "models"
    model = load_onnx(models / "tiny_mobilenet.onnx", {"x": [1, 3, 32, 32]})
    C.optimize(model)
    calib = np.load(models / "tiny_mobilenet_calib.npz")["x"]
    stats = C.calibrate(model.main, [("b", {"x": calib})])
    quantized = every_tensor(C.quantize(model, C.QuantizeOptions(dtype="uint8"), stats))
    data = write_circle(quantized)
    back = read_circle(data).main
    images = mobilenet_images()
    results = run_onert(data, tmp_path, [[x] for x in images])
    mine = differences(back, results, Interpreter(back).run_batch({"x": images}))
    own = differences(back, results, Interpreter(quantized.main).run_batch({"x": images}))
    integer = [v.name for v in back.outputs if v.dtype.kind in "iu"]
    print(f"onert vs the IR's own arithmetic: max {max(own[k] for k in integer):.0f} steps")
    assert len(integer) >= 20 and all(mine[name] == 0 for name in integer)
    assert max(own[k] for k in integer) > 1  # the test tells the two arithmetics apart
    floats = [v for v in back.outputs if v.dtype == np.float32]
    assert floats and all(mine[v.name] <= 1e-6 for v in floats)  # ReduceMean sums in float


@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_digits_every_tensor_bit_for_bit_in_onert(granularity, tmp_path):
    """The digits CNN at uint8 with float input and logits (QUANTIZE, two CONV_2D, MAX_POOL_2D,
    FULLY_CONNECTED or its per-channel 1x1 CONV_2D, DEQUANTIZE), per-channel weights and per
    tensor (onert multiplies the scales of a per-tensor CONV_2D and FULLY_CONNECTED in
    float32), on the 360 test images: every tensor read back equals onert's."""
    model = digits_model()
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"]
    stats = C.calibrate(model.main, [(f"b{i}", {"input": calib[i : i + 32]}) for i in (0, 32)])
    options = C.QuantizeOptions(dtype="uint8", granularity=granularity)
    quantized = every_tensor(C.quantize(model, options, stats))
    data = write_circle(quantized)
    back = read_circle(data).main
    images = np.load(DIGITS / "data" / "test.npz")["input"]
    results = run_onert(data, tmp_path, [[x] for x in images])
    mine = differences(back, results, Interpreter(back).run_batch({"input": images}))
    own = differences(back, results, Interpreter(quantized.main).run_batch({"input": images}))
    print(f"digits {granularity}: onert vs the IR's own arithmetic {own}")
    assert len(mine) >= 7 and max(mine.values()) == 0


def binary_model(op: str, a: QuantParams, b: QuantParams, y: QuantParams) -> Model:
    """uint8 a `op` b over every pair of codes ([1, 65536] each)."""
    graph = Graph(op.lower())
    inputs = []
    for name, params in (("a", a), ("b", b)):
        value = graph.add_input(name, np.dtype(np.uint8), (1, 1 << 16))
        value.quant = params
        inputs.append(value)
    kernel, attrs = binary_attrs(op, a, b, y, "uint8")
    node = graph.make_node(kernel, inputs, attrs, op.lower())
    node.output.quant = y
    graph.outputs.append(node.output)
    return Model([graph], {})


PARAMETERS = [  # (scale, zero point) of a, b, y; odd float64 scales, as calibration gives
    ((0.0235294117647, 128), (0.00392156862745098, 0), (0.01171875, 3)),
    ((0.1057362, 17), (0.0071937, 241), (0.0513, 90)),
    ((0.0301, 0), (0.0299, 255), (0.04011, 128)),
]


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_every_code_pair_of_mul_and_add_in_onert(op, tmp_path):
    """MUL (its multiplier from the float32 product of the scales) and ADD (TFLite's scheme at
    2^20), every pair of uint8 codes: onert gives the read-back circle's codes bit for bit.
    onebuild's own rounding moves some MUL codes by 1 step; ADD's roundings (at 2^20) agree."""
    codes = np.arange(1 << 16)
    feeds = [(codes >> 8).astype(np.uint8)[None], (codes & 255).astype(np.uint8)[None]]
    moved = 0
    for params in PARAMETERS:
        model = binary_model(op, *(QuantParams((s,), (z,)) for s, z in params))
        data = write_circle(model)
        back = read_circle(data).main
        (got,) = run_onert(data, tmp_path, [feeds])[0]
        want = Interpreter(back).run({"a": feeds[0], "b": feeds[1]})[back.outputs[0].name]
        np.testing.assert_array_equal(got, want)
        own = Interpreter(model.main).run({"a": feeds[0], "b": feeds[1]})
        diff = np.abs(got.astype(int) - own[model.main.outputs[0].name].astype(int))
        assert diff.max() <= 1
        moved += int(np.count_nonzero(diff))
    print(f"{op}: onebuild's own rounding moves {moved} of {3 << 16} codes by 1 step")
    assert (moved > 0) == (op == "Mul")


def test_quantize_and_dequantize_round_as_onert(tmp_path):
    """QUANTIZE divides in float32 and rounds half away from zero, DEQUANTIZE multiplies in
    float32: ties (k + 1/2 steps) and ordinary values, bit for bit in onert."""
    graph = Graph("qdq")
    x = graph.add_input("x", np.dtype(np.float32), (1, 4096))
    params = QuantParams((0.0470588235294,), (100,))
    q = graph.make_node(
        "QuantizeLinear",
        [x],
        {"scale": [0.0470588235294], "zero_point": [100], "axis": None, "dtype": "uint8"},
        "q",
    ).output
    q.quant = params
    y = graph.make_node(
        "DequantizeLinear",
        [q],
        {"scale": [0.0470588235294], "zero_point": [100], "axis": None},
        "y",
    ).output
    graph.outputs.extend([q, y])
    rng = np.random.default_rng(0)
    ties = (np.arange(-2048, 2048) + 0.5) * np.float32(0.0470588235294) / 8
    feed = np.where(rng.random(4096) < 0.5, ties, rng.normal(0, 3, 4096)).astype(np.float32)
    model = Model([graph], {})
    data = write_circle(model)
    back = read_circle(data).main
    got = run_onert(data, tmp_path, [[feed[None]]])[0]
    want = Interpreter(back).run({"x": feed[None]})
    for value, array in zip(back.outputs, got):
        np.testing.assert_array_equal(array, want[value.name])


def test_litert_gives_the_irs_own_arithmetic_for_tflite():
    """The same digits model at int8 (per-channel weights) as tflite: LiteRT (XNNPACK rounds
    once) gives the IR's own codes on every tensor, and a tflite reads back with them."""
    quantized = every_tensor(quantized_digits("int8", "channel"))
    feeds = quantize_inputs(quantized.main, {"input": digits_images(64)})["input"]
    data = write_circle(quantized, "tflite")
    back = read_circle(data).main
    assert not any("rounding" in node.attrs for node in back.nodes)
    results = run_litert(data, [[x] for x in feeds])
    want = Interpreter(quantized.main).run_batch({"input": feeds})
    worst = differences(quantized.main, results, want)
    assert len(worst) >= 5 and max(worst.values()) == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rounding": "bogus"}, "attrs.rounding: 'bogus' is not one of float32"),
        ({"rounding": "gemmlowp"}, "attrs.multiplier: must be one integer with rounding"),
    ],
)
def test_an_ir_file_with_a_bad_rounding_is_one_line(tmp_path, change, message):
    """An IR file's `rounding` is one of the three names, and an average pool that rounds as
    gemmlowp carries its multiplier and shift: else loading fails naming the attribute."""
    graph = Graph("pool")
    x = graph.add_input("x", np.dtype(np.uint8), (1, 1, 4, 4))
    x.quant = QuantParams((0.1,), (0,))
    attrs = {
        "kernel_shape": [2, 2], "strides": [2, 2], "dilations": [1, 1], "pads": [0] * 4,
        "ceil_mode": 0, "count_include_pad": 0, "x_zero_point": 0, "y_zero_point": 0,
        "qmin": 0, "qmax": 255, "dtype": "uint8", "scale_ratio": 0.5, **change,
    }  # fmt: skip
    node = graph.make_node("QAveragePool", [x], attrs, "pool")
    node.output.quant = QuantParams((0.2,), (0,))
    graph.outputs.append(node.output)
    path = tmp_path / "m.obir"
    save_ir(Model([graph], {}), path)
    with pytest.raises(FormatError, match=message) as error:
        load_ir(path)
    assert len(str(error.value).splitlines()) == 1
