"""Pattern fusion (passes/patterns.py): each exporter spelling becomes one op, the outputs stay
those of the unfused model (onnxruntime on the original file), and nothing fuses when an
intermediate value has another reader or a constant is off."""

from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_passes, run_preset
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.onnx_export import export_onnx

TORCH = Path(__file__).parent / "data" / "torch_exports"
SHAPE = [2, 8, 5, 5]


def _const(name: str, value) -> helper.NodeProto:
    array = np.asarray(value, np.float32)
    tensor = helper.make_tensor(name, 1, array.shape, array.ravel().tolist())
    return helper.make_node("Constant", [], [name], value=tensor)


def _fused(tmp_path, nodes, outputs=("y",), shape=SHAPE, initializers=(), name="m"):
    """(ops after O1, max |O1 result - onnxruntime on the unfused file|, the model's values)."""
    model = make_model(nodes, [("x", shape)], list(outputs), initializers, opset=13)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(3).normal(0, 4, shape).astype(np.float32)
    expected = ort.InferenceSession(str(path)).run(None, {"x": x})
    ir = load_model(path)
    run_preset(ir)
    got = Interpreter(ir.main).run({"x": x})
    error = max(float(np.abs(got[n] - e).max()) for n, e in zip(outputs, expected))
    return Counter(node.op for node in ir.main.nodes), error, ir


def paddle_hardswish(x="x", y="y", prefix=""):
    """paddle2onnx's hard_swish: Add(3) -> Clip(0, 6) -> Mul(x) -> Div(6)."""
    p = prefix
    return [
        _const(f"{p}three", 3.0),
        _const(f"{p}zero", 0.0),
        _const(f"{p}six", 6.0),
        _const(f"{p}six_d", 6.0),
        helper.make_node("Add", [x, f"{p}three"], [f"{p}a"]),
        helper.make_node("Clip", [f"{p}a", f"{p}zero", f"{p}six"], [f"{p}c"]),
        helper.make_node("Mul", [x, f"{p}c"], [f"{p}m"]),
        helper.make_node("Div", [f"{p}m", f"{p}six_d"], [y]),
    ]


def test_paddle_hardswish(tmp_path):
    ops, error, _ = _fused(tmp_path, paddle_hardswish())
    assert ops == {"HardSwish": 1}
    assert error < 1e-5


def test_torch_relu6_over_six_forms(tmp_path):
    """x * relu6(x + 3) / 6 written by hand in torch (Div of a Clip product) and as
    x * (relu6(x + 3) / 6): both HardSwish; relu6(x + 3) / 6 alone is a HardSigmoid."""
    nodes = [
        _const("three", 3.0),
        _const("zero", 0.0),
        _const("six", 6.0),
        _const("six_d", 6.0),
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Div", ["c", "six_d"], ["g"]),
        helper.make_node("Mul", ["g", "x"], ["y"]),
        helper.make_node("Add", ["x", "three"], ["a2"]),
        helper.make_node("Clip", ["a2", "zero", "six"], ["c2"]),
        helper.make_node("Div", ["c2", "six_d"], ["z"]),
    ]
    ops, error, _ = _fused(tmp_path, nodes, ("y", "z"))
    assert ops == {"HardSwish": 1, "HardSigmoid": 1}
    assert error < 1e-5


def test_relu6_as_min_of_relu(tmp_path):
    nodes = [
        _const("three", 3.0),
        _const("six", 6.0),
        _const("sixth", 1 / 6),
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Min", ["r", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Mul", ["sixth", "m"], ["y"]),
    ]
    ops, error, _ = _fused(tmp_path, nodes)
    assert ops == {"HardSwish": 1}
    assert error < 1e-5


def test_paddle_hardsigmoid_clip_form(tmp_path):
    nodes = [
        _const("a", 0.2),
        _const("b", 0.5),
        _const("zero", 0.0),
        _const("one", 1.0),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["s"]),
        helper.make_node("Clip", ["s", "zero", "one"], ["y"]),
    ]
    ops, error, ir = _fused(tmp_path, nodes)
    assert ops == {"HardSigmoid": 1}
    assert ir.main.nodes[0].attrs["alpha"] == pytest.approx(0.2)
    assert error < 1e-6


