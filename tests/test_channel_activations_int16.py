"""int16 per-channel activations on Conv -> table -> depthwise Conv edges: the table is
interpolated (QLookupInterp: 513 knots and a bend per segment per channel, exact segments at the
corners), checked against its loop definition, against the float function (within 1 output LSB
of the full table on every code), for the SQNR it buys, in onnxruntime (QDQ export) and in an
NPU package (the edge on the CPU, bit-exact). The model is
`test_channel_activations.spread_model`: a BatchNorm-folded pointwise conv whose channels span
300x, HardSwish [then a scalar affine], a depthwise conv."""

import json
from fractions import Fraction

import numpy as np
import onnx
import pytest
from test_channel_activations import (
    CHANNELS,
    _digits,
    _node,
    _quantized,
    _round_half_even,
    _session,
    _sqnr,
    _trace,
    spread_model,
)
from test_partition import assert_package_matches_reference, build_statuses

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, optimize, quantize
from onebuild.errors import ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model, node_alone
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.channel_activations import depthwise_edges, edge_params
from onebuild.graph_ir.quant.interpolated_table import EXACT_SEGMENTS, interpolated_table
from onebuild.graph_ir.quant.kernel_attrs import function_codes
from onebuild.graph_ir.quant.mixed_precision import edge_units
from onebuild.graph_ir.quant.params import channel_of, dequantize
from onebuild.graph_ir.serde import load_ir, load_model, load_onnx
from onebuild.graph_ir.serde.circle_write import write_circle
from onebuild.graph_ir.tensor import QuantParams
from onebuild.npz import write_npz

AFFINE = (0.63, -0.55)  # spread_model(affine=True)'s scalar Mul and Add after the HardSwish


