"""Killed builds, concurrent builds, parallel builds of several recipes."""

import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from onebuild.graph_ir.serde.model_zoo import light_model

RECIPE = """
[import]
source = "model.onnx"
[optimize]
[pack]
output = "out/m.nnpkg"
"""


def build_cmd(*recipes: Path, extra=()):
    return [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes), *extra]


def package_bytes(folder: Path) -> dict[str, bytes]:
    package = folder / "out" / "m.nnpkg"
    return {str(p.relative_to(package)): p.read_bytes() for p in package.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def model_bytes():
    return light_model("squeezenet", seed=5).SerializeToString()


def make_project(folder: Path, model_bytes: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model_bytes)
    (folder / "r.toml").write_text(RECIPE)
    return folder / "r.toml"


def test_sigkill_then_rebuild_matches_a_clean_build(tmp_path, model_bytes):
    reference = make_project(tmp_path / "reference", model_bytes)
    subprocess.run(build_cmd(reference), check=True, capture_output=True)
    expected = package_bytes(reference.parent)
    for attempt, delay in enumerate([0.2, 0.4, 0.6, 0.8, 1.0, 1.3]):
        recipe = make_project(tmp_path / f"killed{attempt}", model_bytes)
        process = subprocess.Popen(
            build_cmd(recipe), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        result = subprocess.run(build_cmd(recipe, extra=["--json"]), capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert package_bytes(recipe.parent) == expected, f"killed after {delay}s"
        leftovers = [p for p in (recipe.parent / "build").rglob("*.tmp")]
        assert all(not p.name.startswith(("import", "optimize")) for p in leftovers)


def test_concurrent_build_of_the_same_folder_stops_with_a_message(tmp_path, model_bytes):
    recipe = make_project(tmp_path / "p", model_bytes)
    lock_folder = recipe.parent / "build" / "r"
    lock_folder.mkdir(parents=True)
    with open(lock_folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        result = subprocess.run(build_cmd(recipe, extra=["--json"]), capture_output=True, text=True)
    assert result.returncode == 3  # not bad input (2): the folder is busy, build again later
    assert json.loads(result.stdout)["exit_code"] == 3
    assert "another onebuild build is using this build folder" in result.stderr
    assert subprocess.run(build_cmd(recipe), capture_output=True).returncode == 0


def test_two_real_concurrent_builds_never_corrupt(tmp_path, model_bytes):
    recipe = make_project(tmp_path / "p", model_bytes)
    processes = [
        subprocess.Popen(
            build_cmd(recipe), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    codes = sorted(p.wait() for p in processes)
    assert codes in ([0, 0], [0, 3])  # 3: the folder was busy
    result = subprocess.run(build_cmd(recipe, extra=["--json"]), capture_output=True, text=True)
    statuses = {s["status"] for s in json.loads(result.stdout)["steps"]}
    assert statuses == {"up-to-date"}


def test_parallel_build_of_several_recipes(tmp_path, model_bytes):
    recipes = [make_project(tmp_path / name, model_bytes) for name in ("a", "b")]
    onnx.save(onnx.load_from_string(model_bytes), tmp_path / "b" / "model.onnx")
    result = subprocess.run(
        build_cmd(*recipes, extra=["-j", "2", "--json"]), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["steps"]) == 6 and len(report["packages"]) == 2
    assert package_bytes(tmp_path / "a") == package_bytes(tmp_path / "b")