def test_paddle_swish_with_unit_beta(tmp_path):
    """paddle2onnx's swish: Mul(x, 1.0) -> Sigmoid -> Mul(x); torch's SiLU without the Mul."""
    nodes = [
        _const("beta", [1.0]),
        helper.make_node("Mul", ["x", "beta"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),
        helper.make_node("Sigmoid", ["x"], ["s2"]),
        helper.make_node("Mul", ["s2", "x"], ["z"]),
    ]
    ops, error, _ = _fused(tmp_path, nodes, ("y", "z"))
    assert ops == {"Swish": 2}
    assert error < 1e-5


def test_swish_with_beta_exports_to_onnx(tmp_path):
    nodes = [
        _const("beta", 1.7),
        helper.make_node("Mul", ["beta", "x"], ["b"]),
        helper.make_node("Sigmoid", ["b"], ["s"]),
        helper.make_node("Mul", ["s", "x"], ["y"]),
    ]
    ops, error, ir = _fused(tmp_path, nodes)
    assert ops == {"Swish": 1} and error < 1e-5
    assert ir.main.nodes[0].attrs["alpha"] == pytest.approx(1.7)
    exported = tmp_path / "swish.onnx"
    exported.write_bytes(export_onnx(ir).SerializeToString())
    x = np.linspace(-6, 6, np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    (y,) = ort.InferenceSession(str(exported)).run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.7 * x)), rtol=1e-5, atol=1e-6)


def test_mish_softplus_tanh(tmp_path):
    nodes = [
        helper.make_node("Softplus", ["x"], ["p"]),
        helper.make_node("Tanh", ["p"], ["t"]),
        helper.make_node("Mul", ["x", "t"], ["y"]),
    ]
    ops, error, _ = _fused(tmp_path, nodes)
    assert ops == {"Mish": 1}
    assert error < 1e-5


