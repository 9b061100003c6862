"""Batched execution of batch-1 graphs gives every sample exactly the result of a single run."""

import numpy as np
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx


def _per_sample(interpreter: Interpreter, feeds: dict) -> dict:
    graph = interpreter.graph
    runs = [
        interpreter.run({v.name: feeds[v.name][i] for v in graph.inputs})
        for i in range(len(next(iter(feeds.values()))))
    ]
    return {v.name: np.stack([r[v.name] for r in runs]) for v in graph.outputs}


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v2"])
def test_light_models_run_in_batches(rng, name):
    model = import_onnx(light_model(name, seed=2, expose_logits=True))
    run_preset(model)
    graph = model.main
    x = graph.inputs[0]
    feeds = {x.name: rng.random((5, *x.shape), dtype=np.float32)}
    interpreter = Interpreter(graph)
    assert interpreter.batchable
    batched = interpreter.run_batch(feeds, chunk=3)  # chunks of 3 and 2
    single = _per_sample(interpreter, feeds)
    for value in graph.outputs:
        np.testing.assert_array_equal(batched[value.name], single[value.name])
    quantized = quantize_graph(graph, calibrate(graph, feeds).ranges)
    integer = Interpreter(quantized)
    assert integer.batchable
    np.testing.assert_array_equal(  # integer kernels: bit-exact regardless of batching
        integer.run_batch(feeds, chunk=3)[graph.outputs[-1].name],
        _per_sample(integer, feeds)[graph.outputs[-1].name],
    )


def test_graphs_mixing_the_batch_axis_run_one_sample_at_a_time(rng):
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 4))
    y = graph.make_node("Softmax", [x], {"axis": 0}).output
    graph.outputs = [y]
    interpreter = Interpreter(graph)
    assert not interpreter.batchable
    feeds = {"x": rng.normal(size=(3, 1, 4)).astype(np.float32)}
    np.testing.assert_array_equal(interpreter.run_batch(feeds)[y.name], np.ones((3, 1, 4)))


def test_calibration_ranges_do_not_depend_on_batching(rng):
    model = import_onnx(light_model("squeezenet", seed=2))
    run_preset(model)
    graph = model.main
    x = graph.inputs[0]
    feeds = {x.name: rng.random((4, *x.shape), dtype=np.float32)}
    batched = calibrate(graph, feeds).ranges
    one_by_one = calibrate(graph, [(f"s{i}", {x.name: feeds[x.name][i : i + 1]}) for i in range(4)])
    assert one_by_one.ranges == batched  # exactly: on-device recording equals build calibration
