"""The command line, run as a user would: real files, exit codes, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_builders import conv_bn_relu_model, make_model

from onebuild.graph_ir.serde.model_zoo import light_model_path
from onebuild.npz import read_npz, write_npz


def onebuild(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


@pytest.fixture
def model_file(tmp_path, rng):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu_model(rng, dynamic_batch=True), path)
    return path


def test_run_batch_matches_python_api(model_file, tmp_path, rng):
    inputs = tmp_path / "in.npz"
    x = rng.random((5, 1, 3, 8, 8), dtype=np.float32)
    write_npz(inputs, {"x": x})
    result = onebuild("run", model_file, "-i", inputs, "-o", tmp_path / "out.npz")
    assert result.returncode == 0, result.stderr
    out = read_npz(tmp_path / "out.npz")["y"]
    assert out.shape == (5, 1, 10)
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_file))
    for i in range(5):
        np.testing.assert_allclose(out[i], session.run(None, {"x": x[i]})[0], rtol=1e-5, atol=1e-6)


def test_run_ir_file_and_output_is_deterministic(model_file, tmp_path, rng):
    ir = tmp_path / "m.obir"
    assert onebuild("import", model_file, "-o", ir).returncode == 0
    write_npz(tmp_path / "in.npz", {"x": rng.random((2, 1, 3, 8, 8), dtype=np.float32)})
    for name in ("a.npz", "b.npz"):
        assert onebuild("run", ir, "-i", tmp_path / "in.npz", "-o", tmp_path / name).returncode == 0
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_inspect_json(tmp_path):
    result = onebuild("inspect", light_model_path("squeezenet"), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["inputs"] == [{"name": "data_0", "dtype": "float32", "shape": [1, 3, 224, 224]}]
    assert info["ops"]["Conv"] == 26 and info["parameters"] == 1235496


def test_inspect_counts_what_control_flow_holds():
    """A value-dependent If's branches (a 1x1 Conv and an activation each) are in the counts."""
    model = Path(__file__).parent / "data" / "torch_models" / "value_if.onnx"
    info = json.loads(onebuild("inspect", model, "--json").stdout)
    assert info["ops"]["If"] == 1 and info["subgraphs"] == 3  # the main graph and two branches
    assert info["ops"]["Conv"] == 3 and info["ops"]["Tanh"] == info["ops"]["Sigmoid"] == 1
    proto = onnx.load(model).graph
    weights = sum(np.prod(t.dims) for t in proto.initializer if t.data_type == 1)
    threshold = [n for n in proto.node if n.op_type == "Constant"]  # the mean-ink scalar
    # the branches' weights once (initializers of the main graph), not again in each copy
    assert len(threshold) == 1 and info["parameters"] == weights + 1


def test_inspect_text():
    result = onebuild("inspect", light_model_path("resnet50"))
    assert result.returncode == 0
    assert "gpu_0/data_0: float32[1, 3, 224, 224]" in result.stdout
    assert "BatchNormalization" in result.stdout and "parameters:" in result.stdout


def _assert_user_error(result, *fragments):
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_inputs_give_one_line_errors(model_file, tmp_path, rng):
    good = tmp_path / "in.npz"
    write_npz(good, {"x": rng.random((2, 1, 3, 8, 8), dtype=np.float32)})
    out = tmp_path / "out.npz"

    _assert_user_error(
        onebuild("run", tmp_path / "nope.onnx", "-i", good, "-o", out), "nope.onnx", "no such file"
    )
    (tmp_path / "text.onnx").write_text("this is not a model")
    _assert_user_error(
        onebuild("run", tmp_path / "text.onnx", "-i", good, "-o", out),
        "text.onnx",
        "not a valid ONNX model",
    )
    data = model_file.read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    _assert_user_error(onebuild("inspect", tmp_path / "cut.onnx"), "cut.onnx")

    unsupported = make_model(
        [
            onnx.helper.make_node("Unique", ["x"], ["a"], name="e"),
            onnx.helper.make_node("StringNormalizer", ["a"], ["y"], name="sn"),
        ],
        [("x", [2, 2])],
        ["y"],
    )
    onnx.save(unsupported, tmp_path / "unsup.onnx")
    _assert_user_error(
        onebuild("inspect", tmp_path / "unsup.onnx"),
        "Unique",
        "StringNormalizer",
        "node 'e'",
        "node 'sn'",
    )

    write_npz(tmp_path / "missing.npz", {"z": np.zeros((2, 1, 3, 8, 8), np.float32)})
    _assert_user_error(
        onebuild("run", model_file, "-i", tmp_path / "missing.npz", "-o", out),
        "missing.npz",
        "missing input 'x'",
    )
    write_npz(tmp_path / "shape.npz", {"x": np.zeros((2, 1, 3, 9, 8), np.float32)})
    _assert_user_error(
        onebuild("run", model_file, "-i", tmp_path / "shape.npz", "-o", out),
        "shape.npz",
        "input 'x' has shape [2, 1, 3, 9, 8]",
        "[N, 1, 3, 8, 8]",
    )
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object))
    (tmp_path / "obj.npz").write_bytes((tmp_path / "obj.npy").read_bytes())
    _assert_user_error(
        onebuild("run", model_file, "-i", tmp_path / "obj.npz", "-o", out), "obj.npz"
    )
    assert not out.exists()


