"""`verify` picks its metrics by the kind of each output: a vector of class scores gets top-1
and top-5 agreement, SQNR and the largest error; maps, sequences and boxes get SQNR, the largest
error and cosine similarity (a detector's map printed top-1 0.25 and MAPE 2174 before)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onebuild.graph_ir.metrics import output_kind
from onebuild.runtime.package import load_package, run_package

ROOT = Path(__file__).parent.parent


def onebuild(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize(
    "shape, kind",
    [((10,), "scores"), ((1, 10), "scores"), ((1, 1, 1, 1000), "scores"),
     ((1, 1, 320, 320), "dense"), ((1, 40, 6625), "dense"), ((1,), "dense"), ((), "dense")],
)  # fmt: skip
def test_output_kind_by_the_axes_holding_values(shape, kind):
    assert output_kind(shape) == kind


def test_a_classifier_is_verified_by_its_top_classes(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    assert onebuild("build", "examples/digits.toml", cwd=tmp_path).returncode == 0
    package, data = tmp_path / "out/digits.nnpkg", tmp_path / "examples/digits/data/test.npz"
    model = tmp_path / "examples/digits/digits.onnx"
    args = ["verify", str(package), "--reference", str(model), "-i", str(data)]
    done = onebuild(*args, "--input-shape", "input=1,1,8,8", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    logits = json.loads(done.stdout)["outputs"]["logits"]
    assert set(logits) == {"kind", "top1_match", "top5_match", "sqnr_db", "max_abs_error"}
    assert logits["kind"] == "scores"
    # against onnxruntime's float logits and the package's, compared here
    images = np.load(data)["input"]
    session = ort.InferenceSession(str(model))
    want = np.concatenate([session.run(["logits"], {"input": x})[0] for x in images])
    got = run_package(load_package(package), {"input": images})[0]["logits"].reshape(want.shape)
    assert logits["top1_match"] == np.mean(want.argmax(1) == got.argmax(1))
    assert logits["max_abs_error"] == pytest.approx(np.abs(want - got).max(), abs=1e-5)
    text = onebuild(*args, "--input-shape", "input=1,1,8,8", cwd=tmp_path).stdout
    assert text.startswith("logits: top1_match ") and "mape" not in text and "cosine" not in text
    assert "('logits': one vector of scores per sample (classification-like)" in text
