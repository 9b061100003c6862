"""Activation-only promotion: a layer computing in uint8 (uint8 inputs, int8 weights, int32
sums) that writes int16, and the mixed-precision search that uses it (`promote_outputs`).

On the trained digits CNN and its real images: the kernel against onnxruntime's ConvInteger and
a definition of the requantization in Python integers, the search against the layer-only one,
the QDQ export layer by layer in onnxruntime, and a build on the TRIX NPU, bit-exact.
"""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_mixed_precision import DIGITS, SHAPES, _quantized_db, decoy_digits, outlier_digits
from test_partition import assert_package_matches_reference, build_statuses
from test_qdq_export import session

from onebuild import compile as api
from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.errors import OneBuildError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model, node_alone
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_ir, load_model
from onebuild.npz import read_npz


def _digits(path: Path = DIGITS / "digits.onnx"):
    model = load_model(path, SHAPES)
    run_preset(model)
    ranges = calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz")).ranges
    return model.main, ranges


def _trace(graph, x: np.ndarray) -> dict[str, np.ndarray]:
    trace = {}
    Interpreter(graph, observer=lambda v, a: trace.__setitem__(v.name, a)).run({"input": x})
    return trace


def _conv_integer(x: np.ndarray, w: np.ndarray, x_zero_point: int, attrs) -> np.ndarray:
    """onnxruntime's ConvInteger: the int32 sums of (x - zp) * w."""
    node = helper.make_node(
        "ConvInteger",
        ["x", "w", "zp"],
        ["y"],
        pads=list(attrs["pads"]),
        strides=list(attrs["strides"]),
        dilations=list(attrs["dilations"]),
        group=int(attrs["group"]),
    )
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape),
        helper.make_tensor_value_info("w", TensorProto.INT8, w.shape),
        helper.make_tensor_value_info("zp", TensorProto.UINT8, []),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    model = helper.make_model(
        helper.make_graph([node], "g", inputs, [output]),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    model.ir_version = 10
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return runtime.run(None, {"x": x, "w": w, "zp": np.array(x_zero_point, np.uint8)})[0]


def _requantized(acc: int, multiplier: int, shift: int, zero_point: int, lo: int, hi: int):
    """round half to even of acc * m / 2^r, plus the zero point, clamped: in Python integers."""
    exact = Fraction(acc * multiplier, 1 << shift)
    return min(max(round(exact) + zero_point, lo), hi)  # round(): half to even


def test_a_uint8_conv_writing_int16_matches_conv_integer_and_the_definition():
    graph, ranges = _digits()
    override = LayerOverride(("conv2",), output_dtype="int16")
    mixed = quantize_graph(graph, ranges, QuantConfig(layers=(override,)))
    conv = next(n for n in mixed.nodes if n.name == "conv2")
    x, w, b = conv.inputs
    assert (x.dtype, w.dtype, b.dtype, conv.output.dtype) == (
        np.uint8,
        np.int8,
        np.int32,
        np.int16,
    )
    images = read_npz(DIGITS / "data" / "test.npz")["input"][:4]
    for image in images:
        trace = _trace(mixed, image)
        codes = trace[x.name]
        sums = _conv_integer(codes, w.numpy(), conv.attrs["x_zero_point"], conv.attrs)
        sums = sums.astype(np.int64) + b.numpy().reshape(1, -1, 1, 1)
        a = conv.attrs
        want = np.array(
            [
                _requantized(
                    int(s),
                    a["multiplier"][c],
                    a["shift"][c],
                    a["y_zero_point"],
                    a["qmin"],
                    a["qmax"],
                )
                for (_, c, _, _), s in np.ndenumerate(sums)
            ]
        ).reshape(sums.shape)
        np.testing.assert_array_equal(trace[conv.output.name], want)
    # the int16 output keeps what uint8 rounds away: against the exact sums in real units
    # (s_x s_w[c] per code, clamped as the fused Relu does), the output's rounding error is
    # over 1000x smaller than in uint8
    plain = quantize_graph(graph, ranges, QuantConfig())

    def rounding_error(quantized) -> float:
        node = next(n for n in quantized.nodes if n.name == "conv2")
        x, w, b = node.inputs
        steps = np.asarray(b.quant.scale).reshape(1, -1, 1, 1)
        total = 0.0
        for image in images:
            trace = _trace(quantized, image)
            sums = _conv_integer(trace[x.name], w.numpy(), node.attrs["x_zero_point"], node.attrs)
            real = (sums + b.numpy().reshape(1, -1, 1, 1)) * steps
            a, y = node.attrs, node.output.quant
            low, high = ((a[k] - a["y_zero_point"]) * y.scale[0] for k in ("qmin", "qmax"))
            got = (trace[node.output.name] - a["y_zero_point"]) * y.scale[0]
            total += float(np.square(got - np.clip(real, low, high)).sum())  # fused Relu
        return total

    assert rounding_error(mixed) < rounding_error(plain) / 1000


def test_output_dtype_is_checked():
    graph, ranges = _digits()
    pool = next(n for n in graph.nodes if n.op == "MaxPool").name
    with pytest.raises(UserError, match=rf"layers\[0\]: output_dtype applies to Conv.*'{pool}'"):
        quantize_graph(
            graph, ranges, QuantConfig(layers=(LayerOverride((pool,), None, None, "int16"),))
        )
    with pytest.raises(UserError, match="output_dtype must be a quantized dtype"):
        quantize_graph(
            graph, ranges, QuantConfig(layers=(LayerOverride(("conv1",), output_dtype="float32"),))
        )
    with pytest.raises(OneBuildError, match="promote_outputs: needs dtype 'int16'"):
        MixedPrecisionOptions(dtype="float32", promote_outputs=True)
    from onebuild.recipe import load_recipe

    keys = ["target_sqnr_db=30", "promote_outputs=true", "dtype=float32"]
    overrides = [f"quantize.mixed_precision.{key}" for key in keys]
    with pytest.raises(OneBuildError, match="promote_outputs needs mixed_precision.dtype 'int16'"):
        load_recipe(DIGITS.parent / "digits.toml", overrides)


def _search(path: Path, promote_outputs: bool):
    options = MixedPrecisionOptions(target_sqnr_db=30, promote_outputs=promote_outputs)
    model, held_out_db = _quantized_db(path, options)
    return model, json.loads(model.metadata["mixed_precision"]), held_out_db


def test_the_search_promotes_an_output_where_that_is_cheaper(tmp_path):
    """The decoy digits CNN: conv2's outlier channels, written in uint8, lose their codes; the
    layer search promotes conv2 and the classifier (80.5 % of the MACs). conv2 can keep uint8
    inputs and int8 weights and write int16: the classifier alone is then promoted (2.7 %)."""
    path = decoy_digits(tmp_path / "decoy.onnx")
    _, layers, _ = _search(path, False)
    model, record, held_out_db = _search(path, True)
    assert record["target_met"] and held_out_db >= 30
    assert "conv2" in record["promoted_outputs"] and "conv2" not in record["promoted"]
    assert (
        record["high_precision_mac_fraction"] < 0.05 < 0.8 < layers["high_precision_mac_fraction"]
    )
    nodes = {n.name: n for n in model.main.nodes}
    conv2 = nodes["conv2"]
    assert (conv2.inputs[0].dtype, conv2.inputs[1].dtype, conv2.output.dtype) == (
        np.uint8,
        np.int8,
        np.int16,
    )
    assert record["steps"][-1]["promoted_outputs"] == len(record["promoted_outputs"])
    # deterministic: the same search, the same record
    assert _search(path, True)[1] == record


def test_outlier_channels_need_their_reader_promoted_not_their_producer(tmp_path):
    """conv1's small channels, written in int16 by a uint8 conv1, reach conv2, which reads
    int16: conv1's MACs stay 8-bit (97.3 -> 77.8 % of the MACs)."""
    path = outlier_digits(tmp_path / "outlier.onnx")
    _, record, held_out_db = _search(path, True)
    assert record["target_met"] and held_out_db >= 30
    assert "conv1" in record["promoted_outputs"] and "conv2" in record["promoted"]
    assert record["high_precision_mac_fraction"] < 0.8


@pytest.mark.parametrize(
    "make, written_ops", [(decoy_digits, {"QConv"}), (outlier_digits, {"QConv", "QGemm"})]
)
def test_qdq_export_of_uint8_layers_writing_int16_runs_in_onnxruntime(make, written_ops, tmp_path):
    model, record, _ = _search(make(tmp_path / "m.onnx"), True)
    graph = model.main
    written = [n for n in graph.nodes if n.name in record["promoted_outputs"]]
    assert {n.op for n in written} == written_ops
    assert all((n.inputs[0].dtype, n.output.dtype) == (np.uint8, np.int16) for n in written)
    images = read_npz(DIGITS / "data" / "test.npz")["input"][:8]
    for image in images:
        trace = _trace(graph, image)
        for node in [n for n in graph.nodes if n.op.startswith("Q") and n.op != "QuantizeLinear"]:
            single = node_alone(node)
            (theirs,) = session(Model([single])).run(
                None, {v.name: trace[v.name] for v in single.inputs}
            )
            ours = trace[node.output.name]
            assert theirs.dtype == ours.dtype, node.name
            gap = np.abs(ours.astype(np.int64) - theirs.astype(np.int64)).max()
            assert gap <= 1, (node.name, gap)
    whole = session(model)
    logits = np.stack([whole.run(None, {"input": x})[0] for x in images])
    want = Interpreter(graph).run_batch({"input": images})["logits"]
    np.testing.assert_allclose(logits, want, atol=0.05 * np.abs(want).max())


def _project(folder: Path, make, quantize_keys: str, target: float) -> Path:
    import shutil

    shutil.copytree(DIGITS / "data", folder / "data")
    make(folder / "m.onnx")
    recipe = folder / "r.toml"
    recipe.write_text(
        f"""
[import]
source = "m.onnx"
input_shapes = {{ input = [1, 1, 8, 8] }}
[optimize]
[quantize]
calibration = "data/calib.npz"
{quantize_keys}
[quantize.mixed_precision]
target_sqnr_db = {target}
promote_outputs = true
[partition]
[codegen]
hw = "trix-m"
[pack]
output = "out/m.nnpkg"
"""
    )
    samples = np.load(folder / "data/test.npz")
    np.savez(folder / "eval.npz", input=samples[samples.files[0]][:8])
    return recipe


def test_a_build_with_promoted_outputs_is_bit_exact_on_the_npu(tmp_path):
    recipe = _project(tmp_path, decoy_digits, "", 30)
    statuses = build_statuses(recipe)
    assert statuses["quantize"] == "run"
    quantized = load_ir(tmp_path / "build/r/quantize.obir")
    record = json.loads(quantized.metadata["mixed_precision"])  # the recipe key reached it
    assert "conv2" in record["promoted_outputs"] and "conv2" not in record["promoted"]
    conv2 = next(n for n in quantized.main.nodes if n.name == "conv2")
    assert (conv2.inputs[0].dtype, conv2.output.dtype) == (np.uint8, np.int16)
    partition = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in partition["parts"]] == ["trix"]  # two element sizes, one conv


