"""Per-channel activations read by ordinary convolutions (any group count): the input scales
folded into the weights, W'[o, c] = W[o, c] s_x[c], each input channel centered by its zero
point (quant/channel_activations.py, `quantize.activation_granularity = "channel"`).

The model is BatchNorm-folded: a 3x3 conv whose BatchNorm scales span 300x across channels,
HardSwish, then a 3x3 conv with padding (groups 1 or 2) whose weights undo the spread
(scikit-learn's digits as inputs). Checked: the edge chosen and why, the SQNR gained, the
folded integer kernel against a loop definition, and an edge whose reader's weights do not
carry the spread staying per tensor."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_builders import make_model
from test_channel_activations import _digits, _quantized, _session, _sqnr, _trace
from test_trix_ops import check

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model, node_alone
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.channel_activations import channel_edges, chosen_edges
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.params import channel_of, dequantize, quantize_multiplier
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.simulator import Simulator

CHANNELS, OUT = 16, 8
SPREAD = 300.0


def folded_model(group: int, compensated: bool = True) -> onnx.ModelProto:
    """Conv 3x3 (1 -> 16) -> BN (scales spanning 300x) -> HardSwish -> Conv 3x3 with padding
    (16 -> 8, `group` groups; weights divided by the BN scale of the channel each reads, if
    `compensated`) -> Relu -> Conv 1x1 (10 outputs)."""
    rng = np.random.default_rng(23)
    gamma = rng.permutation(np.geomspace(1 / np.sqrt(SPREAD), np.sqrt(SPREAD), CHANNELS))
    w1 = rng.normal(0, 0.3, (OUT, CHANNELS // group, 3, 3))
    if compensated:
        index = np.arange(OUT)[:, None] // (OUT // group) * (CHANNELS // group)
        w1 = w1 / gamma[index + np.arange(CHANNELS // group)][:, :, None, None]
    inits = {
        "w0": rng.normal(0, 0.5, (CHANNELS, 1, 3, 3)),
        "g": gamma,
        "beta": rng.normal(0, 0.1, CHANNELS) * gamma,
        "mean": rng.normal(0, 0.1, CHANNELS),
        "var": rng.uniform(0.5, 1.5, CHANNELS),
        "w1": w1,
        "b1": rng.normal(0, 0.1, OUT),
        "w2": rng.normal(0, 0.5, (10, OUT, 1, 1)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("HardSwish", ["bn"], ["hs"]),
        helper.make_node("Conv", ["hs", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=group),
        helper.make_node("Relu", ["c1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2"], ["y"]),
    ]
    arrays = [(name, np.asarray(a, np.float32)) for name, a in inits.items()]
    return make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], arrays, opset=14)


def _setup(tmp_path: Path, group: int, compensated: bool = True):
    path = tmp_path / f"folded{group}.onnx"
    onnx.save(folded_model(group, compensated), path)
    model = load_model(path)
    run_preset(model)
    calib, evaluation = _digits()
    return model.main, calibrate(model.main, {"x": calib}), evaluation


def _chosen(graph, stats) -> list[str]:
    """The end values of the edges chosen in uint8."""
    edges = chosen_edges(graph, lambda node: "uint8", stats.channel_ranges)
    return [edge.values[-1].name for edge, _ in edges]


def _round_half_even(value: Fraction) -> int:
    low = value.numerator // value.denominator
    rest = value - low
    return low + (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and low % 2 == 1))


@pytest.mark.parametrize("group", [1, 2])
def test_the_edge_into_a_3x3_conv_is_per_channel_and_gains_10_db(tmp_path, group):
    graph, stats, evaluation = _setup(tmp_path, group)
    edges = {e.values[-1].name: e for e in channel_edges(graph)}
    assert [n.name for n in edges["hs"].readers] == ["c1"]
    assert [v.name for v in edges["hs"].values] == ["c0", "hs"]
    chosen = _chosen(graph, stats)
    assert "hs" in chosen
    lo, hi = stats.channel_ranges["hs"]
    assert (hi - lo).max() / (hi - lo).min() > 50
    tensor = _sqnr(graph, _quantized(graph, stats, "uint8", "tensor"), evaluation)
    channel = _sqnr(graph, _quantized(graph, stats, "uint8", "channel"), evaluation)
    assert channel >= tensor + 10, (tensor, channel)


def test_weights_that_do_not_carry_the_spread_keep_the_edge_per_tensor(tmp_path):
    """Folding moves the input's spread into the weights: without the BatchNorm's inverse in
    them the 8-bit weights lose more than the activations gain, so the edge stays per tensor
    (and the model no worse than with per-tensor activations)."""
    graph, stats, evaluation = _setup(tmp_path, 1, compensated=False)
    chosen = _chosen(graph, stats)
    assert "hs" not in chosen
    tensor = _sqnr(graph, _quantized(graph, stats, "uint8", "tensor"), evaluation)
    channel = _sqnr(graph, _quantized(graph, stats, "uint8", "channel"), evaluation)
    assert channel >= tensor - 0.5, (tensor, channel)


@pytest.mark.parametrize("group", [1, 2])
def test_the_folded_conv_equals_its_loop_definition(tmp_path, group):
    graph, stats, evaluation = _setup(tmp_path, group)
    quantized = _quantized(graph, stats, "uint8", "channel")
    conv = next(n for n in quantized.nodes if n.name == "c1")
    x_params = conv.inputs[0].quant
    assert x_params.axis == 1 and len(set(x_params.zero_point)) > 1  # zero points differ
    x = _trace(quantized, evaluation[5])[conv.inputs[0].name][0]
    w, b = conv.inputs[1].numpy(), conv.inputs[2].numpy()
    s_w, y = conv.inputs[1].quant.scale, conv.output.quant
    per_group_in, per_group_out = CHANNELS // group, OUT // group
    # the folded weights: W'[o, i] = W[o, i] s_x[c] rounded per output channel
    real = next(n for n in graph.nodes if n.name == "c1").inputs[1].numpy().astype(np.float64)
    for o in range(OUT):
        c = o // per_group_out * per_group_in + np.arange(per_group_in)
        folded = real[o] * np.asarray(x_params.scale)[c][:, None, None]
        np.testing.assert_array_equal(w[o], np.rint(folded / s_w[o]))
    want = np.zeros((OUT, 8, 8), np.int64)
    qmin, qmax = (np.broadcast_to(conv.attrs[k], (OUT,)) for k in ("qmin", "qmax"))
    for o in range(OUT):
        out = channel_of(y, o)  # its output may be per channel too (read by the last conv)
        m, r = quantize_multiplier(s_w[o] / out.scale[0])  # the input scales are in s_w
        for i in range(8):
            for j in range(8):
                acc = int(b[o])
                for k in range(per_group_in):
                    c = o // per_group_out * per_group_in + k
                    for di in range(3):
                        for dj in range(3):
                            row, col = i + di - 1, j + dj - 1
                            inside = 0 <= row < 8 and 0 <= col < 8
                            # padding holds the channel's zero point: real 0, centered 0
                            code = int(x[c, row, col]) if inside else x_params.zero_point[c]
                            acc += (code - x_params.zero_point[c]) * int(w[o, k, di, dj])
                code = _round_half_even(Fraction(acc * m, 1 << r)) + out.zero_point[0]
                want[o, i, j] = min(max(code, qmin[o]), qmax[o])
    np.testing.assert_array_equal(_trace(quantized, evaluation[5])["c1_q"][0], want)


@pytest.mark.parametrize("group", [1, 2])
def test_the_folded_conv_on_the_npu_is_bit_exact(tmp_path, group, rng):
    """The 3x3 conv with per-channel input zero points (pads hold them) lowers to the TRIX NPU
    bit-exactly on both presets, on SRAMs that force tiles and through the .tvn encoding; with
    channel 0's zero point used for every channel its codes differ (the check sees it)."""
    graph, stats, _ = _setup(tmp_path, group)
    config = QuantConfig(
        "uint8", activation_granularity="channel", input_type="uint8", output_type="uint8"
    )
    quantized = quantize_graph(
        graph, stats.ranges_for("uint8"), config, channel_ranges=stats.channel_ranges
    )
    conv = next(n for n in quantized.nodes if n.name == "c1")
    assert isinstance(conv.attrs["x_zero_point"], list) and conv.attrs["group"] == group
    check(quantized, rng)
    hw = load_hardware("trix-m")
    program = lower(quantized, hw)
    for layer in program.layers:
        if layer.name == "c1":
            layer.attrs["x_zero_point"] = [layer.attrs["x_zero_point"][0]] * CHANNELS
    feeds = {"x": rng.integers(0, 256, (1, 1, 8, 8)).astype(np.uint8)}
    want = Interpreter(quantized).run(feeds)
    got, _ = Simulator(generate(program, hw), hw).run(feeds)
    assert not all(np.array_equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("group", [1, 2])
def test_the_qdq_export_runs_the_folded_conv_in_onnxruntime_within_one_lsb(tmp_path, group):
    """Exported as DequantizeLinear with scale 1 and each channel's zero point (axis 1), the
    folded weights dequantized per output channel, a float Conv and the real bias."""
    graph, stats, evaluation = _setup(tmp_path, group)
    quantized = _quantized(graph, stats, "uint8", "channel", output_type="uint8")
    conv = next(n for n in quantized.nodes if n.name == "c1")
    runtime = _session(Model([node_alone(conv)]))
    for sample in evaluation[:8]:
        trace = _trace(quantized, sample)
        (theirs,) = runtime.run(None, {conv.inputs[0].name: trace[conv.inputs[0].name]})
        diff = np.abs(theirs.astype(np.int64) - trace[conv.output.name])
        assert diff.max() <= 1
    ours = Interpreter(quantized).run_batch({"x": evaluation})["y"]
    runtime = _session(Model([quantized]))
    theirs = np.stack([runtime.run(None, {"x": sample})[0] for sample in evaluation])
    diff = np.abs(ours.astype(np.int64) - theirs)  # 1-LSB differences compound end to end
    assert diff.max() <= 2 and np.mean(diff <= 1) >= 0.99


@pytest.mark.parametrize("group", [1, 2])
def test_empirical_bias_correction_takes_the_folded_scales_into_account(tmp_path, group):
    """The folded conv's weights hold its input scales, so its input's mean shift is taken in
    input steps: its output's largest per-channel mean shift on held-out images falls (measured
    0.00115 -> 0.00092 and 0.00179 -> 0.00150; with the shift in real units, unchanged)."""
    graph, stats, evaluation = _setup(tmp_path, group)
    calib, _ = _digits()
    want = _trace_batch(graph, evaluation)["c1"]  # with its Relu (fused)
    shifts = []
    for correction in (True, "empirical"):
        options = QuantizeOptions(activation_granularity="channel", bias_correction=correction)
        model = load_model(tmp_path / f"folded{group}.onnx")
        run_preset(model)
        quantized = quantize(model, options, stats, [{"x": calib}]).main
        conv = next(n for n in quantized.nodes if n.name == "c1")
        codes = _trace_batch(quantized, evaluation)[conv.output.name]
        got = dequantize(codes, conv.output.quant).astype(np.float64)
        shifts.append(np.abs((got - want).mean(axis=(0, 2, 3))).max())
    assert shifts[1] < 0.9 * shifts[0], shifts


def _trace_batch(graph, images: np.ndarray) -> dict[str, np.ndarray]:
    trace = {}
    observe = lambda v, a: trace.__setitem__(v.name, a)  # noqa: E731
    Interpreter(graph, observer=observe).run_batch({"x": images})
    return trace


def test_the_input_of_an_upsampling_conv_transpose_is_recorded(tmp_path, caplog):
    """A ConvTranspose whose windows do not overlap becomes a 1x1 Conv at quantization
    (`pixel_shuffle.py`, the DB text detector's head): calibration records its input per
    channel, so quantization finds the ranges of the edge that rewrite creates."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("ConvTranspose", ["r0", "wt"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    arrays = [
        ("w0", (rng.normal(0, 0.5, (CHANNELS, 1, 3, 3))).astype(np.float32)),
        ("wt", rng.normal(0, 0.5, (CHANNELS, 2, 2, 2)).astype(np.float32)),
    ]
    path = tmp_path / "up.onnx"
    onnx.save(make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], arrays, opset=14), path)
    model = load_model(path)
    run_preset(model)
    calib, _ = _digits()
    stats = calibrate(model.main, {"x": calib})
    conv = next(n for n in model.main.nodes if n.op == "Conv")
    assert conv.output.name in stats.channel_ranges
    with caplog.at_level("WARNING", logger="onebuild"):
        quantize(model, QuantizeOptions(activation_granularity="channel"), stats)
    assert "no per-channel ranges" not in caplog.text


def test_int16_edges_into_ordinary_convs_stay_per_tensor(tmp_path):
    """Folding is used in 8 bits only (`FOLDED_DTYPES`: in int16 the OCR detector lost with
    it): in int16 the 3x3 conv reads its input per tensor, the depthwise edges stay per
    channel."""
    graph, stats, _ = _setup(tmp_path, 1)
    quantized = _quantized(graph, stats, "int16", "channel")
    conv = next(n for n in quantized.nodes if n.name == "c1")
    assert conv.inputs[0].quant.axis is None
    assert "hs" in _chosen(graph, stats)  # the same edge is folded in uint8


def test_mixed_precision_folds_only_in_a_base_that_meets_the_target(tmp_path):
    """The search's candidates fold no edge (a promotion that splits one loses it in both
    types: the layout detector needed 90.8 % of its MACs in int16 for 30 dB, 63.5 % without),
    but the all-uint8 model is first measured as configured: when it meets the target it is
    the answer, folded edge and all, with nothing promoted (it was 100 % promoted when the
    base was measured without folding)."""
    graph, stats, _ = _setup(tmp_path, 1)
    calib, _ = _digits()
    batch = [{"x": calib}]
    plain = quantize(_model(tmp_path), QuantizeOptions(activation_granularity="channel"), stats)
    folded_db = min(
        o["sqnr_db"] for o in compare_graphs(graph, plain.main, [("c", batch[0])]).outputs.values()
    )

    def mixed(target: float):
        options = QuantizeOptions(
            activation_granularity="channel",
            mixed_precision=MixedPrecisionOptions(target_sqnr_db=target),
        )
        model = quantize(_model(tmp_path), options, stats, batch)
        conv = next(n for n in model.main.nodes if n.name == "c1")
        return json.loads(model.metadata["mixed_precision"]), conv.inputs[0].quant.axis

    record, axis = mixed(folded_db - 1)
    assert record["promoted"] == [] and axis is not None, record
    record, axis = mixed(folded_db + 3)
    assert record["promoted"] and axis is None, record
    assert "hs" in _chosen(graph, stats)


def _model(tmp_path) -> Model:
    model = load_model(tmp_path / "folded1.onnx")
    run_preset(model)
    return model
