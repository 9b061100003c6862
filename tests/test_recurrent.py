"""LSTM, GRU and RNN against onnxruntime over their options: directions, per-sample sequence
lengths, initial states, peepholes, input-forget coupling, linear_before_reset, clipping,
activations with parameters, batch-first layout."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
CASES = [
    ("LSTM", {}),
    ("LSTM", {"direction": "bidirectional", "lengths": True, "initial": True}),
    ("LSTM", {"direction": "reverse", "lengths": True, "peepholes": True}),
    ("LSTM", {"input_forget": 1, "clip": 0.7}),
    ("LSTM", {"layout": 1, "initial": True}),
    ("GRU", {}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1, "lengths": True}),
    ("GRU", {"activations": ["HardSigmoid", "LeakyRelu"], "alpha": [0.3, 0.05], "beta": [0.4]}),
    ("GRU", {"layout": 1, "direction": "reverse", "initial": True}),
    ("RNN", {"direction": "bidirectional", "lengths": True, "initial": True}),
    ("RNN", {"activations": ["Relu"], "clip": 1.5}),
    ("RNN", {"layout": 1}),
]


def _model(op: str, options: dict, rng, seq=5, batch=3, size=4, hidden=6):
    dirs = 2 if options.get("direction") == "bidirectional" else 1
    layout = options.get("layout", 0)
    shape = [batch, seq, size] if layout else [seq, batch, size]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    weights = {
        "W": rng.normal(0, 0.4, (dirs, GATES[op] * hidden, size)),
        "R": rng.normal(0, 0.4, (dirs, GATES[op] * hidden, hidden)),
        "B": rng.normal(0, 0.2, (dirs, 2 * GATES[op] * hidden)),
    }
    names = ["X", "W", "R", "B", "", "", "", ""]
    feeds = {"X": rng.normal(0, 1, shape).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)]
    if options.get("lengths"):
        names[4] = "L"
        feeds["L"] = rng.integers(1, seq + 1, batch).astype(np.int32)
        inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [batch]))
    if options.get("initial"):
        for index, name in ((5, "H0"), (6, "C0")) if op == "LSTM" else ((5, "H0"),):
            names[index] = name
            feeds[name] = rng.normal(0, 0.5, state).astype(np.float32)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
    if options.get("peepholes"):
        names[7] = "P"
        weights["P"] = rng.normal(0, 0.3, (dirs, 3 * hidden))
    attrs = {"hidden_size": hidden, "direction": options.get("direction", "forward")}
    for key in ("layout", "clip", "input_forget", "linear_before_reset"):
        if key in options:
            attrs[key] = options[key]
    if "activations" in options:
        attrs["activations"] = options["activations"] * dirs
        for key, name in (("alpha", "activation_alpha"), ("beta", "activation_beta")):
            if options.get(key):
                attrs[name] = options[key] * dirs
    count = {"LSTM": 8, "GRU": 6, "RNN": 6}[op]
    names = names[:count]
    while names and not names[-1]:
        names.pop()
    outputs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    node = helper.make_node(op, names, outputs, name="rnn", **attrs)
    initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
    graph = helper.make_graph(
        [node], "g", inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, feeds


@pytest.mark.parametrize(
    ("op", "options"), CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(CASES)]
)
def test_recurrent_layers_match_onnxruntime(op, options):
    """onnxruntime has no batch-first layout: its reference runs the same weights in layout 0
    on transposed data."""
    rng = np.random.default_rng(len(str(options)) + GATES[op])
    model, feeds = _model(op, options, rng)
    batch_first = options.get("layout", 0) == 1
    reference, ort_feeds = onnx.ModelProto(), dict(feeds)
    reference.CopyFrom(model)
    if batch_first:  # the same node and weights in layout 0, on transposed data
        node = reference.graph.node[0]
        next(a for a in node.attribute if a.name == "layout").i = 0
        for info in reference.graph.input:
            if info.name != "L":
                dims = info.type.tensor_type.shape.dim
                dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
                ort_feeds[info.name] = feeds[info.name].transpose(1, 0, 2)
    session = ort.InferenceSession(
        reference.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in model.graph.output]
    expected = dict(zip(names, session.run(names, ort_feeds)))
    if batch_first:
        expected = {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2)
                    for k, v in expected.items()}  # fmt: skip
    ir = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()})
    got = Interpreter(ir.main).run(feeds)  # sequence lengths too are run-time data
    for name in names:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


FLOAT_LSTM = '[[quantize.layers]]\nnames = ["lstm"]\ndtype = "float32"\n'


def _conv_lstm_gemm(rng, hidden=8) -> onnx.ModelProto:
    """Conv -> Relu -> [time, batch, features] -> LSTM -> last state -> Gemm (no transB)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1], name="time_major"),
        helper.make_node("LSTM", ["t", "W", "R"], ["Y", "Yh"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["Yh", "axis0"], ["h"], name="last"),
        helper.make_node("Gemm", ["h", "fc"], ["y"], name="fc"),
    ]
    weights = {
        "w": rng.normal(0, 0.3, (4, 2, 3)),
        "W": rng.normal(0, 0.3, (1, 4 * hidden, 4)),
        "R": rng.normal(0, 0.3, (1, 4 * hidden, hidden)),
        "fc": rng.normal(0, 0.3, (hidden, 5)),
    }
    initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


