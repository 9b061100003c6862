"""Property: for every model the tests build or ship, running N samples batched gives exactly
(bit for bit) the N single runs, whether the graph is batch-separable or falls back to one
sample at a time; graphs with ops that touch axis 0 either rewrite them for N or fall back."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import conv_bn_relu_model, make_model

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz, write_npz

ROOT = Path(__file__).parent.parent
EXPORTS = ROOT / "tests" / "data" / "torch_exports"
SAMPLES, CHUNK = 5, 3  # chunks of 3 and 2


def assert_batched_equals_single(graph, feeds) -> bool:
    """Bit-for-bit equality of run_batch and per-sample runs; returns whether it batched."""
    interpreter = Interpreter(graph)
    batched = interpreter.run_batch(feeds, chunk=CHUNK)
    for i in range(SAMPLES):
        single = interpreter.run({v.name: feeds[v.name][i] for v in graph.inputs})
        for value in graph.outputs:
            got, want = batched[value.name][i], single[value.name]
            assert got.dtype == want.dtype and got.shape == want.shape, value.name
            assert got.tobytes() == want.tobytes(), f"{value.name}, sample {i}"
    return interpreter.batchable


def random_feeds(graph, rng) -> dict:
    feeds = {}
    for v in graph.inputs:
        shape = (SAMPLES, *v.shape)
        if np.issubdtype(v.dtype, np.integer):
            feeds[v.name] = rng.integers(0, 3, shape).astype(v.dtype)
        else:
            feeds[v.name] = rng.normal(size=shape).astype(v.dtype)
    return feeds


def check_model(model, rng, quantized=False) -> bool:
    """The property before and after O1 (and for the quantized graph); whether it batched."""
    graph = model.main
    feeds = random_feeds(graph, rng)
    batchable = assert_batched_equals_single(graph, feeds)
    run_preset(model)
    assert assert_batched_equals_single(model.main, feeds) or not batchable
    if quantized:
        ranges = calibrate(model.main, feeds).ranges
        one_by_one = calibrate(
            model.main,
            [(f"s{i}", {k: a[i : i + 1] for k, a in feeds.items()}) for i in range(SAMPLES)],
        ).ranges
        assert ranges == one_by_one
        assert_batched_equals_single(quantize_graph(model.main, ranges), feeds)
    return batchable


# -- hand-built graphs: a YOLOv8-style head and every op that mentions axis 0 ------------------
def _i64(*values):
    return np.asarray(values, np.int64)


def yolo_head(rng) -> onnx.ModelProto:
    """YOLOv8's post-processing: '/model.22/Slice' takes axis 0 range 0:1 (and channels 0:2)."""
    anchors = rng.random((1, 2, 20)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["feat"], name="/model.22/cv"),
        helper.make_node("Reshape", ["feat", "dfl_shape"], ["dist"], name="/model.22/Reshape"),
        helper.make_node("Softmax", ["dist"], ["prob"], axis=2, name="/model.22/dfl/Softmax"),
        helper.make_node("ReduceSum", ["prob", "axes2"], ["box"], keepdims=0, name="/model.22/R"),
        helper.make_node(
            "Slice", ["box", "s0", "e0", "a0"], ["lt"], name="/model.22/Slice"
        ),  # axes 0 and 1: [0:1, 0:2]
        helper.make_node("Slice", ["box", "s1", "e1", "a1"], ["rb"], name="/model.22/Slice_1"),
        helper.make_node("Sub", ["anchors", "lt"], ["x1y1"], name="/model.22/Sub"),
        helper.make_node("Add", ["anchors", "rb"], ["x2y2"], name="/model.22/Add"),
        helper.make_node("Add", ["x1y1", "x2y2"], ["s"], name="/model.22/Add_1"),
        helper.make_node("Div", ["s", "two"], ["cxy"], name="/model.22/Div"),
        helper.make_node("Sub", ["x2y2", "x1y1"], ["wh"], name="/model.22/Sub_1"),
        helper.make_node("Concat", ["cxy", "wh"], ["xywh"], axis=1, name="/model.22/Concat"),
        helper.make_node("Mul", ["xywh", "strides"], ["scaled"], name="/model.22/Mul"),
        helper.make_node("Slice", ["x", "s2", "e2", "a1"], ["cls"], name="/model.22/Slice_2"),
        helper.make_node("Reshape", ["cls", "cls_shape"], ["cls2"], name="/model.22/Reshape_1"),
        helper.make_node("Sigmoid", ["cls2"], ["conf"], name="/model.22/Sigmoid"),
        helper.make_node("Concat", ["scaled", "conf"], ["out"], axis=1, name="/model.22/Concat_1"),
        helper.make_node("Transpose", ["out"], ["y"], perm=[0, 2, 1], name="/model.22/T"),
    ]
    inits = [
        ("w", rng.normal(size=(16, 6, 1, 1)).astype(np.float32)),
        ("dfl_shape", _i64(1, 4, 4, 20)),
        ("axes2", _i64(2)),
        ("s0", _i64(0, 0)),
        ("e0", _i64(1, 2)),
        ("a0", _i64(0, 1)),
        ("s1", _i64(2)),
        ("e1", _i64(4)),
        ("a1", _i64(1)),
        ("s2", _i64(2)),
        ("e2", _i64(6)),
        ("cls_shape", _i64(1, 4, 20)),
        ("anchors", anchors),
        ("two", np.asarray(2.0, np.float32)),
        ("strides", rng.random((1, 20)).astype(np.float32)),
    ]
    return make_model(nodes, [("x", [1, 6, 20, 1])], ["y"], inits)