def test_an_index_out_of_range_in_the_data_is_a_user_error(tmp_path):
    """A token id beyond an embedding table is the data's fault: one line naming the node,
    exit 2 (it was an internal error, exit 1)."""
    table = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")],
        "embedding",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 3])],
        [table],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    write_npz(tmp_path / "in.npz", {"ids": np.array([[[1, 9]]], np.int64)})
    result = onebuild(
        "run", tmp_path / "m.onnx", "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz"
    )
    _assert_user_error(result, "node 'embed' (Gather)", "index out of range [-4, 3]")


def test_bad_option_exits_2(model_file):
    result = onebuild("inspect", model_file, "--input-shape", "x:1,2")
    assert result.returncode == 2 and "NAME=D0,D1" in result.stderr


@pytest.mark.parametrize("raw", [[], ["--raw"]], ids=["float", "raw"])
def test_non_finite_inputs_to_a_float_model_give_one_warning_line(model_file, tmp_path, rng, raw):
    """IEEE arithmetic carries NaN/Inf through a float model: the outputs say so in one line,
    without numpy's RuntimeWarnings (code locations) on the terminal."""
    x = rng.random((2, 1, 3, 8, 8), dtype=np.float32)
    x[0, 0, 0, 0, 0], x[1, 0, 1, 2, 3] = np.nan, np.inf
    np.savez(tmp_path / "in.npz", x=x)
    result = onebuild("run", model_file, "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz", *raw)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "dynamic batch dim" not in line]
    assert lines == [f"onebuild: warning: {tmp_path / 'in.npz'}: output(s) y hold NaN or Inf"]


@pytest.mark.parametrize(
    "command, mentions",
    [
        (["run", "{m}", "-i", "{data}", "-o", "{data}"], "own input"),
        (["run", "{m}", "-i", "{data}", "-o", "{m}"], "writes .npz"),
        (["import", "{m}", "-o", "{data}"], "writes .obir"),
        (["export", "{m}", "-o", "{tmp}/notes.toml"], "writes .onnx or .circle or .tflite"),
        (["import", "{m}", "-o", "{m}"], "writes .obir"),
    ],
)
def test_an_output_that_would_overwrite_an_input_or_another_kind_is_refused(
    model_file, tmp_path, rng, command, mentions
):
    data = tmp_path / "in.npz"
    write_npz(data, {"x": rng.random((2, 1, 3, 8, 8), dtype=np.float32)})
    (tmp_path / "notes.toml").write_text("mine")
    before = {p: p.read_bytes() for p in (data, model_file, tmp_path / "notes.toml")}
    args = [a.format(m=model_file, data=data, tmp=tmp_path) for a in command]
    result = onebuild(*args)
    assert result.returncode == 2 and mentions in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in before} == before  # nothing of the user's touched


def test_partition_backends_must_name_the_targets_backend(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[quantize]\nrandom_calibration = true\n'
        '[partition]\nbackends = ["npu", "cpu"]\n[codegen]\n'
    )
    (tmp_path / "m.onnx").write_bytes(b"")
    result = onebuild("list", recipe)
    assert result.returncode == 2
    assert "target 'trix_sim' runs on the backend 'trix' (got 'npu')" in result.stderr
