"""Integer kernels: literal Python-integer references of docs/quantization.md, and agreement
with the float op they replace within one step of the output scale."""

import numpy as np
import pytest

from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.quant.params import dequantize, quantize
from onebuild.graph_ir.quant.quantize_graph import LOOKUP, quantize_graph


def _round_shift(acc: int, m: int, r: int) -> int:
    return (acc * m + (1 << (r - 1))) >> r


def _quantized_pair(build, ranges, inputs, dtype="uint8"):
    """Float graph built by `build(graph, *inputs)`, its quantized form, outputs of both."""
    graph = Graph()
    values = [graph.add_input(f"x{i}", np.float32, a.shape) for i, a in enumerate(inputs)]
    out = build(graph, *values)
    graph.outputs = [out]
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.config import QuantConfig

    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    all_ranges = {f"x{i}": (float(a.min()), float(a.max())) for i, a in enumerate(inputs)}
    want = Interpreter(graph).run(feeds)[out.name]
    all_ranges[out.name] = ranges or (float(want.min()), float(want.max()))
    quantized = quantize_graph(graph, all_ranges, QuantConfig(dtype, output_type=dtype))
    (node,) = [n for n in quantized.nodes if n.op.startswith("Q") and n.op != "QuantizeLinear"]
    got = Interpreter(quantized).run(feeds)[out.name]
    return node, want, dequantize(got, quantized.outputs[0].quant), quantized.outputs[0].quant


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
@pytest.mark.parametrize(
    "op, expected",
    [("Add", "QAdd"), ("Sub", "QAdd"), ("Mul", "QMul"), ("Concat", "QConcat")],
)
def test_binary_kernels_track_float_within_one_step(rng, dtype, op, expected):
    a = rng.normal(0, 2, (2, 3, 4, 5)).astype(np.float32)
    b = rng.normal(1, 0.5, (2, 3, 4, 5)).astype(np.float32)
    attrs = {"axis": 1} if op == "Concat" else {}
    node, want, got, params = _quantized_pair(
        lambda g, x, y: g.make_node(op, [x, y], attrs).output, None, [a, b], dtype
    )
    assert node.op == expected
    # inputs carry half a step of their own rounding each; allow that plus one output step
    assert np.abs(want - got).max() <= params.scale[0] * 1.0 + _input_error(a, b, dtype, op)


def _input_error(a, b, dtype, op):
    qmax = {"uint8": 255, "int8": 254, "int16": 65534}[dtype]
    sa = (max(a.max(), 0) - min(a.min(), 0)) / qmax
    sb = (max(b.max(), 0) - min(b.min(), 0)) / qmax
    if op == "Mul":
        return 0.5 * (sa * np.abs(b).max() + sb * np.abs(a).max()) + sa * sb
    return 0.5 * (sa + sb)


def test_qadd_matches_python_integers(rng):
    a = rng.integers(0, 256, 200).astype(np.uint8)
    b = rng.integers(0, 256, 200).astype(np.uint8)
    attrs = {
        "a_zero_point": 17,
        "b_zero_point": 200,
        "a_rescale": [1518500250, 31],
        "b_rescale": [1073741824, 31],
        "multiplier": 1789569707,
        "shift": 38,
        "y_zero_point": 5,
        "qmin": 0,
        "qmax": 255,
        "dtype": "uint8",
    }
    (got,) = OPS["QAdd"].kernel(attrs, a, b)
    for x, y, z in zip(a, b, got):
        left = _round_shift((int(x) - 17) << 20, 1518500250, 31)
        right = _round_shift((int(y) - 200) << 20, 1073741824, 31)
        expected = min(max(_round_shift(left + right, 1789569707, 38) + 5, 0), 255)
        assert int(z) == expected


@pytest.mark.parametrize("pads, include", [((0, 0, 0, 0), 0), ((1, 1, 1, 1), 0), ((1, 0, 1, 0), 1)])
def test_average_pool_tracks_float(rng, pads, include):
    x = rng.normal(0, 1, (1, 2, 7, 6)).astype(np.float32)
    attrs = {
        "kernel_shape": [3, 3],
        "strides": [2, 2],
        "pads": list(pads),
        "dilations": [1, 1],
        "ceil_mode": 0,
        "count_include_pad": include,
    }
    node, want, got, params = _quantized_pair(
        lambda g, v: g.make_node("AveragePool", [v], attrs).output, None, [x]
    )
    assert node.op == "QAveragePool"
    step_in = (x.max() - min(x.min(), 0)) / 255
    assert np.abs(want - got).max() <= params.scale[0] + 0.5 * step_in


