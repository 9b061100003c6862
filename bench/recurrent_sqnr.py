"""Integer LSTM / GRU / RNN vs float on real sequences. Prints JSON, one entry per model and dtype.

Models: the digit classifiers of examples/recurrent (8x8 digits read as 8 rows of 8 pixels; one
recurrent layer of 24 units, forward or bidirectional, then a Gemm), trained by
examples/recurrent/train.py. Calibration: the 200 calibration sequences, MinMax. Evaluation: the
360 held-out test sequences, run through the float interpreter and the integer reference.

Per model and activation dtype: SQNR (dB) of the hidden states Y (all steps) overall and per
direction, of the logits, and of the same model with the recurrent layer kept float (a
`float32` layer: the error the rest of the model alone causes); top-1 accuracy float / quantized.
"""

import json
import math
from pathlib import Path

import numpy as np
import onnx

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz

EXAMPLES = Path(__file__).parent.parent / "examples" / "recurrent"
DTYPES = ("uint8", "int8", "int16")


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    value = sqnr_db(float((reference.astype(np.float64) ** 2).sum()),
                    float(((reference - test).astype(np.float64) ** 2).sum()))  # fmt: skip
    return round(value, 2) if math.isfinite(value) else value


def measure(path: Path, calib: dict, test: dict, labels: np.ndarray) -> list[dict]:
    graph = import_onnx(onnx.load(path), path.name).main
    layer = next(n for n in graph.nodes if n.op in ("LSTM", "GRU", "RNN"))
    stats = calibrate(graph, calib)
    reference = Interpreter(graph).run_batch(test)
    results = []
    for dtype in DTYPES:
        ranges = stats.ranges_for(dtype)
        quantized = quantize_graph(graph, ranges, QuantConfig(dtype=dtype))
        ops = [n.op for n in quantized.nodes if n.name == layer.name]
        got = Interpreter(quantized).run_batch(test)
        float_layer = QuantConfig(dtype=dtype, layers=(LayerOverride((layer.name,), "float32"),))
        mixed = Interpreter(quantize_graph(graph, ranges, float_layer)).run_batch(test)
        y, y_q = reference["Y"], got["Y"]  # [N, steps, directions, 1, hidden]
        results.append(
            {
                "model": path.stem,
                "dtype": dtype,
                "layer": ops[0],
                "state_sqnr_db": _sqnr(y, y_q),
                "state_sqnr_db_per_direction": [
                    _sqnr(y[:, :, d], y_q[:, :, d]) for d in range(y.shape[2])
                ],
                "logits_sqnr_db": _sqnr(reference["logits"], got["logits"]),
                "logits_sqnr_db_float_layer": _sqnr(reference["logits"], mixed["logits"]),
                "top1_float": float((reference["logits"][:, 0].argmax(1) == labels).mean()),
                "top1_quantized": float((got["logits"][:, 0].argmax(1) == labels).mean()),
            }
        )
    return results


def main() -> None:
    calib = read_npz(EXAMPLES / "data" / "calib.npz")
    test = read_npz(EXAMPLES / "data" / "test.npz")
    labels = read_npz(EXAMPLES / "data" / "test_labels.npz")["labels"]
    results = []
    for path in sorted(EXAMPLES.glob("*.onnx")):
        results.extend(measure(path, calib, test, labels))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
