"""A step's warnings are said again when a later build finds it up to date or restores it from
the step cache (marked as from an earlier run), and `build --json` lists them per step: a CI
job on a warm cache heard nothing of a model's low SQNR."""

import json
import subprocess
import sys

import numpy as np
from onnx import helper
from onnx_builders import make_model

WARNING = "calibrating on 32 RANDOM samples"
EARLIER = "onebuild: warning: (from an earlier run) " + WARNING


def _checkout(folder, cache):
    folder.mkdir()
    weights = np.eye(4, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, [("x", [1, 4])], ["y"], [("w", weights)])
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    recipe = (
        '[import]\nsource = "m.onnx"\n[quantize]\nrandom_calibration = true\n'
        f'[pack]\noutput = "m.nnpkg"\n[build]\ncache = "{cache}"\n'
    )
    (folder / "r.toml").write_text(recipe)
    return folder / "r.toml"


def _build(recipe, *options):
    cli = [sys.executable, "-m", "onebuild.cli", "build", str(recipe), "--json", *options]
    done = subprocess.run(cli, capture_output=True, text=True, check=True)
    steps = {s["step"]: s for s in json.loads(done.stdout)["steps"]}
    return steps, done.stderr


def test_warnings_are_said_again_when_up_to_date_or_restored(tmp_path):
    recipe = _checkout(tmp_path / "first", tmp_path / "cache")
    steps, stderr = _build(recipe)
    assert steps["calibrate"]["status"] == "run"
    assert [WARNING in w for w in steps["calibrate"]["warnings"]] == [True]
    assert steps["import"]["warnings"] == [] and EARLIER not in stderr and WARNING in stderr
    log = json.loads((tmp_path / "first/build/r/calibrate.npz.log").read_text())
    assert log["warnings"] == steps["calibrate"]["warnings"]
    for folder in (recipe, _checkout(tmp_path / "second", tmp_path / "cache")):
        again, stderr = _build(folder)
        assert again["calibrate"]["status"] in ("up-to-date", "restored")
        assert again["calibrate"]["warnings"] == steps["calibrate"]["warnings"]
        assert stderr.count(EARLIER) == 1, stderr
    assert again["calibrate"]["status"] == "restored"


def test_warnings_of_a_step_run_on_a_dask_worker_reach_the_client(tmp_path):
    recipe = _checkout(tmp_path / "p", tmp_path / "cache")
    steps, stderr = _build(recipe, "--executor", "dask", "-j", "1")
    assert steps["calibrate"]["status"] == "run"
    assert [WARNING in w for w in steps["calibrate"]["warnings"]] == [True]
    assert stderr.count(WARNING) == 1 and EARLIER not in stderr, stderr
    log = json.loads((tmp_path / "p/build/r/calibrate.npz.log").read_text())
    assert log["warnings"] == steps["calibrate"]["warnings"]
