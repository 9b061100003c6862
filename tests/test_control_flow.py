"""`If` at import: folded when its condition is known once shapes are fixed, or once inputs are
pinned to constants (`[import] constants`); otherwise imported as control flow (an IR If, see
test_control_flow_ir.py). Outputs match onnxruntime running the unfolded model."""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onebuild.errors import UnsupportedOpsError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx


def _branch(name: str, op: str, factor: float) -> onnx.GraphProto:
    k = numpy_helper.from_array(np.array(factor, np.float32), f"{name}_k")
    nodes = [
        helper.make_node("Mul", ["x", f"{name}_k"], [f"{name}_m"], name=f"{name}_mul"),
        helper.make_node(op, [f"{name}_m"], [f"{name}_y"], name=f"{name}_op"),
    ]
    out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [out], [k])


def _model(nodes, inputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        list(initializers),
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def shape_if_model() -> onnx.ModelProto:
    """Relu(2x) when the input is wider than 16, else Sigmoid(3x): an exporter's shape check."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "three"], ["w"], axis=0, name="width"),
        helper.make_node("Greater", ["w", "sixteen"], ["wide"], name="is_wide"),
        helper.make_node(
            "If", ["wide"], ["y"], name="cond",
            then_branch=_branch("then", "Relu", 2.0), else_branch=_branch("else", "Sigmoid", 3.0),
        ),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    consts = [
        numpy_helper.from_array(np.array(3, np.int64), "three"),
        numpy_helper.from_array(np.array(16, np.int64), "sixteen"),
    ]
    return _model(nodes, [x], consts)


def rate_if_model() -> onnx.ModelProto:
    """A voice-activity detector's pattern: the branch depends on the sample-rate input."""
    nodes = [
        helper.make_node("Equal", ["sr", "k16000"], ["is16k"], name="is_16k"),
        helper.make_node(
            "If", ["is16k"], ["y"], name="by_rate",
            then_branch=_branch("then", "Relu", 2.0), else_branch=_branch("else", "Tanh", 0.5),
        ),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    return _model(nodes, [x, sr], [numpy_helper.from_array(np.array(16000, np.int64), "k16000")])


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


@pytest.mark.parametrize("width", [8, 32])
def test_a_shape_only_if_folds_to_the_branch_it_takes(tmp_path, rng, width):
    model = shape_if_model()
    onnx.save(model, tmp_path / "m.onnx")
    ir = load_onnx(tmp_path / "m.onnx", {"x": [1, 3, 4, width]})
    assert "If" not in {n.op for n in ir.main.nodes}
    expected_op = "Relu" if width > 16 else "Sigmoid"
    assert expected_op in {n.op for n in ir.main.nodes}
    x = rng.normal(size=(1, 3, 4, width)).astype(np.float32)
    got = Interpreter(ir.main).run({"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-6, atol=1e-7)


def test_a_value_dependent_if_folds_once_its_input_is_pinned(tmp_path, rng):
    model = rate_if_model()
    onnx.save(model, tmp_path / "m.onnx")
    dynamic = load_onnx(tmp_path / "m.onnx")
    assert "If" in {n.op for n in dynamic.main.nodes}
    x = rng.normal(size=(1, 4)).astype(np.float32)
    for rate in (16000, 8000):
        ir = load_onnx(tmp_path / "m.onnx", input_values={"sr": rate})
        assert [v.name for v in ir.main.inputs] == ["x"]
        assert "If" not in {n.op for n in ir.main.nodes}
        expected = _ort(model, {"x": x, "sr": np.array(rate, np.int64)})
        got = Interpreter(ir.main).run({"x": x})["y"]
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        feeds = {"x": x, "sr": np.array(rate, np.int64)}
        np.testing.assert_allclose(Interpreter(dynamic.main).run(feeds)["y"], expected, 1e-6)


def test_a_recipe_pins_an_input_with_constants(tmp_path):
    onnx.save(rate_if_model(), tmp_path / "m.onnx")
    recipe = tmp_path / "r.toml"
    recipe.write_text('[import]\nsource = "m.onnx"\nconstants = { sr = 16000 }\n[optimize]\n')
    command = [sys.executable, "-m", "onebuild.cli", "build", str(recipe)]
    assert subprocess.run(command, capture_output=True).returncode == 0
    recipe.write_text('[import]\nsource = "m.onnx"\n[optimize]\n')  # the If stays
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_unsupported_ops_inside_an_if_are_still_listed(tmp_path):
    inner = helper.make_graph(
        [helper.make_node("Unique", ["x"], ["h"], name="unique1")], "b", [],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("Greater", ["x", "x"], ["c"], name="c"),
        helper.make_node("If", ["c"], ["y"], name="cond", then_branch=inner, else_branch=inner),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedOpsError, match=r"Unique \(node 'unique1' in If 'cond'"):
        load_onnx(tmp_path / "m.onnx")
