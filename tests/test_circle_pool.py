"""Pools in circle/tflite, checked in the runtimes that read the files (onert, LiteRT) against
onnxruntime on the source model (float) or onebuild's integer interpreter on the same codes."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import run_litert, run_onert

from onebuild import compile as C
from onebuild.errors import UnsupportedOpsError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.quant.params import quantize
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle


def pool_model(tmp_path, op: str, shape, **attrs):
    """(onebuild model, onnxruntime session) of one pooling node."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    path = tmp_path / "pool.onnx"
    path.write_bytes(make_model([node], [("x", list(shape))], ["y"], opset=19).SerializeToString())
    return load_onnx(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def quantized(model, rng, shape, dtype="uint8"):
    samples = rng.normal(0, 2, (8, *shape)).astype(np.float32)
    stats = C.calibrate(model.main, [("x", {"x": samples})])
    options = C.QuantizeOptions(dtype=dtype, input_type=dtype, output_type=dtype)
    q = C.quantize(model, options, stats)
    return q, quantize(samples, q.main.inputs[0].quant, np.dtype(dtype))


CEIL_INCLUDING_PADS = [  # ceil_mode windows reaching past the end: the overhang is not counted
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
    dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 0, 1]),
]


@pytest.mark.parametrize("attrs", CEIL_INCLUDING_PADS)
def test_ceil_mode_average_counting_pads_in_onert_and_litert(tmp_path, rng, attrs):
    shape = (1, 2, 5, 7)
    model, source = pool_model(
        tmp_path, "AveragePool", shape, ceil_mode=1, count_include_pad=1, **attrs
    )
    x = rng.normal(0, 1, shape).astype(np.float32)
    (want,) = source.run(None, {"x": x})
    lite = run_litert(write_circle(model, "tflite"), [[x]])[0][0]
    np.testing.assert_allclose(lite, want, rtol=1e-6, atol=1e-6)
    onert = run_onert(write_circle(model), tmp_path, [[x]])[0][0]
    np.testing.assert_allclose(onert, want, rtol=1e-6, atol=1e-6)
    q, _ = quantized(model, rng, shape)  # no exact quantized form: named, not written
    with pytest.raises(UnsupportedOpsError, match="QAveragePool \\(node 'pool'\\)"):
        write_circle(q, "tflite")


MAX_EXPLICIT = [  # pads TFLite's SAME does not make: an explicit PADV2 of the lowest code
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
    dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 1, 2], ceil_mode=1),
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("attrs", MAX_EXPLICIT)
def test_quantized_max_pool_with_explicit_pads_in_litert_and_onert(tmp_path, rng, attrs, dtype):
    shape = (1, 2, 5, 7)
    model, _ = pool_model(tmp_path, "MaxPool", shape, **attrs)
    q, codes = quantized(model, rng, shape, dtype)
    ours = Interpreter(q.main).run_batch({"x": codes})["y"]
    lite = run_litert(write_circle(q, "tflite"), [[c] for c in codes])
    np.testing.assert_array_equal(np.stack([r[0] for r in lite]), ours)
    if dtype == "uint8":  # onert 0.1.0 has no int8 TRANSPOSE (the NCHW graph input)
        onert = run_onert(write_circle(q), tmp_path, [[c] for c in codes])
        np.testing.assert_array_equal(np.stack([r[0] for r in onert]), ours)


RESCALING = [  # a QAveragePool whose output parameters differ from its input's
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[1, 2], pads=[1, 0, 1, 1], count_include_pad=1),
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("attrs", RESCALING)
def test_rescaling_average_rounds_once_in_litert_and_onert(tmp_path, rng, attrs, dtype):
    """Within 1 LSB of the integer kernel given the same codes (averaged at the input's
    parameters and then requantized it was 2 LSB off); the circle reads back as the same
    QAveragePool, bit for bit, and as onert computes it (a DEPTHWISE_CONV_2D of ones, its two
    roundings): onert gives the read-back node's codes bit for bit (293 of 1728 codes differ
    from the IR's own rounding with the second window)."""
    shape = (1, 3, 6, 7)
    model, _ = pool_model(tmp_path, "AveragePool", shape, **attrs)
    q, codes = quantized(model, rng, shape, dtype)
    pool = q.main.nodes[0]
    assert pool.op == "QAveragePool" and pool.inputs[0].quant != pool.output.quant
    codes = rng.integers(*_range(dtype), (32, *shape)).astype(dtype)
    ours = Interpreter(q.main).run_batch({"x": codes})["y"].astype(int)
    lite = run_litert(write_circle(q, "tflite"), [[c] for c in codes])
    assert np.abs(np.stack([r[0] for r in lite]).astype(int) - ours).max() <= 1
    if dtype == "uint8":  # onert 0.1.0 has no int8 TRANSPOSE (the NCHW graph input)
        results = run_onert(write_circle(q), tmp_path, [[c] for c in codes])
        onert = np.stack([r[0] for r in results])
        assert np.abs(onert.astype(int) - ours).max() <= 1
        back = read_circle(write_circle(q)).main
        np.testing.assert_array_equal(onert, Interpreter(back).run_batch({"x": codes})["y"])
    data, reason = exact_circle(q)
    assert reason is None and [n.op for n in read_circle(data).main.nodes] == ["QAveragePool"]


def _range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max) + 1