@pytest.fixture(scope="module", params=[False, True], ids=["hardswish", "affine"])
def spread(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("spread16") / "m.onnx"
    onnx.save(spread_model(affine=request.param), path)
    model = load_model(path)
    run_preset(model)
    calib, evaluation = _digits()
    stats = calibrate(model.main, {"x": calib})
    quantized = _quantized(model.main, stats, "int16", "channel")
    return request.param, model.main, stats, evaluation, quantized


def _table(quantized):
    (node,) = [n for n in quantized.nodes if n.op == "QLookupInterp"]
    return node


def _function(real: float, affine: bool) -> float:
    """HardSwish [then the affine], in float32 by the float graph's own kernels."""
    (y,) = OPS["HardSwish"].kernel({}, np.float32([real]))
    if affine:
        y = np.float32(np.float32(y * np.float32(AFFINE[0])) + np.float32(AFFINE[1]))
    return float(y[0])


def test_the_int16_edge_is_per_channel_with_an_interpolated_table(spread):
    quantized = spread[-1]
    per_channel = {v.name for n in quantized.nodes for v in n.outputs if v.quant and v.quant.axis}
    # the edges into ordinary convs may be per channel too (`test_channel_folding.py`)
    assert {"pw_q", "hs_q"} <= per_channel <= {"c0_q", "pw_q", "hs_q", "dw_q"}
    table = _table(quantized).inputs[1]
    assert table.shape == (CHANNELS, 513) and table.dtype == np.int16
    assert "QLookup" not in {n.op for n in quantized.nodes}


def _every_code(node, inputs: int = 4) -> np.ndarray:
    """The table's output codes [C, 65536] for every input code of every channel, from its
    first `inputs` constant inputs (1: the knots alone, the table before bends and exact
    segments; 2: with the bends)."""
    codes = np.arange(-32768, 32768).astype(np.int16)
    every = np.repeat(codes[None, None, :, None], CHANNELS, axis=1)
    constants = [v.numpy() for v in node.inputs[1 : 1 + inputs]]
    (got,) = OPS["QLookupInterp"].kernel({}, every, *constants)
    return got[0, :, :, 0].astype(np.int64)


def _exact_codes(node, edge) -> np.ndarray:
    """The float function rounded at every input code of every channel [C, 65536] (the
    65536-entry table the interpolated one stands for)."""
    codes = np.arange(-32768, 32768).astype(np.int16)
    rows = []
    for c in range(CHANNELS):
        x, y = channel_of(node.inputs[0].quant, c), channel_of(node.output.quant, c)
        rows.append(function_codes(edge.table, dequantize(codes, x), y, "int16", edge.affine))
    return np.stack(rows).astype(np.int64)


def test_table_and_kernel_equal_their_loop_definitions(spread):
    affine, _, _, evaluation, quantized = spread
    node = _table(quantized)
    x, y = node.inputs[0].quant, node.output.quant
    table, bends, segments, exact = (v.numpy() for v in node.inputs[1:])
    assert segments.shape[1] > 0 and bends.any()  # corners inside segments, curvature

    def rounded(c: int, code: int) -> int:
        real = float(np.float32(code * x.scale[c]))
        q = _round_half_even(Fraction(_function(real, affine)) / Fraction(y.scale[c]))
        return min(max(q, -32768), 32767)

    for c in range(CHANNELS):  # knot k: the function at input code -32768 + 128 k, rounded
        for k in range(513):
            assert table[c, k] == rounded(c, -32768 + 128 * k), (c, k)
        for e, k in enumerate(segments[c]):  # exact segments: every code's rounded value
            if k >= 0:
                for t in range(0, 128, 3):
                    assert exact[c, e, t] == rounded(c, -32768 + 128 * k + t), (c, k, t)
    trace = _trace(quantized, evaluation[5])
    codes, got = trace[node.inputs[0].name][0], trace[node.output.name][0]
    used = {"exact": 0, "bent": 0}
    for c in range(CHANNELS):  # y = exact[c, e, t] where segments[c, e] = k, else
        for i in range(8):  # a + floor((128 (b - a) t - β t (128 - t) + 2^13) / 2^14)
            for j in range(8):
                u = int(codes[c, i, j]) + 32768
                k, t = u // 128, u % 128
                a, b, bend = int(table[c, k]), int(table[c, k + 1]), int(bends[c, k])
                if k in segments[c]:
                    want = exact[c, list(segments[c]).index(k), t]
                    used["exact"] += 1
                else:
                    want = a + (128 * (b - a) * t - bend * t * (128 - t) + 2**13) // 2**14
                    want = min(max(want, -32768), 32767)
                    used["bent"] += bend != 0
                assert got[c, i, j] == want, (c, i, j)
    assert min(used.values()) > 0, used  # the sample reads exact and bent segments


def test_the_table_is_within_1_lsb_of_the_exact_table_on_every_code(spread):
    """Against the float function rounded at every input code (the 65536-entry table), on
    every code of every channel, within 1 LSB: the bends take the curvature, and the segments
    still more than 1 LSB off (corners) are stored exactly, at most EXACT_SEGMENTS per
    channel. The knots alone (the table before bends and exact segments) miss by up to 86 LSB
    at HardSwish's corners (±3, inside a 128-code segment), 192 with the affine, whose output
    steps are up to 10x finer than the input's (there four channels' curvature put 25-83
    segments more than 1 LSB off)."""
    affine, graph, _, _, quantized = spread
    node = _table(quantized)
    (edge,) = depthwise_edges(graph)
    exact = _exact_codes(node, edge)

    def segment_errors(inputs: int) -> np.ndarray:  # [C, 512]: each segment's largest
        difference = np.abs(_every_code(node, inputs) - exact)
        return difference.reshape(CHANNELS, 512, 128).max(axis=2)

    error, bent, old = segment_errors(4), segment_errors(2), segment_errors(1)
    assert error.max() <= 1, error.max(axis=1)
    assert old.max() >= 38 and (old.max(axis=1) >= 5).sum() >= 3, old.max(axis=1)
    assert ((old > 1).sum(axis=1) > EXACT_SEGMENTS).sum() == (4 if affine else 0)
    segments = node.inputs[3].numpy()
    for c in range(CHANNELS):  # exact: the segments the bends leave more than 1 LSB off
        listed = set(segments[c][segments[c] >= 0])
        assert listed == set(np.flatnonzero(bent[c] > 1)), c
        assert len(listed) <= 4  # the corners (a corner near a knot can touch two)


@pytest.mark.parametrize(
    "op, attrs, bounds",
    [
        ("HardSwish", {}, None),
        ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, None),  # corners at ±2.5
        ("Clip", {}, (0.0, 6.0)),  # Relu6
        ("Clip", {}, (-1.3, 0.7)),
        ("Relu", {}, None),
        ("Sigmoid", {}, None),  # no corner: the bends alone
    ],
)
def test_every_table_function_is_within_1_lsb_on_every_code(op, attrs, bounds):
    """Channels whose input steps span 1e-4 to 0.2 (a 128-code segment up to 26 wide in real
    terms, so the corners and most of the curvature fall inside single segments): against the
    full table on every code of every channel, within 1 LSB; the knots alone miss by more
    where a corner or a curve sits inside a segment."""
    graph = Graph("t")
    x = graph.add_input("x", np.float32, (1, 8, 2, 2))
    inputs = [x] + [graph.add_constant(np.float32(b)) for b in (bounds or ())]
    node = graph.make_node(op, inputs, attrs)
    scales = tuple(np.geomspace(1e-4, 0.2, 8))
    x_params = QuantParams(scales, (0,) * 8, 1)
    bounded = op in ("HardSigmoid", "Sigmoid")  # outputs in [0, 1]; others: x's steps
    y_params = QuantParams((1 / 32767,) * 8 if bounded else scales, (0,) * 8, 1)
    table = interpolated_table(node, x_params, y_params)
    codes = np.repeat(np.arange(-32768, 32768).astype(np.int16)[None, None, :, None], 8, axis=1)
    (got,) = OPS["QLookupInterp"].kernel({}, codes, *table)
    (chord,) = OPS["QLookupInterp"].kernel({}, codes, table.knots)
    old = []  # each channel's largest difference with the knots alone
    for c in range(8):
        real = dequantize(codes[0, c, :, 0], channel_of(x_params, c))
        exact = function_codes(node, real, channel_of(y_params, c), "int16").astype(np.int64)
        assert np.abs(got[0, c, :, 0] - exact).max() <= 1, (op, c)
        old.append(int(np.abs(chord[0, c, :, 0] - exact).max()))
    # measured, knots alone: 6-32 LSB with corners (HardSwish, Clip), 142-14720 where the
    # output steps are finer than the input's (HardSigmoid, Sigmoid)
    if op == "Relu":  # its corner is real 0, a knot: the chord was within 1 LSB already
        assert max(old) <= 1, old
    else:
        assert max(old) >= 6, old