def test_gelu_tanh_form(tmp_path):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch writes gelu(approximate='tanh')
    before opset 20 (Pow) and as hand-written models do (x * x * x)."""
    nodes = [
        _const("three", 3.0),
        _const("c", 0.044715),
        _const("k", np.sqrt(2 / np.pi)),
        _const("one", 1.0),
        _const("half", 0.5),
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["p", "c"], ["pc"]),
        helper.make_node("Add", ["x", "pc"], ["i"]),
        helper.make_node("Mul", ["i", "k"], ["ik"]),
        helper.make_node("Tanh", ["ik"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["x", "half"], ["xh"]),
        helper.make_node("Mul", ["xh", "t1"], ["y"]),
        helper.make_node("Mul", ["x", "x"], ["x2"]),
        helper.make_node("Mul", ["x2", "x"], ["x3"]),
        helper.make_node("Mul", ["c", "x3"], ["qc"]),
        helper.make_node("Add", ["qc", "x"], ["j"]),
        helper.make_node("Mul", ["k", "j"], ["jk"]),
        helper.make_node("Tanh", ["jk"], ["u"]),
        helper.make_node("Add", ["one", "u"], ["u1"]),
        helper.make_node("Mul", ["x", "u1"], ["xu"]),
        helper.make_node("Mul", ["xu", "half"], ["z"]),
    ]
    ops, error, ir = _fused(tmp_path, nodes, ("y", "z"))
    assert ops == {"Gelu": 2}
    assert {n.attrs["approximate"] for n in ir.main.nodes} == {"tanh"}
    assert error < 1e-5


def paddle_layer_norm(shape_tail=(8,)):
    """paddle2onnx's layer_norm over the last axis: ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div,
    then Mul(weight) and Add(bias)."""
    rng = np.random.default_rng(5)
    return [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        _const("two", 2.0),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        _const("eps", 1e-5),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        _const("w", rng.normal(1, 0.2, shape_tail)),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        _const("b", rng.normal(0, 0.2, shape_tail)),
        helper.make_node("Add", ["nw", "b"], ["y"]),
    ]


def test_paddle_layer_norm(tmp_path):
    ops, error, ir = _fused(tmp_path, paddle_layer_norm(), shape=[1, 6, 8])
    assert ops == {"LayerNormalization": 1}
    (node,) = ir.main.nodes
    assert node.attrs["axis"] == 2 and node.attrs["epsilon"] == pytest.approx(1e-5)
    assert error < 1e-5


def test_layer_norm_with_a_reused_intermediate_stays(tmp_path):
    """The variance is also a model output: it must be computed, so nothing fuses."""
    ops, error, _ = _fused(tmp_path, paddle_layer_norm(), ("y", "var"), shape=[1, 6, 8])
    assert "LayerNormalization" not in ops and ops["ReduceMean"] == 2
    assert error < 1e-5


@pytest.mark.parametrize("name", ["cnn_op11", "cnn_op13", "cnn_op17", "attn_op11", "attn_op13"])
def test_torch_exports_fuse(name):
    """The committed torch.onnx exports: HardSwish (HardSigmoid * x before opset 14), SiLU, GELU
    (erf form) and LayerNorm (decomposed before opset 17) each become one op; the outputs match
    onnxruntime on the original file."""
    shape = [2, 3, 32, 32] if name.startswith("cnn") else [2, 5, 32]
    path = TORCH / f"{name}.onnx"
    model = load_model(path, {"x": shape})
    run_preset(model)
    ops = Counter(n.op for n in model.main.nodes)
    expected = (
        {"HardSwish": 2, "Swish": 1, "Gelu": 1}
        if name.startswith("cnn")
        else {"LayerNormalization": 1}
    )
    assert {op: ops[op] for op in expected} == expected
    assert not {"Sigmoid", "Erf", "HardSigmoid", "Sqrt", "Pow"} & set(ops)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    session = ort.InferenceSession(str(path))
    names = [o.name for o in session.get_outputs()]
    got = Interpreter(model.main).run({"x": x})
    for out, ref in zip(names, session.run(None, {"x": x})):
        np.testing.assert_allclose(got[out], ref, rtol=1e-4, atol=1e-5)


def test_intermediate_with_another_reader_is_not_fused(tmp_path):
    """The Clip output of a hard-swish is also read by a second Mul: no HardSwish."""
    nodes = [*paddle_hardswish(), helper.make_node("Mul", ["c", "c"], ["z"])]
    ops, error, _ = _fused(tmp_path, nodes, ("y", "z"))
    assert "HardSwish" not in ops and ops["Add"] == 1  # x + 3 with its relu6 fused
    assert error < 1e-4


def test_graph_output_intermediate_is_not_fused(tmp_path):
    ops, _, _ = _fused(tmp_path, paddle_hardswish(), ("y", "m"))
    assert "HardSwish" not in ops


def test_near_misses_are_not_fused(tmp_path):
    """Off constants and a sigmoid of another tensor are left as they are (the / 5 becomes a
    multiplication by 0.2)."""
    nodes = [
        *paddle_hardswish(y="h"),
        _const("five", 5.0),
        helper.make_node("Div", ["m", "five"], ["y"]),  # x * relu6(x + 3) / 5 (and / 6: "h")
        helper.make_node("Neg", ["x"], ["nx"]),
        helper.make_node("Sigmoid", ["nx"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["z"]),  # x * sigmoid(-x)
    ]
    ops, error, _ = _fused(tmp_path, nodes, ("y", "h", "z"))
    assert "HardSwish" not in ops and "Swish" not in ops and "Div" not in ops
    assert ops["Sigmoid"] == 1 and ops["Add"] == 1
    assert error < 1e-4


def test_hardswishes_in_sequence_each_fuse(tmp_path):
    nodes = paddle_hardswish(y="h", prefix="p") + paddle_hardswish(x="h", prefix="q")
    ops, error, ir = _fused(tmp_path, nodes)
    assert ops == {"HardSwish": 2}
    assert [v.name for v in ir.main.outputs] == ["y"]
    assert error < 1e-5


def test_division_by_a_constant_becomes_a_product(tmp_path):
    nodes = [_const("d", [[[4.0]], [[0.5]]]), helper.make_node("Div", ["x", "d"], ["y"])]
    ops, error, _ = _fused(tmp_path, nodes, shape=[1, 2, 3, 3])
    assert ops == {"Mul": 1}
    assert error < 1e-6


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_conv_bias_added_afterwards_joins_the_conv(tmp_path, op):
    """Paddle writes a conv's bias as Conv -> Add(Reshape(bias, [1, C, 1, 1])) (the DB text
    detector's upsampling ConvTranspose too)."""
    rng = np.random.default_rng(1)
    transposed = op == "ConvTranspose"
    weight = rng.normal(0, 0.3, (8, 4, 2, 2) if transposed else (4, 8, 3, 3)).astype(np.float32)
    attrs = {"strides": [2, 2]} if transposed else {"pads": [1, 1, 1, 1]}
    nodes = [
        _const("bias", rng.normal(0, 1, 4)),
        _const("shape", [1, 4, 1, 1]),
        helper.make_node(op, ["x", "w"], ["c"], **attrs),
        helper.make_node("Reshape", ["bias", "shape_i"], ["b"]),
        helper.make_node("Add", ["c", "b"], ["y"]),
    ]
    shape = helper.make_tensor("shape_i", 7, [4], [1, 4, 1, 1])
    nodes[1] = helper.make_node("Constant", [], ["shape_i"], value=shape)
    ops, error, ir = _fused(tmp_path, nodes, initializers=[("w", weight)])
    assert ops == {op: 1}
    assert len(ir.main.nodes[0].inputs) == 3
    assert error < 1e-5


