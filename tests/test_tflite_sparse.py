"""Sparse constants (TFLite sparsity, expanded by DENSIFY: MediaPipe's pose and full-range face
detectors store their pruned weights so) read dense: a logistic regression trained on
scikit-learn's digits, its smaller weights pruned, stored sparse element by element and in
blocks of 4 columns, runs as LiteRT runs it (the reader refused every sparse tensor before)."""

import numpy as np
import pytest
from tflite_builder import Op, Tensor, build, run_litert

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde.circle_read import read_tflite


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    model = LogisticRegression(max_iter=500).fit(x[:1000], data.target[:1000])
    weights = model.coef_.astype(np.float32)
    weights[np.abs(weights) < np.quantile(np.abs(weights), 0.6)] = 0  # 60 % pruned
    return x[1000:1100], weights, model.intercept_.astype(np.float32)


@pytest.mark.parametrize("block", [1, 4])
def test_densified_weights_run_as_litert_runs_them(digits, block):
    images, weights, bias = digits
    tensors = [
        Tensor("x", "float32", (1, 64)),
        Tensor("w_sparse", "float32", (10, 64), data=weights, sparse=block),
        Tensor("w", "float32", (10, 64)),
        Tensor("b", "float32", (10,), data=bias),
        Tensor("y", "float32", (1, 10)),
    ]
    ops = [Op("DENSIFY", ["w_sparse"], ["w"]), Op("FULLY_CONNECTED", ["x", "w", "b"], ["y"])]
    data = build(tensors, ops, ["x"], ["y"])
    graph = read_tflite(data).main
    assert [n.op for n in graph.nodes] == ["Gemm"]
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].numpy(), weights)  # read dense
    want = np.stack(run_litert(data, [x[None] for x in images]))
    got = Interpreter(graph).run_batch({"x": images[:, None]})["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
