"""Integer LSTM / GRU / RNN (QLSTM, QGRU, QRNN; docs/quantization.md, "Recurrent layers").

- The integer kernels against an independent float64 simulation of the documented steps (each
  fixed-point value rounded to its grid: Q3.12 pre-activations, Q0.15 functions, the cell's
  2^-k grid, the hidden codes), on the trained digit classifiers of examples/recurrent and on
  layers with initial states, input-forget coupling, clipping and linear_before_reset.
- SQNR floors against the float model on held-out digit sequences.
- Calibration records the LSTM cell states; layers the rule cannot take stay float.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_recurrent import CASES, _model

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.ops.recurrent import cell_state_name, lstm_reporting_cells
from onebuild.graph_ir.quant.calibrate import RangeRecorder, calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import dequantize, quantize, weight_params
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz

EXAMPLES = Path(__file__).parent.parent / "examples" / "recurrent"
DIGIT_MODELS = sorted(EXAMPLES.glob("*.onnx"))
GATES = {"QLSTM": 4, "QGRU": 3, "QRNN": 1}


def _grid(values: np.ndarray, bits: int) -> np.ndarray:
    """Round to the int16 grid of scale 2^-bits (ties up, as every rescale), saturated."""
    return np.clip(np.floor(values * 2.0**bits + 0.5), -32768, 32767) / 2.0**bits


def _table(values: np.ndarray) -> np.ndarray:
    """A gate function's value on the Q0.15 grid (ties to even, as the tables)."""
    return np.clip(np.rint(values * 2.0**15), -32768, 32767) / 2.0**15


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _rows(weight: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric quantization of [dirs, rows, columns]: the rounded weights and the
    scales [dirs, rows]."""
    flat = weight.reshape(-1, weight.shape[-1]).astype(np.float64)
    params = weight_params(flat, dtype, 0)
    rounded = dequantize(quantize(flat, params, dtype), params).astype(np.float64)
    return rounded.reshape(weight.shape), np.asarray(params.scale).reshape(weight.shape[:2])


def simulate(node, qnode, codes: dict) -> np.ndarray:
    """The hidden codes Y [seq, dirs, batch, hidden] of the float layer `node` run with the
    quantization choices of `qnode` (input/hidden parameters, cell shift), in float64."""
    op, attrs, size = qnode.op, qnode.attrs, node.attrs["hidden_size"]
    x_in, h_out = qnode.inputs[0], qnode.outputs[0]
    s_h, zp = h_out.quant.scale[0], h_out.quant.zero_point[0]
    lo, hi = np.iinfo(attrs["dtype"]).min, np.iinfo(attrs["dtype"]).max

    def hidden(real):  # the real value of the nearest hidden code
        return s_h * (np.clip(np.floor(real / s_h + 0.5) + zp, lo, hi) - zp)

    x = dequantize(codes[x_in.name], x_in.quant).astype(np.float64)
    w_dtype = "int16" if attrs["dtype"] == "int16" else "int8"
    (w, s_w), (r, s_r) = (_rows(node.inputs[i].numpy(), w_dtype) for i in (1, 2))
    rows, s_x = w.shape[1], x_in.quant.scale[0]
    b = node.inputs[3].numpy().astype(np.float64)
    bx = np.rint(b[:, :rows] / (s_x * s_w)) * s_x * s_w
    bh = np.rint(b[:, rows:] / (s_h * s_r)) * s_h * s_r
    clip = round(node.attrs["cell_clip"] * 4096) / 4096 if node.attrs["cell_clip"] else 8.0
    gate = lambda v: np.clip(_grid(v, 12), -clip, clip)  # noqa: E731
    dirs, (seq, batch) = w.shape[0], x.shape[:2]
    y = np.zeros((seq, dirs, batch, size))
    for d in range(dirs):
        h = np.zeros((batch, size))
        c = np.zeros((batch, size))
        if len(qnode.inputs) > 7 and qnode.inputs[7] is not None:
            h = hidden(dequantize(codes[qnode.inputs[7].name][d], qnode.inputs[7].quant))
        if op == "QLSTM" and len(qnode.inputs) > 8 and qnode.inputs[8] is not None:
            c0 = dequantize(codes[qnode.inputs[8].name][d], qnode.inputs[8].quant)
            c = _grid(c0, attrs["cell_shift"])
        steps = (
            range(seq - 1, -1, -1) if d == 1 or node.attrs["direction"] == "reverse" else range(seq)
        )
        for t in steps:
            tx = _grid(x[t] @ w[d].T + bx[d].reshape(-1), 12)
            if op == "QLSTM":
                pre = tx + _grid(h @ r[d].T + bh[d].reshape(-1), 12)
                i, o, f, g = (pre[:, k * size : (k + 1) * size] for k in range(4))
                i, o = _table(_sigmoid(gate(i))), _table(_sigmoid(gate(o)))
                g = _table(np.tanh(gate(g)))
                f = 1 - i if attrs["input_forget"] else _table(_sigmoid(gate(f)))
                c = _grid(f * c + i * g, attrs["cell_shift"])
                h = hidden(o * _table(np.tanh(_grid(c, 12))))
            elif op == "QGRU":
                th = _grid(h @ r[d, : 2 * size].T + bh[d, : 2 * size], 12)
                z = _table(_sigmoid(gate(tx[:, :size] + th[:, :size])))
                reset = _table(_sigmoid(gate(tx[:, size : 2 * size] + th[:, size:])))
                rh, bn = r[d, 2 * size :], bh[d, 2 * size :]
                if attrs["linear_before_reset"]:
                    recurrent = reset * _grid(h @ rh.T + bn, 12)
                else:
                    recurrent = _grid(hidden(reset * h) @ rh.T + bn, 12)  # r·h on hidden codes
                n = _table(np.tanh(gate(tx[:, 2 * size :] + recurrent)))
                h = hidden((1 - z) * n + z * h)
            else:
                h = hidden(_table(np.tanh(gate(tx + _grid(h @ r[d].T + bh[d], 12)))))
            y[t, d] = h
    return np.rint(y / s_h) + zp


def _compare_with_simulation(graph, samples: dict, dtype: str = "uint8"):
    stats = calibrate(graph, samples)
    quantized = quantize_graph(graph, stats.ranges_for(dtype), QuantConfig(dtype=dtype))
    node = next(n for n in graph.nodes if n.op in ("LSTM", "GRU", "RNN"))
    (qnode,) = [n for n in quantized.nodes if n.name == node.name]
    assert qnode.op == "Q" + node.op
    wanted = {v.name for v in qnode.inputs if v is not None} | {qnode.outputs[0].name}
    runs: list[dict] = []

    def capture(value, array):
        if value.name == quantized.inputs[0].name:
            runs.append({})
        if value.name in wanted:
            runs[-1][value.name] = array

    Interpreter(quantized, observer=capture).run_batch(samples)
    got = np.stack([run[qnode.outputs[0].name] for run in runs]).astype(np.int64)
    expected = np.stack([simulate(node, qnode, run) for run in runs])
    return got, expected


@pytest.mark.parametrize("path", DIGIT_MODELS, ids=lambda p: p.stem)
def test_trained_layers_follow_the_float_simulation_of_their_integer_steps(path):
    """The simulation rounds at the same points, in float64 with real (not 31-bit) multipliers:
    a rare tie can go the other way, and the state carries that one code on."""
    graph = import_onnx(onnx.load(path), path.name).main
    samples = {"x": read_npz(EXAMPLES / "data" / "test.npz")["x"][:24]}
    got, expected = _compare_with_simulation(graph, samples)
    assert len(got) == 24 and np.ptp(got) > 200  # the states move over most of the code range
    assert np.abs(got - expected).max() <= 2
    assert (got == expected).mean() >= 0.995


OPTIONS = [
    ("LSTM", {"input_forget": 1, "clip": 0.7}),
    ("LSTM", {"direction": "bidirectional", "initial": True}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", {"direction": "reverse", "initial": True}),
    ("RNN", {"direction": "bidirectional", "initial": True}),
]


@pytest.mark.parametrize(
    ("op", "options"), OPTIONS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPTIONS)]
)
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_layer_options_follow_the_float_simulation(op, options, dtype):
    rng = np.random.default_rng(3)
    model, feeds = _model(op, options, rng)
    graph = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()}).main
    samples = {k: rng.normal(0, 1, (16, *v.shape)).astype(np.float32) for k, v in feeds.items()}
    got, expected = _compare_with_simulation(graph, samples, dtype)
    # a tie rounded the other way is carried on by the state: 2 codes of uint8's 255, 8 of
    # int16's 65535 (a 256 times finer grid; seen: 6, in a reset-gated GRU)
    assert np.abs(got - expected).max() <= (2 if dtype == "uint8" else 8)
    assert (got == expected).mean() >= 0.995


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    error = reference.astype(np.float64) - test
    return sqnr_db(float((reference.astype(np.float64) ** 2).sum()), float((error**2).sum()))


@pytest.mark.parametrize("path", DIGIT_MODELS, ids=lambda p: p.stem)
def test_uint8_layers_keep_their_sqnr_on_held_out_digit_sequences(path):
    """Measured on all 360 test sequences (bench/recurrent_sqnr.py): states 37.3-41.3 dB per
    direction, logits 36.9-40.5 dB, top-1 accuracy within one sequence of float's."""
    assert len(DIGIT_MODELS) == 6
    graph = import_onnx(onnx.load(path), path.name).main
    stats = calibrate(graph, read_npz(EXAMPLES / "data" / "calib.npz"))
    quantized = quantize_graph(graph, stats.ranges_for("uint8"), QuantConfig())
    assert {n.op for n in quantized.nodes} >= {"QLSTM", "QGRU", "QRNN"} & {
        "Q" + n.op for n in graph.nodes
    }
    test = {"x": read_npz(EXAMPLES / "data" / "test.npz")["x"][:120]}
    expected, got = Interpreter(graph).run_batch(test), Interpreter(quantized).run_batch(test)
    for d in range(expected["Y"].shape[2]):  # [N, steps, directions, 1, hidden]
        assert _sqnr(expected["Y"][:, :, d], got["Y"][:, :, d]) >= 35.0
    assert _sqnr(expected["logits"], got["logits"]) >= 34.0
    same = expected["logits"].argmax(-1) == got["logits"].argmax(-1)
    assert same.mean() >= 0.98


def _lstm(options: dict | None = None):
    rng = np.random.default_rng(5)
    model, feeds = _model("LSTM", options or {"initial": True}, rng)
    graph = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()}).main
    samples = {k: rng.normal(0, 1, (8, *v.shape)).astype(np.float32) for k, v in feeds.items()}
    return graph, samples


