"""Per-channel activation quantization on Conv -> table -> depthwise Conv edges
(`quantize.activation_granularity = "channel"`, quant/channel_activations.py).

The model is BatchNorm-folded as mobile networks are: a pointwise conv whose BatchNorm scales
span 300x across channels, HardSwish, a depthwise conv that undoes the spread (scikit-learn's
digits as inputs). Checked: the edges chosen, the SQNR gained, the integer kernels against loop
definitions, the QDQ export in onnxruntime, the statistics file, and the NPU package (one NPU
part, bit-exact)."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from sklearn.datasets import load_digits
from test_partition import assert_package_matches_reference, build_statuses

from onebuild.compile import QuantizeOptions, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model, Node, node_alone
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate, merge_recorders, record
from onebuild.graph_ir.quant.channel_activations import depthwise_edges
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import channel_of, quantize_multiplier
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.calibration_file import load_calibration, save_calibration
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.npz import write_npz

CHANNELS = 16
SPREAD = 300.0


def spread_model(affine: bool = False) -> onnx.ModelProto:
    """Conv 3x3 -> Relu -> Conv 1x1 -> BN (scales spanning 300x) -> HardSwish -> depthwise 3x3
    (weights divided by the BN scale) -> Relu -> Conv 1x1 (10 outputs); with `affine`, a
    scalar Mul and Add after the HardSwish (PP-LCNetV3's learnable affine block)."""
    rng = np.random.default_rng(17)
    gamma = rng.permutation(np.geomspace(1 / np.sqrt(SPREAD), np.sqrt(SPREAD), CHANNELS))
    inits = {
        "w0": rng.normal(0, 0.5, (CHANNELS, 1, 3, 3)),
        "w1": rng.normal(0, 0.125, (CHANNELS, CHANNELS, 1, 1)),
        "w2": rng.normal(0, 0.5, (CHANNELS, 1, 3, 3)) / gamma[:, None, None, None],
        "w3": rng.normal(0, 0.5, (10, CHANNELS, 1, 1)),
        "g": gamma,
        "beta": rng.normal(0, 0.1, CHANNELS) * gamma,
        "mean": rng.normal(0, 0.1, CHANNELS),
        "var": rng.uniform(0.5, 1.5, CHANNELS),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["a0"]),
        helper.make_node("Conv", ["a0", "w1"], ["pw"]),
        helper.make_node("BatchNormalization", ["pw", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("HardSwish", ["bn"], ["hs"]),
        helper.make_node("Conv", ["hs", "w2"], ["dw"], pads=[1, 1, 1, 1], group=CHANNELS),
        helper.make_node("Relu", ["dw"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3"], ["y"]),
    ]
    if affine:
        nodes[4].output[0] = "hs0"
        nodes[4:5] = [
            nodes[4],
            helper.make_node("Mul", ["hs0", "lab_scale"], ["hs1"]),
            helper.make_node("Add", ["hs1", "lab_shift"], ["hs"]),
        ]
        inits.update({"lab_scale": [0.63], "lab_shift": [-0.55]})
    arrays = [(name, np.asarray(a, np.float32)) for name, a in inits.items()]
    return make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], arrays, opset=14)


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spread") / "m.onnx"
    onnx.save(spread_model(), path)
    return path


def _digits() -> tuple[np.ndarray, np.ndarray]:
    images = (load_digits().images / 16.0).astype(np.float32)[:, None, None]
    return images[:64], images[1000:1064]  # calibration, evaluation: [N, 1, 1, 8, 8]


@pytest.fixture(scope="module")
def setup(onnx_path):
    model = load_model(onnx_path)
    run_preset(model)
    calib, evaluation = _digits()
    stats = calibrate(model.main, {"x": calib})
    return model.main, stats, evaluation


def _quantized(graph, stats, dtype: str, granularity: str, output_type="float32") -> Graph:
    config = QuantConfig(
        dtype, activation_granularity=granularity, output_type=output_type, input_type="float32"
    )
    return quantize_graph(
        graph,
        stats.ranges_for(dtype),
        config,
        stats.channel_means(),
        channel_ranges=stats.channel_ranges,
    )


def _sqnr(graph, quantized, evaluation) -> float:
    want = Interpreter(graph).run_batch({"x": evaluation})["y"].astype(np.float64).ravel()
    got = Interpreter(quantized).run_batch({"x": evaluation})["y"].astype(np.float64).ravel()
    return sqnr_db(want @ want, (want - got) @ (want - got))


def _trace(graph: Graph, sample: np.ndarray) -> dict[str, np.ndarray]:
    trace = {}
    Interpreter(graph, observer=lambda v, a: trace.__setitem__(v.name, a)).run({"x": sample})
    return trace


def _node(graph: Graph, name: str) -> Node:
    return next(n for n in graph.nodes if n.name == name)


# -- which values -------------------------------------------------------------------------------
def test_the_pointwise_table_depthwise_edge_is_found_and_nothing_else(setup):
    graph, stats, _ = setup
    (edge,) = depthwise_edges(graph)
    assert [edge.producer.name, edge.table.name, [n.name for n in edge.readers]] == [
        "pw",
        "hs",
        ["dw"],
    ]
    assert [v.name for v in edge.values] == ["pw", "hs"]
    # the edges into ordinary convolutions are recorded too (`test_channel_folding.py`); here
    # their readers would not gain by them, so they stay per tensor
    assert set(stats.channel_ranges) == {"c0", "pw", "hs", "dw"}
    lo, hi = stats.channel_ranges["pw"]
    assert lo.shape == hi.shape == (CHANNELS,) and (hi - lo).max() / (hi - lo).min() > 100
    graph.outputs.append(next(n for n in graph.nodes if n.name == "hs").output)
    try:  # a value also read elsewhere (here: a graph output) stays per tensor
        assert depthwise_edges(graph) == []
    finally:
        graph.outputs.pop()


def test_per_channel_parameters_only_on_the_edge(setup):
    graph, stats, _ = setup
    quantized = _quantized(graph, stats, "uint8", "channel")
    per_channel = {
        v.name
        for n in quantized.nodes
        for v in n.outputs
        if v.quant is not None and v.quant.axis is not None
    }
    assert per_channel == {"pw_q", "hs_q"}
    table = _node(quantized, "hs").inputs[1]
    assert table.shape == (CHANNELS, 256)
    assert len(_node(quantized, "dw").attrs["x_zero_point"]) == CHANNELS
    plain = _quantized(graph, stats, "uint8", "tensor")
    assert all(v.quant.axis is None for n in plain.nodes for v in n.outputs if v.quant)


# -- what it buys --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_sqnr_rises_by_10_db(setup, dtype):
    graph, stats, evaluation = setup
    tensor = _sqnr(graph, _quantized(graph, stats, dtype, "tensor"), evaluation)
    channel = _sqnr(graph, _quantized(graph, stats, dtype, "channel"), evaluation)
    assert channel >= tensor + 10, (tensor, channel)
    assert channel >= 25


# -- the integer kernels against loop definitions -------------------------------------------------
def _round_half_even(value: Fraction) -> int:
    low = value.numerator // value.denominator
    rest = value - low
    return low + (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and low % 2 == 1))


def _requantize(acc: int, m: int, r: int) -> int:
    return _round_half_even(Fraction(acc * m, 1 << r))


def _hardswish(x: float) -> float:
    return x * min(max(x + 3.0, 0.0), 6.0) / 6.0


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_kernels_equal_loop_definitions(setup, dtype):
    graph, stats, evaluation = setup
    quantized = _quantized(graph, stats, dtype, "channel")
    trace = _trace(quantized, evaluation[3])
    pw, hs, dw = (_node(quantized, n) for n in ("pw", "hs", "dw"))

    # pointwise conv: per-tensor input, each output channel its own scale and zero point
    x, w, b = trace[pw.inputs[0].name][0], pw.inputs[1].numpy(), pw.inputs[2].numpy()
    out = pw.output.quant
    s_x, s_w = pw.inputs[0].quant.scale[0], pw.inputs[1].quant.scale
    want = np.zeros((CHANNELS, 8, 8), np.int64)
    for c in range(CHANNELS):
        m, r = quantize_multiplier(s_x * s_w[c] / out.scale[c])
        for i in range(8):
            for j in range(8):
                acc = int(b[c]) + sum(
                    (int(x[k, i, j]) - pw.inputs[0].quant.zero_point[0]) * int(w[c, k, 0, 0])
                    for k in range(CHANNELS)
                )
                code = _requantize(acc, m, r) + out.zero_point[c]
                want[c, i, j] = min(max(code, np.iinfo(dtype).min), np.iinfo(dtype).max)
    np.testing.assert_array_equal(trace["pw_q"][0], want)

    # one table per channel: code -> quantize(hardswish(dequantize(code))) in that channel
    codes = trace["pw_q"][0]
    info = np.iinfo(dtype)
    want = np.zeros_like(codes)
    for c in range(CHANNELS):
        s_in, z_in = out.scale[c], out.zero_point[c]
        s_out, z_out = hs.output.quant.scale[c], hs.output.quant.zero_point[c]
        for i in range(8):
            for j in range(8):
                real = float(np.float32((int(codes[c, i, j]) - z_in) * s_in))
                real = float(np.float32(_hardswish(real)))
                q = _round_half_even(Fraction(real) / Fraction(s_out))
                want[c, i, j] = min(max(q + z_out, info.min), info.max)
    np.testing.assert_array_equal(trace["hs_q"][0], want)

    # depthwise conv: each input channel centered by its own zero point, padded with it
    x, w, b = trace["hs_q"][0], dw.inputs[1].numpy(), dw.inputs[2].numpy()
    s_x, z_x = hs.output.quant.scale, hs.output.quant.zero_point
    s_w, y = dw.inputs[1].quant.scale, dw.output.quant
    lo, hi = (np.broadcast_to(dw.attrs[k], (CHANNELS,)) for k in ("qmin", "qmax"))
    want = np.zeros((CHANNELS, 8, 8), np.int64)
    for c in range(CHANNELS):
        out = channel_of(y, c)  # per channel too where the edge into y is chosen (int8)
        m, r = quantize_multiplier(s_x[c] * s_w[c] / out.scale[0])
        for i in range(8):
            for j in range(8):
                acc = int(b[c])
                for di in range(3):
                    for dj in range(3):
                        row, col = i + di - 1, j + dj - 1
                        if 0 <= row < 8 and 0 <= col < 8:
                            acc += (int(x[c, row, col]) - z_x[c]) * int(w[c, 0, di, dj])
                code = _requantize(acc, m, r) + out.zero_point[0]
                want[c, i, j] = min(max(code, lo[c]), hi[c])
    np.testing.assert_array_equal(trace["dw_q"][0], want)


# -- export ---------------------------------------------------------------------------------------
def _session(model: Model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    proto = export_onnx(model).SerializeToString()
    return ort.InferenceSession(proto, options, ["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qdq_export_runs_in_onnxruntime_within_one_lsb(setup, dtype):
    graph, stats, evaluation = setup
    quantized = _quantized(graph, stats, dtype, "channel", output_type=dtype)
    proto = export_onnx(Model([quantized]))
    per_axis = [n for n in proto.graph.node if n.op_type.endswith("QuantizeLinear") and n.attribute]
    assert any(a.name == "axis" and a.i == 1 for n in per_axis for a in n.attribute)
    for name in ("pw", "hs", "dw"):  # layer by layer: the same quantized input in both
        node = _node(quantized, name)
        runtime = _session(Model([node_alone(node)]))
        for sample in evaluation[:8]:
            trace = _trace(quantized, sample)
            feeds = {v.name: trace[v.name] for v in node.inputs if not v.is_const}
            (theirs,) = runtime.run(None, feeds)
            diff = np.abs(theirs.astype(np.int64) - trace[node.output.name].astype(np.int64))
            assert diff.max() <= 1, name
    ours = Interpreter(quantized).run_batch({"x": evaluation})["y"]
    runtime = _session(Model([quantized]))  # end to end, default optimizations
    theirs = np.stack([runtime.run(None, {"x": sample})[0] for sample in evaluation])
    diff = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    assert np.mean(diff <= 1) >= 0.99


# -- statistics ----------------------------------------------------------------------------------
def test_channel_ranges_stream_merge_and_round_trip(setup, tmp_path):
    graph, stats, _ = setup
    calib, _ = _digits()
    data = [("a.npz", {"x": calib[:32]}), ("b.npz", {"x": calib[32:]})]
    shards = [record(graph, data, select=lambda n, k=k: n % 2 == k) for k in (0, 1)]
    merged = merge_recorders(shards)
    for name, (lo, hi) in stats.channel_ranges.items():
        np.testing.assert_array_equal(merged.channel_ranges[name][0], lo)
        np.testing.assert_array_equal(merged.channel_ranges[name][1], hi)
    half = calibrate(graph, {"x": calib[:32]})
    assert not np.array_equal(half.channel_ranges["pw"][1], stats.channel_ranges["pw"][1])
    save_calibration(stats, tmp_path / "c.npz")
    loaded = load_calibration(tmp_path / "c.npz")
    for name, (lo, hi) in stats.channel_ranges.items():
        np.testing.assert_array_equal(loaded.channel_ranges[name][0], lo)
        np.testing.assert_array_equal(loaded.channel_ranges[name][1], hi)


def test_the_compile_api_option_reaches_the_quantizer(onnx_path, setup):
    stats = setup[1]
    results = {}
    for granularity in ("tensor", "channel"):
        model = load_model(onnx_path)
        run_preset(model)
        options = QuantizeOptions(activation_granularity=granularity)
        quantized = quantize(model, options, stats).main
        results[granularity] = {n.name: n for n in quantized.nodes}
    assert np.asarray(results["channel"]["hs"].inputs[1].shape).tolist() == [CHANNELS, 256]
    assert len(results["tensor"]["hs"].inputs[1].shape) == 1


# -- the NPU package ------------------------------------------------------------------------------
def test_npu_package_runs_edge_on_the_npu_and_is_bit_exact(tmp_path):
    onnx.save(spread_model(), tmp_path / "m.onnx")
    calib, evaluation = _digits()
    write_npz(tmp_path / "calib.npz", {"x": calib})
    write_npz(tmp_path / "eval.npz", {"x": evaluation[:4]})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        """
[import]
source = "m.onnx"
[optimize]
[quantize]
dtype = "uint8"
calibration = "calib.npz"
activation_granularity = "channel"
[partition]
[codegen]
hw = "trix-m"
[pack]
output = "out/m.nnpkg"
"""
    )
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["trix"]
    assert report["fallbacks"] == []
    manifest = json.loads((tmp_path / "out/m.nnpkg/metadata/MANIFEST").read_text())
    assert len(manifest["models"]) == 1


def test_an_ungated_per_tensor_build_suggests_the_setting(tmp_path, caplog):
    onnx.save(spread_model(), tmp_path / "m.onnx")
    calib, _ = _digits()
    write_npz(tmp_path / "calib.npz", {"x": calib})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\ncalibration = "calib.npz"\n'
    )
    hint = 'activation_granularity = "channel"'
    with caplog.at_level("WARNING", logger="onebuild"):
        build_statuses(recipe)
    assert hint in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="onebuild"):
        build_statuses(recipe, f"quantize.{hint.replace(' ', '')}")
    assert hint not in caplog.text


def test_a_scalar_affine_after_the_table_is_absorbed_into_it(tmp_path):
    path = tmp_path / "affine.onnx"
    onnx.save(spread_model(affine=True), path)
    model = load_model(path)
    run_preset(model)
    graph = model.main
    calib, evaluation = _digits()
    stats = calibrate(graph, {"x": calib})
    (edge,) = depthwise_edges(graph)
    assert [n.op for n in edge.affine] == ["Mul", "Add"]
    assert [v.name for v in edge.values] == ["pw", "hs"]
    quantized = _quantized(graph, stats, "uint8", "channel")
    ops = [n.op for n in quantized.nodes]
    assert "QMul" not in ops and "QAdd" not in ops and ops.count("QLookup") == 1
    tensor = _sqnr(graph, _quantized(graph, stats, "uint8", "tensor"), evaluation)
    assert _sqnr(graph, quantized, evaluation) >= tensor + 10
    # the table is the composed function, channel by channel
    table = _node(quantized, "hs0")
    x, y = table.inputs[0].quant, table.output.quant
    for c in (0, 7, 15):
        for code in range(256):
            real = float(np.float32((code - x.zero_point[c]) * x.scale[c]))
            real = float(np.float32(np.float32(_hardswish(real)) * np.float32(0.63)))
            real = float(np.float32(np.float32(real) + np.float32(-0.55)))
            q = _round_half_even(Fraction(real) / Fraction(y.scale[c])) + y.zero_point[c]
            assert table.inputs[1].numpy()[c, code] == min(max(q, 0), 255)
    runtime = _session(Model([node_alone(table)]))
    for sample in evaluation[:4]:
        trace = _trace(quantized, sample)
        (theirs,) = runtime.run(None, {table.inputs[0].name: trace[table.inputs[0].name]})
        assert np.array_equal(theirs, trace[table.output.name])


# -- on the device --------------------------------------------------------------------------------
def test_a_session_quantizes_per_channel_when_asked(setup, onnx_path, tmp_path):
    from onebuild.runtime.session import Session

    graph, _, evaluation = setup
    calib = _digits()[0][:16]
    figures = {}
    for granularity in ("tensor", "channel"):
        session = Session(onnx_path, workspace=tmp_path / granularity)
        session.set_activation_granularity(granularity)
        session.set_execute_config("DUMP_MINMAX")
        for sample in calib:
            session.run({"x": sample})
        session.reset_execute_config()
        quantized = load_model(session.quantize()).main
        per_channel = [v for n in quantized.nodes for v in n.outputs if v.quant and v.quant.axis]
        figures[granularity] = (len(per_channel), _sqnr(graph, quantized, evaluation))
    assert figures["tensor"][0] == 0 and figures["channel"][0] > 0, figures
    assert figures["channel"][1] >= figures["tensor"][1] + 10, figures
