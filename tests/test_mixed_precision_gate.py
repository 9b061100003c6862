"""Mixed precision and the accuracy gate on the digits CNN and real digit images: which samples
the search measured on is recorded, the gate reports the SQNR on the samples the search did
not see (checked against onnxruntime's float outputs), warns when it re-measures the search's
own samples, and a failed gate or a missed target says what to try next."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from test_mixed_precision import decoy_digits

from onebuild.cli import main
from onebuild.engine.dag import build
from onebuild.graph_ir.serde import load_ir
from onebuild.npz import read_npz
from onebuild.recipe import load_recipe

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "digits.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
[quantize]
calibration = "data/calib.npz"
[quantize.mixed_precision]
target_sqnr_db = 40
samples = 1
[quantize.accuracy]
data = "data/test.npz"
min_sqnr_db = 40
"""


@pytest.fixture
def project(tmp_path):
    decoy_digits(tmp_path / "digits.onnx")  # one sample is not the other 359: it overfits
    shutil.copytree(DIGITS / "data", tmp_path / "data")
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path


def run(project: Path, *overrides: str) -> dict:
    plan = load_recipe(project / "r.toml", list(overrides))
    return {r.step: r for r in build([plan], progress=lambda message: None)}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return 10 * np.log10(np.sum(reference**2) / np.sum((reference - test) ** 2))


def test_the_gate_reports_the_samples_the_search_did_not_see(project, caplog):
    with caplog.at_level(logging.INFO, logger="onebuild"):
        results = run(project)
    report = json.loads((project / "build/r/quantize.accuracy.json").read_text())
    record = report["mixed_precision"]
    assert record["measured_on"] == {"data": "accuracy", "samples": 1}
    assert record["target_met"] and record["sqnr_db"] >= 40  # on the sample it tuned on
    # the unseen samples' SQNR against onnxruntime's float outputs and the quantized model's
    images = read_npz(project / "data/test.npz")["input"]
    session = ort.InferenceSession(str(project / "digits.onnx"))
    want = np.concatenate([session.run(None, {"input": image})[0] for image in images[1:]])
    np.savez(project / "unseen.npz", input=images[1:])
    quantized, out = project / "build/r/quantize.obir", project / "q.npz"
    assert main(["run", str(quantized), "-i", str(project / "unseen.npz"), "-o", str(out)]) == 0
    got = read_npz(out)["logits"].reshape(want.shape)
    unseen = record["unseen"]
    assert unseen["samples"] == len(images) - 1 == 359
    assert unseen["sqnr_db"] == pytest.approx(_sqnr_db(want, got), abs=0.01)
    assert unseen["sqnr_db"] < 39.0  # the overfit the gate used to hide
    said = _warnings(caplog)
    tuned = "tuned on the first 1 [quantize.accuracy] samples, which the gate measures again"
    assert any(tuned in m for m in said), said
    overfit = f"{unseen['sqnr_db']:.1f} dB on the 359 it did not see, below its 40 dB target"
    assert any(overfit in m for m in said), said
    # the gate fails on all 360; its message names the promoted worst layers and what to try
    error = results["evaluate"].error
    assert results["evaluate"].status == "failed" and "\n" not in error
    model = load_ir(quantized)
    dtypes = {n.name: str(n.outputs[0].dtype) for n in model.main.nodes}
    for layer in report["layers"][:5]:
        promoted = ", promoted by mixed precision" if layer["node"] in record["promoted"] else ""
        named = f"{layer['node']} ({layer['sqnr_db']:.1f} dB, {dtypes[layer['node']]}{promoted})"
        assert named in error
    assert "int16, promoted by mixed precision" in error
    assert "on the 1 accuracy samples it measured" in error
    assert "try more [quantize.mixed_precision] samples" in error
    # with nothing left to promote, more samples would not help: it says so
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onebuild"):
        run(project, "quantize.mixed_precision.samples=3", "quantize.accuracy.min_sqnr_db=30")
    record = json.loads((project / "build/r/quantize.accuracy.json").read_text())
    record = record["mixed_precision"]
    assert record["high_precision_mac_fraction"] == 1 and record["unseen"]["sqnr_db"] < 40
    assert any("every layer is already int16" in m for m in _warnings(caplog)), caplog.text


def test_without_a_gate_the_search_records_the_calibration_samples(project):
    (project / "r.toml").write_text(RECIPE.split("[quantize.accuracy]")[0])
    run(project, "quantize.mixed_precision.samples=16")
    record = json.loads(load_ir(project / "build/r/quantize.obir").metadata["mixed_precision"])
    assert record["measured_on"] == {"data": "calibration", "samples": 16}


def test_a_missed_target_names_what_limits_the_search(project, caplog):
    with caplog.at_level(logging.WARNING, logger="onebuild"):
        results = run(project, "quantize.mixed_precision.target_sqnr_db=90")  # past the floor
    said = [m for m in _warnings(caplog) if "NOT met" in m]
    assert len(said) == 1 and "(the floor)" in said[0], said
    assert "with every layer in int16 the outputs reach" in said[0]
    assert "max_high_precision_mac_fraction" not in said[0]  # no budget was set
    assert "the floor" in results["evaluate"].error
    caplog.clear()
    budget = "quantize.mixed_precision.max_high_precision_mac_fraction=0.1"
    with caplog.at_level(logging.WARNING, logger="onebuild"):
        results = run(project, budget)
    said = [m for m in _warnings(caplog) if "NOT met" in m]
    assert len(said) == 1 and "max_high_precision_mac_fraction = 0.1 bound it" in said[0], said
    record = json.loads((project / "build/r/quantize.accuracy.json").read_text())
    assert record["mixed_precision"]["high_precision_mac_fraction"] <= 0.1
    assert "bound it" in results["evaluate"].error


def test_a_failed_gate_without_mixed_precision_says_what_to_try(project):
    (project / "r.toml").write_text(
        RECIPE.replace("[quantize.mixed_precision]\ntarget_sqnr_db = 40\nsamples = 1\n", "")
    )
    error = run(project)["evaluate"].error
    assert "try [quantize.mixed_precision] target_sqnr_db = 30" in error
    assert "promoted by mixed precision" not in error and ", uint8)" in error
