"""`clean` leaves nothing a build made but the step cache (it left plan.json and an empty
codegen/ folder), and a build with `pack.archive` names the .zip it wrote."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).parent.parent / "examples" / "models"
RECIPE = """extends = "npu-uint8"
[import]
source = "tiny_mobilenet.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[quantize]
calibration = "calib.npz"
[pack]
output = "m.nnpkg"
archive = true
"""


def _onebuild(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True)


def test_clean_leaves_only_the_cache_and_archive_is_named(tmp_path):
    shutil.copy(MODELS / "tiny_mobilenet.onnx", tmp_path)
    shutil.copy(MODELS / "tiny_mobilenet_calib.npz", tmp_path / "calib.npz")
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    built = _onebuild("build", str(recipe))
    archive = tmp_path / "m.nnpkg.zip"
    assert archive.is_file() and f"archive: {archive}" in built.stdout.splitlines()
    document = json.loads(_onebuild("build", str(recipe), "--json").stdout)
    assert document["archives"] == [str(archive)]
    folder = tmp_path / "build" / "r"
    assert (folder / "codegen").is_dir() and (folder / "plan.json").is_file()
    _onebuild("clean", str(recipe))
    assert sorted(p.name for p in folder.iterdir()) == [".lock", ".onebuild", "cache"]
    assert not archive.exists() and not (tmp_path / "m.nnpkg").exists()
