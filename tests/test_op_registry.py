"""One registry entry per op holds all graph_ir knows about it: kernel, type inference, batching
rule, quantization rule. Every op states its rules, every rule has code behind it, and a new op
needs nothing but its `register` call."""

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onebuild.graph_ir import batching
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.ops.registry import (
    PER_SAMPLE,
    QUANT_RULES,
    UNSTATED,
    BatchRule,
    register,
    same_as_input,
    unregister,
)
from onebuild.graph_ir.quant import quantize_graph as qg
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import MultiplierRangeError, quantize_multiplier
from onebuild.graph_ir.serde import load_onnx


def test_every_op_states_its_batch_rule():
    """`batch=None` (never batch-separable) must be written down; forgetting it is an error."""
    unstated = sorted(name for name, op in OPS.items() if op.batch is UNSTATED)
    assert unstated == [], f"ops registered without batch=: {unstated}"
    for name, op in OPS.items():
        assert op.batch is None or isinstance(op.batch, BatchRule), name


def test_every_quant_rule_has_a_dispatch_target():
    assert set(qg.RULES) == set(QUANT_RULES)
    for name, op in OPS.items():
        assert op.quant is None or op.quant in qg.RULES, name
    for applies, emit in qg.RULES.values():
        assert callable(applies) and callable(emit)


def test_register_refuses_unknown_rules_and_duplicates():
    with pytest.raises(ValueError, match="unknown quantization rule"):
        register("TestBadRule", same_as_input, batch=PER_SAMPLE, quant="lookup_table")
    with pytest.raises(TypeError, match="BatchRule"):
        register("TestBadBatch", same_as_input, batch=(0,))
    with pytest.raises(ValueError, match="registered twice"):
        register("Relu", same_as_input, batch=PER_SAMPLE)(lambda attrs, x: x)
    assert OPS["Relu"].quant == "lookup"  # the original entry is untouched


@pytest.fixture
def swish():
    """A test-local elementwise op, stated in one register call and nowhere else."""

    @register("TestSwish", same_as_input, batch=PER_SAMPLE, quant="lookup")
    def test_swish(attrs, x):
        return (x / (1.0 + np.exp(-x))).astype(x.dtype)

    yield "TestSwish"
    unregister("TestSwish")
    assert "TestSwish" not in OPS


def _graph(op: str) -> Graph:
    graph = Graph()
    x = graph.add_input("x", np.float32, (1, 3))
    w = graph.add_constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "w")
    h = graph.make_node("MatMul", [x, w], name="project").output
    y = graph.make_node(op, [h], name="act").output
    graph.outputs = [y]
    return graph


def test_a_new_op_is_batched_and_quantized_by_the_existing_code(rng, swish):
    graph = _graph(swish)
    assert batching.batch_plan(graph) is not None
    interpreter = Interpreter(graph)
    assert interpreter.batchable
    feeds = {"x": rng.normal(0, 2, (5, 1, 3)).astype(np.float32)}
    batched = interpreter.run_batch(feeds, chunk=5)["act"]
    single = np.stack([interpreter.run({"x": s})["act"] for s in feeds["x"]])
    np.testing.assert_array_equal(batched, single)

    ranges = {}
    Interpreter(graph, observer=lambda v, a: ranges.update({v.name: (a.min(), a.max())})).run_batch(
        feeds
    )
    quantized = qg.quantize_graph(graph, ranges, QuantConfig("uint8"))
    ops = {n.name: n.op for n in quantized.nodes}
    assert ops["act"] == "QLookup"
    assert ops["project"] == "QGemm"
    assert swish not in ops.values()  # no float island for it
    got = Interpreter(quantized).run_batch(feeds)["act"]
    assert np.abs(got - batched).max() < 0.05 * np.abs(batched).max()


def test_an_op_without_rules_stays_float_and_unbatched(rng):
    @register("TestPlain", same_as_input, batch=None)
    def test_plain(attrs, x):
        return x * 2

    try:
        graph = _graph("TestPlain")
        assert batching.batch_plan(graph) is None
        ranges = {"x": (-4.0, 4.0), "project": (-4.0, 4.0), "act": (-8.0, 8.0)}
        quantized = qg.quantize_graph(graph, ranges, QuantConfig("uint8"))
        ops = [n.op for n in quantized.nodes]
        assert "TestPlain" in ops and "QGemm" in ops  # its neighbour is still quantized
    finally:
        unregister("TestPlain")


