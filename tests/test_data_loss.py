"""onebuild only replaces or removes what it made itself: packages, build folders, temporaries.

Every case runs the real CLI; unrelated files must survive and the command must fail with one
line that names the path and says how to fix it.
"""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
DATA = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet_calib.npz"
RECIPE = """
[import]
source = "model.onnx"
input_shapes = {{ x = [1, 3, 32, 32] }}
[optimize]
[pack]
output = "{output}"
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def project(folder: Path, output: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, folder / "model.onnx")
    recipe = folder / "r.toml"
    recipe.write_text(RECIPE.format(output=output) + extra)
    return recipe


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onebuild: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_package_output_at_an_unrelated_folder_is_refused_by_build_and_clean(tmp_path):
    recipe = project(tmp_path, "mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path / "mine")
    assert_refused(cli("build", str(recipe), cwd=tmp_path), "mine", "did not make", "move it")
    assert snapshot(tmp_path / "mine") == before
    assert_refused(cli("clean", str(recipe), cwd=tmp_path), "mine", "did not make")
    assert snapshot(tmp_path / "mine") == before


@pytest.mark.parametrize("output", [".", "..", "/"])
def test_package_output_at_the_recipe_folder_or_above_is_refused(tmp_path, output):
    recipe = project(tmp_path / "p", output)
    before = snapshot(tmp_path)
    for command in ("build", "clean", "status"):
        assert_refused(cli(command, str(recipe), cwd=tmp_path), "pack.output", "the recipe")
    assert snapshot(tmp_path) == before


def test_package_output_at_the_accuracy_data_folder_is_refused(tmp_path):
    extra = """