def test_int16_per_channel_rises_by_20_db(spread):
    affine, graph, stats, evaluation, quantized = spread
    tensor = _sqnr(graph, _quantized(graph, stats, "int16", "tensor"), evaluation)
    channel = _sqnr(graph, quantized, evaluation)
    # measured: 37.7 -> 72.3 dB (hardswish), 64.0 -> 77.8 (affine)
    assert channel >= tensor + (10 if affine else 30), (tensor, channel)
    assert channel >= 70


def test_qdq_export_is_exact_for_the_table_and_within_one_lsb(spread):
    _, graph, stats, evaluation, _ = spread
    quantized = _quantized(graph, stats, "int16", "channel", output_type="int16")
    node = _table(quantized)
    runtime = _session(Model([node_alone(node)]))
    constants = [v.numpy() for v in node.inputs[1:]]
    assert len(constants) == 4  # knots, bends, exact segments and their codes
    codes = np.arange(-32768, 32768).astype(np.int16).reshape(-1, 1, 1, 8, 8)
    for block in np.repeat(codes, CHANNELS, axis=2):  # every code of every channel
        (theirs,) = runtime.run(None, {node.inputs[0].name: block})
        (ours,) = OPS["QLookupInterp"].kernel({}, block, *constants)
        np.testing.assert_array_equal(theirs, ours)
    for name in ("pw", "dw"):  # per-axis int16 Q/DQ around float convs: within 1 LSB
        conv = _node(quantized, name)
        runtime = _session(Model([node_alone(conv)]))
        for sample in evaluation[:4]:
            trace = _trace(quantized, sample)
            (theirs,) = runtime.run(None, {conv.inputs[0].name: trace[conv.inputs[0].name]})
            diff = np.abs(theirs.astype(np.int64) - trace[conv.output.name])
            assert diff.max() <= 1, name
    ours = Interpreter(quantized).run_batch({"x": evaluation})["y"]
    runtime = _session(Model([quantized]))
    theirs = np.stack([runtime.run(None, {"x": sample})[0] for sample in evaluation])
    diff = np.abs(ours.astype(np.int64) - theirs)  # 1-LSB differences compound end to end
    print("end to end: max", diff.max(), "share within 1 LSB", np.mean(diff <= 1))
    assert diff.max() <= 2 and np.mean(diff <= 1) >= 0.99
    with pytest.raises(ModelError, match="per channel.*'hs"):  # TFLite: per tensor only
        write_circle(Model([quantized]))


