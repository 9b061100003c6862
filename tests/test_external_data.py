"""ONNX models whose weights are external data: the weights files are inputs of the import step
(doit's file_dep and the step cache key), so a change to them alone rebuilds the package."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from onebuild.graph_ir.serde.onnx_wire import external_data_files
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "m.onnx"
input_shapes = {{ input = [1, 1, 8, 8] }}
[pack]
output = "out/m.nnpkg"
[build]
cache = "{cache}"
"""


def cli(*args: str, cwd: Path) -> str:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _project(folder: Path, cache: Path) -> Path:
    """The digits model with its weights in `m.weights` beside it."""
    folder.mkdir()
    model = onnx.load(DIGITS / "digits.onnx")
    onnx.save(model, folder / "m.onnx", save_as_external_data=True, location="m.weights",
              size_threshold=0)  # fmt: skip
    (folder / "r.toml").write_text(RECIPE.format(cache=cache))
    shutil.copy(DIGITS / "data" / "test.npz", folder / "test.npz")
    return folder


def _package_matches_onnxruntime(folder: Path) -> np.ndarray:
    cli("run", "out/m.nnpkg", "-i", "test.npz", "-o", "y.npz", cwd=folder)
    got = read_npz(folder / "y.npz")
    session = ort.InferenceSession(str(folder / "m.onnx"), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    x = read_npz(folder / "test.npz")["input"]
    want = np.concatenate([session.run(None, {"input": sample})[0] for sample in x])
    np.testing.assert_allclose(got[name].reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    return want


def test_a_change_to_the_weights_file_alone_rebuilds_the_package(tmp_path):
    cache = tmp_path / "cache"
    first = _project(tmp_path / "a", cache)
    cli("build", "r.toml", cwd=first)
    before = _package_matches_onnxruntime(first)
    model = (first / "m.onnx").read_bytes()

    weights = first / "m.weights"  # the model file is left byte for byte, mtime and all
    weights.write_bytes((np.fromfile(weights, np.float32) * 0.5).tobytes())
    assert "0 up to date" not in cli("build", "r.toml", cwd=first).splitlines()[-1]
    assert (first / "m.onnx").read_bytes() == model
    after = _package_matches_onnxruntime(first)
    assert not np.allclose(before, after)

    # a fresh checkout with the first weights gets the first package from the shared cache,
    # not the entry of the model file it shares
    second = _project(tmp_path / "b", cache)
    cli("build", "r.toml", cwd=second)
    np.testing.assert_array_equal(_package_matches_onnxruntime(second), before)


def test_the_weights_files_are_those_onnx_lists(tmp_path):
    """Initializers, attribute tensors and subgraphs, as onnx's external_data_helper walks
    them; files outside the model's folder or missing are not listed (the import refuses
    them)."""

    def constant(name: str, value: float) -> onnx.NodeProto:
        array = numpy_helper.from_array(np.full(64, value, np.float32), f"{name}_value")
        return helper.make_node("Constant", [], [name], value=array)

    def branch(name: str) -> onnx.GraphProto:
        output = helper.make_tensor_value_info(f"{name}_c", TensorProto.FLOAT, [64])
        return helper.make_graph([constant(f"{name}_c", 2.0)], name, [], [output])

    nodes = [
        constant("c", 1.0),
        helper.make_node("Add", ["x", "w"], ["s"]),
        helper.make_node("Add", ["s", "c"], ["t"]),
        helper.make_node("If", ["flag"], ["b"], then_branch=branch("th"), else_branch=branch("el")),
        helper.make_node("Add", ["t", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        [numpy_helper.from_array(np.ones(64, np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph)
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True,
              all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)  # fmt: skip
    reference = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    locations = {
        entry.value
        for tensor in _get_all_tensors(reference)
        if uses_external_data(tensor)
        for entry in tensor.external_data
        if entry.key == "location"
    }
    assert len(locations) == 4  # w, c's value and one constant per branch
    listed = external_data_files(tmp_path / "m.onnx")
    assert listed == sorted((tmp_path / name).resolve() for name in locations)

    for tensor in _get_all_tensors(reference):  # one outside the folder, one missing
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == listed[0].name:
                entry.value = "../outside.bin"
            elif entry.key == "location" and entry.value == listed[1].name:
                entry.value = "missing.bin"
    (tmp_path.parent / "outside.bin").write_bytes(listed[0].read_bytes())
    onnx.save(reference, tmp_path / "m.onnx")
    assert external_data_files(tmp_path / "m.onnx") == listed[2:]
    (tmp_path / "m.onnx").write_bytes(b"\xff" * 10)  # not a model: its import says why
    assert external_data_files(tmp_path / "m.onnx") == []


def test_a_model_that_moves_its_weights_to_another_file_is_followed_there(tmp_path):
    """The plan kept in the build folder lists the weights files; it is made again when the
    model file changes, so the new file is an input from then on."""
    project = _project(tmp_path / "a", tmp_path / "cache")
    cli("build", "r.toml", cwd=project)
    cli("build", "r.toml", cwd=project)  # the plan is kept from the second build on
    assert (project / "build" / "r" / "plan.json").is_file()
    model = onnx.load(project / "m.onnx")
    onnx.save(model, project / "m.onnx", save_as_external_data=True, location="w2.bin",
              size_threshold=0)  # fmt: skip
    cli("build", "r.toml", cwd=project)
    before = _package_matches_onnxruntime(project)
    weights = project / "w2.bin"
    weights.write_bytes((np.fromfile(weights, np.float32) * 0.5).tobytes())
    cli("build", "r.toml", cwd=project)
    assert not np.allclose(before, _package_matches_onnxruntime(project))


def test_a_weights_file_missing_at_first_is_refused_then_followed(tmp_path):
    """A weights file not there yet (git-lfs, a download after a failed try) is refused in one
    line; no plan is kept without it, so once it is there its changes rebuild."""
    folder = _project(tmp_path / "a", tmp_path / "cache")
    weights = folder / "m.weights"
    kept = weights.read_bytes()
    weights.unlink()
    command = [sys.executable, "-m", "onebuild.cli", "build", "r.toml"]
    for _ in range(2):
        result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert "m.weights" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    weights.write_bytes(kept)
    cli("build", "r.toml", cwd=folder)
    before = _package_matches_onnxruntime(folder)
    weights.write_bytes((np.frombuffer(kept, np.float32) * 0.5).tobytes())
    assert "0 up to date" not in cli("build", "r.toml", cwd=folder).splitlines()[-1]
    assert not np.allclose(before, _package_matches_onnxruntime(folder))
