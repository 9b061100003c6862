"""Bare circle and tflite models on the device path: the Session and `onebuild run --quantize /
--auto-compile` open them like ONNX models, quantize and compile them; a quantized circle keeps
its parameters. The models are ones onebuild did not write: the digits MLP as onert's own
exporter wrote it (tests/data/make_onert_circle.py), and MediaPipe's BlazeFace as the
TensorFlow Lite converter wrote it (tests/data/tflite/README.md)."""

from pathlib import Path

import numpy as np
import pytest

from onebuild import Session
from onebuild.cli import main
from onebuild.errors import UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import read_circle
from onebuild.npz import read_npz, write_npz

DATA = Path(__file__).parent / "data"
MLP = DATA / "circle" / "mlp_onert.circle"
RECORDS = 12


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's digits (the MLP's own data): 12 images to record, 200 to evaluate."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)[:, None]  # [N, 1, 64]
    return x[:RECORDS], x[1000:1200], data.target[1000:1200]


def tflite_copy(tmp_path: Path) -> Path:
    """The same flatbuffer with the tflite identifier (the schemas agree on every table the
    file uses, as tests/test_circle_foreign.py checks)."""
    data = bytearray(MLP.read_bytes())
    data[4:8] = b"TFL3"
    path = tmp_path / "mlp.tflite"
    path.write_bytes(bytes(data))
    return path


def onnxruntime_logits(x: np.ndarray) -> np.ndarray:
    """The independent reference: onnxruntime on the ONNX model the circle came from."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(DATA / "qdq" / "mlp.onnx"))
    return session.run(None, {"input": x[:, 0]})[0]


@pytest.mark.parametrize("kind", ["circle", "tflite"])
def test_a_bare_flatbuffer_model_auto_compiles_like_onnx(tmp_path, digits, kind):
    calib, test, labels = digits
    path = MLP if kind == "circle" else tflite_copy(tmp_path)
    session = Session(path, workspace=tmp_path / "ws")
    assert session.state == "INITIAL" and session.inputs == {"input": (1, 64)}
    float_logits = np.concatenate([session.run({"input": x})["logits"] for x in test])
    want = onnxruntime_logits(test)
    assert np.abs(float_logits - want).max() <= 1e-4 * np.abs(want).max()
    session.set_odc_param_minmax_records_count(RECORDS)
    for x in calib:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED" and session.reason is None
    npu = np.concatenate([session.run_with_auto_compilation({"input": x})["logits"] for x in test])
    float_accuracy = np.mean(float_logits.argmax(1) == labels)
    npu_accuracy = np.mean(npu.argmax(1) == labels)
    assert float_accuracy > 0.9 and float_accuracy - npu_accuracy <= 0.01
    # a circle's quantized model is a circle, as for circle packages; a tflite's is IR
    quantized = "quantized.circle" if kind == "circle" else "quantized.obir"
    assert session._artifacts["quantized"]["path"] == quantized


def test_a_quantized_circle_keeps_its_parameters_and_compiles(tmp_path, digits):
    calib, test, _ = digits
    maker = Session(MLP, workspace=tmp_path / "ws")
    maker.set_execute_config("DUMP_MINMAX")
    for x in calib:
        maker.run({"input": x})
    maker.set_quantized_model_path(tmp_path / "q.circle")
    assert maker.quantize() == tmp_path / "q.circle"
    expected = [maker.run({"input": x})["logits"] for x in test[:20]]
    session = Session(tmp_path / "q.circle")
    assert session.state == "QUANTIZED" and session.workspace is None
    written = read_circle(tmp_path / "q.circle").main
    params = {v.name: v.quant for n in written.nodes for v in n.outputs if v.quant is not None}
    mine = {v.name: v.quant for n in session._model.graph.nodes for v in n.outputs}
    assert len(params) >= 5 and all(mine[name] == quant for name, quant in params.items())
    for x, want in zip(test[:20], expected):
        np.testing.assert_array_equal(session.run({"input": x})["logits"], want)
    assert session.codegen("trix_sim") == tmp_path / "q.tvn"
    assert session.state == "COMPILED"
    for node in written.nodes:  # the NPU rounds as onebuild does, not as onert (circle_arith)
        node.attrs.pop("rounding", None)
    npu = Interpreter(written).run_batch({"input": test[:20]})["logits"]
    for x, want in zip(test[:20], npu):  # bit-exact with the quantized model's parameters
        np.testing.assert_array_equal(session.run({"input": x})["logits"], want)
    with pytest.raises(UserError, match="input shapes of a circle/tflite model are fixed"):
        Session(MLP, workspace=tmp_path / "ws2", input_shapes={"input": [1, 64]})


def test_cli_quantizes_and_auto_compiles_circle_and_tflite(tmp_path, digits, capsys):
    calib, test, _ = digits
    inputs = tmp_path / "x.npz"
    write_npz(inputs, {"input": np.concatenate([calib, test[:8]])})
    common = ["-i", str(inputs)]
    manual = ["--workspace", str(tmp_path / "ws1"), "--quantize", "uint8", "--minmax-runs",
              str(RECORDS), "--codegen", "trix_sim"]  # fmt: skip
    assert main(["run", str(MLP), *common, "-o", str(tmp_path / "y.npz"), *manual]) == 0
    out = capsys.readouterr().out
    assert "quantized (U8_ASYM):" in out and "state: COMPILED" in out
    auto = ["--workspace", str(tmp_path / "ws2"), "--auto-compile", "--minmax-runs", str(RECORDS)]
    tflite = str(tflite_copy(tmp_path))
    assert main(["run", tflite, *common, "-o", str(tmp_path / "z.npz"), *auto]) == 0
    assert f"run {RECORDS}: switched INITIAL -> COMPILED" in capsys.readouterr().out
    # the same records, the same quantized model: the same NPU outputs either way
    y, z = read_npz(tmp_path / "y.npz")["logits"], read_npz(tmp_path / "z.npz")["logits"]
    np.testing.assert_array_equal(y[RECORDS:], z[RECORDS:])


def test_a_converter_written_tflite_runs_in_the_session_as_litert_does(tmp_path):
    """BlazeFace (float16 weights behind DEQUANTIZE, explicit PAD): the session's float model
    against LiteRT on scikit-learn's photograph."""
    from ai_edge_litert import interpreter as litert
    from sklearn.datasets import load_sample_image

    model = DATA / "tflite" / "face_detection_short_range.tflite"
    x = (load_sample_image("china.jpg")[100:356, 200:456][::2, ::2] / 127.5 - 1.0)[None]
    x = x.astype(np.float32)
    reference = litert.Interpreter(model_path=str(model))
    reference.allocate_tensors()
    reference.set_tensor(reference.get_input_details()[0]["index"], x)
    reference.invoke()
    session = Session(model, workspace=tmp_path / "ws")
    assert session.state == "INITIAL" and session.inputs == {"input": (1, 128, 128, 3)}
    got = session.run({"input": x})
    for detail in reference.get_output_details():
        want = reference.get_tensor(detail["index"])
        error = np.abs(got[detail["name"]] - want).max() / np.abs(want).max()
        assert error < 1e-5, (detail["name"], error)