def test_int16_for_the_npu_stays_per_tensor_and_on_the_npu(tmp_path, caplog):
    """The TRIX NPU lowers 8-bit per-channel values only (`channel_dtypes`), so an int16 build
    for it keeps the edge per tensor, and says so: one NPU part, bit-exact (per channel, the
    edge ran on the CPU between two NPU parts)."""
    onnx.save(spread_model(affine=True), tmp_path / "m.onnx")
    calib, evaluation = _digits()
    write_npz(tmp_path / "calib.npz", {"x": calib})
    write_npz(tmp_path / "eval.npz", {"x": evaluation[:4]})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\ndtype = "int16"\n'
        'calibration = "calib.npz"\nactivation_granularity = "channel"\n[partition]\n'
        '[codegen]\nhw = "trix-m"\n[pack]\noutput = "out/m.nnpkg"\n'
    )
    build_statuses(recipe)
    warned = [r.getMessage() for r in caplog.records if "stay per tensor" in r.getMessage()]
    assert warned and "per-channel activations in uint8 only" in warned[0]
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["trix"]
    quantized = load_ir(tmp_path / "build/r/quantize.obir").main
    assert _node(quantized, "hs0").output.quant.axis is None


# -- mixed precision -------------------------------------------------------------------------------
def test_mixed_precision_promotes_the_edge_whole_to_int16_per_channel(tmp_path):
    """uint8 per channel holds 40.4 dB; for 50 the search promotes the edge (pointwise conv,
    table with its absorbed Mul and Add, depthwise conv) together, and the edge becomes int16
    per channel with an interpolated table (70.4 dB). Split, it would be per tensor."""
    path = tmp_path / "m.onnx"
    onnx.save(spread_model(affine=True), path)
    calib, evaluation = _digits()
    model = optimize(load_onnx(path))
    stats = calibrate(model.main, [("calibration", {"x": calib})])
    units, members = edge_units(model.main, {n: [n] for n in ("c0", "pw", "hs0", "dw", "y")})
    assert units == {"c0": ["c0"], "pw": ["pw", "hs0", "dw", "hs1", "hs"], "y": ["y"]}
    assert members["pw"] == ["pw", "dw"]  # the table holds the Mul and Add: not measured alone
    mixed = MixedPrecisionOptions(target_sqnr_db=50)
    options = QuantizeOptions(activation_granularity="channel", mixed_precision=mixed)
    quantized = quantize(model, options, stats, [{"x": evaluation[:16]}])
    record = json.loads(quantized.metadata["mixed_precision"])
    assert record["target_met"] and record["sqnr_db"] >= 50
    assert {"pw", "hs0", "hs1", "hs", "dw"} <= set(record["promoted"])
    assert record["high_precision_mac_fraction"] < 1
    table = _node(quantized.main, "hs0")
    assert table.op == "QLookupInterp" and table.output.quant.axis == 1
    assert _node(quantized.main, "c0").output.dtype == np.uint8


def test_an_int16_channel_keeps_its_whole_calibrated_range(spread):
    """int16 per-channel edge values keep each channel's calibrated range, symmetric (no
    narrowing to where an absorbing table's code changes: on the OCR detector that fitted the
    calibration tiles, 39.0 -> 52.3 dB, and lost unseen ones, 39.7 -> 32.3)."""
    affine, graph, stats, _, quantized = spread
    node = _table(quantized)
    (edge,) = depthwise_edges(graph)
    lo, hi = stats.channel_ranges[edge.values[0].name]
    bound = np.asarray(node.inputs[0].quant.scale) * 32767
    widest = 2 * np.maximum(-lo, hi)  # int16 headroom: twice the calibrated magnitude
    if affine:
        assert (bound >= widest * (1 - 1e-6)).all()
    else:  # the last op is the table: its own narrowing (table_ranges.live_range) applies
        assert (bound >= hi).all() and (bound >= np.minimum(-lo, 3.0)).all()
        assert (bound < widest * (1 - 1e-6)).any()


