"""Single operators in the interpreter (imported, optionally after O1) against onnxruntime, on
the inputs a review found wrong: extreme integers, infinities, crops, shorter index tensors."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde.onnx_import import import_onnx


def op_model(nodes, inputs: dict, outputs: list[str], inits: dict, opset: int = 19):
    """A graph of `nodes` reading the arrays `inputs` (graph inputs) and `inits` (initializers)."""
    graph = helper.make_graph(
        nodes,
        "op",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_value_info(name, onnx.TypeProto()) for name in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def both(model, feeds: dict, optimize: bool = False) -> tuple[list, list]:
    """(onebuild's outputs, onnxruntime's outputs)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    imported = import_onnx(model, "op", {k: v.shape for k, v in feeds.items()})
    if optimize:
        run_preset(imported)
    graph = imported.main
    results = Interpreter(graph).run(feeds)
    return [results[v.name] for v in graph.outputs], session.run(None, feeds)


def assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_top_k_largest_of_extreme_integers(dtype):
    """The type's minimum sorts last (-INT_MIN overflowed to INT_MIN and came first)."""
    info = np.iinfo(dtype)
    x = np.array([[info.min, 5, info.max, 0, info.min]], dtype)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = op_model([node], {"x": x}, ["v", "i"], {"k": np.int64([3])})
    assert_same(*both(model, {"x": x}))


def test_gather_elements_with_indices_shorter_on_another_axis():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("GatherElements", ["d", "i"], ["y"], axis=0)
    model = op_model([node], {"d": data}, ["y"], {"i": np.int64([[2, -1]])})
    assert_same(*both(model, {"d": data}))
