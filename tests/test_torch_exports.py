"""Models exported by torch.onnx (committed; see tests/data/torch_exports/make_exports.py), with
dynamic dims fixed by input_shapes, against onnxruntime before and after O1."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_model

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
