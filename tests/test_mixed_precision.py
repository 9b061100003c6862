"""Automatic mixed precision on the trained digits CNN and real digit images.

The "outlier" variant has the digits model's float function exactly, but four of conv1's eight
output channels are scaled down 300x and conv2 scales them back up: what BatchNorm folding does
to real networks. Per-tensor uint8 activations then lose those channels entirely.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_partition import assert_package_matches_reference, build_statuses

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.serde import load_onnx

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}


def outlier_digits(path: Path) -> Path:
    model = onnx.load(DIGITS / "digits.onnx")
    weights = {t.name: t for t in model.graph.initializer}
    factors = np.ones(8, np.float32)
    factors[:4] = 1 / 300

    def scale(name: str, fn) -> None:
        array = fn(numpy_helper.to_array(weights[name]).astype(np.float32))
        weights[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))

    scale("w1", lambda w: w * factors[:, None, None, None])
    scale("b1", lambda b: b * factors)
    scale("w2", lambda w: w / factors[None, :, None, None])
    onnx.save(model, path)
    return path


def decoy_digits(path: Path) -> Path:
    """The digits CNN with a decoy and a real problem. Decoy: four of conv1's channels scaled
    down 300x and left so (conv2 reads them at their old weights: they hardly matter), so
    conv1 is the layer with the most local noise per channel. Real problem: four of conv2's
    channels scaled down 300x and scaled back up by the classifier's weights."""
    model = onnx.load(DIGITS / "digits.onnx")
    weights = {t.name: t for t in model.graph.initializer}
    small = np.ones(8, np.float32)
    small[:4] = 1 / 300
    outliers = np.ones(16, np.float32)
    outliers[:4] = 1 / 300

    def scale(name: str, fn) -> None:
        array = fn(numpy_helper.to_array(weights[name]).astype(np.float32))
        weights[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))

    scale("w1", lambda w: w * small[:, None, None, None])
    scale("b1", lambda b: b * small)
    scale("w2", lambda w: w * outliers[:, None, None, None])
    scale("b2", lambda b: b * outliers)
    scale("w3", lambda w: w / np.repeat(outliers, 4)[None, :])  # fc reads channel-major 16x2x2
    onnx.save(model, path)
    return path


def _float(path: Path):
    return optimize(load_onnx(path, SHAPES))


def _quantized_db(path: Path, mixed: MixedPrecisionOptions | None):
    """(the quantized model, its worst output SQNR on the held-out test images)."""
    reference = _float(path)
    specs = [(v.name, v.shape) for v in reference.main.inputs]
    stats = calibrate(reference.main, iter_batches(DIGITS / "data/calib.npz", specs))
    samples = first_samples(DIGITS / "data/calib.npz", specs, 16)
    model = quantize(_float(path), QuantizeOptions(mixed_precision=mixed), stats, samples)
    test = list(iter_batches(DIGITS / "data/test.npz", specs))
    comparison = compare_graphs(reference.main, model.main, test)
    return model, min(o["sqnr_db"] for o in comparison.outputs.values())


def test_outlier_channels_are_promoted_and_the_target_met(tmp_path):
    path = outlier_digits(tmp_path / "outlier.onnx")
    _, uint8_db = _quantized_db(path, None)
    assert uint8_db < 5  # the failure mode: small channels lose every code
    model, mixed_db = _quantized_db(path, MixedPrecisionOptions(target_sqnr_db=30))
    record = json.loads(model.metadata["mixed_precision"])
    assert record["target_met"] and record["sqnr_db"] >= 30
    assert mixed_db >= 30  # holds on the held-out images too
    # conv1's output must stay int16 up to conv2, which reads it; the classifier need not
    assert {"conv1", "pool1", "conv2"} <= set(record["promoted"])
    assert "fc" not in record["promoted"]
    assert record["high_precision_mac_fraction"] < 1
    dtypes = {n.name: n.outputs[0].dtype for n in model.main.nodes}
    assert dtypes["conv1"] == np.int16 and dtypes["fc"] == np.uint8


def test_layers_are_ranked_by_their_effect_at_the_output(tmp_path):
    """conv1 is the locally noisiest layer but its noise hardly reaches the logits; ranking by
    local noise promotes it (and with it conv2, which reads it): every MAC. Measured at the
    output, conv1 stays uint8 and only conv2's channels and the classifier reading them are
    promoted."""
    path = decoy_digits(tmp_path / "decoy.onnx")
    _, uint8_db = _quantized_db(path, None)
    assert uint8_db < 10
    model, mixed_db = _quantized_db(path, MixedPrecisionOptions(target_sqnr_db=30))
    record = json.loads(model.metadata["mixed_precision"])
    assert record["target_met"] and mixed_db >= 30
    assert "conv1" not in record["promoted"] and {"conv2", "fc"} <= set(record["promoted"])
    assert record["high_precision_mac_fraction"] < 0.81  # conv2 + fc: 80.5 % of the MACs
    alone = {layer["node"]: layer["sqnr_db_alone"] for layer in record["sensitivity"]}
    assert alone["conv1"] > 30 > 10 > alone["conv2"]  # measured at the output