def test_an_int16_edge_written_by_a_uint8_conv_packs_bit_exact(tmp_path):
    """The edge model built for trix_sim: the target lowers per-channel edges in uint8 only
    (`channel_dtypes`), so the promoted edge is int16 per tensor, written by the uint8
    pointwise conv; one NPU part, bit-exact."""
    recipe = _project(tmp_path, edge_model, 'activation_granularity = "channel"', 45)
    build_statuses(recipe)
    quantized = load_ir(tmp_path / "build/r/quantize.obir")
    assert "pointwise" in json.loads(quantized.metadata["mixed_precision"])["promoted_outputs"]
    pointwise = next(n for n in quantized.main.nodes if n.name == "pointwise")
    assert (pointwise.inputs[0].dtype, pointwise.output.dtype) == (np.uint8, np.int16)
    partition = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in partition["parts"]] == ["trix"]


def test_circle_export_refuses_a_uint8_layer_writing_int16_in_one_line():
    """onert 0.1.0 refuses such a CONV_2D when loading, LiteRT when preparing (output type
    must be the input's), so the writer says so instead of writing a file neither runs."""
    from onebuild.graph_ir.serde import write_circle

    graph, ranges = _digits()
    override = LayerOverride(("conv2",), output_dtype="int16")
    model = Model([quantize_graph(graph, ranges, QuantConfig(layers=(override,)))])
    for fmt in ("circle", "tflite"):
        with pytest.raises(
            OneBuildError, match=r"1 node\(s\) compute in 8 bits and write int16.*'conv2'"
        ) as error:
            write_circle(model, fmt)
        assert "\n" not in str(error.value)