def test_calibration_records_every_step_of_the_lstm_cell_state():
    graph, samples = _lstm()
    (node,) = graph.nodes
    stats = calibrate(graph, samples)
    lo, hi = stats.ranges[cell_state_name(node.name)]
    final_lo, final_hi = stats.ranges[node.outputs[2].name]  # Y_c: the last step only
    assert lo <= final_lo and hi >= final_hi and (lo < final_lo or hi > final_hi)
    seen = []
    sample = {name: array[0] for name, array in samples.items()}
    reporting = Interpreter(graph, kernels={node.name: lstm_reporting_cells(seen.append)})
    got, expected = reporting.run(sample), Interpreter(graph).run(sample)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    assert len(seen) == 1 and seen[0].shape == expected[node.outputs[0].name].shape  # as Y
    np.testing.assert_array_equal(seen[0][-1], expected[node.outputs[2].name])  # the last: Y_c


def test_statistics_without_cell_states_leave_the_lstm_float():
    """Ranges recorded by a plain observer (the graph's values only) leave the LSTM float."""
    graph, samples = _lstm()
    recorder = RangeRecorder()
    Interpreter(graph, observer=recorder.observe).run_batch(samples)
    quantized = quantize_graph(graph, recorder.stats().ranges, QuantConfig())
    assert [n.op for n in quantized.nodes if n.name == graph.nodes[0].name] == ["LSTM"]


