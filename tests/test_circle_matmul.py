"""Float MatMul exports read back as the same MatMul (a FULLY_CONNECTED without bias, a
BATCH_MATMUL) and LayerNormalization as itself, so MLPs and transformer blocks pack as exact
circle; onert and LiteRT run them to onnxruntime's outputs."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import run_litert, run_onert

from onebuild import compile as C
from onebuild.cli import main
from onebuild.errors import ModelError
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle
from onebuild.graph_ir.serde.circle_write import Writer
from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "tests" / "data" / "qdq" / "mlp.onnx"  # the digits MLP: MatMul + Add, trained


def digits(count: int) -> np.ndarray:
    images = read_npz(ROOT / "examples" / "digits" / "data" / "test.npz")["input"][:count]
    return images.astype(np.float32)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_trained_mlp_packs_as_exact_circle_and_runs_in_onert(tmp_path):
    model = C.optimize(load_onnx(MLP, {"input": [1, 64]}))
    data, reason = exact_circle(model)
    assert reason is None
    assert [n.op for n in read_circle(data).main.nodes] == [n.op for n in model.main.nodes]
    x = digits(200).reshape(200, 1, 64)
    session = ort.InferenceSession(str(MLP), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"input": s})[0] for s in x])
    got = np.concatenate([r[0] for r in run_onert(data, tmp_path, [[s] for s in x])])
    assert relative(got, want) < 1e-5
    lite = np.concatenate(
        [r[0] for r in run_litert(write_circle(model, "tflite"), [[s] for s in x])]
    )
    assert relative(lite, want) < 1e-5


def attention_model(rng):
    """Scaled dot-product attention over the 8 rows of a digit image: q, k, v projections
    (MatMul + Add, a 3-D input: FULLY_CONNECTED keep_num_dims), q @ k^T and p @ v between
    activations (BATCH_MATMUL), Softmax over the last axis, output projection."""
    inits, nodes = [], []

    def dense(x, y, name):
        inits.extend([(f"{name}_w", rng.normal(0, 0.3, (8, 8)).astype(np.float32))])
        inits.extend([(f"{name}_b", rng.normal(0, 0.1, 8).astype(np.float32))])
        nodes.append(helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_m"], name=f"{name}"))
        nodes.append(helper.make_node("Add", [f"{name}_m", f"{name}_b"], [y], name=f"{name}_add"))

    for name in "qkv":
        dense("x", name, name)
    inits.append(("scale", np.float32(8**-0.5)))
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scaled"),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["a"], name="mix"),
    ]
    dense("a", "y", "o")
    return make_model(nodes, [("x", [1, 8, 8])], ["y"], inits)


def test_attention_packs_as_exact_circle_and_runs_in_onert(tmp_path, rng):
    onnx_model = attention_model(rng)
    path = tmp_path / "attn.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    model = C.optimize(load_onnx(path))
    data, reason = exact_circle(model)
    assert reason is None
    back = read_circle(data).main
    assert sorted(n.op for n in back.nodes) == sorted(n.op for n in model.main.nodes)
    x = digits(64).reshape(64, 1, 8, 8)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"x": s})[0] for s in x])
    got = np.concatenate([r[0] for r in run_onert(data, tmp_path, [[s] for s in x])])
    assert relative(got, want) < 1e-5
    lite = np.concatenate(
        [r[0] for r in run_litert(write_circle(model, "tflite"), [[s] for s in x])]
    )
    assert relative(lite, want) < 1e-5


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_torch_transformer_block_packs_as_exact_circle_and_runs_in_onert(tmp_path, opset):
    """torch.onnx exports of a pre-norm attention block (LayerNormalization, q/k/v/o Linear
    layers on [1, T, 32], 4 heads: 4-D MatMuls, Softmax): the circle reads back to the same
    ops and onert runs it within 1.1e-7 relative of onnxruntime on digit pixels."""
    path = ROOT / "tests" / "data" / "torch_exports" / f"attn_op{opset}.onnx"
    model = C.optimize(load_onnx(path, {"x": [1, 6, 32]}))
    data, reason = exact_circle(model)
    assert reason is None
    assert sorted(n.op for n in read_circle(data).main.nodes) == sorted(
        n.op for n in model.main.nodes
    )
    x = digits(12).reshape(4, 1, 6, 32)  # three digits' pixels per sample
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"x": s})[0] for s in x])
    got = np.concatenate([r[0] for r in run_onert(data, tmp_path, [[s] for s in x])])
    assert relative(got, want) < 2e-7


def test_mlp_recipe_packs_a_circle(tmp_path, capsys):
    """The trial's MatMul + Add model through `onebuild build`: the package holds a .circle
    and the build prints no warning (it fell back to .obir)."""
    (tmp_path / "r.toml").write_text(
        f'[import]\nsource = "{MLP}"\ninput_shapes = {{ input = [1, 64] }}\n'
        '[pack]\noutput = "m.nnpkg"\n'
    )
    assert main(["build", str(tmp_path / "r.toml")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "m.nnpkg").iterdir()) == ["m.circle", "metadata"]


def test_keep_num_dims_with_a_bias_is_refused_saying_why():
    """A FULLY_CONNECTED with keep_num_dims on a 3-D input and a bias (not the writer's form:
    the reader takes it only as a float MatMul without bias) is refused naming the bias."""
    graph = Graph()
    x = graph.add_input("x", np.dtype(np.float32), (1, 2, 8))
    weights = graph.add_constant(np.ones((8, 4), np.float32), "wm")
    y = graph.make_node("MatMul", [x, weights]).output
    graph.outputs = [y]
    w = Writer(graph)
    w.define(x, None)
    inputs = [w.get(x, None), w.constant(np.ones((4, 8), np.float32), "w")]
    inputs.append(w.constant(np.zeros(4, np.float32), "b"))
    w.op("FULLY_CONNECTED", inputs, [w.define(y, None)], keep_num_dims=True)
    with pytest.raises(ModelError) as caught:
        read_circle(w.serialize())
    assert str(caught.value) == (
        "<bytes>: operator 0 (FULLY_CONNECTED): keep_num_dims on an input of rank > 2 is read "
        "for float FULLY_CONNECTED without bias only; this one has a bias"
    )


def test_vector_times_constant_matrix_keeps_its_rank(tmp_path, rng):
    """[K] @ [K, N] is [N] (FULLY_CONNECTED alone gives [1, N]): rows and back by RESHAPE."""
    b = rng.normal(0, 1, (8, 5)).astype(np.float32)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="dense")
    path = tmp_path / "vector.onnx"
    path.write_bytes(make_model([node], [("a", [8])], ["y"], [("b", b)]).SerializeToString())
    model = load_onnx(path)
    a = rng.normal(0, 1, 8).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"a": a}
    )
    lite = run_litert(write_circle(model, "tflite"), [[a]])[0][0]
    onert = run_onert(write_circle(model), tmp_path, [[a]])[0][0]
    for got in (lite, onert):
        assert got.shape == want.shape == (5,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