def test_global_average_pool_and_lookup_tables(rng):
    x = rng.normal(0, 2, (1, 3, 5, 5)).astype(np.float32)

    def build(g, v):
        pooled = g.make_node("GlobalAveragePool", [v]).output
        return g.make_node("Sigmoid", [pooled]).output

    graph = Graph()
    v = graph.add_input("x0", np.float32, x.shape)
    graph.outputs = [build(graph, v)]
    from onebuild.graph_ir.interpreter import Interpreter

    want = Interpreter(graph).run({"x0": x})[graph.outputs[0].name]
    pooled = x.mean(axis=(2, 3), keepdims=True)
    ranges = {
        "x0": (float(x.min()), float(x.max())),
        graph.nodes[0].output.name: (float(pooled.min()), float(pooled.max())),
        graph.outputs[0].name: (float(want.min()), float(want.max())),
    }
    quantized = quantize_graph(graph, ranges)
    assert [n.op for n in quantized.nodes][1:3] == ["QAveragePool", "QLookup"]
    got = Interpreter(quantized).run({"x0": x})[graph.outputs[0].name]
    assert np.abs(want - got).max() < 3 / 255


def test_requantize_between_layer_types(rng):
    """A uint8 layer feeding an int16 layer goes through an integer Requantize node."""
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig

    x = rng.normal(0, 1, (4, 6)).astype(np.float32)
    graph = Graph()
    v = graph.add_input("x", np.float32, x.shape)
    w1 = graph.add_constant(rng.normal(0, 0.5, (6, 6)).astype(np.float32), "w1")
    w2 = graph.add_constant(rng.normal(0, 0.5, (6, 3)).astype(np.float32), "w2")
    h = graph.make_node("MatMul", [v, w1], name="first").output
    y = graph.make_node("MatMul", [h, w2], name="second").output
    graph.outputs = [y]
    ranges = {}
    Interpreter(graph, observer=lambda val, a: ranges.update({val.name: (a.min(), a.max())})).run(
        {"x": x}
    )
    config = QuantConfig("uint8", layers=(LayerOverride(("second",), "int16"),))
    quantized = quantize_graph(graph, ranges, config)
    ops = [n.op for n in quantized.nodes]
    assert ops == ["QuantizeLinear", "QGemm", "Requantize", "QGemm", "DequantizeLinear"]
    want = Interpreter(graph).run({"x": x})[y.name]
    got = Interpreter(quantized).run({"x": x})[y.name]
    assert np.abs(want - got).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("op", sorted(LOOKUP - {"Clip"}))
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_every_table_op_is_its_function_on_the_dequantized_codes(rng, op, dtype):
    """A table op's output is exactly quantize(f(dequantize(q))) of its quantized input."""
    x = rng.uniform(-4, 3, (2, 3, 7)).astype(np.float32)
    node, _, got, params = _quantized_pair(
        lambda g, v: g.make_node(op, [v]).output, None, [x], dtype
    )
    assert node.op == "QLookup"
    in_params = node.inputs[0].quant  # the parameters the quantizer gave its input
    (f,) = OPS[op].kernel({}, dequantize(quantize(x, in_params, dtype), in_params))
    np.testing.assert_array_equal(got, dequantize(quantize(f, params, dtype), params))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_per_code_tables_equal_the_arithmetic(rng, monkeypatch, dtype):
    """QAdd's addends, Requantize and QConcat's inputs run through a table over every input
    code once the input is larger than the table: the same integers as the arithmetic on
    each element (every code present, both ends included, per-tensor parameters)."""
    from onebuild.graph_ir.ops import quantized

    info = np.iinfo(dtype)
    size = 3 << 8 * np.dtype(dtype).itemsize
    a = rng.integers(info.min, info.max + 1, size).astype(dtype)
    b = rng.integers(info.min, info.max + 1, size).astype(dtype)
    a[:2], b[:2] = (info.min, info.max), (info.max, info.min)
    zero = int(info.min) // 3 + 11
    output = {"y_zero_point": zero, "qmin": int(info.min), "qmax": int(info.max), "dtype": dtype}
    add = {"a_zero_point": zero, "b_zero_point": -zero // 2, "a_rescale": [1518500250, 31]}
    add |= {"b_rescale": [1073741824, 32], "multiplier": 1789569707, "shift": 40, **output}
    convert = {"x_zero_point": zero, "multiplier": 1288490189, "shift": 33, **output}
    cases = [("QAdd", add, (a, b)), ("QAdd", {**add, "subtract": 1}, (a, b))]
    concat = {"axis": 0, "x_zero_points": [zero, -zero // 2], "multiplier": [1288490189] * 2}
    concat |= {"shift": [33, 31], **output}
    cases += [("Requantize", convert, (a,)), ("QConcat", concat, (a, b))]
    tabled = [OPS[op].kernel(attrs, *args)[0] for op, attrs, args in cases]
    used = []
    per_code = quantized._per_code
    monkeypatch.setattr(
        quantized, "_per_code", lambda *args: used.append(per_code(*args) is not None)
    )
    for (op, attrs, args), got in zip(cases, tabled):
        (want,) = OPS[op].kernel(attrs, *args)
        assert got.dtype == want.dtype and np.array_equal(got, want), op
    assert used and all(used)  # the tables were taken, and the second runs did not use them