@pytest.mark.parametrize(
    ("op", "options"),
    [
        ("LSTM", {"peepholes": True}),
        ("RNN", {"activations": ["Relu"]}),  # unbounded: no Q0.15 table holds it
        ("GRU", {"activations": ["HardSigmoid", "LeakyRelu"], "alpha": [0.3, 0.05], "beta": [0.4]}),
    ],
)
def test_layers_outside_the_integer_form_stay_float(op, options):
    rng = np.random.default_rng(9)
    model, feeds = _model(op, options, rng)
    graph = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()}).main
    samples = {k: rng.normal(0, 1, (4, *v.shape)).astype(np.float32) for k, v in feeds.items()}
    quantized = quantize_graph(graph, calibrate(graph, samples).ranges, QuantConfig())
    assert [n.op for n in quantized.nodes if n.name == graph.nodes[0].name] == [op]
    reference, got = (
        Interpreter(graph).run_batch(samples),
        Interpreter(quantized).run_batch(samples),
    )
    assert _sqnr(reference["Y"], got["Y"]) >= 30.0


@pytest.mark.parametrize(
    ("op", "options"),
    [case for case in CASES if not case[1].get("peepholes") and "activations" not in case[1]],
    ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value)),
)
def test_every_supported_option_stays_close_to_float(op, options):
    """Sequence lengths, layouts, directions, initial states, clip, coupling, reset placement:
    Y, Y_h (and Y_c) of the integer layer against the float layer, uint8 (random weights, 6
    units; initial states drawn wider than the layer's outputs widen the hidden range: 29 dB)."""
    rng = np.random.default_rng(11)
    model, feeds = _model(op, options, rng)
    graph = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()}).main
    samples = {
        k: np.repeat(v[None], 16, axis=0) if k == "L" else rng.normal(0, 1, (16, *v.shape))
        for k, v in feeds.items()
    }
    samples = {k: v.astype(feeds[k].dtype) for k, v in samples.items()}
    quantized = quantize_graph(graph, calibrate(graph, samples).ranges, QuantConfig())
    assert [n.op for n in quantized.nodes if n.name == graph.nodes[0].name] == ["Q" + op]
    expected, got = Interpreter(graph).run_batch(samples), Interpreter(quantized).run_batch(samples)
    for name in expected:
        assert _sqnr(expected[name], got[name]) >= 27.0, name


