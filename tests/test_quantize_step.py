"""The [quantize] build step on the digits example: accuracy reported by the step itself,
caching of calibration statistics, calibration data sources, and one-line errors."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from onebuild.engine.dag import build
from onebuild.errors import UserError
from onebuild.npz import read_npz, write_npz
from onebuild.recipe import load_recipe

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "digits.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
[quantize]
calibration = "data/calib.npz"
[quantize.accuracy]
data = "data/test.npz"
labels = "data/test_labels.npz"
[pack]
output = "out/digits.nnpkg"
"""


@pytest.fixture
def project(tmp_path):
    shutil.copy(DIGITS / "digits.onnx", tmp_path)
    shutil.copytree(DIGITS / "data", tmp_path / "data")
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path


def run(project: Path, *overrides: str) -> dict[str, str]:
    plan = load_recipe(project / "r.toml", list(overrides))
    results = build([plan], progress=lambda message: None)
    return {r.step: r.status for r in results}


def report(project: Path) -> dict:
    return json.loads((project / "build/r/quantize.accuracy.json").read_text())


@pytest.mark.parametrize(
    "overrides, max_drop",
    [
        ([], 0.01),
        (["quantize.dtype='int16'"], 0.002),
        (["quantize.mode='weight_only'", "quantize.dtype='int8'"], 0.005),
    ],
)
def test_digits_accuracy_reported_by_the_step(project, overrides, max_drop):
    statuses = run(project, *overrides)
    assert all(status == "run" for status in statuses.values()), statuses
    accuracy = report(project)["accuracy"]
    assert accuracy["reference"] >= 0.95
    assert accuracy["reference"] - accuracy["candidate"] <= max_drop


def test_dtype_change_reuses_calibration_method_change_does_not(project):
    run(project)
    assert run(project, "quantize.dtype='int16'") == {
        "import": "up-to-date",
        "optimize": "up-to-date",
        "calibrate": "up-to-date",
        "quantize": "run",
        "measure": "run",
        "evaluate": "run",
        "pack": "run",
    }
    statuses = run(project, "quantize.dtype='int16'", "quantize.method='mse'")
    assert statuses["import"] == statuses["optimize"] == "up-to-date"
    assert statuses["calibrate"] == statuses["quantize"] == "run"
    # options of other methods are not part of the calibration config
    again = run(
        project, "quantize.dtype='int16'", "quantize.method='mse'", "quantize.min_percentile=5.0"
    )
    assert set(again.values()) == {"up-to-date"}


def test_bias_correction_improves_digits_and_reuses_calibration(project):
    run(project)
    corrected = report(project)["outputs"]["logits"]["sqnr_db"]
    statuses = run(project, "quantize.bias_correction=false")
    assert statuses["calibrate"] == "up-to-date" and statuses["quantize"] == "run"
    plain = report(project)["outputs"]["logits"]["sqnr_db"]
    assert corrected > plain + 0.3  # measured: 39.0 vs 38.3 dB


def test_equalization_reruns_calibration_and_layers_stay_comparable(project):
    """quantize.equalization rescales conv1 -> (relu, max pool) -> conv2 before calibration;
    the gate's float reference is equalized alike, so conv1 still compares like for like."""
    run(project)
    before = {layer["node"]: layer["sqnr_db"] for layer in report(project)["layers"]}
    statuses = run(project, "quantize.equalization=true")
    assert statuses["optimize"] == "up-to-date"
    assert statuses["calibrate"] == statuses["quantize"] == statuses["evaluate"] == "run"
    data = report(project)
    after = {layer["node"]: layer["sqnr_db"] for layer in data["layers"]}
    assert abs(after["conv1"] - before["conv1"]) < 6, (before, after)
    assert data["accuracy"]["reference"] >= 0.95
    assert data["accuracy"]["reference"] - data["accuracy"]["candidate"] <= 0.01


def test_accuracy_gate_fails_the_build_and_names_the_worst_layers(project):
    plan = load_recipe(project / "r.toml", ["quantize.accuracy.min_sqnr_db=80.0"])
    results = {r.step: r for r in build([plan], progress=lambda message: None)}
    assert results["evaluate"].status == "failed"
    error = results["evaluate"].error
    assert "sqnr_db of 'logits'" in error and "worst layers: fc" in error and "\n" not in error
    assert results["pack"].blocked and not (project / "out/digits.nnpkg").exists()
    gate = report(project)["gate"]
    assert gate["passed"] is False and gate["checks"][0]["min"] == 80.0


def test_a_changed_threshold_applies_to_the_stored_measurement(project):
    """Only the gate reruns when a threshold changes: the comparison (measure) is kept, and the
    gate's report holds the same measurement under the new threshold."""
    run(project, "quantize.accuracy.min_sqnr_db=20.0")
    before = report(project)
    measured = (project / "build/r/quantize.measured.json").read_bytes()
    statuses = run(project, "quantize.accuracy.min_sqnr_db=25.0")
    assert statuses["measure"] == "up-to-date" and statuses["evaluate"] == "run", statuses
    assert statuses["quantize"] == statuses["pack"] == "up-to-date"
    after = report(project)
    assert (project / "build/r/quantize.measured.json").read_bytes() == measured
    assert after["gate"]["checks"][0]["min"] == 25.0 and after["gate"]["passed"]
    assert {k: v for k, v in after.items() if k != "gate"} == {
        k: v for k, v in before.items() if k != "gate"
    }
    failed = run(project, "quantize.accuracy.min_sqnr_db=90.0")  # the same measurement, failed
    assert failed["measure"] == "up-to-date" and failed["evaluate"] == "failed"
    assert report(project)["gate"]["passed"] is False


