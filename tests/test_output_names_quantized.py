"""A quantized output whose producer stays float keeps its name, in the IR and through circle
(a new user's `run` wrote `y` as `y_1`, the circle read it back as `y_1_1`, and pack fell back
to .obir)."""

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.circle_write import write_circle
from onebuild.graph_ir.serde.onnx_import import import_onnx


def _layer_norm(rng, tail: list[str]) -> Model:
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y" if not tail else "r"])]
    if tail == ["Transpose"]:
        nodes.append(helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1]))
    consts = [("g", rng.random(8).astype(np.float32)), ("b", rng.random(8).astype(np.float32))]
    return import_onnx(make_model(nodes, [("x", [1, 4, 8])], ["y"], consts))


@pytest.mark.parametrize("tail", [[], ["Transpose"]])
def test_quantized_output_of_a_float_node_keeps_its_name(rng, tmp_path, tail):
    model = _layer_norm(rng, tail)
    samples = {"x": rng.standard_normal((8, 1, 4, 8)).astype(np.float32)}
    ranges = calibrate(model.main, samples).ranges
    graph = quantize_graph(model.main, ranges, QuantConfig("uint8", output_type="uint8"))
    assert [v.name for v in graph.outputs] == ["y"]
    want = Interpreter(graph).run({"x": samples["x"][0]})["y"]
    path = tmp_path / "m.circle"
    path.write_bytes(write_circle(Model([graph])))
    back = load_model(path).main
    assert [(v.name, v.dtype, v.shape) for v in back.outputs] == [("y", np.uint8, want.shape)]
    np.testing.assert_array_equal(Interpreter(back).run({"x": samples["x"][0]})["y"], want)
