import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import conv_bn_relu_model, make_model

from onebuild.errors import IRError, ModelError, PassError, UnsupportedOpsError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.passes import run_passes, run_preset
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.graph_ir.verify import verify


def ort_run(proto, feeds):
    session = ort.InferenceSession(proto.SerializeToString())
    return session.run(None, feeds)[0]


def test_shape_subgraph_folds_and_o1_fuses(rng):
    proto = conv_bn_relu_model(rng)
    model = import_onnx(proto)
    ops = [n.op for n in model.main.nodes]
    # Shape -> Gather -> Unsqueeze -> Concat folded away while importing.
    assert ops == ["Conv", "BatchNormalization", "Relu", "Dropout", "Reshape", "Gemm", "Clip"]
    x = rng.random((1, 3, 8, 8), dtype=np.float32)
    want = ort_run(proto, {"x": x})
    records = run_preset(model)
    assert [n.op for n in model.main.nodes] == ["Conv", "Reshape", "Gemm"]
    conv, _, gemm = model.main.nodes
    assert conv.attrs["clip"] == [0.0, float("inf")] and gemm.attrs["clip"] == [0.0, 6.0]
    assert {r.name for r in records if r.modified} >= {
        "remove_identities",
        "fold_batchnorm",
        "fuse_activations",
        "eliminate_dead_code",
    }
    got = Interpreter(model.main).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert model.main.outputs[0].name == "y"


def test_input_shapes_override_fixes_dynamic_batch(rng):
    proto = conv_bn_relu_model(rng, dynamic_batch=True)
    model = import_onnx(proto, input_shapes={"x": [3, 3, 8, 8]})
    assert model.main.outputs[0].shape == (3, 10)
    x = rng.random((3, 3, 8, 8), dtype=np.float32)
    got = Interpreter(model.main).run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_run(proto, {"x": x}), rtol=1e-5, atol=1e-6)


def test_input_shapes_errors(rng):
    proto = conv_bn_relu_model(rng, dynamic_batch=True)
    with pytest.raises(UserError, match="no input 'inp'"):
        import_onnx(proto, input_shapes={"inp": [1, 3, 8, 8]})
    with pytest.raises(UserError, match="axis 1 to 5"):
        import_onnx(proto, input_shapes={"x": [1, 5, 8, 8]})


def test_dynamic_non_batch_dim_needs_input_shapes():
    proto = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, "H"])], ["y"])
    with pytest.raises(ModelError, match="dynamic dim 'H' on axis 1.*input_shapes"):
        import_onnx(proto)
    assert import_onnx(proto, input_shapes={"x": [1, 7]}).main.outputs[0].shape == (1, 7)


def test_unsupported_ops_are_all_listed():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("Unique", ["a"], ["b"], name="e1"),
        helper.make_node("Unique", ["b"], ["c"], name="e2"),
        helper.make_node("StringNormalizer", ["c"], ["d"], name="sn"),
        helper.make_node("Unique", ["d"], ["y"]),  # unnamed: called by its output, as in import
    ]
    proto = make_model(nodes, [("x", [2, 2])], ["y"])
    with pytest.raises(UnsupportedOpsError) as error:
        import_onnx(proto, "m.onnx")
    message = str(error.value)
    assert "StringNormalizer, Unique" in message
    assert all(f"node '{n}'" in message for n in ("e1", "e2", "sn", "y"))
    assert "\n" not in message


def test_shape_mismatch_names_the_node():
    nodes = [helper.make_node("Add", ["x", "z"], ["y"], name="bad_add")]
    proto = make_model(nodes, [("x", [2, 3]), ("z", [4])], ["y"])
    with pytest.raises(ModelError, match="node 'bad_add' \\(Add\\).*do not broadcast"):
        import_onnx(proto)


def test_observer_sees_every_value(rng):
    model = import_onnx(conv_bn_relu_model(rng))
    seen = {}
    Interpreter(model.main, observer=lambda v, a: seen.setdefault(v.name, a.shape)).run(
        {"x": rng.random((1, 3, 8, 8), dtype=np.float32)}
    )
    expected = {v.name for v in model.main.inputs} | {
        v.name for n in model.main.nodes for v in n.outputs
    }
    assert set(seen) == expected


def test_execution_errors_name_the_node():
    graph = Graph()
    x = graph.add_input("x", np.float32, (2,))
    idx = graph.add_constant(np.array([5]), "idx")
    graph.outputs = [graph.make_node("Gather", [x, idx], {"axis": 0}, name="g").output]
    with pytest.raises(Exception, match="while executing node 'g' \\(Gather\\)"):
        Interpreter(graph).run({"x": np.zeros(2, np.float32)})


def test_use_lists_are_maintained_and_verify_catches_breakage():
    graph = Graph()
    x = graph.add_input("x", np.float32, (2, 3))
    a = graph.make_node("Relu", [x], name="a").output
    b = graph.make_node("Neg", [a], name="b").output
    graph.outputs = [b]
    assert [n.name for n, _ in a.uses] == ["b"]
    with pytest.raises(IRError, match="read by b"):
        graph.remove(a.producer)
    c = graph.make_node("Abs", [x], name="c").output
    a.replace_all_uses_with(c)
    assert not a.uses and [n.name for n, _ in c.uses] == ["b"]
    with pytest.raises(IRError, match="node 'b' \\(Neg\\): input 0 'c' is used before"):
        verify(graph)  # c is defined after b
    graph.sort()
    verify(graph)
    b.shape = (3, 2)
    with pytest.raises(IRError, match="node 'b' \\(Neg\\).*declared float32\\[3, 2\\]"):
        verify(graph)


