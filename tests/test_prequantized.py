"""A model quantized elsewhere (onnxruntime's quantize_static, QDQ) with an op onnxruntime
leaves in float: the session's codegen splits it as it splits a model it quantized itself, a
preset recipe builds it without calibration data, and an accuracy gate says it has nothing to
compare with instead of passing. The model: the trained digits CNN whose logits are centered
by their mean (ReduceMean, Sub: float in onnxruntime's QDQ), on the digits test images."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from onebuild import Session
from onebuild.cli import main
from onebuild.errors import UserError
from onebuild.graph_ir.serde import load_model, write_circle
from onebuild.npz import read_npz, write_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"


class Samples(CalibrationDataReader):
    def __init__(self, images: np.ndarray):
        self.samples = iter([{"input": x} for x in images])

    def get_next(self):
        return next(self.samples, None)


@pytest.fixture(scope="module")
def qdq(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qdq")
    model = onnx.load(DIGITS / "digits.onnx")
    graph = model.graph
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    gemm = graph.node[-1]
    gemm.output[0] = "raw"
    graph.node.extend(
        [
            helper.make_node("ReduceMean", ["raw"], ["mean"], axes=[1], keepdims=1),
            helper.make_node("Sub", ["raw", "mean"], ["logits"]),
        ]
    )
    onnx.save(model, folder / "centered.onnx")
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:64]
    quantize_static(
        folder / "centered.onnx", folder / "centered_qdq.onnx", Samples(calib),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8, per_channel=True,
    )  # fmt: skip
    ops = {node.op_type for node in onnx.load(folder / "centered_qdq.onnx").graph.node}
    assert {"ReduceMean", "Sub", "QuantizeLinear"} <= ops  # the centering stays float
    return folder / "centered_qdq.onnx"


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return read_npz(DIGITS / "data" / "test.npz")["input"][:32]


def onnxruntime_logits(model: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model))
    return np.stack([session.run(["logits"], {"input": x})[0] for x in images])


def lsb(qdq: Path) -> float:
    """The scale of the Gemm output's codes (the last QuantizeLinear before the centering)."""
    model = onnx.load(qdq)
    scales = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "QuantizeLinear"][-1]
    return float(scales[last.input[1]])


def test_codegen_splits_a_prequantized_model_like_its_own(tmp_path, qdq, images):
    model = tmp_path / "m.onnx"
    model.write_bytes(qdq.read_bytes())
    session = Session(model, workspace=tmp_path / "ws")
    assert session.state == "QUANTIZED"
    quantized = np.stack([session.run({"input": x})["logits"] for x in images])
    package = session.codegen("trix_sim")
    assert session.state == "COMPILED" and package == tmp_path / "ws" / "compiled.nnpkg"
    kinds = sorted(p.suffix for p in package.iterdir() if p.is_file())
    assert ".tvn" in kinds and len(kinds) >= 2, kinds  # the NPU part and the float centering
    compiled = np.stack([session.run({"input": x})["logits"] for x in images])
    np.testing.assert_array_equal(compiled, quantized)  # the NPU is bit-exact
    want = onnxruntime_logits(qdq, images)
    steps = np.abs(compiled - want).max() / lsb(qdq)
    print(f"compiled vs onnxruntime's QDQ model: {steps:.2f} LSB of the logits")
    assert steps <= 1.01
    # the CLI's --codegen does the same
    write_npz(tmp_path / "in.npz", {"input": images})
    argv = ["run", str(model), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]
    assert main([*argv, "--codegen", "trix_sim", "--workspace", str(tmp_path / "ws2")]) == 0
    np.testing.assert_array_equal(read_npz(tmp_path / "o.npz")["logits"], compiled)