def test_pass_reports_no_change_when_nothing_matches(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", SHAPE)], ["y"])
    path = tmp_path / "relu.onnx"
    path.write_bytes(model.SerializeToString())
    ir = load_model(path)
    (record,) = run_passes(ir, ["fuse_patterns"])
    assert not record.modified


def _affine_block(pads):
    """PP-LCNetV3's learnable affine blocks as paddle2onnx writes them: Conv -> Mul(a) -> Add(b)
    -> hard-swish -> Mul(c) -> Add(d) -> Conv (scalars a, b, c, d)."""
    return [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        _const("a", [0.8]),
        helper.make_node("Mul", ["a", "c1"], ["m1"]),
        _const("b", [0.3]),
        helper.make_node("Add", ["m1", "b"], ["h"]),
        *paddle_hardswish(x="h", y="s", prefix="hs_"),
        _const("c", [1.3]),
        helper.make_node("Mul", ["c", "s"], ["m2"]),
        _const("d", [-0.2]),
        helper.make_node("Add", ["m2", "d"], ["a2"]),
        helper.make_node("Conv", ["a2", "w2", "b2"], ["y"], pads=pads),
    ]


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1]], ids=["1x1", "padded"])
def test_learnable_affine_blocks_join_the_convs(tmp_path, pads):
    """Scales fold into the weights on either side; the shift after the activation only into an
    unpadded Conv (a padded one sees zeros where the shift would have been)."""
    rng = np.random.default_rng(8)
    inits = [
        ("w1", rng.normal(0, 0.3, (6, 8, 3, 3)).astype(np.float32)),
        ("w2", rng.normal(0, 0.3, (4, 6, 1 + 2 * pads[0], 1 + 2 * pads[0])).astype(np.float32)),
        ("b2", rng.normal(0, 0.3, 4).astype(np.float32)),
    ]
    ops, error, _ = _fused(tmp_path, _affine_block(pads), initializers=inits)
    expected = {"Conv": 2, "HardSwish": 1}
    if any(pads):
        expected |= {"Mul": 1, "Add": 1}  # x * c + d stays before a padded Conv
    assert ops == expected
    assert error < 1e-4