def test_cycles_are_detected():
    graph = Graph()
    x = graph.add_input("x", np.float32, (2,))
    first = graph.make_node("Add", [x, x], name="first")
    second = graph.make_node("Relu", [first.output], name="second")
    first.set_input(1, second.output)
    with pytest.raises(IRError, match="cycle"):
        graph.sort()


def test_pass_manager_rejects_misreporting_pass(monkeypatch):
    from onebuild.graph_ir.passes import manager

    def sneaky(graph):
        graph.nodes[0].attrs["alpha"] = 0.5
        return False

    monkeypatch.setitem(manager.PASSES, "sneaky", sneaky)
    graph = Graph()
    x = graph.add_input("x", np.float32, (2,))
    graph.outputs = [graph.make_node("LeakyRelu", [x], {"alpha": 0.1}).output]
    from onebuild.graph_ir.ir import Model

    with pytest.raises(PassError, match="pass 'sneaky'.*passes run before: remove_identities"):
        run_passes(Model([graph]), ["remove_identities", "sneaky"])


@pytest.mark.parametrize("opset", [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21])
def test_opsets_11_to_21(rng, opset):
    """The same network converted to each opset imports and matches onnxruntime."""
    from onnx import version_converter

    base = conv_bn_relu_model(rng, opset=10)
    nodes = [
        helper.make_node("Softmax", ["y"], ["p"], axis=1),
        helper.make_node("ReduceMean", ["p"], ["q"], axes=[1], keepdims=1),
        helper.make_node("Split", ["y"], ["s1", "s2"], axis=1, split=[4, 6]),
        helper.make_node("Pad", ["s1"], ["padded"], pads=[0, 1, 0, 1], mode="constant"),
        helper.make_node("Squeeze", ["q"], ["sq"], axes=[1]),
    ]
    graph = base.graph
    graph.node.extend(nodes)
    del graph.output[:]
    for name in ("p", "sq", "s2", "padded"):
        graph.output.append(helper.make_empty_tensor_value_info(name))
    base = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    proto = version_converter.convert_version(base, opset)
    proto.ir_version = 8
    model = import_onnx(proto)
    x = rng.random((1, 3, 8, 8), dtype=np.float32)
    session = ort.InferenceSession(proto.SerializeToString())
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    for graph_model in (model, None):
        if graph_model is None:
            run_preset(model)
        got = Interpreter(model.main).run({"x": x})
        for name, want in expected.items():
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_multiple_subgraphs_round_trip(tmp_path, rng):
    from onebuild.graph_ir.ir import Model
    from onebuild.graph_ir.serde import load_ir, save_ir

    graphs = []
    for index in range(2):
        graph = Graph(f"g{index}")
        x = graph.add_input("x", np.float32, (2, 3))
        w = graph.add_constant(rng.random((3, 4), dtype=np.float32), "w")
        graph.outputs = [graph.make_node("MatMul", [x, w], name="mm").output]
        graphs.append(graph)
    path = tmp_path / "two.obir"
    save_ir(Model(graphs), path)
    loaded = load_ir(path)
    assert [g.name for g in loaded.graphs] == ["g0", "g1"]
    x = rng.random((2, 3), dtype=np.float32)
    for original, copy in zip(graphs, loaded.graphs):
        np.testing.assert_array_equal(
            Interpreter(copy).run({"x": x})["mm"], Interpreter(original).run({"x": x})["mm"]
        )


@pytest.mark.parametrize("group", [1, 2])
def test_batchnorm_folds_into_conv_transpose(group, rng):
    """ConvTranspose (weights [I, O / group, kh, kw]) -> BatchNormalization -> Relu: O1 folds
    the BatchNormalization into the weights and bias; onnxruntime's outputs on the unfolded
    model within float tolerance."""
    channels = 4
    inits = [
        ("w", rng.normal(0, 0.5, (4, channels // group, 3, 3)).astype(np.float32)),
        ("b", rng.normal(0, 0.1, channels).astype(np.float32)),
        ("scale", rng.uniform(0.5, 2.0, channels).astype(np.float32)),
        ("shift", rng.normal(0, 0.3, channels).astype(np.float32)),
        ("mean", rng.normal(0, 0.3, channels).astype(np.float32)),
        ("var", rng.uniform(0.2, 3.0, channels).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], group=group),
        helper.make_node("BatchNormalization", ["t", "scale", "shift", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    proto = make_model(nodes, [("x", [1, 4, 5, 5])], ["y"], inits)
    model = import_onnx(proto)
    run_preset(model)
    assert [n.op for n in model.main.nodes] == ["ConvTranspose", "Relu"]
    x = rng.normal(0, 1, (1, 4, 5, 5)).astype(np.float32)
    got = Interpreter(model.main).run({"x": x})["y"]
    np.testing.assert_allclose(got, ort_run(proto, {"x": x}), rtol=1e-5, atol=1e-5)
