"""The verifier checks that quantization parameters copied into integer kernels' attributes
agree with the values' own, and runs after quantize, partition and the I/O boundary move."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.compile import QuantizeOptions, calibrate, quantize
from onebuild.errors import IRError
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.verify import verify

DIGITS = Path(__file__).parent.parent / "examples" / "digits" / "digits.onnx"


@pytest.fixture(scope="module")
def quantized():
    model = load_model(DIGITS, {"input": [1, 1, 8, 8]})
    samples = np.random.default_rng(0).random((8, 1, 1, 8, 8), dtype=np.float32)
    stats = calibrate(model.main, {"input": samples})
    return quantize(model, QuantizeOptions(), stats)


def test_a_quantized_graph_verifies(quantized):
    model = quantized
    verify(model.main)


@pytest.mark.parametrize("attr", ["x_zero_point", "y_zero_point"])
def test_a_zero_point_attribute_that_disagrees_is_caught(quantized, attr):
    model = quantized
    node = next(n for n in model.main.nodes if attr in n.attrs and n.op.startswith("Q"))
    original = node.attrs[attr]
    node.attrs[attr] = original + 1
    try:
        with pytest.raises(IRError, match=rf"node '{node.name}'.*{attr} = {original + 1}"):
            verify(model.main)
    finally:
        node.attrs[attr] = original


def test_a_quantize_linear_scale_that_disagrees_is_caught(quantized):
    model = quantized
    node = next(n for n in model.main.nodes if n.op == "QuantizeLinear")
    original = node.attrs["scale"]
    node.attrs["scale"] = [original[0] * 2]
    try:
        with pytest.raises(IRError, match="scale/zero_point attributes"):
            verify(model.main)
    finally:
        node.attrs["scale"] = original