@pytest.mark.parametrize("npu", [False, True])
def test_a_promoted_edge_builds_reports_and_packs_bit_exactly(tmp_path, npu):
    """The recipe form: uint8 per channel with mixed precision (accuracy data: the evaluation
    digits); the report keeps its keys and the edge is promoted whole. Without a codegen
    target it becomes int16 per channel; with the TRIX NPU, which lowers 8-bit per-channel
    values only, int16 per tensor, so the whole model stays on the NPU, bit-exact."""
    onnx.save(spread_model(affine=True), tmp_path / "m.onnx")
    calib, evaluation = _digits()
    write_npz(tmp_path / "calib.npz", {"x": calib})
    write_npz(tmp_path / "eval.npz", {"x": evaluation[:4]})
    write_npz(tmp_path / "test.npz", {"x": evaluation[:16]})
    recipe = tmp_path / "r.toml"
    target = '[partition]\n[codegen]\nhw = "trix-m"\n' if npu else ""
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\ncalibration = "calib.npz"\n'
        'activation_granularity = "channel"\n[quantize.mixed_precision]\ntarget_sqnr_db = 50\n'
        f'[quantize.accuracy]\ndata = "test.npz"\n{target}[pack]\noutput = "out/m.nnpkg"\n'
    )
    build_statuses(recipe)
    report = json.loads((tmp_path / "build/r/quantize.accuracy.json").read_text())
    record = report["mixed_precision"]
    keys = {"target_sqnr_db", "dtype", "promoted", "high_precision_mac_fraction", "sqnr_db"}
    assert keys | {"target_met", "steps", "sensitivity"} <= set(record)
    assert record["target_met"] and {"pw", "hs0", "hs1", "hs", "dw"} <= set(record["promoted"])
    quantized = load_ir(tmp_path / "build/r/quantize.obir").main
    table = _node(quantized, "hs0")
    assert table.output.dtype == np.int16
    assert (table.output.quant.axis is None) == npu  # per channel only where no target refuses
    if npu:
        partition = assert_package_matches_reference(tmp_path)
        assert [p["backend"] for p in partition["parts"]] == ["trix"]


def test_a_dead_int16_channel_gets_a_range_of_at_least_2_to_the_minus_20_of_the_widest():
    """A dead channel (values ~1e-11) on its own range would get a multiplier that flushes to
    zero while its bias, in accumulator units, is ~1e17 (see INT16_MIN_RANGE)."""
    low, high = np.array([-10.0, -1e-11, 0.0]), np.array([6.0, 1e-11, 3.0])
    params = edge_params((low, high), "int16", None)
    floor = 3 * 10.0 * 2.0**-20 / 32767  # the edge headroom triples every range first
    assert params.scale[1] == pytest.approx(floor)
    assert params.scale[0] == pytest.approx(30.0 / 32767)  # live channels keep their range
    assert params.scale[2] == pytest.approx(9.0 / 32767)
    eight = edge_params((low, high), "uint8", None)  # 8-bit keeps each channel's own range
    assert eight.scale[1] == pytest.approx(2e-11 / 255)


def test_an_edge_range_contains_0_before_its_headroom():
    """A channel whose calibrated values are all negative ([-6.1, -0.84] in the layout
    detector, HardSwish after it) keeps them: its range is widened to 0 and then scaled by the
    headroom (3), not scaled to [-18.4, -2.5] (past the data; with a headroom of 4,
    [-24.5, -3.3], where HardSwish is constant, so the table's live range shrank to the 2^-20
    floor: the layout detector fell to 16.8 dB)."""
    seen = []

    def narrow(lo: float, hi: float, c: int) -> tuple[float, float]:
        seen.append((lo, hi))
        return lo, hi

    edge_params((np.array([-6.0, 1.0]), np.array([-0.8, 2.0])), "int16", narrow)
    assert seen == [(-18.0, 0.0), (0.0, 6.0)]