def test_a_target_already_met_promotes_nothing(tmp_path):
    model, db = _quantized_db(DIGITS / "digits.onnx", MixedPrecisionOptions(target_sqnr_db=30))
    record = json.loads(model.metadata["mixed_precision"])
    assert record["promoted"] == [] and record["high_precision_mac_fraction"] == 0
    assert len(record["steps"]) == 1 and db > 30


def test_a_mac_budget_is_respected_and_a_missed_target_said(tmp_path):
    path = outlier_digits(tmp_path / "outlier.onnx")
    budget = MixedPrecisionOptions(target_sqnr_db=30, max_high_precision_mac_fraction=0.5)
    model, _ = _quantized_db(path, budget)
    record = json.loads(model.metadata["mixed_precision"])
    assert record["high_precision_mac_fraction"] <= 0.5
    assert record["target_met"] is False  # conv2 alone is 78 % of the MACs
    # the best set within the budget is chosen by its SQNR: no probe stops early
    assert len(record["steps"]) > 2 and all("sqnr_db" in step for step in record["steps"])


@pytest.fixture
def project(tmp_path, rng):
    shutil.copytree(DIGITS / "data", tmp_path / "data")
    outlier_digits(tmp_path / "m.onnx")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        """
[import]
source = "m.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
[quantize]
calibration = "data/calib.npz"
[quantize.mixed_precision]
target_sqnr_db = 30
[quantize.accuracy]
data = "data/test.npz"
min_sqnr_db = 30
[partition]
[codegen]
hw = "trix-m"
[pack]
output = "out/m.nnpkg"
"""
    )
    samples = np.load(tmp_path / "data/test.npz")
    np.savez(tmp_path / "eval.npz", input=samples[samples.files[0]][:8])
    return recipe


def test_a_mixed_precision_build_is_reported_cached_and_bit_exact_on_the_npu(project):
    statuses = build_statuses(project)
    assert statuses["quantize"] == "run" and statuses["evaluate"] == "run"
    report = json.loads((project.parent / "build/r/quantize.accuracy.json").read_text())
    assert report["mixed_precision"]["target_met"]
    assert report["outputs"]["logits"]["sqnr_db"] >= 30
    partition = assert_package_matches_reference(project.parent)
    assert [p["backend"] for p in partition["parts"]] == ["trix"]  # int16 layers on the NPU too
    assert set(build_statuses(project).values()) == {"up-to-date"}
    changed = build_statuses(project, "quantize.mixed_precision.target_sqnr_db=32")
    assert changed["calibrate"] == "up-to-date" and changed["quantize"] == "run"


def test_a_budget_below_the_layers_that_are_always_promoted_ends(tmp_path, monkeypatch):
    """The classifier (2.7 % of the MACs) counted as negligible, so always promoted: a 1 %
    budget cannot be held by any bound; the search still ends, with the best within it."""
    from onebuild.graph_ir.quant import mixed_precision

    monkeypatch.setattr(mixed_precision, "NEGLIGIBLE_MAC_FRACTION", 0.05)
    path = outlier_digits(tmp_path / "outlier.onnx")
    budget = MixedPrecisionOptions(target_sqnr_db=30, max_high_precision_mac_fraction=0.01)
    model, _ = _quantized_db(path, budget)
    record = json.loads(model.metadata["mixed_precision"])
    assert record["high_precision_mac_fraction"] <= 0.01 and record["target_met"] is False


def test_a_budget_gets_the_noise_bound_that_fills_it():
    """The bound that fills a MAC budget is found to within BUDGET_PRECISION, not on a 1.5x
    grid (the PP-OCR classifier's 25 % budget: 21.1 % of the MACs promoted on the grid, 24.2 %
    now); a budget no bound holds gets a bound above the sum of the costs."""
    from onebuild.graph_ir.quant.mixed_precision import BUDGET_PRECISION, budget_bound

    assert 0.7 <= budget_bound(lambda bound: bound >= 0.7, 10.0) <= 0.7 * BUDGET_PRECISION
    assert 0.01 <= budget_bound(lambda bound: bound >= 0.01, 10.0) <= 0.01 * BUDGET_PRECISION
    assert budget_bound(lambda bound: True, 10.0) == 0.0
    assert budget_bound(lambda bound: False, 10.0) > 10.0


def test_a_near_miss_steps_the_noise_bound_gently():
    """After a probe 0.02 dB short the bound shrinks by MIN_STEP (OCR detector: the next set
    met 30 dB at 45.4 % of MACs, where a fixed 1.5x step promoted 63.7 %); far short, by
    SCALE_STEP; never below the budget's bound."""
    from onebuild.graph_ir.quant.mixed_precision import MIN_STEP, SCALE_STEP, scale_down

    assert scale_down(1.0, 29.98, 30.0, 0.0) == pytest.approx(1 / MIN_STEP)
    assert scale_down(1.0, 29.0, 30.0, 0.0) == pytest.approx(10**-0.1)  # the measured excess
    assert scale_down(1.0, 20.0, 30.0, 0.0) == pytest.approx(1 / SCALE_STEP)
    assert scale_down(1.0, 20.0, 30.0, 0.9) == 0.9
