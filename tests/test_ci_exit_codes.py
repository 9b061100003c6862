"""What a CI job reads: `status --check` exits 1 when a build would do anything, `status` tells
a running build from one that died, and `build --json` carries counts and the exit code when a
step fails."""

import fcntl
import json
import subprocess
import sys

import numpy as np
from onnx import helper
from onnx_builders import make_model

from onebuild.npz import write_npz


def _onebuild(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *args], capture_output=True, text=True
    )


def _project(folder):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    (folder / "m.onnx").write_bytes(make_model(nodes, [("x", [1, 4])], ["y"]).SerializeToString())
    (folder / "r.toml").write_text('[import]\nsource = "m.onnx"\n[pack]\noutput = "m.nnpkg"\n')
    return str(folder / "r.toml")


def test_status_check_exits_1_while_anything_would_run(tmp_path):
    recipe = _project(tmp_path)
    assert _onebuild("status", recipe, "--check").returncode == 1  # never built
    assert _onebuild("status", recipe).returncode == 0  # without --check: a report
    assert _onebuild("build", recipe).returncode == 0
    done = _onebuild("status", recipe, "--check", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["up_to_date"] is True
    (tmp_path / "m.nnpkg" / "metadata" / "MANIFEST").write_text("edited")
    stale = _onebuild("status", recipe, "--check", "--json")
    assert stale.returncode == 1 and json.loads(stale.stdout)["exit_code"] == 1


def test_status_tells_a_running_build_from_a_dead_one(tmp_path):
    recipe = _project(tmp_path)
    assert _onebuild("build", recipe).returncode == 0
    log = tmp_path / "build" / "r" / "import.obir.log"
    log.write_text(json.dumps({**json.loads(log.read_text()), "status": "running"}))
    with open(tmp_path / "build" / "r" / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        running = _onebuild("status", recipe).stdout
    assert "[import] restored: a build is running it now" in running, running
    dead = _onebuild("status", recipe).stdout
    assert "[import] restored: its last run failed or did not finish" in dead, dead


def test_build_json_has_counts_and_exit_code_when_a_step_fails(tmp_path):
    recipe = _project(tmp_path)
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    failed = _onebuild("build", recipe, "--json")
    document = json.loads(failed.stdout)
    assert failed.returncode == document["exit_code"] == 2
    assert document["counts"] == {"failed": 1, "not run": 1}


def test_status_says_why_a_step_after_a_rerun_cannot_stay(tmp_path):
    """quantize reads the calibration data itself (its SQNR check) besides calibrate's output:
    with that file changed it runs or restores, and status says so."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    weights = [("w", np.eye(4, dtype=np.float32))]
    model = make_model(nodes, [("x", [1, 4])], ["y"], weights)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    data = np.random.default_rng(0).normal(size=(8, 1, 4)).astype(np.float32)
    write_npz(tmp_path / "c.npz", {"x": data})
    recipe = tmp_path / "r.toml"
    recipe.write_text('[import]\nsource = "m.onnx"\n[quantize]\ncalibration = "c.npz"\n')
    assert _onebuild("build", str(recipe)).returncode == 0
    write_npz(tmp_path / "c.npz", {"x": data * 2})
    lines = _onebuild("status", str(recipe)).stdout.splitlines()
    quantize = next(line for line in lines if "[quantize]" in line)
    assert quantize.startswith("r.toml [quantize] pending: runs or restores once"), quantize
    assert "input c.npz changed" in quantize