_ONNX_ATTRIBUTE_TYPES = {"INT": int, "FLOAT": float, "STRING": str}


def test_every_declared_onnx_form_matches_the_onnx_schema():
    """An op registered with `onnx=` is the ONNX operator of its name: that operator exists,
    and each attribute the op reads is one of its attributes, of the declared type."""
    declared = {name: op.onnx for name, op in OPS.items() if op.onnx is not None}
    assert len(declared) > 50
    for name, attributes in declared.items():
        schema = onnx.defs.get_schema(name)
        for attribute, kind in attributes.items():
            assert attribute in schema.attributes, f"{name} has no attribute {attribute}"
            onnx_type = schema.attributes[attribute].type.name
            assert _ONNX_ATTRIBUTE_TYPES[onnx_type] is kind, (name, attribute, onnx_type)


def test_an_op_registered_with_its_onnx_form_imports_from_onnx(rng, tmp_path):
    """Nothing but the register call: the importer converts it, the interpreter runs it."""

    @register("Shrink2", same_as_input, batch=PER_SAMPLE, onnx={"lambd": float})
    def shrink2(attrs, x):
        return np.where(np.abs(x) > attrs.get("lambd", 0.5), x, 0).astype(x.dtype)

    try:
        node = helper.make_node("Shrink2", ["x"], ["y"], lambd=1.0)
        info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "xy"]
        model = helper.make_model(helper.make_graph([node], "g", info[:1], info[1:]))
        path = tmp_path / "m.onnx"
        onnx.save(model, path)
        graph = load_onnx(path).main
        x = rng.normal(0, 1, (2, 3)).astype(np.float32)
        got = Interpreter(graph).run({"x": x})["y"]
        np.testing.assert_array_equal(got, np.where(np.abs(x) > 1.0, x, 0))
    finally:
        unregister("Shrink2")


def _mul_graph() -> Graph:
    graph = Graph()
    a = graph.add_input("a", np.float32, (1, 4))
    b = graph.add_input("b", np.float32, (1, 4))
    graph.outputs = [graph.make_node("Mul", [a, b], name="product").output]
    return graph


def test_a_multiplier_out_of_range_keeps_the_node_float_and_says_so(caplog):
    with pytest.raises(MultiplierRangeError):
        quantize_multiplier(2.0**30)
    graph = _mul_graph()
    ranges = {"a": (-1e6, 1e6), "b": (-1e6, 1e6), "product": (-1e-6, 1e-6)}
    with caplog.at_level(logging.INFO, logger="onebuild"):
        quantized = qg.quantize_graph(graph, ranges, QuantConfig("uint8"))
    assert "Mul" in [n.op for n in quantized.nodes]
    assert "QMul" not in [n.op for n in quantized.nodes]
    assert "node 'product' (Mul) stays float: requantization multiplier" in caplog.text


def test_other_errors_in_a_rule_are_not_swallowed(monkeypatch):
    """Before, any ValueError inside a rule silently left the layer in float."""

    def broken(*args):
        raise ValueError("a bug in a rule")

    ranges = {"a": (-1.0, 1.0), "b": (-1.0, 1.0), "product": (-2.0, 2.0)}
    monkeypatch.setattr(qg, "activation_params", broken)
    with pytest.raises(ValueError, match="a bug in a rule"):
        qg.quantize_graph(_mul_graph(), ranges, QuantConfig("uint8"))


def test_a_rule_refuses_an_op_it_has_no_integer_form_for():
    """Registering Div with the binary rule must not quietly emit an integer Add."""

    @register("TestDiv", OPS["Div"].infer, batch=None, quant="binary")
    def test_div(attrs, a, b):
        return a / b

    try:
        graph = _mul_graph()
        graph.outputs = [graph.make_node("TestDiv", graph.inputs, name="ratio").output]
        ranges = {"a": (-1.0, 1.0), "b": (0.5, 1.0), "ratio": (-2.0, 2.0), "product": (-1, 1)}
        with pytest.raises(NotImplementedError, match="no integer form for TestDiv"):
            qg.quantize_graph(graph, ranges, QuantConfig("uint8"))
    finally:
        unregister("TestDiv")
