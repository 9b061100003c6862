"""Type inference refuses shapes kernels and exporters cannot honour: a Reshape that changes the
element count, a Conv bias that is not [out channels], a Gemm bias that does not broadcast to
[M, N]. Every loader (IR file, circle/tflite) builds nodes through it, so they are refused in
one line when read, not inside a kernel or an exporter."""

import numpy as np
import pytest

from onebuild.errors import FormatError, ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.serde import load_ir, read_circle, save_ir, write_circle


def _flatten(shape: list[int]) -> Model:
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 16, 2, 2))
    node = graph.make_node("Reshape", [x], {"shape": [1, 64]}, name="flatten")
    graph.outputs.append(node.outputs[0])
    node.attrs["shape"], node.outputs[0].shape = shape, tuple(shape)  # a damaged file's
    return Model([graph])


def test_a_reshape_changing_the_element_count_is_refused():
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 16, 2, 2))
    with pytest.raises(ValueError, match=r"shape \[2, 64\] holds 128 elements, its input"):
        graph.make_node("Reshape", [x], {"shape": [2, 64]})
    graph.make_node("Reshape", [x], {"shape": [1, 64]})


def test_an_ir_file_with_such_a_reshape_is_refused_when_read(tmp_path):
    save_ir(_flatten([2, 64]), tmp_path / "m.obir")
    with pytest.raises(FormatError, match=r"'flatten' \(Reshape\) is invalid: shape \[2, 64\]"):
        load_ir(tmp_path / "m.obir")


def test_a_circle_file_with_such_a_reshape_is_refused_when_read():
    data = write_circle(_flatten([2, 64]))
    with pytest.raises(ModelError, match=r"RESHAPE\) does not fit its tensors.*\[2, 64\] holds"):
        read_circle(data)
    read_circle(write_circle(_flatten([4, 16])))


def _conv(graph: Graph, bias_shape: tuple[int, ...]):
    x = graph.add_input("x", np.float32, (1, 1, 8, 8))
    w = graph.add_constant(np.ones((8, 1, 3, 3), np.float32), "w")
    b = graph.add_constant(np.ones(bias_shape, np.float32), "b")
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    return graph.make_node("Conv", [x, w, b], attrs)


def test_a_conv_bias_that_is_not_one_per_output_channel_is_refused():
    with pytest.raises(ValueError, match=r"bias is \[1, 8\], the weight needs \[8\]"):
        _conv(Graph(), (1, 8))
    _conv(Graph(), (8,))


def _gemm(bias: np.ndarray) -> Model:
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 64))
    w = graph.add_constant(np.arange(640, dtype=np.float32).reshape(10, 64) / 640, "w")
    c = graph.add_constant(bias, "c")
    node = graph.make_node("Gemm", [x, w, c], {"transB": 1})
    graph.outputs.append(node.outputs[0])
    return Model([graph])


@pytest.mark.parametrize("shape", [(3, 10), (10, 1, 1), (2,)])
def test_a_gemm_bias_that_does_not_broadcast_is_refused(shape):
    with pytest.raises(ValueError, match="does not broadcast to the output"):
        _gemm(np.zeros(shape, np.float32))


@pytest.mark.parametrize("shape", [(10,), (1, 10), (1,), (1, 1)])
def test_a_gemm_row_bias_exports_to_circle_and_computes_the_same(shape):
    model = _gemm(np.linspace(-1, 1, 10, dtype=np.float32)[: int(np.prod(shape))].reshape(shape))
    x = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64)
    [expected] = Interpreter(model.main).run({"x": x}).values()
    back = read_circle(write_circle(model))
    [found] = Interpreter(back.main).run({"x": x}).values()
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)
