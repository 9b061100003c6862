"""A MatMul [..., K] @ [K, N] with constant weights (a sequence nn.Linear) is quantized like the
rank-2 case: a QGemm on its rows, checked against the integer arithmetic written as loops and
against onnxruntime running the QDQ export."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild import compile as api
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx


def _sequence_linear(rng, shape):
    w = rng.standard_normal((shape[-1], 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"]),
        helper.make_node("Add", ["t", "b"], ["y"]),
    ]
    return import_onnx(make_model(nodes, [("x", shape)], ["y"], [("w", w), ("b", b)]))


def _rows_reference(attrs, x, w, b):
    """QGemm over the rows of x, with Python integers: docs/quantization.md, literally."""
    rows = x.reshape(-1, x.shape[-1]).astype(np.int64) - attrs["x_zero_point"]
    out = np.empty((len(rows), w.shape[1]), np.int64)
    for r, row in enumerate(rows):
        for n in range(w.shape[1]):
            acc = sum(int(a) * int(c) for a, c in zip(row, w[:, n])) + int(b[n])
            mult, shift = attrs["multiplier"][n], attrs["shift"][n]
            value = (acc * mult + (1 << (shift - 1))) >> shift
            out[r, n] = min(max(value + attrs["y_zero_point"], attrs["qmin"]), attrs["qmax"])
    return out


@pytest.mark.parametrize("writes", [None, "int16"])  # int16: activation-only promotion
@pytest.mark.parametrize("shape", [[1, 4, 8], [1, 2, 3, 8]])
def test_sequence_matmul_is_an_integer_gemm_on_its_rows(rng, shape, writes):
    model = _sequence_linear(rng, shape)
    samples = {"x": rng.standard_normal((16, *shape)).astype(np.float32)}
    ranges = calibrate(model.main, samples).ranges
    layers = (LayerOverride(("t",), output_dtype=writes),) if writes else ()
    config = QuantConfig("uint8", output_type="uint8", layers=layers)
    graph = quantize_graph(model.main, ranges, config)
    ops = [n.op for n in graph.nodes]
    assert "MatMul" not in ops and ops.count("QGemm") == 1, ops
    assert ("Requantize" in ops) == bool(writes)  # the uint8 Add reads int16 rows converted
    trace = {}
    x = samples["x"][0]
    got = Interpreter(graph, observer=lambda v, a: trace.__setitem__(v.name, a)).run({"x": x})
    gemm = next(n for n in graph.nodes if n.op == "QGemm")
    w, b = gemm.inputs[1].numpy(), gemm.inputs[2].numpy()
    want = _rows_reference(gemm.attrs, trace[gemm.inputs[0].name], w, b)
    np.testing.assert_array_equal(trace[gemm.output.name], want)
    assert gemm.output.dtype == np.dtype(writes or "uint8")
    assert trace[gemm.output.users[0].output.name].dtype == gemm.output.dtype  # the Reshape back
    assert got["y"].shape == (*shape[:-1], 16) and got["y"].dtype == np.uint8

    options = ort.SessionOptions()
    options.log_severity_level = 3
    proto = export_onnx(type(model)([graph])).SerializeToString()
    session = ort.InferenceSession(proto, options, ["CPUExecutionProvider"])
    for sample in samples["x"][:4]:
        ours = Interpreter(graph).run({"x": sample})["y"].astype(np.int64)
        (theirs,) = session.run(None, {"x": sample})
        assert np.abs(ours - theirs.astype(np.int64)).max() <= 1


def test_what_stays_off_the_npu_says_why(rng):
    """The rows QGemm and its Reshapes run on the NPU (tests/test_trix_rows.py); a MatMul of
    two computed tensors stays float and the partition table says it has no constant
    weights."""
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "kt"], ["y"]),
    ]
    model = import_onnx(make_model(nodes, [("x", [1, 4, 8])], ["y"], [("w", w)]))
    samples = {"x": rng.standard_normal((8, 1, 4, 8)).astype(np.float32)}
    graph = quantize_graph(model.main, calibrate(model.main, samples).ranges)
    report = api.partition(graph, "m", codegen=api.CodegenOptions(hw="trix-m")).report
    reasons = {f["op"]: " | ".join(f["reasons"]) for f in report["fallbacks"]}
    assert "QGemm" not in reasons and "Reshape" not in reasons, reasons
    assert "MatMul computes in float (its weights are computed" in reasons["MatMul"]
