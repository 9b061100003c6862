"""`weight_axes` (the registry's one statement of where a weighted op's channels lie) agrees
with the op's own kernel: scaling the weight's slice j along `out` scales output channel j
alone, and zeroing the data's channel i along `data` changes the output exactly as zeroing the
weight's slice i along `into` does."""

import numpy as np
import pytest

from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops import OPS, weight_axes

CONV = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 0, 1, 0]}
CASES = {  # op, attributes, data shape, weight shape
    "conv": ("Conv", {**CONV, "group": 1}, (2, 4, 5, 6), (3, 4, 3, 2)),
    "grouped conv": ("Conv", {**CONV, "group": 2}, (2, 4, 5, 6), (6, 2, 3, 2)),
    "conv transpose": (
        "ConvTranspose",
        {**CONV, "group": 1, "output_padding": [0, 0]},
        (2, 4, 5, 6),
        (4, 3, 3, 2),
    ),
    "gemm": ("Gemm", {}, (3, 5), (5, 4)),
    "gemm transB": ("Gemm", {"transB": 1}, (3, 5), (4, 5)),
    "matmul": ("MatMul", {}, (3, 5), (5, 4)),
    "stacked matmul": ("MatMul", {}, (2, 3, 5), (2, 5, 4)),
}


def _node(op, attrs, x_shape, w_shape):
    graph = Graph()
    x = graph.add_input("x", np.dtype("float64"), x_shape)
    w = graph.add_input("w", np.dtype("float64"), w_shape)
    return graph.make_node(op, [x, w], dict(attrs), name="layer")


@pytest.mark.parametrize("case", CASES)
def test_weight_axes_match_the_kernel(case, rng):
    op, attrs, x_shape, w_shape = CASES[case]
    axes = weight_axes(_node(op, attrs, x_shape, w_shape))
    kernel = OPS[op].kernel
    x, w = rng.normal(size=x_shape), rng.normal(size=w_shape)
    y = kernel(attrs, x, w)[0]
    channel = axes.data % y.ndim  # the output's channels lie where the data's do
    for j in range(w.shape[axes.out]):
        scaled = w.copy()
        np.moveaxis(scaled, axes.out, 0)[j] *= 2.0
        changed = kernel(attrs, x, scaled)[0] - y
        expected = np.zeros_like(y)
        groups = attrs.get("group", 1) if axes.out else 1  # axis 1 of grouped: j per group
        per_group = y.shape[channel] // groups
        for g in range(groups):
            index = g * per_group + j if axes.out else j
            np.moveaxis(expected, channel, 0)[index] = np.moveaxis(y, channel, 0)[index]
        np.testing.assert_allclose(changed, expected, atol=1e-12)
    if attrs.get("group", 1) == 1:
        for i in range(w.shape[axes.into]):
            x0, w0 = x.copy(), w.copy()
            np.moveaxis(x0, axes.data % x.ndim, 0)[i] = 0.0
            np.moveaxis(w0, axes.into, 0)[i] = 0.0
            np.testing.assert_allclose(kernel(attrs, x0, w)[0], kernel(attrs, x, w0)[0], atol=1e-12)


@pytest.mark.parametrize(
    "case, integer",
    [("conv", "QConv"), ("grouped conv", "QConv"), ("gemm", "QGemm"), ("gemm transB", "QGemm"),
     ("matmul", "QGemm")],
)  # fmt: skip
def test_the_integer_form_has_its_float_ops_layout(case, integer):
    """QConv and QGemm keep the float layer's weight and attributes (transB), so its axes."""
    op, attrs, _, w_shape = CASES[case]
    assert op in OPS[integer].quantizes
    rank = len(w_shape)
    assert OPS[integer].weights(attrs, rank) == OPS[op].weights(attrs, rank)


def test_ops_without_a_weight_have_no_axes():
    assert weight_axes(_node("Add", {}, (3, 5), (3, 5))) is None
    assert weight_axes(_node("MatMul", {}, (3, 5), (5,))) is None  # no output channels
