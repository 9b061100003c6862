"""`export` to tflite warns where LiteRT would refuse the file: uint8 layers with per-channel
weights (onebuild's default quantization), which onert runs and LiteRT does not."""

from pathlib import Path

import pytest
from ai_edge_litert.interpreter import Interpreter

from onebuild import compile as api
from onebuild.cli import main
from onebuild.graph_ir.serde import load_model, save_ir
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def _exported(tmp_path: Path, granularity: str) -> Path:
    model = api.optimize(load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}))
    stats = api.calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz"))
    api.quantize(model, api.QuantizeOptions(granularity=granularity), stats)
    save_ir(model, tmp_path / f"{granularity}.obir")
    output = tmp_path / f"{granularity}.tflite"
    assert main(["export", str(tmp_path / f"{granularity}.obir"), "-o", str(output)]) == 0
    return output


def test_uint8_per_channel_weights_warn_and_litert_refuses_them(tmp_path, caplog):
    output = _exported(tmp_path, "channel")
    assert "LiteRT refuses them" in caplog.text and "conv1" in caplog.text
    with pytest.raises(RuntimeError, match="kTfLiteInt8"):
        Interpreter(model_path=str(output)).allocate_tensors()


def test_per_tensor_weights_export_without_a_warning_and_litert_runs_them(tmp_path, caplog):
    output = _exported(tmp_path, "layer")
    assert "LiteRT" not in caplog.text
    Interpreter(model_path=str(output)).allocate_tensors()
