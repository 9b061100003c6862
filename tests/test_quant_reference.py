"""The integer reference: quantized graphs, bit-exact kernels, accuracy on the digits model."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.ops.conv import conv, conv_by_taps
from onebuild.graph_ir.ops.quantized import _by_taps, _float32_exact
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import quantize_multiplier
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.graph_ir.verify import verify
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = np.sum((reference - test) ** 2)
    return float(10 * np.log10(np.sum(reference**2) / max(noise, 1e-30)))


@pytest.fixture(scope="module")
def digits():
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    test = read_npz(DIGITS / "data" / "test.npz")
    labels = read_npz(DIGITS / "data" / "test_labels.npz")["labels"]
    return model.main, ranges, test, labels


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_digits_full_quantization_accuracy(digits, dtype, granularity):
    graph, ranges, test, labels = digits
    quantized = quantize_graph(graph, ranges, QuantConfig(dtype, granularity))
    verify(quantized)
    ops = [n.op for n in quantized.nodes]
    assert ops.count("QConv") == 2 and ops.count("QGemm") == 1
    float_logits = Interpreter(graph).run_batch(test)["logits"][:, 0]
    quant_logits = Interpreter(quantized).run_batch(test)["logits"][:, 0]
    assert quant_logits.dtype == np.float32
    float_accuracy = np.mean(float_logits.argmax(1) == labels)
    quant_accuracy = np.mean(quant_logits.argmax(1) == labels)
    assert quant_accuracy >= float_accuracy - 0.01
    assert sqnr_db(float_logits, quant_logits) > 30


def _exact_conv_reference(attrs, x, w, b):
    """QConv computed with Python integers: the rules of docs/quantization.md, literally."""
    xc = x.astype(np.int64) - attrs["x_zero_point"]
    n, c, h, wd = xc.shape
    m, _, kh, kw = w.shape
    pt, pl, pb, pr = attrs["pads"][0], attrs["pads"][1], attrs["pads"][2], attrs["pads"][3]
    padded = np.zeros((n, c, h + pt + pb, wd + pl + pr), np.int64)
    padded[:, :, pt : pt + h, pl : pl + wd] = xc
    s = attrs["strides"][0]
    oh, ow = (padded.shape[2] - kh) // s + 1, (padded.shape[3] - kw) // s + 1
    out = np.zeros((n, m, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            window = padded[:, :, i * s : i * s + kh, j * s : j * s + kw]
            out[:, :, i, j] = np.tensordot(window, w.astype(np.int64), axes=([1, 2, 3], [1, 2, 3]))
    out += b.astype(np.int64)[None, :, None, None]
    result = np.empty_like(out)
    for channel in range(m):
        mult, shift = attrs["multiplier"][channel], attrs["shift"][channel]
        for index, acc in np.ndenumerate(out[:, channel]):
            value = (int(acc) * mult + (1 << (shift - 1))) >> shift  # Python ints: exact
            value = min(max(value + attrs["y_zero_point"], attrs["qmin"]), attrs["qmax"])
            result[index[0], channel, index[1], index[2]] = value
    return result.astype(attrs["dtype"])


@pytest.mark.parametrize("stride", [1, 2])
def test_qconv_kernel_is_bit_exact(rng, stride):
    x = rng.integers(0, 256, (2, 5, 9, 7)).astype(np.uint8)
    w = rng.integers(-127, 128, (4, 5, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, 4).astype(np.int32)
    pairs = [quantize_multiplier(float(v)) for v in rng.uniform(1e-4, 1e-2, 4)]
    attrs = {
        "strides": [stride, stride],
        "dilations": [1, 1],
        "pads": [1, 0, 1, 2],
        "group": 1,
        "dtype": "uint8",
        "x_zero_point": 117,
        "y_zero_point": 9,
        "qmin": 9,
        "qmax": 255,
        "multiplier": [m for m, _ in pairs],
        "shift": [r for _, r in pairs],
    }
    (got,) = OPS["QConv"].kernel(attrs, x, w, b)
    np.testing.assert_array_equal(got, _exact_conv_reference(attrs, x, w, b))


def test_light_model_quantizes_and_tracks_float(rng):
    model = import_onnx(light_model("squeezenet", seed=1, expose_logits=True))
    run_preset(model)
    graph = model.main
    name = graph.inputs[0].name
    calibration = {name: rng.random((6, *graph.inputs[0].shape), dtype=np.float32)}
    ranges = calibrate(graph, calibration).ranges
    quantized = quantize_graph(graph, ranges)
    verify(quantized)
    sample = {name: calibration[name][0]}
    logits = graph.outputs[-1].name
    want = Interpreter(graph).run(sample)[logits]
    got = Interpreter(quantized).run(sample)[logits]
    assert sqnr_db(want, got) > 15


def test_quantized_graph_round_trips_through_an_ir_file(digits, tmp_path):
    from onebuild.graph_ir.ir import Model
    from onebuild.graph_ir.serde import load_ir, save_ir

    graph, ranges, test, _ = digits
    quantized = quantize_graph(graph, ranges)
    digest = save_ir(Model([quantized]), tmp_path / "q.obir")
    loaded = load_ir(tmp_path / "q.obir")
    assert save_ir(loaded, tmp_path / "again.obir") == digest
    weights = [v for v in loaded.main.constants.values() if v.dtype == np.int8]
    assert weights and all(v.quant is not None and v.quant.axis == 0 for v in weights)
    np.testing.assert_array_equal(
        Interpreter(loaded.main).run_batch(test)["logits"],
        Interpreter(quantized).run_batch(test)["logits"],
    )


LAYERS = {  # kind -> (node attributes, weight shape); input x is [1, 6, 7, 7] or [1, 24]
    "conv": ("Conv", {"pads": [0, 0, 0, 0]}, (5, 6, 3, 3)),
    "depthwise": ("Conv", {"group": 6}, (6, 1, 3, 3)),
    "gemm_transposed": ("Gemm", {"transB": 1}, (5, 24)),
    "gemm": ("Gemm", {}, (24, 5)),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_bias_correction_removes_the_mean_weight_rounding_error(rng, kind):
    from onnx import helper
    from onnx_builders import make_model

    op, attrs, w_shape = LAYERS[kind]
    x_shape = [1, 6, 7, 7] if op == "Conv" else [1, 24]
    w = rng.normal(0, 0.05, w_shape).astype(np.float32)
    w.flat[0] = 1.0  # one outlier: a coarse per-tensor step, so rounding errors are large
    b = np.zeros(w_shape[0] if op == "Conv" or attrs else w_shape[1], np.float32)
    node = helper.make_node(op, ["x", "w", "b"], ["y"], name="layer", **attrs)
    graph = import_onnx(make_model([node], [("x", x_shape)], ["y"], [("w", w), ("b", b)])).main
    channel_offsets = rng.uniform(0.5, 2.0, x_shape[1]).reshape(
        1, 1, -1, *([1] * (len(x_shape) - 2))
    )

    def samples(count):
        return {"x": (rng.random((count, *x_shape)) + channel_offsets).astype(np.float32)}

    stats = calibrate(graph, samples(64))
    assert set(stats.channel_sums) == {"x"}
    test = samples(64)
    want = Interpreter(graph).run_batch(test)["y"]
    channel_axis = 2 if op == "Conv" else -1
    errors = {}
    for corrected in (False, True):
        config = QuantConfig("uint8", "layer", bias_correction=corrected)
        quantized = quantize_graph(graph, stats.ranges, config, stats.channel_means())
        error = Interpreter(quantized).run_batch(test)["y"] - want
        axes = tuple(i for i in range(error.ndim) if i != (channel_axis % error.ndim))
        errors[corrected] = np.abs(error.mean(axis=axes)).mean()
    assert errors[True] < 0.25 * errors[False]


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_a_dead_channel_keeps_its_bias(dtype):
    """A BatchNorm-folded dead channel (weights ~1e-20, bias 0.7) outputs its bias, whatever
    the input range (40 seeds): its weight scale is raised until the bias fits its integer
    type and the multiplier stays above the flush limit (the bias saturated and the multiplier
    was flushed to zero, dropping the bias: thousands of int16 codes off on the OCR models)."""
    from onnx import helper
    from onnx_builders import make_model

    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    b = np.array([0.1, -0.2, 0.7, 0.3], np.float32)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
        w[2] = rng.normal(0, 1e-20, (3, 3, 3))
        model = make_model([node], [("x", [1, 3, 6, 6])], ["y"], [("w", w), ("b", b)])
        graph = import_onnx(model).main
        scale = rng.uniform(0.5, 3.0)
        samples = {"x": (scale * rng.random((4, 1, 3, 6, 6))).astype(np.float32)}
        stats = calibrate(graph, samples)
        quantized = quantize_graph(graph, stats.ranges_for(dtype), QuantConfig(dtype, "channel"))
        got = Interpreter(quantized).run_batch(samples)["y"]
        step = next(n for n in quantized.nodes if n.op == "QConv").output.quant.scale[0]
        np.testing.assert_allclose(got[:, :, 2], 0.7, atol=step, err_msg=f"seed {seed}")
        assert sqnr_db(Interpreter(graph).run_batch(samples)["y"], got) > 30, seed


@pytest.mark.parametrize(
    "dtype, shape, outputs, weight_bound, dilation, pads",
    [
        ("int16", (2, 96, 40, 40), 24, 32767, 1, [1, 1, 1, 1]),  # the OCR detector's int16 head
        ("uint8", (2, 96, 20, 20), 96, 20, 1, [1, 1, 1, 1]),  # float32-exact 8-bit
        ("int16", (1, 8, 11, 9), 8, 32767, 2, [2, 0, 1, 3]),
    ],
)
def test_conv_by_taps_sums_the_integers_im2col_sums(
    rng, dtype, shape, outputs, weight_bound, dilation, pads
):
    """QConv's stride-1 path (one GEMM per tap) against the window matrix and one GEMM that
    `conv` computes, on full-range codes, in the float type q_conv picks: equal integers."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    w = rng.integers(-weight_bound, weight_bound + 1, (outputs, shape[1], 3, 3))
    w = w.astype(np.int16 if weight_bound > 127 else np.int8)
    attrs = {"strides": [1, 1], "dilations": [dilation] * 2, "pads": pads, "group": 1}
    assert _by_taps(attrs, x, w)
    centered = x.astype(np.int64) - (128 if dtype == "uint8" else 0)
    float_type = np.float32 if _float32_exact(centered, w) else np.float64
    assert (float_type == np.float32) == (dtype == "uint8")
    operands = centered.astype(float_type), w.astype(float_type)
    by_taps = conv_by_taps(*operands, pads, attrs["dilations"])
    np.testing.assert_array_equal(by_taps, conv(attrs, *operands))


def test_qconv_by_taps_is_the_integer_definition(rng):
    """An int16 QConv on the per-tap path, bit for bit against the Python-integer rules."""
    x = rng.integers(-32768, 32768, (2, 6, 9, 7)).astype(np.int16)
    w = rng.integers(-32767, 32768, (5, 6, 3, 3)).astype(np.int16)
    b = rng.integers(-(1 << 30), 1 << 30, 5).astype(np.int64)
    pairs = [quantize_multiplier(float(v)) for v in rng.uniform(1e-9, 1e-7, 5)]
    attrs = {
        "strides": [1, 1],
        "dilations": [1, 1],
        "pads": [1, 0, 1, 2],
        "group": 1,
        "dtype": "int16",
        "x_zero_point": 0,
        "y_zero_point": 0,
        "qmin": -32768,
        "qmax": 32767,
        "multiplier": [m for m, _ in pairs],
        "shift": [r for _, r in pairs],
    }
    assert _by_taps(attrs, x, w)
    (got,) = OPS["QConv"].kernel(attrs, x, w, b)
    np.testing.assert_array_equal(got, _exact_conv_reference(attrs, x, w, b))
