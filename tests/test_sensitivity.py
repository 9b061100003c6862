"""Each layer quantized alone (quant/sensitivity.py) on the trained digits CNN and real digits."""

from pathlib import Path

import numpy as np
import pytest

from onebuild.compile import QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.sensitivity import _leave_one_out, isolated_output_noise
from onebuild.graph_ir.serde import load_onnx

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
LAYERS = ["conv1", "conv2", "fc"]


@pytest.fixture(scope="module")
def digits():
    reference = optimize(load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})).main
    specs = [(v.name, v.shape) for v in reference.inputs]
    stats = calibrate(reference, iter_batches(DIGITS / "data/calib.npz", specs))
    model = optimize(load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}))
    quantized = quantize(model, QuantizeOptions(), stats).main
    test = first_samples(DIGITS / "data/test.npz", specs, 64)[0]
    return reference, quantized, test


def test_isolated_noises_add_up_to_the_quantized_models(digits):
    reference, quantized, test = digits
    signal, noise = isolated_output_noise(reference, quantized, test, LAYERS)
    actual = compare_graphs(reference, quantized, [("test", test)]).outputs["logits"]["sqnr_db"]
    alone = {n: 10 * np.log10(signal["logits"] / noise[n]["logits"]) for n in LAYERS}
    summed = 10 * np.log10(signal["logits"] / sum(noise[n]["logits"] for n in LAYERS))
    assert all(30 < db < 60 for db in alone.values())  # every layer adds noise, none dominates
    # the sum predicts the uint8 model within 2 dB (39.5 dB), erring on the safe side
    assert actual - 2 < summed <= actual


def test_each_sample_is_bounded_by_what_the_others_reach():
    assert list(_leave_one_out(np.array([1.0, 5.0, 3.0]), largest=True)) == [5, 3, 5]
    assert list(_leave_one_out(np.array([-1.0, -5.0, 0.0]), largest=False)) == [-5, -1, -5]
    assert list(_leave_one_out(np.array([2.0]), largest=True)) == [2]