def edge_model(path: Path) -> Path:
    """Digits through a blur (conv1: 32 channels), a heavy pointwise conv (64 % of the MACs),
    HardSwish and a light depthwise Laplacian (a high-pass: it amplifies its input's rounding
    against a smooth signal), pooled into 10 logits: the edge pointwise -> HardSwish ->
    depthwise (per channel) needs int16 for 45 dB, the pointwise conv's own MACs do not."""
    rng = np.random.default_rng(0)
    blur = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]]) / 16
    laplacian = np.array([[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]])
    weights = {
        "c1": rng.uniform(0.2, 1, (32, 1, 1, 1)) * blur,
        "pw": rng.normal(0, 0.3, (32, 32, 1, 1)),
        "pwb": np.full(32, 20.0),
        "lap": np.tile(laplacian[None, None], (32, 1, 1, 1)),
        "fc": rng.normal(0, 0.3, (10, 32)),
    }
    same = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["input", "c1"], ["a"], name="conv1", **same),
        helper.make_node("Relu", ["a"], ["b"], name="relu1"),
        helper.make_node("Conv", ["b", "pw", "pwb"], ["c"], name="pointwise"),
        helper.make_node("HardSwish", ["c"], ["d"], name="hswish"),
        helper.make_node("Conv", ["d", "lap"], ["e"], group=32, name="depthwise", **same),
        helper.make_node("Relu", ["e"], ["f"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["f"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["h"], name="flatten"),
        helper.make_node("Gemm", ["h", "fc"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "edge",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _channel_search(path: Path, promote_outputs: bool, target: float = 45):
    reference = optimize(load_model(path, SHAPES))
    specs = [(v.name, v.shape) for v in reference.main.inputs]
    stats = api.calibrate(reference.main, iter_batches(DIGITS / "data/calib.npz", specs))
    samples = first_samples(DIGITS / "data/calib.npz", specs, 16)
    mixed = MixedPrecisionOptions(target_sqnr_db=target, promote_outputs=promote_outputs)
    options = QuantizeOptions(mixed_precision=mixed, activation_granularity="channel")
    model = quantize(optimize(load_model(path, SHAPES)), options, stats, samples)
    test = list(iter_batches(DIGITS / "data/test.npz", specs))
    held_out = compare_graphs(reference.main, model.main, test).outputs["logits"]["sqnr_db"]
    return model, json.loads(model.metadata["mixed_precision"]), held_out


def test_a_heavy_pointwise_conv_keeps_8_bit_macs_and_writes_its_edge_in_int16(tmp_path):
    """Edges promoted whole (the layer search) put the pointwise conv in int16 with its edge:
    81.7 % of the MACs. With promote_outputs the edge (HardSwish and the depthwise conv) is
    one unit and its producer another: the pointwise conv reads uint8 with int8 weights and
    writes int16 per channel into the int16 edge (17.9 %)."""
    path = edge_model(tmp_path / "edge.onnx")
    _, whole, _ = _channel_search(path, False)
    assert {"pointwise", "depthwise"} <= set(whole["promoted"])
    assert whole["high_precision_mac_fraction"] > 0.8
    model, record, held_out_db = _channel_search(path, True)
    assert record["target_met"] and held_out_db >= 45
    assert "pointwise" in record["promoted_outputs"] and "depthwise" in record["promoted"]
    assert record["high_precision_mac_fraction"] < 0.2
    nodes = {n.name: n for n in model.main.nodes}
    pointwise, table = nodes["pointwise"], nodes["hswish"]
    assert (pointwise.inputs[0].dtype, pointwise.inputs[1].dtype) == (np.uint8, np.int8)
    out = pointwise.output
    assert out.dtype == np.int16 and out.quant.axis == 1 and len(out.quant.scale) == 32
    assert table.inputs[0] is out and nodes["depthwise"].inputs[0].dtype == np.int16
    # each layer in onnxruntime, from the QDQ export, within 1 LSB
    images = read_npz(DIGITS / "data" / "test.npz")["input"][:4]
    for image in images:
        trace = _trace(model.main, image)
        for node in (pointwise, table, nodes["depthwise"]):
            single = node_alone(node)
            feeds = {v.name: trace[v.name] for v in single.inputs}
            (theirs,) = session(Model([single])).run(None, feeds)
            gap = np.abs(trace[node.output.name].astype(np.int64) - theirs.astype(np.int64))
            assert gap.max() <= 1, node.name


def _pointwise_edge_graph(rng):
    """x -> Conv 1x1 (channels spanning 300x) -> HardSwish -> depthwise 3x3 -> Conv 1x1,
    with smooth calibration images (sums of sines)."""
    from onebuild.graph_ir.ir import Graph

    graph = Graph("edge")
    x = graph.add_input("x", np.float32, (1, 3, 9, 11))
    gamma = rng.permutation(np.geomspace(1 / 17, 17, 8))

    def conv(name, value, weights, group=1, pad=0):
        w = graph.add_constant(weights.astype(np.float32))
        b = graph.add_constant(rng.normal(0, 0.1, len(weights)).astype(np.float32))
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [pad] * 4, "group": group}
        return graph.make_node("Conv", [value, w, b], attrs, name).output

    mid = conv("pointwise", x, rng.normal(0, 0.5, (8, 3, 1, 1)) * gamma[:, None, None, None])
    mid = graph.make_node("HardSwish", [mid], name="hswish").output
    taps = rng.normal(0, 0.5, (8, 1, 3, 3)) / gamma[:, None, None, None]
    mid = conv("depthwise", mid, taps, group=8, pad=1)
    graph.outputs = [conv("last", mid, rng.normal(0, 0.4, (5, 8, 1, 1)))]
    rows, cols = np.meshgrid(np.arange(9), np.arange(11), indexing="ij")
    phases = rng.uniform(0, 2 * np.pi, (8, 3, 1, 1))
    images = np.sin(0.7 * rows + phases) * np.cos(0.5 * cols - phases)
    return graph, calibrate(graph, {"x": images[:, None].astype(np.float32)})


@pytest.mark.parametrize(
    "granularity, overrides, widths",
    [
        # a uint8 pointwise conv writing int16 into an int16 edge (per tensor)
        (
            "tensor",
            (
                LayerOverride(("pointwise",), output_dtype="int16"),
                LayerOverride(("hswish", "depthwise"), "int16"),
            ),
            (1, 2),
        ),
        # an int16 pointwise conv writing its uint8 per-channel edge (a demoted output)
        (
            "channel",
            (LayerOverride(("pointwise",), "int16", output_dtype="uint8"),),
            (2, 1),
        ),
    ],
)
def test_the_npu_lowers_a_conv_with_two_element_sizes_bit_exact(
    granularity, overrides, widths, rng
):
    from test_trix_ops import check

    graph, stats = _pointwise_edge_graph(rng)
    config = QuantConfig(
        "uint8",
        input_type="uint8",
        output_type="uint8",
        layers=overrides,
        activation_granularity=granularity,
        channel_dtypes=("uint8",),
    )
    quantized = quantize_graph(
        graph, stats.ranges_for("uint8"), config, channel_ranges=stats.channel_ranges
    )
    pointwise = next(n for n in quantized.nodes if n.name == "pointwise")
    sizes = (pointwise.inputs[0].dtype.itemsize, pointwise.output.dtype.itemsize)
    assert sizes == widths
    assert (pointwise.output.quant.axis is not None) == (granularity == "channel")
    check(quantized, rng)  # both presets, tiled to the smallest SRAM, through the .tvn file