FLOAT_REASON = (
    "LSTM computes in float (a float32 layer, or a requantization out of range); "
    "the NPU runs quantized ops only"
)


@pytest.mark.parametrize(
    ("layers", "op", "why"),
    [("", "QLSTM", "QLSTM is not an NPU operation"), (FLOAT_LSTM, "LSTM", FLOAT_REASON)],
)
def test_a_model_with_an_lstm_builds_for_the_npu_with_the_lstm_on_the_cpu(
    tmp_path, layers, op, why
):
    """Quantized to uint8, the LSTM becomes the integer QLSTM (or stays float in a float32
    layer) and runs as a CPU part of the package, bit-exact with the quantized model."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from onebuild.graph_ir.serde.irfile import load_ir
    from onebuild.npz import read_npz, write_npz

    rng = np.random.default_rng(7)
    onnx.save(_conv_lstm_gemm(rng), tmp_path / "m.onnx")
    write_npz(tmp_path / "c.npz", {"x": rng.normal(size=(8, 1, 2, 16)).astype(np.float32)})
    recipes = Path(__file__).parent.parent / "recipes"
    (tmp_path / "r.toml").write_text(
        f'extends = "{recipes / "npu-uint8.toml"}"\n[import]\nsource = "m.onnx"\n'
        f'[quantize]\ncalibration = "c.npz"\n{layers}[pack]\noutput = "out/m.nnpkg"\n'
    )

    def cli(*args):
        command = [sys.executable, "-m", "onebuild.cli", *args]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr

    cli("build", "r.toml")
    report = json.loads((tmp_path / "build/r/partition/m.partition.json").read_text())
    assert {"node": "lstm", "op": op, "reasons": [why]} in report["fallbacks"]
    quantized = load_ir(tmp_path / "build/r/quantize.obir").main
    assert [n.op for n in quantized.nodes if n.name == "lstm"] == [op]
    cli("run", "out/m.nnpkg", "-i", "c.npz", "-o", "package.npz")
    cli("run", "build/r/quantize.obir", "-i", "c.npz", "-o", "model.npz")
    np.testing.assert_array_equal(
        read_npz(tmp_path / "package.npz")["y"], read_npz(tmp_path / "model.npz")["y"]
    )


@pytest.mark.parametrize(
    ("op", "options"),
    [c for c in CASES if not c[1].get("layout")],
    ids=[f"{o}-{i}" for i, (o, c) in enumerate(CASES) if not c.get("layout")],
)
def test_recurrent_layers_export_back_to_onnx(op, options):
    """Exported to ONNX (the IR's [name, alpha, beta] per function back to activations and
    alpha/beta lists), onnxruntime runs the same numbers as on the original."""
    rng = np.random.default_rng(len(str(options)) + GATES[op])
    model, feeds = _model(op, options, rng)
    exported = export_onnx(import_onnx(model))
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(exported.SerializeToString()).run(None, feeds)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
