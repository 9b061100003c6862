"""bench/ort_variants.py: jittered activation scales (the bench's noise estimate) change only
activation scales, by the stated amount, deterministically per seed."""

import importlib.util
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

from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ort_variants", ROOT / "bench" / "ort_variants.py")
variants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variants)
DIGITS = ROOT / "examples" / "digits"


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.items = iter([{"input": s} for s in samples])

    def get_next(self):
        return next(self.items, None)


def _qdq(tmp_path: Path) -> onnx.ModelProto:
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:16]
    proto = onnx.load(DIGITS / "digits.onnx")
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(proto, tmp_path / "digits.onnx")
    quantize_static(
        str(tmp_path / "digits.onnx"),
        str(tmp_path / "qdq.onnx"),
        _Reader(calib),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return onnx.load(tmp_path / "qdq.onnx")


def _initializers(proto):
    return {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}


def test_jitter_scales_only_activation_scales_by_about_the_stated_amount(tmp_path):
    proto = _qdq(tmp_path)
    before = _initializers(proto)
    after = _initializers(variants.jitter_qdq(proto, seed=1))
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    activation_scales = {
        n.input[1]
        for n in proto.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in before
    }
    assert changed == activation_scales and len(changed) >= 4
    ratios = np.array([float(after[n].ravel()[0] / before[n].ravel()[0]) for n in changed])
    assert np.all(np.abs(ratios - 1) < 6 * variants.JITTER)
    assert np.abs(ratios - 1).max() > variants.JITTER / 10  # not a copy
    # the jittered model still runs, and close to the original
    x = read_npz(DIGITS / "data" / "test.npz")["input"][:8]
    runs = [
        ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
        for p in (proto, variants.jitter_qdq(proto, seed=1))
    ]
    a, b = ([r.run(None, {"input": s})[0] for s in x] for r in runs)
    assert np.abs(np.array(a) - np.array(b)).max() < 0.1 * np.abs(np.array(a)).max()


def test_jitter_is_deterministic_per_seed_and_differs_between_seeds():
    ranges = {"a": (-1.0, 2.0), "b": (0.0, 5.0), "c": (-3.0, 0.5)}
    one, again = variants.jitter_ranges(ranges, 3), variants.jitter_ranges(ranges, 3)
    other = variants.jitter_ranges(ranges, 4)
    assert one == again and one != other
    for name, (lo, hi) in ranges.items():  # both ends by one factor: the zero point stays
        factor = one[name][1] / hi
        assert abs(factor - 1) < 6 * variants.JITTER
        assert np.isclose(one[name][0], lo * factor)


def test_a_tensor_named_alike_gets_one_factor_in_both_tools(tmp_path):
    """Paired runs: onebuild's range of a tensor and onnxruntime's scale of the same tensor move
    by the same factor, whatever other names either tool holds."""
    proto = _qdq(tmp_path)
    before, after = _initializers(proto), _initializers(variants.jitter_qdq(proto, seed=2))
    scales = {}  # tensor -> the scale first used for it ("r1" and "p1" share one)
    for n in proto.graph.node:
        quantizes = n.op_type == "QuantizeLinear" and n.input[0] not in before
        if quantizes and n.input[1] not in scales.values():
            scales[n.input[0].removesuffix(variants.OUTPUT_SUFFIX)] = n.input[1]
    assert {"input", "r1", "r2", "logits"} <= set(scales)
    ranges = {name: (-1.0, 1.0) for name in scales}
    ours = variants.jitter_ranges({**ranges, "only_in_onebuild": (0.0, 1.0)}, seed=2)
    for tensor, scale in scales.items():
        theirs = float(after[scale].ravel()[0]) / float(before[scale].ravel()[0])
        assert abs(theirs - ours[tensor][1]) < 1e-6  # float32 scales
    alone = variants.factors(["p1"], seed=2)["p1"]
    assert alone == variants.factors(["p1", "a", "z"], seed=2)["p1"] != 1.0


def test_weights_quantized_from_constant_nodes_keep_their_scales():
    """NNCF's form: a weight in a Constant node quantized by a QuantizeLinear at run time; its
    scale is a weight's and stays, the activation's moves."""
    h = onnx.helper
    weight = onnx.numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32))
    nodes = [
        h.make_node("Constant", [], ["w"], value=weight),
        h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        h.make_node("QuantizeLinear", ["w", "sw", "zw"], ["wq"]),
        h.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"]),
        h.make_node("Conv", ["xd", "wd"], ["y"]),
    ]
    values = {"sx": np.float32(0.1), "zx": np.int8(0), "sw": np.float32(0.01), "zw": np.int8(0)}
    inits = [onnx.numpy_helper.from_array(np.array(v), n) for n, v in values.items()]
    info = h.make_tensor_value_info
    graph = h.make_graph(
        nodes,
        "g",
        [info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
        [info("y", onnx.TensorProto.FLOAT, [1, 2, 2, 2])],
        inits,
    )
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    before, after = _initializers(proto), _initializers(variants.jitter_qdq(proto, seed=1))
    assert after["sw"] == before["sw"] and after["sx"] != before["sx"]
