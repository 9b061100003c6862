"""onebuild's full quantization vs onnxruntime's quantize_static. Prints JSON, one entry per model.

Both quantizers get the same float ONNX file, the same calibration samples and the same settings:
uint8 asymmetric activations, int8 symmetric per-channel weights, MinMax calibration; onnxruntime
writes QDQ. onebuild runs with its defaults otherwise (bias correction on; `onebuild_plain` is
without it). Accuracy is the SQNR (dB) of each quantized model's logits against the float model on
the same evaluation samples (onebuild's integer reference interpreter; onnxruntime running its own
QDQ model). Time is file in -> quantized model out: onebuild import + O1 + calibration +
quantization + IR file write; onnxruntime quantize_static (which loads, calibrates and writes).
`onebuild_mse` is onebuild with its search-based calibration (`method = "mse"`) instead of MinMax.

Models: the digits CNN with its real calibration/evaluation data, and light ResNet50, SqueezeNet,
ShuffleNet and Inception-v2 graphs with seeded random weights fed seeded uniform [0, 1) images
(argument: samples per set, default 16).
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_onnx, save_ir
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
LIGHT = ["resnet50", "squeezenet", "shufflenet", "inception_v2"]


class Reader(CalibrationDataReader):
    def __init__(self, name: str, samples: np.ndarray):
        self.items = iter([{name: s} for s in samples])

    def get_next(self):
        return next(self.items, None)


def _sqnr(reference: list[np.ndarray], test: list[np.ndarray]) -> float:
    ref, out = (
        np.concatenate([r.ravel() for r in reference]),
        np.concatenate([t.ravel() for t in test]),
    )
    diff = ref.astype(np.float64) - out
    return round(sqnr_db(float(ref.astype(np.float64) @ ref), float(diff @ diff)), 2)


def compare(name: str, path: Path, shapes, calib: np.ndarray, evaluation: np.ndarray, work: Path):
    start = time.perf_counter()
    model = load_onnx(path, shapes)
    run_preset(model)
    graph = model.main
    x, logits = graph.inputs[0].name, graph.outputs[-1].name
    stats = calibrate(graph, {x: calib})
    quantized = quantize_graph(graph, stats.ranges, None, stats.channel_means())
    model.graphs[0] = quantized
    save_ir(model, work / f"{name}.obir")
    onebuild_seconds = time.perf_counter() - start

    float_run = Interpreter(graph)
    reference = [float_run.run({x: s})[logits] for s in evaluation]
    ours = [Interpreter(quantized).run({x: s})[logits] for s in evaluation]
    plain = quantize_graph(graph, stats.ranges, QuantConfig(bias_correction=False))
    ours_plain = [Interpreter(plain).run({x: s})[logits] for s in evaluation]
    searched_stats = calibrate(graph, {x: calib}, "mse")
    searched = quantize_graph(
        graph, searched_stats.ranges_for("uint8"), None, searched_stats.channel_means()
    )
    ours_mse = [Interpreter(searched).run({x: s})[logits] for s in evaluation]

    start = time.perf_counter()
    quantize_static(
        str(path),
        str(work / f"{name}.qdq.onnx"),
        Reader(x, calib),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    ort_seconds = time.perf_counter() - start
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(work / f"{name}.qdq.onnx"), options, providers=["CPUExecutionProvider"]
    )
    index = [o.name for o in session.get_outputs()].index(logits)
    theirs = [session.run(None, {x: s})[index] for s in evaluation]
    return {
        "model": name,
        "calibration_samples": len(calib),
        "evaluation_samples": len(evaluation),
        "sqnr_db": {
            "onebuild": _sqnr(reference, ours),
            "onebuild_plain": _sqnr(reference, ours_plain),
            "onebuild_mse": _sqnr(reference, ours_mse),
            "onnxruntime": _sqnr(reference, theirs),
        },
        "seconds": {"onebuild": round(onebuild_seconds, 3), "onnxruntime": round(ort_seconds, 3)},
        "time_ratio": round(onebuild_seconds / ort_seconds, 3),
    }


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    results = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        calib = read_npz(DIGITS / "data" / "calib.npz")["input"]
        evaluation = read_npz(DIGITS / "data" / "test.npz")["input"]
        shapes = {"input": [1, 1, 8, 8]}
        results.append(compare("digits", DIGITS / "digits.onnx", shapes, calib, evaluation, work))
        for name in LIGHT:
            # the zoo graphs are opset 9, which onnxruntime's quantizer cannot upgrade; both
            # quantizers get the same graph re-exported at opset 21 (no optimization applied)
            proto = export_onnx(import_onnx(light_model(name, seed=1, expose_logits=True)))
            path = work / f"{name}.onnx"
            onnx.save(proto, path)
            shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
            rng = np.random.default_rng(7)
            calib = rng.random((samples, *shape), dtype=np.float32)
            evaluation = rng.random((samples, *shape), dtype=np.float32)
            results.append(compare(name, path, None, calib, evaluation, work))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