[quantize]
calibration = "data/calib.npz"
[quantize.accuracy]
data = "data/eval"
"""
    recipe = project(tmp_path, "data/eval", extra)
    (tmp_path / "data" / "eval").mkdir(parents=True)
    shutil.copy(DATA, tmp_path / "data" / "calib.npz")
    shutil.copy(DATA, tmp_path / "data" / "eval" / "samples.npz")
    before = snapshot(tmp_path / "data")
    for command in ("build", "clean"):
        result = cli(command, str(recipe), cwd=tmp_path)
        assert_refused(result, "pack.output", "quantize.accuracy.data")
    assert snapshot(tmp_path / "data") == before


def test_package_output_at_a_folder_holding_the_data_is_refused(tmp_path):
    recipe = project(tmp_path, "inputs", '[quantize]\ncalibration = "inputs/c.npz"\n')
    (tmp_path / "inputs").mkdir()
    shutil.copy(DATA, tmp_path / "inputs" / "c.npz")
    assert_refused(cli("build", str(recipe), cwd=tmp_path), "quantize.calibration")
    assert (tmp_path / "inputs" / "c.npz").read_bytes() == DATA.read_bytes()


def test_build_folder_with_foreign_files_is_refused(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg", '[build]\ndir = "results"\n')
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("keep me")
    assert_refused(cli("build", str(recipe), cwd=tmp_path), "build.dir", "did not make")
    assert (tmp_path / "results" / "notes.txt").read_text() == "keep me"
    (tmp_path / "results.txt").write_text("a file")
    result = cli("build", str(recipe), "--set", "build.dir=results.txt", cwd=tmp_path)
    assert_refused(result, "build.dir", "is a file")


def test_own_package_is_replaced_and_cleaned_and_a_lost_log_stops_the_build(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    result = cli("build", str(recipe), "--set", "optimize.preset=O0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/m.nnpkg/metadata/MANIFEST").is_file()
    (tmp_path / "out/m.nnpkg.log").unlink()  # now nothing says onebuild made the package
    result = cli("build", str(recipe), "--set", "optimize.preset=O1", cwd=tmp_path)
    assert_refused(result, "m.nnpkg", "did not make")
    assert (tmp_path / "out/m.nnpkg/metadata/MANIFEST").is_file()


def test_clean_removes_what_the_build_made_and_sweeps_temporaries(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    build = tmp_path / "build" / "r"
    stale = [
        build / ".optimize.obir.k3j9x_2a.tmp",
        build / ".optimize.obir.log.abcdefgh.tmp",
        tmp_path / "out" / ".m.nnpkg.q1w2e3r4",
        tmp_path / "out" / ".m.nnpkg.old.a1b2c3d4",
    ]
    for path in stale:
        if path.suffix == ".tmp":
            path.write_bytes(b"half")
        else:
            (path / "old").mkdir(parents=True)
    (tmp_path / "out" / "mine.txt").write_text("not onebuild's")
    (tmp_path / "out" / ".m.nnpkg.notes").write_text("not a temporary name")
    result = cli("build", str(recipe), "--set", "optimize.preset=O0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not any(p.exists() for p in stale)
    stale[0].write_bytes(b"half")
    assert cli("clean", str(recipe), cwd=tmp_path).returncode == 0
    assert not stale[0].exists()
    assert not (tmp_path / "out" / "m.nnpkg").exists()
    assert not (tmp_path / "out" / "m.nnpkg.log").exists()
    assert (tmp_path / "out" / "mine.txt").is_file()
    assert (tmp_path / "out" / ".m.nnpkg.notes").is_file()
    assert (tmp_path / "r.toml").is_file() and (tmp_path / "model.onnx").is_file()


def test_clean_takes_the_build_folder_lock(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    with open(tmp_path / "build" / "r" / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = cli("clean", str(recipe), cwd=tmp_path)
        assert busy.returncode == 3, busy.stderr  # FolderBusy: not bad input (2)
        assert busy.stderr.count("\n") == 1 and "another onebuild" in busy.stderr
    assert (tmp_path / "out" / "m.nnpkg" / "metadata" / "MANIFEST").is_file()


def test_a_file_put_inside_the_package_is_neither_replaced_nor_cleaned(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    notes = tmp_path / "out/m.nnpkg/NOTES.txt"
    notes.write_text("mine")
    result = cli("build", str(recipe), "--set", "optimize.preset=O0", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "NOTES.txt" in result.stderr.strip().splitlines()[-1]
    assert_refused(cli("clean", str(recipe), cwd=tmp_path), "NOTES.txt", "did not make")
    assert notes.read_text() == "mine"
    notes.unlink()  # an edited file of onebuild's own is remade, as before
    manifest = tmp_path / "out/m.nnpkg/metadata/MANIFEST"
    made = manifest.read_bytes()
    manifest.write_text("{}")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    assert manifest.read_bytes() == made


def test_an_input_rewritten_with_its_old_modification_time_is_rebuilt(tmp_path):
    """cp -p, tar x, rsync -a and fixed zip times keep a changed file's modification time."""
    recipe = project(tmp_path, "out/m.nnpkg")
    model = tmp_path / "model.onnx"
    os.utime(model, ns=(10**9, 10**9))
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    package = tmp_path / "out/m.nnpkg"
    before = snapshot(package)
    proto = onnx.load(model)
    weight = proto.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 2, weight.name))
    onnx.save(proto, model)
    os.utime(model, ns=(10**9, 10**9))
    result = cli("build", str(recipe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert snapshot(package) != before
    assert "0 step(s) run" in cli("build", str(recipe), cwd=tmp_path).stdout


KILLED_IN_STORE = """
import os, sys
import onebuild.engine.step_cache as step_cache
def store(self, key, outputs, warnings=()):  # killed while the package is copied to the cache
    if any(str(p).endswith(".nnpkg") for p in outputs):
        os._exit(130)
step_cache.StepCache.store = store
from onebuild.cli import main
sys.exit(main())
"""


def test_a_build_killed_after_writing_a_package_leaves_it_its_own(tmp_path):
    """The new package's files are logged as soon as they are in place: a build killed while
    storing them in the step cache leaves a package the next build and `clean` may replace."""
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    shutil.copy(DATA, tmp_path / "calib.npz")
    npu = tmp_path / "npu.toml"  # the same package path, other files in it (.tvn parts)
    npu.write_text(
        RECIPE.format(output="out/m.nnpkg")
        + '[quantize]\ncalibration = "calib.npz"\n[partition]\n[codegen]\ntarget = "trix_sim"\n'
    )
    command = [sys.executable, "-c", KILLED_IN_STORE, "build", str(npu)]
    killed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert killed.returncode == 130, killed.stderr
    result = cli("build", str(npu), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert cli("clean", str(npu), cwd=tmp_path).returncode == 0


def test_a_stray_file_in_a_package_stops_only_a_step_that_would_replace_it(tmp_path):
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    (tmp_path / "out/m.nnpkg/.DS_Store").write_bytes(b"\0")
    result = cli("build", str(recipe), cwd=tmp_path)
    assert result.returncode == 0 and "0 step(s) run" in result.stdout, result.stderr
    changed = cli("build", str(recipe), "--set", "optimize.preset=O0", cwd=tmp_path)
    assert changed.returncode == 2, changed.stderr
    last = changed.stderr.strip().splitlines()[-1]
    assert ".DS_Store" in last and "did not make" in last and last.count("[pack]") == 1, last


def test_an_output_copied_with_its_times_is_hashed_once(tmp_path, monkeypatch):
    """`cp -a` of a build (a CI cache restore) moves every stamp: the first build checks the
    outputs by content and logs their new fingerprints, the next one hashes nothing."""
    from onebuild.engine import ownership, step_cache

    recipe = project(tmp_path / "a", "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path / "a").returncode == 0
    copy = tmp_path / "b"
    subprocess.run(["cp", "-a", str(tmp_path / "a"), str(copy)], check=True)
    log = copy / "out/m.nnpkg.log"
    text = log.read_text().replace(str(tmp_path / "a"), str(copy))
    log.write_text(text)  # the copy's own paths, as a checkout at that place would have
    outputs = [copy / "out/m.nnpkg"]
    recipe_copy = copy / "r.toml"
    hashed = []
    real = step_cache.tree_digest
    monkeypatch.setattr(
        ownership, "tree_digest", lambda path, *rest: hashed.append(path) or real(path, *rest)
    )
    assert ownership.outputs_intact(outputs, recipe_copy, refresh=True)
    assert hashed == outputs
    hashed.clear()
    assert ownership.outputs_intact(outputs, recipe_copy, refresh=True)
    assert hashed == []


def test_a_damaged_log_in_the_build_folder_does_not_stop_the_build(tmp_path):
    """Intermediates in onebuild's marked build folder stay its own when their log is
    damaged; a package outside it is still refused (test_bounded_reads)."""
    recipe = project(tmp_path, "out/m.nnpkg")
    assert cli("build", str(recipe), cwd=tmp_path).returncode == 0
    (tmp_path / "build/r/optimize.obir.log").write_text('{"status": "ru')
    result = cli("build", str(recipe), "--set", "optimize.preset=O0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/m.nnpkg/metadata/MANIFEST").is_file()


def test_a_path_through_a_file_or_a_symlink_loop_is_named_not_file_exists(tmp_path):
    recipe = project(tmp_path, "r.toml/x")
    result = cli("build", str(recipe), cwd=tmp_path)
    assert result.returncode == 2 and "File exists" not in result.stderr, result.stderr
    assert f"cannot write it ({recipe} is not a folder)" in result.stderr
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    result = cli("build", str(recipe), "--set", "build.dir=loop", cwd=tmp_path)
    assert_refused(result, "loop' is a file or a broken symlink, not a folder", "build.dir")