def single_op(op, shape, inputs=(), inits=(), **attrs) -> onnx.ModelProto:
    """x -> Relu -> op(relu, *inputs) -> y; inputs named 'r' are the activation again."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node(op, ["r", *inputs], ["y"], name=f"the_{op}", **attrs),
    ]
    return make_model(nodes, [("x", shape)], ["y"], list(inits))


# (name, model, batches?) for ops whose attributes or operands mention axis 0.
AXIS0_CASES = [
    ("slice_axis0", lambda r: single_op("Slice", [1, 4], ["s", "e", "a"],
        [("s", _i64(0)), ("e", _i64(1)), ("a", _i64(0))]), True),
    ("slice_axis0_reversed", lambda r: single_op("Slice", [1, 4], ["s", "e", "a", "st"],
        [("s", _i64(-1, 3)), ("e", _i64(-9, 0)), ("a", _i64(0, 1)), ("st", _i64(-1, -1))]), True),
    ("slice_axis0_to_end", lambda r: single_op("Slice", [1, 3, 4], ["s", "e"],
        [("s", _i64(0, 1)), ("e", _i64(2**62, 3))]), True),
    ("reshape_squeeze_axis0", lambda r: single_op("Squeeze", [1, 1, 4], ["a"], [("a", _i64(0))]),
        True),
    ("unsqueeze_axis0", lambda r: single_op("Unsqueeze", [1, 4], ["a"], [("a", _i64(0))]), True),
    ("flatten_axis0", lambda r: single_op("Flatten", [1, 3, 4], axis=0), True),
    ("flatten_axis2", lambda r: single_op("Flatten", [1, 3, 4], axis=2), False),
    ("reshape_merge", lambda r: single_op("Reshape", [1, 2, 3], ["s"], [("s", _i64(1, 6))]), True),
    ("expand_same_rank", lambda r: single_op("Expand", [1, 1, 4], ["s"], [("s", _i64(1, 3, 4))]),
        True),
    ("expand_more_rank", lambda r: single_op("Expand", [1, 4], ["s"], [("s", _i64(1, 3, 4))]),
        False),
    ("tile_axis1", lambda r: single_op("Tile", [1, 2], ["t"], [("t", _i64(1, 3))]), True),
    ("gather_axis0_scalar", lambda r: single_op(
        "Gather", [1, 4], ["i"], [("i", np.asarray(0, np.int64))], axis=0), False),
    ("gather_axis0_index_list", lambda r: single_op(
        "Gather", [1, 4], ["i"], [("i", _i64(0))], axis=0), False),
    ("gather_axis1", lambda r: single_op("Gather", [1, 4], ["i"], [("i", _i64(3, 0))], axis=1),
        True),
    ("concat_axis0_with_self", lambda r: single_op("Concat", [1, 4], ["r"], axis=0), False),
    ("concat_axis1_constant", lambda r: single_op(
        "Concat", [1, 2], ["c"], [("c", np.ones((1, 2), np.float32))], axis=1), False),
    ("transpose_moves_axis0", lambda r: single_op("Transpose", [1, 1, 4], perm=[1, 0, 2]), False),
    ("reduce_axis0", lambda r: single_op("ReduceSum", [1, 4], ["a"], [("a", _i64(0))]), False),
    ("reduce_axis1", lambda r: single_op("ReduceMax", [1, 4, 2], axes=[1], keepdims=0), True),
    ("softmax_axis0", lambda r: single_op("Softmax", [1, 4], axis=0), False),
    ("argmax_axis0", lambda r: single_op("ArgMax", [1, 4], axis=0), False),
    ("argmax_axis1", lambda r: single_op("ArgMax", [1, 4], axis=1), True),
    ("pad_axis1_reflect", lambda r: single_op("Pad", [1, 4], ["p"], [("p", _i64(0, 2, 0, 1))],
        mode="reflect"), True),
    ("resize_scales", lambda r: single_op("Resize", [1, 1, 2, 2], ["", "sc"],
        [("sc", np.asarray([1, 1, 2, 2], np.float32))], mode="linear"), True),
    ("resize_sizes", lambda r: single_op("Resize", [1, 1, 2, 2], ["", "", "sz"],
        [("sz", _i64(1, 1, 3, 5))], mode="cubic"), True),
    ("resize_roi", lambda r: single_op("Resize", [1, 1, 4, 4], ["roi", "", "sz"],
        [("roi", np.asarray([0, 0, .1, .1, 1, 1, .9, .8], np.float32)), ("sz", _i64(1, 1, 3, 3))],
        mode="linear", coordinate_transformation_mode="tf_crop_and_resize"), False),
    ("split_axis1", lambda r: make_model(
        [helper.make_node("Split", ["x"], ["y", "z"], axis=1, name="split")],
        [("x", [1, 4])], ["y", "z"]), True),
    ("matmul_both_batched", lambda r: single_op("MatMul", [1, 3, 3], ["r"]), True),
    ("matmul_rank2_right_batched", lambda r: make_model(
        [helper.make_node("MatMul", ["c", "x"], ["y"], name="mm")], [("x", [1, 3])], ["y"],
        [("c", np.ones((2, 1), np.float32))]), False),
    ("matmul_rank2_by_rank3", lambda r: single_op("MatMul", [1, 3], ["c"],
        [("c", np.ones((1, 3, 2), np.float32))]), False),
    ("matmul_vector", lambda r: single_op("MatMul", [1], ["c"],
        [("c", np.ones((1, 1), np.float32))]), False),
    ("gemm_bias_from_input", lambda r: single_op("Gemm", [1, 3], ["c", "r"],
        [("c", np.ones((3, 3), np.float32))]), True),
    ("add_lower_rank_activation", lambda r: make_model(
        [helper.make_node("Reshape", ["x", "s"], ["v"], name="rs"),
         helper.make_node("Add", ["x", "v"], ["y"], name="add")],
        [("x", [1, 1, 4])], ["y"], [("s", _i64(1, 4))]), False),
    ("embedding_gather", lambda r: make_model(
        [helper.make_node("Cast", ["x"], ["i"], to=onnx.TensorProto.INT64, name="cast"),
         helper.make_node("Gather", ["table", "i"], ["y"], axis=0, name="lookup")],
        [("x", [1, 3])], ["y"], [("table", r.normal(size=(3, 2)).astype(np.float32))]), True),
]  # fmt: skip


def test_yolo_head_batches_in_run_calibration_and_quantized_model(rng):
    model = import_onnx(yolo_head(rng))
    assert check_model(model, rng, quantized=True)


@pytest.mark.parametrize("name,build,batches", AXIS0_CASES, ids=[c[0] for c in AXIS0_CASES])
def test_ops_touching_axis0_rewrite_or_fall_back(name, build, batches, rng):
    model = import_onnx(build(rng))
    graph = model.main
    feeds = random_feeds(graph, rng)
    if name == "embedding_gather":
        feeds["x"] = rng.integers(0, 3, (SAMPLES, 1, 3)).astype(np.float32)
    assert assert_batched_equals_single(graph, feeds) == batches


# -- models the tests ship or build ------------------------------------------------------------
def test_digits_example(rng):
    model = load_model(ROOT / "examples" / "digits" / "digits.onnx", {"input": [1, 1, 8, 8]})
    assert check_model(model, rng, quantized=True)


def test_tiny_mobilenet_example(rng):
    assert check_model(load_model(ROOT / "examples" / "models" / "tiny_mobilenet.onnx"), rng)


@pytest.mark.parametrize("path", sorted(EXPORTS.glob("*.onnx")), ids=lambda p: p.stem)
def test_torch_exports(path, rng):
    shape = [1, 3, 32, 32] if path.stem.startswith("cnn") else [1, 5, 32]
    assert check_model(load_model(path, {"x": shape}), rng)


def test_conv_bn_relu_builder(rng):
    assert check_model(import_onnx(conv_bn_relu_model(rng)), rng)


@pytest.mark.parametrize("name,size", [("squeezenet", 32), ("densenet121", 32)])
def test_light_architectures_at_small_sizes(name, size, rng):
    proto = light_model(name, seed=3, expose_logits=True)
    weights = {i.name for i in proto.graph.initializer}
    (data,) = [i for i in proto.graph.input if i.name not in weights]
    dims = data.type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    assert check_model(import_onnx(proto), rng, quantized=name == "squeezenet")


def test_yolo_head_through_the_cli_matches_onnxruntime(tmp_path, rng):
    """`onebuild run` on 16 samples (the issue's failing command) against onnxruntime."""
    path = tmp_path / "yolo.onnx"
    onnx.save(yolo_head(rng), path)
    x = rng.normal(size=(16, 1, 6, 20, 1)).astype(np.float32)
    write_npz(tmp_path / "in.npz", {"x": x})
    argv = ["run", path, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz"]
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *map(str, argv)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    got = read_npz(tmp_path / "out.npz")["y"]
    session = ort.InferenceSession(str(path))
    for i in range(16):
        np.testing.assert_allclose(got[i], session.run(None, {"x": x[i]})[0], rtol=1e-5, atol=1e-5)
