"""ReduceMean without kept dims (torch's `x.mean((2, 3))`): circle writes MEAN keep_dims = true
+ RESHAPE, which onert runs (it refuses keep_dims = false), and reads it back exactly; the
quantizer treats it as the kept-dims form (a global average pool, then a Reshape of the codes),
so it runs on the NPU instead of splitting NPU-CPU-NPU."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import helper
from onnx_builders import make_model
from test_circle import operator_list, run_litert, run_onert

from onebuild import compile as C
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle
from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent


def digits(count: int) -> np.ndarray:
    return read_npz(ROOT / "examples" / "digits" / "data" / "test.npz")["input"][:count]


def pooled_model(keepdims: int, seed: int = 0):
    """Conv (8 channels) -> Relu -> spatial mean -> Gemm to 10 logits on 8x8 digits; with
    keepdims = 1 the mean is followed by a Flatten (the same function)."""
    rng = np.random.default_rng(seed)
    inits = [
        ("w", rng.normal(0, 0.5, (8, 1, 3, 3)).astype(np.float32)),
        ("b", rng.normal(0, 0.1, 8).astype(np.float32)),
        ("fc", rng.normal(0, 0.5, (10, 8)).astype(np.float32)),
        ("fb", rng.normal(0, 0.1, 10).astype(np.float32)),
        ("axes", np.asarray([2, 3], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=keepdims, name="mean"),
    ]
    if keepdims:
        nodes.append(helper.make_node("Flatten", ["m"], ["f"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["f" if keepdims else "m", "fc", "fb"], ["y"], transB=1))
    return make_model(nodes, [("x", [1, 1, 8, 8])], ["y"], inits, opset=18)


def saved(onnx_model, tmp_path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    return path


def relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_mean_without_kept_dims_runs_in_onert(tmp_path):
    path = saved(pooled_model(0), tmp_path, "gap0")
    model = C.optimize(load_onnx(path))
    assert [n.op for n in model.main.nodes] == ["Conv", "ReduceMean", "Gemm"]
    data, reason = exact_circle(model)  # the round trip gives the IR's outputs bit for bit
    assert reason is None
    assert operator_list(data) == ["TRANSPOSE", "CONV_2D", "MEAN", "RESHAPE", "FULLY_CONNECTED"]
    x = digits(64).reshape(64, 1, 1, 8, 8)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"x": s})[0] for s in x])
    got = np.concatenate([r[0] for r in run_onert(data, tmp_path, [[s] for s in x])])
    assert relative(got, want) < 1e-6
    tflite = write_circle(model, "tflite")
    lite = np.concatenate([r[0] for r in run_litert(tflite, [[s] for s in x])])
    assert relative(lite, want) < 1e-6


def test_channel_mean_without_kept_dims_reads_back_as_itself(tmp_path):
    """Not before a dense layer, the MEAN + RESHAPE folds back into the one IR node."""
    axes = ("axes", np.asarray([1], np.int64))
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0, name="mean")
    path = saved(make_model([node], [("x", [1, 4, 8, 8])], ["y"], [axes], opset=18), tmp_path, "m")
    model = load_onnx(path)
    data, reason = exact_circle(model)
    assert reason is None
    back = read_circle(data).main
    assert [(n.op, n.attrs["axes"], n.attrs["keepdims"]) for n in back.nodes] == [
        ("ReduceMean", [1], 0)
    ]
    x = digits(4).reshape(1, 4, 8, 8).astype(np.float32)  # four digits as channels
    got = run_onert(data, tmp_path, [[x]])[0][0]
    want = Interpreter(model.main).run({"x": x})["y"]
    assert got.shape == want.shape == (1, 8, 8)
    assert relative(got, want) < 1e-6


def quantized(keepdims: int, tmp_path):
    model = C.optimize(load_onnx(saved(pooled_model(keepdims), tmp_path, f"k{keepdims}")))
    x = digits(32).reshape(32, 1, 1, 8, 8).astype(np.float32)
    stats = C.calibrate(model.main, [(f"b{i}", {"x": x[i : i + 8]}) for i in range(0, 32, 8)])
    return C.quantize(model, C.QuantizeOptions(), stats).main, x


def test_mean_without_kept_dims_quantizes_like_the_kept_form(tmp_path):
    dropped, x = quantized(0, tmp_path)
    kept, _ = quantized(1, tmp_path)
    ops = [n.op for n in dropped.nodes]
    assert "ReduceMean" not in ops and "QAveragePool" in ops
    assert ops.count("DequantizeLinear") == 1  # the output's only
    feeds = {"x": x}
    a = Interpreter(dropped).run_batch(feeds)["y"]
    b = Interpreter(kept).run_batch(feeds)["y"]
    np.testing.assert_array_equal(a, b)
    report = C.partition(dropped, "m").report
    assert [p["backend"] for p in report["parts"]] == ["trix"]  # was trix, cpu, trix