def test_without_a_workspace_a_prequantized_model_runs_and_a_split_is_refused(tmp_path, qdq):
    """workspace=False: the NPU and CPU parts have nowhere to go (the old code made PATH.odc
    regardless); the session says so in one line and keeps running its quantized model."""
    model = tmp_path / "m.onnx"
    model.write_bytes(qdq.read_bytes())
    session = Session(model, workspace=False)
    with pytest.raises(UserError, match=r"has none \(workspace=False\): give it one"):
        session.codegen("trix_sim")
    assert session.state == "QUANTIZED" and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_preset_builds_a_prequantized_model_without_calibration(tmp_path, qdq, images):
    recipe = tmp_path / "q.toml"
    recipe.write_text(
        f'extends = "npu-uint8"\n[import]\nsource = "{qdq}"\n'
        '[pack]\noutput = "q.nnpkg"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 0
    steps = _package_steps(tmp_path, qdq, images)
    print(f"package vs onnxruntime's QDQ model: {steps:.2f} LSB of the logits")
    assert steps <= 1.01


def _package_steps(tmp_path, qdq, images) -> float:
    """The largest difference between q.nnpkg run by onebuild and onnxruntime's QDQ model, in
    LSBs of the logits."""
    write_npz(tmp_path / "in.npz", {"input": images})
    package = ["run", str(tmp_path / "q.nnpkg"), "-i", str(tmp_path / "in.npz")]
    assert main([*package, "-o", str(tmp_path / "o.npz")]) == 0
    got = read_npz(tmp_path / "o.npz")["logits"]
    return float(np.abs(got - onnxruntime_logits(qdq, images)).max() / lsb(qdq))


@pytest.mark.parametrize("fmt", ["circle", "tflite"])
def test_a_preset_builds_a_prequantized_flatbuffer_without_calibration(
    tmp_path, qdq, images, capsys, fmt
):
    """The same for the QDQ model written as circle / tflite (its activations carry their
    parameters); a float flatbuffer still needs calibration data, said at recipe load."""
    for name, model in (("q", qdq), ("f", DIGITS / "digits.onnx")):
        (tmp_path / f"{name}.{fmt}").write_bytes(write_circle(load_model(model), fmt))
        (tmp_path / f"{name}.toml").write_text(
            f'extends = "npu-uint8"\n[import]\nsource = "{name}.{fmt}"\n'
            f'[pack]\noutput = "{name}.nnpkg"\n[build]\ndir = "build_{name}"\n'
        )
    capsys.readouterr()
    assert main(["list", str(tmp_path / "f.toml")]) == 2
    assert (
        "quantize.calibration: full quantization needs calibration data" in capsys.readouterr().err
    )
    assert main(["build", str(tmp_path / "q.toml")]) == 0
    steps = _package_steps(tmp_path, qdq, images)
    print(f"{fmt} package vs onnxruntime's QDQ model: {steps:.2f} LSB of the logits")
    assert steps <= 1.01


def test_an_accuracy_gate_on_a_prequantized_model_says_it_cannot(tmp_path, qdq, capsys):
    recipe = tmp_path / "q.toml"
    recipe.write_text(
        f'extends = "npu-uint8"\n[import]\nsource = "{qdq}"\n'
        "[quantize]\nrandom_calibration = true\n"
        f'[quantize.accuracy]\ndata = "{DIGITS / "data" / "test.npz"}"\nmin_sqnr_db = 30\n'
        '[pack]\noutput = "q.nnpkg"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "the imported model came quantized, so there is no float model to gate" in err
    assert "gate passed" not in err and "= inf" not in err
    assert not (tmp_path / "q.nnpkg").exists()


def test_a_prequantized_int8_model_says_it_keeps_int8_under_a_uint8_recipe(caplog):
    """The digits CNN quantized to int8 and read back from tflite: asked for uint8, the quantize
    step keeps the file's int8 (it does not requantize) and says so in one warning; asked for
    int8, it says nothing."""
    from onebuild import compile as C
    from onebuild.graph_ir.serde import read_circle

    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    C.optimize(model)
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:64]
    stats = C.calibrate(model.main, [("b", {"input": calib})])
    int8 = C.quantize(model, C.QuantizeOptions(dtype="int8"), stats)
    said = {}
    for dtype in ("uint8", "int8"):
        caplog.clear()
        read = read_circle(write_circle(int8, "tflite"))
        assert C.quantize(read, C.QuantizeOptions(dtype=dtype)) is read
        codes = {v.dtype.name for n in read.main.nodes for v in n.outputs if v.quant}
        assert codes == {"int8"}  # kept as the file has them
        said[dtype] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said["int8"] == []
    (message,) = said["uint8"]
    assert "came quantized with int8 activations and keeps them" in message
    assert 'quantize.dtype = "uint8" does not apply' in message