def test_qdq_export_of_an_integer_layer_says_how_to_export_it():
    from onebuild.errors import UserError
    from onebuild.graph_ir.ir import Model
    from onebuild.graph_ir.serde.onnx_export import export_onnx

    graph, samples = _lstm()
    quantized = quantize_graph(graph, calibrate(graph, samples).ranges, QuantConfig())
    with pytest.raises(UserError, match=r"node 'rnn' \(QLSTM\) has no QDQ form.*float32"):
        export_onnx(Model([quantized]))


def test_an_on_device_session_records_the_cell_states_and_runs_the_integer_lstm(tmp_path):
    from onebuild import Session
    from onebuild.graph_ir.serde import load_ir

    path = EXAMPLES / "lstm_forward.onnx"
    samples = read_npz(EXAMPLES / "data" / "calib.npz")["x"]
    session = Session(path, workspace=tmp_path / "ws")
    session.set_odc_param_minmax_records_count(6)
    for x in samples[:6]:
        session.run_with_auto_compilation({"x": x})
    assert session.state == "COMPILED", session.reason
    quantized = load_ir(tmp_path / "ws" / "quantized.obir").main
    assert [n.op for n in quantized.nodes if n.name == "lstm"] == ["QLSTM"]
    out = session.run_with_auto_compilation({"x": samples[7]})
    expected = Interpreter(quantized).run({"x": samples[7]})
    np.testing.assert_array_equal(out["logits"], expected["logits"])


def test_recurrent_layers_count_their_multiply_accumulates():
    """Every step, direction and sample multiplies x by W and h by R: the CPU cost model and
    mixed precision's budget see the work (the float and the integer layer alike)."""
    from onebuild.graph_ir.macs import macs

    rng = np.random.default_rng(2)
    model, feeds = _model("GRU", {"direction": "bidirectional"}, rng)  # seq 5, batch 3, 4 -> 6
    graph = import_onnx(model, "m.onnx", {k: list(v.shape) for k, v in feeds.items()}).main
    samples = {k: rng.normal(0, 1, (4, *v.shape)).astype(np.float32) for k, v in feeds.items()}
    quantized = quantize_graph(graph, calibrate(graph, samples).ranges, QuantConfig())
    (qnode,) = [n for n in quantized.nodes if n.op == "QGRU"]
    assert macs(graph.nodes[0]) == macs(qnode) == 5 * 2 * 3 * (3 * 6) * (4 + 6)


def test_stacked_layers_with_the_same_gate_functions_share_one_table_constant():
    """Two LSTMs (sigmoid, tanh, tanh) read one stacked table; each stays exact to its own
    simulation, so the sharing changes bytes on disk only."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    seq, batch, size, hidden = 5, 2, 4, 6
    nodes, inits, source = [], [], "X"
    for layer, width in enumerate((size, hidden)):
        names = [f"W{layer}", f"R{layer}", f"B{layer}"]
        shapes = [(1, 4 * hidden, width), (1, 4 * hidden, hidden), (1, 8 * hidden)]
        for name, shape in zip(names, shapes):
            inits.append(
                numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name)
            )
        nodes.append(helper.make_node("LSTM", [source, *names], [f"Y{layer}"], hidden_size=hidden))
        inits.append(numpy_helper.from_array(np.array([1], np.int64), f"axis{layer}"))
        nodes.append(helper.make_node("Squeeze", [f"Y{layer}", f"axis{layer}"], [f"S{layer}"]))
        source = f"S{layer}"
    graph = helper.make_graph(
        nodes,
        "stacked",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, size])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, [seq, batch, hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    float_graph = import_onnx(model, "m.onnx").main
    samples = {"X": rng.normal(0, 1, (16, seq, batch, size)).astype(np.float32)}
    ranges = calibrate(float_graph, samples).ranges_for("uint8")
    qgraph = quantize_graph(float_graph, ranges, QuantConfig(dtype="uint8"))
    layers = [n for n in qgraph.nodes if n.op == "QLSTM"]
    assert len(layers) == 2
    assert layers[0].inputs[5] is layers[1].inputs[5]  # W, R, bias_x, bias_h, tables
    assert layers[0].inputs[5].shape == (2, 65536)  # sigmoid and tanh
    got, expected = _compare_with_simulation(float_graph, samples)
    np.testing.assert_array_equal(got, expected)