def test_a_pre_quantized_onnx_model_compiles_beside_itself(tmp_path, digits):
    """A QDQ export (tests/data/make_qdq_models.py) opens QUANTIZED with its own parameters;
    codegen compiles the model as the session prepared it (it said "the session is
    QUANTIZED" and compiled nothing), and the NPU is bit-exact with it."""
    _, test, _ = digits
    model = tmp_path / "cnn_qdq.onnx"
    model.write_bytes((DATA / "qdq" / "cnn_qdq.onnx").read_bytes())
    session = Session(model, input_shapes={"input": [1, 1, 8, 8]})
    assert session.state == "QUANTIZED" and session.workspace is None
    images = test[:20].reshape(20, 1, 1, 8, 8)
    quantized = [session.run({"input": x})["logits"] for x in images]
    assert session.codegen("trix_sim") == tmp_path / "cnn_qdq.tvn"
    assert session.state == "COMPILED"
    for x, want in zip(images, quantized):
        np.testing.assert_array_equal(session.run({"input": x})["logits"], want)


def with_associated_files(model: Path, tmp_path: Path, suffix: str) -> Path:
    """`model` with a zip of associated files appended, as TFLite-Support's MetadataPopulator
    writes them (9 of the 14 .tflite files in the mediapipe wheel carry one)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("labels.txt", "face\n")
    data = bytearray(model.read_bytes())
    if suffix == ".circle":
        data[4:8] = b"CIR0"
    path = tmp_path / f"with_metadata{suffix}"
    path.write_bytes(bytes(data) + buffer.getvalue())
    return path


@pytest.mark.parametrize("suffix", [".tflite", ".circle"])
def test_a_model_with_appended_metadata_zip_is_a_model_everywhere(tmp_path, suffix, capsys):
    """The flatbuffer identifier decides, not the zip's end record: Session, `onebuild inspect`
    and `onebuild run` read the file as the model (they called it "not an nnpackage") and
    give LiteRT's outputs for it (LiteRT reads such files too)."""
    from ai_edge_litert import interpreter as litert
    from sklearn.datasets import load_sample_image

    from onebuild.runtime.package_files import is_package

    model = with_associated_files(DATA / "tflite" / "face_detection_short_range.tflite",
                                  tmp_path, suffix)  # fmt: skip
    assert not is_package(model)
    x = (load_sample_image("china.jpg")[100:356, 200:456][::2, ::2] / 127.5 - 1.0)[None]
    x = x.astype(np.float32)
    tflite = with_associated_files(DATA / "tflite" / "face_detection_short_range.tflite",
                                   tmp_path, ".tflite")  # fmt: skip
    reference = litert.Interpreter(model_path=str(tflite))
    reference.allocate_tensors()
    reference.set_tensor(reference.get_input_details()[0]["index"], x)
    reference.invoke()
    want = {d["name"]: reference.get_tensor(d["index"]) for d in reference.get_output_details()}
    got = Session(model, workspace=False).run({"input": x})
    write_npz(tmp_path / "x.npz", {"input": x[None]})
    files = ["-i", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]
    assert main(["run", str(model), *files]) == 0
    ran = read_npz(tmp_path / "y.npz")
    assert main(["inspect", str(model)]) == 0
    assert "input: float32[1, 128, 128, 3]" in capsys.readouterr().out
    for name, expected in want.items():
        scale = np.abs(expected).max()
        assert np.abs(got[name] - expected).max() / scale < 1e-5, name
        assert np.abs(ran[name][0] - expected).max() / scale < 1e-5, name
