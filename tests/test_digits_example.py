"""The trained example model: float accuracy measured by the reference interpreter."""

import subprocess
import sys
from pathlib import Path

import numpy as np

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_model
from onebuild.npz import read_npz

EXAMPLE = Path(__file__).parent.parent / "examples" / "digits"


def test_float_test_accuracy_is_at_least_95_percent():
    model = load_model(EXAMPLE / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    images = read_npz(EXAMPLE / "data" / "test.npz")
    labels = read_npz(EXAMPLE / "data" / "test_labels.npz")["labels"]
    logits = Interpreter(model.main).run_batch(images)["logits"][:, 0]
    accuracy = float(np.mean(logits.argmax(axis=1) == labels))
    assert len(labels) == 360 and accuracy >= 0.95, accuracy


def test_data_files_follow_the_npz_convention():
    for name in ("calib", "eval", "test"):
        data = read_npz(EXAMPLE / "data" / f"{name}.npz")
        assert list(data) == ["input"] and data["input"].shape[1:] == (1, 1, 8, 8)
        assert data["input"].dtype == np.float32 and 0 <= data["input"].min() <= 1


def test_cli_run_on_the_test_set(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onebuild.cli",
            "run",
            str(EXAMPLE / "digits.onnx"),
            "--input-shape",
            "input=1,1,8,8",
            "-i",
            str(EXAMPLE / "data" / "test.npz"),
            "-o",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "logits: float32[360, 1, 10]" in result.stdout
