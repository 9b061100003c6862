"""What a model declares is read as ONNX means it: -1 and 0 dims are dynamic, unsupported
operators are found inside subgraphs too, and graph output names are kept exactly."""

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_builders import make_model

from onebuild.errors import UnsupportedOpsError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz, write_npz


def onebuild(*args):
    return subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *map(str, args)], capture_output=True, text=True
    )


def minus_one_model(rng, dims=(-1, 3, -1, -1)) -> onnx.ModelProto:
    """Conv -> Relu -> GlobalAveragePool -> Flatten with an input declared `dims`."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["y"], name="flat"),
    ]
    inits = [
        ("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32)),
        ("b", rng.normal(size=4).astype(np.float32)),
    ]
    return make_model(nodes, [("x", list(dims))], ["y"], inits)


@pytest.mark.parametrize("dims", [(-1, 3, -1, -1), (0, 3, 0, -5), (-1, 3, "h", None)])
def test_minus_one_dims_are_dynamic_in_load_model(tmp_path, rng, dims):
    path = tmp_path / "m.onnx"
    proto = minus_one_model(rng, dims)
    onnx.save(proto, path)
    model = load_model(path, {"x": [1, 3, 48, 192]})
    assert model.main.inputs[0].shape == (1, 3, 48, 192)
    x = rng.random((1, 3, 48, 192), dtype=np.float32)
    run_preset(model)
    if 0 in dims:  # onnxruntime reads a 0 dim as fixed and rejects the input
        for dim in proto.graph.input[0].type.tensor_type.shape.dim:
            dim.dim_value = -1 if dim.dim_value == 0 else dim.dim_value
        onnx.save(proto, path)
    (expected,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    got = Interpreter(model.main).run({"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_minus_one_dims_through_the_cli(tmp_path, rng):
    path = tmp_path / "m.onnx"
    onnx.save(minus_one_model(rng), path)
    x = rng.random((3, 1, 3, 48, 192), dtype=np.float32)
    write_npz(tmp_path / "in.npz", {"x": x})
    shape = ["--input-shape", "x=1,3,48,192"]
    result = onebuild("run", path, *shape, "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz")
    assert result.returncode == 0, result.stderr
    got = read_npz(tmp_path / "o.npz")["y"]
    session = ort.InferenceSession(str(path))
    for i in range(3):
        np.testing.assert_allclose(got[i], session.run(None, {"x": x[i]})[0], rtol=1e-5, atol=1e-6)
    result = onebuild("import", path, *shape, "-o", tmp_path / "m.obir")
    assert result.returncode == 0, result.stderr
    result = onebuild("inspect", tmp_path / "m.obir", "--json")
    assert json.loads(result.stdout)["inputs"][0]["shape"] == [1, 3, 48, 192]


def test_minus_one_dims_need_input_shapes_except_the_batch(rng):
    with pytest.raises(UserError, match="dynamic dim '-1' on axis 2"):
        import_onnx(minus_one_model(rng))
    with pytest.raises(UserError, match="axis 1 to 4, but the model fixes it to 3"):
        import_onnx(minus_one_model(rng), input_shapes={"x": [1, 4, 8, 8]})
    with pytest.raises(UserError, match="axis 2 to -3; sizes must not be negative"):
        import_onnx(minus_one_model(rng), input_shapes={"x": [1, 3, -3, 8]})


def _unsupported_branch(name: str, node: str) -> onnx.GraphProto:
    nodes = [
        helper.make_node("Unique", ["x"], ["h"], name=node),
        helper.make_node("Identity", ["h"], ["out"], name=f"{name}_id"),
    ]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [out])


def test_unsupported_ops_inside_subgraphs_are_listed_with_their_path():
    loop_body = helper.make_graph(
        [helper.make_node("StringNormalizer", ["x"], ["e"], name="deep")],
        "body",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    else_branch = _unsupported_branch("else", "lstm2")
    else_branch.node.append(helper.make_node("Loop", ["", ""], ["l"], body=loop_body, name="loop"))
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="ok"),
        helper.make_node(
            "If",
            ["c"],
            ["y"],
            then_branch=_unsupported_branch("then", "lstm1"),
            else_branch=else_branch,
            name="cond",
        ),
    ]
    proto = make_model(nodes, [("x", [1, 2, 2]), ("c", [])], ["y"])
    with pytest.raises(UnsupportedOpsError) as error:
        import_onnx(proto, "m.onnx")
    message = str(error.value)
    assert "If (node 'cond')" not in message and "Loop (node" not in message  # both imported
    assert "Unique (node 'lstm1' in If 'cond'.then_branch)" in message
    assert "Unique (node 'lstm2' in If 'cond'.else_branch)" in message
    assert "StringNormalizer (node 'deep' in If 'cond'.else_branch / Loop 'loop'.body)" in message
    assert "StringNormalizer, Unique" in message
    assert "\n" not in message
    assert len(error.value.unsupported) == 3


def _relu(out="y"):
    return helper.make_node("Relu", ["x"], [out], name="r")


OUTPUT_NAME_CASES = {
    "sum_of_three": ([helper.make_node("Sum", ["x", "x", "x"], ["result"])], ["result"], []),
    "sum_named_like_its_output": (
        [helper.make_node("Sum", ["x", "x", "x"], ["result"], name="result")],
        ["result"],
        [],
    ),
    "mean_of_three": ([helper.make_node("Mean", ["x", "x", "x"], ["m"])], ["m"], []),
    "node_named_like_a_later_tensor": (
        [
            helper.make_node("Sum", ["x", "x", "x"], ["s"], name="y"),
            helper.make_node("Relu", ["s"], ["y"], name="r"),
        ],
        ["y"],
        [],
    ),
    "reduce_log_sum_exp": (
        [helper.make_node("ReduceLogSumExp", ["x"], ["r"], keepdims=0)],
        ["r"],
        [],
    ),
    "listed_twice": ([_relu()], ["y", "y"], []),
    "graph_input_as_output": ([_relu()], ["x", "y"], []),
    "initializer_as_output": ([_relu()], ["y", "c"], [("c", np.ones(2, np.float32))]),
    "constant_as_output": (
        [helper.make_node("Constant", [], ["k"], value_float=1.0), _relu()],
        ["k", "y"],
        [],
    ),
}


@pytest.mark.parametrize("case", OUTPUT_NAME_CASES)
def test_graph_output_names_are_kept_exactly(case, tmp_path):
    nodes, outputs, inits = OUTPUT_NAME_CASES[case]
    proto = make_model(nodes, [("x", [1, 2])], outputs, inits)
    model = import_onnx(proto)
    assert [v.name for v in model.main.outputs] == outputs
    run_preset(model)
    assert [v.name for v in model.main.outputs] == outputs
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    write_npz(tmp_path / "in.npz", {"x": np.ones((2, 1, 2), np.float32)})
    result = onebuild("run", path, "-i", tmp_path / "in.npz", "-o", tmp_path / "o.npz")
    assert result.returncode == 0, result.stderr
    session = ort.InferenceSession(str(path))
    assert sorted(read_npz(tmp_path / "o.npz")) == sorted({o.name for o in session.get_outputs()})


def test_a_tensor_defined_twice_is_an_error_naming_the_node():
    nodes = [_relu(), helper.make_node("Neg", ["x"], ["y"], name="neg")]
    with pytest.raises(UserError, match="node 'neg' \\(Neg\\) writes 'y', which node 'r'"):
        import_onnx(make_model(nodes, [("x", [1, 2])], ["y"]))
    with pytest.raises(UserError, match="node 'r' \\(Relu\\) writes 'x', which a graph input"):
        import_onnx(make_model([_relu("x")], [("x", [1, 2])], ["x"]))
