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
from onebuild.graph_ir.quant.params import quantize
from onebuild.graph_ir.serde import load_onnx, write_circle


def pool_model(tmp_path, op: str, shape, **attrs):
    """(onebuild model, onnxruntime session) of one pooling node."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    path = tmp_path / "pool.onnx"
    path.write_bytes(make_model([node], [("x", list(shape))], ["y"], opset=19).SerializeToString())
    return load_onnx(path), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def quantized(model, rng, shape):
    samples = rng.normal(0, 2, (8, *shape)).astype(np.float32)
    stats = C.calibrate(model.main, [("x", {"x": samples})])
    options = C.QuantizeOptions(input_type="uint8", output_type="uint8")
    q = C.quantize(model, options, stats)
    return q, quantize(samples, q.main.inputs[0].quant, np.uint8)


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
