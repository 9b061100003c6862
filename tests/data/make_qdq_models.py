"""Write the pre-quantized ONNX test models of tests/test_qdq_import.py (deterministic).

Float models, all with trained weights on scikit-learn's bundled 8x8 digits:
- cnn: the repo's digits example (`examples/digits/digits.onnx`: Conv, Relu, MaxPool, Flatten,
  Gemm);
- branchy: the same trained weights in a graph that uses every operator onnxruntime quantizes
  (LeakyRelu, Sigmoid, Mul, Add, AveragePool, MaxPool, Concat, GlobalAveragePool);
- mlp: a 64-32-10 Relu MLP trained by scikit-learn (MLPClassifier, fixed seed).
Each is quantized by onnxruntime with the digits calibration set (minmax): QDQ and QOperator,
per tensor and per channel, uint8 activations and int8 weights; int8, uint16 and int16
activations (QDQ); and
`quantize_dynamic` (MatMulInteger / ConvInteger). Run: python tests/data/make_qdq_models.py
"""

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).parent / "qdq"
DIGITS = ROOT / "examples" / "digits"
OPSET = 13


def calibration() -> np.ndarray:
    """The digits calibration set, one [1, 1, 8, 8] sample per row."""
    return np.load(DIGITS / "data" / "calib.npz")["input"].astype(np.float32)


class Reader(CalibrationDataReader):
    def __init__(self, name: str, samples: np.ndarray):
        self.items = iter([{name: x} for x in samples])

    def get_next(self):
        return next(self.items, None)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def branchy() -> onnx.ModelProto:
    """The digits CNN's trained weights behind every operator onnxruntime quantizes."""
    cnn = onnx.load(DIGITS / "digits.onnx")
    w = {t.name: numpy_helper.to_array(t) for t in cnn.graph.initializer}
    w2 = w["w2"]
    w2_cat = np.concatenate([w2 / 2, w2 / 2], axis=1).astype(np.float32)  # over Concat(avg, max)
    inits = [numpy_helper.from_array(a, n) for n, a in w.items() if n != "w2"]
    inits.append(numpy_helper.from_array(w2_cat, "w2"))
    make = helper.make_node
    nodes = [
        make("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        make("LeakyRelu", ["c1"], ["lr"], alpha=0.1),
        make("Sigmoid", ["c1"], ["sg"]),
        make("Mul", ["c1", "sg"], ["silu"]),
        make("Add", ["silu", "lr"], ["a1"]),
        make("AveragePool", ["a1"], ["avg"], kernel_shape=[2, 2], strides=[2, 2]),
        make("MaxPool", ["a1"], ["max"], kernel_shape=[2, 2], strides=[2, 2]),
        make("Concat", ["avg", "max"], ["cat"], axis=1),
        make("Conv", ["cat", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        make("Relu", ["c2"], ["r2"]),
        make("GlobalAveragePool", ["r2"], ["gap"]),
        make("Sigmoid", ["gap"], ["gate"]),
        make("Mul", ["r2", "gate"], ["se"]),
        make("MaxPool", ["se"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        make("Flatten", ["p2"], ["flat"], axis=1),
        make("Gemm", ["flat", "w3", "b3"], ["logits"], transB=1),
    ]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [y], inits)


def mlp() -> onnx.ModelProto:
    """A 64-32-10 Relu MLP trained on digits (pixels / 16, the first 1200 samples)."""
    digits = load_digits()
    x, y = digits.data[:1200] / 16.0, digits.target[:1200]
    clf = MLPClassifier((32,), max_iter=300, random_state=0).fit(x, y)
    (w1, w2), (b1, b2) = clf.coefs_, clf.intercepts_
    inits = [
        numpy_helper.from_array(a.astype(np.float32), n)
        for n, a in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))
    ]
    make = helper.make_node
    nodes = [
        make("MatMul", ["input", "w1"], ["h"]),
        make("Add", ["h", "b1"], ["hb"]),
        make("Relu", ["hb"], ["r"]),
        make("MatMul", ["r", "w2"], ["o"]),
        make("Add", ["o", "b2"], ["logits"]),
    ]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [out], inits)


U8S8 = dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
VARIANTS = {  # name suffix -> quantize_static options
    "qdq": dict(quant_format=QuantFormat.QDQ, **U8S8),
    "qdq_pc": dict(quant_format=QuantFormat.QDQ, per_channel=True, **U8S8),
    "qop": dict(quant_format=QuantFormat.QOperator, **U8S8),
    "qop_pc": dict(quant_format=QuantFormat.QOperator, per_channel=True, **U8S8),
    "qdq_s8": dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    ),
    "qdq_u16": dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt16,
        weight_type=QuantType.QInt8,
    ),
    "qdq_i16": dict(
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt16,
        weight_type=QuantType.QInt16,
    ),
}


def _strip(path: Path) -> None:
    """Drop doc strings and value_info (sizes), keep everything onnxruntime wrote."""
    model = onnx.load(path)
    del model.graph.value_info[:]
    model.producer_version = ""
    onnx.save(model, path)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    samples = calibration()
    flat = samples.reshape(len(samples), 1, 64)
    floats = {
        "cnn": (onnx.load(DIGITS / "digits.onnx"), samples),
        "branchy": (branchy(), samples),
        "mlp": (mlp(), flat),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, data) in floats.items():
            source = Path(tmp) / f"{name}.onnx"
            onnx.save(model, source)
            if name == "mlp":
                onnx.save(model, OUT / "mlp.onnx")
            if name == "branchy":
                onnx.save(model, OUT / "branchy.onnx")
            for suffix, options in VARIANTS.items():
                if (name == "mlp" and suffix not in ("qdq", "qop")) or (
                    name == "branchy" and suffix == "qdq_u16"
                ):
                    continue
                target = OUT / f"{name}_{suffix}.onnx"
                quantize_static(source, target, Reader("input", data), **options)
                _strip(target)
            if name != "branchy":
                target = OUT / f"{name}_dynamic.onnx"
                quantize_dynamic(source, target, weight_type=QuantType.QUInt8)
                _strip(target)
    total = sum(p.stat().st_size for p in OUT.glob("*.onnx"))
    print(f"{len(list(OUT.glob('*.onnx')))} models, {total} bytes")


if __name__ == "__main__":
    main()
