"""A quantized sequence MatMul (Reshape [1, T, K] -> [T, K] -> QGemm -> Reshape back) runs N
samples together, their rows stacked ([N T, K]), and gives every sample exactly its single-run
codes; evaluation then compares in chunks. The layer is the trained input projection of the
bidirectional LSTM digit classifier, fed held-out digit sequences (tests/test_trix_rows.py)."""

import numpy as np
import pytest
from test_trix_rows import _codes, _float_projection, _projection

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.quant import evaluate


def _stacked(graph, feeds: list[dict]) -> dict:
    return {v.name: np.stack([f[v.name] for f in feeds]) for v in graph.inputs}


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_rows_of_several_samples_run_together_and_equal_single_runs(dtype):
    graph, test = _projection(relu=True, dtype=dtype)
    interpreter = Interpreter(graph)
    assert interpreter.batchable
    feeds = _codes(graph, test, 37)
    seen = {}
    observed = Interpreter(graph, observer=lambda v, a: seen.setdefault(v.name, a.shape))
    batched = observed.run_batch(_stacked(graph, feeds), chunk=16)  # chunks of 16, 16 and 5
    rows = next(n for n in graph.nodes if n.op == "QGemm")
    assert seen[rows.inputs[0].name] == (16 * 8, 8)  # 16 samples' 8 rows each, together
    for index, sample in enumerate(feeds):
        single = interpreter.run(sample)
        for value in graph.outputs:
            np.testing.assert_array_equal(batched[value.name][index], single[value.name])


def test_evaluation_of_a_rows_graph_runs_in_chunks(monkeypatch):
    graph, test = _projection(relu=True)
    calls = []
    run_batch = Interpreter.run_batch

    def counted(self, feeds, chunk=32):
        calls.append(len(next(iter(feeds.values()))))
        return run_batch(self, feeds, chunk)

    monkeypatch.setattr(Interpreter, "run_batch", counted)
    reference, x = _float_projection(relu=True), graph.inputs[0]
    result = evaluate.compare_graphs(reference, graph, [("held out", {x.name: test[:40]})])
    assert result.samples == 40
    assert max(calls) > 1  # samples together, not one at a time
    assert result.outputs["y"]["sqnr_db"] > 30


def test_rows_read_by_an_op_that_does_not_keep_rows_apart_run_one_sample_at_a_time(rng):
    """Relu on [T, K] rows would be right batched too, but only ops whose registry entry says
    so (`BatchRule.rows`: Reshape, QGemm) may hold stacked rows."""
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 4, 8))
    rows = graph.make_node("Reshape", [x], {"shape": [4, 8]}).output
    relu = graph.make_node("Relu", [rows]).output
    graph.outputs = [graph.make_node("Reshape", [relu], {"shape": [1, 4, 8]}).output]
    interpreter = Interpreter(graph)
    assert not interpreter.batchable
    feeds = {"x": rng.normal(size=(3, 1, 4, 8)).astype(np.float32)}
    got = interpreter.run_batch(feeds)[graph.outputs[0].name]
    np.testing.assert_array_equal(got, np.maximum(feeds["x"], 0))