def test_report_has_every_metric_and_a_layer_table(project):
    run(project)
    data = report(project)
    metrics = data["outputs"]["logits"]
    assert set(metrics) == {"mae", "mse", "mape", "mpeir", "sqnr_db", "top1_match", "top5_match"}
    assert metrics["top1_match"] > 0.97 and metrics["sqnr_db"] > 30
    layers = data["layers"]
    assert [layer["node"] for layer in layers][:1] == ["fc"]
    assert layers == sorted(layers, key=lambda layer: layer["sqnr_db"])
    assert data["samples"] == 360


def test_calibration_from_a_folder_matches_one_file(project):
    calib = read_npz(project / "data/calib.npz")["input"]
    folder = project / "calib"
    folder.mkdir()
    for index in range(0, len(calib), 50):  # npz batches
        write_npz(folder / f"part{index:03d}.npz", {"input": calib[index : index + 50]})
    run(project)
    single = (project / "build/r/calibrate.npz").read_bytes()
    assert run(project, f"quantize.calibration='{folder}'")["calibrate"] == "run"
    assert (project / "build/r/calibrate.npz").read_bytes() == single
    np.save(folder / "zz_extra.npy", calib[0])  # one more sample, single-input .npy
    assert run(project, f"quantize.calibration='{folder}'")["calibrate"] == "run"
    (folder / "zz_extra.npy").unlink()
    # removal noticed: same files as before, so the statistics come from the step cache
    assert run(project, f"quantize.calibration='{folder}'")["calibrate"] == "restored"


def test_random_calibration_only_when_asked_and_loudly(project, caplog):
    (project / "r.toml").write_text(RECIPE.replace('calibration = "data/calib.npz"', ""))
    with pytest.raises(UserError, match="full quantization needs calibration data"):
        load_recipe(project / "r.toml")
    with caplog.at_level(logging.WARNING, logger="onebuild"):
        statuses = run(project, "quantize.random_calibration=true")
    assert statuses["calibrate"] == "run"
    assert any("RANDOM" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"image": "x"}, "missing input 'input'"),
        ({"input": "narrow"}, "has shape"),
        ({"input": "nan"}, "sample 3 contains NaN or Inf"),
        ({"input": "few"}, "2 sample(s); at least 10"),
    ],
)
def test_bad_calibration_data_fails_the_step_in_one_line(project, bad, message):
    x = read_npz(project / "data/calib.npz")["input"]
    variants = {"x": x, "narrow": x[..., :4], "few": x[:2], "nan": x.copy()}
    variants["nan"][3, 0, 0, 0, 0] = np.nan
    write_npz(project / "bad.npz", {k: variants[v] for k, v in bad.items()})
    plan = load_recipe(
        project / "r.toml",
        [f"quantize.calibration='{project / 'bad.npz'}'", "quantize.min_samples=10"],
    )
    results = {r.step: r for r in build([plan], progress=lambda message: None)}
    assert results["calibrate"].status == "failed"
    assert message in results["calibrate"].error and "\n" not in results["calibrate"].error


def test_zero_range_tensor_gets_a_valid_scale(project):
    x = read_npz(project / "data/calib.npz")["input"]
    write_npz(project / "zeros.npz", {"input": np.zeros_like(x)})
    run(project, f"quantize.calibration='{project / 'zeros.npz'}'")
    from onebuild.graph_ir.serde import load_ir

    graph = load_ir(project / "build/r/quantize.obir").main
    scales = [s for v in graph.constants.values() if v.quant for s in v.quant.scale]
    scales += [s for n in graph.nodes for v in n.outputs if v.quant for s in v.quant.scale]
    assert scales and all(np.isfinite(s) and s > 0 for s in scales)


def test_empirical_bias_correction_is_a_quantize_setting(project):
    run(project)
    plain = report(project)["outputs"]["logits"]["sqnr_db"]
    statuses = run(project, "quantize.bias_correction='empirical'")
    assert statuses["calibrate"] == "up-to-date" and statuses["quantize"] == "run"
    empirical = report(project)["outputs"]["logits"]["sqnr_db"]
    assert empirical > plain + 0.1  # fitted on the calibration data, measured on the test set
    with pytest.raises(UserError, match="bias_correction"):
        run(project, "quantize.bias_correction='empiric'")


def test_fitted_quantization_learns_on_calibration_data_not_the_gates(project):
    """AdaRound and empirical bias correction learn on the calibration samples: new accuracy
    data reruns the gate only, so the gate measures the model on samples it did not fit."""
    fitted = ["quantize.bias_correction='empirical'", "quantize.weight_rounding='adaround'"]
    run(project, *fitted)
    before = (project / "build/r/quantize.obir").read_bytes()
    test = read_npz(project / "data/test.npz")["input"]
    write_npz(project / "data/test.npz", {"input": test[::-1].copy()})
    labels = read_npz(project / "data/test_labels.npz")
    write_npz(project / "data/test_labels.npz", {k: v[::-1].copy() for k, v in labels.items()})
    statuses = run(project, *fitted)
    assert statuses["quantize"] == "up-to-date" and statuses["evaluate"] == "run"
    assert (project / "build/r/quantize.obir").read_bytes() == before
