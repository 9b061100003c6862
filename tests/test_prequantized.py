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


def _onebuild_int8_tflite(io: str = "float32"):
    """The digits CNN quantized to int8 by onebuild (inputs and outputs of type `io`), written
    as tflite and read back."""
    from onebuild import compile as C
    from onebuild.graph_ir.serde import read_circle

    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    C.optimize(model)
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:64]
    stats = C.calibrate(model.main, [("b", {"input": calib})])
    options = C.QuantizeOptions(dtype="int8", input_type=io, output_type=io)
    data = write_circle(C.quantize(model, options, stats), "tflite")
    return read_circle(data)


def test_a_prequantized_int8_model_keeps_int8_and_says_so_when_it_cannot_move(caplog):
    """Asked for int16, the quantize step keeps the file's int8 (a pre-quantized model is not
    requantized) and says so in one warning; asked for int8, it says nothing."""
    from onebuild import compile as C

    said = {}
    for dtype in ("int16", "int8"):
        caplog.clear()
        read = _onebuild_int8_tflite()
        assert C.quantize(read, C.QuantizeOptions(dtype=dtype)) is read
        codes = {v.dtype.name for n in read.main.nodes for v in n.outputs if v.quant}
        assert codes == {"int8"}  # kept as the file has them
        said[dtype] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said["int8"] == []
    (message,) = said["int16"]
    assert "came quantized with int8 activations and keeps them" in message
    assert 'quantize.dtype = "int16" does not apply' in message


@pytest.mark.parametrize("io", ["float32", "int8"])
def test_a_prequantized_int8_model_asked_for_uint8_moves_to_uint8_bit_for_bit(images, io):
    """Asked for uint8, its int8 activations move to uint8 (zero point + 128): the model
    computes the int8 model's codes exactly; int8 inputs and outputs stay int8 (a Requantize
    by 1 at each)."""
    from onebuild import compile as C
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.model_io import quantize_inputs

    reference, moved = _onebuild_int8_tflite(io), _onebuild_int8_tflite(io)
    C.quantize(moved, C.QuantizeOptions(dtype="uint8"))
    graph = moved.main
    inner = [n for n in graph.nodes if n.op != "Requantize"]
    assert {v.dtype.name for n in inner for v in n.outputs if v.quant} == {"uint8"}
    assert [n.op for n in graph.nodes].count("Requantize") == (2 if io == "int8" else 0)
    assert [v.dtype.name for v in (*graph.inputs, *graph.outputs)] == [io, io]
    feeds = {"input": images.reshape(len(images), 1, 1, 8, 8)}
    feeds = quantize_inputs(reference.main, feeds) if io == "int8" else feeds
    want = Interpreter(reference.main).run_batch(feeds)["logits"]
    np.testing.assert_array_equal(Interpreter(graph).run_batch(feeds)["logits"], want)


def test_an_int8_qdq_model_builds_for_the_npu_as_uint8_bit_for_bit(tmp_path, images, capsys):
    """onnxruntime's int8 QDQ of the digits CNN (asymmetric int8 activations) under npu-uint8:
    it went to the CPU whole (the NPU runs uint8 and int16); moved to uint8 it runs on the
    NPU, and the package gives the int8 model's outputs bit for bit."""
    from onebuild.graph_ir.interpreter import Interpreter

    model = onnx.load(DIGITS / "digits.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, tmp_path / "digits.onnx")
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"][:64]
    quantize_static(
        tmp_path / "digits.onnx", tmp_path / "int8.onnx", Samples(calib),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8, per_channel=True,
    )  # fmt: skip
    recipe = tmp_path / "q.toml"
    recipe.write_text(
        'extends = "npu-uint8"\n[import]\nsource = "int8.onnx"\n'
        '[pack]\noutput = "q.nnpkg"\n[build]\ndir = "build"\n'
    )
    assert main(["build", str(recipe)]) == 0
    err = capsys.readouterr().err
    assert "trix         1" in err and "came quantized with int8" not in err
    write_npz(tmp_path / "in.npz", {"input": images})
    run = ["run", str(tmp_path / "q.nnpkg"), "-i", str(tmp_path / "in.npz")]
    assert main([*run, "-o", str(tmp_path / "o.npz")]) == 0
    int8 = load_model(tmp_path / "int8.onnx")
    want = Interpreter(int8.main).run_batch({"input": images})["logits"]
    np.testing.assert_array_equal(read_npz(tmp_path / "o.npz")["logits"], want)


def test_the_session_compiles_an_int8_flatbuffer_for_the_npu_bit_for_bit(tmp_path, images):
    """The session (U8_ASYM) on the int8 tflite: codegen moves its activations to uint8, as
    the build does (it refused: "inputs and output must be quantized tensors of a supported
    dtype"), and the compiled model gives the int8 model's outputs bit for bit."""
    path = tmp_path / "digits_int8.tflite"
    path.write_bytes(write_circle(_onebuild_int8_tflite(), "tflite"))
    session = Session(path, workspace=tmp_path / "ws")
    assert session.state == "QUANTIZED"
    feeds = images.reshape(len(images), 1, 1, 8, 8)[:8]
    want = [session.run({"input": x})["logits"] for x in feeds]
    session.codegen("trix_sim")
    assert session.state == "COMPILED"
    for x, expected in zip(feeds, want):
        np.testing.assert_array_equal(session.run({"input": x})["logits"], expected)