@pytest.mark.parametrize(
    "op, dtype, table",
    [
        ("QLookupInterp", np.int16, (2, 513)),  # rows neither 1 nor the input's channels
        ("QLookupInterp", np.int16, (3, 256)),  # not 513 knots
        ("QLookupInterp", np.uint8, (3, 513)),  # interpolation is int16's
        ("QLookup", np.uint8, (4, 256)),
        ("QLookup", np.uint8, (3, 513)),  # not one entry per uint8 code
    ],
)
def test_a_table_that_does_not_fit_its_input_is_refused(op, dtype, table):
    graph = Graph("t")
    x = graph.add_input("x", dtype, (1, 3, 2, 2))
    with pytest.raises(ValueError, match="does not fit input"):
        graph.make_node(op, [x, graph.add_constant(np.zeros(table, dtype))], {})


@pytest.mark.parametrize(
    "extra",
    [
        [(np.int16, (3, 511))],  # not a bend per segment
        [(np.int16, (3, 512)), (np.int16, (3, 2))],  # segments without their codes
        [(np.int16, (3, 512)), (np.int16, (3, 2)), (np.int16, (3, 3, 128))],  # E differs
        [(np.int16, (3, 512)), (np.int32, (3, 2)), (np.int16, (3, 2, 128))],  # not int16
        [(np.int16, (1, 512)), (np.int16, (1, 2)), (np.int16, (1, 2, 128))],  # rows differ
        [(np.int16, (3, 512)), (np.int16, (3, 2)), (np.int16, (3, 2, 64))],  # 64 codes
    ],
)
def test_bends_and_exact_segments_that_do_not_fit_the_knots_are_refused(extra):
    graph = Graph("t")
    x = graph.add_input("x", np.int16, (1, 3, 2, 2))
    inputs = [graph.add_constant(np.zeros(shape, dtype)) for dtype, shape in extra]
    knots = graph.add_constant(np.zeros((3, 513), np.int16))
    with pytest.raises(ValueError, match="do not fit knots"):
        graph.make_node("QLookupInterp", [x, knots, *inputs], {})


@pytest.mark.parametrize("listed", [[0, 512], [-2, 3], [7, 7]])
def test_exact_segments_out_of_range_or_repeated_are_refused(listed):
    q = np.zeros((1, 1, 2, 2), np.int16)
    segments = np.array([listed], np.int16)
    with pytest.raises(ValueError, match="distinct segment indices 0..511"):
        knots, bends = np.zeros((1, 513), np.int16), np.zeros((1, 512), np.int16)
        OPS["QLookupInterp"].kernel({}, q, knots, bends, segments, np.zeros((1, 2, 128), np.int16))


def test_exact_segments_repeated_are_refused_on_export_naming_the_node():
    from onebuild.graph_ir.serde.onnx_export import export_onnx

    graph = Graph("t")
    x = graph.add_input("x", np.int16, (1, 1, 2, 2))
    constants = [np.zeros((1, 513)), np.zeros((1, 512)), [[3, 3]], np.zeros((1, 2, 128))]
    inputs = [graph.add_constant(np.asarray(a, np.int16)) for a in constants]
    node = graph.make_node("QLookupInterp", [x, *inputs], {}, "hs")
    graph.outputs = [node.output]
    with pytest.raises(ModelError, match="node 'hs' \\(QLookupInterp\\): exact segments"):
        export_onnx(Model([graph]))


def test_quantizations_sharing_a_memo_equal_fresh_ones(spread):
    """Mixed precision's probes share tables and live ranges through `memo`: each graph is
    node for node (content keys: ops, attributes, constants, types) the one a fresh
    quantization gives, whatever the order of the dtypes in between."""
    from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
    from onebuild.graph_ir.quant.probes import node_keys
    from onebuild.graph_ir.quant.quantize_graph import quantize_graph

    _, graph, stats, _, _ = spread
    names = tuple(n.name for n in graph.nodes)
    configs = [
        QuantConfig("uint8", activation_granularity="channel", layers=layers)
        for layers in ((), (LayerOverride(names, "int16"),), (LayerOverride(names[:3], "int16"),))
    ]
    memo: dict = {}
    for config in configs + configs[::-1]:
        args = (graph, stats.ranges_for("uint8"), config, stats.channel_means())
        shared = quantize_graph(*args, channel_ranges=stats.channel_ranges, memo=memo)
        fresh = quantize_graph(*args, channel_ranges=stats.channel_ranges)
        assert node_keys(shared) == node_keys(fresh)
    assert any(key[0] == "table" and key[2] == "QLookupInterp" for key in memo)
    assert any(key[0] == "changes" for key in memo)
