"""A .tflite written by the TensorFlow Lite converter (tests/data/tflite/README.md) imports and
runs to LiteRT's outputs on a real photograph; as .circle (same bytes, identifier CIR0: the
schemas agree on every table used) it imports to the same graph. A .circle written by onert's
own exporter imports and runs to onert's and onnxruntime's outputs."""

from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import interpreter as litert  # the oracles are test extras

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_ir, read_circle, save_ir, write_circle
from onebuild.graph_ir.verify import verify

MODEL = Path(__file__).parent / "data" / "tflite" / "face_detection_short_range.tflite"


def photo() -> np.ndarray:
    """scikit-learn's bundled photograph, cropped to 256x256, halved, scaled to [-1, 1]."""
    from sklearn.datasets import load_sample_image

    image = load_sample_image("china.jpg")[100:356, 200:456][::2, ::2]
    return (image.astype(np.float32) / 127.5 - 1.0)[None]


def litert_outputs(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    interpreter = litert.Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def test_converter_written_tflite_matches_litert(tmp_path):
    save_ir(read_circle(MODEL, "tflite"), tmp_path / "face.obir")
    model = load_ir(tmp_path / "face.obir")
    graph = model.main
    verify(graph)
    ops = [n.op for n in graph.nodes]
    assert ops.count("Conv") == 37 and "Transpose" in ops
    # layout changes only at the input and before the four NHWC-order reshapes
    assert ops.count("Transpose") == 5
    x = photo()
    want = litert_outputs(MODEL, x)
    got = Interpreter(graph).run({graph.inputs[0].name: x})
    assert want.keys() == got.keys() == {"regressors", "classificators"}
    for name, expected in want.items():
        error = np.abs(got[name] - expected).max() / np.abs(expected).max()
        assert error < 1e-5, (name, error)
    # written back by onebuild, LiteRT gives the same numbers again
    again = litert.Interpreter(model_content=write_circle(model, "tflite"))
    again.allocate_tensors()
    again.set_tensor(again.get_input_details()[0]["index"], x)
    again.invoke()
    for detail in again.get_output_details():
        expected = want[detail["name"]]
        error = np.abs(again.get_tensor(detail["index"]) - expected).max()
        assert error / np.abs(expected).max() < 1e-5


def test_same_bytes_as_circle_import_identically(tmp_path):
    data = bytearray(MODEL.read_bytes())
    data[4:8] = b"CIR0"
    circle = read_circle(bytes(data), "circle")
    tflite = read_circle(MODEL, "tflite")
    assert [n.op for n in circle.main.nodes] == [n.op for n in tflite.main.nodes]
    x = {"input": photo()}
    a, b = Interpreter(circle.main).run(x), Interpreter(tflite.main).run(x)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_onert_rejects_reshape_without_shape_tensor():
    """onert 0.1.0 needs RESHAPE's shape as a second input (this converter put it in the
    options only), so it cannot load the model in either format; docs/circle-tflite.md."""
    from onert.native import libnnfw_api_pybind as nnfw

    with pytest.raises(Exception, match="NNFW_STATUS_ERROR"):
        nnfw.infer.nnfw_session(str(MODEL), "cpu")


ONERT_WRITTEN = Path(__file__).parent / "data" / "circle" / "mlp_onert.circle"


def test_circle_written_by_onerts_exporter_matches_onert_and_onnxruntime():
    """tests/data/make_onert_circle.py: the digits MLP as onert's own circle exporter wrote it
    (every table serialized anew) imports, verifies and runs to onert's outputs and to
    onnxruntime's on the ONNX model it came from, on scikit-learn's digits."""
    import onnxruntime as ort
    from onert import infer
    from sklearn.datasets import load_digits

    graph = read_circle(ONERT_WRITTEN).main
    verify(graph)
    assert write_circle(read_circle(ONERT_WRITTEN)) != ONERT_WRITTEN.read_bytes()  # not ours
    x = (load_digits().data[1000:1200] / 16.0).astype(np.float32)
    ours = Interpreter(graph).run_batch({"input": x[:, None]})["logits"][:, 0]
    session = infer.session(str(ONERT_WRITTEN))
    theirs = np.concatenate([session.infer([x[i : i + 1]])[0] for i in range(len(x))])
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    source = ort.InferenceSession(str(ONERT_WRITTEN.parent.parent / "qdq" / "mlp.onnx"))
    (reference,) = source.run(None, {"input": x})
    assert np.abs(ours - reference).max() <= 1e-4 * np.abs(reference).max()
