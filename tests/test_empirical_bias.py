"""Empirical bias correction (quant/empirical_bias.py): on a network whose BatchNorm-folded
channels span 1000x in range (scikit-learn's digits as inputs), per-tensor uint8 activations
crush the small channels to a few codes and shift their means; the corrected biases take the
shift out on held-out images, where plain bias correction (weights only) cannot."""

import numpy as np
import pytest
from test_equalize import _digits, _load, spread_model
from test_trix_sim import assert_bit_exact

from onebuild.compile import QuantizeOptions, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.empirical_bias import correct_biases
from onebuild.graph_ir.quant.model_io import with_quantized_io
from onebuild.targets.trix_sim.hardware import load_hardware


def _quantized(path, calib, bias_correction, **options):
    graph = _load(path)
    stats = calibrate(graph, {"x": calib})
    settings = QuantizeOptions(bias_correction=bias_correction, **options)
    return graph, quantize(Model([_load(path)]), settings, stats, [{"x": calib}]).main


def _outputs(graph, images):
    return Interpreter(graph).run_batch({"x": images})["y"].astype(np.float64)


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    return spread_model(tmp_path_factory.mktemp("spread"))


def test_empirical_correction_removes_the_mean_shift_on_held_out_images(spread):
    calib, evaluation = _digits()
    graph, plain = _quantized(spread, calib, True)
    _, empirical = _quantized(spread, calib, "empirical")
    want = _outputs(graph, evaluation)
    results = {}
    for name, quantized in (("plain", plain), ("empirical", empirical)):
        got = _outputs(quantized, evaluation)
        shift = np.abs((got - want).mean(axis=(0, 1, 3, 4))).max()  # per output channel
        noise = float(np.square(got - want).sum())
        results[name] = (shift, sqnr_db(float(np.square(want).sum()), noise))
    # measured: largest channel shift 0.159 -> 0.054, SQNR 9.38 -> 10.06 dB
    assert results["empirical"][0] < results["plain"][0] / 2
    assert results["empirical"][1] > results["plain"][1] + 0.5


def test_only_the_biases_change(spread):
    calib, _ = _digits()
    _, plain = _quantized(spread, calib, True)
    _, empirical = _quantized(spread, calib, "empirical")
    changed = [
        (a.name, i)
        for a, b in zip(plain.nodes, empirical.nodes)
        for i, (u, v) in enumerate(zip(a.inputs, b.inputs))
        if u is not None and u.is_const and not np.array_equal(u.numpy(), v.numpy())
    ]
    assert changed and all(i == 2 for _, i in changed)  # QConv biases only
    assert [n.op for n in plain.nodes] == [n.op for n in empirical.nodes]


def test_a_model_taking_codes_is_left_as_it_is(spread):
    calib, _ = _digits()
    graph, quantized = _quantized(spread, calib, True, input_type="uint8")
    before = [v.numpy().copy() for n in quantized.nodes for v in n.inputs if v and v.is_const]
    assert correct_biases(graph, quantized, [{"x": calib}]) == 0
    after = [v.numpy() for n in quantized.nodes for v in n.inputs if v and v.is_const]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_the_corrected_model_runs_bit_exactly_on_the_npu(spread, rng):
    calib, _ = _digits()
    _, empirical = _quantized(spread, calib, "empirical")
    assert_bit_exact(with_quantized_io(empirical), load_hardware("trix-m"), "performance", rng)
