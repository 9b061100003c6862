"""A second target, installed only through the `onebuild.targets` entry-point group
(tests/data/tiny_target: its own distribution metadata), compiles, packs, runs and inspects
like trix_sim: nothing outside a target's package knows it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from package_reference import as_packaged

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_ir
from onebuild.npz import read_npz

ROOT = Path(__file__).parent.parent
PLUGIN = Path(__file__).parent / "data" / "tiny_target"
RECIPE = """
[import]
source = "m.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[optimize]
[quantize]
calibration = "calib.npz"
[partition]
[codegen]
target = "tiny"
hw = "tiny-1"
[pack]
output = "out/m.nnpkg"
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PLUGIN)}
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *args], cwd=cwd, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def _model(folder: Path) -> None:
    models = ROOT / "examples" / "models"
    shutil.copy(models / "tiny_mobilenet.onnx", folder / "m.onnx")
    shutil.copy(models / "tiny_mobilenet_calib.npz", folder / "calib.npz")


def test_a_target_known_only_by_its_entry_point_builds_and_runs(tmp_path):
    """The recipe names no backends: the partition takes the target's ("tiny")."""
    _model(tmp_path)
    (tmp_path / "r.toml").write_text(RECIPE)
    targets = json.loads(cli("targets", "--json", cwd=tmp_path).stdout)
    assert {"tiny", "trix_sim"} <= set(targets)

    cli("build", "r.toml", cwd=tmp_path)
    manifest = json.loads((tmp_path / "out/m.nnpkg/metadata/MANIFEST").read_text())
    assert set(manifest["model-types"]) == {"tiny", "circle"}  # CPU parts: circle
    tiny = [m for m, t in zip(manifest["models"], manifest["model-types"]) if t == "tiny"]
    assert tiny and all(m.endswith("_tiny.tiny") for m in tiny)
    config = (tmp_path / "out/m.nnpkg/metadata" / f"{Path(tiny[0]).stem}.cfg").read_text()
    assert "BACKENDS=tiny" in config

    # the package (tiny parts through their target) equals the quantized model (its circle
    # parts as onert computes them: package_reference), bit for bit
    cli("run", "out/m.nnpkg", "-i", "calib.npz", "-o", "package.npz", cwd=tmp_path)
    package = read_npz(tmp_path / "package.npz")
    model = packaged_outputs(
        tmp_path / "build/r/quantize.obir",
        tmp_path / "out/m.nnpkg",
        tmp_path / "build/r/partition",
        tmp_path / "calib.npz",
    )
    assert package.keys() == model.keys()
    for name in model:
        np.testing.assert_array_equal(package[name], model[name])

    binary = tmp_path / "out/m.nnpkg" / tiny[0]
    assert cli("inspect", str(binary), cwd=tmp_path).stdout.startswith("tiny binary:")


def packaged_outputs(quantized: Path, package: Path, parts: Path, inputs: Path) -> dict:
    """The quantized model's outputs as the package computes them (`package_reference`)."""
    graph = as_packaged(load_ir(quantized).main, package, parts)
    return Interpreter(graph).run_batch(read_npz(inputs))


def test_on_device_partitioned_codegen_runs_on_the_targets_backend(tmp_path):
    """On the device, a model the tiny NPU cannot run whole becomes a package whose NPU parts
    run on the target's backend ("tiny", not trix_sim's "trix"), and it runs bit-exact with the
    quantized model. Without --hw, the target's own preset is used."""
    _model(tmp_path)
    device = ("--quantize", "uint8", "--minmax-runs", "1", "--codegen", "tiny")
    out = cli("run", "m.onnx", "-i", "calib.npz", "-o", "y.npz", *device, cwd=tmp_path).stdout
    assert "compiled (tiny, tiny-1, performance)" in out  # its preset, not trix_sim's
    assert "state: COMPILED" in out
    package = tmp_path / "m.onnx.odc" / "compiled.nnpkg"
    configs = [p.read_text() for p in (package / "metadata").glob("model.part.*.cfg")]
    assert configs and all("BACKENDS=tiny" in c or "BACKENDS=cpu" in c for c in configs)
    assert any("BACKENDS=tiny" in c for c in configs)
    workspace = tmp_path / "m.onnx.odc"
    device_out = read_npz(tmp_path / "y.npz")
    model = packaged_outputs(
        workspace / "quantized.obir", package, workspace / "partition", tmp_path / "calib.npz"
    )
    assert device_out.keys() == model.keys()
    for name in model:
        np.testing.assert_array_equal(device_out[name], model[name])
