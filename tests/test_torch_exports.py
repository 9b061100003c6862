"""Models exported by torch.onnx (committed; see tests/data/torch_exports/make_exports.py and
tests/data/make_torch_models.py), with dynamic dims fixed by input_shapes, against onnxruntime
before and after O1; the control-flow model through a recipe build to a package."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sklearn.datasets import load_digits

from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_ir, load_model
from onebuild.npz import write_npz
from onebuild.recipe import load_recipe

FOLDER = Path(__file__).parent / "data" / "torch_exports"
SHAPES = {"cnn": [3, 3, 32, 32], "attn": [2, 5, 32]}


@pytest.mark.parametrize("path", sorted(FOLDER.glob("*.onnx")), ids=lambda p: p.stem)
def test_export_matches_onnxruntime(path, rng):
    shape = SHAPES[path.stem.split("_")[0]]
    model = load_model(path, {"x": shape})
    x = rng.random(shape, dtype=np.float32)
    session = ort.InferenceSession(str(path))
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, {"x": x})))
    for optimized in (False, True):
        if optimized:
            run_preset(model)
        got = Interpreter(model.main).run({"x": x})
        for name in names:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    assert "Shape" not in {n.op for n in model.main.nodes}


def test_export_folder_is_populated():
    assert len(list(FOLDER.glob("*.onnx"))) == 6


# -- recurrent and control-flow models (tests/data/make_torch_models.py), on digits images ------
MODELS = Path(__file__).parent / "data" / "torch_models"
IMAGES = (load_digits().images[:48] / 16.0).astype(np.float32)[:, None, None]  # [48, 1, 1, 8, 8]


def _onnxruntime(path: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path))
    return np.stack([session.run(["y"], {"x": image})[0] for image in images])


def _conditions(graph, images) -> list[bool]:
    """The condition of the graph's If for each image (seen by the interpreter's observer)."""
    condition = next(n for n in graph.nodes if n.op == "If").inputs[0]
    seen: list[bool] = []
    interpreter = Interpreter(graph, lambda v, a: seen.append(bool(a)) if v is condition else None)
    for image in images:
        interpreter.run({"x": image})
    return seen


@pytest.mark.parametrize("name", ["lstm", "gru", "shape_if", "value_if"])
def test_torch_model_matches_onnxruntime(name):
    path = MODELS / f"{name}.onnx"
    model = load_model(path, {"x": [1, 1, 8, 8]})
    want = _onnxruntime(path, IMAGES)
    for optimized in (False, True):
        if optimized:
            run_preset(model)
        got = Interpreter(model.main).run_batch({"x": IMAGES})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    ops = {n.op for n in model.main.nodes}
    assert {"lstm": "LSTM", "gru": "GRU", "shape_if": "Conv", "value_if": "If"}[name] in ops
    if name == "shape_if":  # the exported If checks a shape: folded at import
        assert "If" in {n.op_type for n in onnx.load(path).graph.node} and "If" not in ops
    if name == "value_if":  # real images take both branches
        taken = _conditions(model.main, IMAGES)
        assert 0 < sum(taken) < len(taken)


def test_value_if_pinned_by_a_recipe_folds(tmp_path):
    image = IMAGES[0]
    shutil.copy(MODELS / "value_if.onnx", tmp_path / "m.onnx")
    recipe = tmp_path / "r.toml"
    pinned = json.dumps(image.tolist())
    recipe.write_text(f'[import]\nsource = "m.onnx"\nconstants = {{ x = {pinned} }}\n[optimize]\n')
    results = build([load_recipe(recipe)], progress=lambda message: None)
    assert not [r.error for r in results if r.status == "failed"]
    graph = load_ir(tmp_path / "build/r/optimize.obir").main
    assert "If" not in {n.op for n in graph.nodes} and not graph.inputs
    got = Interpreter(graph).run({})["y"]
    np.testing.assert_allclose(got, _onnxruntime(MODELS / "value_if.onnx", image[None])[0], 1e-4)


def test_value_if_package_keeps_the_if_on_the_cpu_and_is_bit_exact(tmp_path):
    from test_partition import assert_package_matches_reference, build_statuses

    shutil.copy(MODELS / "value_if.onnx", tmp_path / "m.onnx")
    write_npz(tmp_path / "calib.npz", {"x": IMAGES[:32]})
    write_npz(tmp_path / "eval.npz", {"x": IMAGES[32:]})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\ninput_shapes = { x = [1, 1, 8, 8] }\n[optimize]\n'
        '[quantize]\ndtype = "uint8"\ncalibration = "calib.npz"\n[partition]\n'
        '[codegen]\nhw = "trix-m"\n[pack]\noutput = "out/m.nnpkg"\n'
    )
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["cpu", "trix", "cpu", "trix"]
    fallback = next(f for f in report["fallbacks"] if f["op"] == "If")
    assert fallback["reasons"] == ["control flow runs on the CPU"]
    quantized = load_ir(tmp_path / "build/r/quantize.obir").main
    node = next(n for n in quantized.nodes if n.op == "If")
    assert node.inputs[1].producer.op == "DequantizeLinear"  # the If runs in float
    taken = _conditions(quantized, IMAGES[32:])
    assert 0 < sum(taken) < len(taken)
